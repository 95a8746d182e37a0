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
- ``meta.json``: counts, the weight dtype and a digest of the three data files' sizes.

A query decodes only the lists of its own words and accumulates ``q_w * weight`` into the image
scores: the work is the length of those lists, as for the in-RAM file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_npy,
    make_folder,
    read_input_bytes,
)

WeightDtype = Literal["float32", "float16"]
FORMAT = 1


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
    n_bytes = np.ones(v.size, np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        n_bytes += rest > 0
        rest >>= np.uint64(7)
    starts = np.zeros(v.size, np.int64)
    np.cumsum(n_bytes[:-1], out=starts[1:])
    out = np.zeros(int(n_bytes.sum()), np.uint8)
    value_of = np.repeat(np.arange(v.size), n_bytes)
    group = np.arange(out.size) - starts[value_of]
    payload = (v[value_of] >> (np.uint64(7) * group.astype(np.uint64))) & np.uint64(0x7F)
    more = group < n_bytes[value_of] - 1
    out[:] = payload.astype(np.uint8) | (more.astype(np.uint8) << 7)
    return out


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


def _ranges(starts: NDArray[np.int64], ends: NDArray[np.int64]) -> NDArray[np.int64]:
    """The concatenation of ``arange(s, e)`` for each pair, without a Python loop."""
    lens = ends - starts
    keep = lens > 0
    starts, lens = starts[keep], lens[keep]
    if not len(lens):
        return np.zeros(0, np.int64)
    shift = np.repeat(starts - (np.cumsum(lens) - lens), lens)
    return np.arange(int(lens.sum()), dtype=np.int64) + shift


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

    def __init__(self, folder: Path, n_words: int, n_db: int, weight_dtype: WeightDtype,
                 offsets: NDArray[np.int64], ids: NDArray[np.uint8], weights: NDArray[np.floating]) -> None:  # fmt: skip
        self.folder = folder
        self.n_words, self.n_db = n_words, n_db
        self.weight_dtype = weight_dtype
        self._offsets, self._ids, self._weights = offsets, ids, weights

    @classmethod
    def write(cls, postings: sp.spmatrix, folder: str | Path, *, weights: WeightDtype = "float32") -> CompressedPostings:
        """Compress ``postings`` (``[n_words, n_db]``, one row per word) into ``folder``.

        Raises:
            InputError: an unknown weight dtype, or non-finite weights.
        """
        if weights not in ("float32", "float16"):
            raise InputError(f"posting weights must be float32 or float16, got {weights!r}")
        m = sp.csr_matrix(postings, dtype=np.float32)
        m.sort_indices()
        m.sum_duplicates()
        if m.nnz and not np.isfinite(m.data).all():
            raise InputError("posting weights must be finite")
        folder = make_folder(Path(folder))
        ids = m.indices.astype(np.int64)
        row_of = np.repeat(np.arange(m.shape[0]), np.diff(m.indptr))
        gaps = np.diff(ids, prepend=0)
        first = m.indptr[:-1][np.diff(m.indptr) > 0]
        gaps[first] = ids[first]  # each list starts from 0
        code_len = np.ones(m.nnz, np.int64)
        rest = gaps >> 7
        while rest.any():
            code_len += rest > 0
            rest >>= 7
        byte_offsets = np.zeros(m.shape[0] + 1, np.int64)
        np.add.at(byte_offsets, row_of + 1, code_len)
        np.cumsum(byte_offsets, out=byte_offsets)
        offsets = np.stack([byte_offsets, m.indptr.astype(np.int64)], axis=1)
        atomic_write_bytes(folder / "ids.bin", vbyte_encode(gaps).tobytes())
        atomic_write_npy(folder / "weights.npy", m.data.astype(weights))
        atomic_write_npy(folder / "offsets.npy", offsets)
        atomic_write_json(folder / "meta.json", {
            "format": FORMAT, "n_words": int(m.shape[0]), "n_db": int(m.shape[1]), "nnz": int(m.nnz),
            "weights": weights, "ids_bytes": int(byte_offsets[-1]),
        })  # fmt: skip
        return cls.open(folder)

    @classmethod
    def open(cls, folder: str | Path) -> CompressedPostings:
        """Map a folder written by :meth:`write` (nothing is read into RAM but the offsets).

        Raises:
            InputError: a file is missing, or the files do not agree with ``meta.json``.
        """
        folder = Path(folder)
        try:
            meta = json.loads(read_input_bytes(folder / "meta.json", limit=1 << 16))
            n_words, n_db, nnz = int(meta["n_words"]), int(meta["n_db"]), int(meta["nnz"])
            wdt = meta["weights"]
            offsets = np.load(folder / "offsets.npy", allow_pickle=False)
            weights = np.load(folder / "weights.npy", mmap_mode="r", allow_pickle=False)
            ids = np.memmap(folder / "ids.bin", dtype=np.uint8, mode="r") if meta["ids_bytes"] else np.zeros(0, np.uint8)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"unreadable compressed inverted file ({type(exc).__name__}: {exc})", folder) from None
        ok = (meta.get("format") == FORMAT and wdt in ("float32", "float16") and offsets.shape == (n_words + 1, 2)
              and offsets.dtype == np.int64 and weights.shape == (nnz,) and weights.dtype == np.dtype(wdt)
              and len(ids) == int(meta["ids_bytes"]) == int(offsets[-1, 0]) and int(offsets[-1, 1]) == nnz
              and bool((np.diff(offsets, axis=0) >= 0).all()))  # fmt: skip
        if not ok:
            raise InputError("compressed inverted file does not agree with its meta.json (damaged?)", folder)
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
            raise InputError(f"compressed inverted file: the list of word {word} is damaged", self.folder)
        return ids, np.asarray(self._weights[w0:w1], np.float32)

    def scores_of_vectors(self, vectors: sp.spmatrix) -> NDArray[np.float32]:
        """Dot products ``[n_queries, n_db]`` of weighted query vectors (``[n, n_words]``) with the
        database: each query's words' lists decoded at once and accumulated in ``float32``, word by
        word in increasing word order (the in-RAM file's order, so its scores exactly)."""
        q = sp.csr_matrix(vectors, dtype=np.float32)
        q.sort_indices()
        if q.shape[1] != self.n_words:
            raise InputError(f"query vectors have {q.shape[1]} words, the index {self.n_words}")
        out = np.zeros((q.shape[0], self.n_db), np.float32)
        for i in range(q.shape[0]):
            a, b = q.indptr[i], q.indptr[i + 1]
            words = q.indices[a:b]
            if not len(words):
                continue
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
            contrib = np.repeat(q.data[a:b], lens) * np.asarray(self._weights[_ranges(w0, w1)], np.float32)
            np.add.at(out[i], ids, contrib)
        return out

    def search(self, vectors: sp.spmatrix, k: int | None = None) -> NDArray[np.int64]:
        """Ranked database indices ``[n_queries, k]`` of weighted query vectors, best first (ties
        by lower index)."""
        return ranks_from_scores(self.scores_of_vectors(vectors).T, k)
