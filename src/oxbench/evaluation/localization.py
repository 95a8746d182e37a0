"""Object localisation: predicted boxes in retrieved images scored by IoU (Tolias et al. 2016).

Retrieval says *which* images show the query's object; localisation asks *where*. Tolias, Sicre
and Jégou (ICLR 2016, "Particular object retrieval with integral max-pooling of CNN
activations") scored it on Oxford 5K with the boxes the ground truth already holds: each query
image carries a box around its landmark, and the query images of one landmark are database
images, so the box of query ``q'`` is where the landmark lies in ``q'``'s image. The protocol here:

- **which pairs count**: for query ``q`` and every *other* query ``q'`` of the same landmark
  whose image ``d`` is a database image labelled positive for ``q`` (and is not ``q``'s own image),
  the pair ``(q, d)`` is scored against ``q'``'s box. Several queries on one image give that
  image several boxes; the best-matching one counts. Queries are of the same landmark when their
  original-protocol ids (``all_souls_1``, ``all_souls_2``) share the landmark part; without ids,
  when each query's image is a positive of the other. A benchmark that knows where the object
  lies in *every* image (the synthetic set, by construction) gives a box for every positive pair;
  :class:`LocalizationTruth` holds either kind.
- **how a pair scores**: the IoU of the predicted box with the ground-truth box (the largest over
  the image's boxes); a pair with no predicted box (the image was not retrieved, or the method
  gave no box for it) scores 0. Boxes are ``(x1, y1, x2, y2)`` in pixels of the full image, area
  ``(x2 - x1) * (y2 - y1)`` (continuous coordinates, as the revisitop boxes).
- **what is averaged**: each query's mean over its pairs, then the mean over the queries that
  have at least one pair (mIoU, the headline); and in the same way the share of pairs with
  IoU >= 0.5 (the usual "correct localisation" threshold).

Bad input is refused with :class:`~oxbench.errors.InputError`: a query without a box, a box that
is not finite or is empty, a box outside its image.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

Box = tuple[float, float, float, float]

#: IoU at or above which a predicted box counts as a correct localisation.
CORRECT_IOU = 0.5
#: How far (pixels) a box may reach past its image's edges before it is refused (rounding).
EDGE_TOLERANCE_PX = 1.0

_QUERY_NUMBER = re.compile(r"_\d+\Z")


def box_iou(a: Box, b: Box) -> float:
    """Intersection over union of two boxes ``(x1, y1, x2, y2)`` (continuous coordinates).

    Example:
        >>> box_iou((0, 0, 2, 2), (1, 1, 3, 3))  # overlap 1, union 7
        0.14285714285714285
        >>> box_iou((0, 0, 1, 1), (2, 2, 3, 3))
        0.0
    """
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def check_box(
    box: Iterable[float], size: tuple[int, int] | None, what: str, source: str | None = None
) -> Box:
    """``box`` as a float 4-tuple, refused when malformed, empty or outside an image of ``size``
    (``(width, height)``; ``None``: not checked against an image)."""
    try:
        vals = tuple(float(v) for v in box)
    except (TypeError, ValueError):
        raise InputError(f"{what}: a box is four numbers x1 y1 x2 y2", source) from None
    if len(vals) != 4 or not all(math.isfinite(v) for v in vals):
        raise InputError(
            f"{what}: a box is four finite numbers x1 y1 x2 y2, got {list(vals)}", source
        )
    x1, y1, x2, y2 = vals
    if x2 <= x1 or y2 <= y1:
        raise InputError(f"{what}: box {list(vals)} is empty (needs x1 < x2 and y1 < y2)", source)
    if size is not None:
        w, h = size
        t = EDGE_TOLERANCE_PX
        if x1 < -t or y1 < -t or x2 > w + t or y2 > h + t:
            raise InputError(f"{what}: box {list(vals)} lies outside the {w}x{h} image", source)
    return (x1, y1, x2, y2)


@dataclass(frozen=True)
class LocalizationTruth:
    """Where each query's object lies in the database images that count.

    Attributes:
        dataset: the benchmark id.
        query_names: the queries, in ground-truth order.
        boxes: ``{(query index, database index): boxes}`` -- the pairs that are scored and the
            ground-truth boxes of the object in that image (several: the best match counts).
        sizes: ``{database index: (width, height)}`` of the images of those pairs.
        kind: ``"other queries"`` (Tolias et al.'s protocol) or ``"generated"`` (known by
            construction).
    """

    dataset: str
    query_names: tuple[str, ...]
    boxes: Mapping[tuple[int, int], tuple[Box, ...]]
    sizes: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    kind: str = "other queries"

    @property
    def n_queries(self) -> int:
        return len(self.query_names)


def landmark_groups(gt: GroundTruth) -> list[int]:
    """A group number per query: queries of one landmark share it.

    From the original-protocol ids (``all_souls_3`` -> ``all_souls``) when every query has one;
    otherwise two queries are grouped when each one's image is a positive of the other.
    """
    ids = [q.query_id for q in gt.queries]
    if all(i is not None for i in ids):
        names = [_QUERY_NUMBER.sub("", str(i)) for i in ids]
        first: dict[str, int] = {}
        return [first.setdefault(n, len(first)) for n in names]
    index = {n: i for i, n in enumerate(gt.db_names)}
    pos = [set(q.positives.tolist()) for q in gt.queries]
    group = list(range(gt.n_queries))
    for a, qa in enumerate(gt.queries):
        for b in range(a + 1, gt.n_queries):
            ia, ib = index.get(qa.name), index.get(gt.queries[b].name)
            if ia is not None and ib is not None and ib in pos[a] and ia in pos[b]:
                old, new = group[b], group[a]
                group = [new if g == old else g for g in group]
    return group


def truth_from_queries(
    gt: GroundTruth, sizes: Mapping[int, tuple[int, int]] | None = None
) -> LocalizationTruth:
    """Tolias et al. 2016's localisation ground truth: the other queries' boxes (module docstring).

    Args:
        gt: ground truth whose query images are database images (Oxford 5K / Paris 6K, original
            protocol); a set whose query images are not in the database (ROxford) has no pairs.
        sizes: ``{database index: (width, height)}`` to check the boxes against (optional).

    Raises:
        InputError: a query without a box, a box outside its image, no pair at all.
    """
    for q in gt.queries:
        if q.bbox is None:
            raise InputError(
                f"query {q.name} has no box; localisation needs a box for every query", gt.source
            )
    index = {n: i for i, n in enumerate(gt.db_names)}
    groups = landmark_groups(gt)
    sizes = dict(sizes or {})
    boxes: dict[tuple[int, int], list[Box]] = {}
    for qi, q in enumerate(gt.queries):
        positives = set(q.positives.tolist())
        for oi, other in enumerate(gt.queries):
            d = index.get(other.name)
            if (
                oi == qi
                or groups[oi] != groups[qi]
                or other.name == q.name
                or d is None
                or d not in positives
            ):
                continue
            assert other.bbox is not None
            box = check_box(
                other.bbox, sizes.get(d), f"query {other.name}'s box in its image", gt.source
            )
            boxes.setdefault((qi, d), []).append(box)
    if not boxes:
        raise InputError(
            "no localisation pairs: no query's image is a positive database image of another query of its landmark "
            "(query images outside the database, as in ROxford/RParis, have none)",
            gt.source,
        )
    return LocalizationTruth(
        gt.dataset, gt.query_names, {k: tuple(v) for k, v in boxes.items()}, sizes
    )


@dataclass(frozen=True)
class LocalizationResult:
    """The localisation score of a run (see the module docstring for the protocol).

    Attributes:
        dataset: the benchmark id.
        miou: mean over queries with pairs of each query's mean IoU (``nan`` when none).
        correct: the same mean of each query's share of pairs with IoU >= :data:`CORRECT_IOU`.
        per_query_iou: ``float64 [n_queries]`` each query's mean IoU (``nan``: no pair).
        per_query_correct: ``float64 [n_queries]`` each query's share of correct pairs.
        per_query_pairs: ``int64 [n_queries]`` its number of pairs.
        n_pairs: pairs scored; ``n_predicted``: of them, with a predicted box.
        iou: ``{(query, database index): IoU}`` of every scored pair.
        miou_boxed: the same two means over the pairs *with* a predicted box only (how good the
            boxes are where the method gave one; ``nan`` when it gave none).
    """

    dataset: str
    miou: float
    correct: float
    per_query_iou: NDArray[np.float64]
    per_query_correct: NDArray[np.float64]
    per_query_pairs: NDArray[np.int64]
    n_pairs: int
    n_predicted: int
    iou: Mapping[tuple[int, int], float]
    miou_boxed: float = float("nan")

    @property
    def n_scored_queries(self) -> int:
        return int((self.per_query_pairs > 0).sum())

    def lines(self) -> list[str]:
        """The printed line: ``oxford5k: localization mIoU: 61.20, IoU>=0.5: 70.00 (...)``."""
        return [
            f"{self.dataset}: localization mIoU: {100 * self.miou:.2f}, IoU>={CORRECT_IOU:g}: {100 * self.correct:.2f} "
            f"({self.n_pairs} pairs over {self.n_scored_queries} queries, {self.n_predicted} with a predicted box, "
            f"mIoU of those {100 * self.miou_boxed:.2f})"
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (fractions; ``None`` for a query without pairs)."""

        def num(v: float) -> float | None:
            return None if math.isnan(v) else float(v)

        return {
            "dataset": self.dataset,
            "miou": num(self.miou),
            "correct": num(self.correct),
            "correct_iou": CORRECT_IOU,
            "n_pairs": self.n_pairs,
            "n_predicted": self.n_predicted,
            "miou_boxed": num(self.miou_boxed),
            "per_query": [
                {"iou": num(i), "correct": num(c), "pairs": int(p)}
                for i, c, p in zip(
                    self.per_query_iou, self.per_query_correct, self.per_query_pairs, strict=True
                )
            ],
        }


def evaluate_localization(
    truth: LocalizationTruth,
    predicted: Mapping[tuple[int, int], Iterable[float]],
    *,
    source: str | None = None,
) -> LocalizationResult:
    """Score predicted boxes against ``truth`` (the protocol of the module docstring).

    Args:
        truth: the pairs that count and their boxes.
        predicted: ``{(query index, database index): (x1, y1, x2, y2)}``; pairs that are not in
            ``truth`` are checked and otherwise ignored, pairs of ``truth`` missing here score 0.
        source: named in error messages (the run folder).

    Raises:
        InputError: a query index out of range, a malformed box, a box outside its image.

    Example:
        >>> t = LocalizationTruth("toy", ("a", "b"), {(0, 5): ((0, 0, 2, 2),), (0, 6): ((0, 0, 1, 1),)})
        >>> r = evaluate_localization(t, {(0, 5): (1, 1, 3, 3)})  # (0, 6) has no box: 0
        >>> round(r.miou, 4), r.n_pairs, r.n_predicted
        (0.0714, 2, 1)
    """
    n_q = truth.n_queries
    boxes: dict[tuple[int, int], Box] = {}
    for (qi, d), box in predicted.items():
        if not 0 <= int(qi) < n_q:
            raise InputError(f"predicted box for query {qi}: there are {n_q} queries", source)
        boxes[(int(qi), int(d))] = check_box(
            box, truth.sizes.get(int(d)), f"query {qi}, image {d}: predicted box", source
        )
    sums, hits, counts = np.zeros(n_q), np.zeros(n_q), np.zeros(n_q, np.int64)
    boxed_sums, boxed_counts = np.zeros(n_q), np.zeros(n_q, np.int64)
    iou: dict[tuple[int, int], float] = {}
    n_predicted = 0
    for (qi, d), gt_boxes in sorted(truth.boxes.items()):
        pred = boxes.get((qi, d))
        value = 0.0
        if pred is not None:
            n_predicted += 1
            value = max(box_iou(pred, g) for g in gt_boxes)
            boxed_sums[qi] += value
            boxed_counts[qi] += 1
        iou[(qi, d)] = value
        sums[qi] += value
        hits[qi] += value >= CORRECT_IOU
        counts[qi] += 1
    has = counts > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        per_iou = np.where(has, sums / np.maximum(counts, 1), np.nan)
        per_correct = np.where(has, hits / np.maximum(counts, 1), np.nan)
    miou = float(per_iou[has].mean()) if has.any() else float("nan")
    correct = float(per_correct[has].mean()) if has.any() else float("nan")
    boxed = boxed_counts > 0
    miou_boxed = (
        float((boxed_sums[boxed] / boxed_counts[boxed]).mean()) if boxed.any() else float("nan")
    )
    return LocalizationResult(
        truth.dataset,
        miou,
        correct,
        per_iou,
        per_correct,
        counts,
        int(counts.sum()),
        n_predicted,
        iou,
        miou_boxed,
    )
