"""Integrity checks of a dataset on disk: ``verify(id, root) -> VerifyReport``.

What is checked:

- every image the dataset needs is present, and decodes with Pillow (a full decode: a truncated
  JPEG is an error); Paris' 20 known-corrupt images are reported as expected, not as errors;
- EXIF orientation: images whose EXIF asks for a rotation are *listed*, never rotated -- the
  benchmarks' boxes and the official pipelines use the stored pixels (Holidays' rotated images are
  the reason its ``orientation`` option exists);
- counts against the official figures (SPEC section 2);
- ground truth: it parses, labels index the database, revisited query images are not in the
  database, original-protocol query images are in it;
- the files recorded in the lock file (ground truth, lists, kept archives) still have their
  recorded size and SHA-256.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from oxbench.datasets.fetch import file_digests
from oxbench.datasets.lock import LockFile
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import DatasetSpec, get_spec
from oxbench.errors import InputError, require

log = logging.getLogger(__name__)

_EXIF_ORIENTATION = 0x0112
_BATCH = 4096


@dataclass
class VerifyReport:
    """The outcome of :func:`verify`; ``ok`` is False when anything is off.

    Attributes:
        dataset, root: what was checked, where.
        counts: ``{"<what>": {"expected": int, "found": int}}``.
        missing: names of needed images that are not on disk.
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
        return [
            f"{what}: found {c['found']}, expected {c['expected']}"
            for what, c in self.counts.items()
            if c["found"] != c["expected"]
        ]

    @property
    def ok(self) -> bool:
        return not (
            self.missing
            or self.corrupt
            or self.ground_truth
            or self.checksums
            or self.count_problems
        )

    def summary(self) -> list[str]:
        """Short human lines (the CLI prints them)."""
        head = f"{self.dataset}: {'OK' if self.ok else 'PROBLEMS'} ({self.n_images_checked} images "
        head += ("decoded" if self.decoded else "found") + f", {self.seconds:.1f} s)"
        lines = [head]
        lines += [f"  count {p}" for p in self.count_problems]
        if self.missing:
            lines.append(
                f"  missing: {len(self.missing)} image(s), e.g. {', '.join(self.missing[:5])}"
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
        d["count_problems"] = self.count_problems
        return d

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON, atomically."""
        from oxbench.formats.revisitop import atomic_write_bytes

        path = Path(path)
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode())
        return path


def check_image(path: Path) -> tuple[str | None, int | None]:
    """Decode one image fully; return ``(error or None, EXIF orientation or None)``."""
    image_mod = require("PIL.Image", "images")
    try:
        with image_mod.open(path) as im:
            orientation = im.getexif().get(_EXIF_ORIENTATION)
            im.load()
            if im.width < 1 or im.height < 1:
                return "empty image", None
        return None, int(orientation) if orientation is not None else None
    except FileNotFoundError:
        return "missing", None
    except Exception as exc:  # noqa: BLE001 - any decoder failure is a corrupt image
        return f"{type(exc).__name__}: {exc}", None


def _files(names: Iterable[str]) -> list[str]:
    return [f"{n}.jpg" for n in names]


def _needed_images(spec: DatasetSpec, ddir: Path, report: VerifyReport) -> tuple[list[str], str]:
    """The image files the dataset needs (relative to the image folder) and that folder.

    Also fills the ground-truth and count checks of ``report``.
    """
    from oxbench.datasets.loaders import _gt_dir_name, _jpg_stems

    folder = "jpg"
    fam = spec.loader.rsplit(":", 1)[-1]
    if fam == "load_revisited":
        from oxbench.formats.revisitop import read_gnd

        gnd = ddir / f"gnd_{spec.id}.pkl"
        try:
            gt = read_gnd(gnd, dataset=spec.id)
        except InputError as exc:
            report.ground_truth.append(str(exc))
            return _files(_jpg_stems(ddir / folder)), folder
        report.counts["database images"] = {"expected": spec.n_images, "found": gt.n_db}
        report.counts["queries"] = {"expected": spec.n_queries, "found": gt.n_queries}
        overlap = sorted(set(gt.query_names) & set(gt.db_names))
        if overlap:
            report.ground_truth.append(
                f"{len(overlap)} query image(s) are in the database, e.g. {overlap[0]}"
            )
        if gt.protocol != "revisited":
            report.ground_truth.append(
                f"{gnd.name} holds {gt.protocol}-protocol labels, not revisited ones"
            )
        return _files(dict.fromkeys([*gt.db_names, *gt.query_names])), folder
    if fam == "load_original":
        from oxbench.formats.oxford_gt import read_gt_dir

        on_disk = _jpg_stems(ddir / folder)
        corrupt = set(spec.expected_corrupt)
        usable = [n for n in on_disk if n not in corrupt]
        report.counts["usable images"] = {"expected": spec.n_images, "found": len(usable)}
        try:
            gt = read_gt_dir(ddir / _gt_dir_name(spec), db_names=usable, dataset=spec.id)
        except InputError as exc:
            report.ground_truth.append(str(exc))
            return _files(on_disk), folder
        report.counts["queries"] = {"expected": spec.n_queries, "found": gt.n_queries}
        db = set(gt.db_names)
        missing_q = [q for q in gt.query_names if q not in db]
        if missing_q:
            report.ground_truth.append(
                f"{len(missing_q)} query image(s) are not in the database, e.g. {missing_q[0]}"
            )
        return _files(on_disk), folder
    if fam == "load_holidays":
        from oxbench.formats.holidays import holidays_ground_truth, read_image_list

        try:
            names = read_image_list(ddir / "holidays_images.dat")
            gt = holidays_ground_truth(names)
        except InputError as exc:
            report.ground_truth.append(str(exc))
            return _files(_jpg_stems(ddir / folder)), folder
        report.counts["images"] = {"expected": spec.n_images, "found": gt.n_db}
        report.counts["queries"] = {"expected": spec.n_queries, "found": gt.n_queries}
        return _files(gt.db_names), folder
    if fam == "load_ukbench":
        from oxbench.formats.ukbench import ukbench_name

        on_disk = _jpg_stems(ddir / folder)
        report.counts["images"] = {"expected": spec.n_images, "found": len(on_disk)}
        return _files(ukbench_name(i) for i in range(spec.n_images)), folder
    if fam == "load_distractor_set":
        from oxbench.datasets.loaders import distractor_files

        try:
            imgs = distractor_files(spec, ddir)
        except InputError as exc:
            report.ground_truth.append(str(exc))
            return [], folder
        report.counts["images"] = {"expected": spec.n_images, "found": len(imgs)}
        return list(imgs.files), folder
    raise InputError(f"verify does not know how to check {spec.id}")  # pragma: no cover


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
        size, sha, md5 = file_digests(path)
        if (
            (exp_size is not None and size != exp_size)
            or (exp_sha and sha != exp_sha)
            or (exp_md5 and md5 != exp_md5)
        ):
            report.checksums.append(
                f"{path}: sha256 {sha} ({size} bytes) differs from the "
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
    from oxbench.datasets.loaders import _remedy

    t0 = time.perf_counter()
    spec = get_spec(dataset_id)
    base = data_root(root)
    ddir = base / spec.id
    if spec.synthetic:
        raise InputError(f"{spec.id} is generated on demand; there is nothing to verify")
    if not ddir.is_dir():
        raise InputError(f"dataset {spec.id} is not on disk; {_remedy(spec, base)}", ddir)
    LockFile(base).read()
    report = VerifyReport(spec.id, str(ddir), decoded=decode)
    needed_files, folder = _needed_images(spec, ddir, report)
    if names is not None:
        needed_files = _files(names)
    files = [f"{folder}/{f}" for f in needed_files]
    if spec.id == "holidays" and (ddir / "jpg_rotated").is_dir():
        # The hand-rotated copy (orientation="rotated") must hold the same images.
        files += [f"jpg_rotated/{f}" for f in needed_files]
    corrupt_known = set(spec.expected_corrupt)
    # Report names: without extension; images outside jpg/ keep their folder ("jpg_rotated/...").
    needed = [f.rsplit(".", 1)[0].removeprefix(f"{folder}/") for f in files]

    def check(i: int) -> tuple[int, str | None, int | None]:
        p = ddir / files[i]
        if not decode:
            return i, (None if p.is_file() else "missing"), None
        err, orient = check_image(p)
        return i, err, orient

    from tqdm.auto import tqdm

    def checked() -> Iterator[tuple[int, str | None, int | None]]:
        # Bounded batches: R1M's million images must not become a million pending futures.
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for start in range(0, len(files), _BATCH):
                yield from pool.map(check, range(start, min(start + _BATCH, len(files))))

    with tqdm(total=len(files), desc=f"verify {spec.id}", disable=not progress) as bar:
        for i, err, orient in checked():
            bar.update(1)
            name = needed[i]
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
    _check_lock(spec, base, ddir, report)
    report.seconds = time.perf_counter() - t0
    return report
