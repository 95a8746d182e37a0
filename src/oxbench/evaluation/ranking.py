"""Ranking layouts: the internal ``[n_queries, k]`` layout and revisitop's ``(k, n_queries)``.

oxbench keeps one internal layout: ``ranks[q]`` is query ``q``'s ranked list of database indices,
best first (``-1`` only where :func:`~oxbench.evaluation.evaluate` is told so: ``padding=-1`` at the
end of a list, ``gaps=True`` anywhere). revisitop (and its ``compute_map``) stores the transpose:
rows = ranked positions, columns = queries. Convert only at the boundary with
:func:`from_revisitop` / :func:`to_revisitop`; both return views, not copies, so a million-row
ranks file is never duplicated in memory.

:func:`ranks_from_scores` is the one "rank by score" helper of the package (the search of the
bag-of-words index and the simulations use it too). Its orientation: scores ``[n_index,
n_queries]`` in (revisitop's ``X.T @ Q``, what :func:`~oxbench.evaluation.evaluate_scores` takes),
ranks ``[n_queries, k]`` out (the internal layout). A ``[n_queries, n]`` matrix goes in as ``.T``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError


def _as_2d(ranks: ArrayLike, what: str, source: str | None) -> np.ndarray:
    arr = np.asarray(ranks)
    if arr.ndim != 2:
        raise InputError(f"{what} must be a 2-D array, got shape {arr.shape}", source)
    return arr


def from_revisitop(ranks: ArrayLike, *, source: str | None = None) -> NDArray[np.int64]:
    """revisitop layout ``(k, n_queries)`` -> internal ``[n_queries, k]`` (a transposed view).

    Args:
        ranks: column ``i`` is query ``i``'s ranked list (the layout ``compute_map`` takes and
            ``np.argsort(-sim, axis=0)`` produces).
        source: name of the input, for error messages.

    Raises:
        InputError: the array is not 2-D.

    Example:
        >>> revisitop = np.array([[2, 0], [0, 1], [1, 2]])  # 3 positions x 2 queries
        >>> from_revisitop(revisitop).tolist()  # one row per query
        [[2, 0, 1], [0, 1, 2]]
        >>> to_revisitop(from_revisitop(revisitop)).tolist()
        [[2, 0], [0, 1], [1, 2]]
    """
    return _as_2d(
        ranks, "ranks (revisitop layout: rows = ranked positions, columns = queries)", source
    ).T


def to_revisitop(ranks: ArrayLike) -> NDArray[np.int64]:
    """Internal ``[n_queries, k]`` -> revisitop layout ``(k, n_queries)`` (a transposed view)."""
    return _as_2d(ranks, "ranks", None).T


def ranks_from_scores(
    scores: ArrayLike, k: int | None = None, *, source: str | None = None
) -> NDArray[np.int64]:
    """Rank a database by score, best first, in the internal layout.

    The order is a *stable* descending sort: equal scores keep database order, so ties go to the
    lower database index. (revisitop's ``np.argsort(-sim, axis=0)`` uses an unstable quicksort, so
    its order among exactly tied scores is unspecified; oxbench fixes it.)

    Args:
        scores: similarity matrix ``[n_index, n_queries]`` (revisitop orientation, ``X.T @ Q``).
        k: keep only the top ``k`` of each list (default: all).
        source: name of the input, for error messages.

    Returns:
        ``int64 [n_queries, k]``.

    Example:
        >>> ranks_from_scores(np.array([[0.5], [0.9], [0.5]])).tolist()
        [[1, 0, 2]]
    """
    s = _as_2d(scores, "scores", source)
    if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise InputError(f"scores must be numbers, got dtype {s.dtype}", source)
    if np.issubdtype(s.dtype, np.floating) and np.isnan(s).any():
        raise InputError("scores contain NaN", source)
    out = np.empty((s.shape[1], s.shape[0] if k is None else min(k, s.shape[0])), dtype=np.int64)
    for q in range(s.shape[1]):
        col = np.ascontiguousarray(s[:, q])
        if not np.issubdtype(col.dtype, np.floating):
            col = col.astype(np.float64)  # exact below 2**53; avoids negating unsigned integers
        out[q] = descending_order(col)[: out.shape[1]]
    return out


#: Order-preserving map of ``float32`` bits to ``uint32``: flip every bit of a negative number,
#: only the sign bit of a non-negative one.
_SIGN = np.uint32(0x80000000)


def descending_order(col: NDArray[np.floating]) -> NDArray[np.int64]:
    """``np.argsort(-col, kind="stable")`` of one float column (NaN-free): best first, ties in
    index order.

    For ``float32`` (the search's scores) this is one sort of unique ``uint64`` keys -- the
    score's bits mapped to an unsigned integer that orders as the float does (``-0.0`` as
    ``0.0``), then the index -- which sorts several times faster than a stable float sort and gives
    the very same order (the keys are distinct, so any sort is stable on them).
    """
    n = len(col)
    if col.dtype != np.float32 or n >= 2**32:
        return np.argsort(-col, kind="stable")
    u = (-col + np.float32(0.0)).view(
        np.uint32
    )  # + 0.0: -0.0 becomes 0.0, so equal scores stay equal
    key = np.where(u & _SIGN, ~u, u | _SIGN).astype(np.uint64)
    key <<= np.uint64(32)
    key |= np.arange(n, dtype=np.uint64)
    key.sort()
    return (key & np.uint64(0xFFFFFFFF)).astype(np.int64)
