"""Re-ranking as a stage: what every family's search ends with, one module per re-ranker.

A pipeline is a family's first ranking plus an ordered list of stages (``rerank``, a
:class:`Pipeline` setting of every family config). Each stage *instance* owns its settings, named
by the stage: ``--set rerank=spatial,aqe-verified --set spatial.top_r=200 --set
aqe-verified.min_inliers=10``; a stage named twice gets ``#2`` for its second instance
(``--set rerank=aqe,aqe --set aqe#2.k=10``), as scikit-learn's ``Pipeline`` names its steps. The
family ranks its index, then the one stage loop (:meth:`oxbench.pipelines.method.RetrievalMethod.search`)
hands the :class:`~oxbench.pipelines.method.Ranking` to each :class:`Reranker`, in order; each
returns a new ranking. A stage reaches the family's index only through the :class:`RerankSpace` the
family offers: dense or sparse database vectors and a way to rank again for new query vectors (query
expansion, diffusion), or the verification of short lists against stored local features (spatial
verification). A stage that needs what a family does not offer is refused in one line when the
method is built.

Stages, by the name a pipeline gives them (:data:`RERANKERS`; the modules of this package are
imported on first lookup, then the ``oxbench.rerankers`` entry points of installed plugins; a module
elsewhere may call :func:`register_reranker`); ``oxbench methods`` lists them with their settings:

- ``aqe``, ``alpha-qe`` -- query expansion over the top ``k`` (:mod:`.qe`);
- ``diffusion`` -- Iscen et al.'s diffusion over the database graph (:mod:`.diffusion`);
- ``spatial`` -- spatial verification of the top ``top_r`` (:mod:`.spatial`);
- ``aqe-verified`` -- average query expansion from spatially verified images, whose new results
  are verified in turn (Chum et al. 2007; :mod:`.verified_qe`);
- ``dqe-verified`` -- the same with discriminative query expansion, a linear SVM's weight vector
  (Arandjelovic & Zisserman 2012; :mod:`.verified_qe`);
- ``diffusion-verified`` -- diffusion seeded by the verified images too (:mod:`.diffusion`);
- ``dba``, ``dba-verified`` -- database-side augmentation at index time, from the top ``k`` by
  vectors or from spatially verified neighbours (:mod:`.dba`).
- ``k-reciprocal`` -- k-reciprocal encoding and Jaccard distance (Zhong et al. 2017), over a graph
  of the queries and the database together or of the database alone (:mod:`.k_reciprocal`);
- ``superglobal`` -- SuperGlobal's MDescAug and RerankwMDA over the top ``M`` (Shao et al. 2023;
  :mod:`.superglobal`).
- ``egt`` -- explore-exploit traversal of the database's k-NN graph (Chang et al. 2019; :mod:`.egt`).

A new re-ranker is one module: a :class:`Reranker` subclass (what it ``needs``, its ``settings``
dataclass, ``__init__`` taking one settings object) and ``register_reranker(name, cls)``.
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
from oxbench.refinement.spatial import Verification
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
        settings: Verification,
        *,
        rows: dict[int, NDArray[np.int64]] | None = None,
        stage: str = "spatial",
    ) -> list[VerifiedList]:
        """Spatial verification, as ``settings`` say, of each query's top ``r`` (or of the lists in
        ``rows``)."""
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

    def verified_neighbours(
        self, r: int, ctx: RunContext, settings: Verification
    ) -> NDArray[np.int64]:
        """With ``"local"``: ``[n_index, r]`` each index image's neighbours among its top ``r`` by
        the database vectors that a verification as ``settings`` say accepts (``-1``: none)."""
        ...


class Reranker(ABC):
    """One re-ranking stage.

    A stage owns its settings: a frozen dataclass (:attr:`settings_type`) whose every field is declared
    with :func:`oxbench.schema.setting` (type, range and one-line doc); each instance of the stage
    in a pipeline has its own values, named by the instance (``spatial.top_r``, ``aqe#2.k``), and
    the stage is built from them (``cls(settings)``; ``cls()`` for a stage without settings).

    Attributes:
        name: the name a pipeline gives the stage (``rerank=spatial,aqe-verified``).
        needs: the capabilities of :class:`RerankSpace` the stage uses.
        settings_type: the stage's settings dataclass, or ``None``.
        phase: ``"query"`` (re-ranks each query's ranking) or ``"index"`` (changes the database at
            index time, in :meth:`prepare`, before the search index is built: DBA).
        after: a stage that must come earlier in the pipeline (``aqe-verified`` expands from the
            images a ``spatial`` stage verified), or ``""``.
        about: what the stage does and its paper, one line (``oxbench methods`` shows it; empty:
            the first paragraph of the class's docstring).
    """

    name: ClassVar[str] = ""
    about: ClassVar[str] = ""
    needs: ClassVar[frozenset[str]] = frozenset()
    settings_type: ClassVar[type | None] = None
    phase: ClassVar[str] = "query"
    after: ClassVar[str] = ""

    @property
    def query_words(self) -> int:
        """The visual words per query feature the stage needs the family to assign (a
        verification that matches shared words through several words per query feature)."""
        return 1

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

#: Re-rankers by name (each class builds itself from its settings: ``cls(settings)``).
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
        InputError: the name is taken (the line names both modules), it holds ``#`` or ``.``, or
            the class's ``settings`` is not a dataclass.
    """
    if not name or "#" in name or "." in name:
        raise InputError(f"re-ranker name {name!r}: a name holds neither '#' nor '.'")
    settings = getattr(reranker, "settings_type", None)
    if settings is not None and not (
        isinstance(settings, type) and dataclasses.is_dataclass(settings)
    ):
        raise InputError(f"re-ranker {name!r}: its settings {settings!r} is not a dataclass")
    if "name" not in vars(reranker) or not reranker.name:
        reranker.name = name
    RERANKERS.register(name, reranker)


def stage_about(name: str) -> str:
    """One line on the stage ``name``: its class's ``about``, else its docstring's first paragraph."""
    cls = RERANKERS.get(name)
    text = cls.about or (cls.__doc__ or "").strip().split("\n\n", 1)[0]
    return " ".join(text.replace("``", "").split())


def stage_instances(names: Sequence[str]) -> list[tuple[str, str]]:
    """``(instance, stage name)`` of each stage of a pipeline, in order: an instance is named by its
    stage, with ``#2``, ``#3`` ... for the later instances of a stage named again.

    Example:
        >>> stage_instances(["aqe", "spatial", "aqe"])
        [('aqe', 'aqe'), ('spatial', 'spatial'), ('aqe#2', 'aqe')]
    """
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name}#{seen[name]}", name))
    return out


def stage_of(instance: str) -> str:
    """The stage name of an instance (``aqe#2`` -> ``aqe``)."""
    return instance.split("#", 1)[0]


class StageSettings(Mapping[str, Any]):
    """The settings of a pipeline's stage instances: ``{"aqe": QeSettings(k=10), ...}``.

    Frozen and hashable; an instance not given takes its stage's defaults
    (:meth:`Pipeline.stage`).
    """

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(values or {})

    def replace(self, instance: str, settings: Any) -> StageSettings:
        """A copy with ``instance`` set to ``settings``."""
        return StageSettings({**self._values, instance: settings})

    def __getitem__(self, instance: str) -> Any:
        return self._values[instance]

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
        stage_settings: each stage instance's settings (:class:`StageSettings`; ``--set aqe.k=10``).
        local_source, global_source: what a stage needs that the family's first stage does not
            have (:mod:`oxbench.pipelines.sources`): local features by name for a global family
            (``local_source=rootsift``: GeM + SV), a global preset's vectors for bag of words or
            ASMK (``global_source=gem-r50-imagenet``: verified images start diffusion).
    """

    rerank: tuple[str, ...] = setting(
        (),
        S.Names(max_len=16, repeats=True),
        doc="stages after the first ranking, in order (none: no stage; a stage named again is "
        "another instance, its settings NAME#2.*)",
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

    @property
    def stage_instances(self) -> list[str]:
        """The instances of this pipeline's stages, in order (``["spatial", "aqe-verified"]``)."""
        return [instance for instance, _ in stage_instances(self.rerank)]

    def stage(self, instance: str) -> Any:
        """The settings of stage instance ``instance`` (its stage's defaults when not set);
        ``None`` for a stage without settings.

        Raises:
            InputError: no stage of the pipeline is ``instance``.
        """
        if instance in self.stage_settings:
            return self.stage_settings[instance]
        if instance not in self.stage_instances:
            raise InputError(
                f"no stage of the pipeline is {instance!r} (its stages: "
                f"{', '.join(self.stage_instances) or 'none'})"
            )
        cls = RERANKERS.get(stage_of(instance)).settings_type
        return None if cls is None else cls()

    def stage_settings_dict(self) -> dict[str, Any]:
        """``{instance: {setting: value}}`` of every stage instance with settings, JSON-able."""
        out = {}
        for instance in self.stage_instances:
            values = self.stage(instance)
            if values is not None:
                out[instance] = {
                    k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(values).items()
                }
        return out

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
        """The stages of :attr:`rerank`, each built from its instance's settings, for a family
        whose index offers ``capabilities`` (and what the sources add); a family's config calls it
        when it is made, so that a stage the family cannot serve is one line then.

        Raises:
            InputError: an unknown re-ranker, one that needs what the family does not offer, or one
                whose earlier stage is missing.
        """
        offered = self.offered(capabilities)
        names = self.rerank
        where = f"method {getattr(self, 'name', '?')}: setting rerank: "
        stages = []
        for i, (instance, name) in enumerate(stage_instances(names)):
            if name not in RERANKERS:
                usable = [n for n in RERANKERS.names() if RERANKERS.get(n).needs <= offered]
                raise InputError(
                    f"{where}unknown re-ranker {name!r}; this family runs: "
                    f"{', '.join(sorted(usable))}"
                )
            cls = RERANKERS.get(name)
            missing = cls.needs - offered
            if missing:
                family = getattr(self, "family", "")
                needed = " and ".join(CAPABILITY_WORDS.get(c, c) for c in sorted(missing))
                raise InputError(
                    f"{where}re-ranker {name!r} needs {needed}, which the {family} family "
                    "does not offer"
                )
            if cls.after and cls.after not in names[:i]:
                raise InputError(f"{where}re-ranker {name!r} needs a {cls.after!r} stage before it")
            settings = self.stage(instance)
            stages.append(cls() if settings is None else cls(settings))  # type: ignore[call-arg]
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
