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
import importlib
import json
import pkgutil
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, close_matches
from oxbench.execution import Executor, SerialExecutor, available_cores, cpu_seconds
from oxbench.features.local import LocalExtractor, learns_on_test_set, reads_pixels
from oxbench.features.store import DEFAULT_SHARD_SIZE
from oxbench.fileio import json_digest
from oxbench.registry import GROUPS, Registry
from oxbench.schema import SPEC_KEY

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
        ``None`` when it does not apply to this method; the setting's spec checks the value."""
        names = {
            "vocab_size": "vocab_size",
            "max_side": "features.max_side",
            "top_r": "spatial.top_r",
        }
        key = names.get(option)
        if key is None:
            return None
        head, _, sub = key.partition(".")
        fields = {f.name for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        if head in fields:
            return key
        return key if sub and _is_group(head) and STAGE_SETTINGS_FIELD in fields else None

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
        from oxbench.schema import input_paths

        return {name: Path(path) for name, path in input_paths(self).items()}

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
        :func:`oxbench.index.estimates.estimate_run`); ``None``: the family's RAM is per image."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """Every setting as JSON-able data (nested configs as dicts), plus the family."""
        assert dataclasses.is_dataclass(self)
        out: dict[str, Any] = {"family": self.family}
        groups: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == STAGE_SETTINGS_FIELD:  # the groups the stages read, as `--set` names them
                groups = value.to_dict(getattr(self, "stage_groups", []))
            else:
                out[f.name] = value.to_dict() if hasattr(value, "to_dict") else _jsonable(value)
        for group, values in groups.items():
            if group in out:
                raise InputError(f"method {self.name}: stage settings group {group!r} is a setting")
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

    @abstractmethod
    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        """Describe ``bench``'s query crops and rank the index for each, re-ranking as configured."""

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

        By default: the :attr:`MethodConfig.local_features` of every part, as
        :func:`~oxbench.pipelines.steps.step_features` describes them in a run.

        Returns:
            ``{part: images described}`` (0 for a part already complete); empty when the method
            describes no images itself (descriptors read from the user's files).
        """
        from oxbench.pipelines.steps import step_features

        features = self.config.local_features
        if features is None:
            return {}
        done = step_features(bench, features, ctx, partition=partition)
        return {part: res.computed for part, res in done.items()}

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


# --- the preset registry -------------------------------------------------------------------------

#: The package whose every module is a family (config, method, presets); imported on first lookup.
FAMILIES_PACKAGE = "oxbench.pipelines.families"

#: The preset ``oxbench run`` uses when none is named.
DEFAULT_METHOD = "rootsift-bow-sv-qe"


def _load_families() -> None:
    package = importlib.import_module(FAMILIES_PACKAGE)
    for info in pkgutil.iter_modules(package.__path__, FAMILIES_PACKAGE + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def _adopt_presets(name: str, obj: object) -> None:
    """An ``oxbench.families`` entry point that names a preset, or a list of presets."""
    for config in obj if isinstance(obj, list | tuple) else [obj]:
        if not isinstance(config, MethodConfig):
            raise TypeError(
                f"entry point {name!r} names {config!r}, not a module or a MethodConfig"
            )
        register_method(config)


#: Every named method of every family, by name; plugins add theirs through the entry-point group
#: ``oxbench.families`` (:mod:`oxbench.registry`).
METHODS: Registry[MethodConfig] = Registry(
    "method", loader=_load_families, group=GROUPS["families"], adopt=_adopt_presets
)


#: ``register_method(config, about=...)``: what each preset is, in one line with its paper.
_PRESET_ABOUT: dict[str, str] = {}


def register_method(config: MethodConfig, *, about: str | None = None) -> MethodConfig:
    """Register a preset under ``config.name`` (a family module calls it for each of its presets).

    ``about`` is the line ``oxbench methods`` shows for it: what it is and its paper
    (``"RootSIFT BoW + spatial verification + AQE from verified images (Chum et al. 2007)"``);
    the built-in presets' lines are in :mod:`oxbench.pipelines.about`.

    Raises:
        InputError: the name is taken (by this or another family; the line names both modules).
    """
    registered = METHODS.register(config.name, config)
    if about is not None:
        _PRESET_ABOUT[config.name] = " ".join(str(about).split())
    return registered


def preset_about(name: str) -> str:
    """The one line ``oxbench methods`` shows for preset ``name``: its ``about`` text, else the
    built-in one (:data:`oxbench.pipelines.about.ABOUT`), else its family's description."""
    from oxbench.pipelines.about import ABOUT

    METHODS.get(name)  # an unknown name is one line, and the families are loaded
    if name in _PRESET_ABOUT:
        return _PRESET_ABOUT[name]
    if name in ABOUT:
        return ABOUT[name]
    family = METHODS.get(name).family
    return next((f.about for f in method_families() if f.name == family), "")


@dataclass(frozen=True)
class MethodFamily:
    """A family of presets, as ``oxbench methods`` lists it: its name, its one-line description
    (the first line of its module's docstring) and its presets in registration order."""

    name: str
    about: str
    presets: tuple[str, ...]


def method_families() -> list[MethodFamily]:
    """Every family with its presets, in the order the families registered their first preset."""
    import sys

    grouped: dict[str, list[str]] = {}
    about: dict[str, str] = {}
    for name in METHODS.names():
        config = METHODS.get(name)
        grouped.setdefault(config.family, []).append(name)
        doc = sys.modules[type(config).__module__].__doc__ or ""
        about.setdefault(config.family, doc.strip().split("\n", 1)[0] if doc.strip() else "")
    return [MethodFamily(f, about[f], tuple(names)) for f, names in grouped.items()]


def list_methods(family: str | None = None) -> list[str]:
    """Names of the registered presets (of one ``family`` when given: ``"bow"``, ``"global"``)."""
    return [n for n in METHODS.names() if family is None or METHODS.get(n).family == family]


def resolve_method(method: str | MethodConfig, **overrides: object) -> MethodConfig:
    """A preset (by name, or a config) with ``overrides`` applied; ``None`` values are ignored.

    Keys are field names; ``a.b`` sets field ``b`` of the nested config in field ``a``
    (``features.max_side=1024``) or setting ``b`` of the stage settings group ``a`` of the
    pipeline (``qe.k=10``, ``spatial.top_r=200``; the group must be read by one of the pipeline's
    stages, after ``rerank`` is applied). A value is checked by the setting's declared spec
    (:mod:`oxbench.schema`): text (``--set qe.alpha=3``) is parsed by it, a typed value checked,
    so a word for a number, NaN, inf or an out-of-range value is one line naming the setting. A
    field without a spec takes text as JSON when it parses (numbers, lists, ``true``), else as text.

    Raises:
        InputError: unknown preset or setting, or a value the setting or the config refuses.
    """
    config = METHODS.get(method) if isinstance(method, str) else method
    top: dict[str, Any] = {}
    nested: dict[str, dict[str, Any]] = {}
    staged: dict[str, dict[str, Any]] = {}
    assert dataclasses.is_dataclass(config)
    fields = {f.name: f for f in dataclasses.fields(config)}
    # whole settings first, so that sub-settings apply to a nested config replaced in the same
    # call (features=h5:a.h5 features.train=b.h5)
    for key, value in sorted(overrides.items(), key=lambda kv: "." in kv[0]):
        if value is None:
            continue
        head, _, sub = key.partition(".")
        if (head not in fields or head == STAGE_SETTINGS_FIELD) and sub and _is_group(head):
            if STAGE_SETTINGS_FIELD not in fields:
                raise InputError(f"method {config.name} has no stages: {key!r} sets nothing")
            staged.setdefault(head, {})[sub] = value
            continue
        if head not in fields or head in ("name", STAGE_SETTINGS_FIELD):
            raise _unknown_setting(config, key)
        current = top.get(head, getattr(config, head))
        if sub:
            if not dataclasses.is_dataclass(current):
                raise InputError(f"unknown method setting {key!r}: {head} has no sub-settings")
            nested.setdefault(head, {})[sub] = value
        elif dataclasses.is_dataclass(current) and SPEC_KEY not in fields[head].metadata:
            raise InputError(f"method setting {key!r} takes sub-settings ({key}.<name>=...)")
        else:
            top[key] = _typed(fields[head], key, value)
    for head, subs in nested.items():
        top[head] = _replace_nested(
            config, top.get(head, getattr(config, head)), subs, head, fields[head]
        )
    if staged:
        top[STAGE_SETTINGS_FIELD] = _stage_settings(config, staged, top.get("rerank"))
    if not top:
        return config
    out = _replace(config, top, f"method {config.name}")
    for key, value in overrides.items():  # a setting that would do nothing is a mistake
        why = out.inapplicable(key) if value is not None else None
        if why is not None:
            raise InputError(why)
    return out


def _replace_nested(
    config: MethodConfig,
    current: Any,
    subs: Mapping[str, object],
    prefix: str,
    owner: dataclasses.Field[Any],
) -> Any:
    """The nested config ``current`` (the value of setting ``prefix``, declared by field
    ``owner``) with the dotted ``subs`` applied (``{"pooling": "rmac"}``, ``{"features.max_side":
    512}``: deeper configs recursively), each value typed by its sub-setting's spec.

    Raises:
        InputError: a sub-setting ``current`` does not have (the line the owner's spec words, if
            it has one: a descriptor kind names the kinds that have it), or a refused value.
    """
    sub_fields = {f.name: f for f in dataclasses.fields(current)}
    changes: dict[str, Any] = {}
    deeper: dict[str, dict[str, object]] = {}
    for sub, value in sorted(subs.items(), key=lambda kv: "." in kv[0]):
        first, _, rest = sub.partition(".")
        key = f"{prefix}.{sub}"
        if first not in sub_fields:
            words = getattr(owner.metadata.get(SPEC_KEY), "unknown_setting", None)
            if words is not None:
                raise InputError(words(current, key, config.name))
            raise _unknown_setting(config, key)
        if rest:
            deeper.setdefault(first, {})[rest] = value
        else:
            changes[first] = _typed(sub_fields[first], key, value)
    for first, more in deeper.items():
        inner = changes.get(first, getattr(current, first))
        if not dataclasses.is_dataclass(inner):
            key = f"{prefix}.{first}.{next(iter(more))}"
            raise InputError(
                f"unknown method setting {key!r}: {prefix}.{first} has no sub-settings"
            )
        changes[first] = _replace_nested(
            config, inner, more, f"{prefix}.{first}", sub_fields[first]
        )
    return _replace(current, changes, f"method {config.name}: {prefix}")


def _is_group(head: str) -> bool:
    from oxbench.pipelines.rerankers import STAGE_SETTINGS

    return head in STAGE_SETTINGS


def _stage_settings(config: Any, staged: dict[str, dict[str, Any]], rerank: Any) -> Any:
    """``config``'s stage settings with the ``staged`` changes (``{group: {setting: value}}``);
    each group must be read by a stage of the pipeline (``rerank``: the new stages, if changed)."""
    from oxbench.pipelines.rerankers import STAGE_SETTINGS, stage_groups

    stages = tuple(rerank) if rerank is not None else tuple(config.rerank)
    used = stage_groups(stages)
    out = config.stage_settings
    for group, subs in staged.items():
        if group not in used:
            have = ", ".join(stages) or "none"
            key = f"{group}.{next(iter(subs))}"
            raise InputError(
                f"method {config.name}: no stage of its pipeline reads {key} (its stages: {have}); "
                "add one with --set rerank=..."
            )
        cls = STAGE_SETTINGS.get(group)
        sub_fields = {f.name: f for f in dataclasses.fields(cls)}
        typed = {}
        for sub, value in subs.items():
            if sub not in sub_fields:
                near = close_matches(sub, sub_fields)
                hint = f"; did you mean {group}.{' or '.join(near)}?" if near else ""
                known = ", ".join(f"{group}.{n}" for n in sub_fields)
                raise InputError(f"unknown stage setting '{group}.{sub}'{hint} ({known})")
            typed[sub] = _typed(sub_fields[sub], f"{group}.{sub}", value)
        out = out.replace(group, _replace(out.of(group), typed, f"method {config.name}: {group}"))
    return out


def settings_rows(config: MethodConfig) -> list[Any]:
    """Every setting of ``config`` as :class:`oxbench.schema.SettingInfo` rows: its fields (nested
    as dotted names), then the settings of each group its stages read (``qe.k``); those that do
    not apply with the others as they are (:meth:`MethodConfig.applies`) too."""
    from oxbench.schema import describe

    rows = describe(config)
    for group in getattr(config, "stage_groups", []):
        rows += describe(config.stage(group), prefix=f"{group}.")  # type: ignore[attr-defined]
    return rows


def _unknown_setting(config: MethodConfig, key: str) -> InputError:
    """One line: the setting ``key`` is not one of ``config``'s; the close matches, else every setting."""
    known = [r.name for r in settings_rows(config)]
    near = close_matches(key, known)
    where = f"unknown method setting {key!r} for {config.name} ({config.family})"
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        hint = getattr(f.metadata.get(SPEC_KEY), "hint_for", None)
        where += hint(f.name, key) if hint is not None and "." not in key else ""
    if near:
        return InputError(
            f"{where}; did you mean {' or '.join(near)}? (`oxbench methods {config.name}` lists "
            f"its {len(known)} settings)"
        )
    return InputError(f"{where}; its settings: {', '.join(sorted(known))}")


def _typed(f: dataclasses.Field[Any], key: str, value: object) -> object:
    """``value`` for field ``f`` as its spec parses or checks it (JSON-or-text without a spec)."""
    spec = f.metadata.get(SPEC_KEY)
    if spec is not None:
        return spec.coerce(key, value)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _replace(config: Any, changes: dict[str, Any], what: str) -> Any:
    try:
        return dataclasses.replace(config, **changes)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{what}: {exc}") from None
