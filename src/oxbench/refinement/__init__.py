"""Ranking refinement: the algorithms the re-ranking stages run, pure functions over arrays.

The stages that run them in a pipeline are :mod:`oxbench.pipelines.rerankers`; here, what they
compute:

- :mod:`oxbench.refinement.spatial`: tentative matches from shared visual words, robust geometric
  verification (OpenCV USAC) and re-ranking of the top R by inlier count (Philbin et al. 2007).
- :mod:`oxbench.refinement.qe`: average / discriminative / alpha query expansion and database-side
  augmentation, on dense or sparse vectors.

OpenCV is imported only when a model is actually fitted, so importing this package is cheap.
"""

from oxbench.refinement.qe import (
    alpha_query_expansion,
    average_query_expansion,
    database_side_augmentation,
    discriminative_query_expansion,
)
from oxbench.refinement.spatial import (
    PairResult,
    SpatialResult,
    rerank_by_inliers,
    spatial_rerank,
    tentative_matches,
    verify_pair,
)

__all__ = [
    "PairResult",
    "SpatialResult",
    "alpha_query_expansion",
    "average_query_expansion",
    "database_side_augmentation",
    "discriminative_query_expansion",
    "rerank_by_inliers",
    "spatial_rerank",
    "tentative_matches",
    "verify_pair",
]
