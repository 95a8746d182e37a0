"""What the families of datasets kept as files share: the layout rules, the checks and their errors.

A family of a fetched or imported dataset (every built-in one but the synthetic city) subclasses
:class:`OnDisk`: it declares its files, reads its ground truth and builds its
:class:`~oxbench.datasets.base.Benchmark` from images laid out as ``<root>/<id>/jpg/<name>.jpg``,
with the helpers here (the remedy every missing-file error names, count checks, image sets). A
family of one's own (see docs/datasets.md, "A benchmark of your own") uses the same.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import numpy as np

from oxbench.datasets.base import Benchmark, CropConvention, FileImages
from oxbench.datasets.spec import DatasetFamily, DatasetSpec
from oxbench.errors import InputError, require
from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

IMAGE_EXT = ".jpg"
IMAGE_DIR = "jpg"


def remedy(spec: DatasetSpec, root: Path) -> str:
    """How to get ``spec`` into the data root ``root`` (one clause for an error message)."""
    if spec.synthetic:
        return (
            f"make it with `oxbench data synth --name {spec.id} --root {root}` "
            "(or `oxbench run`, which builds it on first use)"
        )
    how = f"`oxbench data fetch {spec.id} --root {root}`" if spec.files else ""
    imp = f"`oxbench data import {spec.id} --root {root} --from PATH`"
    return f"get it with {how} or {imp}" if how else f"get it with {imp}"


def require_dir(spec: DatasetSpec, ddir: Path) -> None:
    """Refuse a dataset folder that does not exist (with the remedy)."""
    if not ddir.is_dir():
        raise InputError(f"dataset {spec.id} is not on disk; {remedy(spec, ddir.parent)}", ddir)


def require_file(spec: DatasetSpec, ddir: Path, rel: str, what: str) -> Path:
    require_dir(spec, ddir)
    path = ddir / rel
    if not path.is_file():
        raise InputError(f"{what} of {spec.id} is missing; {remedy(spec, ddir.parent)}", path)
    return path


def image_files(names: Sequence[str], folder: str = IMAGE_DIR) -> tuple[str, ...]:
    return tuple(f"{folder}/{n}{IMAGE_EXT}" for n in names)


def file_images(
    spec: DatasetSpec,
    ddir: Path,
    names: Sequence[str],
    folder: str = IMAGE_DIR,
    *,
    check: bool = True,
) -> FileImages:
    """``<ddir>/<folder>/<name>.jpg`` per name (each present, with ``check``)."""
    return images_at(spec, ddir, names, image_files(names, folder), check=check, where=folder)


def images_at(
    spec: DatasetSpec,
    ddir: Path,
    names: Sequence[str],
    files: Sequence[str],
    *,
    check: bool = True,
    where: str | None = None,
) -> FileImages:
    """The images ``files`` (relative to ``ddir``) under ``names``; with ``check``, a missing one
    is one line with the remedy, naming the folder ``where`` (default: the missing image's)."""
    paths = tuple(ddir / f for f in files)
    if check:
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise InputError(
                f"{len(missing)} of {len(paths)} image(s) of {spec.id} are missing (first: "
                f"{missing[0].name}); {remedy(spec, ddir.parent)}",
                missing[0].parent if where is None else ddir / where,
            )
    return FileImages(tuple(names), paths)


def check_count(
    spec: DatasetSpec, what: str, found: int, expected: int, strict: bool, where: Path
) -> None:
    if found != expected:
        msg = f"{spec.id} has {found} {what}, expected {expected} ({spec.counts_note})"
        if strict:
            raise InputError(
                f"{msg}; run `oxbench data verify {spec.id}` to see what is off", where
            )
        log.warning("%s: %s", where, msg)


def jpg_stems(img_dir: Path) -> list[str]:
    """Sorted names (without ``.jpg``) of the images directly in ``img_dir`` (none if absent)."""
    if not img_dir.is_dir():
        return []
    return sorted(
        e.name[: -len(IMAGE_EXT)] for e in os.scandir(img_dir) if e.name.endswith(IMAGE_EXT)
    )


def names_test(
    names: frozenset[str] | None, pattern: re.Pattern[str] | None
) -> Callable[[str], bool]:
    """``image_test`` from a set of image names (preferred) or a name pattern (else all taken)."""

    def test(rel: str) -> bool:
        if not rel.endswith(IMAGE_EXT) or not rel.startswith(f"{IMAGE_DIR}/"):
            return True  # ground truth, lists: checked against the lock file, not by name
        stem = rel[len(IMAGE_DIR) + 1 : -len(IMAGE_EXT)]
        if names is not None:
            return stem in names
        return pattern is None or pattern.fullmatch(stem) is not None

    return test


def write_tiny_jpegs(folder: Path, names: Sequence[str], size: tuple[int, int] = (48, 36)) -> None:
    """Small distinct JPEG images ``folder/<name>.jpg`` (for example copies; needs Pillow)."""
    image = require("PIL.Image", "images")
    for i, name in enumerate(names):
        path = folder / f"{name}{IMAGE_EXT}"
        path.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(i)
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        image.fromarray(pixels).save(path, quality=90)


class OnDisk(DatasetFamily):
    """A family whose files are fetched or imported: ``load`` builds ``_benchmark`` (a distractor
    set, asked for, is attached by :func:`oxbench.datasets.load`)."""

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return ()

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        return spec.n_images

    #: Whether ``load`` checks that every database image exists (not where the database is the
    #: listing of ``jpg/`` itself).
    check_database: ClassVar[bool] = True

    def image_layout(
        self, spec: DatasetSpec, gt: GroundTruth
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The database and query image files, relative to the dataset folder
        (default ``jpg/<name>.jpg``)."""
        return image_files(gt.db_names), image_files(gt.query_names)

    def _benchmark(
        self,
        spec: DatasetSpec,
        ddir: Path,
        *,
        crop: CropConvention,
        strict: bool,
        options: Mapping[str, str],
    ) -> Benchmark:
        """The ground truth plus its images (:meth:`image_layout`)."""
        gt = self.ground_truth(spec, ddir, strict=strict)
        db_files, query_files = self.image_layout(spec, gt)
        return Benchmark(
            id=spec.id,
            gt=gt,
            database=images_at(spec, ddir, gt.db_names, db_files, check=self.check_database),
            queries=images_at(spec, ddir, gt.query_names, query_files),
            protocols=spec.protocols,
            root=ddir,
            crop=crop,
        )

    def load(
        self,
        spec: DatasetSpec,
        ddir: Path,
        *,
        distractors: str | int | None,
        crop: CropConvention,
        strict: bool,
        options: Mapping[str, str],
        progress: bool,
    ) -> Benchmark:
        """The benchmark; a distractor set is attached by :func:`oxbench.datasets.load`."""
        require_dir(spec, ddir)
        bench = self._benchmark(spec, ddir, crop=crop, strict=strict, options=options)
        if strict:
            return bench
        return replace(bench, options={**bench.options, "strict": "false"})
