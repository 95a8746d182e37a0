"""Local features of one image: keypoints and descriptors (SIFT / RootSIFT).

:class:`LocalFeatures` is the one shape every local-feature step exchanges (extraction, the feature
store, vocabulary assignment, spatial verification). Keypoints are always in the pixel coordinates of
the ORIGINAL image -- for a query, of the full query image, although only its crop was described --
so that query boxes and geometric models mean the same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError

#: Number of keypoint columns: x, y, size, angle_degrees (OpenCV KeyPoint convention).
KEYPOINT_COLUMNS = ("x", "y", "size", "angle")


@dataclass(frozen=True, eq=False)
class LocalFeatures:
    """Keypoints and descriptors of one image.

    Attributes:
        keypoints: ``float32 [n, 4]`` = x, y, size, angle in degrees (OpenCV ``KeyPoint``
            convention), in pixels of the original image (the full query image for a query).
        descriptors: ``float32 [n, d]`` (``d = 128`` for SIFT / RootSIFT).
        image_size: ``(width, height)`` of the original image.
    """

    keypoints: NDArray[np.float32]
    descriptors: NDArray[np.float32]
    image_size: tuple[int, int]

    def __post_init__(self) -> None:
        kp = self.keypoints
        desc = self.descriptors
        if kp.ndim != 2 or kp.shape[1] != 4:
            raise InputError(f"keypoints must have shape [n, 4], got {kp.shape}")
        if desc.ndim != 2 or desc.shape[0] != kp.shape[0]:
            raise InputError(
                f"descriptors must have shape [n={kp.shape[0]}, d], got {desc.shape}"
            )
        if kp.dtype != np.float32 or desc.dtype != np.float32:
            raise InputError(
                f"keypoints and descriptors must be float32, got {kp.dtype} and {desc.dtype}"
            )
        if len(self.image_size) != 2:
            raise InputError(f"image_size must be (width, height), got {self.image_size}")

    def __len__(self) -> int:
        return int(self.keypoints.shape[0])

    @property
    def dim(self) -> int:
        """Descriptor dimension."""
        return int(self.descriptors.shape[1])

    @classmethod
    def empty(cls, image_size: tuple[int, int], dim: int = 128) -> LocalFeatures:
        """Features of an image where nothing was detected."""
        return cls(
            np.zeros((0, 4), np.float32), np.zeros((0, dim), np.float32), (int(image_size[0]), int(image_size[1]))
        )

    def subset(self, index: NDArray[np.integer] | slice) -> LocalFeatures:
        """The features selected by ``index`` (same image size)."""
        return LocalFeatures(
            np.ascontiguousarray(self.keypoints[index]),
            np.ascontiguousarray(self.descriptors[index]),
            self.image_size,
        )
