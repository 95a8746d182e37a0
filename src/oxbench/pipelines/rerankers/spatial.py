"""Spatial verification of the short list as a re-ranking stage (Philbin et al. 2007).

Each query's top ``top_r`` is verified against its stored local features (the family's
verification step, :mod:`oxbench.pipelines.steps.verify`, through the run's executor): verified
images move to the top, by inlier count, and carry it as their score; the rest keep their order.
The verification of every query is kept in the ranking for the stages after it (query expansion
from verified images).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    Ranking,
    Reranker,
    RerankSpace,
    aligned_to_index,
    register_reranker,
)
from oxbench.pipelines.steps.verify import verified_first
from oxbench.refinement.spatial import Verification
from oxbench.schema import setting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpatialSettings(Verification):
    """How the ``spatial`` stage verifies (``--set spatial.top_r=200``): the short list's length
    and the verification's settings (:class:`~oxbench.refinement.spatial.Verification`, declared
    there once; ``dba-verified`` verifies with the same settings of its own).

    Attributes:
        top_r: the short list: each query's top ``top_r`` is verified.
    """

    top_r: int = setting(100, S.Int(lo=1, hi=1 << 24), doc="short-list length R")

    def verification(self) -> Verification:
        """How a pair is verified (the settings without the short list's length)."""
        return Verification(**{f.name: getattr(self, f.name) for f in fields(Verification)})


class SpatialVerification(Reranker):
    """Verify each query's top ``top_r``; verified images first, by inliers."""

    about = "spatial verification of each query's top top_r, verified images first by inliers (Philbin et al. 2007)"

    needs = frozenset({"local"})
    settings_type = SpatialSettings

    def __init__(self, settings: SpatialSettings) -> None:
        self.top_r = settings.top_r
        self.verification = settings.verification()

    @property
    def query_words(self) -> int:
        """Several words per query feature when matching shares words through ``query_ma``."""
        v = self.verification
        return v.query_ma if v.matching == "words" else 1

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        ranks = ranking.ranks
        r = min(self.top_r, ranks.shape[1])
        if self.top_r > ranks.shape[1]:
            log.warning(
                "short list of %d is longer than the index (%d images): verifying all of them",
                self.top_r,
                ranks.shape[1],
            )
        results = space.verify(ranks, r, ctx, self.verification)
        by_index = aligned_to_index(ranks, ranking.scores, ranks.shape[1])
        final, scores = np.empty_like(ranks), np.empty_like(ranking.scores)
        matches: dict[int, dict[int, NDArray[np.float32]]] = {}
        for qi, res in enumerate(results):
            final[qi], scores[qi] = verified_first(
                ranks[qi], by_index[qi], res.verified, res.inliers
            )
            if res.matches:
                matches[qi] = {v: res.matches[v] for v in res.verified.tolist() if v in res.matches}
        info = {**ranking.info, "verified_per_query": [len(res.verified) for res in results]}
        return Ranking(
            final, scores, ranking.queries, tuple(results), info, matches, self.verification
        )


register_reranker("spatial", SpatialVerification)
