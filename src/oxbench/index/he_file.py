"""A Hamming-embedding inverted file for a million images: per-word lists on disk, memory-mapped.

The same postings and scores as :class:`oxbench.index.hamming.HammingIndex` (Jegou, Douze &
Schmid 2008 / 2010; its docstring has the formulas) -- every database feature in the list of its
word with its image, 64-bit signature, orientation and log2 scale; a query feature matches the
features of its word within ``ht`` bits, a match weighs ``idf_w^2 g(h)``; an image's score is the
sum of its matches' weights, or with weak geometric consistency the smaller maximum of its
orientation- and scale-difference histograms, divided by the tf-idf norms of both images -- but
held on disk, one ``.npy`` column per field, CSR by word (:mod:`oxbench.index.word_lists`):

- ``ids.npy``: ``uint32 [n]`` the image of each posting (images increasing within a word);
- ``signatures.npy``: ``uint64 [n]``; ``angles.npy``, ``log_scales.npy``: ``float32 [n]``;
- ``offsets.npy`` ``int64 [n_words + 1]``, ``idf.npy`` ``float64 [n_words]`` (``log(N / df)``,
  0 for a word no image holds), ``norms.npy`` ``float64 [n_images]`` (read into RAM);
- ``meta.json``: counts, ``idf``.

The in-RAM index holds 24 bytes a posting (an ``int64`` image); the file 20, on disk, and the
process only its offsets, idf and norms. The build takes images in chunks (runs merged word block
by word block), so it holds a chunk and a block whatever the size. A query visits its features'
lists in the query's own feature order, adding each list's weights image by image as the in-RAM
index's ``bincount`` over its matches does: without geometry through the compiled kernel of
:func:`oxbench.index.word_lists.scatter_hamming` (a weight table over the 65 distances, 0 past
``ht``); with weak geometric consistency by collecting the matches and voting them as
:func:`oxbench.index.hamming.wgc_scores`. The sums per image are the in-RAM index's, to the bit;
only the database norms, accumulated block by block, may differ in the last bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.index.hamming import (
    N_BITS,
    HammingIndex,
    gaussian_match_weights,
    normalised,
    tfidf_norm,
    wgc_bins,
    wgc_scores,
)
from oxbench.index.word_lists import Column, WordRuns, read_folder, scatter_hamming, write_folder
from oxbench.storage import StoreFolder, known_files

FORMAT = 1
#: The memory-mapped columns of a folder.
COLUMNS = (
    Column("ids", np.uint32),
    Column("signatures", np.uint64),
    Column("angles", np.float32),
    Column("log_scales", np.float32),
)
#: Bytes of one posting on disk.
POSTING_BYTES = sum(c.item_bytes for c in COLUMNS)
#: The kind in messages.
WHAT = "Hamming inverted file"


def lists_folder(folder: str | Path) -> StoreFolder:
    """The folder of a Hamming inverted file, as :mod:`oxbench.storage` checks and builds it."""
    mapped = [f"{c.name}.npy" for c in COLUMNS]
    names = ["offsets.npy", "idf.npy", "norms.npy", *mapped]
    return StoreFolder(Path(folder), WHAT, FORMAT, known_files(names, mapped=mapped))


@dataclass(frozen=True)
class HeEntries:
    """One chunk of images' features, in index order.

    Attributes:
        n_images: images in the chunk (an image may have no feature).
        owners: ``int64 [m]`` each feature's image, ``0 .. n_images - 1``, non-decreasing.
        words: ``int64 [m]`` its visual word.
        signatures: ``uint64 [m]`` its packed signature.
        angles: ``float32 [m]`` its orientation in degrees; log_scales: its log2 scale.
    """

    n_images: int
    owners: NDArray[np.int64]
    words: NDArray[np.int64]
    signatures: NDArray[np.uint64]
    angles: NDArray[np.float32]
    log_scales: NDArray[np.float32]


def _check_entries(e: HeEntries, n_words: int) -> None:
    m = len(e.owners)
    for name in ("words", "signatures", "angles", "log_scales"):
        if np.shape(getattr(e, name)) != (m,):
            raise InputError(
                f"Hamming entries: {m} owners but {name} of shape {np.shape(getattr(e, name))}"
            )
    if m and (e.words.min() < 0 or e.words.max() >= n_words):
        raise InputError(f"Hamming entries: a word outside 0 .. {n_words - 1}")
    if m and (e.owners.min() < 0 or e.owners.max() >= e.n_images or (np.diff(e.owners) < 0).any()):
        raise InputError(f"Hamming entries: owners must be non-decreasing in 0 .. {e.n_images - 1}")


def _tf_pairs(
    words: NDArray[np.int64], ids: NDArray[np.integer]
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """``(word, image, tf)`` of each distinct (word, image) of postings sorted by word, then image."""
    n = len(words)
    if not n:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    i = ids.astype(np.int64)
    first = np.r_[True, (words[1:] != words[:-1]) | (i[1:] != i[:-1])]
    starts = np.flatnonzero(first)
    return words[starts], i[starts], np.diff(np.r_[starts, n]).astype(np.float64)


def in_ram_index(chunks: Iterable[HeEntries], n_words: int, *, idf: bool = True) -> HammingIndex:
    """The in-RAM :class:`~oxbench.index.hamming.HammingIndex` of images given in chunks (index
    order), as :meth:`HammingInvertedFile.build` takes them."""
    parts = list(chunks)
    starts = np.cumsum([0] + [e.n_images for e in parts])

    def column(name: str, dtype: type) -> NDArray:
        if not parts:
            return np.zeros(0, dtype)
        return np.concatenate([getattr(e, name) for e in parts]).astype(dtype)

    images = (
        np.concatenate([e.owners + s for e, s in zip(parts, starts, strict=False)])
        if parts
        else np.zeros(0, np.int64)
    )
    words, signatures = column("words", np.int64), column("signatures", np.uint64)
    angles, scales = column("angles", np.float32), column("log_scales", np.float32)
    parts.clear()  # the chunks go before the build's own copies (the estimate's peak)
    return HammingIndex(n_words, idf=idf).fit(
        words, images, signatures, angles, scales, int(starts[-1])
    )


class HammingInvertedFile:
    """The Hamming-embedding inverted file in per-word lists, memory-mapped (module docstring).

    Build with :meth:`build` (chunks of :class:`HeEntries`), open with :meth:`open`, score with
    :meth:`scores` (the arguments of :meth:`oxbench.index.hamming.HammingIndex.scores`).
    """

    def __init__(
        self,
        folder: Path,
        meta: Mapping[str, object],
        offsets: NDArray[np.int64],
        columns: Mapping[str, NDArray],
        idf: NDArray[np.float64],
        norms: NDArray[np.float64],
    ) -> None:
        self.folder = folder
        self.n_words = int(meta["n_words"])  # type: ignore[call-overload]
        self.n_images = int(meta["n_images"])  # type: ignore[call-overload]
        self.idf = bool(meta["idf"])
        self.offsets_ = offsets
        self.images_ = columns["ids"]
        self.signatures_ = columns["signatures"]
        self.angles_ = columns["angles"]
        self.log_scales_ = columns["log_scales"]
        self.idf_ = idf
        self.norms_ = norms

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        chunks: Iterable[HeEntries],
        n_words: int,
        folder: str | Path,
        *,
        idf: bool = True,
        stands_for: Mapping[str, object] | None = None,
    ) -> HammingInvertedFile:
        """Write the inverted file of the images given in chunks (index order), built beside
        ``folder`` and put in its place whole (:meth:`oxbench.storage.StoreFolder.building`).

        ``idf_w = log(N / df_w)`` with ``df_w`` the images holding word ``w`` (0 where none does;
        ones with ``idf=False``); each image's norm is the L2 norm of its tf-idf vector.
        ``stands_for``: what the lists are built from (inputs' content digests, settings),
        recorded in ``meta.json`` for :meth:`open` to check.

        Raises:
            InputError: entries of another shape, a word out of range, owners out of order, more
                than ``2^32 - 1`` images, or a ``folder`` that is not oxbench's.
        """
        with lists_folder(folder).building() as tmp:
            cls._write(chunks, n_words, tmp, idf=idf, stands_for=stands_for)
        return cls.open(folder, stands_for=stands_for)

    @staticmethod
    def _write(
        chunks: Iterable[HeEntries],
        n_words: int,
        folder: Path,
        *,
        idf: bool,
        stands_for: Mapping[str, object] | None,
    ) -> None:
        df = np.zeros(n_words, np.int64)
        with WordRuns(folder, n_words, COLUMNS) as runs:
            n_images = 0
            for e in chunks:
                _check_entries(e, n_words)
                if n_images + e.n_images > 2**32 - 1:
                    raise InputError("a Hamming inverted file holds fewer than 2^32 images")
                ids = e.owners + n_images
                values: dict[str, NDArray] = {
                    "ids": ids,
                    "signatures": e.signatures,
                    "angles": e.angles,
                    "log_scales": e.log_scales,
                }
                order = runs.add(e.words, values)
                pair_words = _tf_pairs(e.words[order], ids[order])[0]
                df += np.bincount(pair_words, minlength=n_words)  # a chunk's images are its own
                n_images += e.n_images
            weights = np.ones(n_words)
            if idf:
                weights = np.zeros(n_words)
                seen = df > 0
                weights[seen] = np.log(n_images / df[seen])
            norm_sq = np.zeros(n_images)

            def add_norms(words: NDArray[np.int64], ids: NDArray) -> None:
                w, img, tf = _tf_pairs(words, ids)
                norm_sq[:] += np.bincount(img, (tf * weights[w]) ** 2, minlength=n_images)

            offsets = runs.merge(add_norms)
        meta = {
            "format": FORMAT,
            "n_words": int(n_words),
            "n_images": n_images,
            "nnz": int(offsets[-1]),
            "idf": bool(idf),
        }
        arrays = {"idf": weights, "norms": np.sqrt(norm_sq)}
        write_folder(folder, COLUMNS, meta, offsets, arrays, what=WHAT, stands_for=stands_for)

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls, folder: str | Path, *, stands_for: Mapping[str, object] | None = None
    ) -> HammingInvertedFile:
        """Map a folder written by :meth:`build` (offsets, idf and norms are read into RAM);
        ``stands_for``: what it must have been built for (``None``: not checked).

        Raises:
            InputError: a missing or unreadable file, or files that disagree with ``meta.json``.
            CorruptCache: a folder built for another ``stands_for``, a damaged ``meta.json`` or
                array, or a mapped file that is not the one written for this ``meta.json``.
        """
        meta, offsets, arrays, columns = read_folder(
            Path(folder),
            fmt=FORMAT,
            columns_of=lambda meta: COLUMNS,
            arrays={"idf": ("n_words", np.float64), "norms": ("n_images", np.float64)},
            what=WHAT,
            valid_meta=lambda meta: isinstance(meta["idf"], bool),
            stands_for=stands_for,
        )
        return cls(Path(folder), meta, offsets, columns, arrays["idf"], arrays["norms"])

    @property
    def n_postings(self) -> int:
        """Database features in the file."""
        return int(self.offsets_[-1])

    @property
    def disk_bytes(self) -> int:
        """Bytes of the mapped lists and the arrays read on open."""
        return int(
            POSTING_BYTES * self.n_postings
            + self.offsets_.nbytes
            + self.idf_.nbytes
            + self.norms_.nbytes
        )

    @property
    def ram_bytes(self) -> int:
        """Bytes held in RAM when open (offsets, idf, norms; the lists stay mapped), plus the
        ``float64`` score array of one query."""
        return int(self.offsets_.nbytes + self.idf_.nbytes + 2 * self.norms_.nbytes)

    # ------------------------------------------------------------------ searching
    def query_norm(self, words: NDArray[np.integer]) -> float:
        """The tf-idf L2 norm of a query with these feature words."""
        return tfidf_norm(words, self.idf_)

    def scores(
        self,
        words: NDArray[np.integer],
        signatures: NDArray[np.uint64],
        angles: NDArray[np.floating],
        log_scales: NDArray[np.floating],
        *,
        ht: int,
        sigma: float | None,
        wgc: bool = False,
        angle_bins: int = 8,
        scale_bins: int = 8,
        scale_range: float = 4.0,
    ) -> NDArray[np.float64]:
        """Scores ``[n_images]`` of one query's features, as
        :meth:`oxbench.index.hamming.HammingIndex.scores` gives them.

        Raises:
            InputError: arrays of different lengths, a word out of range, ``ht`` outside 0 .. 64.
        """
        w = np.asarray(words, np.int64)
        sig = np.asarray(signatures, np.uint64)
        n = len(w)
        for name, given in (("signatures", sig), ("angles", angles), ("log_scales", log_scales)):
            if np.shape(given) != (n,):
                raise InputError(f"{n} query feature words but {name} of shape {np.shape(given)}")
        if n and (w.min() < 0 or w.max() >= self.n_words):
            raise InputError(f"query words must be in 0 .. {self.n_words - 1}")
        if not 0 <= ht <= N_BITS:
            raise InputError(f"Hamming threshold {ht} outside 0..{N_BITS}")
        h = np.arange(N_BITS + 1)
        g = gaussian_match_weights(h, sigma) if sigma is not None else np.ones(N_BITS + 1)
        g[h > ht] = 0.0
        offsets = self.offsets_
        if wgc:
            raw = self._wgc_raw(
                w, sig, angles, log_scales, g, ht, angle_bins, scale_bins, scale_range
            )
        else:
            raw = np.zeros(self.n_images)
            sig2 = sig.reshape(-1, 1)
            for i in range(n):
                a, b = int(offsets[w[i]]), int(offsets[w[i] + 1])
                if a == b:
                    continue
                table = self.idf_[w[i]] ** 2 * g
                scatter_hamming(
                    raw, self.images_[a:b], self.signatures_[a:b].reshape(-1, 1), sig2[i], table
                )
        return normalised(raw, self.norms_, self.query_norm(w))

    def _wgc_raw(
        self,
        w: NDArray[np.int64],
        sig: NDArray[np.uint64],
        angles: NDArray[np.floating],
        log_scales: NDArray[np.floating],
        g: NDArray[np.float64],
        ht: int,
        angle_bins: int,
        scale_bins: int,
        scale_range: float,
    ) -> NDArray[np.float64]:
        """The matches of every query feature (in feature order), voted per image as
        :func:`oxbench.index.hamming.wgc_scores`."""
        images, weights, d_angle, d_scale = [], [], [], []
        q_angles = np.asarray(angles, np.float64)
        q_scales = np.asarray(log_scales, np.float64)
        for i in range(len(w)):
            a, b = int(self.offsets_[w[i]]), int(self.offsets_[w[i] + 1])
            if a == b:
                continue
            h = np.bitwise_count(self.signatures_[a:b] ^ sig[i])
            keep = np.flatnonzero(h <= ht)
            if not len(keep):
                continue
            images.append(self.images_[a:b][keep])
            weights.append(self.idf_[w[i]] ** 2 * g[h[keep]])
            d_angle.append(self.angles_[a:b][keep] - q_angles[i])
            d_scale.append(self.log_scales_[a:b][keep] - q_scales[i])
        if not images:
            return np.zeros(self.n_images)
        ab, sb = wgc_bins(
            np.concatenate(d_angle),
            np.concatenate(d_scale),
            angle_bins=angle_bins,
            scale_bins=scale_bins,
            scale_range=scale_range,
        )
        return wgc_scores(
            np.concatenate(images),
            np.concatenate(weights),
            ab,
            sb,
            self.n_images,
            angle_bins,
            scale_bins,
        )


__all__ = [
    "COLUMNS",
    "POSTING_BYTES",
    "HammingInvertedFile",
    "HeEntries",
    "in_ram_index",
    "lists_folder",
]
