"""Diffusion over the database's k-NN graph (Iscen et al., CVPR 2017) as a re-ranking stage.

``prepare`` builds the graph at index time; ``rerank`` diffuses each query from its (expanded)
vector over the top of its ranking (:class:`oxbench.rerank.diffusion.Diffusion`). Settings: the
config's ``diffusion_*``.
"""

from __future__ import annotations

from typing import Any

from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import Ranking, Reranker, RerankSpace, register_reranker
from oxbench.rerank.diffusion import Diffusion, DiffusionSettings


def diffusion_settings(config: Any) -> DiffusionSettings:
    """The diffusion a config's ``diffusion_*`` settings describe."""
    return DiffusionSettings(
        k=config.diffusion_k,
        query_k=config.diffusion_query_k,
        alpha=config.diffusion_alpha,
        gamma=config.diffusion_gamma,
        truncation=config.diffusion_truncation,
        iterations=config.diffusion_iterations,
        normalise=config.diffusion_normalise,
        mode=config.diffusion_mode,
    )


class DiffusionReranker(Reranker):
    """Diffusion re-ranking of the top ``truncation`` of each ranking."""

    needs = frozenset({"vectors"})

    def __init__(self, settings: DiffusionSettings) -> None:
        self.diffusion = Diffusion(settings)

    @classmethod
    def from_config(cls, config: Any) -> DiffusionReranker:
        return cls(diffusion_settings(config))

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        with ctx.timed("diffusion_graph"):
            self.diffusion.fit(space.database)
        return {"diffusion": self.diffusion.describe()}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        with ctx.timed("diffusion"):
            ranks, scores = self.diffusion.rerank(ranking.queries, ranking.ranks)
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


register_reranker("diffusion", DiffusionReranker)
