"""Whitening of global descriptors, learned on a training set (scikit-learn's contract).

Jegou & Chum (ECCV 2012) and the CNN retrieval literature after them whiten global descriptors with
a PCA learned on *other* data: centre, project on the leading eigenvectors of the covariance, divide
each component by ``lambda_i ** power`` (``power = 0.5`` is full whitening), and L2-normalise.
``shrinkage`` regularises the eigenvalues towards their mean (``(1 - s) * lambda + s * mean``),
which tames the noisy small-eigenvalue directions when the training set is small.

:class:`LearnedWhitening` is the "Lw" of Radenovic, Tolias & Chum (ECCV 2016 / TPAMI 2018,
"Fine-tuning CNN image retrieval with no human annotation"), learned from *matching pairs*: whiten
the intra-class covariance (of the differences of matching descriptors), then rotate onto the
principal directions of the inter-class covariance (of all training descriptors) in that whitened
space, keeping the leading ones. Both transforms are affine maps ``y = (x - mean) @ P.T``, stored the
same way; :func:`load_whitening` reads either.

State is saved as plain arrays (``.npz``), never pickles, with what it was fitted on.
"""

from __future__ import annotations

import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.fileio import atomic_write_npz, read_input_bytes


def l2_normalize(x: NDArray[np.floating], *, eps: float = 1e-12) -> NDArray[np.float32]:
    """Rows of ``x`` scaled to unit L2 norm (all-zero rows stay zero).

    Example:
        >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]])).tolist()
        [[0.6000000238418579, 0.800000011920929], [0.0, 0.0]]
    """
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, np.maximum(norms, eps), dtype=np.float32)


def _training_matrix(x: NDArray[np.floating]) -> NDArray[np.float64]:
    """Training descriptors as float64 ``[n >= 2, d]``, finite (else one-line :class:`InputError`)."""
    out: NDArray[np.float64] = np.asarray(x, dtype=np.float64)
    if out.ndim != 2 or out.shape[0] < 2:
        raise InputError(
            f"whitening needs an [n, d] training matrix with n >= 2, got shape {out.shape}"
        )
    if not np.isfinite(out).all():
        raise InputError("whitening training descriptors contain NaN or infinity")
    return out


def _sign_fixed(rows: NDArray[np.float64]) -> NDArray[np.float64]:
    """``rows`` (unit vectors) each flipped so that its entry of largest magnitude is positive: an
    eigenvector's sign is arbitrary, and this makes both routes of :func:`_leading_eigenpairs` (and
    every LAPACK) give the same one."""
    big = rows[np.arange(len(rows)), np.argmax(np.abs(rows), axis=1)]
    return rows * np.where(big < 0, -1.0, 1.0)[:, None]


def _leading_eigenpairs(
    xc: NDArray[np.float64], dim: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The ``dim`` largest eigenvalues (``[dim]``, clipped at 0) and unit eigenvectors (rows,
    ``[dim, d]``) of the covariance ``xc.T @ xc / (n - 1)`` of centred vectors ``xc`` (``[n, d]``).

    With fewer vectors than dimensions (VLAD's 8,192 dimensions learnt on a few hundred images) the
    covariance has rank ``< n``, and its nonzero eigenpairs come from the ``n x n`` Gram matrix
    ``G = xc @ xc.T``: ``G u = mu u`` gives the eigenvalue ``mu / (n - 1)`` and the unit eigenvector
    ``xc.T @ u / sqrt(mu)``. That costs ``O(n**2 d + n**3)`` instead of the ``d x d``
    eigendecomposition's ``O(d**3)`` (minutes at d = 8,192), with the same conditioning (both
    square the data matrix) and the same numbers up to rounding (tests/test_whitening.py).
    """
    n, d = xc.shape
    if n < d:
        mu, u = np.linalg.eigh(xc @ xc.T)
        order = np.argsort(mu)[::-1][:dim]
        rows = (xc.T @ u[:, order]).T
        rows /= np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
        evals = mu[order] / (n - 1)
    else:
        w, v = np.linalg.eigh(xc.T @ xc / (n - 1))
        order = np.argsort(w)[::-1][:dim]
        evals, rows = w[order], v[:, order].T
    return np.clip(evals, 0.0, None), _sign_fixed(np.ascontiguousarray(rows))


class PCAWhitening:
    """PCA-whitening: ``fit`` on training descriptors, ``transform`` anything of the same dimension.

    Args:
        dim: output dimension (``None``: the input dimension, capped at ``n_train - 1``).
        power: eigenvalue exponent; 0.5 whitens fully, 0 only rotates (plain PCA).
        shrinkage: in ``[0, 1]``, eigenvalues pulled towards their mean.

    Attributes (after ``fit``):
        mean_: ``float64 [d]``; components_: ``float64 [dim, d]`` (rows: eigenvectors, largest
        eigenvalue first); scale_: ``float64 [dim]`` divisors; explained_variance_: ``[dim]``;
        fitted_on_: what the training descriptors were (recorded in runs).
    """

    #: What the saved file says this whitening is (``load`` refuses another kind).
    kind: ClassVar[str] = "pca"

    def __init__(
        self, dim: int | None = None, *, power: float = 0.5, shrinkage: float = 0.0
    ) -> None:
        if dim is not None and dim < 1:
            raise InputError(f"whitening dimension must be >= 1, got {dim}")
        if not 0.0 <= shrinkage <= 1.0:
            raise InputError(f"whitening shrinkage must be in [0, 1], got {shrinkage}")
        if not 0.0 <= power <= 1.0:
            raise InputError(f"whitening power must be in [0, 1], got {power}")
        self.dim = dim
        self.power = power
        self.shrinkage = shrinkage
        self.mean_: NDArray[np.float64] | None = None
        self.components_: NDArray[np.float64] | None = None
        self.scale_: NDArray[np.float64] | None = None
        self.explained_variance_: NDArray[np.float64] | None = None
        self.fitted_on_ = ""
        self.stands_for_: str | None = None  # a cache entry's record of what it stands for

    def fit(self, x: NDArray[np.floating], *, fitted_on: str = "") -> Self:
        """Learn the whitening from ``x`` (``[n, d]``, ``n > d`` recommended).

        Raises:
            InputError: fewer than 2 vectors, non-finite values, or more output dimensions asked
                than the training set can give (at most ``n - 1``).
        """
        x = _training_matrix(x)
        n, d = x.shape
        rank = min(d, n - 1)
        dim = rank if self.dim is None else self.dim
        if dim > rank:
            raise InputError(
                f"whitening to {dim} dimensions needs more than {dim} training vectors of dimension "
                f">= {dim}; got {n} vectors of dimension {d} (use fewer dimensions or more images)"
            )
        self.mean_ = x.mean(axis=0)
        evals, components = _leading_eigenpairs(x - self.mean_, dim)
        if self.shrinkage:
            evals = (1.0 - self.shrinkage) * evals + self.shrinkage * evals.mean()
        floor = max(float(evals.max()) * 1e-12, 1e-30)
        self.explained_variance_ = evals
        self.components_ = components
        self.scale_ = np.maximum(evals, floor) ** self.power
        self.fitted_on_ = fitted_on
        return self

    def _check_fitted(self) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
        if self.mean_ is None or self.components_ is None or self.scale_ is None:
            raise InputError("the whitening is not fitted; call fit() or load() first")
        return self.mean_, self.components_, self.scale_

    def transform(self, x: NDArray[np.floating], *, normalize: bool = True) -> NDArray[np.float32]:
        """Whiten ``x`` (``[n, d]``) to ``[n, dim]``, L2-normalised unless ``normalize=False``."""
        mean, comps, scale = self._check_fitted()
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != mean.shape[0]:
            raise InputError(
                f"descriptors of shape {x.shape} do not match the whitening's input dimension {mean.shape[0]}"
            )
        y = ((x - mean) @ comps.T) / scale
        return l2_normalize(y) if normalize else y.astype(np.float32)

    def _state(self) -> dict[str, np.ndarray]:
        """Settings stored next to the learned arrays (read back by :meth:`_restore`)."""
        return {"power": np.array(self.power), "shrinkage": np.array(self.shrinkage)}

    def _restore(self, z: Mapping[str, np.ndarray]) -> None:
        self.power = float(z["power"])
        self.shrinkage = float(z["shrinkage"])

    def save(self, path: str | Path, *, stands_for: Mapping[str, object] | None = None) -> Path:
        """Write the learned state as ``.npz`` (plain arrays), with what it was fitted on and, for
        a cache entry, the record of what it stands for (:func:`oxbench.cache.stands_for_record`:
        the settings and the training descriptors' digest; read back as :attr:`stands_for_`)."""
        from oxbench.cache import STANDS_FOR_KEY, stands_for_record

        mean, comps, scale = self._check_fitted()
        assert self.explained_variance_ is not None
        bound = {} if stands_for is None else {STANDS_FOR_KEY: stands_for_record(stands_for)}
        return atomic_write_npz(
            path,
            {
                "kind": np.array(self.kind),
                "mean": mean,
                "components": comps,
                "scale": scale,
                "explained_variance": self.explained_variance_,
                "fitted_on": np.array(self.fitted_on_),
                **self._state(),
                **bound,
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> Self:
        """Read a whitening written by :meth:`save` (of this class's kind).

        Raises:
            InputError: unreadable or malformed file, or a whitening of another kind (names it).
        """
        import io

        data = read_input_bytes(path, limit=1 << 31)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                kind = str(z["kind"]) if "kind" in z.files else "pca"
                if kind != cls.kind:
                    raise InputError(f"this is a {kind!r} whitening, not {cls.kind!r}", path)
                w = cls()
                w._restore(z)
                w.mean_ = np.asarray(z["mean"], np.float64)
                w.components_ = np.asarray(z["components"], np.float64)
                w.scale_ = np.asarray(z["scale"], np.float64)
                w.explained_variance_ = np.asarray(z["explained_variance"], np.float64)
                w.fitted_on_ = str(z["fitted_on"])
                w.stands_for_ = str(z["stands_for"]) if "stands_for" in z.files else None
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"unreadable whitening file ({exc})", path) from None
        if w.components_.ndim != 2 or w.components_.shape != (len(w.scale_), len(w.mean_)):
            raise InputError("malformed whitening file (array shapes disagree)", path)
        for name in ("mean_", "components_", "scale_", "explained_variance_"):
            if not np.isfinite(getattr(w, name)).all():
                raise InputError(
                    f"whitening file holds NaN or infinite values ({name.rstrip('_')})", path
                )
        w.dim = w.components_.shape[0]
        return w


class LearnedWhitening(PCAWhitening):
    """Learned whitening "Lw" from matching pairs (Radenovic, Tolias & Chum, TPAMI 2018).

    With ``x_i - x_j`` the differences of the matching pairs ``(i, j)``, the intra-class covariance
    ``C_S = mean (x_i - x_j)(x_i - x_j)^T`` is whitened by ``L^-1`` (``C_S = L L^T``, Cholesky);
    then the projection is rotated onto the eigenvectors ``V`` of the inter-class covariance of all
    training vectors in that whitened space, ``L^-1 (X - m)(X - m)^T L^-T`` (largest eigenvalue
    first), and the leading ``dim`` rows are kept: ``P = V^T L^-1``, ``y = P (x - m)``, then L2. The
    mean ``m`` is that of the first image of every pair, as in the authors' code (cirtorch
    ``whitenlearn``). After :meth:`fit`, the whitened pair differences have the identity
    covariance.

    Args:
        dim: output dimension (``None``: the input dimension).
        shrinkage: in ``[0, 1)``, the intra-class covariance pulled towards ``mean(eig) * I``
            before it is whitened (0, the default, is the published method).

    Attributes (after ``fit``): as :class:`PCAWhitening` (``components_`` holds ``P``, ``scale_``
    ones, ``explained_variance_`` the inter-class eigenvalues); ``n_pairs_``.
    """

    kind = "learned"

    def __init__(self, dim: int | None = None, *, shrinkage: float = 0.0) -> None:
        if not 0.0 <= shrinkage < 1.0:
            raise InputError(f"learned-whitening shrinkage must be in [0, 1), got {shrinkage}")
        super().__init__(dim, power=0.5, shrinkage=shrinkage)
        self.n_pairs_ = 0

    def fit(
        self, x: NDArray[np.floating], pairs: ArrayLike | None = None, *, fitted_on: str = ""
    ) -> Self:  # type: ignore[override]
        """Learn the whitening from vectors ``x`` (``[n, d]``) and matching ``pairs`` (``[m, 2]``).

        Raises:
            InputError: no pairs, pair indices outside ``x``, non-finite values, fewer images or
                pairs than dimensions, pairs that do not span every dimension, or more output
                dimensions asked than the input has.
        """
        x = _training_matrix(x)
        n, d = x.shape
        if pairs is None:
            raise InputError("learned whitening needs matching pairs (an [m, 2] index array)")
        p = np.asarray(pairs)
        if p.ndim != 2 or p.shape[1] != 2 or not p.size or not np.issubdtype(p.dtype, np.integer):
            raise InputError(
                f"matching pairs must be a non-empty [m, 2] integer array, got {p.shape} {p.dtype}"
            )
        dim = d if self.dim is None else self.dim
        if dim > d:
            raise InputError(f"whitening to {dim} dimensions: the descriptors have only {d}")
        if n <= d or len(p) < d:
            raise InputError(
                f"learned whitening of {d}-dimensional descriptors needs more than {d} images and at "
                f"least {d} matching pairs; got {n} images and {len(p)} pairs (reduce the dimension first)"
            )
        if p.min() < 0 or p.max() >= n:
            raise InputError(f"matching pairs index images outside 0..{n - 1}")
        first = x[p[:, 0]]
        diff = first - x[p[:, 1]]
        intra = diff.T @ diff / len(p)
        if self.shrinkage:
            intra = (1.0 - self.shrinkage) * intra + self.shrinkage * np.trace(intra) / d * np.eye(
                d
            )
        try:
            chol = np.linalg.cholesky(intra)
        except np.linalg.LinAlgError:
            chol = None
        evals_intra = np.linalg.eigvalsh(intra)
        if chol is None or evals_intra[0] <= evals_intra[-1] * 1e-12:
            rank = int(np.sum(evals_intra > max(evals_intra[-1], 1e-300) * 1e-12))
            raise InputError(
                f"the {len(p)} matching-pair differences span only {rank} of {d} dimensions: the "
                "intra-class covariance cannot be whitened (more pairs, or shrinkage > 0)"
            )
        inv_chol = np.linalg.solve(chol, np.eye(d))  # L^-1 (lower triangular)
        self.mean_ = first.mean(axis=0)
        z = (x - self.mean_) @ inv_chol.T
        evals, evecs = np.linalg.eigh(z.T @ z)
        order = np.argsort(evals)[::-1][:dim]
        self.components_ = evecs[:, order].T @ inv_chol
        self.scale_ = np.ones(dim)
        self.explained_variance_ = np.clip(evals[order], 0.0, None) / n
        self.n_pairs_ = len(p)
        self.fitted_on_ = fitted_on
        return self

    def _state(self) -> dict[str, np.ndarray]:
        return {"shrinkage": np.array(self.shrinkage), "n_pairs": np.array(self.n_pairs_)}

    def _restore(self, z: Mapping[str, np.ndarray]) -> None:
        self.shrinkage = float(z["shrinkage"])
        self.n_pairs_ = int(z["n_pairs"])


def load_whitening(path: str | Path) -> PCAWhitening:
    """Read a whitening of either kind written by :meth:`PCAWhitening.save`.

    Raises:
        InputError: unreadable or malformed file, or an unknown kind (names it).
    """
    import io

    data = read_input_bytes(path, limit=1 << 31)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            kind = str(z["kind"]) if "kind" in z.files else "pca"
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"unreadable whitening file ({exc})", path) from None
    classes: dict[str, type[PCAWhitening]] = {"pca": PCAWhitening, "learned": LearnedWhitening}
    if kind not in classes:
        raise InputError(f"unknown whitening kind {kind!r} (pca, learned)", path)
    return classes[kind].load(path)
