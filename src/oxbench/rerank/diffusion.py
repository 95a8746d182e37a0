"""Diffusion re-ranking of global descriptors (Iscen, Tolias, Avrithis, Furon, Chum, CVPR 2017).

"Efficient Diffusion on Region Manifolds: Recovering Small Objects with Compact CNN
Representations". Relevance spreads from the query over the database's k-nearest-neighbour graph, so
images reachable through a chain of close neighbours (the same building from ever more different
views) rise even when their direct similarity to the query is low.

**Offline** (once per database, :meth:`Diffusion.fit`): the affinity matrix ``A`` of the mutual
k-NN graph -- ``a_ij = max(x_i . x_j, 0) ** gamma`` when ``j`` is among the ``k`` nearest neighbours
of ``i`` *and* ``i`` among those of ``j``, else 0; ``a_ii = 0``; ``gamma = 3`` -- built with a
FAISS flat inner-product search of the database against itself.

**Online** (per new query, :meth:`Diffusion.rerank`), the paper's truncated variant: take the top
``R`` images of the query's initial ranking, the sub-graph ``A_R`` of ``A`` on them, its symmetric
normalisation ``W = D^-1/2 A_R D^-1/2`` (``D`` = degrees; isolated nodes get 0), and the query vector
``y``: ``y_i = max(q . x_i, 0) ** gamma`` for the query's ``query_k`` nearest images, 0 elsewhere (the
query is not a node of the graph; it is linked to its nearest neighbours). Solve
``(I - alpha W) f = y`` by conjugate gradient (``scipy.sparse.linalg.cg``; ``I - alpha W`` is
symmetric positive definite for ``alpha < 1``), ``alpha = 0.99``, at most ``iterations`` steps. The
``R`` images are re-ordered by ``f`` (ties: initial order); the rest of the initial ranking follows
unchanged. Returned scores are ``max(f, 0)`` and 0 for the images beyond ``R`` (they are outside the
graph the relevance spreads over), so scores never increase down a list.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DiffusionSettings:
    """Settings of :class:`Diffusion` (defaults as in Iscen et al. 2017's global-descriptor runs).

    Attributes:
        k: neighbours per database image in the graph.
        query_k: nearest images the query's relevance starts from.
        alpha: diffusion weight in ``(0, 1)``.
        gamma: similarity exponent of the affinities.
        truncation: ``R``, images of the initial ranking diffused over per query.
        iterations: conjugate-gradient iterations at most.
        tol: conjugate-gradient relative residual tolerance.
    """

    k: int = 50
    query_k: int = 10
    alpha: float = 0.99
    gamma: float = 3.0
    truncation: int = 1000
    iterations: int = 20
    tol: float = 1e-6

    def __post_init__(self) -> None:
        if self.k < 1 or self.query_k < 1 or self.truncation < 1 or self.iterations < 1:
            raise InputError(f"diffusion: k, query_k, truncation and iterations must be >= 1 ({self})")
        if not 0.0 < self.alpha < 1.0:
            raise InputError(f"diffusion: alpha must be in (0, 1), got {self.alpha}")
        if self.gamma <= 0 or self.tol <= 0:
            raise InputError(f"diffusion: gamma and tol must be positive ({self.gamma}, {self.tol})")


def knn_affinity(
    x: NDArray[np.floating], k: int, *, gamma: float = 3.0, mutual: bool = True, threads: int | None = None
) -> sp.csr_matrix:
    """The (mutual) k-NN affinity matrix of the rows of ``x``, built with FAISS.

    Args:
        x: ``[n, d]`` L2-normalised vectors.
        k: neighbours per row (self excluded).
        gamma: exponent of the clipped similarity.
        mutual: keep ``i - j`` only when each is among the other's ``k`` neighbours (else either).
        threads: FAISS threads.

    Returns:
        Symmetric ``[n, n]`` CSR matrix, zero diagonal.
    """
    from oxbench.index.faiss_setup import load_faiss

    v = np.ascontiguousarray(x, dtype=np.float32)
    if v.ndim != 2 or not np.isfinite(v).all():
        raise InputError(f"diffusion needs a finite [n, d] database matrix, got shape {v.shape}")
    n = v.shape[0]
    if n < 2:
        raise InputError(f"diffusion needs at least 2 database images, got {n}")
    kk = min(k, n - 1)
    faiss = load_faiss(threads)
    index = faiss.IndexFlatIP(v.shape[1])
    index.add(v)
    sims, ids = index.search(v, kk + 1)
    rows = np.arange(n)[:, None]
    keep = ids != rows  # self out (wherever duplicates put it)
    keep &= np.cumsum(keep, axis=1) <= kk
    keep &= ids >= 0
    r = np.broadcast_to(rows, ids.shape)[keep]
    c = ids[keep].astype(np.int64)
    w = np.power(np.clip(sims[keep].astype(np.float64), 0.0, None), gamma)
    a = sp.csr_matrix((w, (r, c)), shape=(n, n))
    a = a.minimum(a.T) if mutual else a.maximum(a.T)
    a = sp.csr_matrix(a)
    a.setdiag(0.0)
    a.eliminate_zeros()
    return a


def normalize_affinity(a: sp.spmatrix | sp.sparray) -> sp.csr_matrix:
    """``D^-1/2 A D^-1/2`` with ``D`` the row sums (rows without edges stay 0)."""
    a = sp.csr_matrix(a)
    deg = np.asarray(a.sum(axis=1)).ravel()
    inv = np.divide(1.0, np.sqrt(deg), out=np.zeros_like(deg), where=deg > 0)
    d = sp.diags(inv)
    return sp.csr_matrix(d @ a @ d)


def diffuse(
    w: sp.spmatrix | sp.sparray, y: NDArray[np.floating], *, alpha: float = 0.99, iterations: int = 20, tol: float = 1e-6
) -> NDArray[np.float64]:
    """Solve ``(I - alpha W) f = y`` by conjugate gradient (at most ``iterations`` steps)."""
    from scipy.sparse.linalg import cg

    w = sp.csr_matrix(w)
    b = np.asarray(y, dtype=np.float64)
    if not b.any():
        return np.zeros_like(b)
    system = sp.identity(w.shape[0], format="csr") - alpha * w
    f, _info = cg(system, b, rtol=tol, maxiter=iterations)
    return np.asarray(f, dtype=np.float64)


class Diffusion:
    """Diffusion re-ranking: ``fit`` builds the database graph, ``rerank`` answers new queries.

    Args:
        settings: see :class:`DiffusionSettings`.
        threads: FAISS threads for the graph.

    Attributes (after ``fit``): ``database_`` (``float32 [n, d]``), ``affinity_`` (``A``, CSR).
    """

    def __init__(self, settings: DiffusionSettings | None = None, *, threads: int | None = None) -> None:
        self.settings = settings or DiffusionSettings()
        self.threads = threads
        self.database_: NDArray[np.float32] | None = None
        self.affinity_: sp.csr_matrix | None = None

    def fit(self, database: NDArray[np.floating]) -> Diffusion:
        """Build the mutual k-NN affinity graph of the database (the offline step)."""
        s = self.settings
        self.database_ = np.ascontiguousarray(database, dtype=np.float32)
        self.affinity_ = knn_affinity(self.database_, s.k, gamma=s.gamma, threads=self.threads)
        return self

    def rerank(
        self, queries: NDArray[np.floating], ranks: NDArray[np.integer]
    ) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """Re-rank each query's top ``truncation`` images by diffusion (the online step).

        Args:
            queries: ``[n_q, d]`` the query vectors the initial ranking came from.
            ranks: ``[n_q, L]`` initial ranked lists (database indices, best first).

        Returns:
            ``(ranks int64 [n_q, L], scores float32 [n_q, L])``: the diffused top ``R`` followed by
            the rest of each initial list (scores: ``max(f, 0)``, then 0).
        """
        if self.database_ is None or self.affinity_ is None:
            raise InputError("diffusion: fit the database graph before re-ranking")
        s = self.settings
        q = np.asarray(queries, dtype=np.float32)
        ranks = np.asarray(ranks).astype(np.int64, copy=False)
        if q.ndim != 2 or q.shape[1] != self.database_.shape[1]:
            raise InputError(f"diffusion: queries of shape {q.shape} do not match the database dimension {self.database_.shape[1]}")
        if ranks.ndim != 2 or ranks.shape[0] != q.shape[0]:
            raise InputError(f"diffusion: ranks of shape {ranks.shape} for {q.shape[0]} queries")
        if ranks.size and (ranks.min() < 0 or ranks.max() >= self.database_.shape[0]):
            raise InputError("diffusion: ranks hold indices outside the database")
        out_r: NDArray[np.int64] = np.array(ranks, dtype=np.int64)
        out_s: NDArray[np.float32] = np.zeros(out_r.shape, np.float32)
        r = min(s.truncation, ranks.shape[1])
        for qi in range(q.shape[0]):
            top = ranks[qi, :r]
            sims = self.database_[top] @ q[qi]
            y = np.zeros(r)
            seeds = np.argsort(-sims, kind="stable")[: s.query_k]
            y[seeds] = np.power(np.clip(sims[seeds].astype(np.float64), 0.0, None), s.gamma)
            w = normalize_affinity(self.affinity_[top][:, top])
            f = np.clip(diffuse(w, y, alpha=s.alpha, iterations=s.iterations, tol=s.tol), 0.0, None)
            order = np.lexsort((np.arange(r), -f))
            out_r[qi, :r] = top[order]
            out_s[qi, :r] = f[order]
        return out_r, out_s

    def describe(self) -> dict[str, Any]:
        """Facts recorded with results: settings and graph size."""
        edges = 0 if self.affinity_ is None else int(self.affinity_.nnz) // 2
        return {**self.settings.__dict__, "graph_edges": edges}
