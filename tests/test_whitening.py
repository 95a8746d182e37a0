"""PCA-whitening and learned whitening (Lw): the identity they promise, refusals, shapes, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.index.whitening import LearnedWhitening, PCAWhitening, load_whitening


def clustered(
    rng: np.random.Generator, n_classes: int = 30, per_class: int = 8, d: int = 12, mix=None
):
    """Vectors of ``n_classes`` classes with correlated intra-class noise, and their pairs."""
    centres = rng.normal(size=(n_classes, d)) * 3.0
    mix = rng.normal(size=(d, d)) if mix is None else mix
    labels = np.repeat(np.arange(n_classes), per_class)
    x = centres[labels] + rng.normal(size=(len(labels), d)) @ mix
    pairs = np.array(
        [(i, j) for i in range(len(x)) for j in range(i + 1, len(x)) if labels[i] == labels[j]]
    )
    return x, labels, pairs


def cov(y: np.ndarray) -> np.ndarray:
    return np.cov(np.asarray(y, np.float64).T)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), d=st.integers(2, 10), extra=st.integers(1, 40))
def test_pca_whitening_makes_the_training_covariance_the_identity(
    seed: int, d: int, extra: int
) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(d + extra + 1, d)) @ rng.normal(size=(d, d)) + rng.normal(size=d) * 5
    w = PCAWhitening().fit(x)
    y = w.transform(x, normalize=False)
    assert y.shape == (len(x), d)
    np.testing.assert_allclose(cov(y), np.eye(d), atol=1e-4)


def test_learned_whitening_whitens_the_intra_class_covariance(rng: np.random.Generator) -> None:
    x, labels, pairs = clustered(rng)
    lw = LearnedWhitening().fit(x, pairs)
    y = lw.transform(x, normalize=False).astype(np.float64)
    diff = y[pairs[:, 0]] - y[pairs[:, 1]]
    np.testing.assert_allclose(diff.T @ diff / len(diff), np.eye(x.shape[1]), atol=1e-4)
    # and the inter-class covariance is diagonal, largest variance first, in the whitened space
    yc = y - lw.transform(x[pairs[:, 0]], normalize=False).mean(axis=0)
    inter = yc.T @ yc
    off = inter - np.diag(np.diag(inter))
    assert np.abs(off).max() < 1e-6 * np.abs(inter).max()
    assert np.all(np.diff(np.diag(inter)) <= 1e-9 * inter[0, 0])
    # not the same transform as PCA: PCA leaves the intra-class covariance far from the identity
    yp = PCAWhitening().fit(x).transform(x, normalize=False).astype(np.float64)
    dp = yp[pairs[:, 0]] - yp[pairs[:, 1]]
    assert np.abs(dp.T @ dp / len(dp) - np.eye(x.shape[1])).max() > 0.1


def test_learned_whitening_separates_classes_better_than_none(rng: np.random.Generator) -> None:
    from oxbench.index.search import exact_search
    from oxbench.index.whitening import l2_normalize

    mix = rng.normal(size=(12, 12))
    x, labels, pairs = clustered(rng, per_class=10, mix=mix)
    test_x, test_labels, _ = clustered(np.random.default_rng(99), per_class=10, mix=mix)
    lw = LearnedWhitening().fit(x, pairs)

    def precision_at_5(v: np.ndarray) -> float:
        _, ids = exact_search(v, v, 6)
        return float(np.mean(test_labels[ids[:, 1:]] == test_labels[:, None]))

    # the classes of the held-out set share the training set's intra-class noise, not its centres
    assert precision_at_5(lw.transform(test_x)) > precision_at_5(l2_normalize(test_x)) + 0.05


def test_dimension_reduction_shapes_and_normalisation(rng: np.random.Generator) -> None:
    x, _, pairs = clustered(rng)
    lw = LearnedWhitening(5).fit(x, pairs)
    y = lw.transform(x[:7])
    assert y.shape == (7, 5) and y.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1.0, atol=1e-6)
    assert PCAWhitening(4).fit(x).transform(x).shape == (len(x), 4)
    with pytest.raises(InputError, match="do not match the whitening's input dimension 12"):
        lw.transform(x[:, :5])


def test_fewer_images_than_dimensions_is_refused_in_one_line(rng: np.random.Generator) -> None:
    x = rng.normal(size=(20, 32))
    pairs = np.stack([np.arange(19), np.arange(1, 20)], axis=1)
    with pytest.raises(InputError) as exc:
        LearnedWhitening().fit(x, pairs)
    assert (
        "needs more than 32 images and at least 32 matching pairs; got 20 images and 19 pairs"
        in str(exc.value)
    )
    assert "\n" not in str(exc.value)
    with pytest.raises(
        InputError, match="whitening to 32 dimensions needs more than 32 training vectors"
    ):
        PCAWhitening(32).fit(x)
    # pairs that do not span every dimension: refused, with the remedy
    x2 = rng.normal(size=(200, 8))
    same = np.stack([np.arange(100), np.arange(100)], axis=1)
    with pytest.raises(InputError, match="span only 0 of 8 dimensions"):
        LearnedWhitening().fit(x2, same)
    assert (
        LearnedWhitening(shrinkage=0.5).fit(x2, np.vstack([same, [[0, 1]] * 8])).components_
        is not None
    )


def test_bad_pairs_are_refused(rng: np.random.Generator) -> None:
    x = rng.normal(size=(50, 4))
    for pairs, msg in (
        (None, "needs matching pairs"),
        (np.array([[0, 50]] * 10), "outside 0..49"),
        (np.array([0.0, 1.0]), "non-empty \\[m, 2\\] integer array"),
    ):
        with pytest.raises(InputError, match=msg):
            LearnedWhitening().fit(x, pairs)
    with pytest.raises(InputError, match="NaN"):
        LearnedWhitening().fit(np.full((50, 4), np.nan), np.array([[0, 1]] * 10))


def test_saved_with_provenance_and_reloaded(tmp_path: Path, rng: np.random.Generator) -> None:
    x, _, pairs = clustered(rng)
    lw = LearnedWhitening(6).fit(x, pairs, fitted_on="train city, 240 images")
    lw.save(tmp_path / "lw.npz")
    back = load_whitening(tmp_path / "lw.npz")
    assert isinstance(back, LearnedWhitening) and back.fitted_on_ == "train city, 240 images"
    assert back.n_pairs_ == len(pairs) and back.dim == 6
    np.testing.assert_array_equal(back.transform(x), lw.transform(x))
    pca = PCAWhitening(power=0.25).fit(x)
    pca.save(tmp_path / "pca.npz")
    assert type(load_whitening(tmp_path / "pca.npz")) is PCAWhitening
    assert PCAWhitening.load(tmp_path / "pca.npz").power == 0.25
    with pytest.raises(InputError, match="this is a 'learned' whitening, not 'pca'"):
        PCAWhitening.load(tmp_path / "lw.npz")
    bad = tmp_path / "bad.npz"
    data = bytearray((tmp_path / "lw.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError, match="unreadable whitening file"):
        load_whitening(bad)


def _reference_pca(x: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The d x d route, written out: eigenvalues and eigenvectors (rows, sign: largest entry
    positive) of the sample covariance, largest first."""
    xc = x - x.mean(axis=0)
    w, v = np.linalg.eigh(xc.T @ xc / (len(x) - 1))
    order = np.argsort(w)[::-1][:dim]
    rows = v[:, order].T
    rows = rows * np.sign(rows[np.arange(dim), np.abs(rows).argmax(axis=1)])[:, None]
    return w[order], rows


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize(("n", "d"), [(5, 12), (20, 40), (39, 40), (41, 40), (60, 13)])
def test_pca_whitening_learnt_on_few_vectors_equals_the_covariance_route(
    seed: int, n: int, d: int
) -> None:
    """Issue 43 case 8: n < d learns through the n x n Gram matrix; the same whitening as the d x d
    eigendecomposition of the covariance (eigenvalues, eigenvectors with one sign, and vectors)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * np.linspace(3.0, 0.5, d) + rng.normal(size=d)
    dim = min(n - 1, d)
    w = PCAWhitening(power=0.5, shrinkage=0.1).fit(x)
    evals, rows = _reference_pca(x, dim)
    shrunk = 0.9 * evals + 0.1 * evals.mean()  # explained_variance_ holds them after shrinkage
    np.testing.assert_allclose(w.explained_variance_, shrunk, rtol=1e-9)
    np.testing.assert_allclose(w.components_, rows, atol=1e-7)
    ref = ((x - x.mean(axis=0)) @ rows.T) / np.sqrt(shrunk)
    np.testing.assert_allclose(w.transform(x, normalize=False), ref, rtol=1e-4, atol=1e-5)


def test_pca_whitening_of_8192_dimensions_on_30_vectors_needs_no_8192_square_eigh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 43 case 8: VLAD's 8,192-D whitening learnt on a small training set took minutes in
    the d x d ``eigh``; the n x n Gram matrix gives it at once."""

    eigh = np.linalg.eigh

    def small_eigh(a: np.ndarray, *args: object, **kwargs: object) -> object:
        assert a.shape[0] <= 30, f"eigh of a {a.shape} matrix"
        return eigh(a, *args, **kwargs)

    monkeypatch.setattr(np.linalg, "eigh", small_eigh)
    x = np.random.default_rng(0).normal(size=(30, 8192))
    w = PCAWhitening().fit(x)
    assert w.components_ is not None and w.components_.shape == (29, 8192)
    y = w.transform(x, normalize=False)
    np.testing.assert_allclose(np.cov(y.T.astype(np.float64)), np.eye(29), atol=1e-3)
