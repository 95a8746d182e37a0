"""Google Landmarks v2 retrieval (Weyand et al., CVPR 2020): the solution file and the index list.

Layout in ``<root>/gldv2-retrieval/``: ``retrieval_solution_v2.1.csv`` (``id,images,Usage``) and
``index.csv`` (the index image ids, first column ``id``, in the order that makes the database).
The queries are the Public and Private test images of the solution (the Ignored ones are none).
The images, when read, are where the GLDv2 archives put them: ``index/a/b/c/<id>.jpg`` and
``test/a/b/c/<id>.jpg`` (the id's first three characters); a run on descriptor files
(``--method features`` with ``descriptor.db_names`` / ``descriptor.query_names``) reads none.
Scored by the ``gldv2`` protocol (:mod:`oxbench.evaluation.protocols.gldv2`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import (
    IMAGE_EXT,
    OnDisk,
    check_count,
    require_file,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

SOLUTION = "retrieval_solution_v2.1.csv"
INDEX = "index.csv"


def image_path(part: str, image_id: str) -> str:
    """Where GLDv2 keeps an image: ``<part>/a/b/c/<id>.jpg`` (``a b c`` the id's first three
    characters)."""
    return f"{part}/{image_id[0]}/{image_id[1]}/{image_id[2]}/{image_id}{IMAGE_EXT}"


@dataclass(frozen=True)
class Gldv2Retrieval(OnDisk):
    """GLDv2 retrieval: ground truth from the solution file, the database from ``index.csv``."""

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (Placement(SOLUTION, "."), Placement(INDEX, "."))

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return (SOLUTION, INDEX)

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        return 0  # the runs this entry is for read descriptors, not images

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        from oxbench.formats.gldv2 import read_index, read_solution

        solution = read_solution(require_file(spec, ddir, SOLUTION, "the solution file"))
        index = read_index(require_file(spec, ddir, INDEX, "the index list"))
        gt = solution.ground_truth(index, dataset=spec.id)
        check_count(spec, "index images", gt.n_db, spec.n_images, strict, ddir)
        check_count(spec, "Public and Private queries", gt.n_queries, spec.n_queries, strict, ddir)
        return gt

    def image_layout(
        self, spec: DatasetSpec, gt: GroundTruth
    ) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (
            tuple(image_path("index", n) for n in gt.db_names),
            tuple(image_path("test", n) for n in gt.query_names),
        )

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            gt = self.ground_truth(spec, ddir, strict=False)
        except InputError as exc:
            return VerifyPlan((), ground_truth=(str(exc),))
        db, queries = self.image_layout(spec, gt)
        return VerifyPlan(
            db + queries,
            counts=(
                CountCheck("index images", spec.n_images, db, listed=gt.n_db),
                CountCheck("query images", spec.n_queries, queries, listed=gt.n_queries),
            ),
        )

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Six index images, two Public and one Private test image, one Ignored."""
        ddir.mkdir(parents=True, exist_ok=True)
        index = [f"{i:016x}" for i in range(0xA0, 0xA6)]
        (ddir / INDEX).write_text("id,url\n" + "".join(f"{i},\n" for i in index))
        rows = [
            ("f00d000000000001", f"{index[0]} {index[1]}", "Public"),
            ("f00d000000000002", index[2], "Public"),
            ("f00d000000000003", f"{index[3]} {index[4]}", "Private"),
            ("f00d000000000004", "", "Ignored"),
        ]
        (ddir / SOLUTION).write_text(
            "id,images,Usage\n" + "".join(f"{q},{rel},{use}\n" for q, rel, use in rows)
        )
        queries = [q for q, _, usage in rows if usage != "Ignored"]
        for part, names in (("index", index), ("test", queries)):
            write_tiny_jpegs(ddir, [image_path(part, n)[: -len(IMAGE_EXT)] for n in names])


register(DatasetSpec(
    id="gldv2-retrieval",
    title="Google Landmarks v2, retrieval (GLDv2)",
    homepage="https://github.com/cvdfoundation/google-landmark",
    description=(
        "Google Landmarks Dataset v2, retrieval task (Weyand et al., CVPR 2020): 761,757 index "
        "images; the test images of retrieval_solution_v2.1.csv marked Public (379) and Private "
        "(750) are the queries, scored by mAP@100 as the challenge scores them. oxbench reads the "
        "solution and index.csv; runs score descriptor files named by image id."
    ),
    n_images=761_757,
    n_queries=1_129,
    counts_note="761,757 index images; 379 Public + 750 Private test images (1,129 with index matches)",
    protocols=("gldv2",),
    files=(),
    terms=(
        "GLDv2 images come from Wikimedia Commons, each under its own licence (listed in the "
        "dataset's metadata); the annotations are CC BY 4.0 (see the homepage). oxbench ships and "
        "downloads none of them: import a copy you have with `oxbench data import gldv2-retrieval "
        "--from PATH`."
    ),
    family=Gldv2Retrieval(),
    citation="T. Weyand, A. Araujo, B. Cao, J. Sim, Google Landmarks Dataset v2, CVPR 2020",
))  # fmt: skip
