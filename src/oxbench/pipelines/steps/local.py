"""Step: local features of a benchmark's parts, into resumable feature stores.

``<cache>/<dataset-key>/features/<extractor digest>/<part>/`` holds one
:class:`~oxbench.features.store.FeatureStore` per part (database, query crops, distractors), filled
by any :class:`~oxbench.features.local.LocalExtractor` through the run's executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.features.extractors.files import LocalFeatureFiles, ReadFeatures
from oxbench.features.local import ExtractionJob, LocalExtractor, reads_pixels
from oxbench.features.store import DescribeImages, DescribeQueries, FeatureStore, extract_to_store
from oxbench.formats.local_features import close_files
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps.keys import PARTS, StepResult, dataset_key, part_names, parts_of


def extraction_job(
    bench: Benchmark, part: str, extractor: LocalExtractor, *, allow_partial: bool = False
) -> tuple[ExtractionJob, int, dict[str, object]]:
    """The extraction job of one part, its size, and what identifies its store.

    Features read from files (an extractor with ``reads_images = False``) are read by image name,
    a query's restricted to its box; every other extractor describes the pixels
    (``allow_partial``: images that cannot be read are skipped, :class:`DescribeImages`).
    """
    if not reads_pixels(extractor):
        names = part_names(bench, part)
        extra: dict[str, object] = {"role": part}
        boxes = None
        if part == "queries":
            extra["crop"] = bench.crop
            boxes = [q.bbox for q in bench.gt.queries]
        assert isinstance(extractor, LocalFeatureFiles)
        return ReadFeatures(extractor, names, boxes, bench.crop), len(names), extra
    if part == "database":
        return (
            DescribeImages(bench.database, extractor, allow_partial=allow_partial),
            len(bench.database),
            {"role": "database"},
        )
    if part == "queries":
        return (
            DescribeQueries(bench, extractor, allow_partial=allow_partial),
            bench.gt.n_queries,
            {"role": "queries", "crop": bench.crop},
        )
    if part == "distractors":
        if bench.distractors is None:
            raise InputError(f"{bench.id} has no distractors")
        return (
            DescribeImages(bench.distractors, extractor, allow_partial=allow_partial),
            len(bench.distractors),
            {"role": "distractors"},
        )
    raise InputError(f"unknown part {part!r}; use one of {PARTS}")


def features_dir(cache: Path, bench: Benchmark, extractor: LocalExtractor, part: str) -> Path:
    """Where the feature store of one part of a benchmark lives."""
    return Path(cache) / dataset_key(bench) / "features" / extractor.digest() / part


def open_store(
    cache: Path, bench: Benchmark, extractor: LocalExtractor, part: str, *, create: bool = False
) -> FeatureStore:
    """Open the feature store of one part (``create=False``: it must exist)."""
    _, _, extra = extraction_job(bench, part, extractor)
    return FeatureStore.open(
        features_dir(cache, bench, extractor, part),
        extractor,
        extra={**extra, "dataset": bench.id},
        create=create,
    )


def step_features(
    bench: Benchmark,
    extractor: LocalExtractor,
    ctx: RunContext,
    *,
    parts: Sequence[str] | None = None,
    partition: tuple[int, int] | None = None,
) -> dict[str, StepResult]:
    """Describe the database, the query crops (and distractors) of a benchmark; resumable.

    Images already in a complete shard are skipped; the rest are described through
    ``ctx.executor``. A part is a cache hit only when no image of it had to be described, so an
    extraction interrupted earlier is recorded as computed on the run that finishes it.

    Args:
        bench: the benchmark.
        extractor: the local feature.
        ctx: cache folder, executor, progress, full checks.
        parts: which parts (default: database, queries, and distractors when present).
        partition: ``(i, n)``: only the planned shards numbered ``i`` modulo ``n`` (an array
            job's share, :meth:`~oxbench.pipelines.method.RetrievalMethod.describe_parts`).

    Returns:
        ``{part: StepResult(store folder, hit, images described)}``.
    """
    out: dict[str, StepResult] = {}
    for part in parts if parts is not None else parts_of(bench):
        job, n, _ = extraction_job(bench, part, extractor, allow_partial=ctx.allow_partial)
        store = open_store(ctx.cache, bench, extractor, part, create=True)
        described = extract_to_store(
            job,
            n,
            store,
            executor=ctx.executor,
            progress=ctx.progress,
            desc=f"{bench.id} {part}" + (f" {partition[0]}/{partition[1]}" if partition else ""),
            full_check=ctx.full_check,
            shard_size=ctx.shard_size,
            verify_images=ctx.verify_images,
            partition=partition,
        )
        out[part] = StepResult(store.directory, hit=described == 0, computed=described)
    if not reads_pixels(extractor):
        close_files()  # the features files this process opened to read them
    return out
