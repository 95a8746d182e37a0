"""Query expansion and database-side augmentation: hand-computed values, dense == sparse."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oxbench.errors import InputError
from oxbench.refinement.qe import (
    alpha_query_expansion,
    average_query_expansion,
    database_side_augmentation,
    discriminative_query_expansion,
)


def dense(x) -> np.ndarray:
    return np.asarray(x.toarray() if sp.issparse(x) else x, dtype=np.float64)


# ------------------------------------------------------------------ average QE


def test_aqe_hand_example():
    q = np.array([1.0, 0.0, 0.0])
    v = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    np.testing.assert_allclose(
        average_query_expansion(q, v, normalize=False), [1 / 3, 1 / 3, 2 / 3]
    )
    # Normalised: v rows become unit vectors, the mean [1,1,1]/3 is normalised.
    np.testing.assert_allclose(average_query_expansion(q, v), np.ones(3) / np.sqrt(3))


def test_aqe_kinds_and_shapes():
    q = np.array([3.0, 0.0, 4.0, 0.0])
    v = np.array([[0.0, 2.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    ref = average_query_expansion(q, v)
    assert ref.shape == (4,)
    out_2d = average_query_expansion(q[None, :], v)
    assert out_2d.shape == (1, 4)
    out_sp = average_query_expansion(sp.csr_matrix(q), sp.csr_matrix(v))
    assert sp.issparse(out_sp) and out_sp.shape == (1, 4)
    mixed_a = average_query_expansion(sp.csr_matrix(q), v)
    mixed_b = average_query_expansion(q, sp.csr_matrix(v))
    assert sp.issparse(mixed_a) and isinstance(mixed_b, np.ndarray) and mixed_b.shape == (4,)
    for out in (out_2d, out_sp, mixed_a, mixed_b):
        np.testing.assert_allclose(dense(out).ravel(), ref)
    # Expected by hand: (0.6,0,0.8) + (0,1,0,0) + (0.5,0.5,0.5,0.5), normalised.
    s = np.array([1.1, 1.5, 1.3, 0.5])
    np.testing.assert_allclose(ref, s / np.linalg.norm(s))


def test_aqe_no_verified_returns_normalised_query():
    q = np.array([0.0, 2.0])
    np.testing.assert_allclose(average_query_expansion(q, np.zeros((0, 2))), [0.0, 1.0])
    out = average_query_expansion(sp.csr_matrix(q), sp.csr_matrix((0, 2)))
    np.testing.assert_allclose(dense(out), [[0.0, 1.0]])


def test_qe_bad_input():
    with pytest.raises(InputError):
        average_query_expansion(np.ones(3), np.ones((2, 4)))
    with pytest.raises(InputError):
        average_query_expansion(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(InputError):
        average_query_expansion(np.array([np.nan, 1.0]), np.ones((1, 2)))
    with pytest.raises(InputError):
        alpha_query_expansion(np.ones(2), np.ones((2, 2)), similarities=np.ones(3))
    with pytest.raises(InputError):
        discriminative_query_expansion(np.ones(2), np.ones((1, 2)), np.zeros((0, 2)))


# ------------------------------------------------------------------ alpha QE


def test_alpha_qe_hand_example():
    q = np.array([1.0, 0.0])
    x = np.array([[0.6, 0.8], [0.0, 1.0], [-1.0, 0.0]])
    # sims 0.6, 0, -1 -> weights 0.36, 0, 0 (negative similarities are clipped).
    total = np.array([1.0, 0.0]) + 0.36 * np.array([0.6, 0.8])
    np.testing.assert_allclose(
        alpha_query_expansion(q, x, alpha=2.0, normalize=False), total / 1.36
    )
    np.testing.assert_allclose(
        alpha_query_expansion(q, x, alpha=2.0), total / np.linalg.norm(total)
    )
    given_sims = alpha_query_expansion(
        q, x, alpha=1.0, similarities=[1.0, 1.0, 0.0], normalize=False
    )
    np.testing.assert_allclose(given_sims, (q + x[0] + x[1]) / 3)


vectors = arrays(
    np.float64,
    st.tuples(st.integers(1, 6), st.just(5)),
    elements=st.floats(0.0, 10.0, allow_subnormal=False),
)


@settings(max_examples=40, deadline=None)
@given(v=vectors, q=arrays(np.float64, 5, elements=st.floats(0.1, 10.0)))
def test_alpha_zero_is_average_qe(v, q):
    np.testing.assert_allclose(
        alpha_query_expansion(q, v, alpha=0.0), average_query_expansion(q, v), atol=1e-12
    )
    np.testing.assert_allclose(
        dense(alpha_query_expansion(sp.csr_matrix(q), sp.csr_matrix(v))),
        alpha_query_expansion(q, v)[None, :],
        atol=1e-12,
    )


# ------------------------------------------------------------------ DBA


def test_dba_hand_example():
    x = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    nbrs = np.array([[2, -1], [0, 1], [0, 1]])  # row 1 lists itself: ignored
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    # normalize=False: raw vectors, weighted mean.
    out = database_side_augmentation(x, nbrs, normalize=False)
    np.testing.assert_allclose(out[0], (x[0] + x[2]) / 2)
    np.testing.assert_allclose(out[1], (x[1] + x[0]) / 2)
    np.testing.assert_allclose(out[2], (x[2] + x[0] + x[1]) / 3)
    # Rank weights with k = 2: first valid neighbour 2/3, second 1/3, self 1.
    out = database_side_augmentation(x, nbrs, weights="rank", normalize=False)
    np.testing.assert_allclose(out[0], (x[0] + 2 / 3 * x[2]) / (5 / 3))
    np.testing.assert_allclose(out[1], (x[1] + 2 / 3 * x[0]) / (5 / 3))
    np.testing.assert_allclose(out[2], (x[2] + 2 / 3 * x[0] + 1 / 3 * x[1]) / 2)
    # Alpha weights: sim(2, 0) = 0.6, sim(2, 1) = 0.8, sim(0, 2) = 0.6, sim(1, 0) = 0.
    out = database_side_augmentation(x, nbrs, weights="alpha", alpha=1.0)
    s = xn[2] + 0.6 * xn[0] + 0.8 * xn[1]
    np.testing.assert_allclose(out[2], s / np.linalg.norm(s))
    np.testing.assert_allclose(out[1], xn[1])


def test_dba_dense_equals_sparse(rng):
    x = rng.random((30, 50)) * (rng.random((30, 50)) < 0.2)
    nbrs = np.argsort(-(x @ x.T), axis=1)[:, :4]
    nbrs[::5, -1] = -1
    for weights in ("uniform", "rank", "alpha"):
        a = database_side_augmentation(x, nbrs, weights=weights)
        b = database_side_augmentation(sp.csr_matrix(x), nbrs, weights=weights)
        assert sp.issparse(b) and b.shape == a.shape
        np.testing.assert_allclose(dense(b), a, atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(a[x.any(axis=1)], axis=1), 1.0)


def test_dba_bad_input():
    x = np.ones((3, 2))
    with pytest.raises(InputError):
        database_side_augmentation(x, np.array([[3], [0], [1]]))
    with pytest.raises(InputError):
        database_side_augmentation(x, np.array([[1], [0]]))
    with pytest.raises(InputError):
        database_side_augmentation(x, np.array([[1], [0], [1]]), weights="median")


# ------------------------------------------------------------------ DQE


def test_dqe_one_dimensional_exact_solution():
    """Points +1 (positive) and -1 (negative): b = 0 by symmetry, w minimises
    w^2/2 + 2c(1 - w)^2, so w = 4c / (1 + 4c)."""
    for c in (0.1, 1.0, 5.0):
        w = discriminative_query_expansion(
            np.array([1.0]), np.zeros((0, 1)), np.array([[-1.0]]), c=c, normalize=False
        )
        np.testing.assert_allclose(w, [4 * c / (1 + 4 * c)], rtol=1e-6)


def test_dqe_separates_linearly_separable_toy(rng):
    d = 20
    direction = rng.normal(size=d)
    pos = rng.normal(size=(6, d)) + 3.0 * direction
    neg = rng.normal(size=(200, d)) - 1.0 * direction
    q = pos[0]
    w = discriminative_query_expansion(q, pos[1:], neg, c=10.0)
    assert w.shape == (d,)
    np.testing.assert_allclose(np.linalg.norm(w), 1.0)
    unit = lambda m: m / np.linalg.norm(m, axis=1, keepdims=True)  # noqa: E731
    assert (unit(pos) @ w).min() > (unit(neg) @ w).max()
    # Sparse input gives the same weight vector, as a CSR row.
    ws = discriminative_query_expansion(
        sp.csr_matrix(q), sp.csr_matrix(pos[1:]), sp.csr_matrix(neg), c=10.0
    )
    assert sp.issparse(ws) and ws.shape == (1, d)
    np.testing.assert_allclose(dense(ws).ravel(), w, atol=1e-5)


def test_dqe_sparse_weights_live_on_the_training_support():
    dim = 1_000_000  # a 1M-word vocabulary costs nothing: only used dimensions are optimised
    q = sp.csr_matrix(([1.0, 1.0], ([0, 0], [10, 500_000])), shape=(1, dim))
    pos = sp.csr_matrix(([1.0, 1.0], ([0, 0], [10, 20])), shape=(1, dim))
    neg = sp.csr_matrix(([1.0, 1.0], ([0, 1], [999_999, 30])), shape=(2, dim))
    w = discriminative_query_expansion(q, pos, neg)
    assert set(w.indices.tolist()) <= {10, 20, 30, 500_000, 999_999}
    dense_w = w.toarray().ravel()
    assert dense_w[10] > dense_w[20] > 0 and dense_w[30] < 0 and dense_w[999_999] < 0


@settings(max_examples=30, deadline=None)
@given(v=vectors, seed=st.integers(0, 2**16))
def test_aqe_ignores_the_order_of_verified_images(v, seed):
    q = np.arange(1.0, 6.0)
    perm = np.random.default_rng(seed).permutation(len(v))
    np.testing.assert_allclose(
        average_query_expansion(q, v[perm]), average_query_expansion(q, v), atol=1e-12
    )


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**16), weights=st.sampled_from(["uniform", "rank", "alpha"]))
def test_dba_is_equivariant_to_renumbering_the_database(seed, weights):
    rng = np.random.default_rng(seed)
    x = rng.random((12, 6))
    nbrs = np.argsort(-(x @ x.T), axis=1)[:, :3]
    perm = rng.permutation(12)
    inv = np.argsort(perm)
    out = database_side_augmentation(x, nbrs, weights=weights)
    # Image perm[i] becomes image i: rows move and neighbour ids are renamed.
    out_p = database_side_augmentation(x[perm], inv[nbrs[perm]], weights=weights)
    np.testing.assert_allclose(out_p, out[perm], atol=1e-12)
