"""Paired statistics over queries: is method B's mAP different from method A's, beyond noise?

Both tests work on the per-query differences ``d_q = b_q - a_q`` of two runs on the same queries
(their mean is the mAP difference):

- a **percentile bootstrap** confidence interval of the mean difference: queries are resampled
  with replacement (the pairs stay together) ``n_resamples`` times (``scipy.stats.bootstrap``);
- a **paired randomization test** (sign flips): under the null hypothesis that A and B are
  exchangeable on each query, every ``d_q`` is equally likely to have either sign; the two-sided
  p-value is the share of sign assignments whose mean is at least as extreme as the observed one
  (``scipy.stats.permutation_test``, ``permutation_type="samples"``). When ``2**n`` sign assignments
  are no more than ``n_resamples``, all of them are enumerated and the p-value is exact.

Both are seeded: the same inputs give the same numbers. With several comparisons, p-values are
adjusted with Holm's step-down method (:func:`holm`), which controls the family-wise error rate
without assuming independence.

Example:
    >>> t = paired_test([0.5, 0.6, 0.7], [0.6, 0.8, 1.0])
    >>> round(t.diff, 4), t.exact, t.p_value  # d = 0.1, 0.2, 0.3: 8 sign flips, 2 as extreme
    (0.2, True, 0.25)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError

DEFAULT_RESAMPLES = 10_000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
#: Per-query differences within this are counted as "equal" (APs are computed in double precision).
EQUAL_TOL = 1e-12


@dataclass(frozen=True)
class PairedTest:
    """The paired comparison of two per-query score vectors (B minus A).

    Attributes:
        n: queries compared (those with a value in both).
        mean_a, mean_b: the two means (mAP when the values are APs).
        diff: ``mean_b - mean_a``.
        ci_low, ci_high: the percentile bootstrap interval of ``diff`` at ``confidence``.
        confidence: e.g. 0.95.
        p_value: two-sided paired randomization (sign-flip) test p-value.
        exact: the p-value enumerates all ``2**n`` sign assignments.
        n_better, n_worse, n_equal: queries where B is above / below / equal to A (within
            :data:`EQUAL_TOL`).
        n_resamples: bootstrap resamples and (when not exact) random sign assignments.
        seed: seed of both.
    """

    n: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    exact: bool
    n_better: int
    n_worse: int
    n_equal: int
    n_resamples: int
    seed: int


def _mean_stat(x: NDArray[np.float64], axis: int = -1) -> NDArray[np.float64]:
    return np.mean(x, axis=axis)


def paired_test(
    a: ArrayLike,
    b: ArrayLike,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> PairedTest:
    """Bootstrap CI and randomization p-value of ``mean(b) - mean(a)`` over paired queries.

    Args:
        a, b: per-query values of the two runs, shape ``[n_queries]``; ``nan`` marks a query
            without a value (skipped in a setup). The two must have ``nan`` at the same places.
        n_resamples: bootstrap resamples; also the random sign assignments of the permutation
            test unless all ``2**n`` are fewer (then the test is exact).
        seed: seed of the resampling.
        confidence: level of the interval, in (0, 1).

    Raises:
        InputError: shapes differ, ``nan`` at different queries, fewer than 2 queries left, bad
            settings.
    """
    from scipy import stats

    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise InputError(
            f"per-query values must be two vectors of one length, got {x.shape} and {y.shape}"
        )
    if not np.array_equal(np.isnan(x), np.isnan(y)):
        raise InputError("a query has a value in one run and none (skipped) in the other")
    if not 0.0 < confidence < 1.0:
        raise InputError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise InputError(f"n_resamples must be positive, got {n_resamples}")
    keep = ~np.isnan(x)
    x, y = x[keep], y[keep]
    n = int(x.size)
    if n < 2:
        raise InputError(f"a paired test needs at least 2 queries with values, got {n}")
    d = y - x
    boot = stats.bootstrap(
        (d,),
        _mean_stat,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    perm = stats.permutation_test(
        (d,),
        _mean_stat,
        permutation_type="samples",
        alternative="two-sided",
        n_resamples=n_resamples,
        vectorized=True,
        random_state=np.random.default_rng(seed),
    )
    return PairedTest(
        n=n,
        mean_a=float(np.mean(x)),
        mean_b=float(np.mean(y)),
        diff=float(np.mean(d)),
        ci_low=float(boot.confidence_interval.low),
        ci_high=float(boot.confidence_interval.high),
        confidence=confidence,
        p_value=float(perm.pvalue),
        exact=2**n <= n_resamples,
        n_better=int(np.count_nonzero(d > EQUAL_TOL)),
        n_worse=int(np.count_nonzero(d < -EQUAL_TOL)),
        n_equal=int(np.count_nonzero(np.abs(d) <= EQUAL_TOL)),
        n_resamples=n_resamples,
        seed=seed,
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values (step-down, family-wise error rate), in the input order.

    The i-th smallest p-value is multiplied by ``m - i`` (i = 0, 1, ...), capped at 1 and made
    non-decreasing along the sorted order. ``nan`` entries stay ``nan`` and do not count in ``m``.

    Example:
        >>> holm([0.01, 0.04, 0.03])
        [0.03, 0.06, 0.06]
    """
    vals = [float(p) for p in p_values]
    idx = sorted((i for i, p in enumerate(vals) if not math.isnan(p)), key=lambda i: vals[i])
    m = len(idx)
    out = [math.nan] * len(vals)
    running = 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * vals[i]))
        out[i] = running
    return out
