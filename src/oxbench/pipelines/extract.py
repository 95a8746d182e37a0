"""Describe a dataset with a method, and write its global descriptors to files (``oxbench extract``).

Every method describes images through one step, its
:meth:`~oxbench.pipelines.method.RetrievalMethod.describe_parts` (local-feature stores for bag of
words, HE, ASMK and VLAD; CNN descriptor shards), into the same cached, resumable stores as
``oxbench run``; this module knows no family. A method with one vector per image
(:meth:`~oxbench.pipelines.method.RetrievalMethod.vectors`: a CNN, VLAD, the user's descriptor
files) describes the database, the distractors and the query crops, and the final descriptors
(what the method searches with: whitened when the method whitens, always L2-normalised; query
expansion is a search step and is not applied) are written as::

    <out>/db.npy            float32 [n_db + n_distractors, d]  database rows, then distractors
    <out>/db_names.txt      one image name per row of db.npy
    <out>/queries.npy       float32 [n_queries, d]             described from the query crops
    <out>/query_names.txt   one query image name per row
    <out>/extract.json      dataset, counts, dimension, the resolved method, model provenance

which is what ``oxbench evaluate revisited --dataset ID --db-features <out>/db.npy
--query-features <out>/queries.npy [--distractors N]`` reads. Every file is written atomically and
``extract.json`` last, after every descriptor has been computed. A method without one vector per
image (bag of words, HE, ASMK) fills its local-feature stores in the cache, which its runs then
read, and writes only ``extract.json`` (the images described per part, ``"vectors": false``).

The partition mode (:func:`extract_partition`, ``oxbench extract --partition I/N`` and
``oxbench run --partition I/N``) is for array jobs without a scheduler (SLURM arrays, Kubernetes
indexed jobs): each of N processes describes only its share of the extraction shards (local
features or CNN descriptors; the write-once shards of :mod:`oxbench.execution.shards`; partitions run side
by side on the same cache), and the same command without ``--partition`` then finds every shard
committed and combines.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.datasets import load
from oxbench.datasets.paths import data_root
from oxbench.errors import InputError, require_installed
from oxbench.execution import Executor, available_cores, make_executor
from oxbench.execution.shards import check_partition
from oxbench.features.store import DEFAULT_SHARD_SIZE
from oxbench.fileio import atomic_write_json, atomic_write_npy, atomic_write_text, check_output_path
from oxbench.pipelines.method import MethodConfig, RunContext
from oxbench.pipelines.presets import resolve_method
from oxbench.pipelines.runner import training_set_of
from oxbench.pipelines.steps import part_names

log = logging.getLogger(__name__)

EXTRACT_FILES = ("db.npy", "db_names.txt", "queries.npy", "query_names.txt", "extract.json")


@dataclass(frozen=True)
class ExtractOutcome:
    """What :func:`extract_descriptors` wrote.

    Attributes:
        out: the output folder.
        n_db, n_distractors, n_queries: rows written (images described, for a method without
            one vector per image).
        dim: descriptor dimension (0: no vectors written).
        info: what ``extract.json`` holds.
    """

    out: Path
    n_db: int
    n_distractors: int
    n_queries: int
    dim: int
    info: Mapping[str, Any]


def extract_descriptors(
    dataset: str,
    method: str | MethodConfig,
    out: str | Path,
    *,
    root: str | Path | None = None,
    cache: str | Path | None = None,
    train_dataset: str | None = None,
    overrides: Mapping[str, object] | None = None,
    distractors: str | int | None = None,
    strict: bool = True,
    workers: int | None = 1,
    engine: str = "processes",
    engine_options: Mapping[str, object] | None = None,
    shard_size: int | None = None,
    decode_threads: int | None = None,
    progress: bool = True,
) -> ExtractOutcome:
    """Describe a dataset with a method and write its descriptors to ``out``.

    Args:
        dataset: dataset id.
        method: a preset (or config) of any family; one with one vector per image writes them.
        out: output folder (created; the five files above are replaced atomically).
        root: data root.
        cache: descriptor cache (default ``<root>/_cache``): a second extraction, or a run of the same
            method, reuses it.
        train_dataset: what a method that learns (a VLAD codebook, a whitening) learns on (default:
            the other city, as ``oxbench run``).
        overrides: method settings (``{"weights": "model.pt", "max_side": 512}``).
        distractors: distractors to describe after the database.
        strict: refuse partial datasets; ``False`` also lets undecodable images through (named in
            warnings and ``extract.json``, zero descriptors).
        workers: workers of the parallel stages (SIFT extraction, VLAD aggregation), through
            the ``engine`` executor (:mod:`oxbench.execution`).
        engine: the execution backend (``processes``, ``serial``, ``dask``, or a plugin's).
        engine_options: the backend's own options (:func:`oxbench.execution.make_executor`;
            ``{"address": "tcp://host:8786"}``: an existing Dask scheduler).
        shard_size: images per write-once shard of the local-feature stores (default 64).
        decode_threads: threads that decode images for a CNN (default: the available cores).
        progress: progress bars.

    Raises:
        InputError: missing data or weights, an undecodable image (unless ``strict=False``), an
            output path that is not a writable file location.
    """
    m = resolve_method(method, **dict(overrides or {}))
    require_installed(m.requires)  # before any data is loaded or generated
    out = Path(out)
    for name in EXTRACT_FILES:
        check_output_path(out / name)
    root_path = data_root(root)
    m.check_inputs(root_path)
    cache_dir = Path(cache) if cache is not None else root_path / "_cache"
    executor = make_executor(engine, workers, options=engine_options)
    try:
        executor.check_paths(
            {"data root": root_path, "cache": cache_dir}
        )  # before anything is loaded
        return _extract(
            m,
            dataset,
            out,
            root_path,
            cache_dir,
            executor,
            train_dataset=train_dataset,
            distractors=distractors,
            strict=strict,
            decode_threads=decode_threads,
            progress=progress,
            shard_size=shard_size,
        )
    finally:
        executor.close()


def _context(
    cache_dir: Path,
    executor: Executor,
    root_path: Path,
    *,
    strict: bool,
    progress: bool,
    decode_threads: int | None = None,
    shard_size: int | None = None,
) -> RunContext:
    """The run context of an extraction (as ``oxbench run`` sets it up for its steps)."""
    return RunContext(
        cache_dir,
        executor=executor,
        progress=progress,
        allow_partial=not strict,
        root=root_path,
        decode_threads=decode_threads or available_cores(),
        shard_size=shard_size or DEFAULT_SHARD_SIZE,
    )


def _extract(
    m: MethodConfig,
    dataset: str,
    out: Path,
    root_path: Path,
    cache_dir: Path,
    executor: Executor,
    *,
    train_dataset: str | None,
    distractors: str | int | None,
    strict: bool,
    decode_threads: int | None,
    progress: bool,
    shard_size: int | None,
) -> ExtractOutcome:
    bench = load(
        dataset,
        root_path,
        distractors=distractors,
        strict=strict,
        progress=progress,
        images=m.reads_images,
    )
    ctx = _context(
        cache_dir,
        executor,
        root_path,
        strict=strict,
        progress=progress,
        decode_threads=decode_threads,
        shard_size=shard_size,
    )
    impl = m.build()
    parts = ["database"] + (["distractors"] if bench.distractors is not None else [])
    info: dict[str, Any] = {
        "dataset": dataset,
        "n_db": bench.gt.n_db,
        "n_distractors": bench.n_distractors,
        "n_queries": bench.gt.n_queries,
    }
    if not impl.offers_vectors:  # the describe step alone: the stores its runs will read
        described = impl.describe_parts(bench, ctx)
        info.update(method=m.to_dict(), vectors=False, described=described, steps=dict(ctx.steps))
        atomic_write_json(out / "extract.json", info)
        log.info("described %s into the cache of %s", described, m.name)
        return ExtractOutcome(out, bench.gt.n_db, bench.n_distractors, bench.gt.n_queries, 0, info)
    train_id = training_set_of(m, dataset, train_dataset)
    train = None
    if train_id is not None:
        train = load(train_id, root_path, strict=strict, progress=progress, images=m.reads_images)
    impl.fit(train, ctx)
    db = impl.vectors(bench, parts, ctx)
    queries = impl.vectors(bench, ["queries"], ctx)
    db_names = [n for p in parts for n in part_names(bench, p)]
    info.update(
        n_queries=int(queries.shape[0]),
        dim=int(db.shape[1]),
        dtype="float32",
        crop=bench.crop,
        method=m.to_dict(),
        train_dataset=None if train is None else train.id,
        provenance=impl.provenance(),
        steps=dict(ctx.steps),
    )
    if "revisited" in bench.protocols:
        info["evaluate"] = (
            f"oxbench evaluate revisited --dataset {dataset} --db-features {out / 'db.npy'} "
            f"--query-features {out / 'queries.npy'}"
            + (f" --distractors {bench.n_distractors}" if bench.n_distractors else "")
        )
    atomic_write_npy(out / "db.npy", db.astype(np.float32))
    atomic_write_text(out / "db_names.txt", "".join(f"{n}\n" for n in db_names))
    atomic_write_npy(out / "queries.npy", queries.astype(np.float32))
    atomic_write_text(
        out / "query_names.txt", "".join(f"{n}\n" for n in part_names(bench, "queries"))
    )
    atomic_write_json(out / "extract.json", info)
    log.info(
        "wrote %d database and %d query descriptors (%d-D) to %s",
        db.shape[0],
        queries.shape[0],
        db.shape[1],
        out,
    )
    return ExtractOutcome(
        out, bench.gt.n_db, bench.n_distractors, int(queries.shape[0]), int(db.shape[1]), info
    )


def extract_partition(
    dataset: str,
    method: str | MethodConfig,
    partition: tuple[int, int],
    *,
    root: str | Path | None = None,
    cache: str | Path | None = None,
    overrides: Mapping[str, object] | None = None,
    distractors: str | int | None = None,
    strict: bool = True,
    workers: int | None = 1,
    engine: str = "processes",
    engine_options: Mapping[str, object] | None = None,
    shard_size: int | None = None,
    progress: bool = True,
    train_dataset: str | None = None,
) -> dict[str, int]:
    """Compute partition ``I`` of ``N`` of a run's extraction shards, and stop.

    The extraction is what a method describes images with: the local features of every part (bag
    of words, ASMK, VLAD), or a CNN's descriptors of every part. With ``train_dataset`` the
    training set is described too (what ``oxbench run --partition`` does: everything the run
    will read). Each planned shard belongs to the partition ``shard number % N``; shards already
    committed are skipped, so a partition re-run after a failure does only what is missing. Run
    every partition (at the same time or not, on any machines sharing the cache), then the command
    without a partition: it finds the shards committed and goes on.

    Returns:
        ``{"<dataset id>/<part>": images described}``.

    Raises:
        InputError: a method that describes no images (descriptor files), a bad partition,
            missing data.
    """
    partition = check_partition(partition)  # type: ignore[assignment]
    m = resolve_method(method, **dict(overrides or {}))
    require_installed(m.requires)
    root_path = data_root(root)
    m.check_inputs(root_path)
    cache_dir = Path(cache) if cache is not None else root_path / "_cache"
    executor: Executor = make_executor(engine, workers, options=engine_options)
    done: dict[str, int] = {}
    with executor:
        executor.check_paths(
            {"data root": root_path, "cache": cache_dir}
        )  # before anything is loaded
        ids = ([train_dataset] if train_dataset and train_dataset != dataset else []) + [dataset]
        for ds in ids:
            bench = load(
                ds,
                root_path,
                distractors=None if ds != dataset else distractors,
                strict=strict,
                progress=progress,
                images=m.reads_images,
            )
            ctx = _context(
                cache_dir,
                executor,
                root_path,
                strict=strict,
                progress=progress,
                shard_size=shard_size,
            )
            described = m.build().describe_parts(
                bench, ctx, training=ds != dataset, partition=partition
            )
            done.update({f"{bench.id}/{part}": n for part, n in described.items()})
    if not done:
        raise InputError(f"--partition splits the extraction of images; {m.name} describes none")
    return done
