"""Query expansion over the top of the ranking: AQE (Chum et al. 2007) and alpha-QE (Radenovic et al.).

Each query vector is replaced by the weighted mean of itself and its top ``qe_k`` database
vectors (weights ``similarity ** qe_alpha``; 0: the plain average) and the index is ranked again
(:func:`oxbench.rerank.qe.alpha_query_expansion`). Settings: the config's ``qe_k`` and ``qe_alpha``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import Ranking, Reranker, RerankSpace, register_reranker
from oxbench.rerank.qe import alpha_query_expansion


def expand_queries(
    queries: NDArray[np.float32],
    database: NDArray[np.float32],
    ranks: NDArray[np.int64],
    *,
    k: int,
    alpha: float,
) -> NDArray[np.float32]:
    """Each query replaced by its alpha-weighted mean with its top ``k`` neighbours (alpha 0: AQE)."""
    out = np.empty_like(queries)
    for qi in range(queries.shape[0]):
        top = ranks[qi, :k]
        out[qi] = np.asarray(
            alpha_query_expansion(queries[qi], database[top], alpha=alpha), np.float32
        ).ravel()
    return out


class QueryExpansion(Reranker):
    """Expand each query with its top ``k`` (weights ``similarity ** alpha``) and rank again."""

    needs = frozenset({"vectors"})

    def __init__(self, k: int, alpha: float) -> None:
        self.k, self.alpha = k, alpha

    @classmethod
    def from_config(cls, config: Any) -> QueryExpansion:
        return cls(config.qe_k, config.qe_alpha)

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        with ctx.timed("query_expansion"):
            queries = expand_queries(
                ranking.queries, space.database, ranking.ranks, k=self.k, alpha=self.alpha
            )
            scores, ranks = space.rank(queries)
        return Ranking(ranks, scores, queries, info=ranking.info)


class AverageQueryExpansion(QueryExpansion):
    """AQE: the plain average of the query and its top ``k`` (alpha 0)."""

    @classmethod
    def from_config(cls, config: Any) -> AverageQueryExpansion:
        return cls(config.qe_k, 0.0)


register_reranker("aqe", AverageQueryExpansion)
register_reranker("alpha-qe", QueryExpansion)
