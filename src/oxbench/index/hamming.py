"""Hamming embedding and weak geometric consistency (Jegou, Douze & Schmid, ECCV 2008).

A descriptor ``x`` quantised to word ``w`` carries, beside ``w``, a binary signature that locates
it inside the word's Voronoi cell: with a random orthogonal projection ``P`` (``d_b x d``, the first
``d_b`` rows of the Q factor of a seeded Gaussian matrix) and per-word medians ``tau_w`` of the
projected training descriptors of that word, bit ``b`` is ``1`` when ``(P x)_b > tau_{w,b}``. Two
features match when they share a word and their signatures differ in at most ``h_t`` bits; a match
weighs ``exp(-h^2 / sigma^2)`` (Jegou, Douze & Schmid, IJCV 2010) times ``idf_w^2``.

Weak geometric consistency votes, per pair of images, every match into a histogram of the
differences of the two features' dominant orientations and one of the differences of their log
scales; a consistent transformation (rotation, zoom) piles the votes into one bin of each, and the
pair's score is the smaller of the two histograms' maxima.

Signatures are packed in ``uint64`` (bit ``b`` is ``(sig >> b) & 1``); the Hamming distance is the
popcount of the XOR.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import DIGEST_KEY, CorruptCache, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.schema import Group, KindSettings, setting, validate

#: Signature length: bits packed in one ``uint64``.
N_BITS = 64


def random_orthogonal_projection(n_bits: int, dim: int, seed: int = 0) -> NDArray[np.float32]:
    """``[n_bits, dim]`` rows of a random orthogonal matrix (QR of a seeded Gaussian ``dim x dim``).

    The sign of each column of Q is fixed by the sign of R's diagonal, so the matrix is drawn
    uniformly (Haar) rather than depending on the QR routine's convention.

    Example:
        >>> p = random_orthogonal_projection(4, 8)
        >>> bool(np.allclose(p @ p.T, np.eye(4), atol=1e-6))
        True
    """
    if not 1 <= n_bits <= dim:
        raise InputError(f"a projection to {n_bits} bits needs 1 <= bits <= the dimension {dim}")
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))[None, :]
    return np.ascontiguousarray(q.T[:n_bits], dtype=np.float32)


def pack_bits(bits: NDArray[np.bool_]) -> NDArray[np.uint64]:
    """``uint64 [n]`` from ``bool [n, 64]``: bit ``b`` of each value is column ``b``."""
    bits = np.asarray(bits, dtype=bool)
    if bits.ndim != 2 or bits.shape[1] != N_BITS:
        raise InputError(f"bits must be [n, {N_BITS}], got shape {bits.shape}")
    packed = np.packbits(bits, axis=1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u8").reshape(-1).astype(np.uint64)


def hamming_distances(a: NDArray[np.uint64], b: NDArray[np.uint64]) -> NDArray[np.int64]:
    """Bits in which packed signatures differ (elementwise, broadcasting), by popcount of the XOR.

    Example:
        >>> hamming_distances(np.array([0b1011], np.uint64), np.array([0b0110], np.uint64)).tolist()
        [3]
    """
    x = np.bitwise_xor(np.asarray(a, np.uint64), np.asarray(b, np.uint64))
    return np.bitwise_count(x).astype(np.int64)


def gaussian_match_weights(h: NDArray[np.integer], sigma: float) -> NDArray[np.float64]:
    """``exp(-h^2 / sigma^2)``: the weight of a match at Hamming distance ``h`` (Jegou et al. 2010)."""
    h = np.asarray(h, dtype=np.float64)
    return np.exp(-(h * h) / (float(sigma) ** 2))


def _medians_by_word(
    projected: NDArray[np.float32], words: NDArray[np.int64], n_words: int, fill: NDArray
) -> NDArray:
    """Per-word medians ``[n_words, n_bits]`` of ``projected [n, n_bits]`` rows (``fill`` where no row)."""
    out = np.broadcast_to(fill.astype(np.float32), (n_words, projected.shape[1])).copy()
    if len(words) == 0:
        return out
    order = np.argsort(words, kind="stable")
    w = words[order]
    starts = np.flatnonzero(np.r_[True, w[1:] != w[:-1]])
    counts = np.diff(np.r_[starts, len(w)])
    lo, hi = starts + (counts - 1) // 2, starts + counts // 2
    for b in range(projected.shape[1]):
        v = projected[order, b]
        v = v[np.lexsort((v, w))]  # sorted within each word's run (w is already sorted)
        out[w[starts], b] = 0.5 * (v[lo].astype(np.float64) + v[hi])
    return out


@dataclass(frozen=True)
class HeSettings(Group):
    """The ``he`` settings of a Hamming-embedding method (Jegou et al. 2008 / 2010).

    Attributes:
        ht: Hamming threshold ``h_t`` (``0 .. 64`` bits; Jegou et al. 2010 use 24 of 64).
        weighting: ``gaussian`` (``exp(-h^2 / sigma^2)``) or ``none`` (every match counts 1).
        sigma: the Gaussian's ``sigma`` in bits (16 in Jegou et al. 2010); with ``gaussian`` only.
        seed: seed of the random orthogonal projection.
        train_max: at most this many training descriptors (a seeded sample) learn the medians
            (``None``: all of them).
    """

    ht: int = setting(24, S.Int(lo=0, hi=64), doc="HE: Hamming threshold (bits of 64)")
    weighting: Literal["gaussian", "none"] = setting(
        "gaussian", S.Choice("gaussian", "none"), doc="HE: match weights exp(-h^2/sigma^2) or 1"
    )
    sigma: float = setting(
        16.0, S.Float(lo=0, lo_open=True, hi=64), doc="HE gaussian weighting: sigma (bits)"
    )
    seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="HE: seed of the random projection")
    train_max: int | None = setting(
        1_000_000,
        S.Optional(S.Int(lo=1, hi=1 << 30)),
        doc="HE: training descriptors for the medians (none: all)",
    )

    def __post_init__(self) -> None:
        validate(self)


@dataclass(frozen=True)
class WgcOff(KindSettings):
    """``wgc=off``: no weak geometric consistency."""

    kind: ClassVar[str] = "off"


@dataclass(frozen=True)
class Wgc(KindSettings):
    """``wgc=on``: weak geometric consistency (Jegou et al. 2008) on the orientation and
    log-scale differences of a pair's matches (:func:`wgc_scores`).

    Attributes:
        angle_bins: bins of the orientation-difference histogram over 360 degrees.
        scale_bins: bins of the log2-scale-difference histogram.
        scale_range: that histogram spans ``+-scale_range`` octaves (beyond: the end bins).
    """

    kind: ClassVar[str] = "on"
    angle_bins: int = setting(8, S.Int(lo=1, hi=360), doc="WGC: orientation bins")
    scale_bins: int = setting(8, S.Int(lo=1, hi=256), doc="WGC: log-scale bins")
    scale_range: float = setting(
        4.0, S.Float(lo=0, lo_open=True, hi=64), doc="WGC: log2-scale half-range"
    )

    def __post_init__(self) -> None:
        validate(self)


#: The ``wgc`` setting of a Hamming-embedding method: ``off``, or ``on`` with its histograms'
#: settings (``--set wgc=on --set wgc.angle_bins=16``).
WGC_SPEC = S.Kinds("wgc", WgcOff, Wgc)


class HammingEmbedding:
    """Per-word binary signatures of descriptors (Jegou et al. 2008).

    Args:
        n_words: vocabulary size.
        seed: seed of the random orthogonal projection.

    Attributes:
        projection_: ``float32 [64, d]`` the projection ``P`` (orthonormal rows).
        medians_: ``float32 [n_words, 64]`` per-word medians of projected training descriptors;
            a word without training descriptors gets the medians over all of them.
        trained_per_word_: ``int64 [n_words]`` training descriptors each word's medians come from.
        file_digest_: the content digest of the file it was loaded from (``""``: not loaded),
            what an index built with it records.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> x = rng.standard_normal((200, 128)).astype(np.float32)
        >>> he = HammingEmbedding(2).fit(x, np.arange(200) % 2)
        >>> he.signatures(x[:3], np.array([0, 1, 0])).dtype
        dtype('uint64')
    """

    def __init__(self, n_words: int, *, seed: int = 0) -> None:
        if n_words < 1:
            raise InputError(f"a Hamming embedding needs at least one word, got {n_words}")
        self.n_words = int(n_words)
        self.seed = int(seed)
        self.projection_: NDArray[np.float32] | None = None
        self.medians_: NDArray[np.float32] | None = None
        self.trained_per_word_: NDArray[np.int64] | None = None
        self.file_digest_ = ""

    def fit(
        self, descriptors: NDArray[np.floating], words: NDArray[np.integer]
    ) -> HammingEmbedding:
        """Learn ``P`` (seeded) and the per-word medians from training descriptors and their words.

        Args:
            descriptors: ``[n, d]`` training descriptors (``d >= 64``).
            words: ``[n]`` their (hard-assigned) words.
        """
        x = np.asarray(descriptors, dtype=np.float32)
        w = self._check_words(words, len(x))
        if x.ndim != 2 or len(x) == 0:
            raise InputError(
                f"Hamming embedding needs [n >= 1, d] training descriptors, got shape {x.shape}"
            )
        self.projection_ = random_orthogonal_projection(N_BITS, x.shape[1], self.seed)
        projected = x @ self.projection_.T
        overall = np.median(projected, axis=0)
        self.medians_ = _medians_by_word(projected, w, self.n_words, overall).astype(np.float32)
        self.trained_per_word_ = np.bincount(w, minlength=self.n_words).astype(np.int64)
        return self

    def _check_words(self, words: NDArray[np.integer], n: int) -> NDArray[np.int64]:
        w = np.asarray(words)
        if w.ndim == 2 and w.shape[1] >= 1:
            w = w[:, 0]
        if w.shape != (n,):
            raise InputError(f"{n} descriptors but words of shape {w.shape}")
        w = w.astype(np.int64, copy=False)
        if w.size and (w.min() < 0 or w.max() >= self.n_words):
            raise InputError(f"visual word outside 0..{self.n_words - 1}")
        return w

    def signatures(
        self, descriptors: NDArray[np.floating], words: NDArray[np.integer]
    ) -> NDArray[np.uint64]:
        """``uint64 [n]`` signatures of descriptors ``[n, d]`` assigned to ``words [n]``."""
        if self.projection_ is None or self.medians_ is None:
            raise InputError("the Hamming embedding is not trained (call fit)")
        x = np.asarray(descriptors, dtype=np.float32)
        w = self._check_words(words, len(x))
        if len(x) == 0:
            return np.zeros(0, np.uint64)
        if x.ndim != 2 or x.shape[1] != self.projection_.shape[1]:
            raise InputError(
                f"descriptors of dimension {x.shape[-1]}, the embedding {self.projection_.shape[1]}"
            )
        return pack_bits((x @ self.projection_.T) > self.medians_[w])

    def save(self, path: str | Path) -> Path:
        """Write the learned arrays as a digest-checked ``.npz``."""
        if self.projection_ is None or self.medians_ is None or self.trained_per_word_ is None:
            raise InputError("the Hamming embedding is not trained (call fit)")
        return save_npz(
            path,
            {
                "projection": self.projection_,
                "medians": self.medians_,
                "trained_per_word": self.trained_per_word_,
                "seed": np.array(self.seed),
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> HammingEmbedding:
        """Read a file written by :meth:`save` (digest checked)."""
        z = load_npz(path, what="Hamming embedding")
        try:
            medians = np.asarray(z["medians"], np.float32)
            he = cls(medians.shape[0], seed=int(z["seed"]))
            he.projection_ = np.asarray(z["projection"], np.float32)
            he.medians_ = medians
            he.trained_per_word_ = np.asarray(z["trained_per_word"], np.int64)
            he.file_digest_ = str(z[DIGEST_KEY])
        except (KeyError, IndexError) as exc:
            raise CorruptCache(f"Hamming embedding file without {exc}", Path(path)) from None
        if he.projection_.shape[0] != N_BITS or medians.shape[1] != N_BITS:
            raise CorruptCache("Hamming embedding arrays of the wrong shape", Path(path))
        return he


def wgc_bins(
    angle_diff_deg: NDArray[np.floating],
    log2_scale_diff: NDArray[np.floating],
    *,
    angle_bins: int,
    scale_bins: int,
    scale_range: float,
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Histogram bins of orientation and log-scale differences of matches.

    Args:
        angle_diff_deg: orientation differences in degrees (any value; taken modulo 360).
        log2_scale_diff: ``log2(scale_db / scale_query)``; values outside ``+-scale_range`` go
            to the end bins.
        angle_bins: bins over the full circle.
        scale_bins: bins over ``[-scale_range, scale_range]``.
        scale_range: half-width of the log2-scale histogram.

    Returns:
        ``(angle bin [m], scale bin [m])``.

    Example:
        >>> wgc_bins(np.array([10.0, -10.0]), np.array([0.1, -3.0]), angle_bins=8, scale_bins=8,
        ...          scale_range=2.0)
        (array([0, 7]), array([4, 0]))
    """
    a = np.mod(np.asarray(angle_diff_deg, np.float64), 360.0)
    ab = np.minimum((a * (angle_bins / 360.0)).astype(np.int64), angle_bins - 1)
    s = np.clip(np.asarray(log2_scale_diff, np.float64), -scale_range, scale_range)
    sb = np.minimum(
        ((s + scale_range) * (scale_bins / (2.0 * scale_range))).astype(np.int64), scale_bins - 1
    )
    return ab, sb


def wgc_scores(
    image: NDArray[np.integer],
    weight: NDArray[np.floating],
    angle_bin: NDArray[np.integer],
    scale_bin: NDArray[np.integer],
    n_images: int,
    angle_bins: int,
    scale_bins: int,
) -> NDArray[np.float64]:
    """Per image, ``min(max of the angle histogram, max of the scale histogram)`` of its matches.

    Each match (one query feature and one feature of ``image``) adds ``weight`` to bin
    ``angle_bin`` of that image's orientation histogram and to bin ``scale_bin`` of its scale
    histogram (Jegou et al. 2008). Images without matches score 0.

    Returns:
        ``float64 [n_images]``.

    Example:
        >>> wgc_scores(np.array([0, 0, 0]), np.ones(3), np.array([1, 1, 2]), np.array([0, 3, 3]), 1, 4, 4).tolist()
        [2.0]
    """
    img = np.asarray(image, np.int64)
    wt = np.asarray(weight, np.float64)
    by_angle = np.bincount(
        img * angle_bins + np.asarray(angle_bin, np.int64), wt, minlength=n_images * angle_bins
    )
    by_scale = np.bincount(
        img * scale_bins + np.asarray(scale_bin, np.int64), wt, minlength=n_images * scale_bins
    )
    return np.minimum(
        by_angle.reshape(n_images, angle_bins).max(axis=1),
        by_scale.reshape(n_images, scale_bins).max(axis=1),
    )


def tfidf_norm(words: NDArray[np.integer], idf: NDArray[np.float64]) -> float:
    """The L2 norm of the tf-idf vector of an image with these feature words."""
    tf = np.bincount(np.asarray(words, np.int64), minlength=len(idf)).astype(np.float64)
    return float(np.sqrt(np.sum((tf * idf) ** 2)))


def normalised(
    raw: NDArray[np.float64], norms: NDArray[np.float64], query_norm: float
) -> NDArray[np.float64]:
    """``raw / (norms * query_norm)``, 0 where that product is 0."""
    denominator = norms * query_norm
    out = np.zeros(len(raw))
    nz = denominator > 0
    out[nz] = raw[nz] / denominator[nz]
    return out


class HammingIndex:
    """An inverted file of features with signatures, scored by Hamming-embedding matches.

    Every database feature is stored in the posting list of its word with its image, signature,
    orientation and log2 scale. A query feature matches the features of its word within
    ``ht`` bits; a match weighs ``idf_w^2 * g(h)`` (``g``: :func:`gaussian_match_weights`, or 1).
    An image's score is the sum of its matches' weights -- or, with weak geometric consistency,
    :func:`wgc_scores` of them -- divided by the L2 norms of the query's and the image's tf-idf
    vectors (the normalisation of Jegou et al.: with every match at distance 0 and ``g = 1`` the
    score is the tf-idf cosine).

    Args:
        n_words: vocabulary size.
        idf: weight words by ``log(N / df)``.

    Attributes:
        idf_: ``float64 [n_words]`` (0 for words in no database image; ones with ``idf=False``).
        norms_: ``float64 [n_images]`` tf-idf norms of the database images.
        offsets_: ``int64 [n_words + 1]``; the postings of word ``w`` are ``offsets_[w]:offsets_[w+1]``.
        images_, signatures_, angles_, log_scales_: the postings, in word order.
    """

    def __init__(self, n_words: int, *, idf: bool = True) -> None:
        self.n_words = int(n_words)
        self.idf = bool(idf)
        self.n_images = 0
        self.idf_: NDArray[np.float64] | None = None
        self.norms_: NDArray[np.float64] | None = None
        self.offsets_: NDArray[np.int64] | None = None
        self.images_ = np.zeros(0, np.int64)
        self.signatures_ = np.zeros(0, np.uint64)
        self.angles_ = np.zeros(0, np.float32)
        self.log_scales_ = np.zeros(0, np.float32)

    def fit(
        self,
        words: NDArray[np.integer],
        images: NDArray[np.integer],
        signatures: NDArray[np.uint64],
        angles: NDArray[np.floating],
        log_scales: NDArray[np.floating],
        n_images: int,
    ) -> HammingIndex:
        """Build the postings of every database feature (all arrays ``[n_features]``).

        Args:
            words: each feature's word; images: its image (``0 .. n_images - 1``).
            signatures: its packed signature; angles: orientation in degrees; log_scales: log2 scale.
            n_images: database images (images without features included).
        """
        w = np.asarray(words, np.int64)
        img = np.asarray(images, np.int64)
        n = len(w)
        for name, a in (
            ("images", img),
            ("signatures", signatures),
            ("angles", angles),
            ("log_scales", log_scales),
        ):
            if np.shape(a) != (n,):
                raise InputError(f"{n} feature words but {name} of shape {np.shape(a)}")
        if n and (w.min() < 0 or w.max() >= self.n_words):
            raise InputError(f"visual word outside 0..{self.n_words - 1}")
        if n and (img.min() < 0 or img.max() >= n_images):
            raise InputError(f"image index outside 0..{n_images - 1}")
        self.n_images = int(n_images)
        order = np.lexsort((img, w))
        self.images_ = img[order]
        self.signatures_ = np.asarray(signatures, np.uint64)[order]
        self.angles_ = np.asarray(angles, np.float32)[order]
        self.log_scales_ = np.asarray(log_scales, np.float32)[order]
        self.offsets_ = np.zeros(self.n_words + 1, np.int64)
        np.cumsum(np.bincount(w, minlength=self.n_words), out=self.offsets_[1:])
        # tf per (word, image): the postings are sorted by word, then image
        ws = w[order]
        key = ws * max(self.n_images, 1) + self.images_
        first = np.r_[True, key[1:] != key[:-1]] if n else np.zeros(0, bool)
        starts = np.flatnonzero(first)
        tf = np.diff(np.r_[starts, n]).astype(np.float64)
        pair_word, pair_image = ws[starts], self.images_[starts]
        if self.idf:
            df = np.bincount(pair_word, minlength=self.n_words).astype(np.float64)
            idf = np.zeros(self.n_words)
            idf[df > 0] = np.log(self.n_images / df[df > 0])
        else:
            idf = np.ones(self.n_words)
        self.idf_ = idf
        self.norms_ = np.sqrt(
            np.bincount(pair_image, (tf * idf[pair_word]) ** 2, minlength=self.n_images)
        )
        return self

    def query_norm(self, words: NDArray[np.integer]) -> float:
        """The tf-idf L2 norm of a query with these feature words."""
        assert self.idf_ is not None
        return tfidf_norm(words, self.idf_)

    def matches(
        self, words: NDArray[np.integer], signatures: NDArray[np.uint64], ht: int
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Every match of a query's features: ``(query feature [m], posting [m], distance [m])``.

        A match is a database feature in the posting list of the query feature's word whose
        signature is within ``ht`` bits.
        """
        if self.offsets_ is None:
            raise InputError("the Hamming index is not built (call fit)")
        if not 0 <= ht <= N_BITS:
            raise InputError(f"Hamming threshold {ht} outside 0..{N_BITS}")
        w = np.asarray(words, np.int64)
        start, stop = self.offsets_[w], self.offsets_[w + 1]
        counts = stop - start
        total = int(counts.sum())
        feature = np.repeat(np.arange(len(w)), counts)
        posting = (
            np.arange(total)
            - np.repeat(np.cumsum(counts) - counts, counts)
            + np.repeat(start, counts)
        )
        h = hamming_distances(np.asarray(signatures, np.uint64)[feature], self.signatures_[posting])
        keep = h <= ht
        return feature[keep], posting[keep], h[keep]

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
        """Scores ``[n_images]`` of one query's features (``sigma=None``: every match weighs ``idf^2``)."""
        assert self.idf_ is not None and self.norms_ is not None
        w = np.asarray(words, np.int64)
        feature, posting, h = self.matches(w, signatures, ht)
        weight = self.idf_[w[feature]] ** 2
        if sigma is not None:
            weight = weight * gaussian_match_weights(h, sigma)
        image = self.images_[posting]
        if wgc:
            ab, sb = wgc_bins(
                self.angles_[posting] - np.asarray(angles, np.float64)[feature],
                self.log_scales_[posting] - np.asarray(log_scales, np.float64)[feature],
                angle_bins=angle_bins,
                scale_bins=scale_bins,
                scale_range=scale_range,
            )
            raw = wgc_scores(image, weight, ab, sb, self.n_images, angle_bins, scale_bins)
        else:
            raw = np.bincount(image, weight, minlength=self.n_images).astype(np.float64)
        return normalised(raw, self.norms_, self.query_norm(w))
