"""Average precision and precision at K on one ranked list, exactly as the official programs.

These are the functions :func:`oxbench.evaluation.evaluate` itself calls for every query and setup,
so a number computed here equals the per-query number of an evaluation bit for bit.

They take the *positions* of the retrieved positives in the ranked list **after the ignored items
have been deleted** (0-based, strictly increasing). Turning a ranking and a ground truth into those
positions is the job of :mod:`oxbench.evaluation.protocols` (and of :mod:`.kernels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _positions(pos_ranks: ArrayLike) -> NDArray[np.int64]:
    """The positions as int64, checked: integers >= 0, strictly increasing."""
    r = pos_ranks if type(pos_ranks) is np.ndarray else np.asarray(pos_ranks)
    if r.ndim != 1:
        r = r.ravel()
    if r.dtype != np.int64:
        if r.size and not (
            np.issubdtype(r.dtype, np.integer) or np.issubdtype(r.dtype, np.floating)
        ):
            raise ValueError(f"positive ranks must be integers, got dtype {r.dtype}")
        if r.size and np.issubdtype(r.dtype, np.floating) and not np.array_equal(r, np.floor(r)):
            raise ValueError("positive ranks must be integers")
        r = r.astype(np.int64)
    if r.size > 1 and not (r[1:] > r[:-1]).all():
        raise ValueError("positive ranks must be strictly increasing")
    if r.size and r[0] < 0:
        raise ValueError("positive ranks must be >= 0")
    return r


def average_precision(pos_ranks: ArrayLike, n_positives: int) -> float:
    """Trapezoidal AP of ``compute_ap.cpp`` / revisitop ``compute_ap`` / ``holidays_map.py``.

    With the k-th retrieved positive (k = 0, 1, ...) at 0-based rank r (ignored items deleted)::

        AP = (1/N) * sum_k (p0 + p1) / 2,   p0 = 1 if r == 0 else k / r,   p1 = (k + 1) / (r + 1)

    Positives missing from a truncated list add nothing but still count in ``n_positives``. The
    terms are computed and summed in revisitop's order (``(p0 + p1) * (1 / N) / 2``, accumulated one
    after the other) in double precision, so the value equals revisitop's ``compute_ap`` bit for
    bit (``compute_ap.cpp`` accumulates in single precision: within 5e-7 of this).

    Args:
        pos_ranks: strictly increasing 0-based ranks of the retrieved positives, shape ``[m]``.
        n_positives: N, the number of positives in the ground truth (``>= m``).

    Returns:
        AP in [0, 1]; 0.0 when nothing is retrieved.

    Raises:
        ValueError: ranks that are not strictly increasing non-negative integers, ``N < 1`` or
            more retrieved positives than ``N``.

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
    j = np.arange(r.size, dtype=np.float64)
    rf = r.astype(np.float64)
    p0 = (
        j / rf if r[0] else np.concatenate(([1.0], j[1:] / rf[1:]))
    )  # p0 = 1 at rank 0 (only first)
    p1 = (j + 1.0) / (rf + 1.0)
    terms = (p0 + p1) * (1.0 / n_positives) / 2.0
    return float(np.cumsum(terms)[-1])  # sequential, like the official loop


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
    """Capped P@K (revisitop's mP@K rule) for each K in ``ks``.

    This is *not* the plain P@K = (positives in the top K) / K: the denominator is capped at the
    rank of the last retrieved positive. With ``pos`` the 1-based ranks of the retrieved positives
    (ignored items deleted), ``kq = min(K, max(pos))`` and ``P@K = |{pos <= kq}| / kq``: three
    positives at ranks 1..3 give 1.0 at K = 10 (plain P@10 would be 0.3). No retrieved positive
    gives 0.

    Args:
        pos_ranks: strictly increasing 0-based ranks of the retrieved positives, shape ``[m]``.
        ks: the K values (positive integers).

    Returns:
        ``float64 [len(ks)]``.

    Example:
        >>> precision_at_ks([0, 1, 2], [1, 5, 10]).tolist()
        [1.0, 1.0, 1.0]
    """
    r = _positions(pos_ranks)
    kk = np.asarray(ks, dtype=np.int64)
    if kk.size and kk.min() < 1:
        raise ValueError(f"every K must be a positive integer, got {list(ks)}")
    if r.size == 0:
        return np.zeros(kk.size, dtype=np.float64)
    kq = np.minimum(kk, r[-1] + 1)
    # r is strictly increasing: |{pos <= kq}| = searchsorted(r, kq - 1, "right"); both counts are
    # exact in float64, so the quotient is the correctly rounded |{pos <= kq}| / kq
    return np.searchsorted(r, kq - 1, side="right") / kq
