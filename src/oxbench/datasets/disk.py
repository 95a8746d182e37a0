"""What is on disk: where each dataset lives under the data root, whether it is there, its size.

``dataset_status(id, root)`` looks, it does not check: it counts the image files in ``jpg/`` and
the bytes below the dataset folder, and asks the family which other files an installed copy has.
``verify`` is the check (decoding, ground truth, checksums).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from oxbench.datasets.catalog import get_spec
from oxbench.datasets.ondisk import IMAGE_DIR, IMAGE_EXT
from oxbench.datasets.paths import data_root

DiskState = Literal["installed", "incomplete", "absent"]


@dataclass(frozen=True)
class DiskStatus:
    """One dataset folder as found on disk.

    Attributes:
        dataset: the id.
        path: the dataset folder (``<root>/<id>``), present or not.
        state: ``"installed"`` (the files the family needs and at least as many images as a
            complete copy has), ``"incomplete"`` (the folder exists, something is short) or
            ``"absent"`` (no folder).
        image_files: ``.jpg`` files found below ``jpg/``.
        expected_image_files: how many a complete copy has.
        size_bytes: bytes of the files below the folder (a file hard-linked twice counted once).
        missing: the family's required files (ground truth, lists) that are not there.
    """

    dataset: str
    path: Path
    state: DiskState
    image_files: int
    expected_image_files: int
    size_bytes: int
    missing: tuple[str, ...] = ()


def disk_usage(folder: Path) -> tuple[int, int]:
    """``(bytes, .jpg files below folder/jpg)`` of the regular files below ``folder``.

    Links are not followed; a file with several hard links below ``folder`` counts once.
    """
    seen: set[tuple[int, int]] = set()
    size = images = 0
    image_dir = os.path.join(folder, IMAGE_DIR)
    stack = [os.fspath(folder)]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        in_images = current == image_dir or current.startswith(image_dir + os.sep)
        for e in entries:
            try:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        size += st.st_size
                    images += in_images and e.name.endswith(IMAGE_EXT)
            except OSError:
                continue
    return size, images


def dataset_status(dataset_id: str, root: str | Path | None = None) -> DiskStatus:
    """Where ``dataset_id`` lives under the data root, and what is there (see :class:`DiskStatus`).

    Raises:
        InputError: unknown id.
    """
    spec = get_spec(dataset_id)
    ddir = data_root(root) / spec.id
    expected = spec.family.expected_image_files(spec, ddir)
    if not ddir.is_dir():
        return DiskStatus(spec.id, ddir, "absent", 0, expected, 0, spec.family.required_files(spec))
    size, images = disk_usage(ddir)
    missing = tuple(f for f in spec.family.required_files(spec) if not (ddir / f).exists())
    complete = not missing and images >= expected
    return DiskStatus(
        spec.id, ddir, "installed" if complete else "incomplete", images, expected, size, missing
    )
