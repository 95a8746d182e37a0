"""What a global-descriptor method does after description: DBA, search index, QE, diffusion.

:class:`SearchChain` is built from the (whitened, L2-normalised) database vectors and a
:class:`~oxbench.pipelines.families.global_descriptors.GlobalConfig`'s settings, and answers query vectors:

1. the index-phase stages of ``rerank`` (``dba``: each database vector replaced by the
   alpha-weighted mean of itself and its top ``dba.k`` neighbours, :mod:`oxbench.pipelines.rerankers.dba`);
2. the search index: exact blocked search, a FAISS flat / IVF-PQ index persisted in the cache
   (reused when its file exists; a corrupt file is refused, naming it), or the database written
   as shards to the cache and searched streamed from disk (``search=mapped``,
   :mod:`oxbench.index.mapped`: each query batch through the run's executor, one shard an item;
   diffusion's k-NN graph through the same search, its pieces cached and reused; with no stage
   that needs the whole database, it comes as :class:`DatabaseChunks`, whitened chunk by chunk
   into the shards and never held together: :meth:`SearchChain.streams`);
3. per query: the first ranking, then the query-phase stages of ``rerank``, in order
   (:mod:`oxbench.pipelines.rerankers`: average / alpha query expansion and a second search,
   diffusion over the top of that ranking, or any registered re-ranker that works on vectors).

The facts of each step (index kind and settings, bytes per database image, the diffusion graph)
go into :attr:`SearchChain.info`, which the runner records with every result.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import json_digest, refuse_linked_folder
from oxbench.index.mapped import MappedDatabase, MappedSearch
from oxbench.index.search import (
    ExactSearch,
    FaissIndex,
    FaissSearch,
    IvfPqSearch,
    exact_search,
    recall_at,
)
from oxbench.pipelines.method import Ranking, RunContext
from oxbench.pipelines.sources import LocalSource
from oxbench.pipelines.steps.verify import VerifiedList


class ChainSettings(Protocol):
    """The settings of :class:`~oxbench.pipelines.families.global_descriptors.GlobalConfig` the
    chain reads (see its attributes; the stages and their settings are its
    :class:`~oxbench.pipelines.rerankers.Pipeline`'s)."""

    @property
    def name(self) -> str: ...

    @property
    def search(self) -> Any: ...

    @property
    def list_length(self) -> int | None: ...

    @property
    def rerank(self) -> tuple[str, ...]: ...

    @property
    def stage_settings(self) -> Any: ...

    def offered(self, capabilities: frozenset[str]) -> frozenset[str]: ...

    def build_stages(self, capabilities: frozenset[str]) -> list[Any]: ...


log = logging.getLogger(__name__)

#: Ranked-list length when ``list_length`` is not set and the index is larger than ``FULL_LIST_MAX``.
LONG_LIST = 10_000
FULL_LIST_MAX = 100_000


def check_search_settings(m: ChainSettings) -> None:
    """Refuse re-ranking stages the search cannot serve (one line naming the method); each
    setting's own type and range is its spec's (:mod:`oxbench.schema`), the search kind's its own."""
    m.build_stages(SearchChain.capabilities)  # unknown or unservable


def array_digest(x: NDArray[np.float32]) -> str:
    """Short SHA-256 of an array's bytes (what a cached index or whitening was made from)."""
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def streamed_digest(chunks: Iterable[NDArray[np.float32]]) -> str:
    """:func:`array_digest` of the rows given chunk by chunk, in order, never held together: the
    same value as the digest of their concatenation (C-order bytes of consecutive rows follow
    each other)."""
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(np.ascontiguousarray(chunk).tobytes())
    return h.hexdigest()[:16]


#: Rows a chunk of an in-RAM database holds on its way to the shards.
STREAM_ROWS = 65536
#: Bytes a chunk of a :class:`DatabaseChunks` takes while it is whitened (:attr:`~DatabaseChunks.chunk_bytes`).
STREAM_BYTES = 16 << 20
#: What a re-ranking stage needs that makes the chain hold the whole database in RAM.
WHOLE_DATABASE = frozenset({"vectors", "dense", "augment"})


class DatabaseChunks:
    """The database vectors made chunk by chunk on demand, never held together: rows ``a .. b``
    are ``finish(raw rows a .. b)`` over parts laid end to end (the database, then distractors).

    ``finish`` must be a per-row map whose rows do not depend on the other rows of the chunk
    (whitening: a linear map then an L2 normalisation, each row on its own), so the chunks are,
    bit for bit, the rows of ``finish`` applied to the whole concatenation. No chunk holds a
    single row unless the database does (a chunk holds at least two rows, and a last chunk of one
    row is joined to the one before it): one row would go through a matrix-vector product, not
    the matrix product the whole array takes.

    Args:
        parts: ``[n_i, D]`` raw descriptors of each part, in order.
        finish: raw rows ``[m, D]`` to searched rows ``float32 [m, d]``.
        dim: ``d``.
        rows: rows a chunk holds (``None``: as many as :data:`STREAM_BYTES` holds; at least 2).
    """

    def __init__(
        self,
        parts: Sequence[NDArray[np.float32]],
        finish: Callable[[NDArray[np.float32]], NDArray[np.float32]],
        dim: int,
        rows: int | None = None,
    ) -> None:
        self.parts = list(parts)
        self.finish = finish
        self.starts = np.cumsum([0] + [len(p) for p in self.parts])
        self.shape = (int(self.starts[-1]), int(dim))
        self.rows = max(2, rows or STREAM_BYTES // self.row_bytes)

    @property
    def row_bytes(self) -> int:
        """Bytes a row takes while it is whitened: float64 rows of the wider dimension, twice
        (the input and its centred copy), and its float32 result."""
        widest = max([self.shape[1]] + [int(p.shape[1]) for p in self.parts])
        return 2 * 8 * widest + 4 * self.shape[1]

    @property
    def chunk_bytes(self) -> int:
        """Bytes one chunk takes while it is whitened."""
        return self.rows * self.row_bytes

    def bounds(self) -> list[tuple[int, int]]:
        """``(a, b)`` of every chunk, in order."""
        n = self.shape[0]
        out = [(a, min(a + self.rows, n)) for a in range(0, n, self.rows)]
        if len(out) > 1 and out[-1][1] - out[-1][0] == 1:
            out[-2:] = [(out[-2][0], n)]
        return out

    def raw(self, a: int, b: int) -> NDArray[np.float32]:
        """Raw rows ``a .. b`` across the parts (only they are copied)."""
        pieces = []
        for part, s in zip(self.parts, self.starts[:-1], strict=True):
            lo, hi = max(a - int(s), 0), min(b - int(s), len(part))
            if lo < hi:
                pieces.append(part[lo:hi])
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def __iter__(self) -> Iterator[NDArray[np.float32]]:
        for a, b in self.bounds():
            x = np.asarray(self.finish(self.raw(a, b)), np.float32)
            if x.shape != (b - a, self.shape[1]):
                raise AssertionError(f"finish gave {x.shape} for rows {a}..{b}")  # pragma: no cover
            yield x


class SearchChain:
    """The database side of a global method and its answers to query vectors.

    Args:
        m: the method's settings.
        database: ``float32 [n, d]`` whitened, L2-normalised database (and distractor) vectors,
            or, when :meth:`streams` (``search=mapped``, no stage holding the whole database),
            the same vectors as :class:`DatabaseChunks`: written to the shards chunk by chunk and
            never held in RAM together.
        ctx: where the FAISS index is cached and where timings go.
        cache_dir: the folder for persisted indexes (``None``: not persisted).
    """

    def __init__(
        self,
        m: ChainSettings,
        database: NDArray[np.float32] | DatabaseChunks,
        ctx: RunContext,
        cache_dir: Path | None,
        *,
        local: LocalSource | None = None,
    ) -> None:
        self.m = m
        self.local = local
        self.capabilities = m.offered(SearchChain.capabilities)
        self.info: dict[str, Any] = {
            "n_index": int(database.shape[0]),
            "dim": int(database.shape[1]),
        }
        self.shape: tuple[int, int] = (int(database.shape[0]), int(database.shape[1]))
        self.stream: DatabaseChunks | None = None
        self.db: NDArray[np.float32] | None = None
        if isinstance(database, DatabaseChunks):
            if not self.streams(m):
                raise InputError(
                    f"method {m.name}: its database can be streamed only with search=mapped and "
                    "no stage that needs it in RAM"
                )
            self.stream = database
        else:
            self.db = database
        self.faiss: FaissIndex | None = None
        self.mapped: MappedDatabase | None = None
        self.index_path: Path | None = None  # the persisted FAISS index, when there is one
        if local is not None:
            self.info.update(local.facts)
        self.ctx, self.cache_dir = ctx, cache_dir

    @classmethod
    def streams(cls, m: ChainSettings) -> bool:
        """Whether the database can go to the search chunk by chunk: ``search=mapped`` and no
        re-ranking stage that reads, augments or builds a graph over the whole database in RAM
        (query expansion, DBA, diffusion, k-reciprocal, ... need :data:`WHOLE_DATABASE`)."""
        if not isinstance(m.search, MappedSearch):
            return False
        return not any(stage.needs & WHOLE_DATABASE for stage in m.build_stages(cls.capabilities))

    def build_index(self) -> SearchChain:
        """Build the search index over the database vectors as they are now (after the
        index-phase stages, DBA, changed them); returns the chain."""
        m, ctx, cache_dir = self.m, self.ctx, self.cache_dir
        with ctx.timed("index"):
            if isinstance(m.search, ExactSearch):
                self.info["search"] = m.search.to_dict()
                self.info["bytes_per_image"] = int(self.shape[1] * self.whole.dtype.itemsize)
            elif isinstance(m.search, MappedSearch):
                self.mapped = self._mapped_shards(m.search, cache_dir or Path(ctx.cache))
                self.info["search"] = m.search.to_dict()
                self.info["streamed_build"] = self.stream is not None
                self.info["bytes_per_image"] = int(
                    self.shape[1] * np.dtype(m.search.dtype).itemsize
                )
                self.info["mapped_disk_bytes"] = self.mapped.disk_bytes
            else:
                self.faiss = self._faiss_index(ctx, cache_dir)
                self.info["search"] = self.faiss.describe()
                self.info["bytes_per_image"] = self.faiss.bytes_per_vector
                if isinstance(self.faiss.settings, IvfPqSearch) and cache_dir is not None:
                    self.db = self._mapped(cache_dir)
        return self

    def _mapped_shards(self, settings: MappedSearch, cache_dir: Path) -> MappedDatabase:
        """The database written as shards (:func:`~oxbench.index.mapped.write_shards`), bound to
        the vectors' digest (:func:`array_digest`; of a streamed database the same value, computed
        in a first pass over its chunks, :func:`streamed_digest`): shards already written for
        them are kept, whichever path wrote them."""
        from oxbench.index.mapped import write_shards

        if self.stream is not None:
            self._check_build_ram(settings, self.stream)
            digest = streamed_digest(self.stream)
            chunks: Iterable[NDArray[np.float32]] = iter(self.stream)
        else:
            db = self.whole
            digest = array_digest(db)
            chunks = (db[a : a + STREAM_ROWS] for a in range(0, db.shape[0], STREAM_ROWS))
        folder = cache_dir / f"mapped-{settings.dtype}-{settings.shard_vectors}-{digest}"
        refuse_linked_folder(folder, below=Path(self.ctx.cache))  # never written through
        stands_for = {"vectors": digest, "shape": list(self.shape)}
        return write_shards(
            chunks,
            folder,
            stands_for=stands_for,
            dtype=settings.dtype,
            shard_vectors=settings.shard_vectors,
        )

    def knn_neighbours(self, k: int) -> tuple[NDArray[np.float32], NDArray[np.int64]] | None:
        """With ``search=mapped``: every database image's top ``k`` (itself included) by the
        streamed search, in pieces cached beside the shards and reused on a rerun (diffusion's
        graph); otherwise ``None`` (the graph is built in RAM)."""
        from oxbench.index.mapped import knn_graph

        if self.mapped is None:
            return None
        folder = Path(self.mapped.shards[0].path).parent / f"knn-{k}"
        scores, ids, reused = knn_graph(
            self.mapped, k, folder, self.m.search, executor=self._executor()
        )
        self.info["knn_pieces_reused"] = reused
        return scores, ids

    def _executor(self) -> Any:
        """The run's executor for the shards of a mapped search (``None``: one shard, here)."""
        if self.mapped is None or len(self.mapped.shards) < 2 or self.ctx.executor.workers < 2:
            return None
        return self.ctx.executor

    def _check_build_ram(self, settings: MappedSearch, stream: DatabaseChunks) -> None:
        """Refuse, before any work, a streamed build whose working set exceeds ``search.ram_gb``:
        one shard's rows pending in the stored dtype (``write_shards`` writes a shard once it is
        whole) and one chunk being whitened."""
        from oxbench.index.mapped import GIB

        pending = min(stream.shape[0], settings.shard_vectors) * stream.shape[1]
        need = pending * np.dtype(settings.dtype).itemsize + stream.chunk_bytes
        if need > settings.ram_gb * GIB:
            raise InputError(
                f"method {self.m.name}: writing the shards needs {need / GIB:.3g} GiB "
                f"(a shard of {settings.shard_vectors:,} rows x {stream.shape[1]} and one chunk), "
                f"more than search.ram_gb={settings.ram_gb:g}: lower search.shard_vectors or "
                "raise search.ram_gb"
            )

    @property
    def whole(self) -> NDArray[np.float32]:
        """The database vectors held in RAM (refused for a streamed database, which no stage of
        the method reads: :meth:`streams`)."""
        if self.db is None:
            raise InputError(
                f"method {self.m.name}: its database was streamed to the shards, not held in RAM"
            )
        return self.db

    def _faiss_index(self, ctx: RunContext, cache_dir: Path | None) -> FaissIndex:
        settings = self.m.search
        path = None
        if cache_dir is not None:
            key = json_digest({**settings.to_dict(), "db": array_digest(self.whole)}, 12)
            path = cache_dir / f"index-{settings.kind}-{key}.npz"
            self.index_path = path
            if path.exists():
                try:
                    index = FaissIndex.load(path, stands_for=self._index_record(settings))
                    if index.ntotal_ != self.whole.shape[0] or index.dim_ != self.whole.shape[1]:
                        raise InputError(
                            f"cached index holds {index.ntotal_} x {index.dim_}, expected {self.whole.shape}",
                            path,
                        )
                except InputError as exc:  # a damaged cache entry is rebuilt, named once
                    log.warning("%s; building the index again", exc)
                else:
                    ctx.record_step("search_index", hit=True)
                    return index
        if isinstance(settings, IvfPqSearch):  # trained once, added by shards, merged by FAISS
            from oxbench.index.sharded import build_ivfpq

            shards = (
                cache_dir or Path(ctx.cache)
            ) / f"shards-{json_digest(settings.to_dict(), 8)}-{array_digest(self.whole)}"
            index = build_ivfpq(
                self.whole, settings, shards, executor=ctx.executor, progress=ctx.progress
            )
            shutil.rmtree(shards, ignore_errors=True)
        else:
            index = FaissIndex(settings).fit(self.whole)
        if path is not None:
            index.save(path, stands_for=self._index_record(settings))
            self.info["index_path"] = str(path)
        ctx.record_step("search_index", hit=False)
        return index

    def _index_record(self, settings: FaissSearch) -> dict[str, object]:
        """What a cached FAISS index stands for: its settings and the vectors it was built from."""
        return {"settings": settings.to_dict(), "vectors": array_digest(self.whole)}

    def _mapped(self, cache_dir: Path) -> NDArray[np.float32]:
        """The database vectors as a read-only memory map of a cached ``.npy``: with IVF-PQ the
        codes are the index, and the float vectors (read by query expansion, diffusion and the
        recall check) are paged in from disk, not held in RAM.

        The file is mapped only when it is the one written from these vectors
        (:func:`oxbench.cache.open_written`); another file in its place (same shape, other rows) is
        written again, with a warning."""
        from oxbench.cache import CorruptCache, open_written, record_written
        from oxbench.fileio import atomic_write_npy

        digest = array_digest(self.whole)
        path = cache_dir / f"vectors-{self.whole.shape[0]}x{self.whole.shape[1]}-{digest}.npy"
        stands_for = {"vectors": digest, "shape": list(self.whole.shape)}
        for attempt in (0, 1):
            if attempt or not path.is_file():
                atomic_write_npy(path, np.ascontiguousarray(self.whole, dtype=np.float32))
                record_written(path, stands_for)
            try:
                mapped = open_written(
                    path,
                    what="cached database vectors",
                    stands_for=stands_for,
                    open_file=lambda p: np.load(p, mmap_mode="r", allow_pickle=False),
                )
            except CorruptCache as exc:
                if attempt:
                    raise
                log.warning("%s; writing them again", exc)
                exc.remove()
                continue
            assert isinstance(mapped, np.ndarray)
            if mapped.shape != self.whole.shape or mapped.dtype != np.float32:
                raise InputError(
                    f"cached vectors hold {mapped.shape} {mapped.dtype}, expected {self.whole.shape} float32",
                    path,
                )
            return mapped
        raise AssertionError("unreachable")  # pragma: no cover

    def footprint(self) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
        """Measured ``(ram, fixed_ram, disk)`` of the database side: the vectors the chain keeps
        (in RAM, or on disk when memory-mapped) and the FAISS index as FAISS serialises it, its
        trained-but-empty copy (coarse quantiser, codebooks) counted as fixed."""
        from oxbench.index.footprint import array_bytes, disk_bytes, faiss_bytes

        filename = self.db.filename if isinstance(self.db, np.memmap) else None
        ram = {"vectors": 0 if filename or self.db is None else array_bytes(self.db)}
        disk = {"vectors": disk_bytes(filename) if filename else 0}
        if self.mapped is not None:
            disk["mapped_shards"] = self.mapped.disk_bytes
        fixed: dict[str, int] = {}
        if self.faiss is not None:
            from oxbench.index.faiss_setup import load_faiss

            empty = load_faiss().clone_index(self.faiss.index_)
            empty.reset()
            fixed["faiss_trained"] = faiss_bytes(empty)
            ram["faiss_index"] = faiss_bytes(self.faiss.index_) - fixed["faiss_trained"]
        return ram, fixed, disk

    def list_length(self) -> int:
        """How many images each ranked list holds."""
        n = self.shape[0]
        if self.m.list_length is not None:
            return min(self.m.list_length, n)
        return n if n <= FULL_LIST_MAX else LONG_LIST

    def rank(self, q: NDArray[np.float32]) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """``(scores, ranks)`` of query vectors ``q`` (IVF-PQ lists cut to the shortest complete one)."""
        k = self.list_length()
        if self.mapped is not None:
            from oxbench.index.mapped import search_shards

            return search_shards(q, self.mapped, k, self.m.search, executor=self._executor())
        if self.faiss is None:
            return exact_search(q, self.whole, None if k == self.shape[0] else k)
        scores, ids = self.faiss.search(q, k)
        if isinstance(self.faiss.settings, IvfPqSearch) and "recall_vs_exact" not in self.info:
            self.info["recall_vs_exact"] = self._recall(q, ids)
        complete = int((ids >= 0).sum(axis=1).min()) if len(ids) else k
        if complete < k:
            log.info(
                "IVF-PQ returned %d or more of %d per query (nprobe %d of %d cells); lists cut to %d",
                complete,
                k,
                self.m.search.nprobe,
                self.m.search.nlist,
                complete,
            )
            self.info["list_length"] = complete
            scores, ids = scores[:, :complete], ids[:, :complete]
        if complete == 0:
            raise InputError(
                f"method {self.m.name}: IVF-PQ found nothing for some query; raise nprobe"
            )
        return scores, ids

    def _recall(self, q: NDArray[np.float32], ids: NDArray[np.int64]) -> dict[str, float]:
        """Recall@k of the approximate first ranking against exact search of the same vectors
        (``k`` in 1, 10, 100 up to the list length): how much of the exact top k IVF-PQ finds."""
        ks = [k for k in (1, 10, 100) if k <= ids.shape[1]]
        if not ks or not len(q):
            return {}
        _, truth = exact_search(q, self.whole, max(ks))
        return {f"recall@{k}": recall_at(ids, truth, k) for k in ks}

    def first_ranking(self, q: NDArray[np.float32], ctx: RunContext) -> Ranking:
        """The ranking of query vectors ``q`` the stages start from; the facts of the index go
        with it."""
        if q.shape[1] != self.shape[1]:
            raise InputError(
                f"query descriptors have dimension {q.shape[1]}, the database {self.shape[1]}"
            )
        with ctx.timed("search"):
            scores, ranks = self.rank(q)
        return Ranking(ranks, scores, q, info=self.info)

    # --- what the re-ranking stages use (RerankSpace): dense vectors -----------------------------
    capabilities = frozenset({"vectors", "dense", "dense-index", "augment"})

    @property
    def dense_database(self) -> NDArray[np.float32]:
        """The database vectors the index holds (diffusion's graph is built over them)."""
        return self.whole

    def dense_queries(self, ranking: Ranking) -> NDArray[np.float32]:
        """The (expanded) query vectors of the ranking so far."""
        return np.asarray(ranking.queries, np.float32)

    def use_database(self, database: NDArray[np.float32]) -> None:
        """Replace the database vectors (an index-phase stage, before the search index is built)."""
        if self.faiss is not None or self.mapped is not None:
            raise InputError(
                f"method {self.m.name}: the database changed after its index was built"
            )
        self.db = np.asarray(database, dtype=np.float32)
        self.shape = (int(self.db.shape[0]), int(self.db.shape[1]))

    @property
    def database(self) -> NDArray[np.float32]:
        """The (augmented) database vectors the index holds."""
        return self.whole

    def verify(
        self, ranks: NDArray[np.int64], r: int, ctx: RunContext, settings: Any, **kw: Any
    ) -> list[VerifiedList]:
        """Verification with the local features of the method's ``local_source``."""
        if self.local is None:
            raise InputError(
                f"method {self.m.name}: a global descriptor has no local features to verify "
                "(name some with --set local_source=rootsift)"
            )
        return self.local.verify(ranks, r, ctx, settings, **kw)
