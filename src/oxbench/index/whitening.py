"""PCA-whitening of global descriptors, learned on a training set (scikit-learn's contract).

Jegou & Chum (ECCV 2012) and the CNN retrieval literature after them whiten global descriptors with
a PCA learned on *other* data: centre, project on the leading eigenvectors of the covariance, divide
each component by ``lambda_i ** power`` (``power = 0.5`` is full whitening), and L2-normalise.
``shrinkage`` regularises the eigenvalues towards their mean (``(1 - s) * lambda + s * mean``),
which tames the noisy small-eigenvalue directions when the training set is small.

State is saved as plain arrays (``.npz``), never pickles, with what it was fitted on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

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

    def __init__(self, dim: int | None = None, *, power: float = 0.5, shrinkage: float = 0.0) -> None:
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

    def fit(self, x: NDArray[np.floating], *, fitted_on: str = "") -> PCAWhitening:
        """Learn the whitening from ``x`` (``[n, d]``, ``n > d`` recommended).

        Raises:
            InputError: fewer than 2 vectors, non-finite values, or more output dimensions asked
                than the training set can give (at most ``n - 1``).
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] < 2:
            raise InputError(f"whitening needs an [n, d] training matrix with n >= 2, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise InputError("whitening training descriptors contain NaN or infinity")
        n, d = x.shape
        rank = min(d, n - 1)
        dim = rank if self.dim is None else self.dim
        if dim > rank:
            raise InputError(
                f"whitening to {dim} dimensions needs more than {dim} training vectors of dimension "
                f">= {dim}; got {n} vectors of dimension {d} (use fewer dimensions or more images)"
            )
        self.mean_ = x.mean(axis=0)
        xc = x - self.mean_
        cov = xc.T @ xc / (n - 1)
        evals, evecs = np.linalg.eigh(cov)
        order = np.argsort(evals)[::-1][:dim]
        evals = np.clip(evals[order], 0.0, None)
        if self.shrinkage:
            evals = (1.0 - self.shrinkage) * evals + self.shrinkage * evals.mean()
        floor = max(float(evals.max()) * 1e-12, 1e-30)
        self.explained_variance_ = evals
        self.components_ = evecs[:, order].T
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

    def save(self, path: str | Path) -> Path:
        """Write the learned state as ``.npz`` (plain arrays)."""
        mean, comps, scale = self._check_fitted()
        assert self.explained_variance_ is not None
        return atomic_write_npz(path, {
            "mean": mean, "components": comps, "scale": scale, "explained_variance": self.explained_variance_,
            "power": np.array(self.power), "shrinkage": np.array(self.shrinkage),
            "fitted_on": np.array(self.fitted_on_),
        })  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> PCAWhitening:
        """Read a whitening written by :meth:`save`.

        Raises:
            InputError: unreadable or malformed file (names it).
        """
        import io

        data = read_input_bytes(path, limit=1 << 31)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                w = cls(power=float(z["power"]), shrinkage=float(z["shrinkage"]))
                w.mean_ = np.asarray(z["mean"], np.float64)
                w.components_ = np.asarray(z["components"], np.float64)
                w.scale_ = np.asarray(z["scale"], np.float64)
                w.explained_variance_ = np.asarray(z["explained_variance"], np.float64)
                w.fitted_on_ = str(z["fitted_on"])
        except (OSError, KeyError, ValueError, EOFError) as exc:
            raise InputError(f"unreadable whitening file ({exc})", path) from None
        if w.components_.ndim != 2 or w.components_.shape != (len(w.scale_), len(w.mean_)):
            raise InputError("malformed whitening file (array shapes disagree)", path)
        w.dim = w.components_.shape[0]
        return w
