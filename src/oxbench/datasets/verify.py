"""Integrity checks of a dataset on disk: ``verify(id, root) -> VerifyReport``.

What is checked:

- every image the dataset needs is present, and decodes with Pillow (a full decode: a truncated
  JPEG is an error); Paris' 20 known-corrupt images are reported as expected, not as errors;
- EXIF orientation: images whose EXIF asks for a rotation are *listed*, never rotated -- the
  benchmarks' boxes and the official pipelines use the stored pixels (Holidays' rotated images are
  the reason its ``orientation`` option exists);
- counts against the official figures (docs/protocols.md, "Datasets"): ``found`` is what is on disk, ``listed``
  what the ground truth or list names;
- generated (synthetic) sets: every image against the SHA-256 its manifest recorded, the counts it
  recorded and the ground-truth file against its recorded checksum;
- ground truth: it parses, labels index the database, revisited query images are not in the
  database, original-protocol query images are in it;
- the files recorded in the lock file (ground truth, lists, kept archives) still have their
  recorded size and SHA-256.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oxbench.datasets.catalog import get_spec
from oxbench.datasets.lock import LockFile
from oxbench.datasets.ondisk import IMAGE_DIR, IMAGE_EXT, require_dir
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import DatasetSpec
from oxbench.errors import InputError
from oxbench.fileio import (
    atomic_write_json,
    checksum_mismatch,
    file_digests,
    file_sha256,
    progress_bar,
)

log = logging.getLogger(__name__)

_EXIF_ORIENTATION = 0x0112
_BATCH = 4096


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`; ``ok`` is False when anything is off.

    Attributes:
        dataset, root: what was checked, where.
        counts: ``{"<what>": {"expected": int, "found": int[, "listed": int]}}``: the official
            figure, what is on disk, and what the ground truth or list names (where one does).
        missing: names of needed images that are not on disk.
        changed: names of images whose SHA-256 differs from the recorded one (generated sets).
        corrupt: ``{"name", "error"}`` for images that do not decode.
        expected_corrupt: known-corrupt images (Paris) found corrupt or absent: not errors.
        exif_rotated: ``{"name", "orientation"}`` for images whose EXIF orientation is not 1.
        ground_truth: problems with the ground truth (one line each).
        checksums: problems with recorded checksums (one line each).
        checksums_ok: names of files whose recorded checksum matched.
        n_images_checked: images decoded (or only found, when ``decode=False``).
        decoded: whether images were decoded.
        seconds: time taken.
    """

    dataset: str
    root: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    corrupt: list[dict[str, str]] = field(default_factory=list)
    expected_corrupt: list[str] = field(default_factory=list)
    exif_rotated: list[dict[str, Any]] = field(default_factory=list)
    ground_truth: list[str] = field(default_factory=list)
    checksums: list[str] = field(default_factory=list)
    checksums_ok: list[str] = field(default_factory=list)
    n_images_checked: int = 0
    decoded: bool = True
    seconds: float = 0.0

    @property
    def count_problems(self) -> list[str]:
        out = []
        for what, c in self.counts.items():
            listed = c.get("listed", c["found"])
            if c["found"] != c["expected"] or listed != c["expected"]:
                extra = f", {listed} listed" if listed != c["found"] else ""
                out.append(f"{what}: found {c['found']}, expected {c['expected']}{extra}")
        return out

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.changed
            or self.corrupt
            or self.ground_truth
            or self.checksums
            or self.count_problems
        )

    @property
    def ground_truth_only(self) -> bool:
        """The ground truth is complete and sound and no image is there at all: enough for the
        methods that read no pixels (the ``features*`` presets on the user's descriptors)."""
        queries = self.counts.get("query images", {})
        return bool(
            self.missing
            and queries.get("listed", 0) > 0
            and self.n_images_checked == 0
            and not (self.changed or self.corrupt or self.ground_truth or self.checksums)
            and all(
                c["found"] == 0 and c.get("listed", c["expected"]) == c["expected"]
                for c in self.counts.values()
            )
        )

    def summary(self) -> list[str]:
        """Short human lines (the CLI prints them)."""
        if self.ground_truth_only:
            return [
                f"{self.dataset}: ground truth for {self.counts['query images']['listed']} queries; "
                f"images: none, which the features presets do not need ({self.seconds:.1f} s)",
                f"  methods that read pixels need the {len(self.missing):,} images: "
                f"`oxbench data fetch {self.dataset}` or `oxbench data import {self.dataset} "
                "--from PATH`",
            ]
        head = f"{self.dataset}: {'OK' if self.ok else 'PROBLEMS'} ({self.n_images_checked} images "
        head += ("decoded" if self.decoded else "found") + f", {self.seconds:.1f} s)"
        lines = [head]
        lines += [f"  count {p}" for p in self.count_problems]
        if self.missing:
            lines.append(
                f"  missing: {len(self.missing)} image(s), e.g. {', '.join(self.missing[:5])}"
            )
        if self.changed:
            lines.append(
                f"  changed since generation: {len(self.changed)} image(s), e.g. {', '.join(self.changed[:5])}"
            )
        if self.corrupt:
            lines.append(
                f"  corrupt: {len(self.corrupt)} image(s), e.g. {self.corrupt[0]['name']} ({self.corrupt[0]['error']})"
            )
        if self.expected_corrupt:
            lines.append(f"  known-corrupt (expected, not used): {len(self.expected_corrupt)}")
        if self.exif_rotated:
            lines.append(
                f"  EXIF orientation != 1 (kept as stored, not rotated): {len(self.exif_rotated)}"
            )
        lines += [f"  ground truth: {p}" for p in self.ground_truth]
        lines += [f"  checksum: {p}" for p in self.checksums]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (with ``ok`` and ``count_problems``)."""
        d = asdict(self)
        d["ok"] = self.ok
        d["ground_truth_only"] = self.ground_truth_only
        d["count_problems"] = self.count_problems
        return d

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON, atomically.

        Raises:
            InputError: the file cannot be written (names it and the OS reason).
        """
        return atomic_write_json(path, self.to_dict())


def check_image(path: Path) -> tuple[str | None, int | None]:
    """Decode one image fully; return ``(error or None, EXIF orientation or None)``."""
    from oxbench.imaging import open_image

    try:
        with open_image(path) as im:
            orientation = im.getexif().get(_EXIF_ORIENTATION)
            im.load()
            if im.width < 1 or im.height < 1:
                return "empty image", None
        return None, int(orientation) if orientation is not None else None
    except FileNotFoundError:
        return "missing", None
    except InputError as exc:
        return ("missing" if exc.problem == "image file not found" else exc.problem), None
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a corrupt image
        return f"{type(exc).__name__}: {exc}", None


def _check_lock(spec: DatasetSpec, base: Path, ddir: Path, report: VerifyReport) -> None:
    records = LockFile(base).read()["files"]
    for f in spec.files:
        path = ddir / f.local_path
        rec = records.get(f.name)
        if not path.is_file():
            continue
        exp_sha = f.sha256 or (rec or {}).get("sha256")
        exp_size = f.size if f.size is not None else (rec or {}).get("size")
        exp_md5 = f.md5 if f.checksum_policy == "published" else (rec or {}).get("md5")
        if not (exp_sha or exp_md5 or exp_size is not None):
            continue
        found: dict[str, str | int | None] = {
            "size": path.stat().st_size,
            **file_digests(path, ("sha256", "md5")),
        }
        if (
            checksum_mismatch({"size": exp_size, "sha256": exp_sha, "md5": exp_md5}, found)
            is not None
        ):
            report.checksums.append(
                f"{path}: sha256 {found['sha256']} ({found['size']} bytes) differs from the "
                f"{'published' if f.checksum_policy == 'published' else 'recorded'} one; fetch it again "
                "(or, if the owners replaced it, delete its entry in oxbench.lock.json)"
            )
        else:
            report.checksums_ok.append(f.name)


def verify(
    dataset_id: str,
    root: str | Path | None = None,
    *,
    decode: bool = True,
    jobs: int = 2,
    progress: bool = True,
    names: Sequence[str] | None = None,
) -> VerifyReport:
    """Check ``<root>/<dataset_id>/`` (see the module docstring).

    Args:
        dataset_id: catalog id.
        root: data root.
        decode: decode every image (False: only check presence; fast).
        jobs: decoding threads (Pillow releases the GIL while decoding).
        progress: tqdm bar.
        names: check only these images (default: all the dataset needs).

    Returns:
        The report (``report.ok``).

    Raises:
        InputError: unknown id, the dataset folder does not exist (with the remedy), or the
            data root's lock file is malformed (refused before anything is decoded, as fetch does).
    """
    t0 = time.perf_counter()
    spec = get_spec(dataset_id)
    base = data_root(root)
    ddir = base / spec.id
    require_dir(spec, ddir)
    LockFile(base).read()  # a malformed lock file is refused before anything is decoded
    report = VerifyReport(spec.id, str(ddir), decoded=decode)
    plan = spec.family.verify_plan(spec, ddir)
    report.ground_truth += plan.ground_truth
    report.checksums += plan.checksums
    report.checksums_ok += plan.checksums_ok
    files = list(plan.files) if names is None else [f"{IMAGE_DIR}/{n}{IMAGE_EXT}" for n in names]
    corrupt_known = set(spec.expected_corrupt)
    # Report names: without extension; images outside jpg/ keep their folder ("jpg_rotated/...").
    needed = [f.rsplit(".", 1)[0].removeprefix(f"{IMAGE_DIR}/") for f in files]

    def check(i: int) -> tuple[int, str | None, int | None, bool]:
        p = ddir / files[i]
        if not decode:
            err, orient = (None if p.is_file() else "missing"), None
        else:
            err, orient = check_image(p)
        sha = plan.sha256.get(files[i])
        changed = err != "missing" and sha is not None and file_sha256(p) != sha
        return i, err, orient, changed

    def checked() -> Iterator[tuple[int, str | None, int | None, bool]]:
        # Bounded batches: R1M's million images must not become a million pending futures.
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for start in range(0, len(files), _BATCH):
                yield from pool.map(check, range(start, min(start + _BATCH, len(files))))

    with progress_bar(total=len(files), desc=f"verify {spec.id}", enabled=progress) as bar:
        absent: set[str] = set()
        for i, err, orient, changed in checked():
            bar.update(1)
            name = needed[i]
            if changed:
                report.changed.append(name)
            if err == "missing":
                absent.add(files[i])
            if err is None:
                report.n_images_checked += 1
                if orient not in (None, 1):
                    report.exif_rotated.append({"name": name, "orientation": orient})
            elif name in corrupt_known:
                report.expected_corrupt.append(name)
            elif err == "missing":
                report.missing.append(name)
            else:
                report.n_images_checked += 1
                report.corrupt.append({"name": name, "error": err})
    checked_files = set(files)
    for c in plan.counts:
        found = c.found
        if found is None:  # what is on disk, from the checks above (or a stat when not checked)
            found = sum(
                (f not in absent) if f in checked_files else (ddir / f).is_file() for f in c.files
            )
        report.counts[c.what] = {"expected": c.expected, "found": found}
        if c.listed is not None:
            report.counts[c.what]["listed"] = c.listed
    _check_lock(spec, base, ddir, report)
    report.seconds = time.perf_counter() - t0
    return report
