"""What a loaded benchmark is: ground truth plus the images it refers to.

:class:`Benchmark` is what :func:`oxbench.datasets.load` returns for every dataset id, real or
synthetic. Images are reached through :class:`ImageSource` objects so that database images on disk
and distractors generated on demand (the synthetic stream) look the same to a pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.groundtruth import BBox, GroundTruth

CropConvention = Literal["python", "matlab"]


@runtime_checkable
class ImageSource(Protocol):
    """An indexed, named collection of images.

    ``read(i)`` returns an ``H x W x 3`` ``uint8`` RGB array; ``path(i)`` the file, or ``None`` for
    images generated on demand.
    """

    def __len__(self) -> int: ...

    def name(self, i: int) -> str: ...

    def path(self, i: int) -> Path | None: ...

    def read(self, i: int) -> NDArray[np.uint8]: ...


def read_image(path: str | Path, *, exif_transpose: bool = False) -> NDArray[np.uint8]:
    """Decode an image file to ``H x W x 3`` uint8 RGB with Pillow.

    EXIF orientation is *not* applied by default: the benchmarks' boxes and the official pipelines
    use the stored pixel orientation. Pass ``exif_transpose=True`` to apply it explicitly.

    Images over the pixel budget (:func:`oxbench.imaging.max_pixels`, ``$OXBENCH_MAX_PIXELS``) are
    refused before they are decoded.

    Raises:
        InputError: missing, undecodable or over-budget file (names the file).
    """
    from oxbench.imaging import open_image

    ops = require("PIL.ImageOps", "images")
    path = Path(path)
    try:
        with open_image(path) as im:
            im.load()
            if exif_transpose:
                im = ops.exif_transpose(im)
            return np.asarray(im.convert("RGB"))
    except (OSError, SyntaxError, ValueError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(
            f"cannot decode image ({' '.join(str(exc).split())[:200]})", path
        ) from None


@dataclass(frozen=True, eq=False)
class FileImages:
    """Images stored as files: ``names[i]`` lives at ``paths[i]``."""

    names: tuple[str, ...]
    paths: tuple[Path, ...]
    exif_transpose: bool = False

    def __post_init__(self) -> None:
        if len(self.names) != len(self.paths):
            raise ValueError("names and paths differ in length")

    def __len__(self) -> int:
        return len(self.names)

    def name(self, i: int) -> str:
        return self.names[i]

    def path(self, i: int) -> Path | None:
        return self.paths[i]

    def read(self, i: int) -> NDArray[np.uint8]:
        return read_image(self.paths[i], exif_transpose=self.exif_transpose)


@dataclass(frozen=True)
class UnreadImages:
    """Images known by name only: loaded for a run that reads no pixels (its descriptors come from
    the user's files), so their files need not be on disk. Reading one is an error."""

    names: tuple[str, ...]
    dataset: str = ""

    def __len__(self) -> int:
        return len(self.names)

    def name(self, i: int) -> str:
        return self.names[i]

    def path(self, i: int) -> Path | None:
        return None

    def read(self, i: int) -> NDArray[np.uint8]:
        raise InputError(
            f"image {self.names[i]} of {self.dataset} was not loaded: this run was set up to read no pixels"
        )


def _round_half_away(x: float) -> int:
    return int(math.floor(abs(x) + 0.5)) * (1 if x >= 0 else -1)


def crop_box(
    bbox: BBox, width: int, height: int, convention: CropConvention = "python"
) -> tuple[int, int, int, int]:
    """Integer pixel box ``(left, top, right, bottom)``, right/bottom exclusive, for a query bbox.

    Two official conventions exist for turning the float ``bbx`` into pixels:

    - ``"python"`` (revisitop's Python code, the default): Pillow's ``Image.crop(bbx)``, i.e. each
      coordinate rounded with Python's ``round`` (half to even), right/bottom edges exclusive;
    - ``"matlab"`` (revisitop's MATLAB ``crop_qim``): ``im(round(y1+1):round(y2+1), round(x1+1):round(x2+1))``,
      MATLAB rounding (half away from zero), 1-based inclusive edges -- one pixel wider and taller.

    The box is clipped to the image.

    Example:
        >>> crop_box((10.4, 20.5, 50.6, 60.5), 640, 480)  # round half to even: 20.5 -> 20
        (10, 20, 51, 60)
        >>> crop_box((10.4, 20.5, 50.6, 60.5), 640, 480, "matlab")
        (10, 21, 52, 62)
    """
    x1, y1, x2, y2 = bbox
    if convention == "python":
        box = (round(x1), round(y1), round(x2), round(y2))
    elif convention == "matlab":
        box = (
            _round_half_away(x1 + 1) - 1,
            _round_half_away(y1 + 1) - 1,
            _round_half_away(x2 + 1),
            _round_half_away(y2 + 1),
        )
    else:
        raise ValueError(f"unknown crop convention {convention!r}; use 'python' or 'matlab'")
    left, top = max(0, box[0]), max(0, box[1])
    right, bottom = min(width, box[2]), min(height, box[3])
    if right <= left or bottom <= top:
        raise InputError(f"query box {bbox} is empty inside a {width}x{height} image")
    return left, top, right, bottom


@dataclass(frozen=True, eq=False)
class Benchmark:
    """A loaded benchmark: ground truth, database images, query images, options.

    Attributes:
        id: dataset id (``roxford5k``, ``synthetic``, ...).
        gt: the ground truth; ``gt.db_names[i]`` is ``database.name(i)``.
        database: the database images, in ground-truth order.
        queries: the full query images, one per ``gt.queries`` entry (crop with :meth:`query_crop`).
        protocols: the scoring protocols that apply (``("revisited",)``, ``("original",)``, ...).
        root: the folder the data was loaded from (``None`` for in-memory data).
        distractors: extra database images appended after the database (R1M), or ``None``;
            distractor ``j`` has ranking index ``gt.n_db + j``, as in ``oxbench evaluate --distractors``.
        crop: which query-crop convention :meth:`query_crop` uses (recorded in results).
        options: other choices that change results (e.g. Holidays ``orientation``), recorded in runs.
    """

    id: str
    gt: GroundTruth
    database: ImageSource
    queries: ImageSource
    protocols: tuple[str, ...]
    root: Path | None = None
    distractors: ImageSource | None = None
    crop: CropConvention = "python"
    options: Mapping[str, str] = field(default_factory=dict)

    @property
    def n_distractors(self) -> int:
        return 0 if self.distractors is None else len(self.distractors)

    @property
    def n_index(self) -> int:
        """Database plus distractors: the size of the index a ranking refers to."""
        return self.gt.n_db + self.n_distractors

    def query_crop(self, i: int) -> NDArray[np.uint8]:
        """The query region of query ``i`` (the whole image when it has no box)."""
        return self.query_crop_and_size(i)[0]

    def query_crop_and_size(self, i: int) -> tuple[NDArray[np.uint8], tuple[int, int]]:
        """The query region of query ``i`` and the ``(height, width)`` of the image it was cut from."""
        image = self.queries.read(i)
        h, w = image.shape[:2]
        bbox = self.gt.queries[i].bbox
        if bbox is None:
            return image, (h, w)
        left, top, right, bottom = crop_box(bbox, w, h, self.crop)
        return image[top:bottom, left:right], (h, w)

    def describe(self) -> dict[str, object]:
        """What identifies this benchmark in a run record."""
        return {
            "id": self.id,
            "root": None if self.root is None else str(self.root),
            "n_db": self.gt.n_db,
            "n_queries": self.gt.n_queries,
            "n_distractors": self.n_distractors,
            "protocols": list(self.protocols),
            "crop": self.crop,
            **{f"option.{k}": v for k, v in self.options.items()},
        }
