"""Re-ranking as a stage: what every family's search ends with, one module per re-ranker.

A pipeline is a family's first ranking plus an ordered list of stages (``rerank``, a
:class:`Pipeline` setting of every family config), each with the settings groups it owns
(``--set rerank=spatial,aqe-verified --set spatial.top_r=200 --set vqe.min_inliers=10``). A family
ranks its index, then hands the :class:`Ranking` to each :class:`Reranker`, in order; each stage
returns a new ranking. A stage reaches the family's index only through
the :class:`RerankSpace` the family offers: dense or sparse database vectors and a way to rank again
for new query vectors (query expansion, diffusion), or the verification of short lists against
stored local features (spatial verification). A stage that needs what a family does not offer is
refused in one line when the method is built.

Stages, by the name a pipeline gives them (:data:`RERANKERS`; the modules of this package are
imported on first lookup, then the ``oxbench.rerankers`` entry points of installed plugins; a module
elsewhere may call :func:`register_reranker`), with the settings groups they read
(:data:`STAGE_SETTINGS`, which plugins extend the same way):

- ``aqe``, ``alpha-qe`` -- query expansion over the top ``qe.k`` (group ``qe``; :mod:`.qe`);
- ``diffusion`` -- Iscen et al.'s diffusion over the database graph (group ``diffusion``;
  :mod:`.diffusion`);
- ``spatial`` -- spatial verification of the top ``spatial.top_r`` (group ``spatial``;
  :mod:`.spatial`);
- ``aqe-verified`` -- average query expansion from spatially verified images, whose new results
  are verified in turn (Chum et al. 2007; group ``vqe``; :mod:`.verified_qe`);
- ``dqe-verified`` -- the same with discriminative query expansion, a linear SVM's weight vector
  (Arandjelovic & Zisserman 2012; groups ``vqe``, ``dqe``; :mod:`.verified_qe`);
- ``dba``, ``dba-verified`` -- database-side augmentation at index time, from the top ``dba.k``
  by vectors or from spatially verified neighbours (groups ``dba``, ``spatial``; :mod:`.dba`).

A new re-ranker is one module: a :class:`Reranker` subclass (its ``needs``, the settings groups it
``uses``, ``__init__`` taking one settings object per group), its settings dataclass registered
with :func:`register_stage_settings`, and ``register_reranker(name, cls)``.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.features.extractors import LOCAL_FEATURES_SPEC
from oxbench.pipelines.method import Ranking, RunContext
from oxbench.registry import GROUPS, Registry
from oxbench.schema import setting

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.pipelines.steps.verify import VerifiedList


class RerankSpace(Protocol):
    """What a family's index offers its re-rankers (each stage uses what it needs).

    Attributes:
        capabilities: what the space offers: ``"vectors"`` (``database`` and :meth:`rank`),
            ``"local"`` (:meth:`verify`), ``"augment"`` (:class:`AugmentableSpace`).
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


class DenseSpace(RerankSpace, Protocol):
    """A space that offers ``"dense"``: dense vectors of every index image and of the queries --
    the family's own (a global method), or a named global source's (bag of words, ASMK)."""

    @property
    def dense_database(self) -> NDArray[np.float32]:
        """``float32 [n_index, d]`` L2-normalised vectors of the index, in index order."""
        ...

    def dense_queries(self, ranking: Ranking) -> NDArray[np.float32]:
        """``float32 [n_queries, d]`` the queries' vectors in the same space (``ranking``: the
        ranking so far, whose ``queries`` a global family's expanded queries are)."""
        ...


class AugmentableSpace(RerankSpace, Protocol):
    """A space that offers ``"augment"``: index-phase stages may replace its database vectors."""

    def use_database(self, database: Any) -> None:
        """Replace the database vectors (index time, before the search index is built)."""
        ...

    def verified_neighbours(self, r: int, ctx: RunContext) -> NDArray[np.int64]:
        """With ``"local"``: ``[n_index, r]`` each index image's spatially verified neighbours
        among its top ``r`` by the database vectors (``-1``: none)."""
        ...


class Reranker(ABC):
    """One re-ranking stage.

    A stage owns its settings: each settings group it reads (:attr:`uses`, e.g. ``("qe",)``) is a
    frozen dataclass registered once with :func:`register_stage_settings` (``qe.k``, ``qe.alpha``
    on the command line); the stage is built from the pipeline's values of those groups
    (:meth:`from_settings`). A group means one thing in every family.

    Attributes:
        name: the name a pipeline gives the stage (``rerank=spatial,aqe-verified``).
        needs: the capabilities of :class:`RerankSpace` the stage uses.
        uses: the settings groups the stage reads, in the order :meth:`from_settings` passes them.
        phase: ``"query"`` (re-ranks each query's ranking) or ``"index"`` (changes the database at
            index time, in :meth:`prepare`, before the search index is built: DBA).
        after: a stage that must come earlier in the pipeline (``aqe-verified`` expands from the
            images a ``spatial`` stage verified), or ``""``.
    """

    name: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    uses: tuple[str, ...] = ()
    phase: ClassVar[str] = "query"
    after: ClassVar[str] = ""

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Reranker:
        """The stage with its groups' settings (``settings[group]`` for each of :attr:`uses`)."""
        return cls(*(settings[group] for group in cls.uses))

    def prepare(self, space: RerankSpace, ctx: RunContext) -> dict[str, Any]:
        """Index-time work (a graph over the database, an augmented database); returns facts to
        record. Default: none."""
        return {}

    @abstractmethod
    def rerank(self, ranking: Ranking, space: RerankSpace, ctx: RunContext) -> Ranking:
        """The ranking after this stage (an index-phase stage returns it unchanged)."""


#: What each capability of a :class:`RerankSpace` is, in messages.
CAPABILITY_WORDS = {
    "vectors": "database vectors",
    "dense": "dense vectors (its own, or a global_source's)",
    "local": "local features (a global method's from its local_source)",
    "dense-index": "a ranking over dense vectors",
    "augment": "a database it may augment",
}

#: Re-rankers by name (each class builds itself from its settings groups: :meth:`Reranker.from_settings`).
RERANKERS: Registry[type[Reranker]] = Registry(
    "re-ranker", loader=lambda: _load_modules(), group=GROUPS["rerankers"]
)

#: Settings groups by name (``qe``, ``spatial``, ``diffusion``, ...): the frozen dataclass of each.
#: A plugin's re-ranker module registers its groups when RERANKERS loads the plugins, so looking a
#: group up loads the re-rankers first.
STAGE_SETTINGS: Registry[type] = Registry(
    "stage settings group", loader=lambda: RERANKERS._ensure_loaded()
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
    if "name" not in vars(reranker) or not reranker.name:
        reranker.name = name
    RERANKERS.register(name, reranker)


def register_stage_settings(group: str, settings: type) -> type:
    """Register the settings dataclass of a stage's settings ``group`` (its module calls this once).

    The dataclass is frozen, every field declared with :func:`oxbench.schema.setting` (type, range
    and one-line doc), and default-constructible.

    Raises:
        InputError: the group is taken, or the class is not such a dataclass.
    """
    if group in STAGE_SETTINGS:
        raise InputError(f"stage settings group {group!r} is registered twice")
    if not dataclasses.is_dataclass(settings) or not isinstance(settings, type):
        raise InputError(f"stage settings group {group!r}: {settings!r} is not a dataclass")
    STAGE_SETTINGS.register(group, settings)
    return settings


def stage_groups(names: Sequence[str]) -> list[str]:
    """The settings groups the stages ``names`` read, in first-use order (unknown names skipped)."""
    out: list[str] = []
    for name in names:
        if name in RERANKERS:
            out += [g for g in RERANKERS.get(name).uses if g not in out]
    return out


class StageSettings(Mapping[str, Any]):
    """The settings of a pipeline's stages, by group: ``{"qe": QeSettings(k=10), ...}``.

    Frozen and hashable; a group not given takes its defaults (:meth:`of`). A method config holds
    one as its ``stage_settings`` and records only the groups its stages read.
    """

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def of(self, group: str) -> Any:
        """The settings of ``group`` (its defaults when not given).

        Raises:
            InputError: no such group is registered.
        """
        if group in self._values:
            return self._values[group]
        return STAGE_SETTINGS.get(group)()

    def replace(self, group: str, settings: Any) -> StageSettings:
        """A copy with ``group`` set to ``settings``."""
        return StageSettings({**self._values, group: settings})

    def to_dict(self, groups: Sequence[str]) -> dict[str, Any]:
        """``{group: {setting: value}}`` of ``groups`` (defaults filled in), JSON-able."""
        out = {}
        for group in groups:
            values = dataclasses.asdict(self.of(group))
            out[group] = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        return out

    def __getitem__(self, group: str) -> Any:
        return self._values[group]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._values))

    def __len__(self) -> int:
        return len(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageSettings) and self._values == other._values

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __repr__(self) -> str:
        return f"StageSettings({self._values!r})"


@dataclass(frozen=True, kw_only=True)
class Pipeline:
    """The stages after a family's first ranking, as a method config holds them (a mixin).

    Attributes:
        rerank: the stages, in order (:data:`RERANKERS` names: ``("spatial", "aqe-verified")``);
            index-phase stages (``dba``) act at index time, in this order among themselves.
        stage_settings: each settings group's values (:class:`StageSettings`; ``--set qe.k=10``).
        local_source, global_source: what a stage needs that the family's first stage does not
            have (:mod:`oxbench.pipelines.sources`): local features by name for a global family
            (``local_source=rootsift``: GeM + SV), a global preset's vectors for bag of words or
            ASMK (``global_source=gem-r50-imagenet``: verified images start diffusion).
    """

    rerank: tuple[str, ...] = setting(
        (), S.Names(max_len=16), doc="stages after the first ranking, in order (none: no stage)"
    )
    stage_settings: StageSettings = field(default_factory=StageSettings)
    local_source: Any = setting(
        None,
        S.Optional(LOCAL_FEATURES_SPEC),
        doc="local features for a family without them (spatial stages of a global method)",
    )
    global_source: str | None = setting(
        None,
        S.Optional(S.Str(min_len=1, max_len=256)),
        doc="a global preset (and KEY=VALUE settings of its own) whose vectors a family "
        "without them diffuses over",
    )

    def stage(self, group: str) -> Any:
        """The settings of stage group ``group`` in this pipeline."""
        return self.stage_settings.of(group)

    @property
    def stage_groups(self) -> list[str]:
        """The settings groups this pipeline's stages read."""
        return stage_groups(self.rerank)

    def offered(self, capabilities: frozenset[str]) -> frozenset[str]:
        """What a family with ``capabilities`` offers its stages once this pipeline's sources join
        it (``local_source``: local features; ``global_source``: dense vectors).

        Raises:
            InputError: a source the family does not need (it has that representation itself).
        """
        out = set(capabilities)
        name, family = getattr(self, "name", "?"), getattr(self, "family", "")
        if self.local_source is not None:
            if "local" in capabilities:
                raise InputError(
                    f"method {name}: local_source gives local features to a family without "
                    f"them; the {family} family verifies with its own"
                )
            out.add("local")
        if self.global_source is not None:
            if "dense" in capabilities:
                raise InputError(
                    f"method {name}: global_source gives dense vectors to a family without "
                    f"them; the {family} family has its own"
                )
            out.add("dense")
        return frozenset(out)

    def build_stages(self, capabilities: frozenset[str]) -> list[Reranker]:
        """The stages of :attr:`rerank`, each built from its settings, for a family whose index
        offers ``capabilities`` (and what the sources add); a family's config calls it when it is
        made, so that a stage the family cannot serve is one line then.

        Raises:
            InputError: an unknown re-ranker, one that needs what the family does not offer, or one
                whose earlier stage is missing.
        """
        offered = self.offered(capabilities)
        names = self.rerank
        where = f"method {getattr(self, 'name', '?')}: setting rerank: "
        stages = []
        for i, name in enumerate(names):
            if name not in RERANKERS:
                usable = [n for n in RERANKERS.names() if RERANKERS.get(n).needs <= offered]
                raise InputError(
                    f"{where}unknown re-ranker {name!r}; this family runs: {', '.join(sorted(usable))}"
                )
            cls = RERANKERS.get(name)
            missing = cls.needs - offered
            if missing:
                family = getattr(self, "family", "")
                needed = " and ".join(CAPABILITY_WORDS.get(c, c) for c in sorted(missing))
                raise InputError(
                    f"{where}re-ranker {name!r} needs {needed}, which the {family} family does not offer"
                )
            if cls.after and cls.after not in names[:i]:
                raise InputError(f"{where}re-ranker {name!r} needs a {cls.after!r} stage before it")
            stages.append(cls.from_settings({g: self.stage_settings.of(g) for g in cls.uses}))
        return stages

    @property
    def reads_vectors(self) -> bool:
        """Whether a stage reads or replaces the database vectors (query expansion, augmentation)."""
        return any(RERANKERS.get(n).needs & {"vectors", "augment"} for n in self.rerank)


def aligned_to_index(
    ranks: NDArray[np.int64], scores: NDArray[np.float32], n_index: int
) -> NDArray[np.float32]:
    """Scores by index position ``[n_queries, n_index]`` from a complete aligned ranking."""
    out = np.empty((ranks.shape[0], n_index), np.float32)
    np.put_along_axis(out, ranks, scores, axis=1)
    return out
