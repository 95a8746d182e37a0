"""A compressed, memory-mapped inverted file: posting lists as delta + variable-byte image ids.

:class:`~oxbench.index.inverted.InvertedFile` keeps the weighted database in RAM twice (the image
vectors and their transpose, the posting lists, as scipy CSR matrices with 32-bit indices and
values). At a million images that no longer fits. :class:`CompressedPostings` keeps one copy, on
disk, memory-mapped:

- ``ids.bin``: for each word, its images' ids in increasing order, each stored as the gap to the
  previous id (the first as itself) in *variable-byte* code: 7 bits per byte, least significant
  group first, the high bit set on every byte but a value's last (Cutting & Pedersen 1990's byte
  code, as in Zobel & Moffat 2006, "Inverted files for text search engines");
- ``weights.npy``: the posting's weight, ``float32`` (the scores are the ones of the in-RAM file,
  exactly) or ``float16`` (half the bytes; scores within float16 rounding);
- ``offsets.npy``: ``int64 [n_words + 1, 2]`` where each word's ids (bytes) and weights (entries)
  start;
- ``meta.json``: counts, the weight dtype, what the lists were built from (``stands_for``) and
  a digest (:class:`oxbench.storage.StoreFolder`); the mapped files are bound to it and to the
  offsets (:func:`oxbench.cache.record_written`).

A query decodes only the lists of its own words and accumulates ``q_w * weight`` into the image
scores: the work is the length of those lists, as for the in-RAM file. The optional compiled
kernel (``bow_scatter`` in :mod:`oxbench.evaluation._accel`, built by ``setup.py``) decodes and
adds in one pass; without it, with ``OXBENCH_NO_ACCEL=1``, or on a list it finds damaged, numpy
does the same float32 products and additions in the same order: the same scores, to the bit.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.cache import check_written, record_written
from oxbench.errors import InputError
from oxbench.evaluation.kernels import _accel, accelerated
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.fileio import (
    atomic_open,
    atomic_write_npy,
    discard_folder,
    json_digest,
    make_temp_folder,
)
from oxbench.storage import StoreFolder, known_files

WeightDtype = Literal["float32", "float16"]
FORMAT = 1

_bow_scatter = getattr(_accel, "bow_scatter", None)


def vbyte_encode(values: NDArray[np.integer]) -> NDArray[np.uint8]:
    """Variable-byte code of non-negative integers (7 bits a byte, low group first, high bit =
    more bytes follow).

    Example:
        >>> vbyte_encode(np.array([5, 300])).tolist()
        [5, 172, 2]
    """
    v = np.asarray(values, np.uint64).ravel()
    if v.size == 0:
        return np.zeros(0, np.uint8)
    n_bytes = vbyte_lengths(v)
    starts = np.zeros(v.size, np.int64)
    np.cumsum(n_bytes[:-1], out=starts[1:])
    out = np.zeros(int(n_bytes.sum()), np.uint8)
    value_of = np.repeat(np.arange(v.size), n_bytes)
    group = np.arange(out.size) - starts[value_of]
    payload = (v[value_of] >> (np.uint64(7) * group.astype(np.uint64))) & np.uint64(0x7F)
    more = group < n_bytes[value_of] - 1
    out[:] = payload.astype(np.uint8) | (more.astype(np.uint8) << 7)
    return out


def vbyte_lengths(values: NDArray[np.integer]) -> NDArray[np.int64]:
    """Bytes of each non-negative integer's variable-byte code (:func:`vbyte_encode`)."""
    v = np.asarray(values, np.uint64).ravel()
    n_bytes = np.ones(v.size, np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        n_bytes += rest > 0
        rest >>= np.uint64(7)
    return n_bytes


def vbyte_decode(code: NDArray[np.uint8]) -> NDArray[np.int64]:
    """The integers of a variable-byte code (:func:`vbyte_encode`).

    Raises:
        InputError: the code ends inside a value.
    """
    b = np.asarray(code, np.uint8).ravel()
    if b.size == 0:
        return np.zeros(0, np.int64)
    last = (b & 0x80) == 0
    if not last[-1]:
        raise InputError("variable-byte code ends inside a value")
    value_of = np.zeros(b.size, np.int64)
    value_of[1:] = np.cumsum(last[:-1])
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    group = np.arange(b.size) - starts[value_of]
    if group.max() > 8:
        raise InputError("variable-byte value longer than 63 bits")
    parts = (b & 0x7F).astype(np.int64) << (7 * group)
    return np.add.reduceat(parts, starts)


#: Postings encoded at a time by the writers (bounds their temporary arrays, not the result).
BLOCK_POSTINGS = 1 << 20


def _check_weight_dtype(weights: str) -> None:
    if weights not in ("float32", "float16"):
        raise InputError(f"posting weights must be float32 or float16, got {weights!r}")


def _word_blocks(counts: NDArray[np.int64], budget: int | None = None) -> Iterator[tuple[int, int]]:
    """Consecutive word ranges ``[w0, w1)`` of about ``budget`` postings each (at least one word)."""
    budget = BLOCK_POSTINGS if budget is None else budget
    cum = np.cumsum(counts)
    w0, n = 0, len(counts)
    while w0 < n:
        base = int(cum[w0 - 1]) if w0 else 0
        w1 = min(max(int(np.searchsorted(cum, base + budget, side="right")), w0 + 1), n)
        yield w0, w1
        w0 = w1


def _ranges(starts: NDArray[np.int64], ends: NDArray[np.int64]) -> NDArray[np.int64]:
    """The concatenation of ``arange(s, e)`` for each pair, without a Python loop."""
    lens = ends - starts
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    if not len(lens):
        return np.zeros(0, np.int64)
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    return np.arange(int(lens.sum()), dtype=np.int64) + shift


#: The memory-mapped files of a folder (written with :func:`oxbench.cache.record_written`).
_MAPPED = ("ids.bin", "weights.npy")
#: The kind in messages.
WHAT = "compressed inverted file"


def lists_folder(folder: str | Path) -> StoreFolder:
    """The folder of compressed posting lists, as :mod:`oxbench.storage` checks and builds it."""
    names = ["offsets.npy", *_MAPPED]
    return StoreFolder(Path(folder), WHAT, FORMAT, known_files(names, mapped=_MAPPED))


def _postings_record(meta: Mapping[str, object], offsets: NDArray[np.int64]) -> dict[str, object]:
    """What the mapped files of a folder stand for: its ``meta.json`` and the lists' offsets."""
    return {"meta": json_digest(meta), "offsets": hashlib.sha256(offsets.tobytes()).hexdigest()}


class CompressedPostings:
    """The posting lists of a built inverted file, compressed on disk and memory-mapped.

    Build with :meth:`write` from an :class:`~oxbench.index.inverted.InvertedFile`'s posting lists
    (its ``postings_``, ``[n_words, n_db]`` CSR), open with :meth:`open`; score like the in-RAM file
    (:meth:`scores_of_vectors`, :meth:`search`).

    Attributes:
        folder: where the files are.
        n_words, n_db: the shape of the posting matrix.
        weight_dtype: ``float32`` or ``float16``.
    """

    def __init__(
        self,
        folder: Path,
        n_words: int,
        n_db: int,
        weight_dtype: WeightDtype,
        offsets: NDArray[np.int64],
        ids: NDArray[np.uint8],
        weights: NDArray[np.floating],
    ) -> None:
        self.folder = folder
        self.n_words, self.n_db = n_words, n_db
        self.weight_dtype = weight_dtype
        self._offsets, self._ids, self._weights = offsets, ids, weights

    @classmethod
    def write(
        cls,
        postings: sp.spmatrix,
        folder: str | Path,
        *,
        weights: WeightDtype = "float32",
        stands_for: Mapping[str, object] | None = None,
    ) -> CompressedPostings:
        """Compress ``postings`` (``[n_words, n_db]``, one row per word) into ``folder`` (built
        beside it and put in its place whole: :meth:`oxbench.storage.StoreFolder.building`).
        ``stands_for``: what the lists are built from (inputs' content digests, settings),
        recorded in ``meta.json`` for :meth:`open` to check.

        Raises:
            InputError: an unknown weight dtype, non-finite weights, or a ``folder`` that is not
                oxbench's.
        """
        _check_weight_dtype(weights)
        m = sp.csr_matrix(postings, dtype=np.float32)
        m.sort_indices()
        m.sum_duplicates()
        if m.nnz and not np.isfinite(m.data).all():
            raise InputError("posting weights must be finite")
        counts = np.diff(m.indptr).astype(np.int64)

        def blocks() -> Iterator[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float32]]]:
            for w0, w1 in _word_blocks(counts):
                a, b = int(m.indptr[w0]), int(m.indptr[w1])
                yield counts[w0:w1], m.indices[a:b].astype(np.int64), m.data[a:b]

        with lists_folder(folder).building() as tmp:
            cls._write(
                tmp, int(m.shape[0]), int(m.shape[1]), int(m.nnz), blocks(), weights, stands_for
            )
        return cls.open(folder, stands_for=stands_for)

    @classmethod
    def build(
        cls,
        rows: Iterable[sp.spmatrix],
        n_words: int,
        folder: str | Path,
        *,
        weights: WeightDtype = "float32",
        stands_for: Mapping[str, object] | None = None,
    ) -> CompressedPostings:
        """Compress the posting lists of database vectors given in chunks of rows, never holding
        them whole: the same files as :meth:`write` of the whole matrix's transpose.

        Each chunk (``[n_i, n_words]`` weighted vectors of the next ``n_i`` images, in index
        order) is transposed and written to a temporary run in the build folder; the runs are then
        merged word block by word block (each word's list: its run pieces in run order, ids
        increasing). The memory used is a chunk and a block, whatever the number of images.

        Raises:
            InputError: an unknown weight dtype, a chunk of another width, or non-finite weights.
        """
        _check_weight_dtype(weights)
        with lists_folder(folder).building() as tmp:
            cls._build(rows, n_words, tmp, weights, stands_for)
        return cls.open(folder, stands_for=stands_for)

    @classmethod
    def _build(
        cls,
        rows: Iterable[sp.spmatrix],
        n_words: int,
        folder: Path,
        weights: WeightDtype,
        stands_for: Mapping[str, object] | None,
    ) -> None:
        runs_dir = make_temp_folder(folder / "runs")
        try:
            runs: list[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float32]]] = []
            n_db = 0
            for k, chunk in enumerate(rows):
                c = sp.csr_matrix(chunk, dtype=np.float32)
                if c.shape[1] != n_words:
                    raise InputError(
                        f"database vectors of {c.shape[1]} words, the index has {n_words}"
                    )
                c.sum_duplicates()
                if c.nnz and not np.isfinite(c.data).all():
                    raise InputError("posting weights must be finite")
                t = c.T.tocsr()
                t.sort_indices()
                for name, arr in (
                    ("indptr", t.indptr.astype(np.int64)),
                    ("ids", t.indices.astype(np.int64) + n_db),
                    ("data", t.data),
                ):
                    np.save(runs_dir / f"{k}.{name}.npy", arr, allow_pickle=False)
                runs.append(
                    tuple(
                        np.load(runs_dir / f"{k}.{name}.npy", mmap_mode="r")  # type: ignore[misc]
                        for name in ("indptr", "ids", "data")
                    )
                )
                n_db += c.shape[0]
            counts = np.zeros(n_words, np.int64)
            for indptr, _, _ in runs:
                counts += np.diff(indptr)

            def blocks() -> Iterator[
                tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float32]]
            ]:
                for w0, w1 in _word_blocks(counts):
                    ids, data, word = [], [], []
                    for indptr, run_ids, run_data in runs:
                        a, b = int(indptr[w0]), int(indptr[w1])
                        ids.append(np.asarray(run_ids[a:b]))
                        data.append(np.asarray(run_data[a:b]))
                        word.append(np.repeat(np.arange(w0, w1), np.diff(indptr[w0 : w1 + 1])))
                    order = np.argsort(
                        np.concatenate(word), kind="stable"
                    )  # by word; runs (ids) in order
                    yield counts[w0:w1], np.concatenate(ids)[order], np.concatenate(data)[order]

            cls._write(folder, n_words, n_db, int(counts.sum()), blocks(), weights, stands_for)
        finally:
            discard_folder(runs_dir)

    @classmethod
    def _write(
        cls,
        folder: Path,
        n_words: int,
        n_db: int,
        nnz: int,
        blocks: Iterable[tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float32]]],
        weights: WeightDtype,
        stands_for: Mapping[str, object] | None,
    ) -> None:
        """Write the lists given word block by word block into the build folder: ``(postings
        per word, ids, weights)`` of consecutive words, each word's ids increasing."""
        offsets = np.zeros((n_words + 1, 2), np.int64)
        w = 0
        header = {
            "descr": np.lib.format.dtype_to_descr(np.dtype(weights)),
            "fortran_order": False,
            "shape": (nnz,),
        }
        with atomic_open(folder / "ids.bin") as f_ids, atomic_open(folder / "weights.npy") as f_wts:
            np.lib.format.write_array_header_1_0(f_wts, header)
            for counts, ids, data in blocks:
                k = len(counts)
                starts = np.cumsum(counts) - counts
                gaps = np.diff(ids, prepend=0)
                first = starts[counts > 0]
                gaps[first] = ids[first]  # each list starts from 0
                ends = np.concatenate(([0], np.cumsum(vbyte_lengths(gaps))))
                offsets[w + 1 : w + k + 1, 0] = offsets[w, 0] + np.cumsum(
                    ends[starts + counts] - ends[starts]
                )
                offsets[w + 1 : w + k + 1, 1] = offsets[w, 1] + np.cumsum(counts)
                f_ids.write(vbyte_encode(gaps).tobytes())
                f_wts.write(np.ascontiguousarray(data, dtype=weights).tobytes())
                w += k
            if w != n_words or int(offsets[-1, 1]) != nnz:
                raise AssertionError(
                    f"posting blocks cover {w} of {n_words} words, {offsets[-1, 1]} of {nnz} postings"
                )
        atomic_write_npy(folder / "offsets.npy", offsets)
        box = lists_folder(folder)
        fields = {
            "n_words": n_words,
            "n_db": n_db,
            "nnz": nnz,
            "weights": weights,
            "ids_bytes": int(offsets[-1, 0]),
        }
        meta = box.fields(fields, stands_for=stands_for)
        for name in _MAPPED:  # mapped, never hashed: bound to the file written (and the offsets)
            record_written(folder / name, _postings_record(meta, offsets))
        box.write_meta(fields, stands_for=stands_for)

    @classmethod
    def open(
        cls, folder: str | Path, *, stands_for: Mapping[str, object] | None = None
    ) -> CompressedPostings:
        """Map a folder written by :meth:`write` (nothing is read into RAM but the offsets);
        ``stands_for``: what it must have been built for (``None``: not checked).

        Raises:
            InputError: a file is missing, or the files do not agree with ``meta.json``.
            CorruptCache: a folder built for another ``stands_for``, a damaged ``meta.json``
                or offsets, or a mapped file that is not the one written.
        """
        folder = Path(folder)
        meta = lists_folder(folder).meta(stands_for=stands_for)
        try:
            n_words, n_db, nnz = int(meta["n_words"]), int(meta["n_db"]), int(meta["nnz"])
            wdt = meta["weights"]
            offsets = np.load(folder / "offsets.npy", allow_pickle=False)
            weights = np.load(folder / "weights.npy", mmap_mode="r", allow_pickle=False)
            ids = (
                np.memmap(folder / "ids.bin", dtype=np.uint8, mode="r")
                if meta["ids_bytes"]
                else np.zeros(0, np.uint8)
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(
                f"unreadable compressed inverted file ({type(exc).__name__}: {exc})", folder
            ) from None
        ok = (
            wdt in ("float32", "float16")
            and offsets.shape == (n_words + 1, 2)
            and offsets.dtype == np.int64
            and weights.shape == (nnz,)
            and weights.dtype == np.dtype(wdt)
            and len(ids) == int(meta["ids_bytes"]) == int(offsets[-1, 0])
            and int(offsets[-1, 1]) == nnz
            and bool((np.diff(offsets, axis=0) >= 0).all())
        )
        if not ok:
            raise InputError(
                "compressed inverted file does not agree with its meta.json (damaged?)", folder
            )
        for name in _MAPPED:
            check_written(
                folder / name,
                what="compressed inverted file",
                stands_for=_postings_record(meta, offsets),
            )
        return cls(folder, n_words, n_db, wdt, offsets, ids, weights)

    @property
    def offsets_bytes(self) -> int:
        """Bytes of the offsets (read into RAM on open; the lists stay mapped)."""
        return int(self._offsets.nbytes)

    @property
    def nbytes(self) -> int:
        """Bytes of the posting lists on disk (ids, weights and offsets)."""
        return int(self._ids.nbytes + self._weights.nbytes + self._offsets.nbytes)

    def posting(self, word: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """``(image ids, weights)`` of one word, ids increasing."""
        (b0, w0), (b1, w1) = self._offsets[word], self._offsets[word + 1]
        ids = np.cumsum(vbyte_decode(np.asarray(self._ids[b0:b1])))
        if len(ids) != w1 - w0 or (len(ids) and ids[-1] >= self.n_db):
            raise InputError(
                f"compressed inverted file: the list of word {word} is damaged", self.folder
            )
        return ids, np.asarray(self._weights[w0:w1], np.float32)

    def scores_of_vectors(self, vectors: sp.spmatrix) -> NDArray[np.float32]:
        """Dot products ``[n_queries, n_db]`` of weighted query vectors (``[n, n_words]``) with the
        database: each query's words' lists decoded and accumulated in ``float32``, word by word
        in increasing word order (the in-RAM file's order, so its scores exactly).

        The compiled kernel (``bow_scatter``, when :func:`oxbench.evaluation.kernels.accelerated`)
        scores a query in one pass over its lists; otherwise, or when it finds a list damaged,
        numpy does (:meth:`_scores_numpy`), from zeros: the same scores to the bit either way.
        """
        q = sp.csr_matrix(vectors, dtype=np.float32)
        q.sort_indices()
        if q.shape[1] != self.n_words:
            raise InputError(f"query vectors have {q.shape[1]} words, the index {self.n_words}")
        out = np.zeros((q.shape[0], self.n_db), np.float32)
        kernel = _bow_scatter if accelerated() else None
        for i in range(q.shape[0]):
            a, b = q.indptr[i], q.indptr[i + 1]
            if a == b:
                continue
            words, weights = q.indices[a:b], q.data[a:b]
            if kernel is not None and not kernel(
                out[i], self._ids, self._weights, self._offsets, words, weights
            ):
                continue
            out[i] = 0.0  # a kernel stopped by a damaged list may have added part of the sums
            self._scores_numpy(out[i], words, weights)
        return out

    def _scores_numpy(
        self, out: NDArray[np.float32], words: NDArray[np.integer], weights: NDArray[np.float32]
    ) -> None:
        """``out[id] += weights[j] * weight`` over the lists of ``words`` (increasing), numpy's
        way: the lists decoded at once, the float32 products added with ``np.add.at``."""
        (b0, w0), (b1, w1) = self._offsets[words].T, self._offsets[words + 1].T
        lens = w1 - w0
        gaps = vbyte_decode(np.asarray(self._ids[_ranges(b0, b1)]))
        if len(gaps) != int(lens.sum()):
            raise InputError("compressed inverted file: a posting list is damaged", self.folder)
        total = np.cumsum(gaps)
        starts = np.cumsum(lens) - lens
        nonempty = lens > 0
        base = np.zeros(len(words), np.int64)
        base[nonempty] = total[starts[nonempty]] - gaps[starts[nonempty]]
        ids = total - np.repeat(base, lens)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n_db):
            raise InputError("compressed inverted file: a posting list is damaged", self.folder)
        contrib = np.repeat(weights, lens) * np.asarray(self._weights[_ranges(w0, w1)], np.float32)
        np.add.at(out, ids, contrib)

    def search(self, vectors: sp.spmatrix, k: int | None = None) -> NDArray[np.int64]:
        """Ranked database indices ``[n_queries, k]`` of weighted query vectors, best first (ties
        by lower index)."""
        return ranks_from_scores(self.scores_of_vectors(vectors).T, k)
