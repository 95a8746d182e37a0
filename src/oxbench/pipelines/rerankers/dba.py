"""Database-side augmentation (Arandjelovic & Zisserman 2012) as index-time stages.

Each database vector is replaced by a combination of itself and its neighbours before the queries
are answered, so that a query meets every database image already "expanded":

- ``dba`` -- the alpha-weighted mean of the image and its top ``dba.k`` neighbours by the space's
  own vectors (exact search, the image itself left out; weights ``similarity ** dba.alpha``,
  0: the plain average), L2-normalised (as Radenovic et al. 2018 apply it to global descriptors);
- ``dba-verified`` -- the normalised sum of the image and its *spatially verified* neighbours
  among its top ``dba-verified.top_r`` (the paper's bag-of-words form: each database image is
  searched for among the others and its short list verified against it, with the settings of the
  spatial stage under the instance's own name; it costs ``dba-verified.top_r`` verifications per
  index image at index time).

Both act in :meth:`~oxbench.pipelines.rerankers.Reranker.prepare` through the space's
``augment`` capability (:meth:`use_database`), before the family builds its search index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.index.search import exact_search
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.rerankers import (
    AugmentableSpace,
    Ranking,
    Reranker,
    RerankSpace,
    register_reranker,
)
from oxbench.pipelines.rerankers.spatial import SpatialSettings
from oxbench.refinement.qe import database_side_augmentation
from oxbench.schema import setting, validate


@dataclass(frozen=True)
class DbaSettings:
    """Alpha-DBA over the space's vectors (``--set dba.k=10``).

    Attributes:
        k: neighbours each database vector is averaged with.
        alpha: weights ``similarity ** alpha`` (0: the plain average).
    """

    k: int = setting(5, S.Int(lo=1, hi=1 << 16), doc="DBA: neighbours")
    alpha: float = setting(3.0, S.Float(lo=0, hi=100), doc="DBA: weight exponent")

    def __post_init__(self) -> None:
        validate(self)


def augment_database(db: NDArray[np.float32], k: int, *, alpha: float) -> NDArray[np.float32]:
    """Alpha-DBA: every vector the weighted mean of itself and its top ``k`` others, L2-normalised."""
    if k < 1 or db.shape[0] < 2:
        return db
    kk = min(k, db.shape[0] - 1)
    _, ids = exact_search(db, db, kk + 1)
    own = ids == np.arange(db.shape[0])[:, None]
    keep = ~own & (np.cumsum(~own, axis=1) <= kk)
    neighbours = ids[keep].reshape(db.shape[0], kk)
    out = database_side_augmentation(db, neighbours, weights="alpha", alpha=alpha)
    return np.asarray(out, dtype=np.float32)


class DatabaseAugmentation(Reranker):
    """``dba``: each database vector the alpha-weighted mean of itself and its top ``k``."""

    about = "database-side augmentation: each database vector the alpha-weighted mean of itself and its top k (Arandjelovic & Zisserman 2012)"

    needs = frozenset({"vectors", "dense-index", "augment"})
    settings_type = DbaSettings
    phase = "index"

    def __init__(self, settings: DbaSettings) -> None:
        self.k, self.alpha = settings.k, settings.alpha

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        space = cast(AugmentableSpace, space)
        with ctx.timed("dba"):
            space.use_database(augment_database(space.database, self.k, alpha=self.alpha))
        return {"dba": {"k": self.k, "alpha": self.alpha}}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        return ranking


class VerifiedDatabaseAugmentation(Reranker):
    """``dba-verified``: each database vector summed with its spatially verified neighbours (its
    own verification settings: ``dba-verified.top_r`` neighbours of each image verified)."""

    about = "database-side augmentation from spatially verified neighbours, at index time (Arandjelovic & Zisserman 2012)"

    needs = frozenset({"vectors", "local", "augment"})
    settings_type = SpatialSettings
    phase = "index"

    def __init__(self, settings: SpatialSettings) -> None:
        self.top_r = settings.top_r
        self.verification = settings.verification()

    @property
    def query_words(self) -> int:
        """Several words per feature when matching shares words through ``query_ma``."""
        v = self.verification
        return v.query_ma if v.matching == "words" else 1

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        space = cast(AugmentableSpace, space)
        neighbours = space.verified_neighbours(self.top_r, ctx, self.verification)
        with ctx.timed("dba"):
            space.use_database(database_side_augmentation(space.database, neighbours))
        verified = (neighbours >= 0).sum(axis=1)
        return {"dba": {"verified_per_image": float(verified.mean()) if len(verified) else 0.0}}

    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        return ranking


register_reranker("dba", DatabaseAugmentation)
register_reranker("dba-verified", VerifiedDatabaseAugmentation)
