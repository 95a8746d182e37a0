"""Images to deep global descriptors: resize, normalise, batch by size, multi-scale, L2.

The conventions of the published GeM models (cirtorch's ``extract_vectors`` / ``extract_ms``):

- each image is shrunk so its longer side is at most ``max_side`` (Pillow's ``thumbnail`` with
  Lanczos filtering; smaller images are not enlarged);
- a query crop, by default (``query_resize="full-image"``), is shrunk by the factor of its *full*
  image, as cirtorch's ``ImagesFromList`` does with boxes: to a longer side of at most
  ``floor(max_side * max(crop) / max(full))`` (:func:`query_crop_side`), so the crop keeps the scale
  it has in the resized database image; ``query_resize="crop"`` shrinks the crop itself to
  ``max_side``. The two agree whenever the full image is within ``max_side``;
- RGB in ``0..1``, normalised with the network's mean / std;
- at every scale ``s`` (default ``1, 1/sqrt(2), 1/2``) the normalised tensor is resized bilinearly
  (``align_corners=False``) by ``s`` and described (an L2-normalised vector); the scales are combined
  by the power mean ``(mean_s v_s ** q) ** (1 / q)`` with ``q`` the network's
  :attr:`~oxbench.features.deep.model.RetrievalNet.multiscale_power` (GeM's ``p``), then
  L2-normalised.

Batching: images are grouped by their resized shape and each group goes through the network in
batches of up to ``batch_size`` images per forward pass, at each scale. Grouping by equal shape was
chosen over padding + masking because a zero-padded border changes the convolution outputs next to
it (and every later layer's receptive field), so a padded image would not get the descriptor it
gets alone; equal-shape batches give the same descriptors as the one-image loop (up to float
summation order). Collections from one camera (Oxford / Paris 1024x768 in two orientations, the
synthetic sets) fall into few groups; query crops are mostly alone in theirs.

Precision: ``bf16`` runs the trunk under ``torch.autocast`` (CPU or GPU); pooling, normalisation and
the scale combination stay in float32. Device: ``auto`` picks CUDA when torch sees a GPU.
Out of GPU memory, the batch is halved (with a warning) until it fits; a single image that does not
fit is an error naming it.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require

if TYPE_CHECKING:  # pragma: no cover
    import torch
else:
    torch = require("torch", "deep")
F = torch.nn.functional

log = logging.getLogger(__name__)

#: The published multi-scale setting (cirtorch ``--multiscale '[1, 1/2**(1/2), 1/2]'``).
DEFAULT_SCALES = (1.0, 2.0**-0.5, 0.5)


@dataclass(frozen=True)
class ExtractOptions:
    """How images become descriptors (everything but the network).

    Attributes:
        max_side: longer image side after resizing (px; images are never enlarged).
        scales: resize factors of the multi-scale descriptor (``(1.0,)``: single scale).
        precision: ``fp32`` or ``bf16`` (autocast of the trunk).
        batch_size: images per forward pass (within a group of equal-size images).
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:<n>``.
        decode_threads: threads decoding and resizing images (the network runs in this process).
    """

    max_side: int = 1024
    scales: tuple[float, ...] = DEFAULT_SCALES
    precision: Literal["fp32", "bf16"] = "fp32"
    batch_size: int = 8
    device: str = "auto"
    decode_threads: int = 1

    def __post_init__(self) -> None:
        if self.max_side < 16:
            raise InputError(f"max_side must be >= 16 px, got {self.max_side}")
        if not self.scales or not all(
            isinstance(s, int | float) and 0 < s <= 4 and math.isfinite(s) for s in self.scales
        ):
            raise InputError(f"scales must be numbers in (0, 4], got {self.scales!r}")
        if self.precision not in ("fp32", "bf16"):
            raise InputError(f"precision must be fp32 or bf16, got {self.precision!r}")
        if self.batch_size < 1:
            raise InputError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.decode_threads < 1:
            raise InputError(f"decode_threads must be >= 1, got {self.decode_threads}")


def select_device(name: str = "auto") -> Any:
    """``torch.device`` for a device setting (``auto``: CUDA when torch sees a GPU, else CPU)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from oxbench.schema import DEVICE

    if (
        name != "auto"
        and DEVICE.pattern is not None
        and re.fullmatch(DEVICE.pattern, name, re.ASCII)
    ):
        if name.startswith("cuda") and not torch.cuda.is_available():
            raise InputError(
                f"device {name!r} asked for, but torch sees no GPU; use device=auto or cpu"
            )
        return torch.device(name)
    raise InputError(f"unknown device {name!r}; use auto, cpu, cuda or cuda:<n>")


def resize_max_side(image: NDArray[np.uint8], max_side: int) -> NDArray[np.uint8]:
    """Shrink ``H x W x 3`` so its longer side is at most ``max_side`` (Pillow thumbnail, Lanczos)."""
    if max(image.shape[:2]) <= max_side:
        return image
    pil = require("PIL.Image", "images")
    im = pil.fromarray(image)
    im.thumbnail((max_side, max_side), pil.Resampling.LANCZOS)
    return np.asarray(im)


def query_crop_side(crop_hw: tuple[int, ...], full_hw: tuple[int, ...], max_side: int) -> int:
    """Longest side a query crop may keep when its *full* image is shrunk to ``max_side``.

    ``floor(max_side * max(crop) / max(full))`` (at least 1): cirtorch's box resizing
    (``imresize(crop, imsize * max(crop.size) / max(full.size))``, whose Pillow ``thumbnail`` floors
    the size). A full image within ``max_side`` gives a side at least the crop's own (no resize).

    Example:
        >>> query_crop_side((300, 700), (1500, 2000), 1024)
        358
    """
    crop_max, full_max = max(crop_hw[:2]), max(full_hw[:2])
    if crop_max < 1 or full_max < crop_max:
        raise InputError(
            f"a query crop of {crop_hw[:2]} px does not fit in its image of {full_hw[:2]} px"
        )
    return max(1, math.floor(max_side * crop_max / full_max))


def resize_query_crop(
    crop: NDArray[np.uint8], full_hw: tuple[int, ...], max_side: int
) -> NDArray[np.uint8]:
    """A query crop shrunk by its full image's factor (see :func:`query_crop_side`)."""
    return resize_max_side(crop, query_crop_side(crop.shape, full_hw, max_side))


class Extractor:
    """Describes images with a :class:`~oxbench.features.deep.model.RetrievalNet`.

    Args:
        net: the network (moved to the device, eval mode).
        options: resizing, scales, precision, batch size, device.
    """

    def __init__(self, net: Any, options: ExtractOptions) -> None:
        self.options = options
        self.device = select_device(options.device)
        self.net = net.to(self.device).eval()
        self.batch_size = options.batch_size
        self.power = float(net.multiscale_power)
        self._mean = torch.tensor(net.mean, dtype=torch.float32, device=self.device).view(
            1, 3, 1, 1
        )
        self._std = torch.tensor(net.std, dtype=torch.float32, device=self.device).view(1, 3, 1, 1)

    @property
    def dim(self) -> int:
        return int(self.net.dim)

    def to_tensor(self, images: Sequence[NDArray[np.uint8]]) -> Any:
        """``[B, 3, H, W]`` normalised float32 on the device, from equal-size ``H x W x 3`` uint8."""
        x = (
            torch.from_numpy(np.stack(images))
            .to(self.device)
            .permute(0, 3, 1, 2)
            .float()
            .div_(255.0)
        )
        return (x - self._mean) / self._std

    def multiscale(self, x: Any) -> Any:
        """Descriptors ``[B, D]`` (float32, L2) of a normalised batch: power mean over the scales."""
        use_bf16 = self.options.precision == "bf16"
        acc = None
        with (
            torch.inference_mode(),
            torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=use_bf16),
        ):
            for s in self.options.scales:
                xs = (
                    x
                    if s == 1
                    else F.interpolate(x, scale_factor=s, mode="bilinear", align_corners=False)
                )
                v = self.net(xs).float()
                v = v if self.power == 1 else v.clamp(min=0).pow(self.power)
                acc = v if acc is None else acc + v
            assert acc is not None
            acc = acc / len(self.options.scales)
            if self.power != 1:
                acc = acc.pow(1.0 / self.power)
            return F.normalize(acc, dim=-1)

    def describe(
        self, images: Sequence[NDArray[np.uint8]], names: Sequence[str] | None = None
    ) -> NDArray[np.float32]:
        """Descriptors ``float32 [n, D]`` of images already resized (see :func:`resize_max_side`).

        Images of equal shape share forward passes (``batch_size`` at a time). Out of GPU memory,
        the batch size is halved until it fits (kept for the rest of the run).

        Raises:
            InputError: one image alone does not fit in GPU memory, or an image is not ``H x W x 3``.
        """
        out = np.zeros((len(images), self.dim), np.float32)
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, im in enumerate(images):
            if im.ndim != 3 or im.shape[2] != 3 or im.dtype != np.uint8:
                raise InputError(
                    f"image {names[i] if names else i}: expected H x W x 3 uint8, got {im.shape} {im.dtype}"
                )
            groups.setdefault(tuple(im.shape), []).append(i)
        for shape, members in groups.items():
            s = 0
            while s < len(members):
                chunk = members[s : s + self.batch_size]
                try:
                    v = self.multiscale(self.to_tensor([images[i] for i in chunk]))
                except torch.cuda.OutOfMemoryError:
                    if self.device.type == "cuda":
                        torch.cuda.empty_cache()
                    if len(chunk) == 1:
                        name = names[chunk[0]] if names else str(chunk[0])
                        raise InputError(
                            f"out of GPU memory describing image {name} ({shape[1]}x{shape[0]} px) alone; "
                            "lower max_side or use device=cpu"
                        ) from None
                    self.batch_size = max(1, len(chunk) // 2)
                    log.warning(
                        "out of GPU memory with %d images of %dx%d per batch; retrying with %d",
                        len(chunk),
                        shape[1],
                        shape[0],
                        self.batch_size,
                    )
                    continue
                out[chunk] = v.cpu().numpy()
                s += len(chunk)
        return out

    def describe_sources(
        self,
        read: Callable[[int], NDArray[np.uint8]],
        positions: Sequence[int],
        names: Sequence[str],
        *,
        allow_undecodable: bool = False,
    ) -> tuple[list[int], NDArray[np.float32]]:
        """Read, resize and describe the images at ``positions``.

        Args:
            read: image ``i`` as ``H x W x 3`` uint8 (raises :class:`InputError` when undecodable).
            positions: which images.
            names: image names by position (for messages).
            allow_undecodable: skip images that fail to decode (each named in a warning) instead of
                stopping at the first.

        Returns:
            ``(described positions, float32 [len(described), D])``.
        """

        def load(i: int) -> NDArray[np.uint8] | InputError:
            try:
                return resize_max_side(read(i), self.options.max_side)
            except InputError as exc:
                return exc

        if self.options.decode_threads > 1 and len(positions) > 1:
            with ThreadPoolExecutor(self.options.decode_threads) as pool:
                loaded = list(pool.map(load, positions))
        else:
            loaded = [load(i) for i in positions]
        done: list[int] = []
        images: list[NDArray[np.uint8]] = []
        for i, item in zip(positions, loaded, strict=True):
            if isinstance(item, InputError):
                if not allow_undecodable:
                    raise InputError(
                        f"image {names[i]}: {item} (allow partial sets to skip it)"
                    ) from None
                log.warning(
                    "image %s cannot be decoded (%s); skipped: its descriptor is zero",
                    names[i],
                    item,
                )
                continue
            done.append(i)
            images.append(item)
        return done, self.describe(images, [names[i] for i in done])
