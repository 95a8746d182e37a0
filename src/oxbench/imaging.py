"""Opening image files under a pixel budget: the one place oxbench decodes an image file.

Every image oxbench reads (dataset images for features and descriptors, the viewer's thumbnails,
``oxbench data verify``) is opened with :func:`open_image`, which reads only the header first and
refuses an image of more than :func:`max_pixels` pixels by name, in one line, before any pixel is
decoded: a 30000 x 30000 PNG of a few hundred kilobytes is refused, not a ``DecompressionBombError``
traceback or gigabytes of memory. The budget is the ``OXBENCH_MAX_PIXELS`` environment variable
(default :data:`DEFAULT_MAX_PIXELS`, generous for real photos), validated like any setting.

Pillow has its own, lower, limit (``PIL.Image.MAX_IMAGE_PIXELS``): a warning above it and an error at
twice it. oxbench does not change that process-wide setting; its own check comes first, Pillow's
warning is left to the CLI (which shows warnings as one ``oxbench`` line), and Pillow's error is
turned into the same one-line refusal.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from oxbench.errors import InputError, require
from oxbench.schema import Int

#: Environment variable holding the pixel budget (width x height) of one image.
MAX_PIXELS_ENV = "OXBENCH_MAX_PIXELS"
#: Default pixel budget: 100 megapixels (a 12,000 x 8,000 photo).
DEFAULT_MAX_PIXELS = 100_000_000
_BUDGET = Int(lo=1, hi=10**12)
_PIL_PIXELS = re.compile(r"\((\d+) pixels\)")


def max_pixels(value: int | str | None = None) -> int:
    """The pixel budget: ``value`` when given, else ``$OXBENCH_MAX_PIXELS``, else the default.

    Raises:
        InputError: the value is not a whole number in ``[1, 10**12]`` (names the variable).
    """
    if value is None:
        value = os.environ.get(MAX_PIXELS_ENV)
        if value is None or value.strip() == "":
            return DEFAULT_MAX_PIXELS
    return int(_BUDGET.coerce(MAX_PIXELS_ENV, value, what="environment variable"))


def over_budget_message(width: int, height: int, budget: int) -> str:
    """The one-line refusal of a ``width x height`` image over ``budget`` pixels."""
    return (
        f"image is {width:,} x {height:,} = {width * height / 1e6:,.1f} megapixels, over the budget of "
        f"{budget / 1e6:,.1f} (set {MAX_PIXELS_ENV} to allow larger images)"
    )


@contextlib.contextmanager
def open_image(path: str | Path, *, budget: int | None = None) -> Iterator[Any]:
    """A Pillow image of ``path`` whose size is within the pixel budget (header read, not decoded).

    Raises:
        InputError: missing, not a regular file, not an image, or over the budget (names the file).
    """
    image_mod = require("PIL.Image", "images")
    limit = max_pixels() if budget is None else budget
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("image file not found", path) from None
    except OSError as exc:
        raise InputError(f"cannot read image ({exc.strerror or exc})", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a folder, FIFO or device); expected an image", path)
    try:
        im = image_mod.open(path)
    except (
        image_mod.DecompressionBombError
    ) as exc:  # over Pillow's own limit, which oxbench leaves alone
        found = _PIL_PIXELS.search(str(exc))
        n = int(found.group(1)) if found else limit + 1
        if n > limit:
            raise InputError(
                f"image is {n / 1e6:,.1f} megapixels, over the budget of {limit / 1e6:,.1f} "
                f"(set {MAX_PIXELS_ENV} to allow larger images)",
                path,
            ) from None
        raise InputError(
            f"image is {n / 1e6:,.1f} megapixels, more than Pillow opens "
            "(PIL.Image.MAX_IMAGE_PIXELS)",
            path,
        ) from None
    except FileNotFoundError:
        raise InputError("image file not found", path) from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise InputError(
            f"cannot decode image ({' '.join(str(exc).split())[:200]})", path
        ) from None
    try:
        w, h = im.size
        if w * h > limit:
            raise InputError(over_budget_message(w, h, limit), path)
        yield im
    finally:
        im.close()
