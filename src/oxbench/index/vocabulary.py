"""Visual vocabularies: k-means codebooks of local descriptors, from thousands to a million words.

Two structures, one scikit-learn-style class :class:`Vocabulary`:

- ``flat``: one k-means with faiss; assignment is an exact nearest-centroid search. Right for small
  vocabularies (up to some tens of thousands of words).
- ``two-level`` (hierarchical, as a depth-2 vocabulary tree): a coarse k-means with
  ``k1 ~ sqrt(K)`` cells, then each cell's points clustered into fine words, the cell's share of the
  ``K`` words proportional to its share of the training points. Assignment searches the ``n_probe``
  nearest coarse cells and the fine words inside them, so its cost grows like ``sqrt(K)`` instead of
  ``K``. This is the approximate assignment used for large vocabularies (Philbin et al. 2007 used
  randomised kd-trees to the same end); ``n_probe`` trades speed for exactness.

Training-sample limits are explicit (``max_points_per_centroid``): oxbench draws the sample itself
(seeded), so faiss never silently subsamples; ``None`` trains on every descriptor given (as the
``asmk`` package trains its codebook: one faiss k-means over all training vectors). The learned state is saved as plain arrays (``.npz``)
with metadata -- the descriptor type, its dimension and the dataset the vocabulary was trained on --
and a vocabulary is refused where another descriptor or dimension is expected.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import (
    DIGEST_KEY,
    STANDS_FOR_KEY,
    CorruptCache,
    check_stands_for,
    load_npz,
    save_npz,
)
from oxbench.errors import InputError
from oxbench.index.faiss_setup import load_faiss
from oxbench.schema import Group, setting, validate

log = logging.getLogger(__name__)

Structure = Literal["auto", "flat", "two-level"]
VOCAB_FORMAT = 1
#: ``structure="auto"`` picks ``flat`` up to this many words and ``two-level`` above: two-level
#: trains and assigns large vocabularies far faster at the same mAP (timings in ``bench/README.md``).
AUTO_FLAT_MAX = 4096


@dataclass(frozen=True)
class Codebook(Group):
    """How a flat k-means codebook is learned: the ``vocabulary`` settings of a method that learns
    one (VLAD's ``descriptor.vocabulary``), declared once for every family.

    Attributes:
        size: number of words (centroids).
        iter: k-means iterations.
        sample: training descriptors per word (the sample is ``size * sample`` descriptors spread
            over the training images); ``None``: every training descriptor.
        seed: seed of the sample and of k-means.
    """

    size: int = setting(65536, S.Int(lo=2, hi=1 << 24), doc="vocabulary: words (centroids)")
    iter: int = setting(10, S.Int(lo=1, hi=1000), doc="vocabulary: k-means iterations")
    sample: int | None = setting(
        32,
        S.Optional(S.Int(lo=1, hi=1 << 20)),
        doc="vocabulary: training descriptors per word (none: every one)",
    )
    seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="vocabulary: seed of sample and k-means")

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class VocabularySettings(Codebook):
    """The ``vocabulary`` settings of bag of words, HE and ASMK: a codebook that may be two-level
    (:class:`Vocabulary`).

    Attributes:
        structure: ``auto`` (flat up to :data:`AUTO_FLAT_MAX` words, else two-level), ``flat`` or
            ``two-level``.
        n_probe: coarse cells searched in two-level assignment.
    """

    structure: Literal["auto", "flat", "two-level"] = setting(
        "auto",
        S.Choice("auto", "flat", "two-level"),
        doc="vocabulary: flat k-means or two-level",
    )
    n_probe: int = setting(
        4, S.Int(lo=1, hi=1 << 16), doc="vocabulary: coarse cells searched (two-level)"
    )


def _as_f32(
    x: NDArray[np.floating], dim: int | None = None, what: str = "descriptors"
) -> NDArray[np.float32]:
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise InputError(f"{what} must be 2-D [n, d], got shape {x.shape}")
    if dim is not None and x.shape[1] != dim:
        raise InputError(f"{what} have dimension {x.shape[1]}, the vocabulary expects {dim}")
    return x


def check_sample_limit(value: object, setting: str) -> int | None:
    """A training-sample limit (descriptors per word): a positive integer, or ``None`` for all.

    Raises:
        InputError: anything else, naming ``setting``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not value >= 1:
        raise InputError(
            f"{setting} must be an integer >= 1 or null (every training descriptor), got {value!r}"
        )
    return int(value)


def training_sample_size(n_words: int, max_points_per_centroid: int | None) -> int | None:
    """How many training descriptors a vocabulary of ``n_words`` draws (``None``: all of them)."""
    return None if max_points_per_centroid is None else n_words * max_points_per_centroid


def _kmeans(
    x: NDArray[np.float32],
    k: int,
    *,
    n_iter: int,
    seed: int,
    max_ppc: int | None,
    threads: int | None,
) -> NDArray[np.float32]:
    """faiss k-means on ``x`` (already subsampled by the caller); returns ``[k, d]`` centroids."""
    if k >= len(x):
        # as many words as points: the points are the words (pad by repetition cannot happen here)
        return x[:k].copy()
    faiss = load_faiss(threads)
    km = faiss.Kmeans(
        x.shape[1],
        k,
        niter=n_iter,
        seed=seed,
        # the caller subsampled to at most k * max_ppc: these keep faiss from subsampling again
        max_points_per_centroid=max(max_ppc or 0, -(-len(x) // k)),
        min_points_per_centroid=1,
        verbose=False,
        spherical=False,
    )
    km.train(x)
    return np.ascontiguousarray(km.centroids, dtype=np.float32)


def _nearest(
    x: NDArray[np.float32], centroids: NDArray[np.float32], k: int, threads: int | None
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Exact k nearest centroids (squared L2) with a faiss flat index."""
    faiss = load_faiss(threads)
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(centroids)
    d2, idx = index.search(x, min(k, len(centroids)))
    return d2, idx.astype(np.int64)


def _nearest_numpy(
    x: NDArray[np.float32], centroids: NDArray[np.float32], k: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Exact k nearest centroids for small problems (no faiss call overhead)."""
    c2 = np.einsum("ij,ij->i", centroids, centroids)
    x2 = np.einsum("ij,ij->i", x, x)
    d2 = x2[:, None] - 2.0 * (x @ centroids.T) + c2[None, :]
    k = min(k, centroids.shape[0])
    if k == 1:
        idx = d2.argmin(axis=1)[:, None]
    else:
        part = np.argpartition(d2, k - 1, axis=1)[:, :k]
        order = np.take_along_axis(d2, part, axis=1).argsort(axis=1, kind="stable")
        idx = np.take_along_axis(part, order, axis=1)
    dist = np.maximum(np.take_along_axis(d2, idx, axis=1), 0.0).astype(np.float32)
    return dist, idx.astype(np.int64)


def _allocate(counts: NDArray[np.int64], total: int) -> NDArray[np.int64]:
    """Split ``total`` words over cells proportionally to ``counts``, at most ``counts[c]`` each."""
    counts = np.asarray(counts, np.int64)
    if counts.sum() < total:
        raise InputError(f"{counts.sum()} training points cannot make {total} words")
    quota = np.zeros_like(counts)
    remaining = total
    active = counts > 0
    while remaining > 0:
        share = counts * active
        exact = remaining * share / share.sum()
        add = np.floor(exact).astype(np.int64)
        left = remaining - int(add.sum())
        if left > 0:  # largest remainders first, ties by lower cell
            rem = np.where(active, exact - add, -1.0)
            add[np.argsort(-rem, kind="stable")[:left]] += 1
        room = counts - quota
        add = np.minimum(add, room)
        quota += add
        remaining -= int(add.sum())
        active = (counts - quota) > 0
        if not active.any():
            break
    return quota


class Vocabulary:
    """A k-means visual vocabulary (codebook) with faiss; fit / predict like scikit-learn.

    Args:
        n_words: number of visual words ``K``.
        structure: ``"flat"``, ``"two-level"`` or ``"auto"`` (flat up to 4,096 words).
        n_iter: k-means iterations (each level).
        max_points_per_centroid: training sample limit: at most ``K * this`` descriptors are drawn
            (seeded) for the flat k-means, and ``k * this`` per k-means of the two-level one;
            ``None``: every descriptor, in every k-means.
        n_probe: coarse cells searched per descriptor in two-level assignment.
        descriptor: descriptor type the vocabulary is for (``"rootsift"``); recorded and checked.
        seed: seeds sampling and faiss.
        threads: faiss threads (default: all CPUs of this process).

    Attributes:
        centroids_: ``float32 [K, d]`` the visual words (two-level: grouped by coarse cell).
        coarse_: ``float32 [k1, d]`` coarse centroids (two-level only, else ``None``).
        cell_offsets_: ``int64 [k1 + 1]``: the words of cell ``c`` are
            ``centroids_[cell_offsets_[c]:cell_offsets_[c + 1]]`` (two-level only).
        trained_on_: what the vocabulary was learned on (a dataset id, free text).
        n_train_: number of descriptors actually used.
        file_digest_: the content digest of the file it was loaded from (``""`` when not loaded):
            what artifacts computed with it record.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = rng.random((2000, 8), dtype=np.float32)
        >>> voc = Vocabulary(16, descriptor="test").fit(x, trained_on="random")
        >>> voc.predict(x[:3]).shape
        (3,)
    """

    def __init__(
        self,
        n_words: int,
        *,
        structure: Structure = "auto",
        n_iter: int = 20,
        max_points_per_centroid: int | None = 64,
        n_probe: int = 4,
        descriptor: str = "rootsift",
        seed: int = 0,
        threads: int | None = None,
    ) -> None:
        if n_words < 2:
            raise InputError(f"a vocabulary needs at least 2 words, got {n_words}")
        if structure not in ("auto", "flat", "two-level"):
            raise InputError(f"unknown vocabulary structure {structure!r}")
        self.n_words = int(n_words)
        self.structure = structure
        self.n_iter = int(n_iter)
        self.max_points_per_centroid = check_sample_limit(
            max_points_per_centroid, "max_points_per_centroid"
        )
        self.n_probe = int(n_probe)
        self.descriptor = descriptor
        self.seed = int(seed)
        self.threads = threads
        self.centroids_: NDArray[np.float32] | None = None
        self.coarse_: NDArray[np.float32] | None = None
        self.cell_offsets_: NDArray[np.int64] | None = None
        self.trained_on_: str = ""
        self.n_train_: int = 0
        self.file_digest_: str = ""

    # ------------------------------------------------------------------ properties
    @property
    def resolved_structure(self) -> str:
        """``flat`` or ``two-level`` (what ``auto`` means for this size)."""
        if self.structure != "auto":
            return self.structure
        return "flat" if self.n_words <= AUTO_FLAT_MAX else "two-level"

    @property
    def dim(self) -> int:
        """Descriptor dimension (after :meth:`fit`)."""
        self._check_fitted()
        assert self.centroids_ is not None
        return int(self.centroids_.shape[1])

    def _check_fitted(self) -> None:
        if self.centroids_ is None:
            raise InputError("the vocabulary is not trained (call fit or load)")

    def describe(self) -> dict[str, object]:
        """Settings and provenance, JSON-able (recorded in runs and saved files)."""
        return {
            "n_words": self.n_words,
            "structure": self.resolved_structure,
            "n_iter": self.n_iter,
            "max_points_per_centroid": self.max_points_per_centroid,
            "n_probe": self.n_probe,
            "descriptor": self.descriptor,
            "dim": None if self.centroids_ is None else self.dim,
            "seed": self.seed,
            "trained_on": self.trained_on_,
            "n_train": self.n_train_,
        }

    # ------------------------------------------------------------------ learning
    def _sample(
        self, x: NDArray[np.float32], n: int | None, rng: np.random.Generator
    ) -> NDArray[np.float32]:
        if n is None or len(x) <= n:
            return x
        idx = np.sort(rng.choice(len(x), size=n, replace=False))
        return x[idx]

    def fit(self, descriptors: NDArray[np.floating], *, trained_on: str = "") -> Vocabulary:
        """Learn the words from training descriptors.

        Args:
            descriptors: ``[n, d]`` training descriptors (from a set other than the test set).
            trained_on: what they came from (dataset id), recorded with the vocabulary.

        Returns:
            self.

        Raises:
            InputError: fewer descriptors than words, or not 2-D.
        """
        x = _as_f32(descriptors)
        if len(x) < self.n_words:
            raise InputError(f"{len(x)} training descriptors cannot make {self.n_words} words")
        rng = np.random.default_rng(self.seed)
        if self.resolved_structure == "flat":
            sample = self._sample(
                x, training_sample_size(self.n_words, self.max_points_per_centroid), rng
            )
            log.info("k-means: %d words from %d descriptors", self.n_words, len(sample))
            self.centroids_ = _kmeans(
                sample,
                self.n_words,
                n_iter=self.n_iter,
                seed=self.seed,
                max_ppc=self.max_points_per_centroid,
                threads=self.threads,
            )
            self.coarse_ = None
            self.cell_offsets_ = None
            self.n_train_ = len(sample)
        else:
            self._fit_two_level(x, rng)
        self.trained_on_ = str(trained_on)
        return self

    def _fit_two_level(self, x: NDArray[np.float32], rng: np.random.Generator) -> None:
        k1 = max(2, round(np.sqrt(self.n_words)))
        mppc = self.max_points_per_centroid
        sample = self._sample(x, training_sample_size(self.n_words, mppc), rng)
        coarse_sample = self._sample(sample, training_sample_size(k1, mppc), rng)
        log.info(
            "two-level k-means: %d cells x ~%d words from %d descriptors",
            k1,
            self.n_words // k1,
            len(sample),
        )
        coarse = _kmeans(
            coarse_sample,
            k1,
            n_iter=self.n_iter,
            seed=self.seed,
            max_ppc=mppc,
            threads=self.threads,
        )
        _, cell = _nearest(sample, coarse, 1, self.threads)
        cell = cell[:, 0]
        counts = np.bincount(cell, minlength=k1)
        quota = _allocate(counts, self.n_words)
        order = np.argsort(cell, kind="stable")
        starts = np.zeros(k1 + 1, np.int64)
        np.cumsum(counts, out=starts[1:])
        words = []
        offsets = np.zeros(k1 + 1, np.int64)
        for c in range(k1):
            pts = sample[order[starts[c] : starts[c + 1]]]
            q = int(quota[c])
            if q > 0:
                pts = self._sample(pts, training_sample_size(q, mppc), rng)
                words.append(
                    _kmeans(
                        pts,
                        q,
                        n_iter=self.n_iter,
                        seed=self.seed + 1 + c,
                        max_ppc=mppc,
                        threads=self.threads,
                    )
                )
            offsets[c + 1] = offsets[c] + q
        self.coarse_ = coarse
        self.cell_offsets_ = offsets
        self.centroids_ = np.ascontiguousarray(np.concatenate(words), dtype=np.float32)
        self.n_train_ = len(sample)

    # ------------------------------------------------------------------ assignment
    def kneighbors(
        self, descriptors: NDArray[np.floating], k: int = 1, *, batch: int = 65536
    ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """The ``k`` nearest words of each descriptor (exact for flat, approximate for two-level).

        Args:
            descriptors: ``[n, d]``.
            k: neighbours per descriptor.
            batch: descriptors per batch (bounds memory).

        Returns:
            ``(squared distances float32 [n, k], words int64 [n, k])``, nearest first.
        """
        self._check_fitted()
        assert self.centroids_ is not None
        x = _as_f32(descriptors, self.dim)
        if k < 1:
            raise InputError(f"k must be >= 1, got {k}")
        k = min(k, self.n_words)
        out_d = np.empty((len(x), k), np.float32)
        out_w = np.empty((len(x), k), np.int64)
        for s in range(0, len(x), batch):
            xb = x[s : s + batch]
            if self.coarse_ is None:
                d, w = _nearest(xb, self.centroids_, k, self.threads)
            else:
                d, w = self._two_level_knn(xb, k)
            out_d[s : s + batch], out_w[s : s + batch] = d, w
        return out_d, out_w

    def _two_level_knn(
        self, x: NDArray[np.float32], k: int
    ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        assert (
            self.coarse_ is not None
            and self.cell_offsets_ is not None
            and self.centroids_ is not None
        )
        n_probe = min(self.n_probe, len(self.coarse_))
        _, cells = _nearest(x, self.coarse_, n_probe, self.threads)
        cand_d = np.full((len(x), n_probe * k), np.inf, np.float32)
        cand_w = np.full((len(x), n_probe * k), -1, np.int64)
        for p in range(n_probe):
            cell = cells[:, p]
            order = np.argsort(cell, kind="stable")
            bounds = np.searchsorted(cell[order], np.arange(len(self.coarse_) + 1))
            for c in np.flatnonzero(np.diff(bounds)):
                rows = order[bounds[c] : bounds[c + 1]]
                a, b = int(self.cell_offsets_[c]), int(self.cell_offsets_[c + 1])
                if b == a:
                    continue
                d, w = _nearest_numpy(x[rows], self.centroids_[a:b], k)
                kk = d.shape[1]
                cand_d[rows, p * k : p * k + kk] = d
                cand_w[rows, p * k : p * k + kk] = w + a
        order = np.argsort(cand_d, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(cand_d, order, axis=1), np.take_along_axis(cand_w, order, axis=1)

    def predict(self, descriptors: NDArray[np.floating]) -> NDArray[np.int64]:
        """Hard assignment: the nearest word of each descriptor, ``int64 [n]``."""
        return self.kneighbors(descriptors, 1)[1][:, 0]

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | Path, *, stands_for: dict[str, object] | None = None) -> Path:
        """Write the state as ``.npz`` (plain arrays + JSON metadata + their digest), atomically;
        ``stands_for``: what it was trained for (:func:`oxbench.cache.stands_for_record`)."""
        self._check_fitted()
        path = Path(path)
        meta = {"format": VOCAB_FORMAT, **self.describe()}
        arrays: dict[str, NDArray] = {
            "centroids": self.centroids_,  # type: ignore[dict-item]
            "meta": np.array(json.dumps(meta, sort_keys=True)),
        }
        if self.coarse_ is not None:
            arrays["coarse"] = self.coarse_
            arrays["cell_offsets"] = self.cell_offsets_  # type: ignore[assignment]
        return save_npz(path, arrays, stands_for=stands_for)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        descriptor: str | None = None,
        dim: int | None = None,
        threads: int | None = None,
        stands_for: dict[str, object] | None = None,
    ) -> Vocabulary:
        """Read a vocabulary saved by :meth:`save`, refusing another descriptor or dimension
        (and, with ``stands_for``, a vocabulary trained for anything else).

        The file's content digest (recorded by :meth:`save`, a full SHA-256) is checked first.

        Args:
            path: the ``.npz`` file.
            descriptor: the descriptor type the caller will assign (``"rootsift"``), if known.
            dim: the descriptor dimension the caller will assign, if known.
            threads: faiss threads for assignment.
            stands_for: the training it must come from (settings, training set).

        Raises:
            InputError: missing file, or trained for another descriptor / dimension.
            CorruptCache: damaged file, its content does not match its digest, or it was trained
                for another ``stands_for``.
        """
        path = Path(path)
        z = load_npz(path, what="vocabulary")
        try:
            meta = json.loads(str(z["meta"]))
            centroids = np.ascontiguousarray(z["centroids"], dtype=np.float32)
            coarse = z["coarse"].astype(np.float32) if "coarse" in z else None
            offsets = z["cell_offsets"].astype(np.int64) if "cell_offsets" in z else None
        except (KeyError, ValueError) as exc:
            raise CorruptCache(f"malformed vocabulary ({exc})", path) from None
        if meta.get("format") != VOCAB_FORMAT:
            raise InputError(f"unknown vocabulary format {meta.get('format')!r}", path)
        if descriptor is not None and meta.get("descriptor") != descriptor:
            raise InputError(
                f"vocabulary was trained on {meta.get('descriptor')!r} descriptors, not {descriptor!r}",
                path,
            )
        if dim is not None and centroids.shape[1] != dim:
            raise InputError(f"vocabulary has dimension {centroids.shape[1]}, expected {dim}", path)
        if (
            stands_for is not None
        ):  # after the refusals above: a foreign file is an error, not stale
            check_stands_for(z.get(STANDS_FOR_KEY), stands_for, what="vocabulary", path=path)
        voc = cls(
            int(meta["n_words"]),
            structure=meta["structure"],
            n_iter=int(meta["n_iter"]),
            max_points_per_centroid=None
            if meta["max_points_per_centroid"] is None
            else int(meta["max_points_per_centroid"]),
            n_probe=int(meta["n_probe"]),
            descriptor=str(meta["descriptor"]),
            seed=int(meta["seed"]),
            threads=threads,
        )
        if centroids.shape[0] != voc.n_words:
            raise InputError(
                f"vocabulary holds {centroids.shape[0]} words, metadata says {voc.n_words}", path
            )
        voc.centroids_ = centroids
        voc.coarse_ = coarse
        voc.cell_offsets_ = offsets
        voc.trained_on_ = str(meta.get("trained_on", ""))
        voc.n_train_ = int(meta.get("n_train", 0))
        voc.file_digest_ = str(z[DIGEST_KEY])
        return voc
