"""A baseline localiser from spatial verification: where the query's box lands in a verified image.

Spatial verification (:mod:`oxbench.refinement.spatial`) finds the correspondences between the query
region and a database image that agree with one geometric transform. :func:`predict_box` turns
them into a box in the database image:

1. **projected query box** (``"projected"``): an affine transform is fitted by least squares to the
   inlier pairs (query -> database; the inliers of a similarity, affine or homography model agree
   with an affine fit up to their threshold over the region), the four corners of the query box
   are mapped with it, and their bounding box, clipped to the image, is the prediction;
2. **inlier box** (``"inliers"``): when fewer than three inliers, nearly collinear ones, or a
   projection that leaves the image make the fit unusable, the bounding box of the inliers' database
   points (clipped; widened to one pixel when the points coincide).

Boxes are ``(x1, y1, x2, y2)`` in pixels of the full images, as the ground truth's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

Box = tuple[float, float, float, float]

#: Smallest ratio of the inlier spread's singular values for the affine fit to be trusted.
MIN_SPREAD_RATIO = 1e-3


def _clip(x1: float, y1: float, x2: float, y2: float, size: tuple[int, int]) -> Box | None:
    w, h = size
    x1, x2 = min(max(x1, 0.0), float(w)), min(max(x2, 0.0), float(w))
    y1, y2 = min(max(y1, 0.0), float(h)), min(max(y2, 0.0), float(h))
    return (x1, y1, x2, y2) if x2 > x1 and y2 > y1 else None


def affine_from_pairs(pairs: ArrayLike) -> np.ndarray | None:
    """Least-squares affine ``A [2, 3]`` with ``A @ [xq, yq, 1] ~ [xd, yd]`` over ``pairs [m, 4]``
    (``xq, yq, xd, yd``); ``None`` with fewer than 3 pairs or query points (nearly) on a line."""
    p = np.asarray(pairs, np.float64).reshape(-1, 4)
    if len(p) < 3:
        return None
    src = p[:, :2]
    centred = src - src.mean(0)
    sv = np.linalg.svd(centred, compute_uv=False)
    if sv[0] <= 0 or sv[1] / sv[0] < MIN_SPREAD_RATIO:
        return None
    design = np.column_stack([src, np.ones(len(p))])
    sol, *_ = np.linalg.lstsq(design, p[:, 2:], rcond=None)
    return np.asarray(sol.T)


def predict_box(
    pairs: ArrayLike, query_box: Sequence[float] | None, size: tuple[int, int]
) -> tuple[Box, str] | None:
    """The predicted box of the query's object in a verified database image, and how it was made.

    Args:
        pairs: ``[m, 4]`` inlier correspondences ``(x_q, y_q, x_db, y_db)``, full-image pixels.
        query_box: the query's box in its image (``None``: the whole query image is the query;
            then only the inlier box is made).
        size: the database image's ``(width, height)``.

    Returns:
        ``(box, "projected" | "inliers")``, or ``None`` without pairs.

    Example:
        >>> pairs = [[0, 0, 10, 20], [4, 0, 18, 20], [0, 2, 10, 24], [4, 2, 18, 24]]  # x2 scale, shift
        >>> predict_box(pairs, (0, 0, 10, 10), (100, 100))
        ((10.0, 20.0, 30.0, 40.0), 'projected')
    """
    p = np.asarray(pairs, np.float64).reshape(-1, 4)
    if not len(p) or not np.isfinite(p).all():
        return None
    if query_box is not None:
        a = affine_from_pairs(p)
        if a is not None:
            x1, y1, x2, y2 = (float(v) for v in query_box)
            corners = (
                np.array([[x1, y1, 1], [x2, y1, 1], [x2, y2, 1], [x1, y2, 1]], np.float64) @ a.T
            )
            lo, hi = corners.min(0), corners.max(0)
            box = _clip(float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1]), size)
            if box is not None:
                return tuple(round(v, 2) for v in box), "projected"  # type: ignore[return-value]
    lo, hi = p[:, 2:].min(0), p[:, 2:].max(0)
    box = _clip(
        float(lo[0]),
        float(lo[1]),
        max(float(hi[0]), float(lo[0]) + 1),
        max(float(hi[1]), float(lo[1]) + 1),
        size,
    )
    if box is None:
        return None
    return tuple(round(v, 2) for v in box), "inliers"  # type: ignore[return-value]
