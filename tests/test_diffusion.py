"""Diffusion re-ranking (Iscen et al. 2017) and database-side augmentation of global descriptors."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from oxbench.errors import InputError
from oxbench.evaluation.ap import average_precision
from oxbench.index.search import exact_search
from oxbench.pipelines.rerankers.dba import augment_database
from oxbench.refinement.diffusion import (
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
    new_ranks, scores = (
        Diffusion(DiffusionSettings(k=10, truncation=50)).fit(v).rerank(v[:3], ranks)
    )
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
    # the one schema names each setting: by its field here, by its stage instance in a pipeline
    from oxbench.pipelines import resolve_method

    with pytest.raises(InputError, match="setting diffusion-verified.alpha: expected a finite"):
        resolve_method("rootsift-bow-sv+vlad-dfs", **{"diffusion-verified.alpha": "high"})
    with pytest.raises(InputError, match="setting alpha: expected a finite number"):
        DiffusionSettings(alpha="high")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="setting k: must be in \\[2, 65536\\]"):
        DiffusionSettings(k=1)
    with pytest.raises(InputError, match="setting truncation: must be in \\[1,"):
        DiffusionSettings(truncation=0)
    for alpha in (0.0, 1.0, -0.5, float("nan"), float("inf")):
        with pytest.raises(InputError, match="setting alpha: "):
            DiffusionSettings(alpha=alpha)
    with pytest.raises(InputError, match="setting gamma"):
        DiffusionSettings(gamma=float("nan"))
    with pytest.raises(InputError, match="setting normalise: .*full, subgraph"):
        DiffusionSettings(normalise="degrees")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="setting mode: .*online, offline"):
        DiffusionSettings(mode="batch")  # type: ignore[arg-type]
    v, _ = two_spirals(n=20)
    with pytest.raises(
        InputError, match="diffusion.k=41 is larger than the database \\(40 images\\)"
    ):
        Diffusion(DiffusionSettings(k=41)).fit(v)
    d = Diffusion(DiffusionSettings(k=3))
    with pytest.raises(InputError, match="fit the database graph"):
        d.rerank(v[:2], np.zeros((2, 5), np.int64))
    d.fit(v)
    with pytest.raises(InputError, match="do not match the database dimension 3"):
        d.rerank(v[:2, :2], np.zeros((2, 5), np.int64))
    with pytest.raises(InputError, match="outside the database"):
        d.rerank(v[:2], np.full((2, 5), 40))


def test_database_side_augmentation_averages_each_vector_with_its_neighbours(
    rng: np.random.Generator,
) -> None:
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


# ---------------------------------------------------------------------------------------------
# The reference conventions (issue 20): k counts the image itself, the truncated diffusion takes
# its weights from the whole graph's normalisation, offline = linear combination of per-image
# diffusions. References written from the formulas (Iscen et al. 2017, Sec. 3), dense numpy.


def ref_affinity(x: np.ndarray, k: int, gamma: float = 3.0) -> np.ndarray:
    """Dense mutual k-NN affinity, each image's list of ``k`` holding the image itself first."""
    s = x.astype(np.float64) @ x.T.astype(np.float64)
    lists = [set(np.argsort(-s[i], kind="stable")[:k].tolist()) for i in range(len(x))]
    a = np.zeros_like(s)
    for i in range(len(x)):
        for j in lists[i]:
            if j != i and i in lists[j]:
                a[i, j] = max(s[i, j], 0.0) ** gamma
    return a


def ref_normalise(a: np.ndarray) -> np.ndarray:
    d = a.sum(axis=1)
    inv = np.divide(1.0, np.sqrt(d), out=np.zeros_like(d), where=d > 0)
    return inv[:, None] * a * inv[None, :]


def ref_query_vector(
    x: np.ndarray, q: np.ndarray, nodes: np.ndarray, query_k: int, gamma: float = 3.0
) -> np.ndarray:
    sims = x[nodes].astype(np.float64) @ q.astype(np.float64)
    y = np.zeros(len(nodes))
    seeds = np.argsort(-sims, kind="stable")[:query_k]
    y[seeds] = np.clip(sims[seeds], 0.0, None) ** gamma
    return y


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clusters(
    n_clusters: int = 6, size: int = 40, dim: int = 16, spread: float = 0.15, seed: int = 0
):
    """Tight clusters around orthogonal directions: their mutual k-NN graphs are separate."""
    rng = np.random.default_rng(seed)
    centres = np.eye(dim)[:n_clusters]
    x = np.repeat(centres, size, axis=0) + spread * rng.normal(
        size=(n_clusters * size, dim)
    ) / np.sqrt(dim)
    return unit(x), np.repeat(np.arange(n_clusters), size)


EXACT = {"iterations": 500, "tol": 1e-12}


def test_k_counts_the_image_itself(rng: np.random.Generator) -> None:
    x = unit(rng.normal(size=(80, 6)))
    d = Diffusion(DiffusionSettings(k=7, **EXACT)).fit(x)
    assert d.affinity_ is not None
    assert int(np.diff(d.affinity_.indptr).max()) <= 6  # k = 7: the image and at most 6 others
    np.testing.assert_allclose(d.affinity_.toarray(), ref_affinity(x, 7), rtol=1e-5, atol=1e-12)
    # k = 2: only mutual nearest neighbours are linked
    a2 = Diffusion(DiffusionSettings(k=2)).fit(x).affinity_
    assert a2 is not None and int(np.diff(a2.indptr).max()) == 1


@pytest.mark.parametrize("normalise", ["full", "subgraph"])
def test_truncated_diffusion_against_the_formula(normalise: str, rng: np.random.Generator) -> None:
    """Online, R < n: ``(I - alpha W_RR) f = y_R``, W sliced from the whole graph (or re-normalised)."""
    x = unit(rng.normal(size=(120, 5)))
    queries = unit(rng.normal(size=(4, 5)))
    _, ranks = exact_search(queries, x)
    s = DiffusionSettings(k=9, query_k=4, truncation=50, normalise=normalise, **EXACT)  # type: ignore[arg-type]
    new_ranks, scores = Diffusion(s).fit(x).rerank(queries, ranks)
    a = ref_affinity(x, 9)
    w_full = ref_normalise(a)
    for qi in range(len(queries)):
        top = ranks[qi, :50]
        w = w_full[np.ix_(top, top)] if normalise == "full" else ref_normalise(a[np.ix_(top, top)])
        f = np.linalg.solve(np.eye(50) - 0.99 * w, ref_query_vector(x, queries[qi], top, 4))
        by_image = dict(zip(new_ranks[qi, :50].tolist(), scores[qi, :50].tolist(), strict=True))
        np.testing.assert_allclose(
            [by_image[i] for i in top], np.clip(f, 0, None), rtol=1e-4, atol=1e-6
        )
    # the two normalisations are different systems on this graph (the top R cuts edges)
    other = "subgraph" if normalise == "full" else "full"
    _, scores2 = (
        Diffusion(DiffusionSettings(k=9, query_k=4, truncation=50, normalise=other, **EXACT))
        .fit(x)
        .rerank(queries, ranks)
    )  # type: ignore[arg-type]
    assert np.abs(np.sort(scores2[:, :50], axis=1) - np.sort(scores[:, :50], axis=1)).max() > 1e-3


def test_online_truncated_equals_full_graph_diffusion_on_the_top_r() -> None:
    """When the top R holds the query's whole connected cluster, truncation changes nothing:
    the truncated solve equals the whole-graph solve ``(I - alpha W)^-1 y`` restricted to the top R
    (tolerance 1e-6 relative, CG to 1e-12), and the offline mode's linear combination equals it too."""
    x, labels = clusters()
    rng = np.random.default_rng(3)
    queries = unit(np.eye(16)[[0, 2, 5]] + 0.05 * rng.normal(size=(3, 16)) / 4)
    _, ranks = exact_search(queries, x)
    for qi, c in enumerate((0, 2, 5)):
        assert set(labels[ranks[qi, :40]].tolist()) == {c}  # the top 40 is the query's cluster
    a = ref_affinity(x, 10)
    assert not a[labels[:, None] != labels[None, :]].any()  # no edge between clusters
    w = ref_normalise(a)
    for mode in ("online", "offline"):
        s = DiffusionSettings(k=10, query_k=5, truncation=40, mode=mode, **EXACT)  # type: ignore[arg-type]
        d = Diffusion(s).fit(x)
        new_ranks, scores = d.rerank(queries, ranks)
        for qi in range(3):
            y = ref_query_vector(x, queries[qi], np.arange(len(x)), 5)
            f = np.linalg.solve(np.eye(len(x)) - 0.99 * w, y)
            top = ranks[qi, :40]
            got = dict(zip(new_ranks[qi].tolist(), scores[qi].tolist(), strict=True))
            np.testing.assert_allclose([got[i] for i in top], f[top], rtol=1e-6, atol=1e-9)
            assert not f[np.setdiff1d(np.arange(len(x)), top)].any()
        if mode == "offline":
            info = d.describe()
            assert info["offline_nnz_per_image"] == 40 and info["offline_bytes_per_image"] >= 40 * 8


def test_offline_is_the_online_diffusion_without_truncation(rng: np.random.Generator) -> None:
    """By linearity, sum_j y_j (I - alpha W)^-1 e_j = (I - alpha W)^-1 y: with R = n the two modes agree."""
    x = unit(rng.normal(size=(90, 4)))
    queries = unit(rng.normal(size=(5, 4)))
    _, ranks = exact_search(queries, x)
    got = {}
    for mode in ("online", "offline"):
        s = DiffusionSettings(k=8, query_k=6, truncation=90, mode=mode, **EXACT)  # type: ignore[arg-type]
        got[mode] = Diffusion(s).fit(x).rerank(queries, ranks)
    np.testing.assert_array_equal(got["online"][0], got["offline"][0])
    np.testing.assert_allclose(got["online"][1], got["offline"][1], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    ("mode", "normalise", "truncation"),
    [
        ("online", "full", 600),
        ("online", "full", 200),
        ("online", "subgraph", 200),
        ("offline", "full", 200),
    ],
)
def test_diffusion_is_never_below_the_baseline_on_the_manifold(
    mode: str, normalise: str, truncation: int
) -> None:
    v, labels = two_spirals()
    queries = np.random.default_rng(1).choice(len(v), 20, replace=False)
    _, ranks = exact_search(v[queries], v)
    plain = mean_ap(ranks, labels, queries)
    s = DiffusionSettings(k=20, query_k=5, truncation=truncation, mode=mode, normalise=normalise)  # type: ignore[arg-type]
    diffused = mean_ap(Diffusion(s).fit(v).rerank(v[queries], ranks)[0], labels, queries)
    assert diffused > plain + 0.05, (plain, diffused)
