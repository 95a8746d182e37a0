"""SfM-120k training tuples (``retrieval-SfM-120k.pkl`` of cirtorch), read without running code.

The pickle is a dict with a ``"train"`` and a ``"val"`` part, each a dict of plain lists:
``cids`` (image ids; the image of ``cid`` is ``ims/<cid[-2:]>/<cid[-4:-2]>/<cid[-6:-4]>/<cid>``,
cirtorch's ``cid2filename``), ``qidxs`` / ``pidxs`` (query and positive indices into ``cids``: the
positive pairs) and ``cluster`` (the 3D-model cluster of each image: negatives come from other
clusters). It is read with the restricted unpickler (:mod:`oxbench.formats.safe_pickle`): plain
containers and numbers only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oxbench.errors import InputError
from oxbench.formats.safe_pickle import load_plain_pickle
from oxbench.train.loop import TrainingSet, _resize, fit_size


def cid_path(images: str | Path, cid: str) -> Path:
    """cirtorch's ``cid2filename``: ``<images>/<cid[-2:]>/<cid[-4:-2]>/<cid[-6:-4]>/<cid>``."""
    return Path(images) / cid[-2:] / cid[-4:-2] / cid[-6:-4] / cid


def sfm_training_set(
    pickle_path: str | Path, images: str | Path, image_size: int, *, part: str = "train"
) -> TrainingSet:
    """The SfM-120k tuples of ``part`` as a :class:`~oxbench.train.loop.TrainingSet` (images read lazily).

    Raises:
        InputError: not a plain pickle, a missing part or field, lists of different lengths,
            indices outside ``cids`` (names the file).
    """
    data = load_plain_pickle(pickle_path)
    if not isinstance(data, dict) or part not in data or not isinstance(data[part], dict):
        raise InputError(f"not an SfM-120k tuple pickle: no {part!r} part", pickle_path)
    db = data[part]
    missing = [k for k in ("cids", "qidxs", "pidxs", "cluster") if k not in db]
    if missing:
        raise InputError(f"SfM-120k {part!r} part lacks {', '.join(missing)}", pickle_path)
    cids = [str(c) for c in db["cids"]]
    try:
        q = np.asarray(db["qidxs"], np.int64)
        p = np.asarray(db["pidxs"], np.int64)
        cluster = np.asarray(db["cluster"], np.int64)
    except (TypeError, ValueError, OverflowError) as exc:  # OverflowError: an index of 10**30
        raise InputError(
            f"SfM-120k {part!r}: qidxs/pidxs/cluster must be lists of 64-bit integers "
            f"({' '.join(str(exc).split())[:120]})",
            pickle_path,
        ) from None
    n = len(cids)
    if q.ndim != 1 or q.shape != p.shape or cluster.shape != (n,):
        raise InputError(
            f"SfM-120k {part!r}: {len(q)} qidxs, {len(p)} pidxs, {len(cluster)} clusters for {n} images",
            pickle_path,
        )
    if len(q) and (min(q.min(), p.min()) < 0 or max(q.max(), p.max()) >= n):
        raise InputError(
            f"SfM-120k {part!r}: query/positive indices outside 0..{n - 1}", pickle_path
        )
    if (cluster < 0).any():
        raise InputError(f"SfM-120k {part!r}: negative cluster ids", pickle_path)
    from oxbench.datasets.base import read_image

    size_of: dict[int, tuple[int, int]] = {}
    cache: dict[int, np.ndarray] = {}

    def read(i: int) -> np.ndarray:
        if i not in cache:
            im = read_image(cid_path(images, cids[i]))
            # one training shape per run: that of the first image read (as the benchmark path does)
            size = size_of.setdefault(0, fit_size(im.shape, image_size))
            cache[i] = _resize(im, size)
        return cache[i]

    # every image of a cluster may show the anchor's landmark: exclude the cluster (by id)
    n_clusters = int(cluster.max()) + 1 if n else 0
    order = np.argsort(cluster, kind="stable")
    bounds = np.searchsorted(cluster[order], np.arange(n_clusters + 1))
    exclude = [order[bounds[c] : bounds[c + 1]] for c in range(n_clusters)]
    return TrainingSet(
        read,
        n,
        np.stack([q, p], axis=1) if len(q) else np.zeros((0, 2), np.int64),
        cluster,
        exclude,
        source=f"SfM-120k {part} ({n} images, {len(q)} pairs) from {pickle_path}",
    )
