"""Diffusion re-ranking of global descriptors (Iscen, Tolias, Avrithis, Furon, Chum, CVPR 2017).

"Efficient Diffusion on Region Manifolds: Recovering Small Objects with Compact CNN
Representations". Relevance spreads from the query over the database's k-nearest-neighbour graph, so
images reachable through a chain of close neighbours (the same building from ever more different
views) rise even when their direct similarity to the query is low.

**The graph** (once per database, :meth:`Diffusion.fit`): the affinity matrix ``A`` of the mutual
k-NN graph -- ``a_ij = max(x_i . x_j, 0) ** gamma`` when ``j`` is among the ``k`` nearest neighbours
of ``i`` *and* ``i`` among those of ``j``, else 0; ``a_ii = 0``; ``gamma = 3`` -- built with a
FAISS flat inner-product search of the database against itself. ``k`` is counted as the reference
code counts it (Iscen et al.'s ``knngraph`` and fyang93's ``get_affinity`` both search ``k``
nearest images of an image *in the database*, the image itself first): ``k = 50`` links an image
to at most 49 others. Then the symmetric normalisation of the **whole** graph,
``W = D^-1/2 A D^-1/2`` (``D`` = degrees; isolated nodes get 0).

**The query** vector ``y``: ``y_i = max(q . x_i, 0) ** gamma`` for the query's ``query_k`` nearest
images, 0 elsewhere (the query is not a node of the graph; it is linked to its nearest neighbours).
Relevance is the solution of ``(I - alpha W) f = y``, by conjugate gradient
(``scipy.sparse.linalg.cg``; ``I - alpha W`` is symmetric positive definite for ``alpha < 1``),
``alpha = 0.99``, at most ``iterations`` steps, relative residual ``tol``.

Two modes (``mode``):

- ``"online"`` (default; the truncated diffusion of the paper): per query, take the top ``R``
  (``truncation``) images of its initial ranking and solve ``(I - alpha W_RR) f = y_R`` on the
  rows and columns of ``W`` that belong to them -- ``normalise="full"``: ``W_RR`` sliced from the
  whole graph's normalisation, as the reference code does (Iscen et al. diffuse over the whole
  ``W`` for their 5K global runs, fyang93's offline step slices the whole graph's Laplacian);
  ``normalise="subgraph"``: the slice ``A_RR`` re-normalised with its own degrees, the truncated
  Laplacian that Iscen et al.'s code uses only for its large-scale regional runs. When the top
  ``R`` holds every image connected to the query's neighbours, "full" is exactly the whole-graph
  solution restricted to them.
- ``"offline"`` (fyang93's ``search_old``): for every database image ``i`` the diffusion from
  ``i`` alone, ``(I - alpha W_TT) g_i = e_i`` over ``i``'s own top ``R`` neighbours ``T``, is
  computed once in :meth:`Diffusion.fit` and kept as a sparse ``[n, n]`` matrix (``R`` values per
  image: its memory per image is recorded); a query's relevance is then the linear combination
  ``f = sum_j y_j g_j`` over its ``query_k`` seeds -- by linearity, with ``R = n``, the same ``f``
  as the online mode.

Ranking: online, the ``R`` images are re-ordered by ``f`` and the rest of the initial ranking
follows unchanged; offline, the whole initial list is re-ordered by ``f`` (images ``f`` does not
reach keep their initial order, after those it does). Ties: initial order. Returned scores are
``max(f, 0)`` (0 beyond ``R`` online), so scores never increase down a list.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.schema import setting, validate

log = logging.getLogger(__name__)

Normalise = Literal["full", "subgraph"]
Mode = Literal["online", "offline"]


@dataclass(frozen=True)
class DiffusionSettings:
    """Settings of :class:`Diffusion` (defaults as in Iscen et al. 2017's global-descriptor runs).

    The one declaration of diffusion's settings: the ``diffusion`` stage's settings
    (``--set diffusion.k=100``), and ``diffusion-verified``'s.

    Attributes:
        k: images per database image's neighbour list, the image itself included (``k = 50``:
            at most 49 edges per image), as the reference code counts it.
        query_k: nearest images the query's relevance starts from.
        alpha: diffusion weight in ``(0, 1)``.
        gamma: similarity exponent of the affinities.
        truncation: ``R``, images diffused over per query (online) or per database image (offline).
        iterations: conjugate-gradient iterations at most.
        tol: conjugate-gradient relative residual tolerance.
        normalise: ``"full"`` (slices of the whole graph's normalisation) or ``"subgraph"``
            (each truncated sub-graph re-normalised with its own degrees).
        mode: ``"online"`` (truncated diffusion per query) or ``"offline"`` (every database
            image's diffusion precomputed, queries answered by linear combination).
    """

    k: int = setting(
        50, S.Int(lo=2, hi=1 << 16), doc="graph neighbours (the image counts: 2 is one)"
    )
    query_k: int = setting(10, S.Int(lo=1, hi=1 << 16), doc="query neighbours")
    alpha: float = setting(0.99, S.Float(lo=0, lo_open=True, hi=1, hi_open=True), doc="alpha")
    gamma: float = setting(3.0, S.Float(lo=0, lo_open=True, hi=100), doc="similarity exponent")
    truncation: int = setting(1000, S.Int(lo=1, hi=1 << 24), doc="images re-ranked")
    iterations: int = setting(20, S.Int(lo=1, hi=10_000), doc="solver iterations")
    tol: float = setting(
        1e-6, S.Float(lo=0, lo_open=True, hi=1, hi_open=True), doc="solver relative residual"
    )
    normalise: Normalise = setting("full", S.Choice("full", "subgraph"), doc="graph normalisation")
    mode: Mode = setting("online", S.Choice("online", "offline"), doc="per query, or precomputed")

    def __post_init__(self) -> None:
        validate(self)


def knn_affinity(
    x: NDArray[np.floating],
    k: int,
    *,
    gamma: float = 3.0,
    mutual: bool = True,
    threads: int | None = None,
) -> sp.csr_matrix:
    """The (mutual) k-NN affinity matrix of the rows of ``x``, built with FAISS.

    Args:
        x: ``[n, d]`` L2-normalised vectors.
        k: neighbours per row, the row itself *not* counted (:class:`Diffusion` passes its
            ``k - 1``).
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
    return affinity_from_neighbours(sims, ids, k, gamma=gamma, mutual=mutual)


def affinity_from_neighbours(
    sims: NDArray[np.floating],
    ids: NDArray[np.integer],
    k: int,
    *,
    gamma: float = 3.0,
    mutual: bool = True,
) -> sp.csr_matrix:
    """:func:`knn_affinity` from each row's searched neighbours (``[n, >= k + 1]``, best first,
    the row itself among them: a k-NN graph built by any exact search, e.g. the streamed one of
    :func:`oxbench.index.mapped.knn_graph`)."""
    n = ids.shape[0]
    if n < 2:
        raise InputError(f"diffusion needs at least 2 database images, got {n}")
    kk = min(k, n - 1)
    ids = np.asarray(ids)[:, : kk + 1]
    sims = np.asarray(sims)[:, : kk + 1]
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
    w: sp.spmatrix | sp.sparray,
    y: NDArray[np.floating],
    *,
    alpha: float = 0.99,
    iterations: int = 20,
    tol: float = 1e-6,
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

    Attributes (after ``fit``): ``database_`` (``float32 [n, d]``), ``affinity_`` (``A``, CSR),
    ``transition_`` (``W = D^-1/2 A D^-1/2`` of the whole graph, CSR), ``offline_`` (offline
    mode: ``float32 [n, n]`` CSR, row ``i`` the diffusion from image ``i``; else ``None``).
    """

    def __init__(
        self, settings: DiffusionSettings | None = None, *, threads: int | None = None
    ) -> None:
        self.settings = settings or DiffusionSettings()
        self.threads = threads
        self.database_: NDArray[np.float32] | None = None
        self.affinity_: sp.csr_matrix | None = None
        self.transition_: sp.csr_matrix | None = None
        self.offline_: sp.csr_matrix | None = None

    def fit(
        self,
        database: NDArray[np.floating],
        *,
        neighbours: tuple[NDArray[np.floating], NDArray[np.integer]] | None = None,
    ) -> Diffusion:
        """Build the mutual k-NN graph of the database and its normalisation (offline mode: and
        every database image's diffusion); ``neighbours``: each image's top ``k`` (itself
        included) already searched (:func:`affinity_from_neighbours`), else FAISS searches them.

        Raises:
            InputError: ``k`` larger than the database, or a database that is not finite ``[n, d]``.
        """
        s = self.settings
        db = np.ascontiguousarray(database, dtype=np.float32)
        if db.ndim == 2 and s.k > db.shape[0]:
            raise InputError(
                f"diffusion.k={s.k} is larger than the database ({db.shape[0]} images)"
            )
        if neighbours is not None:
            if neighbours[1].shape[0] != db.shape[0] or neighbours[1].shape[1] < min(
                s.k, db.shape[0]
            ):
                raise InputError(
                    f"diffusion: neighbours {neighbours[1].shape} for {db.shape[0]} images, k {s.k}"
                )
            self.affinity_ = affinity_from_neighbours(*neighbours, s.k - 1, gamma=s.gamma)
        else:
            self.affinity_ = knn_affinity(db, s.k - 1, gamma=s.gamma, threads=self.threads)
        self.transition_ = normalize_affinity(self.affinity_)
        self.database_ = db
        self.offline_ = self._offline() if s.mode == "offline" else None
        return self

    def _weights(self, nodes: NDArray[np.int64]) -> sp.csr_matrix:
        """``W`` on ``nodes``: sliced from the whole graph's normalisation, or re-normalised."""
        assert self.affinity_ is not None and self.transition_ is not None
        if self.settings.normalise == "subgraph":
            return normalize_affinity(self.affinity_[nodes][:, nodes])
        return sp.csr_matrix(self.transition_[nodes][:, nodes])

    def _offline(self) -> sp.csr_matrix:
        """Row ``i``: the diffusion from image ``i`` over its own top ``truncation`` neighbours."""
        from oxbench.index.faiss_setup import load_faiss

        s = self.settings
        db = self.database_
        assert db is not None
        n = db.shape[0]
        r = min(s.truncation, n)
        faiss = load_faiss(self.threads)
        index = faiss.IndexFlatIP(db.shape[1])
        index.add(db)
        _, nbrs = index.search(db, r)
        nbrs = nbrs.astype(np.int64)
        values = np.zeros((n, r), np.float32)
        for i in range(n):
            hit = np.flatnonzero(nbrs[i] == i)
            if not len(hit):  # duplicates pushed the image itself out of its own list
                nbrs[i, -1] = i
                hit = np.array([r - 1])
            e = np.zeros(r)
            e[hit[0]] = 1.0
            values[i] = diffuse(
                self._weights(nbrs[i]), e, alpha=s.alpha, iterations=s.iterations, tol=s.tol
            )
        rows = np.repeat(np.arange(n), r)
        return sp.csr_matrix((values.ravel(), (rows, nbrs.ravel())), shape=(n, n), dtype=np.float32)

    def rerank(
        self,
        queries: NDArray[np.floating],
        ranks: NDArray[np.integer],
        *,
        seeds: Sequence[NDArray[np.integer]] | None = None,
    ) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """Re-rank each query's initial list by diffusion.

        Args:
            queries: ``[n_q, d]`` the query vectors the initial ranking came from.
            ranks: ``[n_q, L]`` initial ranked lists (database indices, best first).
            seeds: per query, database images that start the diffusion besides the query's
                ``query_k`` nearest -- with ``y = 1``, the weight of an image identical to the
                query (``max(q . x, 0) ** gamma`` is at most 1): the images a spatial verification
                accepted, as the 2018 revisit's hybrid rows start diffusion from them. Online,
                only those within the top ``truncation`` of the list count.

        Returns:
            ``(ranks int64 [n_q, L], scores float32 [n_q, L])``; online: the diffused top ``R``
            followed by the rest of each initial list (scores: ``max(f, 0)``, then 0); offline:
            the whole list ordered by ``max(f, 0)``, ties in initial order.
        """
        if self.database_ is None or self.affinity_ is None:
            raise InputError("diffusion: fit the database graph before re-ranking")
        s = self.settings
        q = np.asarray(queries, dtype=np.float32)
        lists: NDArray[np.int64] = np.asarray(ranks).astype(np.int64, copy=False)
        if q.ndim != 2 or q.shape[1] != self.database_.shape[1]:
            raise InputError(
                f"diffusion: queries of shape {q.shape} do not match the database dimension {self.database_.shape[1]}"
            )
        if lists.ndim != 2 or lists.shape[0] != q.shape[0]:
            raise InputError(f"diffusion: ranks of shape {lists.shape} for {q.shape[0]} queries")
        if lists.size and (lists.min() < 0 or lists.max() >= self.database_.shape[0]):
            raise InputError("diffusion: ranks hold indices outside the database")
        out_r: NDArray[np.int64] = np.array(lists, dtype=np.int64)
        out_s: NDArray[np.float32] = np.zeros(out_r.shape, np.float32)
        r = min(s.truncation, lists.shape[1])
        for qi in range(q.shape[0]):
            top = lists[qi, :r]
            sims = self.database_[top] @ q[qi]
            near = np.argsort(-sims, kind="stable")[: s.query_k]
            weights = np.power(np.clip(sims[near].astype(np.float64), 0.0, None), s.gamma)
            if seeds is not None and len(seeds[qi]):
                extra = np.flatnonzero(np.isin(top, np.asarray(seeds[qi], np.int64)))
                y_top = np.zeros(r)
                y_top[near] = weights
                y_top[extra] = 1.0
                near = np.flatnonzero(y_top)
                weights = y_top[near]
            if self.offline_ is not None:
                f_all = np.asarray(self.offline_[top[near]].T @ weights).ravel()
                f = np.clip(f_all[lists[qi]], 0.0, None)
                order = np.lexsort((np.arange(len(f)), -f))
                out_r[qi] = lists[qi][order]
                out_s[qi] = f[order]
                continue
            y = np.zeros(r)
            y[near] = weights
            f = np.clip(
                diffuse(self._weights(top), y, alpha=s.alpha, iterations=s.iterations, tol=s.tol),
                0.0,
                None,
            )
            order = np.lexsort((np.arange(r), -f))
            out_r[qi, :r] = top[order]
            out_s[qi, :r] = f[order]
        return out_r, out_s

    def describe(self) -> dict[str, Any]:
        """Facts recorded with results: settings, graph size, and offline the memory per image."""
        edges = 0 if self.affinity_ is None else int(self.affinity_.nnz) // 2
        out: dict[str, Any] = {**asdict(self.settings), "graph_edges": edges}
        if self.offline_ is not None:
            o = self.offline_
            n = max(1, o.shape[0])
            out["offline_nnz_per_image"] = int(o.nnz) // n
            out["offline_bytes_per_image"] = (
                int(o.data.nbytes + o.indices.nbytes + o.indptr.nbytes) // n
            )
        return out
