"""INRIA Holidays (Jegou et al., ECCV 2008): ``holidays_images.dat`` plus ``jpg/`` and, optionally,
``jpg_rotated/`` (the same file names turned upright by hand; option ``orientation="rotated"``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from oxbench.datasets.base import Benchmark, CropConvention
from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import (
    IMAGE_DIR,
    IMAGE_EXT,
    OnDisk,
    check_count,
    file_images,
    image_files,
    jpg_stems,
    names_test,
    require_file,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, RemoteFile, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

_MB = 1_000_000

_HOLIDAYS_LIST = "holidays_images.dat"
_HOLIDAYS_FOLDERS = {"original": IMAGE_DIR, "rotated": "jpg_rotated"}


@dataclass(frozen=True)
class Holidays(OnDisk):
    """INRIA Holidays: ``holidays_images.dat`` plus ``jpg/`` and, optionally, ``jpg_rotated/``
    (the same file names turned upright by hand; option ``orientation="rotated"``)."""

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (Placement(_HOLIDAYS_LIST, "."), Placement(f"*{IMAGE_EXT}", IMAGE_DIR))

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return (_HOLIDAYS_LIST,)

    def _read(self, spec: DatasetSpec, ddir: Path) -> GroundTruth:
        from oxbench.formats.holidays import holidays_ground_truth, read_image_list

        lst = require_file(spec, ddir, _HOLIDAYS_LIST, "the image list")
        return holidays_ground_truth(read_image_list(lst), source=str(lst))

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        gt = self._read(spec, ddir)
        check_count(spec, "images", gt.n_db, spec.n_images, strict, ddir)
        check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
        return gt

    def _benchmark(
        self,
        spec: DatasetSpec,
        ddir: Path,
        *,
        crop: CropConvention,
        strict: bool,
        options: Mapping[str, str],
    ) -> Benchmark:
        orientation = str(options.get("orientation", "original"))
        folder = _HOLIDAYS_FOLDERS[orientation]
        gt = self.ground_truth(spec, ddir, strict=strict)
        if orientation == "rotated" and not (ddir / folder).is_dir():
            raise InputError(
                "orientation='rotated' needs the hand-rotated copy of the images in jpg_rotated/ "
                "(same 1,491 file names, turned upright); put it there or use orientation='original'",
                ddir / folder,
            )
        images = file_images(spec, ddir, gt.db_names, folder)
        queries = file_images(spec, ddir, gt.query_names, folder, check=False)
        return Benchmark(
            id=spec.id,
            gt=gt,
            database=images,
            queries=queries,
            protocols=spec.protocols,
            root=ddir,
            crop=crop,
            options={"orientation": orientation},
        )

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            gt = self._read(spec, ddir)
        except InputError as exc:
            return VerifyPlan(image_files(jpg_stems(ddir / IMAGE_DIR)), ground_truth=(str(exc),))
        images = image_files(gt.db_names)
        counts = [
            CountCheck("images", spec.n_images, images, listed=gt.n_db),
            CountCheck(
                "query images", spec.n_queries, image_files(gt.query_names), listed=gt.n_queries
            ),
        ]
        rotated = _HOLIDAYS_FOLDERS["rotated"]
        if (ddir / rotated).is_dir():  # the hand-rotated copy must hold the same images
            rot = image_files(gt.db_names, rotated)
            counts.append(CountCheck("rotated images", spec.n_images, rot, listed=gt.n_db))
            images += rot
        return VerifyPlan(images, counts=tuple(counts))

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        names = None
        if (ddir / _HOLIDAYS_LIST).is_file():
            try:
                names = frozenset(self._read(spec, ddir).db_names)
            except InputError:
                names = None
        return names_test(names, re.compile(r"\d{6}"))

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Three groups of 2 or 3 images (the first of each its query)."""
        names = ["100000", "100001", "100002", "100100", "100101", "100200", "100201"]
        ddir.mkdir(parents=True, exist_ok=True)
        (ddir / _HOLIDAYS_LIST).write_text("".join(f"{n}{IMAGE_EXT}\n" for n in names))
        write_tiny_jpegs(ddir / IMAGE_DIR, names)


register(DatasetSpec(
    id="holidays",
    title="INRIA Holidays",
    homepage="https://lear.inrialpes.fr/people/jegou/data.php#holidays",
    description=(
        "1,491 personal holiday photos in 500 groups; the first image of each group (number "
        "divisible by 100) is its query. Some images are stored rotated by 90 degrees: choose "
        "orientation='original' (the files as published) or 'rotated' (a hand-rotated copy in "
        "jpg_rotated/, same names); the choice is recorded with the results."
    ),
    n_images=1491,
    n_queries=500,
    counts_note="each query image is also in the database, where it is ignored (junk)",
    protocols=("holidays",),
    files=(
        RemoteFile(
            name="jpg1.tar.gz",
            urls=("ftp://ftp.inrialpes.fr/pub/lear/douze/data/jpg1.tar.gz",),
            approx_size=1_100 * _MB,
            archive=True,
            placements=(Placement("*.jpg", "jpg"),),
        ),
        RemoteFile(
            name="jpg2.tar.gz",
            urls=("ftp://ftp.inrialpes.fr/pub/lear/douze/data/jpg2.tar.gz",),
            approx_size=1_500 * _MB,
            archive=True,
            placements=(Placement("*.jpg", "jpg"),),
        ),
        RemoteFile(
            name="eval_holidays.tgz",
            urls=("https://lear.inrialpes.fr/people/jegou/code/eval_holidays.tgz",),
            approx_size=50_000,
            archive=True,
            placements=(Placement("holidays_images.dat", "."),),
        ),
    ),
    terms=(
        "The INRIA Holidays images are copyright INRIA (Jegou, Douze and Schmid, ECCV 2008) and "
        "are provided for research purposes; cite the paper. oxbench downloads them from INRIA "
        "on your request and ships none of them."
    ),
    family=Holidays(),
    options={"orientation": ("original", "rotated")},
    citation="H. Jegou, M. Douze, C. Schmid, Hamming embedding and weak geometric consistency, ECCV 2008",
))  # fmt: skip
