"""Oxford 5K / Paris 6K, the original protocol (Philbin et al., CVPR 2007 / 2008): the text ground
truth ``<landmark>_<n>_{good,ok,junk,query}.txt`` plus every usable image in ``jpg/``.

The database is the sorted names of ``jpg/`` (Paris minus its 20 corrupt images): the text files
name images, not indices.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from oxbench.datasets.catalog import register
from oxbench.datasets.families._oxford_paris import (
    OXFORD_IMAGES,
    OXFORD_NAMES,
    PARIS_CORRUPT,
    PARIS_IMAGES,
    PARIS_NAMES,
    VGG_OX,
    VGG_PA,
    VGG_TERMS,
)
from oxbench.datasets.ondisk import (
    IMAGE_DIR,
    IMAGE_EXT,
    OnDisk,
    check_count,
    image_files,
    jpg_stems,
    names_test,
    remedy,
    require_dir,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, RemoteFile, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth


def text_gt_placements(into: str) -> tuple[Placement, ...]:
    """The four text ground-truth files of each query, laid out in ``into``."""
    return tuple(Placement(f"*_{kind}.txt", into) for kind in ("good", "ok", "junk", "query"))


@dataclass(frozen=True)
class Original(OnDisk):
    """Oxford 5K / Paris 6K: ``<gt_dir>/<landmark>_<n>_{good,ok,junk,query}.txt`` plus ``jpg/``.

    The database is every usable image in ``jpg/`` (the entry's ``expected_corrupt`` left out),
    sorted by name: the text files name images, so their order is not needed.

    Attributes:
        gt_dir: the ground-truth folder (``gt_files_170407``, ``paris_120310``).
        names: regular expression the image names follow (no full image list exists); ``None``:
            any name.
    """

    gt_dir: str
    names: str | None = None

    check_database: ClassVar[bool] = False  # the database is what jpg/ holds

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (Placement(f"*{IMAGE_EXT}", IMAGE_DIR), *text_gt_placements(self.gt_dir))

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return (self.gt_dir,)

    def _usable(self, spec: DatasetSpec, ddir: Path) -> list[str]:
        corrupt = set(spec.expected_corrupt)
        return [n for n in jpg_stems(ddir / IMAGE_DIR) if n not in corrupt]

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        """Needs the listing of ``jpg/`` (not the images' contents): it is the database order."""
        from oxbench.formats.oxford_gt import read_gt_dir

        require_dir(spec, ddir)
        gt_dir = ddir / self.gt_dir
        if not gt_dir.is_dir():
            raise InputError(
                f"the ground-truth folder of {spec.id} is missing; {remedy(spec, ddir.parent)}",
                gt_dir,
            )
        names = self._usable(spec, ddir)
        if not names:
            raise InputError(
                f"no images of {spec.id}; {remedy(spec, ddir.parent)}", ddir / IMAGE_DIR
            )
        check_count(spec, "usable images", len(names), spec.n_images, strict, ddir / IMAGE_DIR)
        gt = read_gt_dir(gt_dir, db_names=names, dataset=spec.id)
        check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, gt_dir)
        return gt

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        from oxbench.formats.oxford_gt import read_gt_dir

        on_disk = image_files(jpg_stems(ddir / IMAGE_DIR))
        usable = self._usable(spec, ddir)
        counts = [CountCheck("usable images", spec.n_images, image_files(usable))]
        try:
            gt = read_gt_dir(ddir / self.gt_dir, db_names=usable, dataset=spec.id)
        except InputError as exc:
            return VerifyPlan(on_disk, counts=tuple(counts), ground_truth=(str(exc),))
        counts.append(CountCheck("queries", spec.n_queries, found=gt.n_queries))
        db = set(gt.db_names)
        missing_q = [q for q in gt.query_names if q not in db]
        problems = (
            (f"{len(missing_q)} query image(s) are not in the database, e.g. {missing_q[0]}",)
            if missing_q
            else ()
        )
        return VerifyPlan(on_disk, counts=tuple(counts), ground_truth=problems)

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        return names_test(None, None if self.names is None else re.compile(self.names))

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """12 images, 2 queries (``ex_1``, ``ex_2``) with good, ok and junk images."""
        names = [f"ex_{i:06d}" for i in range(12)]
        gt_dir = ddir / self.gt_dir
        gt_dir.mkdir(parents=True, exist_ok=True)
        lists = {
            "ex_1": (names[0], names[1:3], names[3:4], names[4:5]),
            "ex_2": (names[5], names[6:7], names[7:9], names[9:10]),
        }
        for qid, (query, good, ok, junk) in lists.items():
            for kind, members in (("good", good), ("ok", ok), ("junk", junk)):
                (gt_dir / f"{qid}_{kind}.txt").write_text("".join(f"{n}\n" for n in members))
            (gt_dir / f"{qid}_query.txt").write_text(f"oxc1_{query} 1.0 2.0 30.0 25.0\n")
        write_tiny_jpegs(ddir / IMAGE_DIR, names)


register(DatasetSpec(
    id="oxford5k",
    title="Oxford Buildings (Oxford 5K)",
    homepage=f"{VGG_OX}/",
    description=(
        "Flickr photos of 11 Oxford landmarks, 5 queries each (55), with good/ok/junk labels "
        "(Philbin et al., CVPR 2007). The query image is part of the database."
    ),
    n_images=5063,
    n_queries=55,
    counts_note="5,062 images officially; 5,063 in the image archive and in common lists (loaded: 5,063)",
    protocols=("original",),
    files=(
        OXFORD_IMAGES,
        RemoteFile(
            name="gt_files_170407.tgz",
            urls=(f"{VGG_OX}/gt_files_170407.tgz",),
            approx_size=100_000,
            archive=True,
            placements=text_gt_placements("gt_files_170407"),
        ),
    ),
    terms=VGG_TERMS.format(name="Oxford Buildings", page=f"{VGG_OX}/"),
    family=Original(gt_dir="gt_files_170407", names=OXFORD_NAMES),
    belongs_with=("oxford100k",),
    citation="J. Philbin et al., Object retrieval with large vocabularies and fast spatial matching, CVPR 2007",
))  # fmt: skip

register(DatasetSpec(
    id="paris6k",
    title="Paris Buildings (Paris 6K)",
    homepage=f"{VGG_PA}/",
    description=(
        "Flickr photos of 11 Paris landmarks, 55 queries, same format as Oxford 5K (Philbin et al., "
        "CVPR 2008). All *_good.txt files are empty: every positive is in *_ok.txt. 20 images in "
        "the archives are corrupt and are left out of the database."
    ),
    n_images=6392,
    n_queries=55,
    counts_note="6,412 images listed, 20 of them corrupt -> 6,392 usable (loaded: 6,392)",
    protocols=("original",),
    files=(
        *PARIS_IMAGES,
        RemoteFile(
            name="paris_120310.tgz",
            urls=(f"{VGG_PA}/paris_120310.tgz",),
            approx_size=110_000,
            archive=True,
            placements=text_gt_placements("paris_120310"),
        ),
        RemoteFile(name="corrupt.txt", urls=(f"{VGG_PA}/corrupt.txt",), approx_size=1_000, optional=True),
    ),
    terms=VGG_TERMS.format(name="Paris Buildings", page=f"{VGG_PA}/"),
    family=Original(gt_dir="paris_120310", names=PARIS_NAMES),
    expected_corrupt=PARIS_CORRUPT,
    citation="J. Philbin et al., Lost in quantization, CVPR 2008",
))  # fmt: skip
