"""A large bag-of-words index measured by simulation: distractor words drawn from measured statistics.

Rendering and describing a million distractors costs ~29 CPU-hours here; what an index of that
size costs to build and to query does not depend on the pixels, only on the bags of words it
holds. :class:`BagStatistics` measures, on the words of rendered (or real) images, the two things
that shape an inverted file: how many features an image has (the empirical distribution of bag
sizes) and how often each word occurs (the empirical word frequencies). :func:`simulated_bags`
draws any number of bags from them, seeded, chunk by chunk; :func:`build_simulated_compact`
indexes the real database's bags followed by the simulated distractors the way
``inverted_file=mapped`` does (idf from a first pass, compressed posting lists written by
chunks), so the build's CPU and peak memory, the lists' disk and the query time of real queries
can be measured at 100K or 1M images.

The other indexes' entries are drawn from the same bags, chunk by chunk with a seed:
:func:`simulated_asmk_entries` (ASMK: each image's distinct words, each with a binary aggregated
residual resampled from the measured ones of that word, :class:`SignaturePool`),
:func:`simulated_he_entries` (Hamming embedding: a 64-bit signature per feature, its bits uniform
as HE's per-word medians make them, with an orientation and a measured log-scale) and :func:`simulated_vectors` (global descriptors: measured
vectors resampled plus Gaussian noise, for IVF-PQ).

What the simulation leaves out, and so what it cannot say: words are drawn independently within a
bag (real images repeat words: burstiness, which shortens bags in distinct words), there is no
geometry (spatial verification is not simulated), a simulated ASMK or HE code is independent of
the query's (no near-duplicates: the share of strong matches is the measured images' share) and
the distractors' content is not realistic, so **no accuracy** is measured: only costs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError

if TYPE_CHECKING:
    from oxbench.index.asmk_file import AsmkEntries
    from oxbench.index.he_file import HeEntries

#: Most simulated images one index may hold.
MAX_SIMULATED = 10_000_000


@dataclass(frozen=True)
class BagStatistics:
    """What simulated bags are drawn from.

    Attributes:
        n_words: vocabulary size.
        bag_sizes: ``int64 [n_images]`` features per measured image (drawn with replacement).
        word_probabilities: ``float64 [n_words]`` each word's share of all measured features.
    """

    n_words: int
    bag_sizes: NDArray[np.int64]
    word_probabilities: NDArray[np.float64]

    @classmethod
    def from_bags(cls, bags: Sequence[NDArray[np.integer]], n_words: int) -> BagStatistics:
        """Measure the statistics of ``bags`` (each an image's word per feature).

        Raises:
            InputError: no bag, no feature, or a word outside ``0 .. n_words - 1``.
        """
        if not bags:
            raise InputError("no images to measure the bag statistics on")
        sizes = np.array([len(b) for b in bags], np.int64)
        counts = np.zeros(n_words, np.float64)
        for b in bags:
            b = np.asarray(b, np.int64)
            if len(b) and (b.min() < 0 or b.max() >= n_words):
                raise InputError(f"a word outside 0 .. {n_words - 1}")
            counts += np.bincount(b, minlength=n_words)
        if counts.sum() == 0:
            raise InputError("the measured images have no features")
        return cls(int(n_words), sizes, counts / counts.sum())


def check_simulated_size(n: int) -> int:
    """``n`` simulated images, 1 .. :data:`MAX_SIMULATED` (one line otherwise)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or not 1 <= n <= MAX_SIMULATED:
        raise InputError(f"a simulated index holds 1 to {MAX_SIMULATED:,} images, got {n!r}")
    return int(n)


def _check_chunk(chunk: int) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk < 1:
        raise InputError(f"a simulation chunk holds at least one image, got {chunk!r}")
    return int(chunk)


def _drawn_chunks(
    stats: BagStatistics, n: int, seed: int, chunk: int
) -> Iterator[tuple[np.random.Generator, NDArray[np.int64], NDArray[np.int64]]]:
    """Per chunk: its generator (after the draws), the bag sizes ``[m]`` and the words, flat."""
    check_simulated_size(n)
    _check_chunk(chunk)
    cdf = np.cumsum(stats.word_probabilities)
    cdf[-1] = 1.0
    for k, a in enumerate(range(0, n, chunk)):
        rng = np.random.default_rng([seed, k])
        m = min(chunk, n - a)
        sizes = stats.bag_sizes[rng.integers(0, len(stats.bag_sizes), m)]
        words = np.searchsorted(cdf, rng.random(int(sizes.sum())), side="right")
        yield rng, sizes, np.minimum(words, stats.n_words - 1).astype(np.int64)


def simulated_bags(
    stats: BagStatistics, n: int, *, seed: int = 0, chunk: int = 2048
) -> Iterator[list[NDArray[np.int64]]]:
    """``n`` bags drawn from ``stats`` in chunks of ``chunk`` images: each bag's size from the
    measured sizes, its words independently from the word frequencies. Chunk ``k`` depends only
    on ``(seed, k)``, so a chunk can be drawn again without the others."""
    for _, sizes, words in _drawn_chunks(stats, n, seed, chunk):
        yield np.split(words, np.cumsum(sizes)[:-1])


@dataclass(frozen=True)
class SignaturePool:
    """Measured binary signatures, grouped by word, to resample simulated ones from.

    A simulated entry of word ``w`` takes the signature of a measured entry of ``w`` drawn
    uniformly (of any measured entry when ``w`` has none): the bits keep their measured
    frequencies and correlations, per word, and a simulated image's codes are real codes.

    Attributes:
        n_words: vocabulary size.
        offsets: ``int64 [n_words + 1]``; word ``w``'s signatures are rows ``offsets[w]:offsets[w+1]``.
        signatures: ``uint64 [m, n_u64]`` packed signatures, by word.
    """

    n_words: int
    offsets: NDArray[np.int64]
    signatures: NDArray[np.uint64]

    @classmethod
    def from_entries(
        cls, words: NDArray[np.integer], signatures: NDArray[np.uint64], n_words: int
    ) -> SignaturePool:
        """Group measured ``(word [m], signature [m, n_u64])`` entries by word.

        Raises:
            InputError: no entry, shapes that disagree, or a word outside ``0 .. n_words - 1``.
        """
        w = np.asarray(words, np.int64)
        sig = np.asarray(signatures)
        if sig.ndim == 1:
            sig = sig[:, None]
        if not len(w) or sig.shape[0] != len(w) or sig.dtype != np.uint64:
            raise InputError(
                f"a signature pool needs uint64 signatures, one per word ({len(w)} words, "
                f"signatures {sig.dtype} {sig.shape})"
            )
        if w.min() < 0 or w.max() >= n_words:
            raise InputError(f"a word outside 0 .. {n_words - 1}")
        order = np.argsort(w, kind="stable")
        offsets = np.searchsorted(w[order], np.arange(n_words + 1)).astype(np.int64)
        return cls(int(n_words), offsets, np.ascontiguousarray(sig[order]))

    def draw(self, words: NDArray[np.int64], rng: np.random.Generator) -> NDArray[np.uint64]:
        """``uint64 [len(words), n_u64]``: a measured signature of each word (module docstring)."""
        start, count = self.offsets[words], np.diff(self.offsets)[words]
        none = count == 0
        start = np.where(none, 0, start)
        count = np.where(none, len(self.signatures), count)
        return self.signatures[start + (rng.random(len(words)) * count).astype(np.int64)]


def simulated_asmk_entries(
    stats: BagStatistics, pool: SignaturePool, n: int, *, seed: int = 0, chunk: int = 2048
) -> Iterator[AsmkEntries]:
    """ASMK entries of ``n`` simulated images, chunk by chunk (chunk ``k`` from ``(seed, k)``):
    each image's bag drawn as :func:`simulated_bags` draws it, its distinct words kept (one
    aggregated residual per word, as ASMK indexes an image), each with a signature resampled
    from ``pool``.

    Raises:
        InputError: ``n`` out of bounds, or a pool of another vocabulary.
    """
    from oxbench.index.asmk_file import AsmkEntries

    if pool.n_words != stats.n_words:
        raise InputError(f"signatures of {pool.n_words} words, statistics of {stats.n_words}")
    for rng, sizes, words in _drawn_chunks(stats, n, seed, chunk):
        owners = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        pairs = np.sort(owners * stats.n_words + words)  # a sort: np.unique hashes, 20x slower
        pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]]
        owners, words = pairs // stats.n_words, pairs % stats.n_words
        yield AsmkEntries(len(sizes), owners, words, pool.draw(words, rng))


def simulated_he_entries(
    stats: BagStatistics,
    n: int,
    *,
    log_scales: NDArray[np.floating] | None = None,
    seed: int = 0,
    chunk: int = 2048,
) -> Iterator[HeEntries]:
    """Hamming-embedding postings of ``n`` simulated images, chunk by chunk (chunk ``k`` from
    ``(seed, k)``): one per feature of each drawn bag, its 64 bits uniform and independent --
    what HE's per-word median thresholds make each bit (:mod:`oxbench.index.hamming`: a bit is 1
    on half of a word's training descriptors) -- its orientation uniform over the circle and its
    log2 scale resampled from ``log_scales`` (measured keypoints; 0 when not given).

    Raises:
        InputError: ``n`` out of bounds, or ``log_scales`` empty or not finite.
    """
    from oxbench.index.he_file import HeEntries

    measured = None
    if log_scales is not None:
        measured = np.asarray(log_scales, np.float32).reshape(-1)
        if not len(measured) or not np.isfinite(measured).all():
            raise InputError("measured log-scales must be finite and not empty")
    for rng, sizes, words in _drawn_chunks(stats, n, seed, chunk):
        m = len(words)
        owners = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
        sig = rng.integers(0, np.iinfo(np.uint64).max, m, dtype=np.uint64, endpoint=True)
        angles = (rng.random(m) * 360.0).astype(np.float32)
        scales = (
            measured[rng.integers(0, len(measured), m)]
            if measured is not None
            else np.zeros(m, np.float32)
        )
        yield HeEntries(len(sizes), owners, words, sig, angles, scales)


def simulated_vectors(
    measured: NDArray[np.floating],
    n: int,
    *,
    noise: float = 0.1,
    seed: int = 0,
    chunk: int = 8192,
) -> Iterator[NDArray[np.float32]]:
    """``n`` global vectors ``float32 [m, d]`` chunk by chunk (chunk ``k`` from ``(seed, k)``): a
    measured vector drawn uniformly plus Gaussian noise of ``noise`` times each dimension's
    measured standard deviation, L2-normalised (global descriptors are compared by cosine).

    Raises:
        InputError: no measured vector, a non-finite one, or ``noise`` negative or NaN.
    """
    check_simulated_size(n)
    _check_chunk(chunk)
    x = np.asarray(measured, np.float32)
    if x.ndim != 2 or not len(x) or not np.isfinite(x).all():
        raise InputError("simulated vectors need finite measured vectors [m, d], m >= 1")
    if not noise >= 0:  # NaN too
        raise InputError(f"the noise of simulated vectors must be >= 0, got {noise!r}")
    std = (noise * x.std(axis=0)).astype(np.float32)
    for k, a in enumerate(range(0, n, chunk)):
        rng = np.random.default_rng([seed, k])
        m = min(chunk, n - a)
        v = x[rng.integers(0, len(x), m)] + rng.standard_normal((m, x.shape[1]), np.float32) * std
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        yield (v / np.where(norms > 0, norms, 1)).astype(np.float32)


@dataclass(frozen=True)
class SimulatedIndex:
    """A compact index over real database bags plus simulated distractors, and what it cost.

    Attributes:
        n_index: images indexed (database first, then the simulated distractors).
        build_cpu_s: CPU seconds of drawing the bags and building the lists (both passes).
        postings: postings in the index.
        disk_bytes: bytes of the compressed lists on disk.
        folder: where the lists are.
    """

    n_index: int
    build_cpu_s: float
    postings: int
    disk_bytes: int
    folder: Path


def build_simulated_compact(
    database: Sequence[NDArray[np.integer]],
    stats: BagStatistics,
    n_simulated: int,
    folder: str | Path,
    *,
    seed: int = 0,
    chunk: int = 2048,
) -> tuple[SimulatedIndex, object]:
    """Index ``database``'s bags and ``n_simulated`` drawn distractors as the compact preset does.

    Returns:
        The :class:`SimulatedIndex` and the fitted :class:`~oxbench.index.inverted.InvertedFile`
        (its idf, to weight queries); the lists are opened with
        :meth:`~oxbench.index.postings.CompressedPostings.open`.
    """
    from oxbench.index.inverted import InvertedFile, bow_matrix
    from oxbench.index.postings import CompressedPostings

    check_simulated_size(n_simulated)
    n_words = stats.n_words

    def chunks() -> Iterator[sp.csr_matrix]:
        for a in range(0, len(database), chunk):
            yield bow_matrix(list(database[a : a + chunk]), n_words)
        for bags in simulated_bags(stats, n_simulated, seed=seed, chunk=chunk):
            yield bow_matrix(bags, n_words)

    n_post = 0

    def weighted() -> Iterator[sp.csr_matrix]:
        nonlocal n_post
        for tf in chunks():
            v = ivf.transform(tf)
            n_post += v.nnz
            yield v

    t0 = time.process_time()
    ivf = InvertedFile(n_words).fit_idf(chunks())
    postings = CompressedPostings.build(weighted(), n_words, folder)
    cpu = time.process_time() - t0
    out = SimulatedIndex(len(database) + n_simulated, cpu, n_post, postings.nbytes, Path(folder))
    return out, ivf
