"""Spatial verification of the short list as a re-ranking stage (Philbin et al. 2007).

Each query's top ``spatial.top_r`` is verified against its stored local features (the family's
verification step, :mod:`oxbench.pipelines.steps.verify`, through the run's executor): verified
images move to the top, by inlier count, and carry it as their score; the rest keep their order.
The verification of every query is kept in the ranking for the stages after it (query expansion
from verified images).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

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
    register_stage_settings,
)
from oxbench.pipelines.steps.verify import VerifySettings, verified_first
from oxbench.schema import setting, validate

log = logging.getLogger(__name__)


#: The verification defaults (:mod:`oxbench.refinement.spatial`'s, through :class:`VerifySettings`).
_VERIFY = VerifySettings()


@dataclass(frozen=True)
class SpatialSettings:
    """How short lists are spatially verified (group ``spatial``: ``--set spatial.top_r=200``).

    Read by every stage that verifies: ``spatial``, the query expansions from verified images
    (through the family's verification) and ``dba-verified``.

    Attributes:
        top_r: the short list: each query's top ``top_r`` is verified.
        matching: tentative correspondences of a short-listed pair: ``descriptors`` (mutual
            nearest neighbours with Lowe's ``ratio``, :func:`oxbench.refinement.spatial.descriptor_matches`)
            or ``words`` (shared visual words, at most ``max_per_word`` pairs per word, each query
            feature through its ``query_ma`` nearest words).
        model, method, min_inliers, threshold_px: the verification
            (:func:`oxbench.refinement.spatial.spatial_rerank`, whose defaults they are); ``fsm`` is
            Philbin et al.'s fast spatial matching from single correspondences with scale and
            orientation.
    """

    top_r: int = setting(100, S.Int(lo=1, hi=1 << 24), doc="short-list length R")
    matching: Literal["words", "descriptors"] = setting(
        "descriptors",
        S.Choice("words", "descriptors"),
        doc="tentative matches from descriptors or shared words",
    )
    ratio: float = setting(_VERIFY.ratio, S.Float(lo=0, lo_open=True, hi=1), doc="Lowe's ratio")
    max_per_word: int = setting(
        _VERIFY.max_per_word, S.Int(lo=1, hi=1 << 16), doc="words matching: pairs per shared word"
    )
    query_ma: int = setting(
        _VERIFY.query_ma, S.Int(lo=1, hi=64), doc="words matching: words per query feature"
    )
    model: Literal["affine", "homography", "similarity"] = setting(
        _VERIFY.model, S.Choice("similarity", "affine", "homography"), doc="geometric model"
    )
    method: Literal["magsac", "accurate", "ransac", "fsm"] = setting(
        _VERIFY.method, S.Choice("fsm", "magsac", "accurate", "ransac"), doc="robust estimator"
    )
    min_inliers: int = setting(
        _VERIFY.min_inliers, S.Int(lo=1, hi=1 << 30), doc="inliers to count as verified"
    )
    threshold_px: float = setting(
        _VERIFY.threshold_px,
        S.Float(lo=0, lo_open=True, hi=1e4),
        doc="inlier threshold, px at 1024 px",
    )

    def __post_init__(self) -> None:
        validate(self, label=lambda n: f"spatial.{n}")

    def verification(self) -> VerifySettings:
        """How the short list is verified."""
        return VerifySettings(
            self.model,
            self.method,
            self.min_inliers,
            self.threshold_px,
            self.max_per_word,
            self.matching,
            self.ratio,
            self.query_ma,
        )


class SpatialVerification(Reranker):
    """Verify each query's top ``top_r``; verified images first, by inliers."""

    needs = frozenset({"local"})
    uses = ("spatial",)

    def __init__(self, settings: SpatialSettings) -> None:
        self.top_r = settings.top_r

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        ranks = ranking.ranks
        r = min(self.top_r, ranks.shape[1])
        if self.top_r > ranks.shape[1]:
            log.warning(
                "short list of %d is longer than the index (%d images): verifying all of them",
                self.top_r,
                ranks.shape[1],
            )
        results = space.verify(ranks, r, ctx)
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
        return Ranking(final, scores, ranking.queries, tuple(results), info, matches)


register_stage_settings("spatial", SpatialSettings)
register_reranker("spatial", SpatialVerification)
