"""The two-level bootstrap over seeds and queries (oxbench.evaluation.bootstrap), on synthetic
per-query APs whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oxbench.errors import InputError
from oxbench.evaluation.bootstrap import (
    resampled_differences,
    spread_note,
    spread_text,
    two_level_test,
)
from oxbench.report.stats import paired_test

N_QUERIES = 60


def _groups(
    seed_offsets_a: list[float], seed_offsets_b: list[float], shift: float, noise: float = 0.002
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query APs: a base AP per query, plus each seed's offset (a vocabulary that is better or
    worse on every query), plus B's shift, plus small per-query noise."""
    rng = np.random.default_rng(7)
    base = rng.uniform(0.2, 0.8, N_QUERIES)
    a = (
        base
        + np.array(seed_offsets_a)[:, None]
        + rng.normal(0, noise, (len(seed_offsets_a), N_QUERIES))
    )
    b = (
        base
        + shift
        + np.array(seed_offsets_b)[:, None]
        + rng.normal(0, noise, (len(seed_offsets_b), N_QUERIES))
    )
    return a, b


def test_identical_groups_give_p_one() -> None:
    a, _ = _groups([-0.03, 0.0, 0.02], [0, 0, 0], 0.0)
    t = two_level_test(a, a.copy(), n_resamples=2000)
    assert t.diff == 0.0 and t.p_value == 1.0
    assert t.ci_low <= 0.0 <= t.ci_high


def test_a_shift_far_beyond_the_seed_spread_is_significant() -> None:
    a, b = _groups([-0.005, 0.0, 0.005], [-0.004, 0.001, 0.004], 0.10)
    t = two_level_test(a, b, n_resamples=5000)
    assert t.diff == pytest.approx(0.10, abs=0.005)
    assert t.p_value == pytest.approx(1 / 5001)  # no resample as far from d as d is from 0
    assert 0.09 < t.ci_low < t.diff < t.ci_high < 0.11


def test_a_shift_inside_the_seed_spread_is_not_significant_though_consistent_over_queries() -> None:
    # the seeds move the mAP by +-5 points; B is 1 point better on every query at every seed
    offsets = [-0.05, 0.0, 0.05]
    a, b = _groups(offsets, offsets, 0.01)
    single = paired_test(a[0], b[0], n_resamples=5000)
    assert (b[0] - a[0] > 0).all() and single.p_value < 0.001  # one seed: "significant"
    t = two_level_test(a, b, n_resamples=5000)
    assert t.diff == pytest.approx(0.01, abs=0.002)
    assert t.p_value > 0.3 and t.ci_low < 0.0 < t.ci_high  # against the seed spread: not


def test_one_seed_each_is_the_paired_query_bootstrap() -> None:
    rng = np.random.default_rng(3)
    a = rng.uniform(0, 1, 80)
    b = np.clip(a + rng.normal(0.03, 0.1, 80), 0, 1)
    t = two_level_test(a, b, n_resamples=20_000, seed=1)
    ref = paired_test(a, b, n_resamples=20_000, seed=1)
    assert t.diff == pytest.approx(ref.diff)
    width = ref.ci_high - ref.ci_low
    assert abs(t.ci_low - ref.ci_low) < 0.05 * width
    assert abs(t.ci_high - ref.ci_high) < 0.05 * width


def test_resamples_from_counts_equal_explicit_resamples() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(size=(3, 11)), rng.uniform(size=(4, 11))
    got = resampled_differences(a, b, 50, seed=5)
    draws = np.random.default_rng(5)  # the same draws, in the same order, used by definition
    ia = draws.integers(0, 3, size=(50, 3))
    ib = draws.integers(0, 4, size=(50, 4))
    iq = draws.integers(0, 11, size=(50, 11))
    want = [b[ib[r]][:, iq[r]].mean() - a[ia[r]][:, iq[r]].mean() for r in range(50)]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_queries_without_a_value_are_left_out_of_both() -> None:
    a = np.array([[0.5, np.nan, 0.7], [0.4, np.nan, 0.6]])
    b = np.array([[0.6, 0.9, 0.8]])
    t = two_level_test(a, b, n_resamples=100)
    assert t.n_queries == 2 and t.mean_a == pytest.approx(0.55) and t.mean_b == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ([[0.1, 0.2]], [[0.1, 0.2, 0.3]], "2 and 3 queries"),
        ([[np.nan]], [[0.1]], "no query has a value"),
        ([[np.inf, 0.1]], [[0.1, 0.1]], "infinite"),
        ([], [[0.1]], "seeds x queries"),
    ],
)
def test_bad_inputs_are_one_line(a: list, b: list, why: str) -> None:
    with pytest.raises(InputError, match=why):
        two_level_test(a, b, n_resamples=10)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InputError, match="confidence"):
        two_level_test([[0.1]], [[0.2]], confidence=float("nan"))
    with pytest.raises(InputError, match="n_resamples"):
        two_level_test([[0.1]], [[0.2]], n_resamples=0)


@settings(max_examples=30, deadline=None)
@given(
    arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)), elements=st.floats(0, 1)),
    st.integers(1, 4),
)
def test_swapping_the_groups_negates_the_difference(a: np.ndarray, nb: int) -> None:
    b = np.roll(a, 1, axis=1)[:1].repeat(nb, axis=0) * 0.5
    t, u = two_level_test(a, b, n_resamples=200), two_level_test(b, a, n_resamples=200)
    assert u.diff == pytest.approx(-t.diff)
    assert 0.0 < t.p_value <= 1.0 and t.ci_low <= t.ci_high
    assert u.p_value == pytest.approx(t.p_value, abs=0.15)  # other draws, same distribution


def test_spread_text_follows_the_seed_count() -> None:
    assert spread_text([0.724]) == "72.4"
    assert spread_text([0.71, 0.739, 0.722]) == "72.4 (71.0-73.9)"
    # n >= 5: mean +- sample sd (ddof 1): 1..5 -> mean 3, sd sqrt(2.5) = 1.58
    assert spread_text([0.01, 0.02, 0.03, 0.04, 0.05]) == "3.0 \u00b1 1.6"
    assert spread_text([0.5, np.nan]) == "-"
    assert spread_note(3) == "mean (min-max) over 3 seeds"
    assert spread_note(5) == "mean \u00b1 sample standard deviation over 5 seeds"
