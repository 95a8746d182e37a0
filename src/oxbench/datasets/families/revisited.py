"""Revisited Oxford / Paris (Radenovic et al., CVPR 2018): ``gnd_<id>.pkl`` plus ``jpg/``.

The database order is the pickle's ``imlist``; the query images are not in the database.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oxbench.datasets.catalog import register
from oxbench.datasets.families._oxford_paris import (
    OXFORD_IMAGES,
    OXFORD_NAMES,
    PARIS_CORRUPT,
    PARIS_IMAGES,
    PARIS_NAMES,
    REVISITOP,
    REVISITOP_TERMS,
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
    require_file,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, RemoteFile, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth
from oxbench.protocol import get_protocol


@dataclass(frozen=True)
class Revisited(OnDisk):
    """ROxford / RParis: ``gnd_<id>.pkl`` (revisitop pickle) plus ``jpg/``.

    Attributes:
        names: regular expression the image names follow (used by ``import`` until the pickle,
            which lists them exactly, is in place); ``None``: any name.
    """

    names: str | None = None

    def _gnd(self, spec: DatasetSpec) -> str:
        return f"gnd_{spec.id}.pkl"

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (Placement(f"*{IMAGE_EXT}", IMAGE_DIR), Placement(self._gnd(spec), "."))

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return (self._gnd(spec),)

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        return spec.n_images + spec.n_queries

    def _read(self, spec: DatasetSpec, ddir: Path) -> GroundTruth:
        from oxbench.formats.revisitop import read_gnd

        return read_gnd(
            require_file(spec, ddir, self._gnd(spec), "the ground truth"), dataset=spec.id
        )

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        gt = self._read(spec, ddir)
        if gt.protocol not in spec.protocols:
            raise InputError(
                f"expected the revisited ground truth (easy/hard/junk), got {gt.protocol}",
                gt.source,
            )
        check_count(spec, "database images", gt.n_db, spec.n_images, strict, ddir)
        check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
        return gt

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            gt = self._read(spec, ddir)
        except InputError as exc:
            return VerifyPlan(image_files(jpg_stems(ddir / IMAGE_DIR)), ground_truth=(str(exc),))
        problems = []
        overlap = sorted(set(gt.query_names) & set(gt.db_names))
        if overlap:
            problems.append(f"{len(overlap)} query image(s) are in the database, e.g. {overlap[0]}")
        if gt.protocol not in spec.protocols:
            problems.append(
                f"{self._gnd(spec)} holds {gt.protocol}-protocol labels, not revisited ones"
            )
        db, queries = image_files(gt.db_names), image_files(gt.query_names)
        return VerifyPlan(
            tuple(dict.fromkeys(db + queries)),
            counts=(
                CountCheck("database images", spec.n_images, db, listed=gt.n_db),
                CountCheck("query images", spec.n_queries, queries, listed=gt.n_queries),
            ),
            ground_truth=tuple(problems),
        )

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        names = None
        if (ddir / self._gnd(spec)).is_file():
            try:
                gt = self._read(spec, ddir)
                names = frozenset((*gt.db_names, *gt.query_names))
            except InputError:
                names = None
        return names_test(names, None if self.names is None else re.compile(self.names))

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """12 database images, 2 queries with easy, hard and junk images."""
        from oxbench.formats.revisitop import write_gnd
        from oxbench.groundtruth import make_query

        db = tuple(f"ex_db_{i:03d}" for i in range(12))
        queries = (
            make_query("ex_q_000", (2.0, 2.0, 20.0, 20.0), easy=[0, 1], hard=[2], junk=[3]),
            make_query("ex_q_001", (1.0, 3.0, 30.0, 25.0), easy=[4], hard=[5, 6], junk=[7]),
        )
        ddir.mkdir(parents=True, exist_ok=True)
        revisited = get_protocol(spec.protocols[0])
        write_gnd(GroundTruth(spec.id, revisited, db, queries), ddir / self._gnd(spec))
        write_tiny_jpegs(ddir / IMAGE_DIR, (*db, *(q.name for q in queries)))


register(DatasetSpec(
    id="roxford5k",
    title="Revisited Oxford (ROxford 5K)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "Oxford 5K re-annotated: 70 queries (26 groups) with easy/hard/junk(Unclear) labels and "
        "three setups (Easy, Medium, Hard). The query images are removed from the database. Use "
        "only the cropped query region."
    ),
    n_images=4993,
    n_queries=70,
    counts_note="4,993 database images + 70 query images = the 5,063 Oxford images",
    protocols=("revisited",),
    files=(
        OXFORD_IMAGES,
        RemoteFile(
            name="gnd_roxford5k.pkl",
            urls=(f"{REVISITOP}/roxford5k/gnd_roxford5k.pkl",),
            approx_size=150_000,
        ),
    ),
    terms=VGG_TERMS.format(name="Oxford Buildings", page=f"{VGG_OX}/")
    + REVISITOP_TERMS.format(id="roxford5k"),
    family=Revisited(names=OXFORD_NAMES),
    belongs_with=("revisitop1m",),
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip

register(DatasetSpec(
    id="rparis6k",
    title="Revisited Paris (RParis 6K)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "Paris 6K re-annotated: 70 queries (25 groups) with easy/hard/junk labels; query images "
        "removed from the database; the 20 corrupt images are not used."
    ),
    n_images=6322,
    n_queries=70,
    counts_note="6,322 database images + 70 query images = the 6,392 usable Paris images",
    protocols=("revisited",),
    files=(
        *PARIS_IMAGES,
        RemoteFile(
            name="gnd_rparis6k.pkl",
            urls=(f"{REVISITOP}/rparis6k/gnd_rparis6k.pkl",),
            approx_size=280_000,
        ),
    ),
    terms=VGG_TERMS.format(name="Paris Buildings", page=f"{VGG_PA}/")
    + REVISITOP_TERMS.format(id="rparis6k"),
    family=Revisited(names=PARIS_NAMES),
    belongs_with=("revisitop1m",),
    expected_corrupt=PARIS_CORRUPT,
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip
