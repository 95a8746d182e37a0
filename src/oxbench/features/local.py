"""Local features of one image, and the protocol every local-feature extractor implements.

:class:`LocalFeatures` is the one shape every local-feature step exchanges (extraction, the feature
store, vocabulary assignment, spatial verification). Keypoints are always in the pixel coordinates of
the ORIGINAL image -- for a query, of the full query image, although only its crop was described --
so that query boxes and geometric models mean the same thing everywhere.

:class:`LocalExtractor` is what a local feature is to the pipelines: a frozen config that describes
an image (:meth:`~LocalExtractor.extract`: keypoints and the descriptors *as stored*, in the dtype
and dimension it declares) and turns stored descriptors into the ones matched and quantised
(:meth:`~LocalExtractor.finish`: RootSIFT from SIFT histograms, or the identity). SIFT / RootSIFT
(:class:`oxbench.features.sift.SiftConfig`) is the first implementation; a learned local feature is
one new module with one such class, usable as any method's ``features``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.registry import GROUPS, Registry

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
            raise InputError(f"descriptors must have shape [n={kp.shape[0]}, d], got {desc.shape}")
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
            np.zeros((0, 4), np.float32),
            np.zeros((0, dim), np.float32),
            (int(image_size[0]), int(image_size[1])),
        )

    def subset(self, index: NDArray[np.integer] | slice) -> LocalFeatures:
        """The features selected by ``index`` (same image size)."""
        return LocalFeatures(
            np.ascontiguousarray(self.keypoints[index]),
            np.ascontiguousarray(self.descriptors[index]),
            self.image_size,
        )


@runtime_checkable
class LocalExtractor(Protocol):
    """A local-feature extractor: settings (a frozen dataclass) plus how to describe an image.

    Everything that changes the stored features must be in :meth:`to_dict` (it keys the feature
    store, and a store built under another one is refused).

    Attributes:
        dim: descriptor dimension.
        stored_dtype: dtype of the stored descriptors (``uint8`` SIFT histograms, ``float16`` ...).
    """

    @property
    def dim(self) -> int: ...  # pragma: no cover

    @property
    def stored_dtype(self) -> Any: ...  # pragma: no cover

    def to_dict(self) -> dict[str, object]:
        """Every setting, JSON-able, with a ``kind`` naming the extractor."""
        ...  # pragma: no cover

    def digest(self) -> str:
        """Short stable hash of :meth:`to_dict` (names the store folder)."""
        ...  # pragma: no cover

    def extract(self, image: NDArray[np.uint8]) -> tuple[NDArray[np.float32], NDArray[Any]]:
        """``(keypoints float32 [n, 4], stored descriptors [n, dim])`` of ``image`` (``H x W x 3``
        uint8 RGB), keypoints in the pixel coordinates of ``image``."""
        ...  # pragma: no cover

    def finish(self, stored: NDArray[Any]) -> NDArray[np.float32]:
        """The descriptors used for matching and quantisation, ``float32 [n, dim]``."""
        ...  # pragma: no cover


def _load_builtin_extractors() -> None:
    from oxbench.features.sift import SiftConfig

    LOCAL_FEATURES.register("sift", SiftConfig)


#: Local-feature extractors by name: each entry builds a :class:`LocalExtractor` from its settings
#: (``SiftConfig(descriptor="rootsift")``); plugins add theirs through the entry-point group
#: ``oxbench.local_features`` (:mod:`oxbench.registry`).
LOCAL_FEATURES: Registry[Callable[..., LocalExtractor]] = Registry(
    "local feature", loader=_load_builtin_extractors, group=GROUPS["local_features"]
)
