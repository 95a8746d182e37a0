"""The exact top-k selection every exact search shares (in RAM, :mod:`oxbench.index.search`;
streamed from disk, :mod:`oxbench.index.mapped`): per block, the top ``k`` columns of each score
row, merged into a running list; equal scores go to the lower database index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require


def _as_matrix(x: Any, name: str, dim: int | None = None) -> NDArray[np.float32]:
    arr = np.asarray(x)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.number):
        raise InputError(
            f"{name} must be a numeric [n, d] matrix, got shape {arr.shape} dtype {arr.dtype}"
        )
    if dim is not None and arr.shape[1] != dim:
        raise InputError(f"{name} have dimension {arr.shape[1]}, the database has {dim}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    if not np.isfinite(arr).all():
        raise InputError(f"{name} hold NaN or infinite values")
    return arr


def _topk_block(s: NDArray[np.float32], k: int) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The top ``k`` columns of every row of ``s`` (ties: lower column), unsorted, exactly ``k``."""
    n_rows, n_cols = s.shape
    if k >= n_cols:
        return s, np.broadcast_to(np.arange(n_cols, dtype=np.int64), s.shape).copy()
    kth = -np.partition(-s, k - 1, axis=1)[:, k - 1 : k]
    greater = s > kth
    equal = s == kth
    need = k - greater.sum(axis=1, keepdims=True)
    take = greater | (equal & (np.cumsum(equal, axis=1) <= need))
    cols = np.nonzero(take)[1].reshape(n_rows, k).astype(np.int64)  # row-major: columns ascending
    return np.take_along_axis(s, cols, axis=1), cols


def _merge(
    scores: NDArray[np.float32], ids: NDArray[np.int64], k: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Sort candidates (ids ascending within equal scores) and keep the best ``k`` of each row."""
    order = np.lexsort((ids, -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1)


def torch_merge_block(best_s: Any, best_i: Any, s: Any, start: int, k: int) -> tuple[Any, Any]:
    """Merge a block's scores ``s`` (torch, ``[n_q, block]``, columns = database rows ``start ..``)
    into the running top ``k`` ``(best_s, best_i)``, on their device: the selection of
    :func:`_topk_block` and :func:`_merge` (ties to the lower index)."""
    torch = require("torch", "deep")
    if not bool(torch.isfinite(s).all()):
        raise InputError("descriptor dot products are not finite (overflow)")
    kb = min(k, s.shape[1])
    kth = torch.topk(s, kb, dim=1, sorted=True).values[:, kb - 1 : kb]
    greater = s > kth
    equal = s == kth
    need = kb - greater.sum(dim=1, keepdim=True)
    take = greater | (equal & (torch.cumsum(equal.to(torch.int64), dim=1) <= need))
    cols = torch.nonzero(take)[:, 1].reshape(s.shape[0], kb)
    cand_s = torch.cat((best_s, torch.gather(s, 1, cols)), dim=1)
    cand_i = torch.cat((best_i, cols + start), dim=1)
    # stable sort on score keeps earlier (lower-index) candidates first among equal scores
    order = torch.sort(cand_i, dim=1, stable=True).indices
    cand_s, cand_i = torch.gather(cand_s, 1, order), torch.gather(cand_i, 1, order)
    order = torch.sort(-cand_s, dim=1, stable=True).indices[:, :k]
    return torch.gather(cand_s, 1, order), torch.gather(cand_i, 1, order)
