"""Matching pairs and landmark groups from a benchmark's ground truth (labels by construction).

For a training city (``synthetic-train``, or the other real city) the labels say which images
match: a query crop and each of its positives (revisited Easy + Hard, or original good + ok) show the
same object. Those are the *matching pairs* of the learned whitening and the positive pairs of the
contrastive training. Queries whose positives overlap show one landmark; an image labelled (positive
or junk) for any query of a landmark may show it, so it is never used as that landmark's negative.

Indices: database images are ``0 .. n_db - 1``; query ``q`` is ``n_db + q`` (queries appended after
the database, as the whitening and the training stack them).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth


def matching_pairs(gt: GroundTruth) -> NDArray[np.int64]:
    """``[m, 2]`` pairs ``(n_db + q, p)``: every query with every one of its positives.

    Raises:
        InputError: the ground truth has no positive at all.
    """
    pairs = [(gt.n_db + qi, int(p)) for qi, q in enumerate(gt.queries) for p in q.positives]
    if not pairs:
        raise InputError(
            f"{gt.dataset}: no query has a positive; no matching pairs to learn from", gt.source
        )
    return np.asarray(pairs, dtype=np.int64)


def landmark_of_queries(gt: GroundTruth) -> NDArray[np.int64]:
    """``[n_queries]`` landmark ids: queries linked by a shared positive form one landmark."""
    n_q = gt.n_queries
    parent = list(range(n_q))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[int, int] = {}
    for qi, q in enumerate(gt.queries):
        for p in q.positives.tolist():
            if p in owner:
                a, b = find(owner[p]), find(qi)
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                owner[p] = qi
    roots = [find(i) for i in range(n_q)]
    _, ids = np.unique(roots, return_inverse=True)
    return ids.astype(np.int64)


def image_clusters(gt: GroundTruth) -> tuple[NDArray[np.int64], list[NDArray[np.int64]]]:
    """Landmark of every image and the images each landmark may show.

    Returns:
        ``cluster [n_db + n_queries]``: the landmark of each query and of each database image that is
        a positive of a query (the first such landmark); other images get their own negative id
        ``-1 - i`` (a cluster of one). ``maybe[l]``: every database index labelled positive or junk
        for a query of landmark ``l`` (never a negative of ``l``), plus the queries of ``l``.
    """
    lq = landmark_of_queries(gt)
    n_db = gt.n_db
    n_l = int(lq.max()) + 1 if len(lq) else 0
    cluster = -1 - np.arange(n_db + gt.n_queries, dtype=np.int64)
    cluster[n_db:] = lq
    maybe: list[set[int]] = [set() for _ in range(n_l)]
    for qi, q in enumerate(gt.queries):
        lm = int(lq[qi])
        for p in q.positives.tolist():
            if cluster[p] < 0:
                cluster[p] = lm
        maybe[lm].update(q.positives.tolist())
        maybe[lm].update(q.junk.tolist())
        maybe[lm].add(n_db + qi)
    return cluster, [np.array(sorted(s), dtype=np.int64) for s in maybe]
