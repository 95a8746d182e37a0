"""The method interface: what every retrieval method implements, whatever its family.

A *method* is two things kept apart, as scikit-learn keeps settings apart from learned state:

- a :class:`MethodConfig` -- a frozen dataclass holding every setting that changes the result (a
  preset is one of these, registered by name in :data:`METHODS`); it is data, recorded in every
  run folder, hashed into cache keys, and never executes anything but :meth:`MethodConfig.build`;
- a :class:`RetrievalMethod` -- what ``config.build()`` returns: it learns on a training set
  (:meth:`~RetrievalMethod.fit`: a vocabulary, a whitening), describes and indexes a benchmark's
  database (:meth:`~RetrievalMethod.index`), and answers the queries (:meth:`~RetrievalMethod.search`),
  re-ranking as its config says (spatial verification, query expansion, diffusion).

Every step takes a :class:`RunContext` (cache folder, the executor its parallel stages run in,
progress, where timings and cache hits are recorded) and caches its outputs under the cache folder,
keyed by what determines them, so a rerun resumes. :func:`oxbench.pipelines.runner.run` drives any
method the same way and writes the same run folder.

Families: one module each in :mod:`oxbench.pipelines.families` (bag of words, ASMK, global
descriptors), holding its config, its method and its presets; :data:`METHODS` imports every module
of that package on first use. A family of your own is one module that defines a config and a
method and calls :func:`register_method`; import it before resolving its presets, or declare it
as an ``oxbench.families`` entry point of its distribution (docs/plugins.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.execution import Executor, SerialExecutor, available_cores, cpu_seconds
from oxbench.features.local import LocalExtractor, learns_on_test_set, reads_pixels
from oxbench.features.store import DEFAULT_SHARD_SIZE
from oxbench.fileio import json_digest

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.index.footprint import Footprint


#: The field of a method config that holds its stages' settings by group
#: (:class:`oxbench.pipelines.rerankers.StageSettings`); ``to_dict`` writes each group as a key.
STAGE_SETTINGS_FIELD = "stage_settings"

#: ``timings[stage + CPU_SUFFIX]``: the stage's CPU seconds over all processes (wall time: ``timings[stage]``).
CPU_SUFFIX = "_cpu"


@dataclass(frozen=True)
class RunContext:
    """Where a method's steps cache their outputs, and what they record about themselves.

    Attributes:
        cache: the cache root (features, vocabularies, descriptors, ...).
        executor: where the parallel stages run (:mod:`oxbench.execution`: local feature
            extraction, word assignment, verification, aggregation); default: this process.
        progress: show tqdm bars.
        decode_threads: threads that decode images for CNN extraction in this process.
        full_check: hash every cached artifact in full before reusing it (the runner's second
            attempt after a corrupt cache file was met), not only the cheap open-time checks.
        verify_images: compare every cached image's features with its file by the file's bytes
            (``--verify-images``: a full read and hash), not only by ``stat``.
        allow_partial: the user accepts partial image sets: an image that cannot be decoded is
            named in a warning and skipped (recorded) instead of stopping the run.
        shard_size: images per write-once shard of the local-feature stores
            (:mod:`oxbench.features.store`; the shard plan, and so the resume granularity).
        root: the data root of the run, where ``models:<file>`` weights are found
            (:func:`oxbench.features.deep.models_dir`); ``None``: ``$OXBENCH_DATA`` or the per-user
            default.
        timings: seconds per stage, filled by :meth:`timed`.
        steps: ``{step: "hit" | "computed"}``, filled by :meth:`record_step`.
        computed: ``{step: items computed}`` of the steps that count them (images described
            again after their files changed, ...), filled by :meth:`record_step`.
    """

    cache: Path
    executor: Executor = field(default_factory=SerialExecutor)
    progress: bool = True
    decode_threads: int = field(default_factory=available_cores)
    full_check: bool = False
    verify_images: bool = False
    allow_partial: bool = False
    root: Path | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    timings: dict[str, float] = field(default_factory=dict)
    steps: dict[str, str] = field(default_factory=dict)
    computed: dict[str, int] = field(default_factory=dict)

    @property
    def workers(self) -> int:
        """How many items the executor runs at once."""
        return self.executor.workers

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the block's wall time to ``timings[stage]`` and its CPU time (this process and the
        worker processes it waited for) to ``timings[stage + "_cpu"]``."""
        t0, c0 = time.perf_counter(), cpu_seconds()
        try:
            yield
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - t0
            cpu = f"{stage}{CPU_SUFFIX}"
            self.timings[cpu] = self.timings.get(cpu, 0.0) + cpu_seconds() - c0

    def record_step(self, step: str, *, hit: bool, computed: int | None = None) -> None:
        """Record whether ``step`` came from the cache (and how many of its items were computed)."""
        self.steps[step] = "hit" if hit else "computed"
        if computed is not None:
            self.computed[step] = int(computed)


@dataclass(frozen=True)
class SearchResult:
    """A method's answer to every query of a benchmark.

    Attributes:
        ranks: ``int64 [n_queries, k]`` -- the internal layout: row ``q`` is query ``q``'s ranked
            list of index positions, best first (database ``0 .. n_db - 1``, then distractors).
        scores: ``float32 [n_queries, k]`` -- the score of each ranked item, aligned with
            ``ranks``, higher is better (spatially verified items carry their inlier count), or
            ``None`` when the method has no meaningful score.
        info: facts of the run (vocabulary or whitening provenance, features per image, verified
            images per query, memory per database image ...), JSON-able.
        matches: optional inlier correspondences ``{query: {index: float32 [m, 4]}}`` as
            ``(x_q, y_q, x_db, y_db)`` full-image pixels, for viewers.
    """

    ranks: NDArray[np.int64]
    scores: NDArray[np.float32] | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    matches: Mapping[int, Mapping[int, NDArray[np.float32]]] | None = None

    def __post_init__(self) -> None:
        if self.ranks.ndim != 2:
            raise ValueError(f"ranks must be 2-D [n_queries, k], got shape {self.ranks.shape}")
        if self.scores is not None and self.scores.shape != self.ranks.shape:
            raise ValueError(
                f"scores {self.scores.shape} do not align with ranks {self.ranks.shape}"
            )

    def top(self, k: int | None) -> SearchResult:
        """The first ``k`` of every list (all when ``k`` is ``None`` or larger)."""
        if k is None or k >= self.ranks.shape[1]:
            return self
        return dataclasses.replace(
            self,
            ranks=self.ranks[:, :k],
            scores=None if self.scores is None else self.scores[:, :k],
        )


@dataclass(frozen=True)
class Ranking:
    """A ranking between the stages of a pipeline.

    Attributes:
        ranks: ``int64 [n_queries, k]`` index positions, best first.
        scores: ``float32 [n_queries, k]`` aligned with ``ranks`` (higher is better; a spatially
            verified image carries its inlier count).
        queries: the query representation the ranking was made from (dense ``[n_queries, d]``
            vectors or sparse rows), or ``None``; a stage that expands the queries replaces it.
        verified: per query, the spatial verification of its short list, once a stage verified it.
        info: facts of the stages (JSON-able), recorded with the result.
        matches: inlier correspondences of verified images ``{query: {index: float32 [m, 4]}}``.
        verification: the settings the lists in ``verified`` were verified with (what a stage
            that verifies more images of the same queries uses).
    """

    ranks: NDArray[np.int64]
    scores: NDArray[np.float32]
    queries: Any = None
    verified: tuple[Any, ...] | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    matches: Mapping[int, Mapping[int, NDArray[np.float32]]] | None = None
    verification: Any = None

    def result(self) -> SearchResult:
        """The ranking as a method's answer."""
        return SearchResult(self.ranks, self.scores, dict(self.info), matches=self.matches)


class MethodConfig(ABC):
    """Base of every method config: a frozen dataclass of settings, registered as a preset.

    Subclasses are ``@dataclass(frozen=True)`` with a ``name`` field, set :attr:`family`, and
    implement :meth:`build`. ``needs_training`` says whether :meth:`RetrievalMethod.fit` uses a
    training set (a vocabulary or a whitening is learned), so the runner knows whether to load one;
    ``reads_images`` whether any step reads pixels, so the runner knows whether the images must be
    on disk.
    """

    family: ClassVar[str] = ""
    name: str
    #: Settings of earlier versions, by their old name, and where they are now: refused in one line
    #: naming the new name (a family declares its own).
    renamed: ClassVar[Mapping[str, str]] = {}
    #: The command-line shorthands this family answers, by option (``vocab_size`` for
    #: ``--vocab-size``), and the setting each sets: a family declares its own.
    shorthands: ClassVar[Mapping[str, str]] = {}

    @property
    def needs_training(self) -> bool:
        """Whether the method learns anything on a training set."""
        return True

    @property
    def local_features(self) -> LocalExtractor | None:
        """The local features the method extracts and reads (bag of words, HE, ASMK, VLAD), or
        ``None``. By default the ``features`` setting when it holds a local extractor; a family
        whose ``features`` setting is not always read overrides this."""
        features = getattr(self, "features", None)
        return features if isinstance(features, LocalExtractor) else None

    @property
    def reads_images(self) -> bool:
        """Whether any step reads the benchmark's pixels (else the ground truth is enough).

        By default: unless the method's local features (a ``features`` setting) are read from
        the user's files (:func:`oxbench.features.local.reads_pixels`)."""
        features = getattr(self, "features", None)
        return features is None or reads_pixels(features)

    @property
    def learns_on_test_set(self) -> bool:
        """Whether what the method learns must come from the test set itself, for want of training
        data of its own (local features read from files without a training file): the runner then
        trains on the test set, warns, and records ``trained_on_test_set``."""
        features = getattr(self, "features", None)
        return self.needs_training and features is not None and learns_on_test_set(features)

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """The optional modules the method's steps import, as ``(module, extra)``: the runner checks
        them (:func:`oxbench.errors.require_installed`) before it loads or generates any data."""
        return ()

    def shorthand(self, option: str) -> str | None:
        """The setting a command-line shorthand sets (``vocab_size``, ``max_side``, ``top_r``), or
        ``None`` when it does not apply to this method (:attr:`shorthands`); the setting's spec
        checks the value."""
        return self.shorthands.get(option)

    def inapplicable(self, setting: str) -> str | None:
        """Why the (dotted) ``setting`` does nothing with the other settings as they are (one
        line), or ``None`` when it applies: ``oxbench methods NAME`` lists only the settings that
        apply (``--all``: every one), and :func:`resolve_method` refuses to set one that does not. A family whose
        settings depend on a choice overrides this (a choice with settings of its own is better a
        nested config, as the global family's descriptor kind: its settings then exist only with it)."""
        return None

    def applies(self, setting: str) -> bool:
        """Whether the (dotted) ``setting`` does anything (:meth:`inapplicable`)."""
        return self.inapplicable(setting) is None

    def check_inputs(self, root: Path | None = None) -> None:
        """Refuse, before any data is loaded or generated, an input file the settings name that is
        not there (a model file, descriptor files); ``root`` is the data root (``models:`` files).
        Nothing is read but the files' metadata; a family with such settings overrides this.

        Raises:
            InputError: one line naming the setting and the file.
        """
        return None  # no setting of the base names a file

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """The files the settings name as inputs, by setting (``{"db_features": Path(...)}``):
        every set path setting marked ``input`` in the schema. Their content digests go into the
        run's config (:func:`oxbench.provenance.input_record`); a family whose other settings name
        an input file (a model file) adds it."""
        import dataclasses

        from oxbench.schema import input_paths

        out = {name: Path(path) for name, path in input_paths(self).items()}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]  # a nested config's files (local features' h5 / npz)
            value = getattr(self, f.name)
            if (
                dataclasses.is_dataclass(value)
                and not isinstance(value, type)
                and not hasattr(value, "input_files")  # a family adds those itself
            ):
                for name, path in input_paths(value).items():
                    out[f"{f.name}.{name}"] = Path(path)
        return out

    def test_data_in_training(self, bench: Benchmark) -> str | None:
        """Why what the method learns from its own input files holds ``bench``'s test data (a
        training file equal to, or containing, the test descriptors), or ``None``. The runner also
        compares training and test sets itself; a family with training files overrides this."""
        return None

    def ram_bytes_per_image(self) -> int | None:
        """An upper bound of the index's RAM per database image from the settings alone, for the
        runner's pre-flight check (:func:`oxbench.index.footprint.check_ram`); ``None``: unknown,
        nothing is checked. A family overrides it."""
        return None

    def ram_bytes_per_feature(self) -> float | None:
        """For an index over local features: the bytes of RAM its build holds at most per database
        feature (the pre-flight multiplies it by the dataset's actual feature counts,
        :func:`oxbench.pipelines.estimates.estimate_run`); ``None``: the family's RAM is per image."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every setting as JSON-able data (nested configs as dicts), plus the family."""
        assert dataclasses.is_dataclass(self)
        out: dict[str, Any] = {"family": self.family}
        groups: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == STAGE_SETTINGS_FIELD:  # each stage instance's, as `--set` names them
                groups = self.stage_settings_dict()  # type: ignore[attr-defined]
            else:
                out[f.name] = value.to_dict() if hasattr(value, "to_dict") else _jsonable(value)
        for group, values in groups.items():
            if group in out:
                raise InputError(f"method {self.name}: stage instance {group!r} is also a setting")
            out[group] = values
        return out

    def digest(self) -> str:
        """Short stable hash of :meth:`to_dict`."""
        return json_digest(self.to_dict(), 12)

    @abstractmethod
    def build(self) -> RetrievalMethod:
        """The runnable method with these settings (no I/O)."""


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


class RetrievalMethod(ABC):
    """A method with learned state: fit on a training set, index a database, search it.

    Call order: ``fit(train, ctx)`` (``train`` is ``None`` when the config needs no training),
    ``index(bench, ctx)``, ``search(bench, ctx)``. Each step caches its outputs under
    ``ctx.cache`` and records in ``ctx`` how long it took and whether it was a cache hit.
    """

    config: MethodConfig
    #: Whether the method describes an image by one vector (:meth:`vectors`).
    offers_vectors: ClassVar[bool] = False

    @abstractmethod
    def fit(self, train: Benchmark | None, ctx: RunContext) -> RetrievalMethod:
        """Learn what the method learns (vocabulary, whitening) on ``train``; returns self."""

    @abstractmethod
    def index(self, bench: Benchmark, ctx: RunContext) -> RetrievalMethod:
        """Describe and index ``bench``'s database (and distractors); returns self."""

    #: What the method's index offers the stages of its pipeline (the capabilities of
    #: :class:`~oxbench.pipelines.rerankers.RerankSpace`: ``vectors``, ``local``, ...).
    capabilities: ClassVar[frozenset[str]] = frozenset()

    @functools.cached_property
    def stages(self) -> list[Any]:
        """The re-ranking stages of the config's pipeline (a config that is also a
        :class:`~oxbench.pipelines.rerankers.Pipeline`), built once, so that what a stage prepares
        at index time is there at search time; none for a config without a pipeline."""
        build = getattr(self.config, "build_stages", None)
        return [] if build is None else list(build(self.capabilities))

    def prepare_stages(
        self, space: Any, ctx: RunContext, *, phase: str | None = None
    ) -> dict[str, Any]:
        """Index-time work of the stages (of one ``phase`` when given: ``index`` stages change the
        database before the search index is built on it, the others prepare after it); the facts
        they report."""
        facts: dict[str, Any] = {}
        for stage in self.stages:
            if phase is None or (stage.phase == "index") == (phase == "index"):
                facts.update(stage.prepare(space, ctx))
        return facts

    def first_ranking(self, bench: Benchmark, ctx: RunContext) -> tuple[Any, Ranking]:
        """Describe ``bench``'s query crops and rank the index for each: the ranking the stages
        start from, and the space they re-rank in (what the index offers them: its
        :attr:`capabilities`). A family with a pipeline implements this; :meth:`search` runs the
        stages."""
        raise NotImplementedError(
            f"method {self.config.name}: its family implements neither first_ranking nor search"
        )

    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        """Describe ``bench``'s query crops and rank the index for each, re-ranking as configured:
        the family's :meth:`first_ranking`, then every stage of its pipeline in order -- the one
        stage loop of every family. (A family without stages may implement this alone.)"""
        space, ranking = self.first_ranking(bench, ctx)
        for stage in self.stages:
            ranking = stage.rerank(ranking, space, ctx)
        return ranking.result()

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """The method's describe step: describe the images of ``bench`` that the method will read
        (as its training set with ``training``) into the cache, by its write-once extraction
        shards -- local-feature stores, CNN descriptor shards -- and only the shards of
        ``partition`` (``(i, n)``: shard numbers ``i`` modulo ``n``) when given. What
        ``oxbench extract`` and ``oxbench run --partition`` do for every family; ``fit``,
        ``index`` and ``search`` then find the shards committed.

        Returns:
            ``{part: images described}`` (0 for a part already complete); empty (the default) when
            the method describes no images itself (descriptors read from the user's files).
        """
        return {}

    def vectors(self, bench: Benchmark, parts: list[str], ctx: RunContext) -> NDArray[np.float32]:
        """One vector per image of ``parts`` (in part order, concatenated) as the method searches
        with them, after :meth:`fit` (what ``oxbench extract`` writes to ``.npy`` files); only
        for a method that :attr:`offers_vectors`."""
        raise InputError(
            f"method {self.config.name} ({self.config.family}) has no one vector per image"
        )

    def provenance(self) -> dict[str, Any]:
        """What was learned and from what (recorded in the run); empty by default."""
        return {}

    def footprint(self) -> Footprint | None:
        """The measured RAM and disk of the index (after :meth:`index`), recorded in every run
        (``record.json`` ``"footprint"``); ``None`` when the method does not measure it."""
        return None
