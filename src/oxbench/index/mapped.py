"""``search=mapped``: exact global search streamed from descriptor shards on disk.

The database is never held in RAM: it lies on disk as shards of ``float16`` or ``float32`` rows
(:func:`write_shards` -- from an array, a :class:`~oxbench.features.descstore.DescriptorStore` or
any iterator of chunks -- or the user's own ``.npy`` files, :func:`open_npy_files`), and a search
reads it block by block (``search.block`` rows at a time, by plain reads into one reusable buffer,
so the page cache serves the file without counting in this process's memory), scores each block
against the queries and merges the block's top ``k`` into a running top ``k``.

**The scores are canonical**: each is the float64 dot product of the stored row and the
float32 query, rounded once to float32. A float32 BLAS product sums in an order that depends on the
matrix shapes (another block size, another query batch, torch instead of numpy: the last bit
moves), so near-tied images could swap places between runs; float64 sums of exact float32
products differ in order only far below float32's precision, so every backend and every blocking
gives the same scores -- and, with the tie-break of the rest of oxbench (equal scores: the lower
database index first, :func:`oxbench.index.search.exact_search`), the same ranks. On data whose
dot products float32 holds exactly, these are exact search's own scores and ranks.

Memory is bounded by ``search.ram_gb`` and checked before any work (:func:`plan_batches`): the
block buffers, the score matrix of one query batch and its top-k temporaries, the running lists;
queries are searched in batches that fit, and a bound that cannot hold one query is refused in
one line.

Backends: numpy (BLAS threads bounded by ``search.threads``) on the CPU; torch on a GPU
(``search.device=cuda``, or ``auto`` when CUDA is available; the same canonical scores, float64 on
the device); and any :class:`~oxbench.execution.Executor` -- the Dask backend included -- over
shards (:func:`search_shards`: each worker searches whole shards, the driver merges their top
``k`` lists, which gives the single process's ranks since the top ``k`` of a union is the top
``k`` of the parts' top ``k``).

Every file names what it stands for inside its content: a shard is a :func:`oxbench.cache.save_npz`
entry (content digest, and a record of the database digest, shard number, first row and dtype),
the manifest lists the shards' digests; a shard swapped, truncated or from another database is
refused on open. :func:`knn_graph` (diffusion's offline graph: every database row searched
against the database) writes its pieces the same way and reuses the pieces already written on a
rerun.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.schema import KindSettings, setting, validate

log = logging.getLogger(__name__)

#: The dtypes a shard may hold.
DTYPES = ("float16", "float32")
#: The member of a shard file that holds its rows.
ROWS = "vectors"
#: The manifest of a shard folder.
MANIFEST = "manifest.npz"
#: Bytes each working query row and each kept result cost beyond the score matrix: the running
#: list and the candidates merged into it (float32 score + int64 id, twice).
_RESULT_BYTES = 2 * 2 * (4 + 8)
#: Bytes of one score in the working set: the float64 product, its float32 rounding, the top-k
#: selection's temporaries (a partition copy, comparisons, a cumulative count).
_SCORE_BYTES = 8 + 4 + 4 + 4 + 2 + 8 + 1
GIB = 1 << 30

Device = Literal["auto", "cpu", "cuda"]


@dataclass(frozen=True)
class MappedSearch(KindSettings):
    """``search=mapped``: exact search streamed from memory-mapped shards (this module).

    Attributes:
        ram_gb: the most memory (GiB) the search's working set may take (checked before the work).
        block: database rows scored at a time.
        shard_vectors: rows per shard file when the chain writes the database's shards.
        dtype: what the shards store (``float16`` halves the disk; the scores are then those of
            the rounded vectors).
        device: ``cpu`` (numpy BLAS), ``cuda`` (torch on the GPU) or ``auto`` (the GPU when torch
            sees one).
        threads: BLAS threads of the numpy backend (0: the cores this process may use).
    """

    kind: ClassVar[str] = "mapped"
    ram_gb: float = setting(
        4.0, S.Float(lo=0.0, lo_open=True, hi=1 << 20), doc="mapped search: memory bound (GiB)"
    )
    block: int = setting(65536, S.Int(lo=1, hi=1 << 26), doc="mapped search: rows per block")
    shard_vectors: int = setting(
        1 << 18, S.Int(lo=1, hi=1 << 31), doc="mapped search: rows per shard file"
    )
    dtype: str = setting("float32", S.Choice(*DTYPES), doc="mapped search: stored dtype")
    device: str = setting("auto", S.Choice("auto", "cpu", "cuda"), doc="mapped search: device")
    threads: int = setting(0, S.Int(lo=0, hi=4096), doc="mapped search: BLAS threads (0: all)")

    def __post_init__(self) -> None:
        validate(self)


# --- the shards -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    """One file of rows: ``count`` rows of ``dim`` values of ``dtype`` at byte ``offset`` of
    ``path``, database rows ``first .. first + count``; ``identity``: the file's (inode, size,
    mtime) when it was checked (a file changed since is refused before it is read)."""

    path: str
    offset: int
    first: int
    count: int
    dim: int
    dtype: str
    identity: tuple[int, int, int]

    def check(self) -> None:
        """Refuse a file that is not the one checked (replaced, rewritten, gone)."""
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise InputError(f"mapped shard unreadable ({exc.strerror})", self.path) from None
        if (st.st_ino, st.st_size, st.st_mtime_ns) != self.identity:
            raise InputError("mapped shard changed since it was checked", self.path)

    def read(self, start: int, stop: int, out: NDArray[Any] | None = None) -> NDArray[Any]:
        """Rows ``start .. stop`` (shard-relative) read from disk (into ``out`` when given)."""
        n = stop - start
        dt = np.dtype(self.dtype)
        buf = out[:n] if out is not None else np.empty((n, self.dim), dt)
        view = memoryview(buf.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        with open(self.path, "rb", buffering=0) as fh:
            fh.seek(self.offset + start * self.dim * dt.itemsize)
            got = 0
            while got < len(view):
                r = fh.readinto(view[got:])
                if not r:
                    raise InputError("mapped shard shorter than its header says", self.path)
                got += r
        return buf


def _identity(path: str | Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return (int(st.st_ino), int(st.st_size), int(st.st_mtime_ns))


@dataclass(frozen=True)
class MappedDatabase:
    """Database rows on disk, in shards, in row order.

    Attributes:
        shards: the files, in row order.
        digest: what the rows are (the manifest's content digest; for the user's files, their
            paths and identities): what caches built from them are bound to.
    """

    shards: tuple[Shard, ...]
    digest: str

    @property
    def n(self) -> int:
        return sum(s.count for s in self.shards)

    @property
    def dim(self) -> int:
        return self.shards[0].dim if self.shards else 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.dim)

    @property
    def disk_bytes(self) -> int:
        return sum(s.identity[1] for s in self.shards)

    def rows(self, ids: NDArray[np.integer]) -> NDArray[np.float32]:
        """``float32 [len(ids), d]`` the rows at database positions ``ids`` (any order)."""
        ids = np.asarray(ids, np.int64).reshape(-1)
        out = np.zeros((len(ids), self.dim), np.float32)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise InputError(f"row ids must be in 0 .. {self.n - 1}")
        firsts = np.array([s.first for s in self.shards], np.int64)
        which = np.searchsorted(firsts, ids, side="right") - 1
        for w in np.unique(which):
            shard = self.shards[int(w)]
            shard.check()
            sel = np.nonzero(which == w)[0]
            mm = np.memmap(
                shard.path, np.dtype(shard.dtype), "r", shard.offset, (shard.count, shard.dim)
            )
            out[sel] = mm[ids[sel] - shard.first]
            del mm
        return out

    def chunks(self, size: int) -> Iterator[NDArray[np.float32]]:
        """The rows in order, ``float32`` chunks of at most ``size`` rows."""
        for shard in self.shards:
            shard.check()
            for a in range(0, shard.count, size):
                yield shard.read(a, min(a + size, shard.count)).astype(np.float32)


def _not_linked(path: Path) -> Path:
    """``path`` (a shard, the manifest, a graph piece, their folder) unless it is a symbolic link
    (:func:`oxbench.fileio.refuse_link`)."""
    from oxbench.fileio import refuse_link

    return refuse_link(path, what="mapped shard file or folder")


def _shard_record(stands_for: dict[str, Any], number: int, first: int) -> dict[str, Any]:
    return {**stands_for, "shard": number, "first": first}


def write_shards(
    chunks: Iterable[NDArray[np.floating]],
    folder: str | Path,
    *,
    stands_for: dict[str, Any],
    dtype: str = "float32",
    shard_vectors: int = 1 << 20,
) -> MappedDatabase:
    """Write rows given chunk by chunk as shard files of ``shard_vectors`` rows, then the manifest;
    a shard already in ``folder`` for the same record, number and first row is kept (resumable).

    Args:
        chunks: ``[m, d]`` arrays, in row order (never held together).
        folder: the shard folder (created).
        stands_for: what the rows are (e.g. the digest of their source and the settings); stored
            in every file and checked by :func:`open_shards`.
        dtype: ``float16`` or ``float32`` on disk.
        shard_vectors: rows per shard file.

    Raises:
        InputError: non-finite rows, chunks of differing dimension, a value float16 cannot hold.
    """
    from oxbench.cache import CorruptCache, load_npz, save_npz, save_npz_pieces
    from oxbench.fileio import make_folder, remove_stale_temps

    if dtype not in DTYPES:
        raise InputError(f"mapped shards hold one of {', '.join(DTYPES)}, not {dtype!r}")
    if shard_vectors < 1:
        raise InputError(f"shard_vectors must be >= 1, got {shard_vectors}")
    folder = make_folder(_not_linked(Path(folder)))
    remove_stale_temps(folder)  # a killed build's unfinished shard (hours old: no live writer's)
    record = {**stands_for, "dtype": dtype}
    counts: list[int] = []
    digests: list[str] = []
    pending: list[NDArray[Any]] = []
    held = 0
    dim: int | None = None

    def flush(rows: list[NDArray[Any]]) -> None:
        number, first = len(counts), sum(counts)
        path = _not_linked(folder / f"shard-{number:05d}.npz")
        rec = _shard_record(record, number, first)
        count = sum(len(r) for r in rows)
        if path.is_file():
            try:
                old = load_npz(path, what="mapped shard", mapped=[ROWS], stands_for=rec)
                if old[ROWS].shape == (count, dim):
                    counts.append(count)
                    digests.append(str(old["content_sha256"]))
                    return
            except CorruptCache as exc:
                log.warning("%s; writing it again", exc)
        save_npz_pieces(path, {ROWS: rows}, stands_for=rec)
        digests.append(str(load_npz(path, what="mapped shard", mapped=[ROWS])["content_sha256"]))
        counts.append(count)

    for chunk in chunks:
        x = np.asarray(chunk)
        if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
            raise InputError(f"mapped shards: a chunk of shape {x.shape}, expected [m, {dim}]")
        dim = int(x.shape[1])
        if not np.isfinite(x).all():
            raise InputError("mapped shards: rows hold NaN or infinite values")
        x = x.astype(dtype)
        if not np.isfinite(x).all():
            raise InputError(f"mapped shards: values too large for {dtype}")
        while len(x):
            take = min(len(x), shard_vectors - held)
            pending.append(x[:take])
            held += take
            x = x[take:]
            if held == shard_vectors:
                flush(pending)
                pending, held = [], 0
    if held:
        flush(pending)
    if dim is None:
        raise InputError("mapped shards: no rows to write")
    save_npz(
        _not_linked(folder / MANIFEST),
        {"counts": np.array(counts, np.int64), "digests": np.array(digests), "dim": np.array(dim)},
        stands_for=record,
    )
    return open_shards(folder, stands_for=stands_for, dtype=dtype)


def open_shards(
    folder: str | Path, *, stands_for: dict[str, Any], dtype: str = "float32"
) -> MappedDatabase:
    """Open a folder :func:`write_shards` wrote for ``stands_for``: every file's digest and record
    checked (each shard hashed once here; searches then check only that the file is unchanged).

    Raises:
        CorruptCache: a missing, damaged, swapped or foreign file (named).
    """
    from oxbench.cache import CorruptCache, load_npz

    folder = _not_linked(Path(folder))
    record = {**stands_for, "dtype": dtype}
    manifest = load_npz(
        _not_linked(folder / MANIFEST), what="mapped shard manifest", stands_for=record
    )
    counts = [int(c) for c in manifest["counts"]]
    digests = [str(d) for d in manifest["digests"]]
    dim = int(manifest["dim"])
    shards = []
    first = 0
    for number, (count, digest) in enumerate(zip(counts, digests, strict=True)):
        path = _not_linked(folder / f"shard-{number:05d}.npz")
        z = load_npz(
            path,
            what="mapped shard",
            mapped=[ROWS],
            stands_for=_shard_record(record, number, first),
        )
        rows = z[ROWS]
        if str(z["content_sha256"]) != digest or rows.shape != (count, dim) or rows.dtype != dtype:
            raise CorruptCache("mapped shard is not the one its manifest lists", path)
        assert isinstance(rows, np.memmap)
        shards.append(Shard(str(path), int(rows.offset), first, count, dim, dtype, _identity(path)))
        del rows, z
        first += count
    return MappedDatabase(tuple(shards), str(manifest["content_sha256"]))


def open_npy_files(paths: Sequence[str | Path]) -> MappedDatabase:
    """The user's own ``.npy`` files (``float16`` or ``float32`` ``[n_i, d]``, C order) as one
    database, in the order given, read in place (never copied).

    Raises:
        InputError: an unreadable file, another dtype, a mismatched dimension, NaN/inf rows.
    """
    from oxbench.fileio import json_digest, require_regular_file

    shards: list[Shard] = []
    first = 0
    for p in paths:
        require_regular_file(p)  # before opening: opening a FIFO would block
        try:
            mm = np.load(p, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"unreadable descriptor file ({exc})", p) from None
        if not isinstance(mm, np.memmap) or mm.ndim != 2 or mm.dtype.name not in DTYPES:
            raise InputError(
                f"descriptor file must hold a C-ordered float16/float32 [n, d] array, got "
                f"{getattr(mm, 'dtype', '?')} {getattr(mm, 'shape', '?')}",
                p,
            )
        if shards and mm.shape[1] != shards[0].dim:
            raise InputError(f"descriptor file has dimension {mm.shape[1]}, not {shards[0].dim}", p)
        if not mm.flags.c_contiguous:
            raise InputError("descriptor file is in Fortran order", p)
        for a in range(0, len(mm), 1 << 16):
            if not np.isfinite(mm[a : a + (1 << 16)]).all():
                raise InputError("descriptor file holds NaN or infinite values", p)
        shards.append(
            Shard(str(p), int(mm.offset), first, len(mm), mm.shape[1], mm.dtype.name, _identity(p))
        )
        first += len(mm)
        del mm
    if not shards:
        raise InputError("no descriptor files given")
    return MappedDatabase(tuple(shards), json_digest([[s.path, *s.identity] for s in shards], 16))


# --- memory ---------------------------------------------------------------------------------------


def working_bytes(batch: int, block: int, dim: int, itemsize: int, k: int) -> int:
    """Bytes the search's working set takes with ``batch`` queries and ``block`` rows a block:
    the read buffer and its float64 copy, the batch's queries (float64), the score matrix and its
    top-k temporaries, the running lists."""
    return (
        block * dim * (itemsize + 8)
        + batch * dim * 8
        + batch * block * _SCORE_BYTES
        + batch * (k + min(k, block)) * _RESULT_BYTES
    )


def plan_batches(
    n_queries: int, k: int, block: int, dim: int, itemsize: int, ram_bytes: int
) -> int:
    """Queries a batch may hold so the working set fits ``ram_bytes`` (all results included).

    Raises:
        InputError: one line, when even one query (or the results alone) does not fit.
    """
    results = n_queries * k * (4 + 8)
    need_one = working_bytes(1, block, dim, itemsize, k) + results
    if need_one > ram_bytes:
        raise InputError(
            f"search.ram_gb={ram_bytes / GIB:.3g} is below what the mapped search needs "
            f"({need_one / GIB:.3g} GiB for one query with search.block={block}, "
            f"{n_queries} x {k} results): raise search.ram_gb or lower search.block"
        )
    per = working_bytes(2, block, dim, itemsize, k) - working_bytes(1, block, dim, itemsize, k)
    spare = ram_bytes - need_one
    return int(max(1, min(n_queries, 1 + spare // max(per, 1))))


# --- the search -----------------------------------------------------------------------------------


def _resolve_device(device: str) -> str:
    """``cpu`` or ``cuda``: ``auto`` is the GPU when torch sees one (torch is imported for the
    question only where an NVIDIA device node exists; a CPU machine never loads it)."""
    if device == "cpu":
        return "cpu"
    torch: Any = sys.modules.get("torch")
    if device == "cuda" or (torch is None and os.path.exists("/dev/nvidiactl")):
        from oxbench.errors import require

        torch = require("torch", "deep")
    if torch is None or not torch.cuda.is_available():
        if device == "cuda":
            raise InputError("search.device=cuda, but torch sees no CUDA device")
        return "cpu"
    return "cuda"


def _check_queries(queries: NDArray[np.floating], dim: int) -> NDArray[np.float32]:
    from oxbench.index.topk import _as_matrix

    return _as_matrix(queries, "query vectors", dim)


@dataclass(frozen=True)
class ShardSearch:
    """The job of one shard (picklable, for any :class:`~oxbench.execution.Executor`): the
    canonical top ``k`` of the queries over the shard's rows, ids as database positions.

    Attributes:
        queries: ``float32 [n_q, d]``.
        k: list length; block: rows a block; ram_bytes: the working-set bound.
        engine: ``numpy``, or a torch device (``cpu``, ``cuda``) for torch.
        threads: numpy BLAS threads (0: leave as is).
    """

    queries: NDArray[np.float32]
    k: int
    block: int
    ram_bytes: int
    engine: str = "numpy"
    threads: int = 0

    def __call__(self, shard: Shard) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        if self.threads:
            from threadpoolctl import threadpool_limits

            with threadpool_limits(limits=self.threads):
                return search_one(shard, self)
        return search_one(shard, self)


def search_one(shard: Shard, job: ShardSearch) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """:class:`ShardSearch` of one shard, in this process."""
    from oxbench.index.topk import _merge, _topk_block

    shard.check()
    q = job.queries
    nq, kk = q.shape[0], min(job.k, shard.count)
    itemsize = np.dtype(shard.dtype).itemsize
    block = min(job.block, shard.count)
    batch = plan_batches(nq, kk, block, shard.dim, itemsize, job.ram_bytes)
    buf = np.empty((block, shard.dim), np.dtype(shard.dtype))
    if job.engine != "numpy":
        return _search_one_torch(shard, job, buf, batch, kk)
    q64 = q.astype(np.float64)
    out_s = np.zeros((nq, kk), np.float32)
    out_i = np.zeros((nq, kk), np.int64)
    best_s = [np.zeros((min(batch, nq - a), 0), np.float32) for a in range(0, nq, batch)]
    best_i = [np.zeros((min(batch, nq - a), 0), np.int64) for a in range(0, nq, batch)]
    for start in range(0, shard.count, block):
        rows = shard.read(start, min(start + block, shard.count), buf).astype(np.float64)
        for b, a in enumerate(range(0, nq, batch)):
            s = (q64[a : a + batch] @ rows.T).astype(np.float32)
            if not np.isfinite(s).all():
                raise InputError("descriptor dot products are not finite (overflow)")
            bs, bi = _topk_block(s, kk)
            del s
            best_s[b], best_i[b] = _merge(
                np.hstack((best_s[b], bs)),
                np.hstack((best_i[b], bi + (shard.first + start))),
                kk,
            )
        del rows
    for b, a in enumerate(range(0, nq, batch)):
        out_s[a : a + batch], out_i[a : a + batch] = best_s[b], best_i[b]
    return out_s, out_i


def _search_one_torch(
    shard: Shard, job: ShardSearch, buf: NDArray[Any], batch: int, kk: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """:func:`search_one` with torch on ``job.engine`` (the same float64 scores, rounded once)."""
    from oxbench.errors import require
    from oxbench.index.topk import torch_merge_block

    torch = require("torch", "deep")
    dev = torch.device(job.engine)
    tq = torch.from_numpy(job.queries).to(dev, torch.float64)
    nq = tq.shape[0]
    state = [
        (
            torch.zeros((min(batch, nq - a), 0), dtype=torch.float32, device=dev),
            torch.zeros((min(batch, nq - a), 0), dtype=torch.int64, device=dev),
        )
        for a in range(0, nq, batch)
    ]
    for start in range(0, shard.count, job.block):
        host = shard.read(start, min(start + job.block, shard.count), buf)
        rows = torch.from_numpy(host).to(dev).to(torch.float64)
        for b, a in enumerate(range(0, nq, batch)):
            s = (tq[a : a + batch] @ rows.T).to(torch.float32)
            state[b] = torch_merge_block(*state[b], s, shard.first + start, kk)
    best_s = torch.cat([s for s, _ in state]).cpu().numpy().astype(np.float32)
    best_i = torch.cat([i for _, i in state]).cpu().numpy().astype(np.int64)
    return best_s, best_i


def search_shards(
    queries: NDArray[np.floating],
    database: MappedDatabase,
    k: int,
    settings: MappedSearch | None = None,
    *,
    executor: Any = None,
    engine: str | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """The canonical exact top ``k`` of every query over the mapped database.

    Args:
        queries: ``[n_q, d]``.
        database: the shards.
        k: list length (capped at the database size).
        settings: block, memory bound, device, threads (default: :class:`MappedSearch`'s).
        executor: an :class:`~oxbench.execution.Executor` that searches the shards (one item a
            shard; the Dask backend runs them on its workers); ``None``: in this process.
        engine: ``numpy`` or a torch device name, overriding ``settings.device`` (tests of the
            torch path on a CPU).

    Returns:
        ``(scores float32 [n_q, k], ids int64 [n_q, k])``, best first, ties to the lower index.

    Raises:
        InputError: bad queries, ``k < 1``, a memory bound too small (before any work), a shard
            changed on disk.
    """
    from oxbench.index.topk import _merge

    st = settings or MappedSearch()
    q = _check_queries(queries, database.dim)
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    kk = min(k, database.n)
    ram = int(st.ram_gb * GIB)
    itemsize = max(np.dtype(s.dtype).itemsize for s in database.shards)
    plan_batches(len(q), kk, min(st.block, database.n), database.dim, itemsize, ram)
    if engine is None:
        dev = _resolve_device(st.device)
        engine = "numpy" if dev == "cpu" else dev
    job = ShardSearch(q, kk, st.block, ram, engine, st.threads)
    parts = (
        executor.map(job, list(database.shards))
        if executor is not None
        else (job(s) for s in database.shards)
    )
    best_s = np.zeros((len(q), 0), np.float32)
    best_i = np.zeros((len(q), 0), np.int64)
    for ps, pi in parts:  # shard order: the same merge as one running list
        best_s, best_i = _merge(np.hstack((best_s, ps)), np.hstack((best_i, pi)), kk)
    return best_s, best_i


# --- the k-NN graph -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphPiece:
    """Database rows ``first .. first + count`` searched against the whole database."""

    number: int
    first: int
    count: int


@dataclass(frozen=True)
class GraphPieceJob:
    """Search one piece's rows against the database and write the piece's file (kept when it is
    already there for the same record)."""

    database: MappedDatabase
    k: int
    settings: MappedSearch
    folder: str
    engine: str = "numpy"

    def record(self, piece: GraphPiece) -> dict[str, Any]:
        return {
            "database": self.database.digest,
            "k": self.k,
            "piece": piece.number,
            "first": piece.first,
            "count": piece.count,
        }

    def path(self, piece: GraphPiece) -> Path:
        return _not_linked(Path(self.folder) / f"graph-{piece.number:05d}.npz")

    def __call__(self, piece: GraphPiece) -> str:
        from oxbench.cache import save_npz

        path = self.path(piece)
        if self.done(piece):
            return str(path)
        rows = self.database.rows(np.arange(piece.first, piece.first + piece.count))
        scores, ids = search_shards(rows, self.database, self.k, self.settings, engine=self.engine)
        save_npz(path, {"scores": scores, "ids": ids}, stands_for=self.record(piece))
        return str(path)

    def done(self, piece: GraphPiece) -> bool:
        from oxbench.cache import CorruptCache, load_npz

        path = self.path(piece)
        if not path.is_file():
            return False
        try:
            load_npz(path, what="k-NN graph piece", stands_for=self.record(piece))
        except CorruptCache as exc:
            log.warning("%s; searching it again", exc)
            return False
        return True

    def load(self, piece: GraphPiece) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        from oxbench.cache import load_npz

        z = load_npz(self.path(piece), what="k-NN graph piece", stands_for=self.record(piece))
        return z["scores"].astype(np.float32), z["ids"].astype(np.int64)


def knn_graph(
    database: MappedDatabase,
    k: int,
    folder: str | Path,
    settings: MappedSearch | None = None,
    *,
    piece_rows: int = 65536,
    rows: int | None = None,
    executor: Any = None,
    engine: str | None = None,
) -> tuple[NDArray[np.float32], NDArray[np.int64], int]:
    """Every database row's top ``k`` over the database (itself included), by the streamed search,
    in pieces of ``piece_rows`` rows written to ``folder``; pieces already written there for the
    same database and ``k`` are reused (an interrupted build resumes). ``rows``: only the first
    ``rows`` rows' lists (a sample of the graph; default all).

    Returns:
        ``(scores float32 [rows, k], ids int64 [rows, k], pieces_reused)``.
    """
    from oxbench.fileio import make_folder, remove_stale_temps

    st = settings or MappedSearch()
    if piece_rows < 1:
        raise InputError(f"piece_rows must be >= 1, got {piece_rows}")
    if engine is None:
        dev = _resolve_device(st.device)
        engine = "numpy" if dev == "cpu" else dev
    remove_stale_temps(make_folder(_not_linked(Path(folder))))
    kk = min(k, database.n)
    job = GraphPieceJob(database, kk, st, str(folder), engine)
    n_rows = database.n if rows is None else min(max(rows, 1), database.n)
    pieces = [
        GraphPiece(i, a, min(piece_rows, n_rows - a))
        for i, a in enumerate(range(0, n_rows, piece_rows))
    ]
    todo = [p for p in pieces if not job.done(p)]
    if todo:
        runs = executor.map(job, todo) if executor is not None else (job(p) for p in todo)
        for _ in runs:
            pass
    parts = [job.load(p) for p in pieces]
    return (
        np.vstack([s for s, _ in parts]),
        np.vstack([i for _, i in parts]),
        len(pieces) - len(todo),
    )


# --- what a size costs ----------------------------------------------------------------------------

#: CPU-nanoseconds the numpy backend spends per database vector, per query, per dimension: float64
#: products, their rounding and the top-k selection (bench/README.md, "Streamed exact search at
#: 10M": measured at 128-D, float16 shards, 70 queries a batch, 2 BLAS threads).
CPU_NS_PER_VECTOR_DIM = 0.36
#: Bytes a second one reader gets from the shards' disk when the page cache does not hold them
#: (a planning figure for a local NVMe disk; a network file system gives less).
DISK_READ_BYTES_S = 2e9


@dataclass(frozen=True)
class ScalePlan:
    """What exact streamed search over ``n`` vectors of ``dim`` costs, per query batch.

    Attributes:
        n, dim, dtype, n_queries: the size.
        disk_bytes: the shards on disk.
        ram_bytes: the working set of one search process (``search.ram_gb``), besides the results.
        results_bytes: the top-k lists of the batch.
        cpu_s: CPU seconds of the batch by the numpy backend (measured cost a vector).
        read_s: seconds to read the shards once at :data:`DISK_READ_BYTES_S` per reader.
    """

    n: int
    dim: int
    dtype: str
    n_queries: int
    k: int
    disk_bytes: int
    ram_bytes: int
    results_bytes: int
    cpu_s: float
    read_s: float

    def wall_s(self, cores: int = 1, readers: int = 1) -> float:
        """Seconds of the batch on ``cores`` cores with ``readers`` disks read in parallel (a Dask
        cluster of N machines: N x their cores, N readers): compute and reading overlap (the
        block read is the next block's wait), so the slower of the two."""
        return max(self.cpu_s / max(cores, 1), self.read_s / max(readers, 1))


def scale_plan(
    n: int, dim: int, n_queries: int, *, k: int = 100, dtype: str = "float16", ram_gb: float = 4.0
) -> ScalePlan:
    """The :class:`ScalePlan` of a batch of ``n_queries`` over ``n`` stored ``dim``-D vectors.

    Example:
        >>> p = scale_plan(100_000_000, 1024, 1232)  # ILIAS: 100M distractors, 1,232 queries
        >>> round(p.disk_bytes / 1e9)
        205
    """
    if n < 1 or dim < 1 or n_queries < 1 or k < 1:
        raise InputError(f"a scale plan needs positive sizes, got n={n} dim={dim} q={n_queries}")
    if dtype not in DTYPES:
        raise InputError(f"mapped shards hold one of {', '.join(DTYPES)}, not {dtype!r}")
    disk = n * dim * np.dtype(dtype).itemsize
    return ScalePlan(
        n=n,
        dim=dim,
        dtype=dtype,
        n_queries=n_queries,
        k=k,
        disk_bytes=disk,
        ram_bytes=int(ram_gb * GIB),
        results_bytes=n_queries * min(k, n) * 12,
        cpu_s=n * dim * n_queries * CPU_NS_PER_VECTOR_DIM * 1e-9,
        read_s=disk / DISK_READ_BYTES_S,
    )
