"""Global descriptor kinds by name: how an image becomes one vector in the global family.

Each kind is one module of this package (as :mod:`oxbench.features.extractors` keeps one module per
local feature), registered under its name in :data:`DESCRIPTORS` (the mechanism is
:class:`oxbench.registry.Registry`; plugins add theirs through the ``oxbench.descriptors`` entry
points):

- ``vlad`` -- VLAD over local features (RootSIFT), with a k-means codebook (:mod:`.vlad`);
- ``cnn`` -- a CNN / ViT activation map pooled by MAC, SPoC, GeM, R-MAC or fc6 (:mod:`.cnn`);
- ``vit`` -- a frozen foundation model's tokens (DINOv2, DINOv3, CLIP, SigLIP by timm name) pooled
  by class token, GeM over the patch tokens, both, or the model's own head (:mod:`.vit`);
- ``features`` -- nothing is described: the user's descriptor files are read (:mod:`.files`).

A kind is two things kept apart, as a method is (:mod:`oxbench.pipelines.method`):

- a :class:`DescriptorKind` -- a frozen dataclass of the kind's own settings, each declared with
  :func:`oxbench.schema.setting` (type and range in one spec), plus what the settings say: whether
  the kind learns on the training set, which extras it imports, the files it reads, the cache key
  of one image's descriptor, the raw dimension when the settings fix it;
- a :class:`Describer` -- what ``kind.build(method)`` returns for one run: it learns what the kind
  learns (:meth:`Describer.fit`: VLAD's codebook, a CNN's model file) and gives the raw descriptors
  of a dataset part (:meth:`Describer.describe`), cached per part in a
  :class:`~oxbench.features.descstore.DescriptorStore` (:class:`StoredDescriber`).

A global method's ``descriptor`` setting holds one kind (:data:`DESCRIPTOR_SPEC`): the text
``cnn`` is the kind's defaults (``--set descriptor=cnn``), its settings are sub-settings
(``--set descriptor.pooling=rmac``), and a record's ``to_dict()`` (a mapping with a ``kind``)
rebuilds it. A kind's settings carry no kind prefix (``descriptor.k``, ``descriptor.seed``).

A new kind is one module: a :class:`DescriptorKind` dataclass with ``kind = "name"`` and its
:meth:`~DescriptorKind.build`, a :class:`Describer` (usually a :class:`StoredDescriber`: its cache
key, and the job that computes some images' descriptors), and ``register_descriptor(Cls)`` -- or an
``oxbench.descriptors`` entry point naming the class (docs/plugins.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError, close_matches
from oxbench.features.local import LocalExtractor, learns_on_test_set, reads_pixels
from oxbench.fileio import file_lock, json_digest
from oxbench.pipelines.method import RunContext
from oxbench.registry import GROUPS, Registry
from oxbench.schema import Spec, _Refusal, input_paths, validate

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.features.descstore import Compute
    from oxbench.index.whitening import PCAWhitening

__all__ = [
    "DESCRIPTORS",
    "DESCRIPTOR_FIELD",
    "DESCRIPTOR_SPEC",
    "Describer",
    "DescriptorKind",
    "DescriptorSetting",
    "FamilySettings",
    "PartImages",
    "StoredDescriber",
    "descriptor_from_dict",
    "descriptor_kind",
    "register_descriptor",
]

#: The global family's setting that holds the kind (sub-settings are ``descriptor.<name>``).
DESCRIPTOR_FIELD = "descriptor"


class FamilySettings(Protocol):
    """The settings of the global family a describer reads besides its kind's: the method's name
    (for messages) and its whitening (what a CNN describes for learned whitening; the user's files
    learn their own)."""

    @property
    def name(self) -> str: ...

    @property
    def whitening(self) -> str: ...

    @property
    def whitening_dim(self) -> int | None: ...

    @property
    def whitening_power(self) -> float: ...

    @property
    def whitening_shrinkage(self) -> float: ...


class DescriptorKind(ABC):
    """Base of a descriptor kind's settings: a frozen dataclass whose every field is declared with
    :func:`oxbench.schema.setting` (checked in ``__post_init__``), with ``kind`` its registry name.

    The defaults below fit a kind that learns nothing, reads pixels, imports no extra and reads no
    file; a kind overrides what differs.
    """

    kind: ClassVar[str] = ""

    def __post_init__(self) -> None:
        validate(self)  # every setting's type and range (one line naming it)
        self.check()

    def __str__(self) -> str:
        return self.kind

    def check(self) -> None:
        """Refuse settings of the kind that cannot work together (one :class:`InputError` line)."""
        return None

    def check_with(self, m: FamilySettings) -> None:
        """Refuse a kind's setting that contradicts the family's (a model file's whitening with
        ``whitening=pca``); called when the method config is made."""
        return None

    # --- what the settings say ---------------------------------------------------------------
    @property
    def learns(self) -> str:
        """What the kind itself learns on the training set, in words (``"a codebook"``), or ``""``
        when it learns nothing there."""
        return ""

    @property
    def whitens_on_training_set(self) -> bool:
        """Whether the family's whitening learns on the training set's descriptors of this kind
        (else the describer learns it itself: :meth:`Describer.fit_whitening`)."""
        return True

    @property
    def reads_images(self) -> bool:
        """Whether describing reads the benchmark's pixels."""
        lf = self.local_features
        return lf is None or reads_pixels(lf)

    @property
    def local_features(self) -> LocalExtractor | None:
        """The local features the kind extracts and reads (VLAD's), or ``None``."""
        return None

    @property
    def learns_on_test_set(self) -> bool:
        """Whether what it learns must come from the test set (local features read from files
        without a training file)."""
        lf = self.local_features
        return lf is not None and learns_on_test_set(lf)

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """The optional modules describing imports, as ``(module, extra)``."""
        return ()

    @property
    def dim(self) -> int | None:
        """The raw descriptor dimension when the settings fix it (VLAD's), else ``None``."""
        return None

    def shorthand(self, option: str) -> str | None:
        """The kind's sub-setting a command-line shorthand (``max_side``) sets, or ``None``."""
        return None

    @abstractmethod
    def cache_key(self) -> dict[str, Any]:
        """What determines one image's descriptor from the settings alone (the descriptor cache
        key; the describer adds what it learned or loaded: the codebook, the weights)."""

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """The files the settings name as inputs (every set path setting declared ``input``), by
        sub-setting name; their content digests go into the run's config."""
        return {name: Path(path) for name, path in input_paths(self).items()}

    def check_inputs(self, root: Path | None = None) -> None:
        """Refuse an input file that is not a regular file, before any data is loaded (one line
        naming the setting and the file)."""
        from oxbench.fileio import require_regular_file

        for name, path in self.input_files(root).items():
            try:
                require_regular_file(path)
            except InputError as exc:
                raise InputError(f"{DESCRIPTOR_FIELD}.{name}: {exc.problem}", path) from None

    def test_data_in_training(self, bench: Benchmark, m: FamilySettings) -> str | None:
        """Why the kind's own training files hold ``bench``'s test data, or ``None``."""
        return None

    def to_dict(self) -> dict[str, Any]:
        """``{"kind": ..., every setting}`` (nested configs as their ``to_dict()``): what a run
        records and :func:`descriptor_from_dict` rebuilds."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if hasattr(value, "to_dict"):
                out[f.name] = value.to_dict()
            else:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @abstractmethod
    def build(self, m: FamilySettings) -> Describer:
        """The describer of one run of method ``m`` (no I/O)."""


class Describer(ABC):
    """A descriptor kind at work in one run: what it learned, and the raw descriptors of a part.

    Args:
        kind: the kind's settings.
        m: the family's settings (name, whitening).
    """

    def __init__(self, kind: DescriptorKind, m: FamilySettings) -> None:
        self.kind = kind
        self.m = m

    def fit(self, train: Benchmark, ctx: RunContext) -> None:
        """Learn what the kind learns on ``train`` (nothing by default)."""
        return None

    def fit_whitening(self) -> PCAWhitening | None:
        """The whitening learned from the kind's own files (when not
        :attr:`~DescriptorKind.whitens_on_training_set`)."""
        return None

    @abstractmethod
    def describe(self, bench: Benchmark, part: str, ctx: RunContext) -> NDArray[np.float32]:
        """Raw (unwhitened) descriptors ``float32 [n, D]`` of one part, names in part order."""

    def store_path(self, bench: Benchmark, part: str, ctx: RunContext) -> Path | None:
        """The folder of the cached descriptors of one part (``None``: nothing is cached)."""
        return None

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """The describe step (``oxbench extract``, ``run --partition``): by default the kind's
        local features of every part."""
        from oxbench.pipelines.steps import step_features

        features = self.kind.local_features
        if features is None:
            return {}
        done = step_features(bench, features, ctx, partition=partition)
        return {part: res.computed for part, res in done.items()}

    def stores_on_disk(
        self, bench: Benchmark, parts: list[str], ctx: RunContext
    ) -> dict[str, list[Path]]:
        """What the index keeps on disk, by what it is (for the footprint)."""
        return {}

    def fixed_disk(self) -> dict[str, int]:
        """Bytes on disk of what was learned, whatever the database size (a codebook)."""
        return {}

    def provenance(self) -> dict[str, Any]:
        """What was learned or loaded and from what (recorded in the run)."""
        return {}


class StoredDescriber(Describer):
    """A describer whose descriptors are computed per image and cached per part in a sharded,
    resumable :class:`~oxbench.features.descstore.DescriptorStore` under
    ``<cache>/<dataset>/global/<digest of the store key>/<part>``, each shard checked against its
    recorded digest when read. Subclasses give the store key and the job."""

    #: Images per descriptor shard (the plan of the store is fixed by it).
    shard_size: ClassVar[int] = 2048
    #: Whether the descriptors come from the pixels (a network): the describe step then fills
    #: the descriptor store of every part instead of computing the kind's local features.
    from_pixels: ClassVar[bool] = False

    def __init__(self, kind: DescriptorKind, m: FamilySettings) -> None:
        super().__init__(kind, m)
        self.undecodable_: dict[str, list[str]] = {}

    @abstractmethod
    def store_key(self, ctx: RunContext, part: str) -> dict[str, Any]:
        """Everything that determines one image's descriptor of ``part``: the kind's
        :meth:`~DescriptorKind.cache_key` and what was learned or loaded."""

    @abstractmethod
    def compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext) -> Compute:
        """The picklable job that computes the descriptors of some images of ``part``."""

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """With ``from_pixels``: the descriptor shards of every part (of a training set: what
        the whitening reads); otherwise the kind's local features."""
        if not self.from_pixels:
            return super().describe_parts(bench, ctx, training=training, partition=partition)
        from oxbench.pipelines.steps import parts_of

        if training:
            parts = ["database"] + (["queries"] if self.m.whitening == "learned" else [])
        else:
            parts = parts_of(bench)
        return {part: self.describe_shards(bench, part, ctx, partition) for part in parts}

    def finish_stored(self, x: NDArray[np.float32], ctx: RunContext) -> NDArray[np.float32]:
        """What the store holds as the describer gives it (a model file's whitening applied)."""
        return x

    def store_path(self, bench: Benchmark, part: str, ctx: RunContext) -> Path:
        from oxbench.pipelines.steps import dataset_key

        digest = json_digest(self.store_key(ctx, part), 12)
        return Path(ctx.cache) / dataset_key(bench) / "global" / digest / part

    def describe(self, bench: Benchmark, part: str, ctx: RunContext) -> NDArray[np.float32]:
        """Raw descriptors of one part, cached: an interrupted run resumes with the images not yet
        described. Images that cannot be decoded stop the run, unless ``ctx.allow_partial``: then
        each is named in a warning, recorded in :meth:`provenance` and given the zero descriptor."""
        from oxbench.features.descstore import DescriptorStore
        from oxbench.pipelines.steps import part_names

        names = part_names(bench, part)
        path = self.store_path(bench, part, ctx)
        with file_lock(path.with_name(path.name + ".lock"), wait=24 * 3600.0, what=str(path)):
            store = DescriptorStore.open(path, self.store_key(ctx, part))
            hit = not store.missing(names)
            failed: list[str] = []
            if not hit:
                failed = self._fill(store, bench, part, names, ctx)
        ctx.record_step(f"descriptors.{part}", hit=hit)
        if failed:
            self.undecodable_[f"{bench.id}/{part}"] = failed
        return self.finish_stored(store.get(names, missing_as_zero=ctx.allow_partial), ctx)

    def describe_shards(
        self, bench: Benchmark, part: str, ctx: RunContext, partition: tuple[int, int] | None
    ) -> int:
        """Describe the planned shards of one part (of ``partition`` when given); returns the
        images described."""
        from oxbench.features.descstore import DescriptorStore
        from oxbench.pipelines.steps import part_names

        names = part_names(bench, part)
        store = DescriptorStore.open(self.store_path(bench, part, ctx), self.store_key(ctx, part))
        before = len(store)
        self._fill(store, bench, part, names, ctx, partition)
        return len(store) - before

    def _fill(
        self,
        store: Any,
        bench: Benchmark,
        part: str,
        names: list[str],
        ctx: RunContext,
        partition: tuple[int, int] | None = None,
    ) -> list[str]:
        """:func:`~oxbench.features.descstore.fill_store` with this describer's job and shard
        size; returns the names that could not be decoded."""
        from oxbench.features.descstore import fill_store

        return fill_store(
            store,
            names,
            self.compute(bench, part, names, ctx),
            executor=ctx.executor,
            shard_size=self.shard_size,
            progress=ctx.progress,
            desc=f"{self.kind.kind} {bench.id} {part}",
            partition=partition,
        )

    def stores_on_disk(
        self, bench: Benchmark, parts: list[str], ctx: RunContext
    ) -> dict[str, list[Path]]:
        return {"descriptors": [self.store_path(bench, p, ctx) for p in parts]}

    def provenance(self) -> dict[str, Any]:
        return {"undecodable_images": dict(self.undecodable_)} if self.undecodable_ else {}


class PartImages:
    """Picklable reader of image ``i`` of one part as a describer describes it: a database or
    distractor image whole, a query by its crop (a query is described from its crop only,
    docs/protocols.md). A job that computes descriptors from pixels reads through it where it runs.
    """

    def __init__(self, bench: Benchmark, part: str) -> None:
        if part not in ("database", "queries", "distractors"):
            raise InputError(f"unknown part {part!r}; use one of database, queries, distractors")
        if part == "distractors" and bench.distractors is None:
            raise InputError(f"{bench.id} has no distractors")
        self.bench, self.part = bench, part

    def __call__(self, i: int) -> NDArray[np.uint8]:
        if self.part == "queries":
            return self.bench.query_crop(i)
        source = self.bench.database if self.part == "database" else self.bench.distractors
        assert source is not None
        return source.read(i)


# --- the registry --------------------------------------------------------------------------------


def _load_kinds() -> None:
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        if not info.name.rsplit(".", 1)[-1].startswith("_"):
            importlib.import_module(info.name)


def _adopt_plugin(name: str, obj: Any) -> object:
    """Register what an ``oxbench.descriptors`` entry point names: a :class:`DescriptorKind`
    dataclass (registered under its ``kind``, which must be the entry point's name)."""
    if not (isinstance(obj, type) and issubclass(obj, DescriptorKind)):
        raise InputError(f"descriptor plugin {name!r}: {obj!r} is not a DescriptorKind class")
    if obj.kind != name:
        raise InputError(
            f"descriptor plugin {name!r}: its class declares kind {obj.kind!r}; name the entry "
            "point after the kind"
        )
    return register_descriptor(obj)


#: Every descriptor kind, by name (each module of this package registers its own; plugins through
#: the ``oxbench.descriptors`` entry points).
DESCRIPTORS: Registry[type[DescriptorKind]] = Registry(
    "descriptor kind", loader=_load_kinds, group=GROUPS["descriptors"], adopt=_adopt_plugin
)


def register_descriptor(cls: type[DescriptorKind]) -> type[DescriptorKind]:
    """Register the kind ``cls`` under ``cls.kind`` (a kind module calls it at import; usable as a
    class decorator).

    Raises:
        InputError: no kind name, not a frozen dataclass, or the name is taken.
    """
    if not cls.kind:
        raise InputError(f"descriptor kind {cls.__name__} declares no kind name")
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise InputError(f"descriptor kind {cls.__name__} is not a frozen dataclass")
    return DESCRIPTORS.register(cls.kind, cls)


def descriptor_kind(text: str) -> DescriptorKind:
    """The kind ``text`` names, with its defaults (``"cnn"`` -> ``CnnDescriptor()``).

    Raises:
        InputError: an unknown name (with the known ones), or a name of an earlier version.
    """
    name = text.strip()
    if name in RENAMED_KINDS and name not in DESCRIPTORS:
        raise InputError(f"descriptor kind {name!r} is now {RENAMED_KINDS[name]!r}")
    return DESCRIPTORS.get(name)()


#: Descriptor kinds of earlier versions and their names now: ``features`` read the user's
#: descriptor files, a word that also names the local-feature setting and the presets.
RENAMED_KINDS = {"features": "files"}


def descriptor_from_dict(settings: Mapping[str, Any]) -> DescriptorKind:
    """The kind a record's ``descriptor`` dict describes (the inverse of ``to_dict()``).

    Raises:
        InputError: no or an unknown ``kind``, a setting the kind does not have, or a value its
            spec refuses.
    """
    kind = settings.get("kind")
    if not isinstance(kind, str):
        raise InputError(f"descriptor settings without a kind; known kinds: {_known()}")
    cls = DESCRIPTORS.get(kind)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(settings) - names - {"kind"})
    if unknown:
        raise InputError(
            f"descriptor kind {kind} has no setting {unknown[0]!r}; its settings: "
            + ", ".join(sorted(names))
        )
    values = {k: v for k, v in settings.items() if k != "kind"}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if isinstance(default, S.Group) and isinstance(values.get(f.name), Mapping):
            try:  # a nested group of settings, recorded as a dict (descriptor.vocabulary.size)
                values[f.name] = type(default).from_dict(values[f.name])
            except InputError as exc:
                raise InputError(f"descriptor kind {kind}: {f.name}: {exc.problem}") from None
    return cls(**values)


def _known() -> str:
    return ", ".join(sorted(DESCRIPTORS.names()))


def other_kinds_with(setting: str) -> list[str]:
    """The registered kinds that have the sub-setting ``setting`` (its first dotted part)."""
    head = setting.split(".", 1)[0]
    return sorted(
        n
        for n in DESCRIPTORS.names()
        if head in {f.name for f in dataclasses.fields(DESCRIPTORS.get(n))}  # type: ignore[arg-type]
    )


class DescriptorSetting(Spec):
    """The schema of the global family's ``descriptor`` setting: text names a kind (its defaults,
    :func:`descriptor_kind`), a mapping is a record's ``to_dict()`` (:func:`descriptor_from_dict`),
    a kind object (a preset's ``CnnDescriptor(...)``) is taken as it is."""

    _kind: ClassVar[str] = "descriptor kind"

    def _from_text(self, text: str) -> Any:
        try:
            return descriptor_kind(text)
        except InputError as exc:
            return _Refusal(str(exc))

    def _check(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            try:
                return descriptor_from_dict(value)
            except InputError as exc:
                return _Refusal(str(exc))
        if isinstance(value, DescriptorKind):
            return value
        return _Refusal(f"expected a descriptor kind ({_known()})")

    def describe(self) -> str:
        return f"one of {_known()}"

    def unknown_setting(self, value: Any, key: str, method: str) -> str:
        """The one line for ``--set descriptor.X`` where the kind in ``value`` has no ``X``: the
        kinds that have it, else the close matches, and the kind's own settings."""
        sub = key.split(".", 1)[1]
        renamed = getattr(type(value), "renamed", {}).get(sub)
        if renamed is not None:  # a name of an earlier version
            return f"method {method}: {key} is now {DESCRIPTOR_FIELD}.{renamed}"
        names = [f.name for f in dataclasses.fields(value)]
        own = ", ".join(f"{DESCRIPTOR_FIELD}.{n}" for n in names)
        others = [k for k in other_kinds_with(sub) if k != value.kind]
        if others:
            return (
                f"method {method}: {key} is a setting of descriptor kind {' and '.join(others)}, "
                f"and {method} describes images with descriptor={value.kind} (whose settings are "
                f"{own}); switch kinds with --set {DESCRIPTOR_FIELD}={others[0]}"
            )
        near = close_matches(sub, names)
        hint = (
            f"; did you mean {' or '.join(f'{DESCRIPTOR_FIELD}.{n}' for n in near)}?"
            if near
            else ""
        )
        return (
            f"unknown setting {key!r} of descriptor kind {value.kind} ({method}){hint} "
            f"(its settings: {own}; kinds: {_known()})"
        )

    def hint_for(self, field: str, key: str) -> str:
        """For an unknown top-level ``key`` that is a descriptor kind's setting (``pooling``,
        the flat name of earlier versions): where it lives now; else ``""``."""
        kinds, name = other_kinds_with(key), key
        kind, _, rest = key.partition("_")  # vlad_k: a kind's settings carry no kind prefix
        if not kinds and kind in DESCRIPTORS:
            rest = getattr(DESCRIPTORS.get(kind), "renamed", {}).get(rest, rest)
            if kind in other_kinds_with(rest):
                kinds, name = [kind], rest
        if not kinds:
            return ""
        return (
            f"; a descriptor kind's settings are {field}.<name>: {key} is {field}.{name} of "
            f"{' and '.join(kinds)} (--set {field}={kinds[0]} --set {field}.{name}=...)"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DescriptorSetting)

    def __hash__(self) -> int:
        return hash(DescriptorSetting)


#: The one spec of the global family's ``descriptor`` setting.
DESCRIPTOR_SPEC = DescriptorSetting()
