"""Nearest-neighbour search of global descriptors: exact blocked top-k, FAISS flat and IVF-PQ.

Scores are inner products (cosine for L2-normalised descriptors), higher first. Every search returns
``(scores float32 [n_queries, k], ids int64 [n_queries, k])``, best first.

- :func:`exact_search`: the matrix product in database blocks (bounded temporaries) with an exact
  top-k merge; ties go to the lower database index, as in the rest of oxbench
  (:func:`oxbench.evaluation.ranking.ranks_from_scores`). numpy by default; torch (on a GPU when torch sees
  one) when asked for, or automatically when a deep pipeline has loaded torch and CUDA is available.
- ``search=mapped`` (:mod:`oxbench.index.mapped`): exact search streamed from descriptor shards on
  disk, RAM bounded, on the CPU, a GPU or a Dask cluster.
- :class:`FaissIndex`: ``IndexFlatIP`` (exact, FAISS's BLAS) or ``IndexIVFPQ`` with inner-product
  metric and explicit ``nlist`` (coarse cells), ``m`` (sub-quantisers), ``nbits`` (bits per code)
  and ``nprobe`` (cells visited per query) -- Jegou, Douze & Schmid, "Product quantization for
  nearest neighbor search", TPAMI 2011. An index is persisted as ``.npz`` (the FAISS serialisation
  with its SHA-256 and settings), so a corrupt file is refused before FAISS parses it, and
  :attr:`FaissIndex.bytes_per_vector` says what one database image costs in memory.

IVF-PQ visits only ``nprobe`` of ``nlist`` cells: a query may get fewer than ``k`` results; the
missing slots hold id ``-1`` and score ``-inf``.
"""

from __future__ import annotations

import hashlib
import io
import logging
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError, require
from oxbench.fileio import atomic_write_npz, read_input_bytes
from oxbench.index.mapped import MappedSearch
from oxbench.index.topk import _as_matrix, _merge, _topk_block, torch_merge_block
from oxbench.schema import KindSettings, setting, validate

log = logging.getLogger(__name__)

Backend = Literal["auto", "numpy", "torch"]


def _use_torch(backend: Backend) -> bool:
    if backend == "numpy":
        return False
    if backend == "torch":
        return True
    torch = sys.modules.get("torch")  # auto: only when a deep pipeline already loaded torch
    return torch is not None and bool(torch.cuda.is_available())


def exact_search(
    queries: NDArray[np.floating],
    database: NDArray[np.floating],
    k: int | None = None,
    *,
    block: int = 65536,
    backend: Backend = "auto",
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Exact inner-product search: the top ``k`` database vectors of every query.

    Args:
        queries: ``[n_queries, d]``.
        database: ``[n_db, d]``.
        k: list length (``None``: the whole database, fully sorted).
        block: database rows per matrix product (bounds the temporaries to ``n_queries x block``).
        backend: ``"numpy"``, ``"torch"`` (GPU when available, else CPU threads) or ``"auto"``
            (torch on a GPU when torch is already imported and CUDA is available, else numpy).

    Returns:
        ``(scores float32 [n_queries, k], ids int64 [n_queries, k])``, best first, ties to the
        lower index; ``k`` is capped at ``n_db``.

    Raises:
        InputError: shapes that do not fit, NaN/inf, ``k < 1``, or scores that overflow.

    Example:
        >>> db = np.eye(3, dtype=np.float32)
        >>> exact_search(np.array([[0.0, 1.0, 0.5]], np.float32), db, 2)[1].tolist()
        [[1, 2]]
    """
    db = _as_matrix(database, "database vectors")
    q = _as_matrix(queries, "query vectors", db.shape[1])
    n = db.shape[0]
    if k is not None and k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    if block < 1:
        raise InputError(f"block must be >= 1, got {block}")
    kk = n if k is None else min(k, n)
    if q.shape[0] == 0 or n == 0:
        return np.zeros((q.shape[0], kk), np.float32), np.zeros((q.shape[0], kk), np.int64)
    if _use_torch(backend):
        return _exact_search_torch(q, db, kk, block)
    best_s = np.zeros((q.shape[0], 0), np.float32)
    best_i = np.zeros((q.shape[0], 0), np.int64)
    for start in range(0, n, block):
        s = q @ db[start : start + block].T
        if not np.isfinite(s).all():
            raise InputError("descriptor dot products are not finite (overflow)")
        bs, bi = _topk_block(s, kk)
        best_s, best_i = _merge(np.hstack((best_s, bs)), np.hstack((best_i, bi + start)), kk)
    return best_s, best_i


def _exact_search_torch(
    q: NDArray[np.float32], db: NDArray[np.float32], k: int, block: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """:func:`exact_search` with torch: the same selection (ties to the lower index) on its device."""
    torch = require("torch", "deep")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tq = torch.from_numpy(q).to(device)
    best_s = torch.zeros((q.shape[0], 0), dtype=torch.float32, device=device)
    best_i = torch.zeros((q.shape[0], 0), dtype=torch.int64, device=device)
    n = db.shape[0]
    for start in range(0, n, block):
        s = tq @ torch.from_numpy(db[start : start + block]).to(device).T
        best_s, best_i = torch_merge_block(best_s, best_i, s, start, k)
    return best_s.cpu().numpy().astype(np.float32), best_i.cpu().numpy().astype(np.int64)


# --- FAISS ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExactSearch(KindSettings):
    """``search=exact``: every database vector scored by a matrix product (:func:`exact_search`)."""

    kind: ClassVar[str] = "exact"


@dataclass(frozen=True)
class FlatSearch(KindSettings):
    """``search=faiss-flat``: FAISS's exact inner-product index (``IndexFlatIP``)."""

    kind: ClassVar[str] = "faiss-flat"


@dataclass(frozen=True)
class IvfPqSearch(KindSettings):
    """``search=faiss-ivfpq``: FAISS's inverted file over product-quantised codes (approximate).

    Attributes:
        nlist: IVF cells (k-means centroids of the coarse quantiser).
        m: PQ sub-quantisers (must divide the dimension).
        nbits: bits per sub-quantiser code (8: 256 centroids each).
        nprobe: cells visited per query (``1 .. nlist``).
        seed: k-means seed of the coarse quantiser and the product quantiser.
    """

    kind: ClassVar[str] = "faiss-ivfpq"
    nlist: int = setting(256, S.Int(lo=1, hi=1 << 20), doc="IVF-PQ cells")
    m: int = setting(16, S.Int(lo=1, hi=4096), doc="IVF-PQ sub-quantisers")
    nbits: int = setting(8, S.Int(lo=1, hi=16), doc="IVF-PQ bits per code")
    nprobe: int = setting(16, S.Int(lo=1, hi=1 << 20), doc="IVF-PQ cells visited")
    seed: int = setting(
        0, S.Int(lo=0, hi=2**32 - 1), doc="IVF-PQ: k-means seed of the cell and PQ quantisers"
    )

    def __post_init__(self) -> None:
        validate(self)
        if self.nprobe > self.nlist:
            raise InputError(f"IVF-PQ: nprobe {self.nprobe} is larger than nlist {self.nlist}")


#: The FAISS indexes :class:`FaissIndex` builds.
FaissSearch = FlatSearch | IvfPqSearch

#: The ``search`` setting of a global method: how the database is searched, a kind with its own
#: settings (``--set search=faiss-ivfpq --set search.nlist=1024``).
SEARCH_SPEC = S.Kinds("search", ExactSearch, FlatSearch, IvfPqSearch, MappedSearch)


class FaissIndex:
    """A FAISS inner-product index over database descriptors: fit (train + add), search, save, load.

    Args:
        settings: the index kind and its parameters.
        threads: FAISS OpenMP threads (default: the CPUs this process may use).

    Attributes (after ``fit``): ``index_`` (the FAISS object), ``dim_``, ``ntotal_``.
    """

    def __init__(self, settings: FaissSearch, *, threads: int | None = None) -> None:
        self.settings = settings
        self.threads = threads
        self.index_: Any = None
        self.dim_ = 0
        self.ntotal_ = 0

    def _faiss(self):  # noqa: ANN202 - the faiss module
        from oxbench.index.faiss_setup import load_faiss

        return load_faiss(self.threads)

    def fit(self, database: NDArray[np.floating]) -> FaissIndex:
        """Train the index on ``database`` (IVF-PQ: coarse k-means, then PQ codebooks) and add it.

        Raises:
            InputError: NaN/inf, ``nlist`` larger than the database, ``m`` not dividing the
                dimension, or fewer vectors than one PQ codebook needs (``2 ** nbits``).
        """
        faiss = self._faiss()
        x = _as_matrix(database, "database vectors")
        n, d = x.shape
        st = self.settings
        if n == 0:
            raise InputError("cannot index an empty database")
        if isinstance(st, FlatSearch):
            index = faiss.IndexFlatIP(d)
        else:
            if st.nlist > n:
                raise InputError(
                    f"IVF-PQ: nlist {st.nlist} is larger than the database ({n} vectors)"
                )
            if d % st.m:
                raise InputError(f"IVF-PQ: m {st.m} does not divide the dimension {d}")
            if n < (1 << st.nbits):
                raise InputError(
                    f"IVF-PQ: training a {st.nbits}-bit product quantiser needs at least "
                    f"{1 << st.nbits} vectors, the database has {n}"
                )
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFPQ(
                quantizer, d, st.nlist, st.m, st.nbits, faiss.METRIC_INNER_PRODUCT
            )
            index.cp.seed = st.seed
            index.pq.cp.seed = st.seed
            index.train(x)
            index.nprobe = st.nprobe
        index.add(x)
        self.index_, self.dim_, self.ntotal_ = index, d, n
        return self

    def _check_fitted(self) -> Any:
        if self.index_ is None:
            raise InputError("the index is empty; call fit() or load() first")
        return self.index_

    def search(
        self, queries: NDArray[np.floating], k: int
    ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """The top ``k`` of every query: ``(scores [n_q, k], ids [n_q, k])``; ``-1`` / ``-inf`` pad.

        ``k`` is capped at the number of indexed vectors.
        """
        index = self._check_fitted()
        q = _as_matrix(queries, "query vectors", self.dim_)
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        k = min(k, self.ntotal_)
        self._faiss()  # thread count
        scores, ids = index.search(q, k)
        ids = ids.astype(np.int64)
        scores = np.where(ids >= 0, scores, -np.inf).astype(np.float32)
        return scores, ids

    @property
    def bytes_per_vector(self) -> int:
        """Memory one database vector costs in the index: its code, plus its id in IVF lists."""
        index = self._check_fitted()
        return int(index.code_size) + (8 if isinstance(self.settings, IvfPqSearch) else 0)

    def describe(self) -> dict[str, Any]:
        """Facts recorded with search results: kind, settings, vectors, bytes per vector."""
        return {
            **self.settings.to_dict(),
            "ntotal": self.ntotal_,
            "dim": self.dim_,
            "bytes_per_image": self.bytes_per_vector,
        }

    def save(self, path: str | Path, *, stands_for: dict[str, object] | None = None) -> Path:
        """Persist the index (FAISS serialisation + its SHA-256 + settings) as ``.npz``;
        ``stands_for``: what it was built from (:func:`oxbench.cache.stands_for_record`, checked
        by :meth:`load`)."""
        from oxbench.cache import STANDS_FOR_KEY, stands_for_record

        index = self._check_fitted()
        blob = np.asarray(self._faiss().serialize_index(index), dtype=np.uint8)
        meta = {f"setting_{k}": np.array(v) for k, v in self.settings.to_dict().items()}
        if stands_for is not None:
            meta[STANDS_FOR_KEY] = stands_for_record(stands_for)
        return atomic_write_npz(
            path,
            {
                "faiss": blob,
                "sha256": np.array(hashlib.sha256(blob.tobytes()).hexdigest()),
                "dim": np.array(self.dim_),
                "ntotal": np.array(self.ntotal_),
                **meta,
            },
        )

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        threads: int | None = None,
        stands_for: dict[str, object] | None = None,
    ) -> FaissIndex:
        """Read an index written by :meth:`save` (for ``stands_for``, when given).

        Raises:
            InputError: unreadable file, checksum mismatch (corrupt), an index built from other
                vectors than ``stands_for`` (:class:`~oxbench.cache.CorruptCache`), or an index
                FAISS refuses.
        """
        from oxbench.cache import STANDS_FOR_KEY, check_stands_for

        data = read_input_bytes(path, limit=1 << 40)
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                blob = np.asarray(z["faiss"], np.uint8)
                digest = str(z["sha256"])
                dim, ntotal = int(z["dim"]), int(z["ntotal"])
                raw = {
                    k[len("setting_") :]: z[k].item() for k in z.files if k.startswith("setting_")
                }
                found = str(z[STANDS_FOR_KEY]) if STANDS_FOR_KEY in z.files else None
        except (OSError, KeyError, ValueError, EOFError, TypeError, zipfile.BadZipFile) as exc:
            raise InputError(f"unreadable index file ({exc})", path) from None
        if hashlib.sha256(blob.tobytes()).hexdigest() != digest:
            raise InputError("corrupt index file (checksum mismatch)", path)
        if stands_for is not None:
            check_stands_for(found, stands_for, what="index file", path=path)
        kind = raw.pop("kind", None)
        if kind not in (FlatSearch.kind, IvfPqSearch.kind):
            raise InputError(f"malformed index settings (kind {kind!r})", path)
        try:
            settings = SEARCH_SPEC.check("search", {"kind": kind, **raw}, what="index file setting")
        except InputError as exc:
            raise InputError(f"malformed index settings ({exc})", path) from None
        out = cls(settings, threads=threads)
        faiss = out._faiss()
        try:
            index = faiss.deserialize_index(blob)
        except RuntimeError as exc:
            raise InputError(
                f"FAISS cannot read the index ({str(exc).splitlines()[0]})", path
            ) from None
        if index.d != dim or index.ntotal != ntotal:
            raise InputError(
                f"index holds {index.ntotal} x {index.d}, its header says {ntotal} x {dim}", path
            )
        if not _finite_index(faiss, index):
            raise InputError("index file holds NaN or infinite vectors", path)
        if isinstance(settings, IvfPqSearch):
            index.nprobe = settings.nprobe  # deserialize_index returns the concrete class
        out.index_, out.dim_, out.ntotal_ = index, dim, ntotal
        return out


def _finite_index(faiss: Any, index: Any) -> bool:
    """Whether the float content of a flat or IVF-PQ index (vectors, centroids) is finite."""
    parts = []
    if hasattr(index, "pq"):  # IVF-PQ: the product quantizer's and the coarse quantizer's centroids
        parts.append(faiss.vector_to_array(index.pq.centroids))
        parts.append(index.quantizer.reconstruct_n(0, index.nlist))
    elif hasattr(index, "codes"):  # flat: the vectors themselves, stored as float32 bytes
        parts.append(faiss.vector_to_array(index.codes).view(np.float32))
    return all(bool(np.isfinite(p).all()) for p in parts)


def recall_at(found: NDArray[np.int64], truth: NDArray[np.int64], k: int) -> float:
    """Mean over queries of ``|found[:k] & truth[:k]| / k``: how much of the exact top-k is found."""
    if found.shape[0] != truth.shape[0]:
        raise ValueError(f"{found.shape[0]} result rows, {truth.shape[0]} reference rows")
    k = min(k, truth.shape[1])
    hits = [
        len(np.intersect1d(f[:k][f[:k] >= 0], t[:k])) for f, t in zip(found, truth, strict=True)
    ]
    return float(np.mean(hits)) / k if hits else 0.0
