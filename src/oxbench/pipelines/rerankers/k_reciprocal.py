"""k-reciprocal re-ranking (Zhong, Zheng, Cao, Li, CVPR 2017) as a stage: ``k-reciprocal``.

"Re-ranking Person Re-identification with k-reciprocal Encoding". Each image is encoded by its
*k-reciprocal* nearest neighbours, and a query and a database image are compared by the Jaccard
distance of their encodings, mixed with their original distance.

Over a set of images (the **graph**), with ``d(p, g) = ||x_p - x_g||^2`` divided by the largest
such distance of ``p`` to any image of the set (the authors' normalisation):

1. ``N(p, k)``: the ``k + 1`` nearest images of ``p`` (``p`` itself first); the k-reciprocal set
   ``R(p, k) = {g in N(p, k) : p in N(g, k)}`` (Eq. 3).
2. Expansion (Eq. 6): ``R*(p, k1) = R(p, k1)  U  R(c, round(k1 / 2))`` for every ``c`` in
   ``R(p, k1)`` whose half set shares more than two thirds of its images with ``R(p, k1)``.
3. Encoding (Eq. 8): ``V_p[g] = exp(-d(p, g)) / sum_{g' in R*} exp(-d(p, g'))`` for ``g`` in
   ``R*(p, k1)``, else 0.
4. Local query expansion (Eq. 11): ``V_p <- mean of V_g over the k2 nearest images g of p``
   (``p`` itself among them).
5. Jaccard distance (Eq. 10): ``d_J(p, g) = 1 - sum_i min(V_p[i], V_g[i]) / sum_i max(V_p[i], V_g[i])``.
6. Final distance (Eq. 12): ``d*(p, g) = (1 - lambda) d_J(p, g) + lambda d(p, g)``.

The graph (``k-reciprocal.graph``):

- ``joint`` (default; the authors' convention, their ``re_ranking(q_g, q_q, g_g)``): every query of
  the run and every database image, together, built when the queries are answered;
- ``database``: the database images alone, built once at index time, so that a database image's
  encoding does not depend on the queries of the run. Each query is then encoded as if it alone
  were added: ``g`` of its ``k1`` nearest database images is k-reciprocal when the query is
  nearer to ``g`` than ``g``'s ``k1``-th database neighbour; the half sets of step 2 are the
  database graph's (with the query, when it is mutual at that depth), and step 4 averages the
  query's encoding with the database encodings of its ``k2 - 1`` nearest images.

Each query's top ``k-reciprocal.top`` images are re-ordered by ``d*`` (ties: the incoming order),
the rest of the ranking follows unchanged; scores are ``1 - d*``, and below the re-ranked head at
most its lowest score.

Cost, with ``N`` the images of the graph (``n_queries + n_db`` joint, ``n_db`` database-only):
``O(N^2 d)`` time for the exact neighbour lists (blocks of rows, never the ``N x N`` matrix),
``O(N k1^2)`` for the reciprocity checks and ``O(N k2 k1)`` memory for the encodings; each query's
Jaccard distances cost ``O(top k2 k1)``. A graph of more than ``k-reciprocal.max_images`` images
is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

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
from oxbench.schema import setting, validate

Graph = Literal["joint", "database"]

#: Float64 entries of one block of squared distances (bounds the temporaries to 128 MiB).
_BLOCK = 1 << 24


@dataclass(frozen=True)
class KReciprocalSettings:
    """k-reciprocal re-ranking (``--set k-reciprocal.k1=20 --set k-reciprocal.lambda_value=0.3 --set
    k-reciprocal.graph=database``).

    Attributes:
        k1: neighbours of the k-reciprocal sets (the paper's ``k1``).
        k2: neighbours of the local query expansion (``k2``; 1: none).
        lambda_value: weight of the original distance in the final one (the paper's
            ``lambda``; the authors' code names it ``lambda_value``, as ``lambda`` is Python's).
        graph: ``"joint"`` (queries and database together) or ``"database"`` (database alone).
        top: images re-ranked per query (the head of its ranking).
        max_images: the largest graph built (``N``); a larger one is refused.
    """

    k1: int = setting(20, S.Int(lo=1, hi=1 << 10), doc="k-reciprocal neighbours")
    k2: int = setting(6, S.Int(lo=1, hi=1 << 10), doc="local query expansion neighbours")
    lambda_value: float = setting(
        0.3, S.Float(lo=0, hi=1), doc="weight of the original distance (the paper's lambda)"
    )
    graph: Graph = setting(
        "joint", S.Choice("joint", "database"), doc="neighbour graph: queries+database, database"
    )
    top: int = setting(1000, S.Int(lo=1, hi=1 << 24), doc="images re-ranked per query")
    max_images: int = setting(
        1 << 20, S.Int(lo=2, hi=1 << 30), doc="largest graph built (its images)"
    )

    def __post_init__(self) -> None:
        validate(self)


def squared_neighbours(
    x: NDArray[np.floating], y: NDArray[np.floating], k: int, *, self_offset: int | None = None
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
    """The ``k`` nearest rows of ``y`` of each row of ``x`` by squared Euclidean distance.

    Args:
        x: ``[n, d]``.
        y: ``[m, d]``.
        k: list length (at most ``m``).
        self_offset: row ``i`` of ``x`` is row ``i + self_offset`` of ``y`` (its distance is 0).

    Returns:
        ``(ids int64 [n, k], dists float64 [n, k], farthest float64 [n])``: nearest first (ties:
        lower index), and each row's largest distance to any row of ``y``.
    """
    xf, yf = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n, m = xf.shape[0], yf.shape[0]
    k = min(k, m)
    yy = (yf * yf).sum(axis=1)
    ids = np.empty((n, k), np.int64)
    dists = np.empty((n, k), np.float64)
    farthest = np.empty(n, np.float64)
    rows = max(1, _BLOCK // max(m, 1))
    for s in range(0, n, rows):
        xb = xf[s : s + rows]
        d = (xb * xb).sum(axis=1)[:, None] + yy[None, :] - 2.0 * (xb @ yf.T)
        np.maximum(d, 0.0, out=d)
        if self_offset is not None:
            r = np.arange(xb.shape[0])
            d[r, s + r + self_offset] = 0.0
        farthest[s : s + xb.shape[0]] = d.max(axis=1)
        part = (
            np.argpartition(d, k - 1, axis=1)[:, :k]
            if k < m
            else np.tile(np.arange(m), (len(d), 1))
        )
        pd = np.take_along_axis(d, part, axis=1)
        order = np.lexsort((part, pd), axis=1)
        ids[s : s + xb.shape[0]] = np.take_along_axis(part, order, axis=1)
        dists[s : s + xb.shape[0]] = np.take_along_axis(pd, order, axis=1)
    return ids, dists, farthest


def pair_distances(
    x: NDArray[np.floating], i: int, y: NDArray[np.floating], cols: NDArray[np.int64]
) -> NDArray[np.float64]:
    """Squared distances of row ``i`` of ``x`` to rows ``cols`` of ``y`` (clipped at 0)."""
    a = np.asarray(x[i], np.float64)
    b = np.asarray(y[cols], np.float64)
    return np.maximum((a @ a) + (b * b).sum(axis=1) - 2.0 * (b @ a), 0.0)


def reciprocal_sets(nbr: NDArray[np.int64], k: int) -> list[NDArray[np.int64]]:
    """``R(p, k)`` of every node ``p`` from its neighbour list ``nbr[p]`` (itself first):
    the nodes of ``nbr[p, :k + 1]`` whose own first ``k + 1`` hold ``p``, in ``nbr``'s order."""
    n = nbr.shape[0]
    f = nbr[:, : k + 1]
    out: list[NDArray[np.int64]] = []
    rows = max(1, _BLOCK // max(f.shape[1] ** 2, 1))
    for s in range(0, n, rows):
        block = f[s : s + rows]
        back = f[block]  # [b, k+1, k+1]: each forward neighbour's own list
        mask = (back == np.arange(s, s + len(block))[:, None, None]).any(axis=2)
        out.extend(block[j][mask[j]] for j in range(len(block)))
    return out


def expanded_set(r: NDArray[np.int64], half: list[NDArray[np.int64]] | Any) -> NDArray[np.int64]:
    """``R*``: ``r`` united with the half set of each of its members that shares more than two
    thirds of its images with ``r`` (``half[c]``: the half set of member ``c``)."""
    parts = [r]
    for c in r:
        hc = half[int(c)]
        if len(np.intersect1d(hc, r)) > 2.0 / 3.0 * len(hc):
            parts.append(hc)
    return np.unique(np.concatenate(parts))


def _encoding(cols: NDArray[np.int64], dist: NDArray[np.float64]) -> NDArray[np.float64]:
    w = np.exp(-dist)
    return w / w.sum()


def jaccard_distances(vq: sp.csr_matrix, vg: sp.csr_matrix) -> NDArray[np.float64]:
    """``1 - sum min / sum max`` between the one row ``vq`` and every row of ``vg`` (Eq. 10)."""
    cols, vals = vq.indices, vq.data
    full = np.zeros(vq.shape[1], np.float64)
    full[cols] = vals
    sub = sp.csr_matrix(vg[:, cols]) if len(cols) else sp.csr_matrix(vg.shape, dtype=np.float64)
    lookup = vals if len(cols) else np.zeros(0)
    mins = sp.csr_matrix(
        (np.minimum(sub.data, lookup[sub.indices]), sub.indices, sub.indptr), shape=sub.shape
    )
    summin = np.asarray(mins.sum(axis=1), np.float64).ravel()
    summax = vals.sum() + np.asarray(vg.sum(axis=1), np.float64).ravel() - summin
    return 1.0 - np.divide(summin, summax, out=np.zeros_like(summin), where=summax > 0)


def joint_encodings(
    x: NDArray[np.floating], k1: int, k2: int
) -> tuple[sp.csr_matrix, NDArray[np.float64]]:
    """The encodings ``V`` after local query expansion of every row of ``x`` over the graph of
    all rows (steps 1-4), and each row's largest squared distance (its normalisation)."""
    n = x.shape[0]
    depth = max(k1, k2 - 1) + 1
    nbr, _, farthest = squared_neighbours(x, x, depth, self_offset=0)
    scale = np.where(farthest > 0, farthest, 1.0)
    recip = reciprocal_sets(nbr, k1)
    half = reciprocal_sets(nbr, int(np.around(k1 / 2.0)))
    indptr, indices, data = [0], [], []
    for p in range(n):
        cols = expanded_set(recip[p], half)
        dist = pair_distances(x, p, x, cols) / scale[p]
        dist[cols == p] = 0.0
        indices.append(cols)
        data.append(_encoding(cols, dist))
        indptr.append(indptr[-1] + len(cols))
    v = sp.csr_matrix((np.concatenate(data), np.concatenate(indices), indptr), shape=(n, n))
    return _local_expansion(v, nbr[:, :k2]), farthest


def _local_expansion(v: sp.csr_matrix, rows: NDArray[np.int64]) -> sp.csr_matrix:
    """Row ``p``: the mean of the rows ``rows[p]`` of ``v`` (step 4)."""
    n, k2 = rows.shape
    avg = sp.csr_matrix(
        (np.full(n * k2, 1.0 / k2), rows.ravel(), np.arange(0, n * k2 + 1, k2)),
        shape=(n, v.shape[0]),
    )
    return sp.csr_matrix(avg @ v)


class DatabaseGraph:
    """The database-only graph (``graph=database``): encodings of the database images, built
    once; :meth:`query_encoding` encodes a query as if it alone were added."""

    def __init__(self, db: NDArray[np.floating], k1: int, k2: int) -> None:
        self.db = np.asarray(db, np.float32)
        self.k1, self.k2, self.h = k1, k2, int(np.around(k1 / 2.0))
        n = self.db.shape[0]
        depth = max(k1, k2 - 1) + 1
        self.nbr, self.dists, farthest = squared_neighbours(self.db, self.db, depth, self_offset=0)
        self.scale = np.where(farthest > 0, farthest, 1.0)
        recip = reciprocal_sets(self.nbr, k1)
        self.half = reciprocal_sets(self.nbr, self.h)
        indptr, indices, data = [0], [], []
        for p in range(n):
            cols = expanded_set(recip[p], self.half)
            dist = pair_distances(self.db, p, self.db, cols) / self.scale[p]
            dist[cols == p] = 0.0
            indices.append(cols)
            data.append(_encoding(cols, dist))
            indptr.append(indptr[-1] + len(cols))
        # one more column: the query being encoded (no database image holds it)
        self.v = sp.csr_matrix(
            (np.concatenate(data), np.concatenate(indices), indptr), shape=(n, n + 1)
        )
        self.v_qe = _local_expansion(self.v, self.nbr[:, :k2])

    def _depth(self, k: int) -> int:
        return min(k, self.nbr.shape[1] - 1)

    def query_encoding(self, q: NDArray[np.floating]) -> tuple[sp.csr_matrix, NDArray[np.float64]]:
        """The query's encoding after local expansion (one row, the query's own column last)
        and its squared distance to every database image."""
        n = self.db.shape[0]
        qf = np.asarray(q, np.float64)
        dq = np.maximum(
            (qf @ qf) + (self.db.astype(np.float64) ** 2).sum(axis=1) - 2.0 * (self.db @ qf), 0.0
        )
        order = np.lexsort((np.arange(n), dq))
        scale = float(dq.max()) if n and dq.max() > 0 else 1.0

        def mutual(k: int) -> NDArray[np.int64]:
            kk = self._depth(k)
            fwd = order[:k]
            # the query enters g's own first k + 1 when nearer than g's k-th neighbour
            return fwd[dq[fwd] < self.dists[fwd, kk]]

        r = np.concatenate([[n], mutual(self.k1)])
        half_q = np.concatenate([[n], mutual(self.h)])
        in_half = set(half_q.tolist())

        class _Half:
            def __getitem__(inner, c: int) -> NDArray[np.int64]:  # noqa: N805
                if c == n:
                    return half_q
                own = self.half[c]
                return np.concatenate([own, [n]]) if c in in_half else own

        cols = expanded_set(r, _Half())
        dist = np.where(cols == n, 0.0, dq[np.minimum(cols, n - 1)] / scale)
        row = sp.csr_matrix((_encoding(cols, dist), cols, [0, len(cols)]), shape=(1, n + 1))
        near = order[: self.k2 - 1]
        expanded = (row + self.v[near].sum(axis=0)) / self.k2
        return sp.csr_matrix(expanded), dq / scale


def k_reciprocal_rerank(
    queries: NDArray[np.floating],
    database: NDArray[np.floating],
    ranks: NDArray[np.int64],
    settings: KReciprocalSettings,
    *,
    graph: DatabaseGraph | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Re-rank the top ``settings.top`` of each query's ranking by the final distance ``d*``.

    Args:
        queries: ``[n_queries, d]`` query vectors.
        database: ``[n_db, d]`` database vectors.
        ranks: ``int64 [n_queries, L]`` the ranking so far (database positions).
        settings: the stage's settings.
        graph: the database graph (``graph=database``; built here when ``None``).

    Returns:
        ``(ranks, scores)`` of the same shape: the head re-ordered by ``d*`` (scores ``1 - d*``).
    """
    q = np.asarray(queries, np.float32)
    db = np.asarray(database, np.float32)
    nq, ndb = q.shape[0], db.shape[0]
    k1, k2, lam = settings.k1, settings.k2, settings.lambda_value
    size = nq + ndb if settings.graph == "joint" else ndb
    check_graph_size(size, settings)
    top = min(settings.top, ranks.shape[1])
    out_ranks = ranks.copy()
    scores = np.empty(ranks.shape, np.float32)
    if settings.graph == "joint":
        x = np.concatenate([q, db])
        v, farthest = joint_encodings(x, k1, k2)
        vg = sp.csr_matrix(v[nq:])
        scale = np.where(farthest > 0, farthest, 1.0)
        for i in range(nq):
            head = ranks[i, :top]
            jac = jaccard_distances(v[i], vg[head])
            orig = pair_distances(x, i, x, head + nq) / scale[i]
            _place(out_ranks, scores, i, ranks[i], head, (1 - lam) * jac + lam * orig, lam, orig)
    else:
        g = graph if graph is not None else DatabaseGraph(db, k1, k2)
        for i in range(nq):
            vq, dq = g.query_encoding(q[i])
            head = ranks[i, :top]
            jac = jaccard_distances(vq, g.v_qe[head])
            orig = dq[head]
            _place(out_ranks, scores, i, ranks[i], head, (1 - lam) * jac + lam * orig, lam, orig)
    return out_ranks, scores


def _place(
    out_ranks: NDArray[np.int64],
    scores: NDArray[np.float32],
    i: int,
    row: NDArray[np.int64],
    head: NDArray[np.int64],
    final: NDArray[np.float64],
    lam: float,
    orig: NDArray[np.float64],
) -> None:
    order = np.argsort(final, kind="stable")
    top = len(head)
    out_ranks[i, :top] = head[order]
    head_scores = (1.0 - final[order]).astype(np.float32)
    scores[i, :top] = head_scores
    if row.shape[0] > top:
        floor = float(head_scores.min()) if top else 0.0
        # beyond the head: as if no encoding were shared (d_J = 1), never above the head
        scores[i, top:] = floor
    del lam, orig


def check_graph_size(size: int, settings: KReciprocalSettings) -> None:
    """Refuse a graph larger than ``settings.max_images``, in one line."""
    if size > settings.max_images:
        raise InputError(
            f"k-reciprocal.graph={settings.graph}: a graph of {size:,} images is larger than "
            f"k-reciprocal.max_images={settings.max_images:,} (time O(N^2 d), memory "
            f"O(N k1 k2)); use graph=database, or raise k-reciprocal.max_images"
        )


class KReciprocalReranker(Reranker):
    """Re-rank each query's top by k-reciprocal encoding (Jaccard distance mixed with the
    original one)."""

    about = "k-reciprocal encoding: Jaccard distance of neighbour sets mixed with the original distance (Zhong et al. 2017)"

    needs = frozenset({"dense"})
    settings_type: ClassVar[type] = KReciprocalSettings

    def __init__(self, settings: KReciprocalSettings) -> None:
        self.settings = settings
        self.graph: DatabaseGraph | None = None

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        s = self.settings
        if s.graph == "database":
            db = cast(DenseSpace, space).dense_database
            check_graph_size(db.shape[0], s)
            with ctx.timed("k_reciprocal_graph"):
                self.graph = DatabaseGraph(db, s.k1, s.k2)
        return {
            "k_reciprocal": {
                "graph": s.graph,
                "k1": s.k1,
                "k2": s.k2,
                "lambda_value": s.lambda_value,
            }
        }

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        dense = cast(DenseSpace, space)
        queries = dense.dense_queries(ranking)
        with ctx.timed("k_reciprocal"):
            ranks, scores = k_reciprocal_rerank(
                queries, dense.dense_database, ranking.ranks, self.settings, graph=self.graph
            )
        info = {**ranking.info, "k_reciprocal_graph": self.settings.graph}
        return Ranking(ranks, scores, ranking.queries, info=info)


register_reranker("k-reciprocal", KReciprocalReranker)
