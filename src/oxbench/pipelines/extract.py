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
from oxbench.errors import InputError, require_installed
from oxbench.execution import Executor
from oxbench.execution.shards import check_partition
from oxbench.fileio import atomic_write_json, atomic_write_npy, atomic_write_text, check_output_path
from oxbench.pipelines.method import MethodConfig
from oxbench.pipelines.presets import resolve_method
from oxbench.pipelines.runner import training_set_of
from oxbench.pipelines.session import Session
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
    session: Session | None = None,
    *,
    train_dataset: str | None = None,
    overrides: Mapping[str, object] | None = None,
    distractors: str | int | None = None,
) -> ExtractOutcome:
    """Describe a dataset with a method and write its descriptors to ``out``.

    Args:
        dataset: dataset id.
        method: a preset (or config) of any family; one with one vector per image writes them.
        out: output folder (created; the five files above are replaced atomically).
        session: where it runs (:class:`~oxbench.pipelines.session.Session`: data root, descriptor
            cache -- a second extraction, or a run of the same method, reuses it -- executor,
            progress; ``strict=False`` also lets undecodable images through, named in warnings
            and ``extract.json``, zero descriptors).
        train_dataset: what a method that learns (a VLAD codebook, a whitening) learns on (default:
            the other city, as ``oxbench run``).
        overrides: method settings (``{"descriptor.weights": "model.pt"}``).
        distractors: distractors to describe after the database.

    Raises:
        InputError: missing data or weights, an undecodable image (unless not strict), an
            output path that is not a writable file location.
    """
    session = session if session is not None else Session()
    m = resolve_method(method, **dict(overrides or {}))
    require_installed(m.requires)  # before any data is loaded or generated
    out = Path(out)
    for name in EXTRACT_FILES:
        check_output_path(out / name)
    m.check_inputs(session.data_root)
    with session.executor() as executor:
        return _extract(
            m, dataset, out, session, executor, train_dataset=train_dataset, distractors=distractors
        )


def _extract(
    m: MethodConfig,
    dataset: str,
    out: Path,
    session: Session,
    executor: Executor,
    *,
    train_dataset: str | None,
    distractors: str | int | None,
) -> ExtractOutcome:
    root_path = session.data_root
    bench = load(
        dataset,
        root_path,
        distractors=distractors,
        strict=session.strict,
        progress=session.progress,
        images=m.reads_images,
    )
    ctx = session.context(executor)
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
        train = load(
            train_id,
            root_path,
            strict=session.strict,
            progress=session.progress,
            images=m.reads_images,
        )
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
    if bench.gt.protocol.scores_feature_files:
        info["evaluate"] = (
            f"oxbench evaluate {bench.gt.protocol.command} --dataset {dataset} "
            f"--db-features {out / 'db.npy'} "
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
    session: Session | None = None,
    *,
    overrides: Mapping[str, object] | None = None,
    distractors: str | int | None = None,
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
    session = session if session is not None else Session()
    partition = check_partition(partition)  # type: ignore[assignment]
    m = resolve_method(method, **dict(overrides or {}))
    require_installed(m.requires)
    m.check_inputs(session.data_root)
    done: dict[str, int] = {}
    with session.executor() as executor:
        ids = ([train_dataset] if train_dataset and train_dataset != dataset else []) + [dataset]
        for ds in ids:
            bench = load(
                ds,
                session.data_root,
                distractors=None if ds != dataset else distractors,
                strict=session.strict,
                progress=session.progress,
                images=m.reads_images,
            )
            described = m.build().describe_parts(
                bench, session.context(executor), training=ds != dataset, partition=partition
            )
            done.update({f"{bench.id}/{part}": n for part, n in described.items()})
    if not done:
        raise InputError(f"--partition splits the extraction of images; {m.name} describes none")
    return done
