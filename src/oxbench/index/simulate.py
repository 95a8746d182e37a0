"""A large bag-of-words index measured by simulation: distractor words drawn from measured statistics.

Rendering and describing a million distractors costs ~29 CPU-hours here; what an index of that
size costs to build and to query does not depend on the pixels, only on the bags of words it
holds. :class:`BagStatistics` measures, on the words of rendered (or real) images, the two things
that shape an inverted file: how many features an image has (the empirical distribution of bag
sizes) and how often each word occurs (the empirical word frequencies). :func:`simulated_bags`
draws any number of bags from them, seeded, chunk by chunk; :func:`build_simulated_compact`
indexes the real database's bags followed by the simulated distractors the way
``inverted_file=compressed`` does (idf from a first pass, compressed posting lists written by
chunks), so the build's CPU and peak memory, the lists' disk and the query time of real queries
can be measured at 100K or 1M images.

What the simulation leaves out, and so what it cannot say: words are drawn independently within a
bag (real images repeat words: burstiness, which shortens bags in distinct words), there is no
geometry (spatial verification is not simulated) and the distractors' content is not realistic, so
**no accuracy** is measured: only costs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from numpy.typing import NDArray

from oxbench.errors import InputError

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


def simulated_bags(
    stats: BagStatistics, n: int, *, seed: int = 0, chunk: int = 2048
) -> Iterator[list[NDArray[np.int64]]]:
    """``n`` bags drawn from ``stats`` in chunks of ``chunk`` images: each bag's size from the
    measured sizes, its words independently from the word frequencies. Chunk ``k`` depends only
    on ``(seed, k)``, so a chunk can be drawn again without the others."""
    check_simulated_size(n)
    cdf = np.cumsum(stats.word_probabilities)
    cdf[-1] = 1.0
    for k, a in enumerate(range(0, n, chunk)):
        rng = np.random.default_rng([seed, k])
        m = min(chunk, n - a)
        sizes = stats.bag_sizes[rng.integers(0, len(stats.bag_sizes), m)]
        words = np.searchsorted(cdf, rng.random(int(sizes.sum())), side="right")
        words = np.minimum(words, stats.n_words - 1)
        yield np.split(words.astype(np.int64), np.cumsum(sizes)[:-1])


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
