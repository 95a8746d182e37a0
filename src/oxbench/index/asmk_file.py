"""An ASMK inverted file for a million images: packed binary residuals in per-word contiguous lists.

The aggregated selective match kernel (Tolias, Avrithis & Jegou, ICCV 2013) compares two images
word by word over the words they share: each image holds, per word ``w``, one binarised
aggregated residual ``b_w`` (the signs of the sum of its features' residuals to the centroid,
``d`` bits), the similarity of two codes is ``u = 1 - 2 h / d`` (``h`` their Hamming distance) and
the selectivity function keeps strong matches only, ``sigma_alpha(u) = u^alpha`` when
``u >= tau``, else 0. An image's score is

    ``S(q, x) = sum_w idf_w sigma_alpha(u(b_w(q), b_w(x))) / sqrt(n_q n_x)``

with ``n_x`` the sum of ``idf_w`` over ``x``'s words (its number of words without idf), exactly
the conventions of the ``asmk`` package's ``IVF.search`` with ``functional.asmk_kernel`` that
oxbench's ASMK family uses (the threshold inclusive, ``idf_w = log(N / df_w)^2``, 1 for a word no
image holds).

The package keeps one growing numpy array per word and compares a query word against its list
through a Python callback. :class:`AsmkInvertedFile` keeps the lists *contiguous*, CSR by word,
on disk and memory-mapped (bound to what they were written for with
:func:`oxbench.cache.record_written`):

- ``codes.npy``: ``uint64 [n_postings, d / 64]`` the packed codes, word after word;
- ``ids.npy``: ``uint32 [n_postings]`` the image of each posting;
- ``offsets.npy``: ``int64 [n_words + 1]`` where each word's postings start (read into RAM);
- ``norms.npy``: ``float64 [n_images]`` ``sqrt(n_x)`` (read into RAM), ``idf.npy``;
- ``meta.json``: counts, dimension, ``use_idf``.

A query visits only its own words (in increasing order, so the mapped file is read forward):
the Hamming distances of a list are two XORs and popcounts (``np.bitwise_count``) against the
query word's code, the kernel is a lookup in a table of its ``d + 1`` values, and an image occurs
once in a word's list, so the contributions are added into the score array with one fancy-index
add. The optional compiled kernel (``asmk_scatter`` in :mod:`oxbench.evaluation._accel`, built by
``setup.py``; ``OXBENCH_NO_ACCEL=1`` forces numpy) does the popcounts, the lookup and the add in
one pass over the list, with the same additions in the same order: the same scores, to the bit.
The build takes images in chunks, writes each chunk's postings sorted by word as a run and
merges the runs word block by word block, so it holds one chunk and one block whatever the size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.index.word_lists import Column, WordRuns, read_folder, scatter_hamming, write_folder
from oxbench.schema import Group, setting, validate
from oxbench.storage import StoreFolder, known_files

FORMAT = 1
#: The kind in messages.
WHAT = "ASMK inverted file"


def lists_folder(folder: str | Path) -> StoreFolder:
    """The folder of an ASMK inverted file, as :mod:`oxbench.storage` checks and builds it."""
    mapped = ["codes.npy", "ids.npy"]
    names = ["offsets.npy", "idf.npy", "norms.npy", *mapped]
    return StoreFolder(Path(folder), WHAT, FORMAT, known_files(names, mapped=mapped))


@dataclass(frozen=True)
class AsmkSettings(Group):
    """The ``asmk`` settings of an ASMK method (Tolias et al. 2013): the selectivity function of
    the match kernel and the query side's multiple assignment.

    Attributes:
        alpha: exponent of the selectivity function.
        tau: its threshold on the normalised Hamming similarity (``-1 .. 1``).
        query_ma: words per query feature (multiple assignment; the database uses 1).
    """

    alpha: float = setting(
        3.0, S.Float(lo=0, lo_open=True, hi=100), doc="ASMK: selectivity exponent"
    )
    tau: float = setting(0.0, S.Float(lo=-1, hi=1, hi_open=True), doc="ASMK: selectivity threshold")
    query_ma: int = setting(5, S.Int(lo=1, hi=64), doc="ASMK: words per query feature")

    def __post_init__(self) -> None:
        validate(self)


def _columns(n_u64: int) -> tuple[Column, Column]:
    """The memory-mapped files of a folder: ``ids.npy`` and ``codes.npy``."""
    return Column("ids", np.uint32), Column("codes", np.uint64, n_u64)


def binarize_residuals(residuals: NDArray[np.floating]) -> NDArray[np.uint64]:
    """``uint64 [n, d / 64]`` packed signs of aggregated residuals ``[n, d]`` (bit set when the
    component is ``> 0``, as the ``asmk`` package binarises; ``d`` a multiple of 64).

    Example:
        >>> binarize_residuals(np.r_[np.ones(3), -np.ones(61)][None]).tolist()
        [[7]]
    """
    r = np.asarray(residuals)
    if r.ndim != 2 or r.shape[1] % 64 or not r.shape[1]:
        raise InputError(f"residuals must be [n, d] with d a multiple of 64, got shape {r.shape}")
    packed = np.packbits(r > 0, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").astype(np.uint64)


def selectivity_table(dim: int, alpha: float, tau: float) -> NDArray[np.float64]:
    """``sigma_alpha(1 - 2 h / dim)`` for ``h = 0 .. dim``: ``u^alpha`` where ``u >= tau``, else 0.

    Example:
        >>> selectivity_table(4, 3.0, 0.0).tolist()
        [1.0, 0.125, 0.0, 0.0, 0.0]
    """
    u = 1.0 - 2.0 * np.arange(dim + 1, dtype=np.float64) / dim
    keep = u >= tau
    out = np.zeros(dim + 1, np.float64)
    out[keep] = np.sign(u[keep]) * np.abs(u[keep]) ** alpha
    return out


@dataclass(frozen=True)
class AsmkEntries:
    """One chunk of images' ASMK entries, in index order.

    Attributes:
        n_images: images in the chunk (an image may have no entry).
        owners: ``int64 [m]`` each entry's image, ``0 .. n_images - 1``, non-decreasing.
        words: ``int64 [m]`` its word (distinct within an image).
        codes: ``uint64 [m, d / 64]`` its packed aggregated residual.
    """

    n_images: int
    owners: NDArray[np.int64]
    words: NDArray[np.int64]
    codes: NDArray[np.uint64]


def _check_entries(e: AsmkEntries, n_words: int, n_u64: int) -> None:
    m = len(e.owners)
    if e.words.shape != (m,) or e.codes.shape != (m, n_u64):
        raise InputError(
            f"ASMK entries: {m} owners, words {e.words.shape}, codes {e.codes.shape} "
            f"(expected [{m}, {n_u64}])"
        )
    if m and (e.words.min() < 0 or e.words.max() >= n_words):
        raise InputError(f"ASMK entries: a word outside 0 .. {n_words - 1}")
    if m and (e.owners.min() < 0 or e.owners.max() >= e.n_images or (np.diff(e.owners) < 0).any()):
        raise InputError(f"ASMK entries: owners must be non-decreasing in 0 .. {e.n_images - 1}")


class AsmkInvertedFile:
    """The ASMK inverted file in contiguous per-word lists, memory-mapped (module docstring).

    Build with :meth:`build` (chunks of :class:`AsmkEntries`), open with :meth:`open`, score with
    :meth:`scores`.
    """

    def __init__(
        self,
        folder: Path,
        meta: Mapping[str, object],
        offsets: NDArray[np.int64],
        codes: NDArray[np.uint64],
        ids: NDArray[np.uint32],
        norms: NDArray[np.float64],
        idf: NDArray[np.float32],
    ) -> None:
        self.folder = folder
        self.n_words = int(meta["n_words"])  # type: ignore[call-overload]
        self.n_images = int(meta["n_images"])  # type: ignore[call-overload]
        self.dim = int(meta["dim"])  # type: ignore[call-overload]
        self.use_idf = bool(meta["use_idf"])
        self._offsets = offsets
        self._codes = np.asarray(codes)  # views of the maps, without np.memmap's per-slice cost
        self._ids = np.asarray(ids)
        self.norms_ = norms
        self.idf_ = idf

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        chunks: Iterable[AsmkEntries],
        n_words: int,
        dim: int,
        folder: str | Path,
        *,
        use_idf: bool = False,
        stands_for: Mapping[str, object] | None = None,
    ) -> AsmkInvertedFile:
        """Write the inverted file of the images given in chunks (index order), built beside
        ``folder`` and put in its place whole (:meth:`oxbench.storage.StoreFolder.building`).

        ``idf_w = log(N / df_w)^2`` with ``N`` the images indexed (the package counts up to the
        last image with an entry: the same unless the last images have no feature).
        ``stands_for``: what the lists are built from (inputs' content digests, settings),
        recorded in ``meta.json`` for :meth:`open` to check.

        Raises:
            InputError: entries of another shape, a word out of range, an image holding a word
                twice, more than ``2^32 - 1`` images, or a ``folder`` that is not oxbench's.
        """
        if dim % 64 or dim <= 0:
            raise InputError(f"ASMK codes of {dim} bits: a multiple of 64 is needed")
        with lists_folder(folder).building() as tmp:
            cls._write(chunks, n_words, dim, tmp, use_idf=use_idf, stands_for=stands_for)
        return cls.open(folder, stands_for=stands_for)

    @staticmethod
    def _write(
        chunks: Iterable[AsmkEntries],
        n_words: int,
        dim: int,
        folder: Path,
        *,
        use_idf: bool,
        stands_for: Mapping[str, object] | None,
    ) -> None:
        n_u64 = dim // 64
        with WordRuns(folder, n_words, _columns(n_u64)) as runs:
            n_images = 0
            for e in chunks:
                _check_entries(e, n_words, n_u64)
                if n_images + e.n_images > 2**32 - 1:
                    raise InputError("an ASMK inverted file holds fewer than 2^32 images")
                ids = e.owners + n_images
                order = runs.add(e.words, {"ids": ids, "codes": e.codes})
                w, i = e.words[order], ids[order]  # by word, images increasing
                if ((np.diff(w) == 0) & (np.diff(i) == 0)).any():
                    raise InputError(
                        "ASMK entries: an image holds a word twice (aggregate it first)"
                    )
                n_images += e.n_images
            counts = runs.counts
            idf = np.ones(n_words, np.float32)
            if use_idf:
                seen = counts > 0
                idf[seen] = (np.log(n_images / counts[seen]) ** 2).astype(np.float32)
            norm = np.zeros(n_images, np.float64)

            def add_norms(words: NDArray[np.int64], ids: NDArray) -> None:
                norm[:] += np.bincount(ids, weights=idf[words], minlength=n_images)

            offsets = runs.merge(add_norms)
        meta = {
            "format": FORMAT,
            "n_words": n_words,
            "n_images": n_images,
            "nnz": int(offsets[-1]),
            "dim": dim,
            "use_idf": bool(use_idf),
        }
        arrays = {"norms": np.sqrt(norm), "idf": idf}
        write_folder(
            folder, _columns(n_u64), meta, offsets, arrays, what=WHAT, stands_for=stands_for
        )

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls, folder: str | Path, *, stands_for: Mapping[str, object] | None = None
    ) -> AsmkInvertedFile:
        """Map a folder written by :meth:`build` (offsets, norms and idf are read into RAM);
        ``stands_for``: what it must have been built for (``None``: not checked).

        Raises:
            InputError: a missing or unreadable file, or files that disagree with ``meta.json``.
            CorruptCache: a folder built for another ``stands_for``, a damaged ``meta.json`` or
                array, or a mapped file that is not the one written for this ``meta.json``.
        """
        meta, offsets, arrays, mapped = read_folder(
            Path(folder),
            fmt=FORMAT,
            columns_of=lambda meta: _columns(int(meta["dim"]) // 64),
            arrays={"norms": ("n_images", np.float64), "idf": ("n_words", np.float32)},
            what=WHAT,
            valid_meta=lambda meta: int(meta["dim"]) > 0 and int(meta["dim"]) % 64 == 0,
            stands_for=stands_for,
        )
        return cls(
            Path(folder),
            meta,
            offsets,
            mapped["codes"],
            mapped["ids"],
            arrays["norms"],
            arrays["idf"],
        )

    @property
    def n_postings(self) -> int:
        """Entries (image, word) in the file."""
        return int(self._offsets[-1])

    @property
    def disk_bytes(self) -> int:
        """Bytes of the mapped lists and the arrays read on open."""
        return int(
            self._codes.nbytes
            + self._ids.nbytes
            + self._offsets.nbytes
            + self.norms_.nbytes
            + self.idf_.nbytes
        )

    @property
    def ram_bytes(self) -> int:
        """Bytes held in RAM when open (offsets, norms, idf; the lists stay mapped), plus the
        ``float64`` score array of one query."""
        return int(self._offsets.nbytes + 2 * self.norms_.nbytes + self.idf_.nbytes)

    def posting(self, word: int) -> tuple[NDArray[np.uint32], NDArray[np.uint64]]:
        """``(image ids, codes)`` of one word, images increasing."""
        a, b = int(self._offsets[word]), int(self._offsets[word + 1])
        return np.asarray(self._ids[a:b]), np.asarray(self._codes[a:b])

    # ------------------------------------------------------------------ searching
    def scores(
        self,
        codes: NDArray[np.uint64],
        words: NDArray[np.integer],
        *,
        alpha: float = 3.0,
        tau: float = 0.0,
    ) -> NDArray[np.float32]:
        """ASMK similarities ``[n_images]`` of one query to every indexed image
        (:meth:`scores_of_queries` of that one query)."""
        return self.scores_of_queries([(codes, words)], alpha=alpha, tau=tau)[0]

    def _check_query(
        self, codes: NDArray[np.uint64], words: NDArray[np.integer]
    ) -> tuple[NDArray[np.uint64], NDArray[np.int64]]:
        c, w = np.asarray(codes), np.asarray(words, np.int64)
        n_u64 = self.dim // 64
        if c.ndim != 2 or c.shape != (len(w), n_u64) or c.dtype != np.uint64:
            raise InputError(
                f"query codes must be uint64 [{len(w)}, {n_u64}], got {c.dtype} {c.shape}"
            )
        if len(w) and (w.min() < 0 or w.max() >= self.n_words):
            raise InputError(f"query words must be in 0 .. {self.n_words - 1}")
        if len(np.unique(w)) != len(w):
            raise InputError("query words must be distinct (aggregate the query first)")
        return c, w

    def scores_of_queries(
        self,
        queries: Sequence[tuple[NDArray[np.uint64], NDArray[np.integer]]],
        *,
        alpha: float = 3.0,
        tau: float = 0.0,
    ) -> NDArray[np.float32]:
        """ASMK similarities ``[n_queries, n_images]`` of queries to every indexed image.

        The queries are scored together: each word's list is read once for all the queries that
        hold the word (the frequent words, whose lists are most of the work, are in most
        queries), and each query's contributions are added word by word in increasing word
        order, as one query alone adds them: the same scores, to the bit.

        Args:
            queries: per query, ``(codes uint64 [u, d / 64], words [u])``: its packed aggregated
                residuals and their (distinct) words; multiple assignment gives a query more words.
            alpha: selectivity exponent; tau: its threshold on ``u`` (inclusive).

        Raises:
            InputError: codes of another width, a word out of range or repeated in a query.
        """
        checked = [self._check_query(c, w) for c, w in queries]
        n_q, n_u64 = len(checked), self.dim // 64
        scores = np.zeros((n_q, self.n_images), np.float64)
        if not n_q:
            return scores.astype(np.float32)
        table = selectivity_table(self.dim, alpha, tau)
        offsets, lists, ids, idf = self._offsets, self._codes, self._ids, self.idf_
        all_words = np.concatenate([w for _, w in checked])
        all_codes = np.concatenate([c for c, _ in checked]).reshape(-1, n_u64)
        owner = np.repeat(np.arange(n_q), [len(w) for _, w in checked])
        last, a, b, weights = -1, 0, 0, table
        for k in np.lexsort((owner, all_words)).tolist():  # by word (lists read forward)
            w = int(all_words[k])
            if w != last:
                last, a, b = w, int(offsets[w]), int(offsets[w + 1])
                weights = table * idf[w]
            if a == b:
                continue
            scatter_hamming(scores[owner[k]], ids[a:b], lists[a:b], all_codes[k], weights)
        nz = self.norms_ > 0
        for i, (_, q_words) in enumerate(checked):
            q_norm = float(idf[q_words].sum(dtype=np.float64))
            if q_norm <= 0:  # every word in every image (idf 0), or no word
                scores[i] = 0
                continue
            scores[i, nz] /= self.norms_[nz]
            scores[i] /= np.sqrt(q_norm)
        return scores.astype(np.float32)
