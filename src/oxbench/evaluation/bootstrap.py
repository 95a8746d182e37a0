"""The two-level (hierarchical) bootstrap of a difference of mAP between two seed groups.

Two methods, each run with several seeds (:mod:`oxbench.pipelines.seedgroup`), give per-query
values ``a[s, q]`` (seed ``s`` of method A, query ``q``) and ``b[t, q]`` on the same queries. The
statistic is the difference of the grand means, ``d = mean(b) - mean(a)`` (the mAP of B averaged
over its seeds minus that of A). Its sampling distribution has two sources of noise: which seeds
were drawn (the vocabulary, the projection ... a method learns) and which queries the benchmark
has. The two-level bootstrap resamples both, in the order they were drawn:

1. seeds: ``S_a`` of A's ``n_a`` seeds with replacement, and ``S_b`` of B's ``n_b``, independently
   (seed ``i`` of A and seed ``i`` of B are unrelated runs);
2. queries: ``n_q`` of the queries with replacement, the same for both methods (the queries are
   paired: both methods answer each one);
3. ``d* = mean(b[S_b][:, Q]) - mean(a[S_a][:, Q])``.

Repeated ``n_resamples`` times, the percentiles of ``d*`` are the confidence interval, and the
two-sided p-value is that of the bootstrap distribution shifted to the null hypothesis (mean
difference zero; Hall & Wilson 1991): ``p = (1 + #{|d* - d| >= |d|}) / (1 + n_resamples)``. A shift
smaller than what the seeds move the mAP by is not significant however consistent it is over the
queries; with one seed per method the test is the paired query bootstrap.

Each resample is computed from counts, not copies: with ``w_q`` the share of query ``q`` in the
resampled queries and ``c_s`` the share of seed ``s`` in the resampled seeds,
``mean(a[S_a][:, Q]) = sum_s c_s sum_q w_q a[s, q]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError

#: Resamples computed together (a ``(chunk, n_queries)`` weight matrix).
_CHUNK = 1024


@dataclass(frozen=True)
class TwoLevelTest:
    """The two-level bootstrap of ``mean(b) - mean(a)``.

    Attributes:
        n_seeds_a, n_seeds_b: seeds of each group.
        n_queries: queries used (those with a value in every run of both groups).
        mean_a, mean_b: the grand means.
        diff: ``mean_b - mean_a``.
        ci_low, ci_high: percentile interval of the resampled differences at ``confidence``.
        confidence: e.g. 0.95.
        p_value: two-sided, of the null-shifted bootstrap distribution.
        n_resamples: how many resamples.
        seed: seed of the resampling.
    """

    n_seeds_a: int
    n_seeds_b: int
    n_queries: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    n_resamples: int
    seed: int


def _matrix(x: ArrayLike, name: str) -> NDArray[np.float64]:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise InputError(
            f"{name}: expected per-query values of one or more seeds (seeds x queries)"
        )
    if np.isinf(arr).any():
        raise InputError(f"{name}: infinite per-query value")
    return arr


def resampled_differences(
    a: NDArray[np.float64], b: NDArray[np.float64], n_resamples: int, seed: int
) -> NDArray[np.float64]:
    """``n_resamples`` values of ``d*`` (seeds of each group, then the shared queries, resampled)."""
    rng = np.random.default_rng(seed)
    (na, nq), nb = a.shape, b.shape[0]
    out = np.empty(n_resamples)
    for lo in range(0, n_resamples, _CHUNK):
        r = min(_CHUNK, n_resamples - lo)
        # seed shares c (r, n_seeds), then query shares w (r, n_queries): counts / sample size
        ca = _shares(rng.integers(0, na, size=(r, na)), na)
        cb = _shares(rng.integers(0, nb, size=(r, nb)), nb)
        w = _shares(rng.integers(0, nq, size=(r, nq)), nq)
        mean_a = np.einsum("rs,rs->r", ca, w @ a.T)
        mean_b = np.einsum("rs,rs->r", cb, w @ b.T)
        out[lo : lo + r] = mean_b - mean_a
    return out


def _shares(draws: NDArray[np.int64], n: int) -> NDArray[np.float64]:
    rows = draws.shape[0]
    counts = np.zeros((rows, n))
    np.add.at(counts, (np.repeat(np.arange(rows), draws.shape[1]), draws.ravel()), 1.0)
    return counts / draws.shape[1]


def two_level_test(
    a: ArrayLike,
    b: ArrayLike,
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
    confidence: float = 0.95,
) -> TwoLevelTest:
    """The two-level bootstrap of ``mean(b) - mean(a)`` (module docstring).

    ``a`` and ``b`` are ``(seeds, queries)`` per-query values (one row: one seed), the same queries
    in the same order; a query without a value (NaN) in any run is left out of both.

    Raises:
        InputError: not 2-D, different query counts, no query with values everywhere, infinite
            values, ``n_resamples < 1`` or ``confidence`` outside (0, 1).

    Example:
        >>> t = two_level_test([[0.5, 0.6]], [[0.5, 0.6]], n_resamples=100)
        >>> t.diff, t.p_value
        (0.0, 1.0)
    """
    a_m, b_m = _matrix(a, "group A"), _matrix(b, "group B")
    if a_m.shape[1] != b_m.shape[1]:
        raise InputError(
            f"the groups have {a_m.shape[1]} and {b_m.shape[1]} queries: not the same benchmark"
        )
    if not (isinstance(n_resamples, int) and n_resamples >= 1):
        raise InputError(f"n_resamples must be a whole number >= 1, got {n_resamples!r}")
    if not (0.0 < confidence < 1.0):  # NaN fails too
        raise InputError(f"confidence must be in (0, 1), got {confidence!r}")
    keep = ~(np.isnan(a_m).any(axis=0) | np.isnan(b_m).any(axis=0))
    if not keep.any():
        raise InputError("no query has a value in every run of both groups")
    a_m, b_m = a_m[:, keep], b_m[:, keep]
    mean_a, mean_b = float(a_m.mean()), float(b_m.mean())
    diff = mean_b - mean_a
    d = resampled_differences(a_m, b_m, n_resamples, seed)
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(d, [tail, 1.0 - tail])
    tol = 1e-12 * max(1.0, abs(diff))  # the same mean summed in another order
    extreme = int(np.count_nonzero(np.abs(d - diff) >= abs(diff) - tol))
    return TwoLevelTest(
        n_seeds_a=a_m.shape[0],
        n_seeds_b=b_m.shape[0],
        n_queries=int(keep.sum()),
        mean_a=mean_a,
        mean_b=mean_b,
        diff=diff,
        ci_low=float(lo),
        ci_high=float(hi),
        confidence=confidence,
        p_value=min(1.0, (1 + extreme) / (1 + n_resamples)),
        n_resamples=n_resamples,
        seed=seed,
    )


def spread_text(values: ArrayLike, decimals: int = 1, *, scale: float = 100.0) -> str:
    """A seed group's number as tables write it: ``72.4 ± 1.3`` (mean ± sample standard deviation)
    for 5 or more seeds, ``72.4 (71.0-73.9)`` (mean and min-max) for 2 to 4, the value for one.

    Example:
        >>> spread_text([0.71, 0.739, 0.722])
        '72.4 (71.0-73.9)'
    """
    v = np.asarray(values, dtype=np.float64) * scale
    if v.size == 0 or np.isnan(v).any():
        return "-"
    mean = float(v.mean())
    if v.size == 1:
        return f"{mean:.{decimals}f}"
    if v.size >= 5:
        return f"{mean:.{decimals}f} \u00b1 {float(v.std(ddof=1)):.{decimals}f}"
    return f"{mean:.{decimals}f} ({float(v.min()):.{decimals}f}-{float(v.max()):.{decimals}f})"


def spread_note(n: int) -> str:
    """What :func:`spread_text` shows for ``n`` seeds, in words."""
    if n <= 1:
        return "one seed"
    if n >= 5:
        return f"mean \u00b1 sample standard deviation over {n} seeds"
    return f"mean (min-max) over {n} seeds"


__all__ = ["TwoLevelTest", "resampled_differences", "spread_note", "spread_text", "two_level_test"]
