"""Diffusion re-ranking (Iscen et al. 2017) and database-side augmentation of global descriptors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from oxbench.errors import InputError
from oxbench.evaluation.ap import average_precision
from oxbench.index.search import exact_search
from oxbench.pipelines.globalchain import augment_database
from oxbench.rerank.diffusion import (
    Diffusion,
    DiffusionSettings,
    diffuse,
    knn_affinity,
    normalize_affinity,
)

pytest.importorskip("faiss")


def two_spirals(n: int = 300, noise: float = 0.02, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved spirals in the plane, lifted to unit 3-D vectors (cosine ~ planar distance)."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0.05, 1.0, n)) * 3 * np.pi
    a = np.stack([t * np.cos(t), t * np.sin(t)], axis=1) / (3 * np.pi)
    xy = np.vstack([a, -a]) + noise * rng.normal(size=(2 * n, 2))
    v = np.hstack([xy, np.full((2 * n, 1), 0.6)])
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32), np.repeat([0, 1], n)


def mean_ap(ranks: np.ndarray, labels: np.ndarray, queries: np.ndarray) -> float:
    aps = []
    for row, qi in zip(ranks, queries, strict=True):
        relevant = labels[row] == labels[qi]
        aps.append(average_precision(np.nonzero(relevant)[0], int(relevant.sum())))
    return float(np.mean(aps))


def test_diffusion_follows_the_manifold() -> None:
    v, labels = two_spirals()
    queries = np.random.default_rng(1).choice(len(v), 20, replace=False)
    _, ranks = exact_search(v[queries], v)
    plain = mean_ap(ranks, labels, queries)
    d = Diffusion(DiffusionSettings(k=20, query_k=5, truncation=len(v))).fit(v)
    new_ranks, scores = d.rerank(v[queries], ranks)
    diffused = mean_ap(new_ranks, labels, queries)
    # measured: cosine 0.60, diffusion 0.95 -- the spirals interleave, cosine mixes them
    assert diffused > plain + 0.2, (plain, diffused)
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert all(sorted(r) == list(range(len(v))) for r in new_ranks.tolist())


def test_truncation_keeps_the_tail_of_the_initial_ranking() -> None:
    v, _ = two_spirals(n=100)
    _, ranks = exact_search(v[:3], v)
    new_ranks, scores = Diffusion(DiffusionSettings(k=10, truncation=50)).fit(v).rerank(v[:3], ranks)
    np.testing.assert_array_equal(new_ranks[:, 50:], ranks[:, 50:])
    assert np.all(scores[:, 50:] == 0)
    for a, b in zip(new_ranks[:, :50], ranks[:, :50], strict=True):
        assert set(a.tolist()) == set(b.tolist())


def test_cg_solution_equals_a_dense_solve(rng: np.random.Generator) -> None:
    x = rng.normal(size=(60, 5))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    a = knn_affinity(x, 8)
    assert (a != a.T).nnz == 0 and a.diagonal().max() == 0
    w = normalize_affinity(a)
    y = np.zeros(60)
    y[[3, 7, 11]] = [1.0, 0.5, 0.25]
    for alpha in (0.5, 0.9, 0.99):
        f = diffuse(w, y, alpha=alpha, iterations=500, tol=1e-12)
        dense = np.linalg.solve(np.eye(60) - alpha * w.toarray(), y)
        np.testing.assert_allclose(f, dense, rtol=1e-7, atol=1e-9)


def test_affinity_is_mutual_knn_with_cubed_similarity() -> None:
    # a point on a line: 0 -- 1 -- 2 ....... 3 ; with k = 1, 3's nearest is 2 but 2's nearest is 1
    ang = np.array([0.0, 0.1, 0.25, 1.2])
    x = np.stack([np.cos(ang), np.sin(ang)], axis=1)
    a = knn_affinity(x, 1).toarray()
    expected = np.zeros((4, 4))
    expected[0, 1] = expected[1, 0] = np.cos(0.1) ** 3
    np.testing.assert_allclose(a, expected, rtol=1e-6)
    w = normalize_affinity(sp.csr_matrix(a)).toarray()
    np.testing.assert_allclose(w[0, 1], 1.0, rtol=1e-6)  # degree-normalised; isolated nodes stay 0
    assert not w[2:].any()


def test_bad_settings_and_inputs() -> None:
    with pytest.raises(InputError, match="alpha must be in \\(0, 1\\)"):
        DiffusionSettings(alpha=1.0)
    with pytest.raises(InputError, match="must be >= 1"):
        DiffusionSettings(k=0)
    v, _ = two_spirals(n=20)
    d = Diffusion(DiffusionSettings(k=3))
    with pytest.raises(InputError, match="fit the database graph"):
        d.rerank(v[:2], np.zeros((2, 5), np.int64))
    d.fit(v)
    with pytest.raises(InputError, match="do not match the database dimension 3"):
        d.rerank(v[:2, :2], np.zeros((2, 5), np.int64))
    with pytest.raises(InputError, match="outside the database"):
        d.rerank(v[:2], np.full((2, 5), 40))


def test_database_side_augmentation_averages_each_vector_with_its_neighbours(rng: np.random.Generator) -> None:
    x = rng.normal(size=(30, 4))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    out = augment_database(x, 3, alpha=0.0)
    sims = x @ x.T
    for i in (0, 17):
        others = [j for j in np.argsort(-sims[i], kind="stable") if j != i][:3]
        want = x[i] + x[others].sum(axis=0)
        np.testing.assert_allclose(out[i], want / np.linalg.norm(want), atol=1e-6)
    # alpha weights: far neighbours count less than with plain averaging
    a3 = augment_database(x, 3, alpha=3.0)
    assert np.mean(np.sum(a3 * x, axis=1)) > np.mean(np.sum(out * x, axis=1))
    np.testing.assert_array_equal(augment_database(x, 0, alpha=3.0), x)
