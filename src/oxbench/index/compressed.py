"""A compressed, memory-mappable inverted file: delta + variable-byte postings, float32 weights.

:class:`~oxbench.index.inverted.InvertedFile` keeps two sparse copies of the database (rows and
posting lists), 8 bytes per posting each. At a million images the posting lists are what search
needs; :class:`CompressedInvertedFile` keeps only those, with each list's image ids sorted,
replaced by their gaps (the first id itself) and written in variable-byte code (7 bits per byte,
the high bit set on every byte but a value's last: Zobel & Moffat, "Inverted files for text search
engines", 2006): a gap below 128 takes one byte instead of four. The weights stay ``float32``, so
scores are those of the uncompressed file.

Scoring a query adds, word by word in increasing word order, ``q_w * weight`` into a ``float32``
score vector: the same products summed in the same order as scipy's sparse product
(``q @ postings``), so the scores -- and the rankings -- are identical, not merely close.

The arrays are written as ``.npy`` files in one folder and read back memory-mapped
(:meth:`CompressedInvertedFile.load`): a query touches only the pages of its own words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.fileio import atomic_write_json, atomic_write_npy, make_folder

_FILES = ("byte_offsets", "offsets", "codes", "weights")
FORMAT = 1


def varbyte_encode(values: NDArray[np.integer]) -> NDArray[np.uint8]:
    """Variable-byte code of non-negative integers: low 7 bits first, high bit = more bytes follow.

    Example:
        >>> varbyte_encode(np.array([5, 300])).tolist()
        [5, 172, 2]
    """
    v = np.asarray(values, dtype=np.uint64)
    if v.size == 0:
        return np.zeros(0, np.uint8)
    nbytes = np.ones(v.size, np.int64)
    rest = v >> np.uint64(7)
    while rest.any():
        more = rest > 0
        nbytes += more
        rest >>= np.uint64(7)
    owner = np.repeat(np.arange(v.size), nbytes)
    first = np.cumsum(nbytes) - nbytes
    k = np.arange(owner.size) - first[owner]  # byte position within its value
    out = ((v[owner] >> (np.uint64(7) * k.astype(np.uint64))) & np.uint64(0x7F)).astype(np.uint8)
    out[k < nbytes[owner] - 1] |= 0x80
    return out


def varbyte_decode(code: NDArray[np.uint8]) -> NDArray[np.int64]:
    """The integers of :func:`varbyte_encode`'s code.

    Raises:
        InputError: the code ends inside a value (its last byte has the high bit set).

    Example:
        >>> varbyte_decode(np.array([5, 172, 2], np.uint8)).tolist()
        [5, 300]
    """
    b = np.asarray(code, dtype=np.uint8)
    if b.size == 0:
        return np.zeros(0, np.int64)
    if b[-1] & 0x80:
        raise InputError("variable-byte code ends inside a value")
    last = (b & 0x80) == 0
    ends = np.flatnonzero(last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    owner = np.repeat(np.arange(ends.size), ends - starts + 1)
    k = np.arange(b.size) - starts[owner]
    parts = (b & 0x7F).astype(np.int64) << (7 * k)
    return np.add.reduceat(parts, starts)


def _ranges(starts: NDArray[np.int64], stops: NDArray[np.int64]) -> NDArray[np.int64]:
    """The positions ``start .. stop - 1`` of every range, one range after the other."""
    lens = (stops - starts).astype(np.int64)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    first = np.cumsum(lens) - lens
    return np.repeat(starts.astype(np.int64) - first, lens) + np.arange(total, dtype=np.int64)


class CompressedInvertedFile:
    """Posting lists in delta + variable-byte code with ``float32`` weights (module docstring).

    Attributes:
        n_words: vocabulary size.
        n_images: images indexed.
        byte_offsets: ``int64 [n_words + 1]``: word ``w``'s code is ``codes[byte_offsets[w]:byte_offsets[w+1]]``.
        offsets: ``int64 [n_words + 1]``: its weights are ``weights[offsets[w]:offsets[w+1]]``.
        codes: ``uint8``: the gaps of every list, one after the other.
        weights: ``float32 [n_postings]``.

    Example:
        >>> post = sp.csr_matrix(np.array([[0.5, 0, 0.5], [0, 1.0, 0]], np.float32))  # 2 words x 3 images
        >>> cif = CompressedInvertedFile.from_postings(post)
        >>> cif.scores_of_vectors(sp.csr_matrix(np.array([[1.0, 0.0]], np.float32))).tolist()
        [[0.5, 0.0, 0.5]]
    """

    def __init__(self, n_words: int, n_images: int, byte_offsets: NDArray[np.int64], offsets: NDArray[np.int64],
                 codes: NDArray[np.uint8], weights: NDArray[np.float32]) -> None:  # fmt: skip
        if byte_offsets.shape != (n_words + 1,) or offsets.shape != (n_words + 1,):
            raise InputError(f"compressed inverted file: offsets must have {n_words + 1} entries")
        if int(offsets[-1]) != weights.shape[0] or int(byte_offsets[-1]) != codes.shape[0]:
            raise InputError("compressed inverted file: offsets do not fit the codes and weights")
        self.n_words, self.n_images = int(n_words), int(n_images)
        self.byte_offsets, self.offsets, self.codes, self.weights = byte_offsets, offsets, codes, weights

    @classmethod
    def from_postings(cls, postings: sp.spmatrix) -> CompressedInvertedFile:
        """Compress a ``[n_words, n_images]`` posting matrix (``InvertedFile.postings_``)."""
        p = sp.csr_matrix(postings, dtype=np.float32, copy=True)
        p.sort_indices()
        n_words, n_images = p.shape
        indptr = p.indptr.astype(np.int64)
        ids = p.indices.astype(np.int64)
        gaps = ids.copy()
        if ids.size:
            gaps[1:] -= ids[:-1]
            starts = indptr[:-1][np.diff(indptr) > 0]
            gaps[starts] = ids[starts]  # each list starts from its first id
        nbytes = np.ones(ids.size, np.int64)
        rest = gaps >> 7
        while rest.any():
            nbytes += rest > 0
            rest >>= 7
        byte_offsets = np.concatenate(([0], np.cumsum(nbytes)))[indptr].astype(np.int64)  # where each list's code starts
        return cls(n_words, n_images, byte_offsets, indptr, varbyte_encode(gaps), p.data.astype(np.float32))

    def postings(self, word: int) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """``(image ids ascending, weights)`` of one word's list."""
        code = self.codes[self.byte_offsets[word] : self.byte_offsets[word + 1]]
        ids = np.cumsum(varbyte_decode(np.asarray(code)))
        return ids, np.asarray(self.weights[self.offsets[word] : self.offsets[word + 1]])

    def scores_of_vectors(self, vectors: sp.spmatrix) -> NDArray[np.float32]:
        """Dot products ``[n_queries, n_images]`` of weighted query vectors with every image:
        identical to ``InvertedFile.scores_of_vectors`` over the same postings."""
        q = sp.csr_matrix(vectors, dtype=np.float32)
        if q.shape[1] != self.n_words:
            raise InputError(f"query vectors have {q.shape[1]} words, the index {self.n_words}")
        q.sort_indices()
        out = np.zeros((q.shape[0], self.n_images), np.float32)
        for qi in range(q.shape[0]):
            a, b = q.indptr[qi], q.indptr[qi + 1]
            words = q.indices[a:b].astype(np.int64)
            ids, wts, counts = self._lists(words)
            # float32 products added one by one in word order (ufunc.at is unbuffered and sequential),
            # as scipy's sparse product adds them: the same sums to the last bit
            np.add.at(out[qi], ids, np.repeat(q.data[a:b], counts) * wts)
        return out

    def _lists(self, words: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.float32], NDArray[np.int64]]:
        """The lists of ``words`` one after the other: ``(ids, weights, postings per word)``."""
        counts = (self.offsets[words + 1] - self.offsets[words]).astype(np.int64)
        code = np.asarray(self.codes[_ranges(self.byte_offsets[words], self.byte_offsets[words + 1])])
        gaps = varbyte_decode(code)
        total = np.cumsum(gaps)
        first = np.cumsum(counts) - counts  # where each list starts among the decoded gaps
        before = np.where(first > 0, total[np.maximum(first - 1, 0)], 0) if total.size else first
        ids = total - np.repeat(before, counts)
        wts = np.asarray(self.weights[_ranges(self.offsets[words], self.offsets[words + 1])])
        return ids, wts, counts

    def search(self, vectors: sp.spmatrix, k: int | None = None) -> NDArray[np.int64]:
        """Ranked image ids ``[n_queries, k]``, ties to the lower id (as ``InvertedFile.search``)."""
        return ranks_from_scores(self.scores_of_vectors(vectors).T, k)

    @property
    def nbytes(self) -> int:
        """Bytes of the four arrays (what the index costs, in RAM or mapped from disk)."""
        return sum(int(getattr(self, n).nbytes) for n in _FILES)

    def save(self, folder: str | Path) -> Path:
        """Write the arrays as ``.npy`` files (each atomically) and ``meta.json`` last."""
        out = make_folder(folder)
        for name in _FILES:
            atomic_write_npy(out / f"{name}.npy", np.asarray(getattr(self, name)))
        atomic_write_json(out / "meta.json", {"format": FORMAT, "n_words": self.n_words, "n_images": self.n_images})
        return out

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> CompressedInvertedFile:
        """Read a folder written by :meth:`save`, memory-mapped unless ``mmap=False``.

        Raises:
            InputError: a missing or malformed file, another format, arrays that do not fit.
        """
        folder = Path(folder)
        try:
            meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
            arrays = {n: np.load(folder / f"{n}.npy", mmap_mode="r" if mmap else None, allow_pickle=False)
                      for n in _FILES}  # fmt: skip
        except (OSError, ValueError) as exc:
            raise InputError(f"unreadable compressed inverted file ({exc})", folder) from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise InputError(f"not a compressed inverted file of format {FORMAT}", folder)
        return cls(int(meta["n_words"]), int(meta["n_images"]), arrays["byte_offsets"], arrays["offsets"],
                   arrays["codes"], arrays["weights"])  # fmt: skip
