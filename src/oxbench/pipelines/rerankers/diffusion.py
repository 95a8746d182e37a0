"""Diffusion over the database's k-NN graph (Iscen et al., CVPR 2017) as a re-ranking stage.

``prepare`` builds the graph at index time; ``rerank`` diffuses each query from its (expanded)
vector over the top of its ranking (:class:`oxbench.rerank.diffusion.Diffusion`). Settings: the
``diffusion`` group (:class:`~oxbench.rerank.diffusion.DiffusionSettings`, declared once there).
"""

from __future__ import annotations

from typing import Any

from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
    register_stage_settings,
)
from oxbench.rerank.diffusion import Diffusion, DiffusionSettings


class DiffusionReranker(Reranker):
    """Diffusion re-ranking of the top ``truncation`` of each ranking."""

    needs = frozenset({"vectors", "dense"})
    uses = ("diffusion",)

    def __init__(self, settings: DiffusionSettings) -> None:
        self.diffusion = Diffusion(settings)

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        with ctx.timed("diffusion_graph"):
            self.diffusion.fit(space.database)
        return {"diffusion": self.diffusion.describe()}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        with ctx.timed("diffusion"):
            ranks, scores = self.diffusion.rerank(ranking.queries, ranking.ranks)
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


register_stage_settings("diffusion", DiffusionSettings)
register_reranker("diffusion", DiffusionReranker)
