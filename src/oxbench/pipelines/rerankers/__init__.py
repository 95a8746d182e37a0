"""Re-ranking as a stage: what every family's search ends with, one module per re-ranker.

A family ranks its index, then hands the :class:`Ranking` to each :class:`Reranker` its config
names, in order; each stage returns a new ranking. A stage reaches the family's index only through
the :class:`RerankSpace` the family offers: dense or sparse database vectors and a way to rank again
for new query vectors (query expansion, diffusion), or the verification of short lists against
stored local features (spatial verification). A stage that needs what a family does not offer is
refused in one line when the method is built.

Stages, by the name a config gives them (:data:`RERANKERS`; the modules of this package are
imported on first lookup, then the ``oxbench.rerankers`` entry points of installed plugins; a
module elsewhere may call :func:`register_reranker`):

- ``aqe``, ``alpha-qe`` -- query expansion over the top ``qe_k`` (:mod:`.qe`);
- ``diffusion`` -- Iscen et al.'s diffusion over the database graph (:mod:`.diffusion`);
- ``spatial`` -- spatial verification of the top ``spatial_top_r`` (:mod:`.spatial`);
- ``aqe-verified`` -- average query expansion from spatially verified images, whose new results
  are verified in turn (Chum et al. 2007; :mod:`.verified_qe`);
- ``dqe-verified`` -- the same with discriminative query expansion, a linear SVM's weight vector
  (Arandjelovic & Zisserman 2012; :mod:`.verified_qe`).

A new re-ranker is one module: a :class:`Reranker` subclass (its ``needs``, and ``from_config``
reading the settings it knows from a method config) and ``register_reranker(name, cls)``.
"""

from __future__ import annotations

import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.pipelines.method import RunContext, SearchResult
from oxbench.pipelines.steps.verify import VerifiedList
from oxbench.registry import GROUPS, Registry


@dataclass(frozen=True)
class Ranking:
    """A ranking between stages.

    Attributes:
        ranks: ``int64 [n_queries, k]`` index positions, best first.
        scores: ``float32 [n_queries, k]`` aligned with ``ranks`` (higher is better; a spatially
            verified image carries its inlier count).
        queries: the query representation the ranking was made from (dense ``[n_queries, d]``
            vectors or sparse rows), or ``None``; a stage that expands the queries replaces it.
        verified: per query, the spatial verification of its short list, once a stage verified it.
        info: facts of the stages (JSON-able), recorded with the result.
        matches: inlier correspondences of verified images ``{query: {index: float32 [m, 4]}}``.
    """

    ranks: NDArray[np.int64]
    scores: NDArray[np.float32]
    queries: Any = None
    verified: tuple[VerifiedList, ...] | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    matches: Mapping[int, Mapping[int, NDArray[np.float32]]] | None = None

    def result(self) -> SearchResult:
        """The ranking as a method's answer."""
        return SearchResult(self.ranks, self.scores, dict(self.info), matches=self.matches)


class RerankSpace(Protocol):
    """What a family's index offers its re-rankers (each stage uses what it needs).

    Attributes:
        capabilities: what the space offers: ``"vectors"`` (``database`` and :meth:`rank`) and/or
            ``"local"`` (:meth:`verify`).
        database: database vectors, one row per index position (dense or sparse), when offered.
    """

    @property
    def capabilities(self) -> frozenset[str]: ...

    @property
    def database(self) -> Any: ...

    def rank(self, queries: Any) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """``(scores, ranks)``, aligned, of query vectors ``queries`` over the whole index."""
        ...

    def verify(
        self,
        ranks: NDArray[np.int64],
        r: int,
        ctx: RunContext,
        *,
        rows: dict[int, NDArray[np.int64]] | None = None,
        stage: str = "spatial",
    ) -> list[VerifiedList]:
        """Spatial verification of each query's top ``r`` (or of the lists in ``rows``)."""
        ...


class Reranker(ABC):
    """One re-ranking stage.

    Attributes:
        needs: the capabilities of :class:`RerankSpace` the stage uses.
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    @abstractmethod
    def from_config(cls, config: Any) -> Reranker:
        """The stage with the settings it reads from a method config."""

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        """Index-time work (a graph over the database); returns facts to record. Default: none."""
        return {}

    @abstractmethod
    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        """The ranking after this stage."""


#: Re-rankers by name (each class builds itself from a method config: :meth:`Reranker.from_config`).
RERANKERS: Registry[type[Reranker]] = Registry(
    "re-ranker", loader=lambda: _load_modules(), group=GROUPS["rerankers"]
)


def _load_modules() -> None:
    package = importlib.import_module(__name__)
    for info in pkgutil.iter_modules(package.__path__, __name__ + "."):
        importlib.import_module(info.name)


def register_reranker(name: str, reranker: type[Reranker]) -> None:
    """Register a re-ranker class under ``name`` (its module calls this once).

    Raises:
        InputError: the name is taken (the line names both modules).
    """
    RERANKERS.register(name, reranker)


def build_stages(
    config: Any, names: Sequence[str], offered: frozenset[str], *, setting: str = ""
) -> list[Reranker]:
    """The stages ``names`` built from ``config``; one line when the family cannot serve one.

    Args:
        config: the method config the stages read their settings from.
        names: re-ranker names, in order.
        offered: what the family's :class:`RerankSpace` offers.
        setting: the config setting the names come from, for the message.

    Raises:
        InputError: an unknown re-ranker, or one that needs what the family does not offer.
    """
    where = f"method {config.name}: " + (f"setting {setting}: " if setting else "")
    stages = []
    for name in names:
        if name not in RERANKERS:
            usable = [n for n in RERANKERS.names() if RERANKERS.get(n).needs <= offered]
            raise InputError(
                f"{where}unknown re-ranker {name!r}; this family runs: {', '.join(sorted(usable))}"
            )
        cls = RERANKERS.get(name)
        missing = cls.needs - offered
        if missing:
            family = getattr(config, "family", "")
            raise InputError(
                f"{where}re-ranker {name!r} needs {', '.join(sorted(missing))} features, which the "
                f"{family} family does not offer"
            )
        stages.append(cls.from_config(config))
    return stages


def prepare_stages(
    stages: Sequence[Reranker], space: RerankSpace, ctx: RunContext
) -> dict[str, Any]:
    """Index-time work of every stage; the facts they report."""
    facts: dict[str, Any] = {}
    for stage in stages:
        facts.update(stage.prepare(space, ctx))
    return facts


def run_stages(
    ranking: Ranking, stages: Sequence[Reranker], space: RerankSpace, ctx: RunContext
) -> Ranking:
    """``ranking`` through every stage in order."""
    for stage in stages:
        ranking = stage.rerank(ranking, space, ctx)
    return ranking


def aligned_to_index(
    ranks: NDArray[np.int64], scores: NDArray[np.float32], n_index: int
) -> NDArray[np.float32]:
    """Scores by index position ``[n_queries, n_index]`` from a complete aligned ranking."""
    out = np.empty((ranks.shape[0], n_index), np.float32)
    np.put_along_axis(out, ranks, scores, axis=1)
    return out
