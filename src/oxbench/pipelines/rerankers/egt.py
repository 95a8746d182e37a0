"""Explore-exploit graph traversal (Chang, Yu, Liu, Volkovs, CVPR 2019) as a stage: ``egt``.

"Explore-Exploit Graph Traversal for Image Retrieval". The database is a weighted k-NN graph; a
query's result list is the order in which a traversal from the query reaches the images.

**The graph** (index time, :meth:`EgtReranker.prepare`): each database image linked to its ``k``
nearest *other* database images, edge weight the similarity ``x_i . x_j``; then made symmetric
(an edge either way is an edge both ways, weight the larger). The query is linked to the first
``k`` images of its ranking, weights ``q . x_j``; no database image links back to a query (the
paper's online inference).

**The traversal** (Algorithm 1, as the authors' ``primPaperEfficient`` runs it): a max-heap ``H``
of edges to images not yet reached, keyed by weight (ties: the edge pushed first); an edge to an
image is pushed only when heavier than every edge pushed to it so far. Starting from the query's
edges, repeat:

1. *explore*: take the heaviest edge of ``H``; its image is next in the result;
2. *exploit*: while the heaviest edge of ``H`` weighs more than ``tau``, take it too;
3. push the edges of every image just reached; stop when ``p`` images are reached or ``H`` is
   empty.

The result is the images in the order they were reached, then the rest of the incoming ranking in
its order. Scores: the weight of the edge that reached each image, as a running minimum down the
list (so they never rise), and that minimum for the rest.

Defaults ``k = 250``, ``tau = 0.42``, ``p = 5000``: the authors' ROxford run (their README and
``run_all.py``, "to generate the paper result"). The authors' code makes the graph symmetric with
a slip (``getSymmetric`` files every reverse edge of image ``j`` under the key ``j``, so ``j`` keeps
at most one of them); the paper's symmetric graph is built here (docs/conformance.md compares both).

Cost: the graph ``O(n_db^2 d)`` time (exact neighbours, in blocks) and ``O(n_db k)`` memory; each
query ``O(p k log(p k))``. A database larger than ``egt.max_images`` is refused in one line.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.index.search import exact_search
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    DenseSpace,
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
)
from oxbench.schema import setting, validate


@dataclass(frozen=True)
class EgtSettings:
    """Explore-exploit graph traversal (``--set egt.k=250 --set egt.tau=0.42 --set egt.p=5000``).

    Attributes:
        k: neighbours of each image in the graph (and of the query).
        tau: the exploit threshold: edges heavier than it are followed at once.
        p: images reached per query (the result's traversed head).
        max_images: the largest database whose graph is built.
    """

    k: int = setting(250, S.Int(lo=1, hi=1 << 16), doc="graph neighbours per image")
    tau: float = setting(0.42, S.Float(lo=-1, hi=1), doc="exploit threshold (edge similarity)")
    p: int = setting(5000, S.Int(lo=1, hi=1 << 24), doc="images reached per query")
    max_images: int = setting(
        1 << 20, S.Int(lo=2, hi=1 << 30), doc="largest database whose graph is built"
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class KnnGraph:
    """A weighted graph in CSR form: the neighbours of image ``i`` are
    ``indices[indptr[i]:indptr[i + 1]]``, heaviest first, with weights ``weights[...]``."""

    indptr: NDArray[np.int64]
    indices: NDArray[np.int64]
    weights: NDArray[np.float64]


def knn_graph(db: NDArray[np.floating], k: int) -> KnnGraph:
    """Each image's ``k`` nearest other images (weights: similarities), made symmetric."""
    n = db.shape[0]
    kk = min(k, n - 1)
    if kk < 1:
        return KnnGraph(np.zeros(n + 1, np.int64), np.zeros(0, np.int64), np.zeros(0))
    sims, ids = exact_search(db, db, kk + 1)
    own = ids == np.arange(n)[:, None]
    keep = ~own & (np.cumsum(~own, axis=1) <= kk)
    rows = np.broadcast_to(np.arange(n)[:, None], ids.shape)[keep]
    cols, w = ids[keep], sims[keep].astype(np.float64)
    # symmetric: both directions, the larger weight where both exist
    r = np.concatenate([rows, cols])
    c = np.concatenate([cols, rows])
    ww = np.concatenate([w, w])
    order = np.lexsort((-ww, c, r))
    r, c, ww = r[order], c[order], ww[order]
    first = np.ones(len(r), bool)
    first[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
    r, c, ww = r[first], c[first], ww[first]
    order = np.lexsort((c, -ww, r))  # per image: heaviest first, ties by index
    r, c, ww = r[order], c[order], ww[order]
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, r + 1, 1)
    return KnnGraph(np.cumsum(indptr), c.astype(np.int64), ww)


def traverse(
    graph: KnnGraph, start: NDArray[np.int64], start_w: NDArray[np.float64], p: int, tau: float
) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """The explore-exploit traversal from a query linked to ``start`` (weights ``start_w``):
    the images reached, in order (at most ``p``), and the weight of the edge that reached each."""
    n = len(graph.indptr) - 1
    best = np.full(n, -np.inf)
    reached = np.zeros(n, bool)
    heap: list[tuple[float, int, int]] = []
    seq = 0
    out: list[int] = []
    out_w: list[float] = []
    cand, weights = np.asarray(start, np.int64), np.asarray(start_w, np.float64)
    while True:
        # push the edges (in order) that are heavier than every earlier edge to their image
        ok = ~reached[cand]
        cand, weights = cand[ok], weights[ok]
        if len(cand):
            pos = np.arange(len(cand))
            order = np.lexsort((pos, cand))
            cs, ws = cand[order], weights[order]
            start_of = np.ones(len(cs), bool)
            start_of[1:] = cs[1:] != cs[:-1]
            group = np.cumsum(start_of) - 1
            lift = 2.0 * float(np.abs(ws).max()) + 1.0  # a group's weights never reach the next's
            running = np.maximum.accumulate(ws + lift * group) - lift * group
            before = np.empty_like(running)
            before[1:] = running[:-1]
            before[start_of] = -np.inf
            pushed_sorted = ws > np.maximum(best[cs], before)
            pushed = np.zeros(len(cand), bool)
            pushed[order] = pushed_sorted
            np.maximum.at(best, cs, ws)
            for node, w in zip(cand[pushed].tolist(), weights[pushed].tolist(), strict=True):
                heapq.heappush(heap, (-w, seq, node))
                seq += 1
        if not heap:
            break
        new: list[int] = []
        while True:
            negw, _, v = heapq.heappop(heap)
            if not reached[v]:
                reached[v] = True
                out.append(v)
                out_w.append(-negw)
                new.append(v)
            if len(out) >= p or not (heap or new):
                break
            if not heap or -heap[0][0] <= tau:
                break
        if len(out) >= p or not (heap or new):
            break
        spans = [graph.indices[graph.indptr[v] : graph.indptr[v + 1]] for v in new]
        wspans = [graph.weights[graph.indptr[v] : graph.indptr[v + 1]] for v in new]
        cand = np.concatenate(spans) if spans else np.zeros(0, np.int64)
        weights = np.concatenate(wspans) if wspans else np.zeros(0)
    return np.asarray(out, np.int64), np.asarray(out_w, np.float64)


def egt_rerank(
    queries: NDArray[np.floating],
    database: NDArray[np.floating],
    ranks: NDArray[np.int64],
    settings: EgtSettings,
    *,
    graph: KnnGraph | None = None,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """Each query's traversal order first, then the rest of its ranking.

    Args:
        queries: ``[n_queries, d]``.
        database: ``[n_db, d]``.
        ranks: ``int64 [n_queries, L]`` the ranking so far (its first ``k`` link the query).
        settings: k, tau, p.
        graph: the database graph (built here when ``None``).

    Returns:
        ``(ranks, scores)`` of the shape of ``ranks``.
    """
    db = np.asarray(database, np.float32)
    check_size(db.shape[0], settings)
    g = graph if graph is not None else knn_graph(db, settings.k)
    q = np.asarray(queries, np.float64)
    out = np.empty_like(ranks)
    scores = np.empty(ranks.shape, np.float32)
    width = ranks.shape[1]
    for i in range(ranks.shape[0]):
        start = ranks[i, : settings.k]
        start_w = db[start].astype(np.float64) @ q[i]
        order, w = traverse(g, start, start_w, min(settings.p, width), settings.tau)
        rest = ranks[i][~np.isin(ranks[i], order)]
        head = order[np.isin(order, ranks[i])]  # a truncated ranking keeps its images only
        w = w[np.isin(order, ranks[i])]
        out[i] = np.concatenate([head, rest])[:width]
        running = np.minimum.accumulate(w) if len(w) else w
        floor = float(running[-1]) if len(running) else 0.0
        scores[i, : len(head)] = running
        scores[i, len(head) :] = floor
    return out, scores


def check_size(n: int, settings: EgtSettings) -> None:
    """Refuse a database larger than ``settings.max_images``, in one line."""
    if n > settings.max_images:
        raise InputError(
            f"egt: a graph of {n:,} database images is larger than egt.max_images="
            f"{settings.max_images:,} (time O(n^2 d), memory O(n k)); raise egt.max_images"
        )


class EgtReranker(Reranker):
    """Explore-exploit traversal of the database's k-NN graph from each query."""

    about = (
        "explore-exploit graph traversal of the database's k-NN graph from each query "
        "(Chang et al. 2019)"
    )
    needs = frozenset({"dense"})
    settings_type: ClassVar[type] = EgtSettings

    def __init__(self, settings: EgtSettings) -> None:
        self.settings = settings
        self.graph: KnnGraph | None = None

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        db = cast(DenseSpace, space).dense_database
        check_size(db.shape[0], self.settings)
        with ctx.timed("egt_graph"):
            self.graph = knn_graph(db, self.settings.k)
        edges = len(self.graph.indices)
        return {"egt": {"graph_edges": int(edges), "k": self.settings.k}}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        dense = cast(DenseSpace, space)
        with ctx.timed("egt"):
            ranks, scores = egt_rerank(
                dense.dense_queries(ranking),
                dense.dense_database,
                ranking.ranks,
                self.settings,
                graph=self.graph,
            )
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


register_reranker("egt", EgtReranker)
