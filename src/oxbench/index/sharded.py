"""FAISS IVF-PQ built by shards: train once, add each shard to an empty copy, merge with FAISS.

At a million images the database vectors of an IVF-PQ index need not be in one process, nor its
inverted lists in RAM. The index is built the way FAISS's own large-scale recipe builds it:

1. :func:`train_ivfpq` -- the coarse quantiser and the product quantiser are trained once, on the
   database or a sample of it, giving a trained *empty* index;
2. :class:`ShardAdder` -- a picklable job: each shard (a contiguous range of database positions)
   adds its vectors, with their positions as ids (``add_with_ids``), to its own copy of the trained
   index and writes it to a file (temporary name, then rename), returning a small receipt; shards
   run through any :class:`~oxbench.execution.Executor`;
3. :func:`merge_shards` -- the shard files are merged in shard order into a copy of the trained
   index with FAISS's ``merge_from`` (in RAM), or with ``faiss.contrib.ondisk.merge_ondisk`` into
   on-disk inverted lists (memory-mapped at search time) when they would not fit.

Each vector's code depends only on the vector and the trained quantisers, and merging appends the
shards' list entries in shard order, so the merged index holds the same codes, in the same order,
as an index built in one piece by adding the vectors in position order -- and answers every query
the same.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import TEMP_PREFIX, make_folder

#: Database vectors per shard when none is given.
DEFAULT_SHARD_VECTORS = 65536


def _faiss(threads: int | None = None) -> Any:
    from oxbench.index.faiss_setup import load_faiss

    return load_faiss(threads)


def train_ivfpq(
    train: NDArray[np.float32], d: int, nlist: int, m: int, nbits: int, *, seed: int = 0, what: str = "the training set"
) -> Any:  # fmt: skip
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
        raise InputError(f"IVF-PQ: training a {nbits}-bit product quantiser needs at least {1 << nbits} vectors, "
                         f"{what} has {n}")  # fmt: skip
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFPQ(quantizer, d, nlist, m, nbits, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = seed
    index.pq.cp.seed = seed
    index.train(np.ascontiguousarray(train, dtype=np.float32))
    return index


def serialize(index: Any) -> NDArray[np.uint8]:
    """FAISS's serialisation of ``index`` (picklable bytes for a job)."""
    return np.asarray(_faiss().serialize_index(index), dtype=np.uint8)


@dataclass(frozen=True)
class ShardReceipt:
    """What a shard job returns: its file, its first position, its vector count and the file's digest."""

    path: str
    start: int
    count: int
    sha256: str


def _sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardAdder:
    """The job of one shard: add ``(start, vectors)`` to a copy of the trained index, write it.

    Attributes:
        trained: :func:`serialize` of the trained empty index.
        folder: where the shard files go (``shard-<start>-<count>.faiss``).
    """

    trained: NDArray[np.uint8]
    folder: str

    def __call__(self, item: tuple[int, NDArray[np.float32]]) -> ShardReceipt:
        start, x = item
        faiss = _faiss()
        index = faiss.deserialize_index(self.trained)
        if index.ntotal:
            raise InputError("a shard must start from the trained, empty index")
        x = np.ascontiguousarray(x, dtype=np.float32)
        index.add_with_ids(x, np.arange(start, start + x.shape[0], dtype=np.int64))
        final = Path(self.folder) / f"shard-{start:012d}-{x.shape[0]}.faiss"
        tmp = final.with_name(f"{TEMP_PREFIX}{final.name}-{os.getpid()}")
        faiss.write_index(index, str(tmp))
        os.replace(tmp, final)  # a killed job leaves a temporary file, never a partial shard
        return ShardReceipt(str(final), int(start), int(x.shape[0]), _sha256(final))


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each shard of ``n`` positions, ``shard_size`` each (the last shorter).

    Example:
        >>> shard_ranges(10, 4)
        [(0, 4), (4, 8), (8, 10)]
    """
    if shard_size < 1:
        raise InputError(f"shard size must be >= 1, got {shard_size}")
    return [(s, min(s + shard_size, n)) for s in range(0, n, shard_size)]


def build_shards(
    trained: Any, vectors: NDArray[np.float32], folder: str | Path, *, shard_size: int = DEFAULT_SHARD_VECTORS,
    executor: Any = None, progress: bool = False,
) -> list[ShardReceipt]:  # fmt: skip
    """Add ``vectors`` (ids: their positions) shard by shard to copies of ``trained``, one file each.

    Args:
        trained: the trained, empty index (:func:`train_ivfpq`).
        vectors: ``float32 [n, d]``.
        folder: where the shard files are written.
        shard_size: vectors per shard.
        executor: where the shards run (:mod:`oxbench.execution`; default: this process).

    Returns:
        The receipts, in shard order.
    """
    from oxbench.execution import SerialExecutor

    make_folder(folder)
    job = ShardAdder(serialize(trained), str(folder))
    items = [(a, vectors[a:b]) for a, b in shard_ranges(vectors.shape[0], shard_size)]
    ex = executor or SerialExecutor()
    return list(ex.map(job, items, desc="IVF-PQ shards", unit="shard", progress=progress))


def merge_shards(trained: Any, receipts: Sequence[ShardReceipt], *, ondisk: str | Path | None = None) -> Any:
    """The shards merged, in receipt order, into a copy of the trained index.

    Args:
        trained: the trained, empty index the shards started from.
        receipts: :func:`build_shards`'s receipts.
        ondisk: a file for on-disk inverted lists (``faiss.contrib.ondisk.merge_ondisk``; the
            index then reads its lists from that file, memory-mapped); ``None``: lists in RAM
            (``merge_from``).

    Raises:
        InputError: a shard file missing or changed since it was written, shards that do not
            follow each other (a gap or an overlap of positions).
    """
    faiss = _faiss()
    expected = 0
    for r in receipts:
        if not Path(r.path).is_file():
            raise InputError("IVF-PQ shard file is missing (deleted since it was written?); rebuild the index", r.path)
        if r.start != expected:
            raise InputError(f"IVF-PQ shards do not follow each other: expected position {expected}, got {r.start}", r.path)
        if _sha256(r.path) != r.sha256:
            raise InputError("IVF-PQ shard file changed since it was written; rebuild the index", r.path)
        expected += r.count
    out = faiss.clone_index(trained)
    if out.ntotal:
        raise InputError("the shards must be merged into the trained, empty index")
    if ondisk is not None:
        from faiss.contrib.ondisk import merge_ondisk

        merge_ondisk(out, [r.path for r in receipts], str(ondisk))
    else:
        for r in receipts:
            shard = faiss.read_index(r.path)
            out.merge_from(shard, 0)  # add_id 0: the ids the shard was given (positions) are kept
    if out.ntotal != expected:
        raise InputError(f"merged IVF-PQ index holds {out.ntotal} vectors, the shards {expected}")
    return out


def list_contents(index: Any) -> tuple[list[NDArray[np.int64]], list[NDArray[np.uint8]]]:
    """The ids and codes of every inverted list of an IVF index, in list order (for comparisons)."""
    faiss = _faiss()
    ivf = faiss.extract_index_ivf(index)
    invlists = ivf.invlists
    ids, codes = [], []
    for li in range(ivf.nlist):
        n = invlists.list_size(li)
        ids.append(faiss.rev_swig_ptr(invlists.get_ids(li), n).copy().astype(np.int64) if n else np.zeros(0, np.int64))
        codes.append(faiss.rev_swig_ptr(invlists.get_codes(li), n * invlists.code_size).copy() if n
                     else np.zeros(0, np.uint8))  # fmt: skip
    return ids, codes


def build_ivfpq(
    vectors: NDArray[np.float32], settings: Any, folder: str | Path, *, shard_size: int | None = None,
    executor: Any = None, progress: bool = False, ondisk: bool = False,
) -> Any:  # fmt: skip
    """A :class:`~oxbench.index.search.FaissIndex` IVF-PQ over ``vectors`` built by shards.

    Trains on ``vectors`` (as :meth:`FaissIndex.fit <oxbench.index.search.FaissIndex.fit>` does),
    adds them shard by shard through ``executor`` (:func:`build_shards`, files under ``folder``)
    and merges the shards (:func:`merge_shards`; with ``ondisk``, into ``folder/lists.ivfdata``).
    The shard files are removed once merged (the merged index is what is kept).

    Args:
        vectors: ``float32 [n, d]`` database vectors (ids: positions).
        settings: an :class:`~oxbench.index.search.IndexSettings` of kind ``ivfpq``.
        shard_size: vectors per shard (default :data:`DEFAULT_SHARD_VECTORS`).
    """
    from oxbench.index.search import FaissIndex, _as_matrix

    x = _as_matrix(vectors, "database vectors")
    if x.shape[0] == 0:
        raise InputError("cannot index an empty database")
    trained = train_ivfpq(x, x.shape[1], settings.nlist, settings.m, settings.nbits, seed=settings.seed,
                          what="the database")  # fmt: skip
    size = shard_size or DEFAULT_SHARD_VECTORS
    receipts = build_shards(trained, x, folder, shard_size=size, executor=executor, progress=progress)
    merged = merge_shards(trained, receipts, ondisk=Path(folder) / "lists.ivfdata" if ondisk else None)
    for r in receipts:
        Path(r.path).unlink(missing_ok=True)
    merged.nprobe = settings.nprobe
    out = FaissIndex(settings)
    out.index_, out.dim_, out.ntotal_ = merged, int(x.shape[1]), int(x.shape[0])
    return out
