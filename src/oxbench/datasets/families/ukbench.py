"""UKBench (Nister and Stewenius, CVPR 2006): ``jpg/ukbench00000.jpg`` ...; the ground truth follows
from the image count (object = index // 4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from oxbench.datasets.base import Benchmark, CropConvention
from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import (
    IMAGE_DIR,
    OnDisk,
    check_count,
    file_images,
    image_files,
    jpg_stems,
    names_test,
    require_dir,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, RemoteFile, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

_MB = 1_000_000


@dataclass(frozen=True)
class UKBench(OnDisk):
    """UKBench: ``jpg/ukbench00000.jpg`` ...; the ground truth follows from the image count."""

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        # the archive holds full/ and thumbnails/ copies under the same names
        return (
            Placement("ukbench[0-9][0-9][0-9][0-9][0-9].jpg", IMAGE_DIR, exclude="*thumbnails/*"),
        )

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        """No file is read with ``strict`` (the official 10,200 images); else the images in
        ``jpg/`` are counted (a subset: a positive multiple of 4)."""
        from oxbench.formats.ukbench import ukbench_ground_truth

        require_dir(spec, ddir)
        n = spec.n_images
        if not strict:
            n = len(jpg_stems(ddir / IMAGE_DIR))
            if n == 0 or n % 4:
                raise InputError(
                    f"found {n} UKBench images; need a positive multiple of 4", ddir / IMAGE_DIR
                )
            check_count(spec, "images", n, spec.n_images, False, ddir / IMAGE_DIR)
        return ukbench_ground_truth(n)

    def _benchmark(
        self,
        spec: DatasetSpec,
        ddir: Path,
        *,
        crop: CropConvention,
        strict: bool,
        options: Mapping[str, str],
    ) -> Benchmark:
        gt = self.ground_truth(spec, ddir, strict=strict)
        images = file_images(spec, ddir, gt.db_names)
        return Benchmark(
            id=spec.id,
            gt=gt,
            database=images,
            queries=images,
            protocols=spec.protocols,
            root=ddir,
            crop=crop,
        )

    def _names(self, spec: DatasetSpec) -> list[str]:
        from oxbench.formats.ukbench import ukbench_name

        return [ukbench_name(i) for i in range(spec.n_images)]

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        files = image_files(self._names(spec))
        return VerifyPlan(files, counts=(CountCheck("images", spec.n_images, files),))

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        return names_test(frozenset(self._names(spec)), None)

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Two objects, 4 images each (load it with ``strict=False``)."""
        from oxbench.formats.ukbench import ukbench_name

        write_tiny_jpegs(ddir / IMAGE_DIR, [ukbench_name(i) for i in range(8)])


register(DatasetSpec(
    id="ukbench",
    title="University of Kentucky Recognition Benchmark (UKBench)",
    homepage="https://archive.org/details/ukbench",
    description=(
        "10,200 images (640x480) of 2,550 objects, 4 each; every image queries the whole set, "
        "itself included; the score is the mean number of the object's 4 images in the top 4."
    ),
    n_images=10_200,
    n_queries=10_200,
    counts_note="10,200 images = 2,550 objects x 4",
    protocols=("ukbench",),
    files=(
        RemoteFile(
            name="ukbench.zip",
            urls=(
                "https://archive.org/download/ukbench/ukbench.zip",
                "http://vis.uky.edu/~stewe/ukbench/ukbench.zip",
            ),
            approx_size=1_600 * _MB,
            archive=True,
            placements=(Placement("*/full/ukbench*.jpg", "jpg"), Placement("full/ukbench*.jpg", "jpg")),
        ),
    ),
    terms=(
        "UKBench (Nister and Stewenius, CVPR 2006) is provided by the University of Kentucky for "
        "research; cite the paper. The archive.org copy is the one the authors' page points to "
        "since the original host went offline."
    ),
    family=UKBench(),
    citation="D. Nister, H. Stewenius, Scalable recognition with a vocabulary tree, CVPR 2006",
))  # fmt: skip
