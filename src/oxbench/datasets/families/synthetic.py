"""The generated city (:mod:`oxbench.datasets.synthetic`): a test and a training city in the ROxford
layout, made on first use."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxbench.datasets.base import Benchmark, CropConvention
from oxbench.datasets.catalog import register
from oxbench.datasets.ondisk import image_files, remedy
from oxbench.datasets.spec import CountCheck, DatasetFamily, DatasetSpec, Placement, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth


@dataclass(frozen=True)
class Synthetic(DatasetFamily):
    """The generated city (:mod:`oxbench.datasets.synthetic`): ``manifest.json`` (written last,
    the mark of a complete set), ``gnd_<id>.pkl``, ``gt_files/`` and ``jpg/``.

    Only :meth:`load` generates: it builds the default test and training cities on first use.
    Reading the ground truth or verifying never does; they say how to make the set.
    """

    generated = True
    own_distractors = True

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return ()

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        from oxbench.datasets.synthetic.generate import MANIFEST

        return (MANIFEST,)

    def _manifest(self, spec: DatasetSpec, ddir: Path) -> dict[str, Any]:
        from oxbench.datasets.synthetic import read_manifest

        manifest = read_manifest(ddir) if ddir.is_dir() else None
        if manifest is None:
            raise InputError(
                f"the synthetic set {spec.id} is not generated here; {remedy(spec, ddir.parent)}",
                ddir,
            )
        return manifest

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        try:
            counts = self._manifest(spec, ddir)["counts"]
            return int(counts["db"]) + int(counts["queries"])
        except (InputError, KeyError, TypeError, ValueError):
            return 0

    def image_free_options(self, spec: DatasetSpec, ddir: Path) -> dict[str, str] | None:
        """The options :meth:`load` records (city, seed, the images' digest), from the manifest;
        ``None`` for a set not generated here (``load`` generates it)."""
        from oxbench.datasets.synthetic import read_manifest
        from oxbench.datasets.synthetic.config import SynthConfig

        manifest = read_manifest(ddir) if ddir.is_dir() else None
        if manifest is None:
            return None
        try:
            config = SynthConfig.from_dict(manifest["config"])
            digest = str(manifest["checksums"]["images_sha256"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                "malformed synthetic manifest; regenerate the set", ddir / "manifest.json"
            ) from None
        return {"city": config.city, "seed": str(config.seed), "images_sha256": digest}

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        from oxbench.datasets.synthetic.loader import _read_ground_truth

        manifest = self._manifest(spec, ddir)
        return _read_ground_truth(ddir / str(manifest["gnd"]), str(manifest["dataset"]))

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
        from oxbench.datasets import synthetic
        from oxbench.datasets.synthetic.distractor_kinds import is_kind_spec

        if (
            distractors is not None
            and not is_kind_spec(distractors)
            and (not isinstance(distractors, int) or isinstance(distractors, bool))
        ):
            raise InputError(
                "the synthetic benchmark takes a number of generated distractors "
                "(or synthetic-<kind>:N)"
            )
        synthetic.ensure_default(ddir.parent, progress=progress)  # a no-op once both cities exist
        return synthetic.load_synthetic(ddir, distractors=distractors, crop=crop)

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        """The generated images against the per-image SHA-256 the manifest recorded, the counts
        it recorded, and the ground-truth file against its recorded checksum."""
        import hashlib

        from oxbench.fileio import file_sha256

        manifest = self._manifest(spec, ddir)
        try:
            db = [(str(r["name"]), str(r["sha256"])) for r in manifest["images"]]
            qs = [(str(r["name"]), str(r["sha256"])) for r in manifest["queries"]]
            n_db, n_q = int(manifest["counts"]["db"]), int(manifest["counts"]["queries"])
            checks = dict(manifest["checksums"])
            gnd_name = str(manifest["gnd"])
        except (KeyError, TypeError, ValueError):
            raise InputError(
                "malformed synthetic manifest; regenerate the set", ddir / "manifest.json"
            ) from None
        db_files, q_files = image_files([n for n, _ in db]), image_files([n for n, _ in qs])
        sha = dict(zip(q_files + db_files, [h for _, h in qs + db], strict=True))
        checksums, ok, problems = [], [], []
        images_hash = hashlib.sha256("".join(h for _, h in qs + db).encode()).hexdigest()
        if images_hash != checks.get("images_sha256"):
            checksums.append(
                "the manifest's per-image checksums do not add up to its images_sha256"
            )
        gnd = ddir / gnd_name
        if not gnd.is_file():
            problems.append(f"{gnd_name} is missing; regenerate the set")
        elif file_sha256(gnd) != checks.get("gnd_sha256"):
            checksums.append(
                f"{gnd}: sha256 differs from the one recorded in the manifest; regenerate the set"
            )
        else:
            ok.append(gnd_name)
        listed_db: int | None = None
        listed_q: int | None = None
        if gnd.is_file():
            try:
                gt = self.ground_truth(spec, ddir, strict=True)
                listed_db, listed_q = gt.n_db, gt.n_queries
                if list(gt.db_names) != [n for n, _ in db]:
                    problems.append(f"{gnd_name} lists other database images than the manifest")
            except InputError as exc:
                problems.append(str(exc))
        return VerifyPlan(
            q_files + db_files,
            counts=(
                CountCheck("database images", n_db, db_files, listed=listed_db),
                CountCheck("query images", n_q, q_files, listed=listed_q),
            ),
            ground_truth=tuple(problems),
            sha256=sha,
            checksums=tuple(checksums),
            checksums_ok=tuple(ok),
        )

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """The tiny test and training cities beside each other (:func:`make_tiny_cities`)."""
        from oxbench.datasets.synthetic.generate import make_tiny_cities

        make_tiny_cities(ddir.parent)


for _sid, _what in (("synthetic", "test city"), ("synthetic-train", "training city (other seed)")):
    register(
        DatasetSpec(
            id=_sid,
            title=f"Synthetic city ({_what})",
            homepage="",
            description=(
                f"A generated {_what} in the ROxford layout (revisited labels, boxes, on-demand "
                "distractors), for tests and demos without any download. Made by `oxbench data synth` "
                "or on first load."
            ),
            n_images=0,
            n_queries=0,
            counts_note="set by the generator's parameters",
            protocols=("revisited",),
            files=(),
            terms="Generated locally by oxbench; no terms apply.",
            family=Synthetic(),
        )
    )
