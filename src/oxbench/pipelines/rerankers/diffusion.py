"""Diffusion over the database's k-NN graph (Iscen et al., CVPR 2017) as a re-ranking stage.

``prepare`` builds the graph at index time over the space's dense vectors (a global method's own,
or the vectors of a named ``global_source``); ``rerank`` diffuses each query from its (expanded)
vector over the top of its ranking (:class:`oxbench.refinement.diffusion.Diffusion`). Settings:
:class:`~oxbench.refinement.diffusion.DiffusionSettings`, declared once there (``diffusion.k``).

``diffusion-verified`` is the 2018 revisit's hybrid (Radenovic et al. 2018, "ASMK* + SP ->
R-GeM + DFS"): after a ``spatial`` stage, the strongly verified images -- those that would expand
the query (``diffusion-verified.min_inliers`` inliers or more, at most
``diffusion-verified.max_verified``, as query expansion from verified images picks them) -- start the diffusion too, with the weight of an image identical
to the query, besides the query's nearest images in the dense space; the graph and the query's
vector are the dense space's (a global source's, when the first ranking is a bag of words or
ASMK). The verified images keep the head of the list, in the verification's order, and diffusion
orders the rest: what the local features proved stays proved, and diffusion brings up what the
short list missed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    DenseSpace,
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
)
from oxbench.pipelines.rerankers.verified_qe import VerifiedSeeds
from oxbench.refinement.diffusion import Diffusion, DiffusionSettings


class DiffusionReranker(Reranker):
    """Diffusion re-ranking of the top ``truncation`` of each ranking."""

    about = "diffusion over the database's mutual k-NN graph, the top truncation re-ranked (Iscen et al. 2017)"

    needs = frozenset({"dense"})
    settings_type: ClassVar[type] = DiffusionSettings

    def __init__(self, settings: DiffusionSettings) -> None:
        self.diffusion = Diffusion(settings)

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        with ctx.timed("diffusion_graph"):
            # a space that searches from disk (search=mapped) builds the graph by its own search
            knn = getattr(space, "knn_neighbours", None)
            neighbours = knn(self.diffusion.settings.k) if knn is not None else None
            self.diffusion.fit(cast(DenseSpace, space).dense_database, neighbours=neighbours)
        return {"diffusion": self.diffusion.describe()}

    def seeds(self, ranking: Ranking) -> Any:
        """Images that start each query's diffusion besides its nearest ones (none here)."""
        return None

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        queries = cast(DenseSpace, space).dense_queries(ranking)
        with ctx.timed("diffusion"):
            ranks, scores = self.diffusion.rerank(queries, ranking.ranks, seeds=self.seeds(ranking))
        return Ranking(ranks, scores, ranking.queries, info=ranking.info)


@dataclass(frozen=True)
class VerifiedDiffusionSettings(DiffusionSettings, VerifiedSeeds):
    """Diffusion seeded by verified images too (``--set diffusion-verified.k=50 --set
    diffusion-verified.min_inliers=8``): diffusion's settings and which verified images seed it."""


class VerifiedDiffusion(DiffusionReranker):
    """Diffusion started from the query's nearest images and from its strongly verified ones; the
    verified images first, in the verification's order, then the rest in the diffusion's."""

    about = "diffusion seeded by the spatially verified images too, after a spatial stage (Radenovic et al. 2018)"

    needs = frozenset({"dense", "local"})
    settings_type = VerifiedDiffusionSettings
    after = "spatial"

    def __init__(self, settings: VerifiedDiffusionSettings) -> None:
        super().__init__(settings)
        self.min_inliers, self.max_verified = settings.min_inliers, settings.max_verified

    def seeds(self, ranking: Ranking) -> Any:
        assert ranking.verified is not None  # a spatial stage came before (checked when built)
        return [
            res.verified[res.inliers >= self.min_inliers][: self.max_verified]
            for res in ranking.verified
        ]

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        out = super().rerank(ranking, space, ctx)
        assert ranking.verified is not None
        ranks, scores = out.ranks.copy(), out.scores.copy()
        for qi, res in enumerate(ranking.verified):
            head = res.verified  # as the spatial stage ordered them (by inliers), at the top
            if not len(head):
                continue
            rest = ~np.isin(out.ranks[qi], head)
            ranks[qi] = np.concatenate([head, out.ranks[qi][rest]])
            top = float(out.scores[qi].max()) if out.scores.shape[1] else 0.0
            scores[qi] = np.concatenate(
                [top + np.asarray(res.inliers, np.float32), out.scores[qi][rest]]
            )
        seeded = [len(s) for s in self.seeds(ranking)]
        info = {**out.info, "diffusion_seeded_by_verified": seeded}
        return Ranking(
            ranks,
            scores,
            out.queries,
            ranking.verified,
            info,
            ranking.matches,
            ranking.verification,
        )


register_reranker("diffusion", DiffusionReranker)
register_reranker("diffusion-verified", VerifiedDiffusion)
