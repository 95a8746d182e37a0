"""Spatial verification and spatial re-ranking of a short list (Philbin et al., CVPR 2007).

A bag-of-words search ranks database images by how many visual words they share with the query,
ignoring where the words are. Spatial re-ranking takes the top ``R`` of that list, forms tentative
correspondences between the query's and each candidate's features from shared visual words
(:func:`tentative_matches`), fits a geometric model to them robustly (:func:`verify_pair`, OpenCV's
USAC estimators, or ``method="fsm"``: Philbin et al.'s exhaustive single-correspondence
hypotheses from keypoint scale and orientation) and moves the images whose model has enough
inliers to the top, sorted by inlier count (:func:`spatial_rerank`).

Inputs are plain arrays, the layout of :class:`oxbench.features.local.LocalFeatures`:

- keypoints ``[n, 4]`` float32: ``x, y, size, angle_degrees`` in original-image pixels (only
  ``x, y`` are used here);
- visual words ``[n]`` int64: the hard assignment of each feature; negative ids mean "no word" and
  never match.

Coordinate normalisation: before fitting, each image's points are moved into a frame whose longer
side measures ``reference_side`` (1024 by default) and whose origin is the image centre, so that
``threshold_px`` means "pixels of an image resized to a longer side of 1024" for every image,
whatever its stored resolution. The extent of an image is its ``(width, height)`` when given, else
the bounding box of its keypoints. The returned transforms are converted back to the original pixel
coordinates (query pixels -> candidate pixels).

Example (``feats[i]``: a :class:`~oxbench.features.local.LocalFeatures`, ``words[i]`` its words)::

    top = order[:100]
    candidates = [(feats[i].keypoints, words[i], feats[i].image_size) for i in top]
    res = spatial_rerank(q.keypoints, q_words, candidates, order, top_r=100,
                         query_size=q.image_size)
    res.order      # the new ranking; res.verified: the images that passed, best first
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError, require
from oxbench.schema import setting, validate

logger = logging.getLogger(__name__)

GeometricModel = Literal["affine", "homography", "similarity"]
RobustMethod = Literal["magsac", "accurate", "ransac", "fsm"]

#: Minimal sample size of each model (correspondences needed to fit it).
MIN_SAMPLE: dict[str, int] = {"similarity": 2, "affine": 3, "homography": 4}

#: The fixed parts of a fit (not settings): the normalised frame's side, the estimator's iteration
#: cap, and the accepted scale change and anisotropy of a model.
DEFAULT_REFERENCE_SIDE = 1024.0
DEFAULT_MAX_ITERS = 1000
DEFAULT_MAX_SCALE = 10.0
DEFAULT_MAX_ANISOTROPY = 6.0
#: Query rows per matrix-product block in :func:`descriptor_matches` (a block of 256 rows by a few
#: thousand database features stays in the CPU's cache while it is reduced).
_MATCH_ROWS = 256


@dataclass(frozen=True)
class Verification:
    """How a pair, or a short list, is spatially verified: the one declaration of these settings
    and their defaults (the ``spatial`` stage's settings add the short list's length to them).

    The defaults: Philbin et al.'s fast spatial matching of a similarity from single
    correspondences, an 8 px threshold at 1024 px, and 4 inliers to count as verified. How the
    inlier counts of unrelated and matching pairs compare, and why these were chosen, is measured
    in bench/README.md ("Classic pipeline on real photos").

    Attributes:
        matching: tentative correspondences of a short-listed pair: ``descriptors`` (mutual
            nearest neighbours with Lowe's ``ratio``, :func:`descriptor_matches`) or ``words``
            (shared visual words, at most ``max_per_word`` pairs per word, each query feature
            through its ``query_ma`` nearest words, :func:`tentative_matches`).
        ratio: Lowe's ratio of descriptor matching.
        max_per_word: ``matching="words"``: at most this many pairs per shared word.
        query_ma: ``matching="words"``: words per query feature.
        model: the geometric model: ``similarity`` (4 dof), ``affine`` (6) or ``homography`` (8).
        method: ``fsm`` (Philbin et al.'s fast spatial matching) or an OpenCV robust estimator
            (:func:`verify_pair`).
        min_inliers: inliers for a candidate to count as verified (and matches needed to try).
        threshold_px: inlier threshold, in pixels of an image resized to 1024 px.
    """

    matching: Literal["words", "descriptors"] = setting(
        "descriptors",
        S.Choice("words", "descriptors"),
        doc="tentative matches from descriptors or shared words",
    )
    ratio: float = setting(0.8, S.Float(lo=0, lo_open=True, hi=1), doc="Lowe's ratio")
    max_per_word: int = setting(
        8, S.Int(lo=1, hi=1 << 16), doc="words matching: pairs per shared word"
    )
    query_ma: int = setting(1, S.Int(lo=1, hi=64), doc="words matching: words per query feature")
    model: GeometricModel = setting(
        "similarity", S.Choice("similarity", "affine", "homography"), doc="geometric model"
    )
    method: RobustMethod = setting(
        "fsm", S.Choice("fsm", "magsac", "accurate", "ransac"), doc="robust estimator"
    )
    min_inliers: int = setting(4, S.Int(lo=1, hi=1 << 30), doc="inliers to count as verified")
    threshold_px: float = setting(
        8.0, S.Float(lo=0, lo_open=True, hi=1e4), doc="inlier threshold, px at 1024 px"
    )

    def __post_init__(self) -> None:
        validate(self)


#: Lowe's ratio of :func:`descriptor_matches` (the verification's default).
DEFAULT_RATIO = Verification().ratio

PairStatus = Literal["verified", "below_min_inliers", "too_few_matches", "no_model", "degenerate"]


# --------------------------------------------------------------------------------------------
# Tentative correspondences
# --------------------------------------------------------------------------------------------


def _check_words(words: NDArray, name: str) -> NDArray[np.int64]:
    arr = np.asarray(words)
    if arr.ndim != 1:
        raise InputError(f"{name} must be a 1-D array of visual word ids, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"{name} must hold integer visual word ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


@dataclass(frozen=True)
class _WordGroups:
    """One image's features grouped by visual word (sorted word ids, run starts and lengths)."""

    order: NDArray[np.int64]  # feature indices sorted by word (stable)
    words: NDArray[np.int64]  # distinct non-negative words, ascending
    start: NDArray[np.int64]  # start of each word's run in ``order``
    count: NDArray[np.int64]  # length of each run
    # word id -> index into ``words`` (-1 = absent); built when a query is matched many times
    lookup: NDArray[np.int32] | None = None


_MAX_LOOKUP = 1 << 24  # word ids above this use binary search instead of a lookup table


def _group_words(words: NDArray[np.int64], *, with_lookup: bool = False) -> _WordGroups:
    order = np.argsort(words, kind="stable")
    sorted_words = words[order]
    valid = sorted_words >= 0  # negative ids = unassigned; they sort first
    first_valid = int(np.argmax(valid)) if valid.any() else sorted_words.size
    order = order[first_valid:]
    sorted_words = sorted_words[first_valid:]
    if sorted_words.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return _WordGroups(order.astype(np.int64), empty, empty, empty)
    boundary = np.flatnonzero(np.diff(sorted_words)) + 1
    start = np.concatenate(([0], boundary)).astype(np.int64)
    count = np.diff(np.concatenate((start, [sorted_words.size]))).astype(np.int64)
    distinct = sorted_words[start]
    lookup = None
    if with_lookup and distinct[-1] < _MAX_LOOKUP:
        lookup = np.full(int(distinct[-1]) + 1, -1, dtype=np.int32)
        lookup[distinct] = np.arange(distinct.size, dtype=np.int32)
    return _WordGroups(order.astype(np.int64), distinct, start, count, lookup)


def _matches_from_groups(
    q: _WordGroups, d_words: NDArray[np.int64], max_per_word: int | None
) -> NDArray[np.int64]:
    """Pairs between the grouped query words and a database image's words.

    The query is grouped once (sorted unique words, and for repeated use a word -> group lookup
    table); each database image then needs one gather (or ``searchsorted``) of its words, no sort
    of its own -- this is the per-pair cost.
    """
    n_q_words = q.words.size
    if n_q_words == 0 or d_words.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if q.lookup is not None:
        d_idx = np.flatnonzero((d_words >= 0) & (d_words < q.lookup.size))
        group = q.lookup[d_words[d_idx]].astype(np.int64)
        found = group >= 0
        d_idx, group = d_idx[found], group[found]
    else:
        pos = np.searchsorted(q.words, d_words)
        np.minimum(pos, n_q_words - 1, out=pos)
        d_idx = np.flatnonzero((q.words[pos] == d_words) & (d_words >= 0))
        group = pos[d_idx]
    if d_idx.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    a = q.count[group]  # query occurrences of each matching db feature's word
    b = np.bincount(group, minlength=n_q_words)[group]  # db occurrences of that word
    if max_per_word is not None:
        keep = a * b <= max_per_word
        d_idx, group, a = d_idx[keep], group[keep], a[keep]
    if d_idx.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    first = q.start[group]
    if np.all(a == 1):  # the usual case: no query-side repetition
        q_idx = q.order[first]
    else:
        # Each db feature pairs with all ``a`` query occurrences of its word; enumerate them
        # without a Python loop.
        rep = np.repeat(np.arange(d_idx.size), a)
        t = np.arange(rep.size, dtype=np.int64) - (np.cumsum(a) - a)[rep]
        q_idx = q.order[first[rep] + t]
        d_idx = d_idx[rep]
    # Canonical order (by query feature, then database feature): independent of word numbering.
    key = q_idx * (int(d_words.size) + 1) + d_idx
    sort = np.argsort(key, kind="stable")
    return np.stack((q_idx[sort], d_idx[sort]), axis=1)


def tentative_matches(
    q_words: NDArray[np.integer],
    d_words: NDArray[np.integer],
    *,
    max_per_word: int | None,
) -> NDArray[np.int64]:
    """Tentative correspondences between two images from shared visual words.

    A word that occurs once in each image gives one (one-to-one) correspondence. A word that
    occurs ``a`` times in the query and ``b`` times in the database image (a *burst*, e.g. repeated
    windows) gives all ``a * b`` pairs when ``a * b <= max_per_word``; larger bursts are dropped,
    since at most ``min(a, b)`` of their pairs can be right and they would swamp the robust fit
    with outliers. Negative word ids mean "unassigned" and never match.

    The work is one sort of the query's words (done once per query by :func:`spatial_rerank`)
    and one :func:`numpy.searchsorted` of the database words into them; there is no Python loop
    over features.

    Args:
        q_words: ``[n_q]`` visual word of each query feature.
        d_words: ``[n_d]`` visual word of each database feature.
        max_per_word: the most pairs one word may contribute; ``None`` = no limit.

    Returns:
        ``[m, 2]`` int64 pairs ``(query feature index, database feature index)``, sorted by query
        index then database index.

    Example:
        >>> tentative_matches(np.array([5, 7, 9]), np.array([9, 1, 5]), max_per_word=8)
        array([[0, 2],
               [2, 0]])
    """
    if max_per_word is not None and max_per_word < 1:
        raise InputError(f"max_per_word must be >= 1 or None, got {max_per_word}")
    q = _group_words(_check_words(q_words, "q_words"))
    return _matches_from_groups(q, _check_words(d_words, "d_words"), max_per_word)


def expand_query_words(words: NDArray[np.integer]) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Multiple assignment on the query side: one entry per (feature, word) of ``[n, k]`` words.

    Tentative correspondences from a query feature's ``k`` nearest words (Jegou et al.'s multiple
    assignment, here only where correspondences are formed) recover matches whose two descriptors
    fell into neighbouring cells of the vocabulary. Repeated or negative words of a feature are
    dropped.

    Args:
        words: ``[n]`` or ``[n, k]`` word ids of each query feature, nearest first.

    Returns:
        ``(words [m], feature [m])``: the flat word list and, per entry, the query feature it
        belongs to (map matches of the flat list back with ``feature[matches[:, 0]]``).

    Example:
        >>> expand_query_words(np.array([[3, 5], [5, 5]]))
        (array([3, 5, 5]), array([0, 0, 1]))
    """
    arr = np.asarray(words)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(
            f"query words must be an [n] or [n, k] integer array, got {arr.shape} {arr.dtype}"
        )
    arr = arr.astype(np.int64, copy=False)
    n, k = arr.shape
    feature = np.repeat(np.arange(n, dtype=np.int64), k)
    flat = arr.reshape(-1)
    keep = flat >= 0
    if k > 1:  # a word repeated within one feature's list counts once
        dup = np.zeros_like(arr, dtype=bool)
        for j in range(1, k):
            dup[:, j] = (arr[:, j : j + 1] == arr[:, :j]).any(axis=1)
        keep &= ~dup.reshape(-1)
    return flat[keep], feature[keep]


#: Lengths that differ by less than this (relative) count as equal in :func:`descriptor_matches`:
#: float32 rounding of a unit-length RootSIFT vector is about 1e-7.
_SAME_LENGTH_RTOL = 1e-6


def _constant(half_sq: NDArray[np.float32]) -> bool:
    """Whether every vector has the same length (``half_sq``: half their squared lengths), to float32 rounding."""
    hi = float(half_sq.max())
    return hi > 0 and float(half_sq.min()) >= hi * (1.0 - _SAME_LENGTH_RTOL)


def descriptor_matches(
    q_desc: NDArray[np.floating], d_desc: NDArray[np.floating], *, ratio: float = DEFAULT_RATIO
) -> NDArray[np.int64]:
    """Tentative correspondences from the descriptors: mutual nearest neighbours passing a ratio test.

    Query feature ``i`` and database feature ``j`` correspond when ``j`` is ``i``'s nearest
    neighbour (Euclidean) among the database image's features, ``i`` is ``j``'s nearest among the
    query's, and the nearest distance is below ``ratio`` times the second nearest (Lowe 2004). This
    is the matching a bag-of-words with a very large vocabulary approximates; on real photos it
    separates positives from negatives far better than shared words of a vocabulary trained on
    another city (bench/README.md, "Classic pipeline on real photos"). Cost: one ``[n_q, n_d]``
    matrix product per pair, computed in blocks of query rows and reduced in place (memory of one
    block, not of the whole matrix); when every descriptor of each side has one length (RootSIFT's
    unit length, to float32 rounding) the nearest neighbours are the largest dot products and the
    product is reduced as it is, without turning it into distances. Ties match nothing: a database feature with several equally
    near query features is no one's mutual neighbour, as a query feature with two equally near
    database features fails the ratio test.

    Args:
        q_desc: ``[n_q, d]`` query descriptors.
        d_desc: ``[n_d, d]`` database descriptors (same ``d``).
        ratio: Lowe's ratio (on distances, not squared distances), in ``(0, 1]``.

    Returns:
        ``[m, 2]`` int64 ``(query feature, database feature)``, sorted by query feature.

    Example:
        >>> q = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
        >>> descriptor_matches(q, np.array([[0.0, 1.0], [0.9, 0.1], [-1.0, 0.0]], np.float32))
        array([[0, 1],
               [1, 0]])
    """
    if not 0 < ratio <= 1:
        raise InputError(f"ratio must be in (0, 1], got {ratio}")
    q = np.asarray(q_desc, dtype=np.float32)
    d = np.asarray(d_desc, dtype=np.float32)
    if q.ndim != 2 or d.ndim != 2 or (q.size and d.size and q.shape[1] != d.shape[1]):
        raise InputError(
            f"descriptors must be [n, d] arrays of one dimension, got {q.shape} and {d.shape}"
        )
    if q.shape[0] == 0 or d.shape[0] < 2:
        return np.zeros((0, 2), dtype=np.int64)
    # Squared distances are |q_i|^2 + |d_j|^2 - 2 q_i.d_j. Each block of query rows is one matrix
    # product, turned in place into the row metric |d_j|^2/2 - q_i.d_j (its argmin is i's nearest,
    # its two smallest values give the ratio) and then into the column metric |q_i|^2/2 - q_i.d_j,
    # whose running minimum over all blocks says which query feature is each database feature's
    # nearest. No full [n_q, n_d] matrix is kept and no sort or argpartition runs over it.
    n_q = q.shape[0]
    half_q = 0.5 * np.einsum("ij,ij->i", q, q)
    half_d = 0.5 * np.einsum("ij,ij->i", d, d)
    d_t = np.ascontiguousarray(d.T)
    nearest = np.empty(n_q, np.int64)
    best = np.empty(n_q, np.float32)
    second = np.empty(n_q, np.float32)
    if _constant(half_q) and _constant(half_d):
        # Every descriptor of a side has the same length (RootSIFT: unit length): the nearest
        # neighbour on either side is the largest dot product, so one product per block serves
        # both directions without turning it into distances.
        sim_best = np.full(d.shape[0], -np.inf, np.float32)
        sim_count = np.zeros(d.shape[0], np.int64)
        for start in range(0, n_q, _MATCH_ROWS):
            stop = min(start + _MATCH_ROWS, n_q)
            rows = np.arange(stop - start)
            block = q[start:stop] @ d_t
            j = block.argmax(axis=1)
            b = block[rows, j]
            nearest[start:stop], best[start:stop] = j, b
            block[rows, j] = -np.inf
            second[start:stop] = block.max(axis=1)
            block[rows, j] = b
            high = block.max(axis=0)
            n_high = np.count_nonzero(block == high, axis=0)
            sim_count = np.where(
                high > sim_best, n_high, sim_count + np.where(high == sim_best, n_high, 0)
            )
            np.maximum(sim_best, high, out=sim_best)
        mutual = np.flatnonzero((best >= sim_best[nearest]) & (sim_count[nearest] == 1))
        lengths = 2.0 * (float(half_q.mean()) + float(half_d.mean()))  # |q|^2 + |d|^2
        best2 = np.maximum(lengths - 2.0 * best[mutual].astype(np.float64), 0.0)
        second2 = np.maximum(lengths - 2.0 * second[mutual].astype(np.float64), 0.0)
        qi = mutual[best2 < (ratio * ratio) * second2]
        return np.stack((qi, nearest[qi]), axis=1).astype(np.int64)
    # Squared distances are |q_i|^2 + |d_j|^2 - 2 q_i.d_j. Each block of query rows is one matrix
    # product, turned in place into the row metric |d_j|^2/2 - q_i.d_j (its argmin is i's nearest,
    # its two smallest values give the ratio) and then into the column metric |q_i|^2/2 - q_i.d_j,
    # whose running minimum over all blocks says which query feature is each database feature's
    # nearest. No full [n_q, n_d] matrix is kept and no sort or argpartition runs over it.
    at_nearest = np.empty(n_q, np.float32)  # column metric of (i, nearest[i])
    col_best = np.full(d.shape[0], np.inf, np.float32)
    col_count = np.zeros(d.shape[0], np.int64)  # query features at that minimum
    for start in range(0, n_q, _MATCH_ROWS):
        stop = min(start + _MATCH_ROWS, n_q)
        rows = np.arange(stop - start)
        block = q[start:stop] @ d_t
        np.subtract(half_d[None, :], block, out=block)
        j = block.argmin(axis=1)
        b = block[rows, j]
        nearest[start:stop], best[start:stop] = j, b
        block[rows, j] = np.inf
        second[start:stop] = block.min(axis=1)
        block[rows, j] = b
        block -= half_d[None, :]
        block += half_q[start:stop, None]
        at_nearest[start:stop] = block[rows, j]
        low = block.min(axis=0)
        n_low = np.count_nonzero(block == low, axis=0)
        col_count = np.where(low < col_best, n_low, col_count + np.where(low == col_best, n_low, 0))
        np.minimum(col_best, low, out=col_best)
    # mutual: i is the one query feature nearest to its nearest database feature
    mutual = np.flatnonzero((at_nearest <= col_best[nearest]) & (col_count[nearest] == 1))
    best2 = np.maximum(2.0 * (best[mutual].astype(np.float64) + half_q[mutual]), 0.0)
    second2 = np.maximum(2.0 * (second[mutual].astype(np.float64) + half_q[mutual]), 0.0)
    qi = mutual[best2 < (ratio * ratio) * second2]
    return np.stack((qi, nearest[qi]), axis=1).astype(np.int64)


# --------------------------------------------------------------------------------------------
# Robust model fitting for one pair
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PairResult:
    """Outcome of spatially verifying one query-candidate pair.

    Attributes:
        n_inliers: one-to-one inlier count of the accepted model: the smaller of the number of
            distinct query features and of distinct database features among the inlier
            correspondences (so a burst cannot count twice). 0 when no acceptable model was found
            or there were too few tentative matches to try.
        transform: ``3 x 3`` float64 mapping query pixel coordinates (homogeneous) to candidate
            pixel coordinates, or ``None`` when no acceptable model was found.
        inlier_mask: ``[m]`` bool over the input matches (all False without a model).
        status: ``"verified"`` (``n_inliers >= min_inliers``), ``"below_min_inliers"``,
            ``"too_few_matches"`` (fewer matches than ``min_inliers`` or the minimal sample; no
            fit was attempted), ``"no_model"`` (the estimator found none) or ``"degenerate"``
            (rejected by the sanity checks: reflection, extreme scale or anisotropy, a homography
            that sends inliers through infinity).
    """

    n_inliers: int
    transform: NDArray[np.float64] | None
    inlier_mask: NDArray[np.bool_]
    status: PairStatus

    @property
    def verified(self) -> bool:
        """Whether the pair passed spatial verification."""
        return self.status == "verified"


def _check_keypoints(kp: NDArray, name: str) -> NDArray[np.float64]:
    arr = np.asarray(kp)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise InputError(
            f"{name} must be an [n, 4] keypoint array (x, y, size, angle), got {arr.shape}"
        )
    return arr[:, :2].astype(np.float64)


def _normaliser(
    xy: NDArray[np.float64], size: tuple[float, float] | None, reference_side: float
) -> NDArray[np.float64]:
    """3x3 similarity taking pixel coordinates to the centred frame of longer side ``reference_side``."""
    if size is not None:
        width, height = float(size[0]), float(size[1])
        if not (width > 0 and height > 0):
            raise InputError(f"image size must be positive (width, height), got {size}")
        cx, cy, side = width / 2.0, height / 2.0, max(width, height)
    elif xy.shape[0]:
        # 1-D reductions: much faster than ``min(axis=0)`` over an [n, 2] array.
        x, y = xy[:, 0], xy[:, 1]
        x0, x1, y0, y1 = float(x.min()), float(x.max()), float(y.min()), float(y.max())
        cx, cy = (x0 + x1) / 2.0, (y0 + y1) / 2.0
        side = max(x1 - x0, y1 - y0, 1.0)
    else:
        cx, cy, side = 0.0, 0.0, reference_side
    s = reference_side / side
    return np.array([[s, 0.0, -s * cx], [0.0, s, -s * cy], [0.0, 0.0, 1.0]])


def _apply(t: NDArray[np.float64], xy: NDArray[np.float64]) -> NDArray[np.float64]:
    return xy @ t[:2, :2].T + t[:2, 2]


def _sane(
    t: NDArray[np.float64],
    model: str,
    q_inliers: NDArray[np.float64],
    max_scale: float,
    max_anisotropy: float,
) -> bool:
    """Sanity of a model fitted in the normalised frame (both images at the same reference side)."""
    if not np.all(np.isfinite(t)):
        return False
    if model == "homography":
        if abs(t[2, 2]) < 1e-12:
            return False
        h = t / t[2, 2]
        w = q_inliers @ h[2, :2] + h[2, 2]
        # All inliers on the same side of the line at infinity: no fold through infinity.
        if not (np.all(w > 0) or np.all(w < 0)):
            return False
        # Local linear part (Jacobian) at the inliers' centroid.
        c = q_inliers.mean(axis=0)
        wc = c @ h[2, :2] + h[2, 2]
        u = h[:2, :2] @ c + h[:2, 2]
        lin = (h[:2, :2] * wc - np.outer(u, h[2, :2])) / (wc * wc)
    else:
        lin = t[:2, :2]
    if np.linalg.det(lin) <= 0:  # reflection (or collapse to a line)
        return False
    s = np.linalg.svd(lin, compute_uv=False)
    if s[1] <= 0 or s[0] > max_scale or s[1] < 1.0 / max_scale:
        return False
    return bool(s[0] / s[1] <= max_anisotropy)


def _count_one_to_one(matches: NDArray[np.int64], mask: NDArray[np.bool_]) -> int:
    inl = matches[mask]
    if inl.shape[0] == 0:
        return 0
    return int(min(np.unique(inl[:, 0]).size, np.unique(inl[:, 1]).size))


def _check_settings(model: str, method: str, min_inliers: int, threshold_px: float) -> None:
    if model not in MIN_SAMPLE:
        raise InputError(f"unknown geometric model {model!r}; use affine, homography or similarity")
    if method not in ("magsac", "accurate", "ransac", "fsm"):
        raise InputError(f"unknown robust method {method!r}; use magsac, accurate, ransac or fsm")
    if min_inliers < 1:
        raise InputError(f"min_inliers must be >= 1, got {min_inliers}")
    if not threshold_px > 0:
        raise InputError(f"threshold_px must be positive, got {threshold_px}")


def _lstsq_model(src: NDArray[np.float64], dst: NDArray[np.float64], model: str):
    """Least-squares fit of ``model`` (similarity/affine/homography); ``None`` if degenerate."""
    n = src.shape[0]
    if n < MIN_SAMPLE[model]:
        return None
    if model == "homography":
        cv2 = require("cv2", "classic")
        try:
            h, _ = cv2.findHomography(src.astype(np.float32), dst.astype(np.float32), 0)
        except cv2.error:
            return None
        return None if h is None or h.size == 0 else np.asarray(h, dtype=np.float64)
    if model == "similarity":
        # x' = a x - b y + tx, y' = b x + a y + ty
        a_mat = np.zeros((2 * n, 4))
        a_mat[0::2] = np.c_[src[:, 0], -src[:, 1], np.ones(n), np.zeros(n)]
        a_mat[1::2] = np.c_[src[:, 1], src[:, 0], np.zeros(n), np.ones(n)]
        sol, _, rank, _ = np.linalg.lstsq(a_mat, dst.reshape(-1), rcond=None)
        if rank < 4:
            return None
        a, b, tx, ty = sol
        return np.array([[a, -b, tx], [b, a, ty], [0.0, 0.0, 1.0]])
    design = np.c_[src, np.ones(n)]
    sol, _, rank, _ = np.linalg.lstsq(design, dst, rcond=None)
    if rank < 3:
        return None
    return np.vstack((sol.T, [0.0, 0.0, 1.0]))


def _sq_errors(t: NDArray[np.float64], src: NDArray[np.float64], dst: NDArray[np.float64]):
    p = src @ t[:2, :2].T + t[:2, 2]
    if t[2, 0] != 0.0 or t[2, 1] != 0.0 or t[2, 2] != 1.0:
        w = src @ t[2, :2] + t[2, 2]
        p = p / np.where(np.abs(w) < 1e-12, 1e-12, w)[:, None]
    return np.sum((p - dst) ** 2, axis=1)


def _fsm_fit(
    src: NDArray[np.float64],
    dst: NDArray[np.float64],
    scale_ratio: NDArray[np.float64],
    rotation: NDArray[np.float64],
    model: str,
    threshold: float,
    max_scale: float,
    *,
    max_hypotheses: int = 512,
    n_refined: int = 3,
    lo_iters: int = 4,
) -> tuple[NDArray[np.float64] | None, NDArray[np.bool_]]:
    """Fast spatial matching (Philbin et al. 2007): hypotheses from single correspondences.

    Each correspondence of two oriented, scaled keypoints defines a similarity (scale ratio,
    rotation difference, translation). All hypotheses are scored on all correspondences at once
    (with twice the threshold, since a similarity only approximates an affine map away from its
    seed), and the best few are refined by iterated least squares of ``model`` on their inliers
    (local optimisation). Exhaustive and deterministic: there is no random sampling.
    """
    m = src.shape[0]
    hyp = np.arange(m)
    if m > max_hypotheses:
        hyp = np.unique(np.linspace(0, m - 1, max_hypotheses).round().astype(np.int64))
    ok = (scale_ratio[hyp] > 1.0 / max_scale) & (scale_ratio[hyp] < max_scale)
    hyp = hyp[ok]
    if hyp.size == 0:
        return None, np.zeros(m, dtype=bool)
    c = scale_ratio[hyp] * np.cos(rotation[hyp])
    s = scale_ratio[hyp] * np.sin(rotation[hyp])
    tx = dst[hyp, 0] - (c * src[hyp, 0] - s * src[hyp, 1])
    ty = dst[hyp, 1] - (s * src[hyp, 0] + c * src[hyp, 1])
    loose = (2.0 * threshold) ** 2
    # |A_k p_j + t_k - d_j|^2 for all hypotheses k and correspondences j as one matrix product:
    # expanding the square separates k-terms from j-terms (A_k = [[c, -s], [s, c]]).
    px, py, dx, dy = src[:, 0], src[:, 1], dst[:, 0], dst[:, 1]
    hyp_terms = np.stack(
        [
            c * c + s * s,
            tx * tx + ty * ty,
            np.ones_like(c),
            -2 * tx,
            -2 * ty,
            2 * (c * tx + s * ty),
            2 * (c * ty - s * tx),
            -2 * c,
            -2 * s,
        ],
        axis=1,
    )
    corr_terms = np.stack(
        [
            px * px + py * py,
            np.ones_like(px),
            dx * dx + dy * dy,
            dx,
            dy,
            px,
            py,
            px * dx + py * dy,
            px * dy - py * dx,
        ],
        axis=0,
    )
    counts = np.empty(hyp.size, dtype=np.int64)
    chunk = max(1, 4_000_000 // max(m, 1))
    for lo in range(0, hyp.size, chunk):
        err2 = hyp_terms[lo : lo + chunk] @ corr_terms
        counts[lo : lo + chunk] = np.count_nonzero(err2 < loose, axis=1)
    best_t: NDArray[np.float64] | None = None
    best_mask = np.zeros(m, dtype=bool)
    thr2 = threshold * threshold
    for k in np.argsort(-counts, kind="stable")[:n_refined]:
        t = np.array([[c[k], -s[k], tx[k]], [s[k], c[k], ty[k]], [0.0, 0.0, 1.0]])
        mask = _sq_errors(t, src, dst) < loose
        fit_model = "affine" if model == "homography" else model
        for it in range(lo_iters + (2 if model == "homography" else 0)):
            if model == "homography" and it >= lo_iters:
                fit_model = "homography"
            new_t = _lstsq_model(src[mask], dst[mask], fit_model)
            if new_t is None:
                break
            new_mask = _sq_errors(new_t, src, dst) < thr2
            if new_mask.sum() < MIN_SAMPLE[fit_model]:
                break
            converged = fit_model == model and np.array_equal(new_mask, mask)
            t, mask = new_t, new_mask
            if converged:
                break
        mask = _sq_errors(t, src, dst) < thr2
        if mask.sum() > best_mask.sum():
            best_t, best_mask = t, mask
    return best_t, best_mask


def verify_pair(
    q_kp: NDArray[np.floating],
    d_kp: NDArray[np.floating],
    matches: NDArray[np.integer],
    settings: Verification,
    *,
    max_iters: int = DEFAULT_MAX_ITERS,
    confidence: float = 0.999,
    q_size: tuple[float, float] | None = None,
    d_size: tuple[float, float] | None = None,
    reference_side: float = DEFAULT_REFERENCE_SIDE,
    max_scale: float = DEFAULT_MAX_SCALE,
    max_anisotropy: float = DEFAULT_MAX_ANISOTROPY,
    seed: int = 0,
) -> PairResult:
    """Fit a geometric model to tentative matches robustly and count its inliers.

    The model is fitted with OpenCV's USAC framework: ``cv2.estimateAffine2D`` (affine) or
    ``cv2.findHomography`` (homography) with ``cv2.USAC_MAGSAC`` (``method="magsac"``, MAGSAC++
    scoring) or ``cv2.USAC_ACCURATE`` (``"accurate"``: GC-RANSAC local optimisation), or classic
    ``cv2.RANSAC``. The similarity model (``cv2.estimateAffinePartial2D``) is only available with
    ``method="ransac"`` in OpenCV, and that is what it uses for the three OpenCV methods.
    ``method="fsm"`` is Philbin et al.'s fast spatial matching instead: every correspondence of
    two keypoints with size and orientation defines a similarity hypothesis, all are scored
    exhaustively (no sampling) and the best are refined into ``model`` by iterated least squares;
    it needs keypoint sizes and angles (OpenCV convention) that are consistent between images.

    Points are first moved to the normalised frame described in the module docstring, so
    ``threshold_px`` is a reprojection error in the candidate image measured in pixels of an image
    whose longer side is ``reference_side``. A fitted model is then checked in that frame (both
    images at the same reference size): no reflection, both singular values of its linear part (for
    a homography: of its Jacobian at the inliers' centroid) within ``[1/max_scale, max_scale]``,
    their ratio at most ``max_anisotropy``, and for a homography all inliers in front of the line
    at infinity. A model failing a check counts 0 inliers.

    Deterministic: OpenCV's RNG is seeded with ``seed`` before the fit (``cv2.setRNGSeed``) and the
    USAC estimators use a fixed internal state.

    Args:
        q_kp: ``[n_q, >=2]`` query keypoints (x, y first), pixels of the original image.
        d_kp: ``[n_d, >=2]`` candidate keypoints.
        matches: ``[m, 2]`` pairs ``(query feature, candidate feature)``, e.g. from
            :func:`tentative_matches`.
        settings: the model, the robust estimator (see above), the inlier threshold (pixels at
            ``reference_side``) and the inliers that make a verified pair (:class:`Verification`).
        max_iters: iteration cap of the estimator (non-matching pairs always reach it).
        confidence: the estimator's stopping confidence.
        q_size: ``(width, height)`` of the query image; default: the bounding box of ``q_kp``.
        d_size: ``(width, height)`` of the candidate image; default: the bounding box of ``d_kp``.
        reference_side: the longer side of the normalised frame.
        max_scale: largest accepted scale change (and smallest: its inverse).
        max_anisotropy: largest accepted ratio of the two singular values.
        seed: OpenCV RNG seed.

    Returns:
        A :class:`PairResult`; its transform maps query pixels to candidate pixels.

    Raises:
        InputError: malformed arrays, out-of-range match indices or an unknown model/method.
    """
    model, method, min_inliers = settings.model, settings.method, settings.min_inliers
    threshold_px = settings.threshold_px
    _check_settings(model, method, min_inliers, threshold_px)
    q_xy = _check_keypoints(q_kp, "q_kp")
    d_xy = _check_keypoints(d_kp, "d_kp")
    m_arr = _checked_matches(matches, q_xy.shape[0], d_xy.shape[0])
    if m_arr.shape[0] < max(min_inliers, MIN_SAMPLE[model]):
        return PairResult(0, None, np.zeros(m_arr.shape[0], dtype=bool), "too_few_matches")
    if method == "fsm" and (np.shape(q_kp)[1] < 4 or np.shape(d_kp)[1] < 4):
        raise InputError("method 'fsm' needs keypoints with size and angle ([n, 4])")
    return _verify(
        q_xy,
        np.asarray(q_kp),
        _normaliser(q_xy, q_size, reference_side),
        d_xy,
        np.asarray(d_kp),
        _normaliser(d_xy, d_size, reference_side),
        m_arr,
        model=model,
        threshold_px=threshold_px,
        min_inliers=min_inliers,
        method=method,
        max_iters=max_iters,
        confidence=confidence,
        max_scale=max_scale,
        max_anisotropy=max_anisotropy,
        seed=seed,
    )


def _verify(
    q_xy: NDArray[np.float64],
    q_kp: NDArray,
    n_q: NDArray[np.float64],
    d_xy: NDArray[np.float64],
    d_kp: NDArray,
    n_d: NDArray[np.float64],
    m_arr: NDArray[np.int64],
    *,
    model: str,
    threshold_px: float,
    min_inliers: int,
    method: str,
    max_iters: int,
    confidence: float,
    max_scale: float,
    max_anisotropy: float,
    seed: int,
) -> PairResult:
    """:func:`verify_pair` on validated arrays with precomputed normalisers ``n_q``, ``n_d``."""
    n_matches = m_arr.shape[0]
    no_mask = np.zeros(n_matches, dtype=bool)
    if n_matches < max(min_inliers, MIN_SAMPLE[model]):
        return PairResult(0, None, no_mask, "too_few_matches")
    cv2 = require("cv2", "classic")
    src = _apply(n_q, q_xy[m_arr[:, 0]])
    dst = _apply(n_d, d_xy[m_arr[:, 1]])
    src32 = np.ascontiguousarray(src, dtype=np.float32)
    dst32 = np.ascontiguousarray(dst, dtype=np.float32)
    flag = {
        "magsac": cv2.USAC_MAGSAC,
        "accurate": cv2.USAC_ACCURATE,
        "ransac": cv2.RANSAC,
        "fsm": None,
    }[method]
    cv2.setRNGSeed(int(seed))
    try:
        if method == "fsm":
            kq, kd = q_kp, d_kp
            size_q = kq[m_arr[:, 0], 2].astype(np.float64) * n_q[0, 0]
            size_d = kd[m_arr[:, 1], 2].astype(np.float64) * n_d[0, 0]
            ratio = np.divide(size_d, size_q, out=np.zeros_like(size_d), where=size_q > 0)
            rotation = np.deg2rad(
                kd[m_arr[:, 1], 3].astype(np.float64) - kq[m_arr[:, 0], 3].astype(np.float64)
            )
            t, mask = _fsm_fit(src, dst, ratio, rotation, model, float(threshold_px), max_scale)
        elif model == "homography":
            t, mask = cv2.findHomography(
                src32,
                dst32,
                flag,
                float(threshold_px),
                maxIters=int(max_iters),
                confidence=float(confidence),
            )
        elif model == "affine":
            t, mask = cv2.estimateAffine2D(
                src32,
                dst32,
                method=flag,
                ransacReprojThreshold=float(threshold_px),
                maxIters=int(max_iters),
                confidence=float(confidence),
            )
        else:
            t, mask = cv2.estimateAffinePartial2D(
                src32,
                dst32,
                method=cv2.RANSAC,
                ransacReprojThreshold=float(threshold_px),
                maxIters=int(max_iters),
                confidence=float(confidence),
            )
    except cv2.error as exc:  # degenerate configurations (e.g. all points identical)
        logger.debug("robust fit failed: %s", exc)
        return PairResult(0, None, no_mask, "no_model")
    if t is None or mask is None or t.size == 0:
        return PairResult(0, None, no_mask, "no_model")
    t = np.asarray(t, dtype=np.float64)
    if t.shape == (2, 3):
        t = np.vstack((t, [0.0, 0.0, 1.0]))
    inlier_mask = np.asarray(mask).ravel().astype(bool)
    if not inlier_mask.any():
        return PairResult(0, None, no_mask, "no_model")
    if not _sane(t, model, src[inlier_mask], max_scale, max_anisotropy):
        return PairResult(0, None, no_mask, "degenerate")
    transform = np.linalg.inv(n_d) @ t @ n_q
    if model == "homography":
        transform = transform / transform[2, 2]
    n_inliers = _count_one_to_one(m_arr, inlier_mask)
    status: PairStatus = "verified" if n_inliers >= min_inliers else "below_min_inliers"
    return PairResult(n_inliers, transform, inlier_mask, status)


# --------------------------------------------------------------------------------------------
# Re-ranking a short list
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpatialResult:
    """Outcome of :func:`spatial_rerank` for one query.

    Attributes:
        order: ``[n]`` int64, the new full ranking (a permutation of the input ``order``).
        inliers: ``[r]`` int64, inlier count of ``input_order[i]`` for ``i < r`` (aligned with the
            *input* order and with ``candidates``), ``r = min(top_r, len(order))``.
        n_matches: ``[r]`` int64, number of tentative matches of each of those candidates.
        verified: int64 database indices (values of ``order``) that passed, best first, in the
            order they take in the new ranking.
        transforms: ``r`` entries aligned with ``inliers``: the 3x3 query->candidate pixel
            transform, or ``None``.
        statuses: ``r`` :class:`PairResult` status strings aligned with ``inliers``.
        inlier_matches: ``r`` entries aligned with ``inliers``: for a verified pair, the ``[m, 2]``
            int64 ``(query feature, candidate feature)`` inlier correspondences; else ``None``.
    """

    order: NDArray[np.int64]
    inliers: NDArray[np.int64]
    n_matches: NDArray[np.int64]
    verified: NDArray[np.int64]
    transforms: tuple[NDArray[np.float64] | None, ...]
    statuses: tuple[str, ...]
    inlier_matches: tuple[NDArray[np.int64] | None, ...] = ()


def rerank_by_inliers(
    order: NDArray[np.integer], inliers: NDArray[np.integer], min_inliers: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Reorder a ranking given inlier counts of its first ``len(inliers)`` entries.

    The first ``r = len(inliers)`` entries are split: those with ``inliers >= min_inliers`` go
    first, sorted by decreasing inlier count (ties keep their initial order); the others of the top
    ``r`` follow in their initial order; entries beyond ``r`` keep their order and positions.

    Args:
        order: ``[n]`` the initial ranking.
        inliers: ``[r]`` inlier counts of ``order[:r]``, ``r <= n``.
        min_inliers: the count needed to move up.

    Returns:
        ``(new_order [n], verified [k])``: the new ranking and the verified entries, best first.
    """
    ranking = np.asarray(order, dtype=np.int64)
    inliers = np.asarray(inliers, dtype=np.int64)
    r = inliers.shape[0]
    if r > ranking.shape[0]:
        raise InputError(f"{r} inlier counts for a ranking of {ranking.shape[0]} entries")
    passed = inliers >= min_inliers
    pos = np.arange(r)
    # lexsort's last key is primary: unverified after verified, then more inliers first, then
    # the initial position (stable ties). Unverified entries all get key 0 so they keep order.
    sort_inl = np.where(passed, -inliers, 0)
    perm = np.lexsort((pos, sort_inl, ~passed))
    head = ranking[:r][perm]
    new_order = np.concatenate((head, ranking[r:]))
    return new_order, head[: int(passed.sum())]


def spatial_rerank(
    query_kp: NDArray[np.floating],
    query_words: NDArray[np.integer],
    candidates: Sequence[tuple[NDArray, NDArray] | tuple[NDArray, NDArray, tuple[float, float]]],
    order: NDArray[np.integer],
    settings: Verification,
    *,
    top_r: int,
    max_iters: int = DEFAULT_MAX_ITERS,
    confidence: float = 0.999,
    query_size: tuple[float, float] | None = None,
    reference_side: float = DEFAULT_REFERENCE_SIDE,
    max_scale: float = DEFAULT_MAX_SCALE,
    max_anisotropy: float = DEFAULT_MAX_ANISOTROPY,
    seed: int = 0,
    tentative: Sequence[NDArray[np.integer]] | None = None,
) -> SpatialResult:
    """Spatially verify the top ``R`` of a ranking and re-rank them by inlier count.

    Philbin et al. 2007: the short list is re-ranked by the number of inliers of a geometric model
    between the query and each candidate. Here candidates with at least ``min_inliers`` inliers
    move to the top of the list, sorted by inlier count (ties keep their initial order); the other
    top-``R`` candidates follow in their initial order; everything below position ``R`` is left
    unchanged (see :func:`rerank_by_inliers`).

    Candidates contract: ``candidates[i]`` holds the features of the database image ``order[i]``,
    for ``i = 0 .. r-1`` with ``r = min(top_r, len(order))``, and ``len(candidates)`` must equal
    ``r``. Each entry is ``(keypoints [n, 4], words [n])`` or ``(keypoints, words, (width,
    height))``; the size, when given, sets that image's normalised frame (see module docstring).

    Each pair is verified independently with the same seed, so results do not depend on the
    order of the candidates, and a run is reproducible.

    Args:
        query_kp: ``[n_q, 4]`` query keypoints (x, y, size, angle) in query-image pixels.
        query_words: ``[n_q]`` visual words of the query features.
        candidates: features of ``order[:r]``, see above.
        order: ``[n]`` initial ranking of database indices, best first.
        settings: how a pair is verified (:class:`Verification`: its ``max_per_word`` for shared
            words, then :func:`verify_pair`'s; candidates with at least ``min_inliers`` move up).
        top_r: how many of the top of ``order`` to verify.
        max_iters: see :func:`verify_pair`.
        confidence: see :func:`verify_pair`.
        reference_side: see :func:`verify_pair`.
        max_scale: see :func:`verify_pair`.
        max_anisotropy: see :func:`verify_pair`.
        seed: see :func:`verify_pair`.
        query_size: ``(width, height)`` of the query image (default: its keypoints' bounding box).
        tentative: optional ``[m, 2]`` tentative correspondences per candidate (e.g.
            :func:`descriptor_matches`), used instead of shared words; ``query_words`` may then
            be empty. ``query_words`` may also be ``[n_q, k]``: each query feature matches
            through any of its ``k`` words (:func:`expand_query_words`).

    Returns:
        A :class:`SpatialResult`.

    Raises:
        InputError: ``len(candidates) != r`` or malformed arrays.
    """
    order = np.asarray(order)
    if order.ndim != 1 or (order.size and not np.issubdtype(order.dtype, np.integer)):
        raise InputError(f"order must be a 1-D integer array, got {order.shape} {order.dtype}")
    order = order.astype(np.int64, copy=False)
    if top_r < 0:
        raise InputError(f"top_r must be >= 0, got {top_r}")
    r = min(int(top_r), order.shape[0])
    if len(candidates) != r:
        raise InputError(
            f"spatial_rerank needs the features of the top {r} images of the ranking "
            f"(candidates[i] for order[i]), got {len(candidates)}"
        )
    q_xy = _check_keypoints(query_kp, "query_kp")
    if tentative is not None and len(tentative) != r:
        raise InputError(f"{len(tentative)} tentative match arrays for {r} candidates")
    q_words_2d = np.asarray(query_words)
    if tentative is None and q_words_2d.shape[:1] != (q_xy.shape[0],):
        raise InputError(f"query has {q_xy.shape[0]} keypoints but {q_words_2d.shape[0]} words")
    q_words, q_feature = expand_query_words(
        q_words_2d if q_words_2d.size else np.zeros(0, np.int64)
    )
    q_groups = _group_words(q_words, with_lookup=True)
    multiple = q_words_2d.ndim == 2 and q_words_2d.shape[1] > 1
    model, method, min_inliers = settings.model, settings.method, settings.min_inliers
    threshold_px, max_per_word = settings.threshold_px, settings.max_per_word
    _check_settings(model, method, min_inliers, threshold_px)
    query_kp = np.asarray(query_kp)
    if method == "fsm" and query_kp.shape[1] < 4:
        raise InputError("method 'fsm' needs keypoints with size and angle ([n, 4])")
    n_q = _normaliser(q_xy, query_size, reference_side)
    needed = max(min_inliers, MIN_SAMPLE[model])
    verify = functools.partial(
        _verify,
        model=model,
        threshold_px=threshold_px,
        min_inliers=min_inliers,
        method=method,
        max_iters=max_iters,
        confidence=confidence,
        max_scale=max_scale,
        max_anisotropy=max_anisotropy,
        seed=seed,
    )

    inliers = np.zeros(r, dtype=np.int64)
    n_matches = np.zeros(r, dtype=np.int64)
    transforms: list[NDArray[np.float64] | None] = []
    statuses: list[str] = []
    inlier_matches: list[NDArray[np.int64] | None] = []
    for i, cand in enumerate(candidates):
        if len(cand) not in (2, 3):
            raise InputError(f"candidate {i} (image {order[i]}) must be (keypoints, words[, size])")
        d_kp = np.asarray(cand[0])
        d_xy = _check_keypoints(d_kp, f"keypoints of candidate {i} (image {order[i]})")
        d_words = _check_words(cand[1], f"words of candidate {i} (image {order[i]})")
        if tentative is None and d_xy.shape[0] != d_words.shape[0]:
            raise InputError(
                f"candidate {i} (image {order[i]}) has {d_xy.shape[0]} keypoints "
                f"but {d_words.shape[0]} words"
            )
        if method == "fsm" and d_kp.shape[1] < 4:
            raise InputError("method 'fsm' needs keypoints with size and angle ([n, 4])")
        if tentative is not None:
            matches = _checked_matches(tentative[i], q_xy.shape[0], d_xy.shape[0])
        else:
            matches = _matches_from_groups(q_groups, d_words, max_per_word)
            if multiple:
                matches[:, 0] = q_feature[matches[:, 0]]
                matches = np.unique(matches, axis=0)
        n_matches[i] = matches.shape[0]
        if matches.shape[0] < needed:
            res = PairResult(0, None, np.zeros(matches.shape[0], dtype=bool), "too_few_matches")
        else:
            d_size = cand[2] if len(cand) == 3 else None
            n_d = _normaliser(d_xy, d_size, reference_side)
            res = verify(q_xy, query_kp, n_q, d_xy, d_kp, n_d, matches)
        inliers[i] = res.n_inliers
        transforms.append(res.transform)
        statuses.append(res.status)
        inlier_matches.append(matches[res.inlier_mask] if res.verified else None)
    new_order, verified = rerank_by_inliers(order, inliers, min_inliers)
    return SpatialResult(
        order=new_order,
        inliers=inliers,
        n_matches=n_matches,
        verified=verified,
        transforms=tuple(transforms),
        statuses=tuple(statuses),
        inlier_matches=tuple(inlier_matches),
    )


def _checked_matches(matches: NDArray[np.integer], n_q: int, n_d: int) -> NDArray[np.int64]:
    m_arr = np.asarray(matches)
    if m_arr.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if m_arr.ndim != 2 or m_arr.shape[1] != 2 or not np.issubdtype(m_arr.dtype, np.integer):
        raise InputError(
            f"matches must be an [m, 2] integer array, got {m_arr.shape} {m_arr.dtype}"
        )
    m_arr = m_arr.astype(np.int64, copy=False)
    if m_arr.min() < 0 or m_arr[:, 0].max() >= n_q or m_arr[:, 1].max() >= n_d:
        raise InputError("matches refer to keypoints outside q_kp / d_kp")
    return m_arr
