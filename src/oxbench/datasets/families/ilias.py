"""ILIAS (Kordopatis-Zilos et al., CVPR 2025): its id files, optionally its images.

Layout in ``<root>/ilias/`` (as ``evaluation/download_ids.sh`` and the ``ilias_core`` archive lay
it out): ``image_ids/{image_query_ids,text_query_ids,positive_ids}.txt`` (the ground truth),
optionally ``image_ids/distractor_ids.txt`` (or ``.txt.gz``: the distractors to put after the
positives, in that order) and ``misc/taxonomy.json`` (for the per-category breakdown), and where
images are read, ``<instance>/{query,pos}/<name>.jpg`` and ``yfcc100m/<distractor id>.jpg``. The
queries are the 1,232 image queries; names drop the ``.jpg`` of the ids, as oxbench's name lists do
(``bold_bimp_000/query/Q000_00``). A run on descriptor files (``--method features`` with
``descriptor.db_names`` / ``descriptor.query_names``) reads no image. Scored by the ``ilias``
protocol (:mod:`oxbench.evaluation.protocols.ilias`): mAP@1k, per scale and clutter, per category.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import IMAGE_EXT, OnDisk, check_count, require_dir, write_tiny_jpegs
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

IDS = "image_ids"
TAXONOMY = "misc/taxonomy.json"
DISTRACTORS = ("image_ids/distractor_ids.txt", "image_ids/distractor_ids.txt.gz")
DISTRACTOR_DIR = "yfcc100m"
#: The largest distractor list read (decompressed): the 100M list is beyond a run on one machine.
MAX_LIST_BYTES = 1 << 30


def read_distractor_ids(path: Path) -> tuple[str, ...]:
    """One distractor id a line (gzip-compressed when the name ends in ``.gz``), in file order.

    Raises:
        InputError: larger than :data:`MAX_LIST_BYTES`, not UTF-8, not gzip, or an id twice.
    """
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read(MAX_LIST_BYTES + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(MAX_LIST_BYTES + 1)
        if len(data) > MAX_LIST_BYTES:
            raise InputError(f"the list is larger than {MAX_LIST_BYTES >> 20} MiB", path)
        text = data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise InputError(
            f"not a readable list of ids ({' '.join(str(exc).split())[:120]})", path
        ) from None
    ids = tuple(line.strip() for line in text.splitlines() if line.strip())
    if len(set(ids)) != len(ids):
        raise InputError("a distractor id is listed twice", path)
    return ids


@dataclass(frozen=True)
class IliasFamily(OnDisk):
    """ILIAS: ground truth from the id files; the database is the positives, then the listed
    distractors; the queries are the image queries."""

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (
            Placement("image_query_ids.txt", IDS),
            Placement("text_query_ids.txt", IDS),
            Placement("positive_ids.txt", IDS),
            Placement("distractor_ids.txt*", IDS),
            Placement("taxonomy.json", "misc"),
            Placement("*.jpg", ".", mode="tree", strip="ilias_core"),
        )

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return tuple(
            f"{IDS}/{n}" for n in ("image_query_ids.txt", "text_query_ids.txt", "positive_ids.txt")
        )

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        return 0  # the runs this entry is for read descriptors, not images

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        return self._read(spec, ddir, strict=strict)[0]

    def _read(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> tuple[GroundTruth, int]:
        """The ground truth and its number of positives (the database's first images)."""
        from oxbench.formats.ilias import ground_truth, read_ids, read_taxonomy

        require_dir(spec, ddir)
        ids = read_ids(ddir)
        taxonomy = read_taxonomy(ddir / TAXONOMY) if (ddir / TAXONOMY).is_file() else None
        listed = next((ddir / p for p in DISTRACTORS if (ddir / p).is_file()), None)
        distractors = read_distractor_ids(listed) if listed is not None else ()
        gt = ground_truth(
            ids,
            taxonomy=taxonomy,
            queries="image",
            distractors=distractors,
            extension=False,
            dataset=spec.id,
        )
        check_count(spec, "positives", len(ids.positives), spec.n_images, strict, ddir)
        check_count(spec, "image queries", gt.n_queries, spec.n_queries, strict, ddir)
        return gt, len(ids.positives)

    def image_layout(
        self, spec: DatasetSpec, gt: GroundTruth
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Positives and queries in the ``ilias_core`` layout, distractors in ``yfcc100m/``."""
        annotated = np.isfinite(getattr(gt, "scale", np.zeros(0)))  # the positives
        db = tuple(
            f"{n}{IMAGE_EXT}"
            if i < annotated.size and annotated[i]
            else f"{DISTRACTOR_DIR}/{n}{IMAGE_EXT}"
            for i, n in enumerate(gt.db_names)
        )
        return db, tuple(f"{q}{IMAGE_EXT}" for q in gt.query_names)

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            gt, n_pos = self._read(spec, ddir, strict=False)
        except InputError as exc:
            return VerifyPlan((), ground_truth=(str(exc),))
        db, queries = self.image_layout(spec, gt)
        return VerifyPlan(
            db + queries,
            counts=(
                CountCheck("positives", spec.n_images, db[:n_pos], listed=n_pos),
                CountCheck("image queries", spec.n_queries, queries, listed=gt.n_queries),
            ),
        )

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Three instances (one image query each, one with two), their positives with scale and
        clutter, three listed distractors, a taxonomy, and every image."""
        import json

        (ddir / IDS).mkdir(parents=True, exist_ok=True)
        (ddir / "misc").mkdir(exist_ok=True)
        instances = ["brisk_zip_000", "cozy_pop_001", "dandy_fig_002"]
        queries = [f"{x}/query/Q{i:03d}_00.jpg" for i, x in enumerate(instances)]
        queries.append(f"{instances[1]}/query/Q001_01.jpg")
        positives = [
            (f"{x}/pos/P{i:03d}_{j:02d}.jpg", scale, clutter)
            for i, x in enumerate(instances)
            for j, (scale, clutter) in enumerate(((0.05, 10), (0.2, 40), (0.5, 60))[: 1 + i])
        ]
        distractors = ["00000/aa01", "00000/aa02", "00001/bb03"]
        (ddir / IDS / "image_query_ids.txt").write_text(
            "".join(f"{q},x\n" for q in sorted(queries))
        )
        (ddir / IDS / "text_query_ids.txt").write_text(
            "".join(f"{x}/query/T{i:03d}.txt\n" for i, x in enumerate(instances))
        )
        (ddir / IDS / "positive_ids.txt").write_text(
            "".join(f"{p},{s},{c}\n" for p, s, c in positives)
        )
        (ddir / DISTRACTORS[0]).write_text("".join(f"{d}\n" for d in distractors))
        taxonomy = {
            "product": {"food": {"cake": instances[:2]}},
            "landmark": {"tower": {"x": instances[2:]}},
        }
        (ddir / TAXONOMY).write_text(json.dumps(taxonomy))
        write_tiny_jpegs(
            ddir, [p[: -len(IMAGE_EXT)] for p in queries + [p for p, _, _ in positives]]
        )
        write_tiny_jpegs(ddir / DISTRACTOR_DIR, distractors)


register(DatasetSpec(
    id="ilias",
    title="ILIAS (instance-level image retrieval at scale)",
    homepage="https://vrg.fel.cvut.cz/ilias/",
    description=(
        "1,000 object instances (Kordopatis-Zilos et al., CVPR 2025): 1,232 image queries on clean "
        "backgrounds, 4,715 positives in the wild, scored by mAP@1k against up to 100M YFCC100M "
        "distractors (mini-ILIAS: 5M). oxbench reads the id files (and the distractors listed in "
        "image_ids/distractor_ids.txt); runs score descriptor files named by image id."
    ),
    n_images=4_715,
    n_queries=1_232,
    counts_note="4,715 positives (+ the listed distractors) and 1,232 image queries (1,000 text queries apart)",
    protocols=("ilias",),
    files=(),
    terms=(
        "ILIAS core images are collected by the authors for research; the distractors are "
        "YFCC100M images, each under its own Creative Commons licence. See the homepage; oxbench "
        "ships and downloads none of them: import a copy you have with `oxbench data import ilias "
        "--from PATH`."
    ),
    family=IliasFamily(),
    citation="G. Kordopatis-Zilos et al., ILIAS: Instance-Level Image retrieval At Scale, CVPR 2025",
))  # fmt: skip
