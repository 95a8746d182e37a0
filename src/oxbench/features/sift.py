"""SIFT and RootSIFT local features with OpenCV.

RootSIFT (Arandjelovic & Zisserman 2012): L1-normalise each SIFT descriptor and take the element-wise
square root, so that the Euclidean distance between RootSIFT vectors is the Hellinger kernel between
the SIFT histograms. The result has unit L2 norm.

Images are converted to grey, optionally downscaled so that the longer side is at most
``max_side`` (never upscaled), described, and the keypoints are mapped back to the pixel coordinates
of the original image. A query is described from its crop only; its keypoints are shifted by the
crop offset into the coordinates of the full query image (docs/protocols.md, "The task").
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError, require
from oxbench.features.local import LocalFeatures
from oxbench.schema import setting, validate

DescriptorType = Literal["sift", "rootsift"]
DESCRIPTOR_TYPES: tuple[str, ...] = ("sift", "rootsift")
#: The ``kind`` :meth:`SiftConfig.to_dict` records.
SIFT_KIND = "opencv-sift"


@dataclass(frozen=True)
class SiftConfig:
    """How SIFT / RootSIFT features are extracted; everything that changes the stored features.

    The first :class:`~oxbench.features.local.LocalExtractor`: stores OpenCV's SIFT histograms as
    ``uint8`` and finishes them into RootSIFT (or plain SIFT) on read.

    Attributes:
        descriptor: ``"rootsift"`` (default) or ``"sift"``.
        max_side: images whose longer side exceeds this are downscaled to it (``0`` = never).
        n_features: keep at most this many keypoints, the strongest by response (``0`` = all).
        contrast_threshold, edge_threshold, sigma, n_octave_layers: OpenCV ``SIFT_create``
            parameters (OpenCV defaults).
        orientation: ``"invariant"`` (default): each keypoint is described along its dominant
            gradient orientation, so a photo turned by a quarter (Holidays' sideways images) gives
            the same descriptors and spatial verification's similarity / affine model absorbs the
            turn; ``"upright"``: every keypoint described at angle 0 (no rotation invariance, one
            descriptor per location: the better choice for sets whose photos are all upright).
    """

    descriptor: DescriptorType = setting(
        "rootsift", S.Choice(*DESCRIPTOR_TYPES), doc="rootsift or sift"
    )
    max_side: int = setting(
        512, S.Int(lo=0, hi=1 << 16), doc="longer image side described (0: as is)"
    )
    n_features: int = setting(
        1000, S.Int(lo=0, hi=1 << 20), doc="strongest keypoints kept (0: all)"
    )
    contrast_threshold: float = setting(
        0.04, S.Float(lo=0, hi=1), doc="OpenCV SIFT contrast threshold"
    )
    edge_threshold: float = setting(
        10.0, S.Float(lo=0, lo_open=True, hi=1000), doc="OpenCV SIFT edge threshold"
    )
    sigma: float = setting(1.6, S.Float(lo=0, lo_open=True, hi=100), doc="OpenCV SIFT sigma")
    n_octave_layers: int = setting(3, S.Int(lo=1, hi=16), doc="OpenCV SIFT layers per octave")
    orientation: str = setting(
        "invariant",
        S.Choice("invariant", "upright"),
        doc="invariant: along each keypoint's dominant orientation (rotated photos match); upright: angle 0",
    )

    def __post_init__(self) -> None:
        validate(self)

    @property
    def dim(self) -> int:
        """Descriptor dimension (128 for SIFT and RootSIFT)."""
        return 128

    @property
    def stored_dtype(self) -> type[np.uint8]:
        """Stored as OpenCV's integer-valued histograms, exactly (:func:`extract_raw_sift`)."""
        return np.uint8

    def extract(self, image: NDArray[np.uint8]) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
        """Keypoints and raw SIFT histograms of ``image`` (:func:`extract_raw_sift`)."""
        return extract_raw_sift(image, self)

    def finish(self, stored: NDArray[np.uint8 | np.float32]) -> NDArray[np.float32]:
        """RootSIFT (or SIFT as float32) of stored histograms (:func:`finish_descriptors`)."""
        return finish_descriptors(stored, self.descriptor)

    def __str__(self) -> str:
        """The name that selects it (``rootsift``); its other settings are ``features.*``."""
        return self.descriptor

    def to_dict(self) -> dict[str, object]:
        """The configuration as JSON-able data, including the descriptor dimension.

        ``orientation`` appears only when it is not the default, so the features (and caches) of
        configs from before the setting existed keep their digest.
        """
        out: dict[str, object] = {"kind": SIFT_KIND, **asdict(self), "dim": self.dim}
        if self.orientation == "invariant":
            del out["orientation"]
        return out

    def digest(self) -> str:
        """A short stable hash of :meth:`to_dict` (names feature-store folders)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def rootsift(
    descriptors: NDArray[np.floating | np.integer], eps: float = 1e-12
) -> NDArray[np.float32]:
    """RootSIFT of SIFT descriptors: L1-normalise each row, then take the square root.

    Args:
        descriptors: ``[n, d]`` non-negative SIFT descriptors (any scale; float, or OpenCV's
            integer-valued uint8).
        eps: guards all-zero rows, which stay zero.

    Returns:
        ``float32 [n, d]``, each non-zero row with unit L2 norm.

    Example:
        >>> rootsift(np.array([[1.0, 3.0]]))  # doctest: +ELLIPSIS
        array([[0.5      , 0.866...]], dtype=float32)
    """
    # one float32 copy, normalised in place: a vocabulary's training set (10M descriptors, 4.9 GiB
    # an array) once held three such arrays at the same time here
    d = np.array(descriptors, dtype=np.float32)
    if d.ndim != 2:
        raise InputError(f"descriptors must be 2-D, got shape {d.shape}")
    if d.size and float(d.min()) < 0:
        raise InputError("SIFT descriptors must be non-negative for RootSIFT")
    d /= np.maximum(d.sum(axis=1, keepdims=True), eps)
    return np.sqrt(d, out=d)


def finish_descriptors(raw: NDArray[np.uint8 | np.float32], descriptor: str) -> NDArray[np.float32]:
    """Turn stored raw SIFT (OpenCV's integer-valued histograms) into the configured descriptor."""
    if descriptor == "rootsift":
        return rootsift(raw)
    return np.asarray(raw, dtype=np.float32)


def _to_gray(image: NDArray[np.uint8]) -> NDArray[np.uint8]:
    cv2 = require("cv2", "classic")
    if image.ndim == 2:
        return np.ascontiguousarray(image)
    if image.ndim == 3 and image.shape[2] == 3:
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGB2GRAY)
    if image.ndim == 3 and image.shape[2] == 4:
        return cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_RGBA2GRAY)
    raise InputError(f"image must be H x W, H x W x 3 or H x W x 4, got shape {image.shape}")


def extract_raw_sift(
    image: NDArray[np.uint8], config: SiftConfig = SiftConfig()
) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
    """Detect and describe SIFT keypoints; keypoints in the pixel coordinates of ``image``.

    Args:
        image: ``H x W x 3`` uint8 RGB (or grey ``H x W``).
        config: extraction settings (resizing, number of features, OpenCV parameters).

    Returns:
        ``(keypoints float32 [n, 4], raw uint8 [n, 128])``: x, y, size, angle (degrees) in the
        coordinates of ``image`` (downscaling undone), and OpenCV's SIFT histograms, which are
        integer-valued in ``[0, 255]`` and therefore stored exactly as ``uint8``.
    """
    cv2 = require("cv2", "classic")
    gray = _to_gray(np.asarray(image))
    h, w = gray.shape
    if h == 0 or w == 0:
        raise InputError(f"empty image ({w}x{h})")
    scale = 1.0
    if config.max_side and max(h, w) > config.max_side:
        scale = config.max_side / float(max(h, w))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        gray = cv2.resize(gray, size, interpolation=cv2.INTER_AREA)
        # the actual per-axis factors after rounding
        sx, sy = size[0] / float(w), size[1] / float(h)
    else:
        sx = sy = 1.0
    sift = cv2.SIFT_create(
        nfeatures=config.n_features,
        nOctaveLayers=config.n_octave_layers,
        contrastThreshold=config.contrast_threshold,
        edgeThreshold=config.edge_threshold,
        sigma=config.sigma,
    )
    if config.orientation == "upright":
        # one keypoint per location and scale (OpenCV repeats a location for each strong
        # orientation), described at angle 0
        seen: dict[tuple[float, float, float, int], Any] = {}
        for k in sift.detect(gray, None):
            seen.setdefault((round(k.pt[0], 3), round(k.pt[1], 3), round(k.size, 3), k.octave), k)
        upright = [
            cv2.KeyPoint(k.pt[0], k.pt[1], k.size, 0.0, k.response, k.octave, k.class_id)
            for k in seen.values()
        ]
        kps, desc = sift.compute(gray, upright) if upright else ((), None)
    else:
        kps, desc = sift.detectAndCompute(gray, None)
    if not kps or desc is None:
        return np.zeros((0, 4), np.float32), np.zeros((0, 128), np.uint8)
    kp = np.array([(k.pt[0], k.pt[1], k.size, k.angle) for k in kps], dtype=np.float32)
    if config.n_features and len(kp) > config.n_features:
        # OpenCV may return a few more than asked (ties at the response cut): keep the first n
        kp, desc = kp[: config.n_features], desc[: config.n_features]
    # pixel centres: (x + 0.5) / s - 0.5 maps the resized grid back onto the original one
    kp[:, 0] = (kp[:, 0] + 0.5) / sx - 0.5
    kp[:, 1] = (kp[:, 1] + 0.5) / sy - 0.5
    kp[:, 2] /= float(np.sqrt(sx * sy))
    raw = np.clip(np.rint(desc), 0, 255).astype(np.uint8)
    return kp, raw


def extract_features(
    image: NDArray[np.uint8],
    config: SiftConfig = SiftConfig(),
    *,
    offset: tuple[float, float] = (0.0, 0.0),
    image_size: tuple[int, int] | None = None,
) -> LocalFeatures:
    """SIFT / RootSIFT features of one image (or of a query crop).

    Args:
        image: ``H x W x 3`` uint8 RGB, the whole image or a query crop.
        config: extraction settings.
        offset: ``(left, top)`` of ``image`` inside the original image; added to the keypoints
            (a query crop's offset in the full query image).
        image_size: ``(width, height)`` of the original image; defaults to ``image``'s own size.

    Returns:
        :class:`LocalFeatures` in the original image's pixel coordinates.
    """
    kp, raw = extract_raw_sift(image, config)
    kp[:, 0] += offset[0]
    kp[:, 1] += offset[1]
    if image_size is None:
        image_size = (int(image.shape[1]), int(image.shape[0]))
    return LocalFeatures(kp, finish_descriptors(raw, config.descriptor), image_size)
