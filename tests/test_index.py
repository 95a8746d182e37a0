"""Vocabularies (flat and two-level k-means) and the tf-idf inverted file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.index.faiss_setup import suggested_coretype
from oxbench.index.inverted import InvertedFile, bow_matrix, soft_assignment_weights
from oxbench.index.vocabulary import Vocabulary, _allocate

pytest.importorskip("faiss")


def blobs(
    rng: np.random.Generator, n_clusters: int = 8, per: int = 200, dim: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    centres = rng.normal(size=(n_clusters, dim)).astype(np.float32) * 10
    labels = np.repeat(np.arange(n_clusters), per)
    x = centres[labels] + rng.normal(size=(len(labels), dim)).astype(np.float32) * 0.3
    return x.astype(np.float32), labels


def brute_nearest(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    d = ((x[:, None, :].astype(np.float64) - c[None, :, :]) ** 2).sum(axis=2)
    return d.argmin(axis=1)


# ---------------------------------------------------------------------- vocabulary


def test_flat_vocabulary_recovers_clusters_and_predicts_exactly(rng: np.random.Generator) -> None:
    x, labels = blobs(rng)
    voc = Vocabulary(16, structure="flat", n_iter=20, descriptor="test", seed=1).fit(
        x, trained_on="blobs"
    )
    words = voc.predict(x)
    # k-means may split a cluster but never mixes two well-separated ones in one word
    for w in np.unique(words):
        assert len(np.unique(labels[words == w])) == 1
    assert len(np.unique(words)) >= 8
    np.testing.assert_array_equal(words, brute_nearest(x, voc.centroids_))
    assert voc.trained_on_ == "blobs" and voc.dim == 16


def test_kneighbors_sorted_and_exact(rng: np.random.Generator) -> None:
    x = rng.random((500, 8), dtype=np.float32)
    voc = Vocabulary(20, structure="flat", descriptor="test").fit(x)
    d2, w = voc.kneighbors(x[:50], 3)
    assert w.shape == (50, 3) and np.all(np.diff(d2, axis=1) >= 0)
    ref = ((x[:50, None, :] - voc.centroids_[None]) ** 2).sum(axis=2)
    np.testing.assert_allclose(d2, np.sort(ref, axis=1)[:, :3], rtol=1e-4, atol=1e-5)


def test_training_sample_limit_is_explicit(rng: np.random.Generator) -> None:
    x = rng.random((5000, 8), dtype=np.float32)
    voc = Vocabulary(10, structure="flat", max_points_per_centroid=30, descriptor="test").fit(x)
    assert voc.n_train_ == 300
    with pytest.raises(InputError, match="cannot make 10 words"):
        Vocabulary(10, descriptor="test").fit(x[:9])


def test_two_level_vocabulary(rng: np.random.Generator) -> None:
    x = rng.random((6000, 8), dtype=np.float32)
    voc = Vocabulary(
        100,
        structure="two-level",
        n_iter=5,
        max_points_per_centroid=40,
        n_probe=3,
        descriptor="test",
    ).fit(x)
    assert voc.centroids_.shape == (100, 8)
    assert voc.cell_offsets_[0] == 0 and voc.cell_offsets_[-1] == 100
    assert np.all(np.diff(voc.cell_offsets_) >= 0)
    w = voc.predict(x[:1000])
    assert w.min() >= 0 and w.max() < 100
    # searching every coarse cell is exact nearest-word search over the fine words
    voc.n_probe = len(voc.coarse_)
    d2, w_all = voc.kneighbors(x[:300], 2)
    ref = ((x[:300, None, :] - voc.centroids_[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(w_all[:, 0], ref.argmin(axis=1))
    np.testing.assert_allclose(d2[:, 1], np.sort(ref, axis=1)[:, 1], rtol=1e-4, atol=1e-5)
    # approximate search with fewer probes agrees most of the time on uniform data
    voc.n_probe = 3
    assert (voc.predict(x[:300]) == w_all[:, 0]).mean() > 0.8


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(1, 200))
def test_allocate_words_over_cells(counts: list[int], total: int) -> None:
    counts_arr = np.array(counts)
    if counts_arr.sum() < total:
        with pytest.raises(InputError):
            _allocate(counts_arr, total)
        return
    q = _allocate(counts_arr, total)
    assert q.sum() == total
    assert np.all(q <= counts_arr) and np.all(q >= 0)


def test_vocabulary_save_load_and_refusals(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.random((3000, 8), dtype=np.float32)
    for structure in ("flat", "two-level"):
        voc = Vocabulary(30, structure=structure, descriptor="rootsift").fit(
            x, trained_on="train-city"
        )
        path = voc.save(tmp_path / f"{structure}.npz")
        back = Vocabulary.load(path, descriptor="rootsift", dim=8)
        np.testing.assert_array_equal(back.predict(x[:200]), voc.predict(x[:200]))
        assert back.trained_on_ == "train-city" and back.resolved_structure == structure
        with pytest.raises(InputError, match="trained on 'rootsift' descriptors, not 'sift'"):
            Vocabulary.load(path, descriptor="sift")
        with pytest.raises(InputError, match="dimension 8, expected 128"):
            Vocabulary.load(path, dim=128)
        with pytest.raises(InputError, match="dimension 4"):
            back.predict(x[:5, :4])
    with pytest.raises(InputError, match="not found"):
        Vocabulary.load(tmp_path / "absent.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match="unreadable"):
        Vocabulary.load(tmp_path / "bad.npz")
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("given, expected", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_faiss_threads_wait_passively_unless_the_user_says_otherwise(
    given: str | None, expected: str
) -> None:
    """Spinning OpenMP threads burn the CPU other work needs (bench/README.md, "The main job")."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    code = "import os; from oxbench.index.faiss_setup import load_faiss; load_faiss(); print(os.environ['OMP_WAIT_POLICY'])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected


def test_suggested_coretype() -> None:
    assert (
        suggested_coretype({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma"})
        == "SkylakeX"
    )
    assert suggested_coretype({"avx2", "fma"}) == "Haswell"
    assert suggested_coretype({"sse2"}) is None


# ---------------------------------------------------------------------- soft assignment


def test_soft_assignment_weights() -> None:
    w = soft_assignment_weights(np.array([[0.1, 0.1, 0.1], [0.0, 0.02, 0.5]]), sigma2=0.01)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(w[0], 1 / 3, rtol=1e-6)
    assert w[1, 0] > w[1, 1] > w[1, 2]
    # ratio follows the Gaussian: exp(-(0.02 - 0) / (2 * 0.01)) = exp(-1)
    assert abs(w[1, 1] / w[1, 0] - np.exp(-1.0)) < 1e-5
    with pytest.raises(InputError):
        soft_assignment_weights(np.zeros((2, 2)), 0.0)


# ---------------------------------------------------------------------- inverted file


def dense_reference(db_words, q_words, n_words, burst, db_w=None, q_w=None):  # noqa: ANN001, ANN201
    """Plain dense tf-idf with explicit loops: the specification the inverted file must match."""

    def tf(words_list, weights):  # noqa: ANN001, ANN202
        m = np.zeros((len(words_list), n_words))
        for i, ws in enumerate(words_list):
            wt = np.ones(np.shape(ws)) if weights is None else weights[i]
            for w, v in zip(np.ravel(ws), np.ravel(wt), strict=True):
                m[i, w] += v
        return m

    db, q = tf(db_words, db_w), tf(q_words, q_w)
    n = len(db_words)
    df = (db > 0).sum(axis=0)
    idf = np.where(df > 0, np.log(n / np.maximum(df, 1)), 0.0)

    def weight(m):  # noqa: ANN001, ANN202
        m = np.sqrt(m) if burst == "sqrt" else m
        m = m * idf
        norms = np.linalg.norm(m, axis=1, keepdims=True)
        return np.divide(m, norms, out=np.zeros_like(m), where=norms > 0)

    return weight(q) @ weight(db).T


@pytest.mark.parametrize("burst", ["none", "sqrt"])
def test_inverted_file_equals_dense_tfidf(burst: str, rng: np.random.Generator) -> None:
    n_words = 50
    db_words = [rng.integers(0, n_words, size=rng.integers(0, 40)) for _ in range(30)]
    q_words = [rng.integers(0, n_words, size=rng.integers(1, 30)) for _ in range(5)]
    ivf = InvertedFile(n_words, burst=burst).fit(bow_matrix(db_words, n_words))
    got = ivf.scores(bow_matrix(q_words, n_words))
    ref = dense_reference(db_words, q_words, n_words, burst)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    # dense query vectors give the same scores as sparse ones
    q_vec = ivf.transform(bow_matrix(q_words, n_words))
    np.testing.assert_allclose(ivf.scores_of_vectors(q_vec.toarray()), got, rtol=1e-5, atol=1e-6)


def test_inverted_file_with_soft_assignment_equals_dense(rng: np.random.Generator) -> None:
    n_words, k = 40, 3
    db_words = [rng.integers(0, n_words, size=(rng.integers(1, 20), k)) for _ in range(20)]
    db_w = [soft_assignment_weights(np.sort(rng.random(w.shape), axis=1), 0.05) for w in db_words]
    q_words = [rng.integers(0, n_words, size=(10, k)) for _ in range(3)]
    q_w = [soft_assignment_weights(np.sort(rng.random(w.shape), axis=1), 0.05) for w in q_words]
    ivf = InvertedFile(n_words).fit(bow_matrix(db_words, n_words, db_w))
    got = ivf.scores(bow_matrix(q_words, n_words, q_w))
    np.testing.assert_allclose(
        got, dense_reference(db_words, q_words, n_words, "sqrt", db_w, q_w), rtol=1e-5, atol=1e-6
    )


def test_ranking_is_stable_and_self_retrieval_first(rng: np.random.Generator) -> None:
    n_words = 100
    db_words = [rng.integers(0, n_words, size=30) for _ in range(20)]
    ivf = InvertedFile(n_words).fit(bow_matrix(db_words, n_words))
    ranks = ivf.search(bow_matrix(db_words, n_words))
    np.testing.assert_array_equal(ranks[:, 0], np.arange(20))
    assert ranks.shape == (20, 20)
    assert np.all(np.sort(ranks, axis=1) == np.arange(20))
    np.testing.assert_array_equal(
        ranks_from_scores(np.array([[0.5, 1.0, 0.5, 1.0, 0.0]]).T), [[1, 3, 0, 2, 4]]
    )
    np.testing.assert_array_equal(ranks_from_scores(np.array([[0.0, -0.0, 0.0]]).T, 2), [[0, 1]])


def test_bad_words_and_unfitted_index() -> None:
    with pytest.raises(InputError, match="outside 0..9"):
        bow_matrix([np.array([1, 10])], 10)
    with pytest.raises(InputError, match="not built"):
        InvertedFile(10).scores(sp.csr_matrix((1, 10)))
    ivf = InvertedFile(10).fit(bow_matrix([np.array([1, 2])], 10))
    with pytest.raises(InputError, match="11 words"):
        ivf.scores(sp.csr_matrix((1, 11)))
    with pytest.raises(InputError):
        InvertedFile(10, burst="log")  # type: ignore[arg-type]


def test_every_training_descriptor_when_the_sample_limit_is_none(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    """``max_points_per_centroid=None``: the k-means sees every descriptor, as the asmk package's
    codebook does (one faiss k-means over all training vectors)."""
    import faiss

    from oxbench.pipelines import resolve_method

    x = rng.random((5000, 8), dtype=np.float32)
    voc = Vocabulary(
        10, structure="flat", n_iter=7, max_points_per_centroid=None, descriptor="test", seed=3
    ).fit(x)
    assert voc.n_train_ == 5000 and voc.describe()["max_points_per_centroid"] is None
    km = faiss.Kmeans(
        8, 10, niter=7, seed=3, max_points_per_centroid=10**6, min_points_per_centroid=1
    )
    km.train(x)
    np.testing.assert_allclose(voc.centroids_, km.centroids, rtol=1e-5, atol=1e-6)
    two = Vocabulary(
        100, structure="two-level", n_iter=3, max_points_per_centroid=None, descriptor="test"
    ).fit(x)
    assert two.n_train_ == 5000
    back = Vocabulary.load(voc.save(tmp_path / "all.npz"), descriptor="test")
    assert back.max_points_per_centroid is None
    for bad in (0, -1, "all", True, 2.5):
        with pytest.raises(
            InputError, match="max_points_per_centroid must be an integer >= 1 or null"
        ):
            Vocabulary(10, max_points_per_centroid=bad)  # type: ignore[arg-type]
    # ASMK trains on all by default (recorded in its vocabulary settings); bag of words keeps 32 per word
    asmk = resolve_method("rootsift-asmk")
    assert (
        asmk.vocabulary.sample is None
        and asmk.vocabulary_spec().settings()["max_points_per_centroid"] is None
    )
    assert resolve_method("rootsift-bow").vocabulary.sample == 32
    assert (
        resolve_method("rootsift-asmk", **{"vocabulary.sample": 32})
        .vocabulary_spec()
        .settings()["max_points_per_centroid"]
        == 32
    )
    with pytest.raises(
        InputError, match=r"setting vocabulary.sample: must be in \[1, 1048576\], got 0"
    ):
        resolve_method("rootsift-asmk", **{"vocabulary.sample": 0})
    assert (
        resolve_method("rootsift-asmk", **{"vocabulary.sample": "none"}).vocabulary.sample is None
    )
