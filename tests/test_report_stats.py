"""Paired statistics: known answers (identical runs, a constant shift, exact sign-flip enumeration), Holm."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.report.stats import holm, paired_test


def brute_force_p(d: np.ndarray) -> float:
    """Two-sided sign-flip p-value by enumerating all 2^n sign assignments (reference)."""
    obs = d.mean()
    means = np.array([np.mean(d * np.array(s)) for s in itertools.product([1, -1], repeat=d.size)])
    tol = 1e-12
    greater = np.mean(means >= obs - tol)
    less = np.mean(means <= obs + tol)
    return min(1.0, 2 * min(greater, less))


def test_identical_runs_p_one_ci_zero(rng):
    a = rng.uniform(0, 1, 70)
    t = paired_test(a, a.copy())
    assert t.p_value == 1.0
    assert (t.ci_low, t.ci_high) == (0.0, 0.0)
    assert (t.n_better, t.n_worse, t.n_equal) == (0, 0, 70)
    assert t.diff == 0.0 and not t.exact


def test_constant_shift_ci_is_the_shift(rng):
    a = rng.uniform(0, 0.9, 70)
    t = paired_test(a, a + 0.05)
    assert t.ci_low == pytest.approx(0.05, abs=1e-12) and t.ci_high == pytest.approx(
        0.05, abs=1e-12
    )
    assert t.diff == pytest.approx(0.05, abs=1e-12)
    assert t.n_better == 70
    # 70 same-sign differences: no random flip is as extreme (chance 2^-69), so each tail is the
    # smallest randomized p-value (0 + 1) / (10,000 + 1), and the two-sided p twice that
    assert t.p_value == pytest.approx(2 / 10_001, rel=1e-12)


def test_hand_computed_exact_p_value():
    # d = 0.1, 0.2, 0.3: sums over the 8 sign flips are +-0.6, +-0.4, +-0.2, +-0.0 (twice);
    # as extreme as +0.6 (either side): 2 of 8 -> p = 0.25
    t = paired_test([0.5, 0.6, 0.7], [0.6, 0.8, 1.0])
    assert t.exact and t.p_value == pytest.approx(0.25)
    # d = 1, -1, 2, 0 (n = 4, 16 flips): observed sum 2; |sum| >= 2 for sums in {+-2, +-4}:
    # sums of +-1 +-1 +-2 (x2 for the zero) -> {4, 2, 0, 2, 0, -2, -2, -4} twice: 12 of 16
    t = paired_test([0.0, 1.0, 0.0, 0.5], [1.0, 0.0, 2.0, 0.5])
    assert t.exact and t.p_value == pytest.approx(12 / 16)
    assert (t.n_better, t.n_worse, t.n_equal) == (2, 1, 1)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(-1, 1, allow_nan=False).map(lambda v: round(v, 3)), min_size=2, max_size=9)
)
def test_exact_p_matches_enumeration(diffs):
    d = np.array(diffs)
    t = paired_test(np.zeros_like(d), d)
    assert t.exact
    assert t.p_value == pytest.approx(brute_force_p(d), abs=1e-9)


def test_random_test_is_seeded_and_near_exact(rng):
    a = rng.uniform(0, 1, 16)
    b = np.clip(a + rng.normal(0.05, 0.1, 16), 0, 1)
    t1, t2 = paired_test(a, b, seed=3), paired_test(a, b, seed=3)
    assert t1 == t2 and not t1.exact
    exact = brute_force_p(b - a)
    assert t1.p_value == pytest.approx(exact, abs=0.015)  # 10,000 flips: standard error < 0.005
    assert t1.ci_low < t1.diff < t1.ci_high


def test_nan_skipped_queries_and_refusals():
    t = paired_test([0.1, np.nan, 0.3], [0.2, np.nan, 0.5])
    assert t.n == 2
    with pytest.raises(InputError, match="skipped"):
        paired_test([0.1, np.nan, 0.3], [0.2, 0.4, 0.5])
    with pytest.raises(InputError, match="at least 2"):
        paired_test([0.1], [0.2])
    with pytest.raises(InputError, match="one length"):
        paired_test([0.1, 0.2], [0.2])


def test_holm():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5]) == [0.5]
    out = holm([0.2, math.nan, 0.9])
    assert out[0] == pytest.approx(0.4) and math.isnan(out[1]) and out[2] == pytest.approx(0.9)
    assert holm([0.6, 0.7]) == [1.0, 1.0]
