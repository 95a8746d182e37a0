"""FAISS IVF-PQ built by shards: train once, add each shard to an empty copy, merge with FAISS.

At a million images the database vectors of an IVF-PQ index need not be in one process, nor its
inverted lists in RAM. The index is built the way FAISS's own large-scale recipe builds it:

1. :func:`train_ivfpq` -- the coarse quantiser and the product quantiser are trained once, on the
   database or a sample of it, giving a trained *empty* index;
2. :class:`ShardAdder` -- a picklable job of the write-once shard protocol (:mod:`oxbench.execution.shards`):
   each planned shard (a contiguous range of database positions) adds its vectors, with their
   positions as ids (``add_with_ids``), to its own copy of the trained index, writes it into a
   temporary folder and commits the folder by one rename, returning a small receipt; shards run
   through any :class:`~oxbench.execution.Executor`, and an interrupted build reuses the shards it
   committed;
3. :func:`merge_shards` -- the shard files are merged in shard order into a copy of the trained
   index with FAISS's ``merge_from`` (in RAM), or with ``faiss.contrib.ondisk.merge_ondisk`` into
   on-disk inverted lists (memory-mapped at search time) when they would not fit.

Each vector's code depends only on the vector and the trained quantisers, and merging appends the
shards' list entries in shard order, so the merged index holds the same codes, in the same order,
as an index built in one piece by adding the vectors in position order -- and answers every query
the same.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.execution.shards import (
    ShardReceipt,
    ShardTask,
    check_shard_size,
    plan_digest,
    plan_shards,
    run_shard_tasks,
)
from oxbench.fileio import commit_folder, discard_folder, file_sha256, make_folder, make_temp_folder

log = logging.getLogger(__name__)

#: Database vectors per shard when none is given.
DEFAULT_SHARD_VECTORS = 65536


def _faiss(threads: int | None = None) -> Any:
    from oxbench.index.faiss_setup import load_faiss

    return load_faiss(threads)


def train_ivfpq(
    train: NDArray[np.float32],
    d: int,
    nlist: int,
    m: int,
    nbits: int,
    *,
    seed: int = 0,
    what: str = "the training set",
) -> Any:
    """A trained, empty inner-product ``IndexIVFPQ`` (coarse k-means, then PQ codebooks on ``train``;
    ``what`` names it in messages).

    Raises:
        InputError: fewer training vectors than ``nlist`` or than one PQ codebook needs, ``m`` not
            dividing ``d``.
    """
    faiss = _faiss()
    n = train.shape[0]
    if nlist > n:
        raise InputError(f"IVF-PQ: nlist {nlist} is larger than {what} ({n} vectors)")
    if d % m:
        raise InputError(f"IVF-PQ: m {m} does not divide the dimension {d}")
    if n < (1 << nbits):
        raise InputError(
            f"IVF-PQ: training a {nbits}-bit product quantiser needs at least {1 << nbits} vectors, "
            f"{what} has {n}"
        )
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFPQ(quantizer, d, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.pq.cp.seed = seed
    index.train(np.ascontiguousarray(train, dtype=np.float32))
    return index


def serialize(index: Any) -> NDArray[np.uint8]:
    """FAISS's serialisation of ``index`` (picklable bytes for a job)."""
    return np.asarray(_faiss().serialize_index(index), dtype=np.uint8)


#: The file of a committed IVF-PQ shard folder.
SHARD_FILE = "index.faiss"


@dataclass(frozen=True)
class AddTask:
    """One planned shard of vectors to add: its plan entry (item indices = database positions) and
    the vectors (named by its shard in messages, never by its data)."""

    task: ShardTask
    vectors: NDArray[np.float32]

    def __str__(self) -> str:
        return str(self.task)


@dataclass(frozen=True)
class ShardAdder:
    """The job of one shard (:mod:`oxbench.execution.shards` protocol): add its vectors, with their database
    positions as ids, to a copy of the trained index, write it into a temporary folder and commit
    the folder by one rename (the first commit wins); return the receipt (the file's digest).

    Attributes:
        trained: :func:`serialize` of the trained empty index.
        folder: the shard folders' parent.
        plan: the plan's digest; tag: this build's token (in temporary folder names).
    """

    trained: NDArray[np.uint8]
    folder: str
    plan: str = ""
    tag: str = ""

    def __call__(self, item: AddTask) -> ShardReceipt:
        t0 = time.perf_counter()
        task, x = item.task, np.ascontiguousarray(item.vectors, dtype=np.float32)
        faiss = _faiss()
        index = faiss.deserialize_index(self.trained)
        if index.ntotal:
            raise InputError("a shard must start from the trained, empty index")
        if x.shape[0] != len(task.items):
            raise InputError(f"{task}: {x.shape[0]} vectors for {len(task.items)} positions")
        index.add_with_ids(x, np.asarray(task.items, dtype=np.int64))
        final = Path(self.folder) / task.folder
        tmp = make_temp_folder(final, tag=self.tag)
        try:
            faiss.write_index(index, str(tmp / SHARD_FILE))
            digest = file_sha256(tmp / SHARD_FILE)
        except BaseException:
            discard_folder(tmp)
            raise
        committed = commit_folder(tmp, final)
        return ShardReceipt(
            task.number,
            task.folder,
            len(task.items),
            len(task.items),
            digest,
            committed,
            time.perf_counter() - t0,
        )


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each shard of ``n`` positions, ``shard_size`` each (the last shorter).

    Example:
        >>> shard_ranges(10, 4)
        [(0, 4), (4, 8), (8, 10)]
    """
    if shard_size < 1:
        raise InputError(f"shard size must be >= 1, got {shard_size}")
    return [(s, min(s + shard_size, n)) for s in range(0, n, shard_size)]


def _committed_receipt(folder: Path, task: ShardTask) -> ShardReceipt | None:
    """The receipt of a shard committed by an earlier, interrupted build, if it holds exactly the
    task's positions (else it is deleted, with a warning, to be added again)."""
    path = folder / task.folder / SHARD_FILE
    if not path.is_file():
        return None
    try:
        ids, _ = list_contents(_faiss().read_index(str(path)))
        ok = sorted(np.concatenate(ids).tolist()) == list(task.items)
    except Exception:  # noqa: BLE001 - whatever FAISS raises on a damaged file
        ok = False
    if not ok:
        log.warning(
            "%s: IVF-PQ shard does not hold its positions (damaged?); adding it again", path
        )
        discard_folder(path.parent)
        return None
    return ShardReceipt(
        task.number, task.folder, len(task.items), len(task.items), file_sha256(path), False
    )


def build_shards(
    trained: Any,
    vectors: NDArray[np.float32],
    folder: str | Path,
    *,
    shard_size: int = DEFAULT_SHARD_VECTORS,
    executor: Any = None,
    progress: bool = False,
) -> list[ShardReceipt]:
    """Add ``vectors`` (ids: their positions) shard by shard to copies of ``trained``, one committed
    shard folder each (:mod:`oxbench.execution.shards`): shards committed by an earlier, interrupted build
    of the same folder are reused, the others run through ``executor``.

    Args:
        trained: the trained, empty index (:func:`train_ivfpq`).
        vectors: ``float32 [n, d]``.
        folder: the shard folders' parent (one per trained index and database).
        shard_size: vectors per shard.
        executor: where the shards run (:mod:`oxbench.execution`; default: this process).

    Returns:
        The receipts, in shard order.
    """
    make_folder(folder)
    folder = Path(folder)
    names = [str(i) for i in range(vectors.shape[0])]
    tasks = plan_shards(names, check_shard_size(shard_size))
    receipts: dict[int, ShardReceipt] = {}
    todo = []
    for task in tasks:
        found = _committed_receipt(folder, task)
        if found is None:
            todo.append(task)
        else:
            receipts[task.number] = found
    if todo:
        tag = uuid.uuid4().hex[:12]
        job = ShardAdder(
            serialize(trained), str(folder), plan=plan_digest(names, shard_size), tag=tag
        )
        items = [AddTask(t, vectors[t.items[0] : t.items[-1] + 1]) for t in todo]
        done = run_shard_tasks(
            job,  # type: ignore[arg-type]
            items,  # type: ignore[arg-type]
            folder,
            tag,
            executor=executor,
            desc="IVF-PQ shards",
            progress=progress,
        )
        receipts.update({r.number: r for r in done})
    return [receipts[t.number] for t in tasks]


def merge_shards(
    trained: Any,
    receipts: Sequence[ShardReceipt],
    folder: str | Path,
    *,
    ondisk: str | Path | None = None,
) -> Any:
    """The shards merged, in receipt order, into a copy of the trained index.

    Args:
        trained: the trained, empty index the shards started from.
        receipts: :func:`build_shards`'s receipts.
        folder: the shard folders' parent.
        ondisk: a file for on-disk inverted lists (``faiss.contrib.ondisk.merge_ondisk``; the
            index then reads its lists from that file, memory-mapped); ``None``: lists in RAM
            (``merge_from``).

    Raises:
        InputError: a shard file missing or changed since it was written, shards that do not
            follow each other (a gap or a repeat).
    """
    faiss = _faiss()
    expected, total = 0, 0
    paths = []
    for r in receipts:
        path = Path(folder) / r.folder / SHARD_FILE
        if not path.is_file():
            raise InputError(
                "IVF-PQ shard file is missing (deleted since it was written?); rebuild the index",
                path,
            )
        if r.number != expected:
            raise InputError(
                f"IVF-PQ shards do not follow each other: expected shard {expected}, got {r.number}",
                path,
            )
        if file_sha256(path) != r.digest:
            raise InputError(
                "IVF-PQ shard file changed since it was written; rebuild the index", path
            )
        expected += 1
        total += r.images
        paths.append(path)
    out = faiss.clone_index(trained)
    if out.ntotal:
        raise InputError("the shards must be merged into the trained, empty index")
    if ondisk is not None:
        from faiss.contrib.ondisk import merge_ondisk

        merge_ondisk(out, [str(p) for p in paths], str(ondisk))
    else:
        for path in paths:
            shard = faiss.read_index(str(path))
            out.merge_from(shard, 0)  # add_id 0: the ids the shard was given (positions) are kept
    if out.ntotal != total:
        raise InputError(f"merged IVF-PQ index holds {out.ntotal} vectors, the shards {total}")
    return out


def list_contents(index: Any) -> tuple[list[NDArray[np.int64]], list[NDArray[np.uint8]]]:
    """The ids and codes of every inverted list of an IVF index, in list order (for comparisons)."""
    faiss = _faiss()
    ivf = faiss.extract_index_ivf(index)
    invlists = ivf.invlists
    ids, codes = [], []
    for li in range(ivf.nlist):
        n = invlists.list_size(li)
        ids.append(
            faiss.rev_swig_ptr(invlists.get_ids(li), n).copy().astype(np.int64)
            if n
            else np.zeros(0, np.int64)
        )
        codes.append(
            faiss.rev_swig_ptr(invlists.get_codes(li), n * invlists.code_size).copy()
            if n
            else np.zeros(0, np.uint8)
        )
    return ids, codes


def build_ivfpq(
    vectors: NDArray[np.float32],
    settings: Any,
    folder: str | Path,
    *,
    shard_size: int | None = None,
    executor: Any = None,
    progress: bool = False,
    ondisk: bool = False,
) -> Any:
    """A :class:`~oxbench.index.search.FaissIndex` IVF-PQ over ``vectors`` built by shards.

    Trains on ``vectors`` (as :meth:`FaissIndex.fit <oxbench.index.search.FaissIndex.fit>` does),
    adds them shard by shard through ``executor`` (:func:`build_shards`, files under ``folder``)
    and merges the shards (:func:`merge_shards`; with ``ondisk``, into ``folder/lists.ivfdata``).
    The shard files are removed once merged (the merged index is what is kept).

    Args:
        vectors: ``float32 [n, d]`` database vectors (ids: positions).
        settings: the IVF-PQ's :class:`~oxbench.index.search.IvfPqSearch` settings.
        shard_size: vectors per shard (default :data:`DEFAULT_SHARD_VECTORS`).
    """
    from oxbench.index.search import FaissIndex, _as_matrix

    x = _as_matrix(vectors, "database vectors")
    if x.shape[0] == 0:
        raise InputError("cannot index an empty database")
    trained = train_ivfpq(
        x,
        x.shape[1],
        settings.nlist,
        settings.m,
        settings.nbits,
        seed=settings.seed,
        what="the database",
    )
    size = shard_size or DEFAULT_SHARD_VECTORS
    receipts = build_shards(
        trained, x, folder, shard_size=size, executor=executor, progress=progress
    )
    merged = merge_shards(
        trained, receipts, folder, ondisk=Path(folder) / "lists.ivfdata" if ondisk else None
    )
    for r in receipts:
        discard_folder(Path(folder) / r.folder)
    merged.nprobe = settings.nprobe
    out = FaissIndex(settings)
    out.index_, out.dim_, out.ntotal_ = merged, int(x.shape[1]), int(x.shape[0])
    return out
