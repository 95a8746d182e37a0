"""SuperGlobal's re-ranking (Shao, Chen, Karpur, Cui, Araujo, Cao, ICCV 2023) as a stage: ``superglobal``.

"Global Features are All You Need for Image Retrieval and Reranking", Sec. 3.3: the query and its
top ``M`` database images are refined with global descriptors only, in two steps (the authors'
``MDescAug`` and ``RerankwMDA``).

For one query ``q`` with top ``M`` images ``x_1 .. x_M`` of its ranking (``s(a, b) = a . b``):

1. **MDescAug** (top-M descriptor augmentation): each ``x_i`` is replaced by the weighted mean of
   itself and its ``K`` nearest images *among the M*, ``N_K(i)``::

       x'_i = (x_i + sum_{j in N_K(i)} beta s(x_i, x_j) x_j) / (1 + sum_{j in N_K(i)} beta s(x_i, x_j))

   (not re-normalised), and the ``M`` images are ordered by ``s1_i = s(q, x'_i)``.
2. **RerankwMDA** (re-ranking with maximum descriptor aggregation): the refined query is the
   element-wise maximum of the refined descriptors of the first ``K + 1`` images of that order,
   ``q' = max_{i <= K+1} x'_(i)``, and the ``M`` images are ordered by
   ``(s1_i + s(q', x'_i)) / 2``.

The ``M`` images come first in that order (ties: the MDescAug order), the rest of the ranking
follows unchanged; the scores of the head are ``(s1 + s2) / 2``, those below it at most the head's
lowest. Defaults M / K / beta = 400 / 9 / 0.15, the authors'. The weights of step 1 hold ``beta``
times the similarity and the query of step 2 is pooled over ``K + 1`` images, as the authors' code
computes them (``self.K = K + 1  # including oneself``).

Cost per query: ``O(M^2 d)`` time and ``O(M^2 + M d)`` memory (the similarities among the M);
``superglobal.M`` is bounded so that the ``M x M`` matrix stays under 1 GiB.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
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
class SuperGlobalSettings:
    """SuperGlobal re-ranking (``--set superglobal.M=400 --set superglobal.K=9``).

    Attributes:
        M: images of each ranking refined and re-ranked.
        K: neighbours of each image among the ``M`` (MDescAug), and the query's ``K + 1`` pooled
            images (RerankwMDA).
        beta: weight of a neighbour, times its similarity (MDescAug).
    """

    M: int = setting(400, S.Int(lo=1, hi=1 << 14), doc="images refined and re-ranked per query")
    K: int = setting(9, S.Int(lo=1, hi=1 << 14), doc="neighbours among the M")
    beta: float = setting(0.15, S.Float(lo=0, hi=1e6), doc="neighbour weight (times similarity)")

    def __post_init__(self) -> None:
        validate(self)


def mdesc_aug(top: NDArray[np.floating], k: int, beta: float) -> NDArray[np.float64]:
    """MDescAug: each row of ``top`` (``[M, d]``) the weighted mean of itself and its ``k``
    nearest other rows (weights 1 and ``beta * similarity``)."""
    x = np.asarray(top, np.float64)
    m = x.shape[0]
    kk = min(k, m - 1)
    sims = x @ x.T
    others = sims.copy()
    np.fill_diagonal(others, -np.inf)
    nn = np.argsort(-others, axis=1, kind="stable")[:, :kk]
    w = beta * np.take_along_axis(sims, nn, axis=1)  # [M, kk]
    num = x + np.einsum("mk,mkd->md", w, x[nn])
    return num / (1.0 + w.sum(axis=1))[:, None]


def superglobal_rerank(
    queries: NDArray[np.floating],
    database: NDArray[np.floating],
    ranks: NDArray[np.int64],
    settings: SuperGlobalSettings,
) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
    """MDescAug then RerankwMDA on the top ``M`` of each query's ranking.

    Args:
        queries: ``[n_queries, d]``.
        database: ``[n_db, d]``.
        ranks: ``int64 [n_queries, L]`` the ranking so far.
        settings: M, K, beta.

    Returns:
        ``(ranks, scores)`` of the shape of ``ranks``.
    """
    q = np.asarray(queries, np.float64)
    m = min(settings.M, ranks.shape[1])
    out = ranks.copy()
    scores = np.empty(ranks.shape, np.float32)
    for i in range(q.shape[0]):
        head = ranks[i, :m]
        refined = mdesc_aug(database[head], settings.K, settings.beta)
        s1 = refined @ q[i]
        first = np.argsort(-s1, kind="stable")
        refined, s1, head = refined[first], s1[first], head[first]
        pooled = refined[: settings.K + 1].max(axis=0)
        final = (s1 + refined @ pooled) / 2.0
        second = np.argsort(-final, kind="stable")
        out[i, :m] = head[second]
        scores[i, :m] = final[second].astype(np.float32)
        if ranks.shape[1] > m:
            scores[i, m:] = scores[i, :m].min() if m else 0.0
    return out, scores


class SuperGlobalReranker(Reranker):
    """SuperGlobal's MDescAug and RerankwMDA over each query's top ``M``."""

    about = "SuperGlobal: MDescAug then RerankwMDA over each query's top M (Shao et al. 2023)"

    needs = frozenset({"dense"})
    settings_type: ClassVar[type] = SuperGlobalSettings

    def __init__(self, settings: SuperGlobalSettings) -> None:
        self.settings = settings

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        dense = cast(DenseSpace, space)
        with ctx.timed("superglobal"):
            ranks, scores = superglobal_rerank(
                dense.dense_queries(ranking), dense.dense_database, ranking.ranks, self.settings
            )
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


register_reranker("superglobal", SuperGlobalReranker)
