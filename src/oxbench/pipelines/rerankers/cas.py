"""Cluster-aware similarity diffusion (Luo, Yao, Xu, ICML 2024) as a stage: ``cas``.

"Cluster-Aware Similarity Diffusion for Instance Retrieval". Similarities are diffused inside each
image's local cluster (Bidirectional Similarity Diffusion), smoothed by its confident neighbours
(Neighbor-guided Similarity Smoothing), and images are compared by the divergence of their
diffused similarity rows. As the authors' ``cas_reranking`` (jifeiluo/reranking) computes it, over
the graph of every query of the run and every database image together (``N`` images), with
``d(i, j) = ||x_i - x_j||^2 / max_j' ||x_i - x_j'||^2`` and ``rank(i)`` the images by ``d(i, .)``,
``i`` first:

1. **Sets.** Confident set ``C(i)``: the ``j`` of ``rank(i)[:k1]`` whose own ``rank(j)[:k1]``
   holds ``i``. Candidate set ``R*(i)``: the same mutual set of depth ``k2 + 1``, united with the
   mutual set of depth ``k2 // 2 + 1`` of each member that shares more than two thirds of it with
   the former (the k-reciprocal expansion of :mod:`.k_reciprocal`, half depth ``k2 // 2``).
2. **Bidirectional Similarity Diffusion.** ``s(i, j) = exp(-d(i, j) / sigma^2)``. ``W(i, j) =
   s(i, j)`` for the ``k1 - 1`` nearest other images ``j`` of ``i``, doubled where ``j`` is in
   ``C(i)``; ``W <- (W + W^T) / 2``; ``S = D^-1/2 W D^-1/2`` (``D`` the row sums). ``F`` minimises
   ``sum_k sum_{i,j} W_ij [(F_ki / sqrt(D_ii) - F_kj / sqrt(D_jj))^2 + (F_ik / sqrt(D_ii) -
   F_jk / sqrt(D_jj))^2] / 4n + mu ||F - I||^2``, whose fixed point is iterated 10 times from
   ``F = W``: ``F <- alpha (F S + S F) / 2 + (1 - alpha) I``, ``alpha = 1 / (1 + mu)``.
3. **Neighbor-guided Similarity Smoothing.** ``P``: ``s`` on the ``k3 - 1`` nearest other images,
   each row summing to 1; ``T = P P``. For ``i`` with more than one confident and more than one
   other candidate: the anchor ``a = mean_{c in C(i)} T(c, c)``, the weight ``w(j) = a`` for a
   confident ``j`` and ``min(mean_{c in C(i)} T(j, c), a)`` for another candidate ``j``; on the
   candidates ``v(j) = (F(i, j) (a w(j) + 2 beta) + a^2 m(F) - a m(F w)) / (a^2 + 2 beta)``, ``m``
   the mean over ``R*(i)``; else ``v(j) = F(i, j)``. ``V(i)``: ``v`` on ``R*(i)``, summing to 1.
4. **Expansion** (the authors' Markov step): ``M(i) = (mean_{j in rank(i)[:k4]} V(j) + lv
   mean_{c in C(i)} V(c)) / (1 + lv)``, summing to 1; ``Q``: each row of ``M M`` cut to its
   ``k5`` largest entries, summing to 1; the feature of ``i`` is row ``i`` of ``Q Q``, summing to 1.
5. **Distance.** The Jensen-Shannon divergence (base 2) of two features, on the edges from each
   image to its first 100 of ``rank``; the geodesic (shortest-path) distance over that graph, an
   edge taken either way at its shorter length, at most 50; the final distance ``(1 - lambda)
   geodesic + lambda d(q, x)``.

Each query's list is ordered by the final distance (ties: the incoming order); scores are minus
the final distance. Defaults (k1 .. k5 = 5 / 20 / 25 / 6 / 25, lambda 0.3, lv 2, sigma 0.3,
mu 0.23, beta 0) are the authors' ``cas_reranking`` defaults; the confident weight 2, the 10
iterations, the 100 path neighbours and the cap 50 are fixed there as here.

Cost, ``N = n_queries + n_db``: ``O(N^2 d)`` time for the exact neighbour lists (blocks of rows),
``O(10 N^2 k1)`` time and ``16 N^2`` bytes for the diffusion's dense ``F`` (every image's row is
needed), ``O(N^2 k5)`` for the two-step rows (blocks of rows); the divergences ``O(100 N k5^2)``
and the shortest paths ``O(n_queries 100 N log N)``. A graph of more than ``cas.max_images``
images is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    DenseSpace,
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
)
from oxbench.pipelines.rerankers.k_reciprocal import (
    expanded_set,
    reciprocal_sets,
    squared_neighbours,
)
from oxbench.schema import setting, validate

#: Fixed in the authors' ``cas_reranking`` call chain: the weight of a confident edge in ``W``,
#: the diffusion's iterations, the neighbours of each image in the path graph, the path cap.
CONFIDENT_WEIGHT = 2.0
ITERATIONS = 10
PATH_NEIGHBOURS = 100
PATH_CAP = 50.0

#: Rows of one block of two-step products (bounds the dense temporaries).
_BLOCK = 1 << 22


@dataclass(frozen=True)
class CasSettings:
    """Cluster-aware similarity diffusion (``--set cas.k1=5 --set cas.k2=20 --set cas.mu=0.23``).

    Attributes:
        k1: depth of the confident (mutual) neighbours, the image itself counted; the diffusion
            graph links each image to its ``k1 - 1`` nearest others.
        k2: depth of the k-reciprocal candidate set (``k2 + 1`` with the image).
        k3: depth of the transition matrix of the smoothing (``k3 - 1`` others).
        k4: neighbours averaged in the expansion (the image itself counted).
        k5: entries kept of each two-step row in the expansion.
        lambda_value: weight of the original distance in the final one.
        lv: weight of the confident neighbours in the expansion (the authors' ``lv``).
        sigma: width of the similarity ``exp(-d / sigma^2)`` (``d`` in [0, 1]).
        mu: weight of the fit term of the diffusion (``alpha = 1 / (1 + mu)``).
        beta: weight of the fit term of the smoothing (0: the smoothed weights alone).
        max_images: the largest graph built (queries and database images).
    """

    k1: int = setting(5, S.Int(lo=2, hi=1 << 10), doc="confident neighbours (the image counted)")
    k2: int = setting(20, S.Int(lo=1, hi=1 << 10), doc="k-reciprocal candidate depth")
    k3: int = setting(25, S.Int(lo=2, hi=1 << 10), doc="transition neighbours of the smoothing")
    k4: int = setting(6, S.Int(lo=1, hi=1 << 10), doc="neighbours averaged in the expansion")
    k5: int = setting(25, S.Int(lo=1, hi=1 << 10), doc="entries kept per two-step row")
    lambda_value: float = setting(
        0.3, S.Float(lo=0, hi=1), doc="weight of the original distance in the final one"
    )
    lv: float = setting(2.0, S.Float(lo=0, hi=1e6), doc="weight of the confident neighbours")
    sigma: float = setting(0.3, S.Float(lo=0.05, hi=1e3), doc="similarity width")
    mu: float = setting(0.23, S.Float(lo=0, hi=1e6, lo_open=True), doc="diffusion fit weight")
    beta: float = setting(0.0, S.Float(lo=0, hi=1e6), doc="smoothing fit weight")
    max_images: int = setting(
        1 << 13, S.Int(lo=2, hi=1 << 20), doc="largest graph built (its images)"
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.k1 > min(self.k2 + 1, self.k3):
            raise InputError(
                f"cas.k1={self.k1} must be at most cas.k2 + 1 ({self.k2 + 1}) and cas.k3 "
                f"({self.k3}): the confident neighbours lie among the candidates and the "
                "transition neighbours"
            )


def _row_normalised(m: sp.csr_matrix) -> sp.csr_matrix:
    """Each row divided by its sum of absolute values (an all-zero row stays zero)."""
    sums = np.asarray(abs(m).sum(axis=1), np.float64).ravel()
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(sums, 1e-12)) @ m)


def _on_lists(ids: NDArray[np.int64], values: NDArray[np.float64], n: int) -> sp.csr_matrix:
    """``[n, n]`` with ``values[i, t]`` at ``(i, ids[i, t])``."""
    rows = np.repeat(np.arange(ids.shape[0]), ids.shape[1])
    return sp.csr_matrix((values.ravel(), (rows, ids.ravel())), shape=(n, n))


def _sets_matrix(sets: list[NDArray[np.int64]], n: int) -> sp.csr_matrix:
    indptr = np.concatenate([[0], np.cumsum([len(s) for s in sets])])
    cols = np.concatenate(sets) if sets else np.zeros(0, np.int64)
    return sp.csr_matrix((np.ones(len(cols)), cols, indptr), shape=(n, n))


def bidirectional_diffusion(
    sim: NDArray[np.float64],
    ids: NDArray[np.int64],
    confident: sp.csr_matrix,
    k1: int,
    mu: float,
) -> NDArray[np.float64]:
    """Step 2: the diffused similarities ``F`` (``[N, N]``, symmetric) after ``ITERATIONS``.

    Args:
        sim: ``[N, L]`` similarities of each image to its ranked list ``ids`` (``L >= k1``).
        ids: ``[N, L]`` the ranked lists, the image first.
        confident: ``[N, N]`` 1 where ``j`` is a confident neighbour of ``i``.
        k1: the confident depth (``k1 - 1`` edges per image).
        mu: the fit weight.
    """
    n = ids.shape[0]
    w = _on_lists(ids[:, 1:k1], sim[:, 1:k1], n)
    w = w + (CONFIDENT_WEIGHT - 1.0) * w.multiply(confident)
    w = sp.csr_matrix((w + w.T) / 2.0)
    inv = 1.0 / np.sqrt(np.asarray(w.sum(axis=1), np.float64).ravel())
    s = sp.csr_matrix(sp.diags(inv) @ w @ sp.diags(inv))
    alpha = 1.0 / (1.0 + mu)
    f = w.toarray()
    for _ in range(ITERATIONS):
        g = np.asarray(s @ f)  # S F; F S = (S F)^T as F and S are symmetric
        f = (alpha / 2.0) * (g + g.T)
        f[np.diag_indices(n)] += 1.0 - alpha
    return f


def smoothed_features(
    f: NDArray[np.float64],
    sim: NDArray[np.float64],
    ids: NDArray[np.int64],
    confident: sp.csr_matrix,
    candidates: list[NDArray[np.int64]],
    k3: int,
    beta: float,
) -> sp.csr_matrix:
    """Step 3: the smoothed rows ``V`` on the candidate sets, each summing to 1 (``confident``:
    1 where ``j`` is a confident neighbour of ``i``, each a candidate too)."""
    n = ids.shape[0]
    p = _row_normalised(_on_lists(ids[:, 1:k3], sim[:, 1:k3], n))
    t = sp.csr_matrix(p @ p)
    lengths = np.array([len(c) for c in candidates])
    ci = np.repeat(np.arange(n), lengths)
    cj = np.concatenate(candidates)
    fi = f[ci, cj]
    n_conf = np.asarray(confident.sum(axis=1), np.float64).ravel()
    is_conf = np.asarray(confident[ci, cj], np.float64).ravel() > 0
    smooth = (n_conf > 1) & (lengths - n_conf > 1)
    a = (confident @ t.diagonal()) / np.maximum(n_conf, 1.0)
    # mean over the confident c of T(j, c): (C T^T)(i, j) / |C(i)|
    toward = np.asarray(sp.csr_matrix(confident @ t.T)[ci, cj], np.float64).ravel()
    ai = a[ci]
    w = np.where(is_conf, ai, np.minimum(toward / np.maximum(n_conf[ci], 1.0), ai))
    mean_f = np.bincount(ci, fi, n) / lengths
    mean_fw = np.bincount(ci, fi * w, n) / lengths
    rest = (a * a * mean_f - a * mean_fw)[ci]
    with np.errstate(divide="ignore", invalid="ignore"):
        smoothed = (fi * (ai * w + 2.0 * beta) + rest) / (ai * ai + 2.0 * beta)
    v = np.where(smooth[ci], smoothed, fi)
    total = np.bincount(ci, np.abs(v), n)
    v = v / np.maximum(total, 1e-12)[ci]
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return sp.csr_matrix((v, cj, indptr), shape=(n, n))


def expanded_features(
    v: sp.csr_matrix, ids: NDArray[np.int64], confident: sp.csr_matrix, k4: int, k5: int, lv: float
) -> sp.csr_matrix:
    """Step 4: the features ``Q Q`` (each row summing to 1)."""
    n = v.shape[0]
    avg = _on_lists(ids[:, :k4], np.full((n, k4), 1.0 / k4), n)
    m = (avg @ v + lv * (_row_normalised(confident) @ v)) / (1.0 + lv)
    m = _row_normalised(sp.csr_matrix(m))
    k = min(k5, n)
    rows = max(1, _BLOCK // max(n, 1))
    keep_ids = np.empty((n, k), np.int64)
    keep = np.empty((n, k), np.float64)
    for s in range(0, n, rows):
        block = np.asarray((m[s : s + rows] @ m).toarray())
        top = np.argpartition(-block, k - 1, axis=1)[:, :k] if k < n else np.argsort(-block)
        keep_ids[s : s + len(block)] = top
        keep[s : s + len(block)] = np.take_along_axis(block, top, axis=1)
    q = _row_normalised(_on_lists(keep_ids, keep, n))
    q.eliminate_zeros()
    return _row_normalised(sp.csr_matrix(q @ q))


def js_divergences(
    x: sp.csr_matrix, rows: NDArray[np.int64], cols: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Jensen-Shannon divergences (base 2) of rows ``rows[e]`` and ``cols[e]`` of ``x`` (rows
    ``p``, ``q`` with nonnegative entries): ``(sum_k p log2(2p / (p + q)) + q log2(2q / (p + q)))
    / 2``, each term only where its weight is positive."""
    x = sp.csr_matrix(x)
    x.sort_indices()
    sums = np.asarray(x.sum(axis=1), np.float64).ravel()
    out = 0.5 * (sums[rows] + sums[cols])
    per = np.diff(x.indptr)
    step = max(1, _BLOCK // max(int(per.max(initial=1)), 1))
    for s in range(0, len(rows), step):
        r, c = rows[s : s + step], cols[s : s + step]
        lens = per[c]
        edge = np.repeat(np.arange(len(c)), lens)
        pos = np.repeat(x.indptr[c] - np.cumsum(lens) + lens, lens) + np.arange(lens.sum())
        q = x.data[pos]
        p = np.asarray(x[r[edge], x.indices[pos]], np.float64).ravel()
        both = (p > 0) & (q > 0)
        pb, qb = p[both], q[both]
        # on shared entries the two terms, less the p + q that the row sums above count
        shared = pb * np.log2(2 * pb / (pb + qb)) + qb * np.log2(2 * qb / (pb + qb)) - pb - qb
        out[s : s + step] += 0.5 * np.bincount(edge[both], shared, len(c))
    return out


def cas_distances(
    queries: NDArray[np.floating], database: NDArray[np.floating], settings: CasSettings
) -> NDArray[np.float64]:
    """The final distances ``[n_queries, n_db]`` of every query to every database image."""
    from scipy.sparse.csgraph import dijkstra

    s = settings
    x = np.concatenate([np.asarray(queries, np.float32), np.asarray(database, np.float32)])
    nq, n = len(queries), len(x)
    depth = min(n, max(s.k2 + 1, s.k3, s.k4, PATH_NEIGHBOURS))
    ids, dist, farthest = squared_neighbours(x, x, depth, self_offset=0)
    scale = np.where(farthest > 0, farthest, 1.0)
    sim = np.exp(-(dist / scale[:, None]) / s.sigma**2)
    conf_sets = reciprocal_sets(ids, min(s.k1, depth) - 1)
    recip = reciprocal_sets(ids, min(s.k2, depth - 1))
    half = reciprocal_sets(ids, min(s.k2, depth - 1) // 2)
    cand_sets = [expanded_set(r, half) for r in recip]
    confident = _sets_matrix(conf_sets, n)
    f = bidirectional_diffusion(sim, ids, confident, min(s.k1, depth), s.mu)
    v = smoothed_features(f, sim, ids, confident, cand_sets, min(s.k3, depth), s.beta)
    del f
    feats = expanded_features(v, ids, confident, min(s.k4, depth), s.k5, s.lv)
    width = min(PATH_NEIGHBOURS, depth)
    rows = np.repeat(np.arange(n), width)
    cols = ids[:, :width].ravel()
    keep = cols != rows
    rows, cols = rows[keep], cols[keep]
    # rounding can leave a divergence a hair below 0; the authors clamp to [0, cap] as here
    edges = np.clip(js_divergences(feats, rows, cols), 0.0, PATH_CAP)
    graph = sp.csr_matrix((edges, (rows, cols)), shape=(n, n))
    geodesic = np.minimum(dijkstra(graph, directed=False, indices=np.arange(nq)), PATH_CAP)
    xq, xd = x[:nq].astype(np.float64), x[nq:].astype(np.float64)
    orig = (xq * xq).sum(1)[:, None] + (xd * xd).sum(1)[None, :] - 2.0 * xq @ xd.T
    orig = np.maximum(orig, 0.0) / scale[:nq, None]
    return (1.0 - s.lambda_value) * geodesic[:, nq:] + s.lambda_value * orig


def check_graph_size(size: int, settings: CasSettings) -> None:
    """Refuse a graph larger than ``settings.max_images``, in one line."""
    if size > settings.max_images:
        raise InputError(
            f"cas: a graph of {size:,} images (queries and database) is larger than "
            f"cas.max_images={settings.max_images:,} (the diffusion holds a dense N x N matrix, "
            f"{16 * size * size / 2**30:.1f} GiB); raise cas.max_images if it fits"
        )


def cas_rerank(
    queries: NDArray[np.floating],
    database: NDArray[np.floating],
    ranks: NDArray[np.int64],
    settings: CasSettings,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Order each query's list by the final CAS distance.

    Args:
        queries: ``[n_queries, d]``.
        database: ``[n_db, d]``.
        ranks: ``int64 [n_queries, L]`` the ranking so far.
        settings: the stage's settings.

    Returns:
        ``(ranks, scores)`` of the shape of ``ranks``; scores are minus the final distance.
    """
    check_graph_size(len(queries) + len(database), settings)
    final = cas_distances(queries, database, settings)
    d = np.take_along_axis(final, ranks, axis=1)
    order = np.argsort(d, axis=1, kind="stable")
    return np.take_along_axis(ranks, order, axis=1), (-np.take_along_axis(d, order, axis=1)).astype(
        np.float32
    )


class CasReranker(Reranker):
    """Re-rank by cluster-aware similarity diffusion over the queries and database together."""

    about = "cluster-aware similarity diffusion: diffusion inside local clusters, smoothing, Jensen-Shannon geodesics (Luo et al. 2024)"

    needs = frozenset({"dense"})
    settings_type: ClassVar[type] = CasSettings

    def __init__(self, settings: CasSettings) -> None:
        self.settings = settings

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        s = self.settings
        return {"cas": {k: getattr(s, k) for k in ("k1", "k2", "k3", "k4", "k5", "lambda_value")}}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        dense = cast(DenseSpace, space)
        queries = dense.dense_queries(ranking)
        with ctx.timed("cas"):
            ranks, scores = cas_rerank(queries, dense.dense_database, ranking.ranks, self.settings)
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


register_reranker("cas", CasReranker)
