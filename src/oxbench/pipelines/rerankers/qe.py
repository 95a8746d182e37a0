"""Query expansion over the top of the ranking: AQE (Chum et al. 2007) and alpha-QE (Radenovic et al.).

Each query vector is replaced by the weighted mean of itself and its top ``k`` database vectors
(weights ``similarity ** alpha``; ``aqe``: the plain average) and the index is ranked again
(:func:`oxbench.refinement.qe.alpha_query_expansion`). Settings: :class:`QeSettings`
(``alpha-qe.k``, ``alpha-qe.alpha``), :class:`AqeSettings` (``aqe.k``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
)
from oxbench.refinement.qe import alpha_query_expansion
from oxbench.schema import setting, validate


@dataclass(frozen=True)
class AqeSettings:
    """Average query expansion (``--set aqe.k=10``).

    Attributes:
        k: the query's top ``k`` database vectors expand it.
    """

    k: int = setting(5, S.Int(lo=1, hi=1 << 16), doc="query expansion: neighbours")

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class QeSettings(AqeSettings):
    """Alpha query expansion (``--set alpha-qe.k=10 --set alpha-qe.alpha=3``).

    Attributes:
        k: the query's top ``k`` database vectors expand it.
        alpha: the weight exponent (``similarity ** alpha``; 0 is AQE's plain average).
    """

    alpha: float = setting(3.0, S.Float(lo=0, hi=100), doc="alpha-qe: weight exponent")


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

    about = "alpha query expansion: each query the similarity**alpha-weighted mean of itself and its top k, ranked again (Radenovic et al. 2018)"

    needs = frozenset({"vectors", "dense-index"})
    settings_type: ClassVar[type] = QeSettings

    def __init__(self, settings: QeSettings) -> None:
        self.k, self.alpha = settings.k, settings.alpha

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        with ctx.timed("query_expansion"):
            queries = expand_queries(
                ranking.queries, space.database, ranking.ranks, k=self.k, alpha=self.alpha
            )
            scores, ranks = space.rank(queries)
        return Ranking(ranks, scores, queries, info=ranking.info)


class AverageQueryExpansion(QueryExpansion):
    """AQE: the plain average of the query and its top ``k`` (alpha 0)."""

    about = "average query expansion: each query the mean of itself and its top k, ranked again (Chum et al. 2007)"

    settings_type = AqeSettings

    def __init__(self, settings: AqeSettings) -> None:  # type: ignore[override]
        self.k, self.alpha = settings.k, 0.0


register_reranker("aqe", AverageQueryExpansion)
register_reranker("alpha-qe", QueryExpansion)
