"""Estimates before the work: the RAM, disk and CPU time a run will take, and its refusals.

The runner calls :func:`preflight` once the dataset is loaded and before any feature is extracted:

- **RAM** of the index at the build's peak. A family over local features states its measured cost
  per database feature (:meth:`~oxbench.pipelines.method.MethodConfig.ram_bytes_per_feature`); it
  is multiplied by the dataset's *actual* feature counts where its images are already described
  (the feature stores in the cache) and by the extractor's cap only for the images not described
  yet, plus the 8-byte words offset of every image. Other families give a bound per image
  (:meth:`~oxbench.pipelines.method.MethodConfig.ram_bytes_per_image`).
- **Disk** the run adds to the cache: the feature store (16 bytes of keypoint and the stored
  descriptor per feature) and the visual words (an ``int32`` word and a ``float32`` distance per
  assigned word) of the images not described yet, at the cap.
- **CPU time**: the images not described yet at :data:`DESCRIBE_CPU_S` each.
- **Streamed search** (``search=mapped``, :mod:`oxbench.index.mapped`): where the searched
  dimension is known from the settings, the shards' disk (counted with the new files), the
  working-set bound ``search.ram_gb`` and the CPU time of the queries at the measured cost a vector
  (:func:`~oxbench.index.mapped.scale_plan`), announced when long.

A run whose RAM exceeds what is available, or whose new files exceed the free space of the cache's
file system (:func:`free_disk_bytes`), is refused with one line naming the remedies its family
accepts (each checked by building the remedied config: :func:`ram_remedies`); a run estimated at
more than :data:`ANNOUNCE_CPU_S` seconds of CPU is announced in a log line before it starts.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oxbench.errors import InputError
from oxbench.index.footprint import available_ram, check_ram, gib

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.pipelines.method import MethodConfig

log = logging.getLogger(__name__)

#: RAM per indexed image besides its features: the offset of its words in the mapped words file.
WORDS_OFFSET_BYTES = 8
#: Disk per stored feature besides its descriptor: the keypoint (``float32`` x, y, size, angle).
KEYPOINT_BYTES = 16
#: Disk per assigned word in a words file: an ``int32`` word and a ``float32`` squared distance.
WORD_BYTES = 8
#: CPU seconds to describe one image and assign its words, measured on the synthetic set at
#: 512x384 (render, RootSIFT, words: 0.13-0.14 CPU-s a distractor and ~0.01 for its words;
#: bench/README.md, "The scale curve"). Photos at 1024 px take several times longer.
DESCRIBE_CPU_S = 0.15
#: A run estimated at more CPU seconds than this is announced before it starts.
ANNOUNCE_CPU_S = 180.0
#: Settings that lower an index's RAM, tried on a refused config in this order; a remedy is named
#: only when the family has the setting, accepts the value and then fits.
RAM_REMEDY_SETTINGS: tuple[tuple[str, str], ...] = (
    ("inverted_file", "mapped"),
    ("search", "faiss-ivfpq"),
)
#: The presets named beside a remedy: the same method with the remedy set.
REMEDY_PRESETS = {("rootsift-bow-sv", "inverted_file", "mapped"): "rootsift-bow-sv-compact"}


def free_disk_bytes(path: str | Path) -> int:
    """Bytes free to this user on the file system that holds ``path`` (its nearest existing
    folder when it does not exist yet). The one place the pre-flight reads free space, so a test
    can state it."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return int(shutil.disk_usage(p).free)


@dataclass(frozen=True)
class FeatureCounts:
    """The local features of an index's images, as far as they are known before the run.

    Attributes:
        n_images: images indexed (database plus distractors).
        described: those already in a feature store.
        features: the features of the described images (their actual counts).
        cap: the extractor's cap per image (0: no cap, so the rest cannot be bounded).
    """

    n_images: int
    described: int
    features: int
    cap: int

    @property
    def undescribed(self) -> int:
        """Images not yet described."""
        return self.n_images - self.described

    @property
    def bound(self) -> int | None:
        """At most this many features in the index: the actual counts, the cap for the rest;
        ``None`` when some image is not described and there is no cap."""
        if self.undescribed and not self.cap:
            return None
        return self.features + self.undescribed * self.cap


@dataclass(frozen=True)
class RunEstimate:
    """What :func:`estimate_run` projects for one run.

    Attributes:
        n_index: images indexed.
        ram_bytes: the index's RAM at the build's peak (``None``: the family gives no bound).
        ram_basis: how ``ram_bytes`` was made (said in a refusal).
        new_disk_bytes: what the run adds to the cache (features and words of new images).
        cpu_s: CPU seconds of describing the new images.
        counts: the feature counts used (``None``: the method has no local features).
        search: with ``search=mapped`` and a known dimension, the streamed search's plan
            (:class:`~oxbench.index.mapped.ScalePlan` as a dict: ``disk_bytes``, ``ram_bytes``,
            ``cpu_s`` of all the benchmark's queries ...); its disk is in ``new_disk_bytes``.
    """

    n_index: int
    ram_bytes: int | None
    ram_basis: str
    new_disk_bytes: int
    cpu_s: float
    counts: FeatureCounts | None
    search: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (the run's log and ``--json`` readers)."""
        return dataclasses.asdict(self)


def _extractor(m: MethodConfig) -> Any:
    from oxbench.features.local import LocalExtractor

    features = getattr(m, "features", None)
    return features if isinstance(features, LocalExtractor) else None


def feature_counts(m: MethodConfig, bench: Benchmark, cache: Path) -> FeatureCounts | None:
    """The actual feature counts of ``bench``'s database and distractors where their feature
    stores in ``cache`` hold them (nothing is created or described); ``None`` when the method
    reads no local features."""
    from oxbench.cache import CorruptCache
    from oxbench.pipelines.steps.keys import part_names, parts_of
    from oxbench.pipelines.steps.local import open_store

    extractor = _extractor(m)
    if extractor is None:
        return None
    n_images = described = features = 0
    for part in parts_of(bench, queries=False):
        names = part_names(bench, part)
        n_images += len(names)
        try:
            store = open_store(cache, bench, extractor, part, create=False)
        except (InputError, CorruptCache):  # no store yet (or one to be rebuilt): nothing known
            continue
        for name in names:
            if name in store:
                described += 1
                features += store.count(name)
    return FeatureCounts(n_images, described, features, int(getattr(extractor, "n_features", 0)))


def _ram(m: MethodConfig, n_index: int, counts: FeatureCounts | None) -> tuple[int | None, str]:
    per_feature = m.ram_bytes_per_feature()
    bound = None if counts is None else counts.bound
    if per_feature is not None and counts is not None and bound is not None:
        ram = int(per_feature * bound) + WORDS_OFFSET_BYTES * n_index
        if counts.undescribed:
            how = (
                f"{counts.features:,} features of {counts.described:,} described images and "
                f"the cap of {counts.cap:,} for {counts.undescribed:,} not yet described"
            )
        else:
            how = f"the {counts.features:,} features of its images"
        return ram, f"{per_feature:g} bytes a feature by {m.name}'s build, {how}"
    per_image = m.ram_bytes_per_image()
    if per_image is None:
        return None, ""
    return per_image * n_index, f"at most {per_image:,} bytes per image by {m.name}'s settings"


def _disk_per_feature(m: MethodConfig) -> int:
    """Bytes on disk per new feature: its keypoint and stored descriptor, and its words."""
    import numpy as np

    extractor = _extractor(m)
    if extractor is None:
        return 0
    store = KEYPOINT_BYTES + int(extractor.dim) * np.dtype(extractor.stored_dtype).itemsize
    words = m.ram_bytes_per_feature() is not None  # a quantising family keeps words files
    k = getattr(getattr(m, "assignment", None), "words", 1)  # words per database feature
    return store + (WORD_BYTES * k if words else 0)


def searched_dim(m: MethodConfig) -> int | None:
    """The dimension a global method searches, when its settings fix it (else ``None``)."""
    raw = getattr(getattr(m, "descriptor", None), "dim", None)
    if raw is None:
        return None
    wdim = getattr(m, "whitening_dim", None)
    return int(min(wdim or raw, raw)) if getattr(m, "whitening", "none") != "none" else int(raw)


def streamed_search_plan(m: MethodConfig, n_index: int, n_queries: int) -> dict[str, Any] | None:
    """The plan of ``m``'s streamed search (``search=mapped``) over ``n_index`` images for
    ``n_queries`` queries, or ``None`` (another search, or a dimension the settings leave open)."""
    from oxbench.index.mapped import MappedSearch, scale_plan

    st = getattr(m, "search", None)
    dim = searched_dim(m)
    if not isinstance(st, MappedSearch) or dim is None or n_index < 1:
        return None
    k = getattr(m, "list_length", None) or 100
    plan = scale_plan(n_index, dim, max(n_queries, 1), k=k, dtype=st.dtype, ram_gb=st.ram_gb)
    return dataclasses.asdict(plan)


def estimate_run(m: MethodConfig, bench: Benchmark, cache: Path) -> RunEstimate:
    """RAM, new disk and CPU time of running ``m`` on ``bench`` with the cache ``cache`` (module
    docstring); reads the feature stores' indexes only."""
    counts = feature_counts(m, bench, cache)
    n_index = bench.n_index
    ram, basis = _ram(m, n_index, counts)
    new = 0 if counts is None else counts.undescribed
    disk = new * counts.cap * _disk_per_feature(m) if counts is not None else 0
    search = streamed_search_plan(m, n_index, bench.gt.n_queries)
    if search is not None:
        disk += search["disk_bytes"]
    return RunEstimate(n_index, ram, basis, int(disk), new * DESCRIBE_CPU_S, counts, search)


def ram_remedies(m: MethodConfig, bench: Benchmark, cache: Path, available: int) -> list[str]:
    """The settings, among :data:`RAM_REMEDY_SETTINGS`, that ``m``'s family accepts and that bring
    its estimate within ``available`` bytes, as ``--set KEY=VALUE`` (with the preset that has it)."""
    out = []
    counts = feature_counts(m, bench, cache)  # a remedy changes the index, not the features
    fields = {f.name for f in dataclasses.fields(m)}  # type: ignore[arg-type]
    for key, value in RAM_REMEDY_SETTINGS:
        if key not in fields or getattr(m, key) == value:
            continue
        try:
            fixed = dataclasses.replace(m, **{key: value})  # type: ignore[type-var]
        except (InputError, ValueError, TypeError):  # the family refuses it with these settings
            continue
        ram, _ = _ram(fixed, bench.n_index, counts)
        if ram is not None and ram <= available:
            preset = REMEDY_PRESETS.get((m.name, key, value))
            out.append(f"--set {key}={value}" + (f" (the preset {preset})" if preset else ""))
    return out


def preflight(
    m: MethodConfig,
    bench: Benchmark,
    cache: Path,
    *,
    available: int | None = None,
    free_disk: int | None = None,
) -> RunEstimate:
    """Refuse a run that will not fit, and announce a long one, before any work.

    Args:
        m: the method config.
        bench: the loaded benchmark (database and distractors named, nothing described).
        cache: the cache the run writes into.
        available: bytes of RAM available (default :func:`~oxbench.index.footprint.available_ram`).
        free_disk: bytes free for the cache (default :func:`free_disk_bytes`).

    Returns:
        The :class:`RunEstimate`.

    Raises:
        InputError: one line: the RAM or the disk will not hold the run, with the remedies.
    """
    est = estimate_run(m, bench, cache)
    # the streamed search's plan first: said even when the RAM or the disk refuses the run
    if est.search is not None and est.search["cpu_s"] > ANNOUNCE_CPU_S:
        p = est.search
        log.warning(
            "estimate: the streamed search (search=mapped) of %s queries over %s x %s %s takes "
            "about %.1f CPU-hours (%.2f CPU-s a query, %.2f ns a vector and dimension as measured "
            "here), reads %s of shards a query batch, and holds at most %s",
            f"{p['n_queries']:,}",
            f"{p['n']:,}",
            p["dim"],
            p["dtype"],
            p["cpu_s"] / 3600,
            p["cpu_s"] / p["n_queries"],
            p["cpu_s"] / p["n_queries"] / p["n"] / p["dim"] * 1e9,
            gib(p["disk_bytes"]),
            gib(p["ram_bytes"]),
        )
    if est.ram_bytes is not None:
        ram_free = available_ram() if available is None else available
        remedies = ram_remedies(m, bench, cache, ram_free) if est.ram_bytes > ram_free else []
        check_ram(
            est.ram_bytes, est.n_index, basis=est.ram_basis, available=ram_free, remedies=remedies
        )
    if est.new_disk_bytes:
        disk_free = free_disk_bytes(cache) if free_disk is None else free_disk
        if est.new_disk_bytes > disk_free and est.search is not None:
            p = est.search
            raise InputError(
                f"the run would add about {gib(est.new_disk_bytes)} to the cache, "
                f"{gib(p['disk_bytes'])} of them the streamed search's shards ({p['n']:,} x "
                f"{p['dim']} {p['dtype']}), more than the {gib(disk_free)} free for the cache "
                f"{cache}; put the cache on a larger disk (--cache)"
                + (", set search.dtype=float16" if p["dtype"] == "float32" else "")
                + ", or use fewer distractors"
            )
        if est.new_disk_bytes > disk_free:
            assert est.counts is not None
            raise InputError(
                f"the run would add about {gib(est.new_disk_bytes)} of features and words for "
                f"{est.counts.undescribed:,} new images (at the cap of {est.counts.cap:,} "
                f"features), more than the {gib(disk_free)} free for the cache {cache}; free some "
                "space, put the cache on a larger disk (--cache), or use fewer distractors"
            )
    if est.cpu_s > ANNOUNCE_CPU_S:
        assert est.counts is not None
        log.warning(
            "estimate: describing %s new images takes about %.1f CPU-hours (%.2f CPU-s each, "
            "measured on the synthetic set at 512x384) and adds up to %s to the cache (%s free)",
            f"{est.counts.undescribed:,}",
            est.cpu_s / 3600,
            DESCRIBE_CPU_S,
            gib(est.new_disk_bytes),
            gib(free_disk_bytes(cache) if free_disk is None else free_disk),
        )
    return est
