"""Average query expansion from spatially verified images, verified in turn (Chum et al. 2007).

After :mod:`.spatial`, each query with verified images of at least ``min_inliers`` inliers is
replaced by the average of its vector and theirs (at most ``max_verified``) and the index is
ranked again. The expanded query's new results -- the images of its top ``verify_top`` that the
first short list did not hold -- are verified against the query, and those that pass join the
verified images (ordered by inliers) above the expanded query's order. Settings: the ``vqe`` group
(:class:`VerifiedQeSettings`; ``verify_top=0``: no second verification).

``dqe-verified`` is the same stage with discriminative query expansion (Arandjelovic & Zisserman
2012): the expanded query is a linear SVM's weight vector, trained with the query and its verified
images as positives and the bottom ``negatives`` of the ranking as negatives (``c``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    Ranking,
    Reranker,
    RerankSpace,
    aligned_to_index,
    register_reranker,
)
from oxbench.pipelines.steps.verify import VerifiedList, joined, verified_first
from oxbench.refinement.qe import average_query_expansion, discriminative_query_expansion
from oxbench.schema import setting, validate


@dataclass(frozen=True)
class VerifiedSeeds:
    """Which verified images a stage starts from (query expansion, diffusion).

    Attributes:
        max_verified: at most this many verified images.
        min_inliers: only verified images with at least this many inliers (a stricter test than
            the verification's ``min_inliers``, as in Chum et al. 2007: averaging in a false
            positive drifts the query, while ranking it high costs one place).
    """

    max_verified: int = setting(
        50, S.Int(lo=1, hi=1 << 30), doc="QE: at most this many verified images"
    )
    min_inliers: int = setting(
        8, S.Int(lo=1, hi=1 << 30), doc="QE: inliers an image needs to expand"
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class VerifiedQeSettings(VerifiedSeeds):
    """Query expansion from spatially verified images (``--set aqe-verified.min_inliers=10``).

    Attributes:
        verify_top: the images of the expanded query's top ``verify_top`` that the first short list
            did not hold are verified too (as the spatial stage before verified), and join the
            verified images (0: none).
    """

    verify_top: int = setting(
        100, S.Int(lo=0, hi=1 << 24), doc="QE: new results verified (0: none)"
    )


@dataclass(frozen=True)
class DqeSettings(VerifiedQeSettings):
    """Discriminative query expansion from verified images (``--set dqe-verified.c=10``): the
    verified-QE settings and the SVM's.

    Attributes:
        negatives: this many images from the bottom of the first ranking (200 in the paper).
        c: the linear SVM's ``C``.
    """

    negatives: int = setting(
        200, S.Int(lo=1, hi=1 << 24), doc="DQE: negatives from the bottom of the ranking"
    )
    c: float = setting(1.0, S.Float(lo=0, lo_open=True, hi=1e6), doc="DQE: the linear SVM's C")


class VerifiedQueryExpansion(Reranker):
    """AQE from verified images, with verification of the expanded query's new results."""

    about = "average query expansion from spatially verified images, their new results verified in turn (Chum et al. 2007)"

    needs = frozenset({"vectors", "local"})
    settings_type: ClassVar[type] = VerifiedQeSettings
    after = "spatial"

    def __init__(self, settings: VerifiedQeSettings) -> None:
        self.max_verified = settings.max_verified
        self.min_inliers = settings.min_inliers
        self.verify_top = settings.verify_top

    def expand(
        self, ranking: Ranking, qi: int, positives: NDArray[np.int64], space: RerankSpace
    ) -> Any:
        """The expanded query ``qi`` from its verified ``positives`` (``None``: leave it as it is)."""
        return average_query_expansion(ranking.queries[qi], space.database[positives])

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        if ranking.verified is None:
            raise InputError(
                f"{self.name} expands from verified images: put the spatial stage before it"
            )
        if self.verify_top and ranking.verification is None:
            raise InputError(
                f"{self.name} verifies new results as the stage before it did, which did not say "
                "how (Ranking.verification)"
            )
        n_index = ranking.ranks.shape[1]
        first = ranking.verified
        expanded: dict[int, tuple[NDArray[np.float32], NDArray[np.int64]]] = {}
        with ctx.timed("query_expansion"):
            for qi, res in enumerate(first):
                use = res.verified[res.inliers >= self.min_inliers][: self.max_verified]
                q_new = self.expand(ranking, qi, use, space) if len(use) else None
                if q_new is not None:
                    scores, order = space.rank(q_new)
                    expanded[qi] = aligned_to_index(order, scores, n_index)[0], order[0]
        rows: dict[int, NDArray[np.int64]] = {}
        second: dict[int, VerifiedList] = {}
        if expanded and self.verify_top:
            for qi, (_, order) in expanded.items():
                new = order[: self.verify_top]
                new = new[~np.isin(new, first[qi].head)]
                if len(new):
                    rows[qi] = new
            done = space.verify(
                ranking.ranks, 0, ctx, ranking.verification, rows=rows, stage="spatial_after_qe"
            )
            second = dict(zip(rows, done, strict=True))
        final, scores = ranking.ranks.copy(), ranking.scores.copy()
        matches = {qi: dict(m) for qi, m in (ranking.matches or {}).items()}
        n_verified = [len(res.verified) for res in first]
        for qi, (row_scores, order) in expanded.items():
            verified, inliers, found = joined(first[qi], second.get(qi))
            final[qi], scores[qi] = verified_first(order, row_scores, verified, inliers)
            n_verified[qi] = len(verified)
            if found:
                matches[qi] = found
        info = {**ranking.info, "verified_per_query": n_verified}
        if self.verify_top:
            info["pairs_verified_after_qe"] = [len(v) for v in rows.values()]
            info["queries_expanded"] = len(expanded)
        return Ranking(
            final, scores, ranking.queries, ranking.verified, info, matches, ranking.verification
        )


class DiscriminativeVerifiedQueryExpansion(VerifiedQueryExpansion):
    """DQE (Arandjelovic & Zisserman 2012): the new query is the weight vector of a linear SVM.

    Positives: the query and its verified images (those :class:`VerifiedQueryExpansion` would
    average); negatives: the ``negatives`` images at the bottom of the ranking (below the verified
    short list), as in the paper (:func:`oxbench.refinement.qe.discriminative_query_expansion`, L2-SVM
    with classes balanced, ``C = c``). A query whose ranking has no image below its short list
    keeps its first ranking. The expanded query's new results are verified as with AQE.
    """

    about = "discriminative query expansion: a linear SVM's weight vector from verified images (Arandjelovic & Zisserman 2012)"

    settings_type = DqeSettings

    def __init__(self, settings: DqeSettings) -> None:
        super().__init__(settings)
        self.negatives, self.c = settings.negatives, settings.c

    def expand(
        self, ranking: Ranking, qi: int, positives: NDArray[np.int64], space: RerankSpace
    ) -> Any:
        assert ranking.verified is not None
        row = ranking.ranks[qi]
        below = row[~np.isin(row, ranking.verified[qi].head)]
        negatives = below[-self.negatives :]
        if len(negatives) == 0:
            return None
        return discriminative_query_expansion(
            ranking.queries[qi], space.database[positives], space.database[negatives], c=self.c
        )


register_reranker("aqe-verified", VerifiedQueryExpansion)
register_reranker("dqe-verified", DiscriminativeVerifiedQueryExpansion)
