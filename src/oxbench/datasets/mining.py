"""R1M's selection procedure: keep the most distracting of a larger pool of candidates.

Radenovic et al. 2018 built R1M from 4.1M candidates: each was scored by the fraction of Easy and
Hard images ranked below it, summed over the queries and over three methods, and the one million
highest scores kept -- a set that gives clearly lower mAP than a random million.
:func:`distractor_scores` is that rule over ranked lists; :func:`oxbench.pipelines.mining.mine_distractors` runs it on a
pool of generated distractors of one kind (:mod:`oxbench.datasets.synthetic.distractor_kinds`)
and writes the selection, with every candidate's score, to ``<dataset>/mined/<kind>-<N>.json``,
which ``--distractors synthetic-mined-<kind>:N`` then reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

#: ``format`` of a selection file.
SELECTION_FORMAT = 1
#: The methods that score the pool when none are named: two bag-of-words rankings (without and
#: with spatial verification) and a global descriptor, as R1M used three different methods.
DEFAULT_METHODS = ("rootsift-bow", "rootsift-bow-sv", "rootsift-vlad")


def distractor_scores(
    gt: GroundTruth, ranks: NDArray[np.integer], n_candidates: int
) -> NDArray[np.float64]:
    """Each candidate's score under one method: the fraction of the query's Easy and Hard images
    ranked below it, summed over the queries.

    Args:
        gt: revisited ground truth (``easy``, ``hard`` of each query index the database).
        ranks: ``[n_ranked, n_queries]`` in the revisitop layout; index ``gt.n_db + c`` is
            candidate ``c``. Lists may be truncated: a candidate not in a list scores 0 for that
            query, an Easy or Hard image not in it is below every listed candidate.
        n_candidates: candidates after the database.

    Returns:
        ``float64 [n_candidates]``; queries without Easy or Hard images add nothing.

    Example:
        One query with positives 0 and 1, candidate 0 (index 2) ranked between them:

        >>> from oxbench.groundtruth import GroundTruth, Query
        >>> q = Query("q", easy=np.array([0]), hard=np.array([1]))
        >>> gt = GroundTruth("t", "revisited", ("a", "b"), (q,))
        >>> distractor_scores(gt, np.array([[0], [2], [1]]), 1).tolist()
        [0.5]
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 2 or ranks.shape[1] != len(gt.queries):
        raise InputError(
            f"ranks of shape {ranks.shape} do not fit {len(gt.queries)} queries (n_ranked, n_queries)"
        )
    n_db = gt.n_db
    scores = np.zeros(n_candidates, np.float64)
    for qi, q in enumerate(gt.queries):
        positives = np.unique(np.asarray([*q.easy, *q.hard], np.int64))
        if not len(positives):
            continue
        listed = ranks[:, qi].astype(np.int64)
        where = np.full(n_db + n_candidates, len(listed), np.int64)  # unlisted: below the list
        valid = (listed >= 0) & (listed < n_db + n_candidates)
        where[listed[valid]] = np.flatnonzero(valid)
        pos_at = np.sort(where[positives])
        cand = np.flatnonzero(valid & (listed >= n_db))
        below = len(pos_at) - np.searchsorted(pos_at, cand, side="right")
        np.add.at(scores, listed[cand] - n_db, below / len(pos_at))
    return scores


def select_most_distracting(scores: NDArray[np.floating], keep: int) -> NDArray[np.int64]:
    """The ``keep`` highest scores' candidates (ties to the lower index), in ascending order.

    Raises:
        InputError: ``keep`` is not in ``1 .. len(scores)`` (a pool smaller than the mined count).
    """
    n = len(scores)
    if not 1 <= keep <= n:
        raise InputError(f"cannot keep {keep:,} distractors from a pool of {n:,}")
    order = np.lexsort((np.arange(n), -np.asarray(scores, np.float64)))
    return np.sort(order[:keep]).astype(np.int64)


def selection_path(dataset_dir: Path, kind: str, keep: int) -> Path:
    """Where the selection of ``keep`` distractors of ``kind`` is written."""
    return Path(dataset_dir) / "mined" / f"{kind}-{keep}.json"


def read_selection(dataset_dir: Path, kind: str, keep: int) -> tuple[int, ...]:
    """The pool indices a mined selection kept (checked: ``keep`` unique indices in the pool).

    Raises:
        InputError: the selection was not made, or the file is not one.
    """
    import json

    from oxbench.fileio import read_input_bytes

    path = selection_path(dataset_dir, kind, keep)
    if not path.exists():
        raise InputError(
            f"no mined selection of {keep:,} {kind} distractors; make it with "
            f"`oxbench data mine-distractors --kind {kind} --keep {keep} --pool M`",
            path,
        )
    try:
        doc = json.loads(read_input_bytes(path))
    except (ValueError, UnicodeDecodeError):
        doc = None
    kept = doc.get("kept") if isinstance(doc, dict) else None
    pool = doc.get("pool_size") if isinstance(doc, dict) else None
    if (
        not isinstance(doc, dict)
        or not isinstance(kept, list)
        or not isinstance(pool, int)
        or doc.get("format") != SELECTION_FORMAT
        or doc.get("kind") != kind
        or len(kept) != keep
        or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < pool for i in kept)
        or len(set(kept)) != keep
    ):
        raise InputError("not a mined distractor selection (format, kind, kept indices)", path)
    return tuple(sorted(kept))


def selection_summary(doc: Mapping[str, Any]) -> str:
    """One line about a selection: how many kept of how many, and their mean score against the
    pool's."""
    scores = np.asarray(doc["scores"], np.float64)
    kept = np.asarray(doc["kept"], np.int64)
    return (
        f"kept {len(kept):,} of {len(scores):,} {doc['kind']} candidates: mean score "
        f"{scores[kept].mean():.3f} (pool {scores.mean():.3f}), by {', '.join(doc['methods'])}"
    )
