"""Average precision and precision at K on one ranked list, exactly as the official programs.

All functions here take the *positions* of the retrieved positives in the ranked list **after the
ignored items have been deleted** (0-based, increasing). Turning a ranking and a ground truth into
those positions is the job of :mod:`oxbench.evaluation.protocols`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _positions(pos_ranks: ArrayLike) -> NDArray[np.float64]:
    r = np.asarray(pos_ranks, dtype=np.float64).ravel()
    if r.size > 1 and np.any(np.diff(r) <= 0):
        raise ValueError("positive ranks must be strictly increasing")
    return r


def average_precision(pos_ranks: ArrayLike, n_positives: int) -> float:
    """Trapezoidal AP of ``compute_ap.cpp`` / revisitop ``compute_ap`` / ``holidays_map.py``.

    With the k-th retrieved positive (k = 0, 1, ...) at 0-based rank r (ignored items deleted)::

        AP = (1/N) * sum_k (p0 + p1) / 2,   p0 = 1 if r == 0 else k / r,   p1 = (k + 1) / (r + 1)

    Positives missing from a truncated list add nothing but still count in ``n_positives``.

    Args:
        pos_ranks: strictly increasing 0-based ranks of the retrieved positives, shape ``[m]``.
        n_positives: N, the number of positives in the ground truth (``>= m``).

    Returns:
        AP in [0, 1]; 0.0 when nothing is retrieved.

    Example:
        >>> round(average_precision([0, 2, 5], 3), 6)  # ranked: P N P N N P
        0.677778
    """
    r = _positions(pos_ranks)
    if n_positives <= 0:
        raise ValueError("average precision needs at least one positive")
    if r.size > n_positives:
        raise ValueError(f"{r.size} retrieved positives but only {n_positives} in the ground truth")
    if r.size == 0:
        return 0.0
    k = np.arange(r.size, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        p0 = np.where(r == 0, 1.0, k / np.where(r == 0, 1.0, r))
    p1 = (k + 1.0) / (r + 1.0)
    return float(np.sum((p0 + p1) * 0.5) / n_positives)


def average_precision_textbook(pos_ranks: ArrayLike, n_positives: int) -> float:
    """The finite-sum ("non-interpolated", TREC / scikit-learn style) AP, for comparison only.

    ``AP = (1/N) * sum_k (k + 1) / (r_k + 1)``. It is *not* what the Oxford/Paris/Holidays programs
    compute; it is never lower than the trapezoidal AP on the same list (which averages each term
    with the precision just before the hit).

    Example:
        >>> round(average_precision_textbook([0, 2, 5], 3), 6)  # trapezoidal: 0.677778
        0.722222
    """
    r = _positions(pos_ranks)
    if n_positives <= 0:
        raise ValueError("average precision needs at least one positive")
    if r.size == 0:
        return 0.0
    k = np.arange(r.size, dtype=np.float64)
    return float(np.sum((k + 1.0) / (r + 1.0)) / n_positives)


def precision_at_ks(pos_ranks: ArrayLike, ks: Sequence[int]) -> NDArray[np.float64]:
    """revisitop's P@K with the capped denominator, for each K in ``ks``.

    With ``pos`` the 1-based ranks of the retrieved positives (ignored items deleted),
    ``kq = min(K, max(pos))`` and ``P@K = |{pos <= kq}| / kq``: three positives at ranks 1..3 give
    1.0 at K = 10. No retrieved positive gives 0.

    Example:
        >>> precision_at_ks([0, 1, 2], [1, 5, 10]).tolist()
        [1.0, 1.0, 1.0]
    """
    r = _positions(pos_ranks)
    out = np.zeros(len(ks), dtype=np.float64)
    if r.size == 0:
        return out
    pos = r + 1.0
    last = pos[-1]
    for i, K in enumerate(ks):
        kq = min(float(K), last)
        out[i] = np.count_nonzero(pos <= kq) / kq
    return out
