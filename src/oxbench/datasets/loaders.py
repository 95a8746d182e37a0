"""Loading a dataset from its canonical layout into a :class:`~oxbench.datasets.base.Benchmark`.

:func:`load` is the entry point; the per-family loaders below are named by the catalog entries.
Loading reads the ground truth with the shared parsers of :mod:`oxbench.formats` and checks that
every image file it refers to is present; it does not decode images (``verify`` does).

Database order:

- revisited sets, Holidays: the order of the official list (``imlist``, ``holidays_images.dat``);
- Oxford 5K / Paris 6K (original protocol): the sorted image names found in ``jpg/`` (Paris minus
  its 20 corrupt images) -- the order of ``gnd_oxford5k.pkl``/``gnd_paris6k.pkl``'s ``imlist``
  is not needed because the text files name images, not indices;
- UKBench: ``ukbench00000`` ... ``ukbench10199``;
- R1M: the order of ``revisitop1m.txt``; Oxford 100K: sorted names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark, CropConvention, FileImages, read_image
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import DatasetSpec, get_spec
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

_IMAGE_EXT = ".jpg"


def _remedy(spec: DatasetSpec, root: Path) -> str:
    how = f"`oxbench data fetch {spec.id} --root {root}`" if spec.files else ""
    imp = f"`oxbench data import {spec.id} --root {root} --from PATH`"
    return f"get it with {how} or {imp}" if how else f"get it with {imp}"


def _require_dir(spec: DatasetSpec, ddir: Path) -> None:
    if not ddir.is_dir():
        raise InputError(f"dataset {spec.id} is not on disk; {_remedy(spec, ddir.parent)}", ddir)


def _require_file(spec: DatasetSpec, path: Path, what: str) -> Path:
    if not path.is_file():
        raise InputError(
            f"{what} of {spec.id} is missing; {_remedy(spec, path.parent.parent)}", path
        )
    return path


def _images(
    spec: DatasetSpec, ddir: Path, names: Sequence[str], folder: str = "jpg", *, check: bool = True
) -> FileImages:
    img_dir = ddir / folder
    paths = tuple(img_dir / f"{n}{_IMAGE_EXT}" for n in names)
    if check:
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise InputError(
                f"{len(missing)} of {len(paths)} image(s) of {spec.id} are missing (first: "
                f"{missing[0].name}); {_remedy(spec, ddir.parent)}",
                img_dir,
            )
    return FileImages(tuple(names), paths)


def _check_count(
    spec: DatasetSpec, what: str, found: int, expected: int, strict: bool, where: Path
) -> None:
    if found != expected:
        msg = f"{spec.id} has {found} {what}, expected {expected} ({spec.counts_note})"
        if strict:
            raise InputError(
                f"{msg}; run `oxbench data verify {spec.id}` to see what is off", where
            )
        log.warning("%s: %s", where, msg)


def _jpg_stems(img_dir: Path, *, recursive: bool = False) -> list[str]:
    if not img_dir.is_dir():
        return []
    if recursive:
        return sorted(
            p.relative_to(img_dir).with_suffix("").as_posix()
            for p in img_dir.rglob(f"*{_IMAGE_EXT}")
        )
    return sorted(
        e.name[: -len(_IMAGE_EXT)] for e in os.scandir(img_dir) if e.name.endswith(_IMAGE_EXT)
    )


def _gt_dir_name(spec: DatasetSpec) -> str:
    for p in spec.layout:
        if p.pattern.endswith("_query.txt"):
            return p.into
    raise ValueError(f"catalog entry {spec.id} names no ground-truth folder")  # pragma: no cover


def load_revisited(
    spec: DatasetSpec, ddir: Path, *, crop: CropConvention, strict: bool, options: dict[str, Any]
) -> Benchmark:
    """ROxford / RParis: ``gnd_<id>.pkl`` plus ``jpg/``; queries carry boxes, labels easy/hard/junk."""
    from oxbench.formats.revisitop import read_gnd

    gt = read_gnd(
        _require_file(spec, ddir / f"gnd_{spec.id}.pkl", "the ground truth"), dataset=spec.id
    )
    if gt.protocol != "revisited":
        raise InputError(
            f"expected the revisited ground truth (easy/hard/junk), got {gt.protocol}", gt.source
        )
    _check_count(spec, "database images", gt.n_db, spec.n_images, strict, ddir)
    _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
    return Benchmark(
        id=spec.id,
        gt=gt,
        database=_images(spec, ddir, gt.db_names),
        queries=_images(spec, ddir, gt.query_names),
        protocols=spec.protocols,
        root=ddir,
        crop=crop,
    )


def load_original(
    spec: DatasetSpec, ddir: Path, *, crop: CropConvention, strict: bool, options: dict[str, Any]
) -> Benchmark:
    """Oxford 5K / Paris 6K: the text ground truth plus every usable image in ``jpg/``."""
    from oxbench.formats.oxford_gt import read_gt_dir

    gt_dir = ddir / _gt_dir_name(spec)
    if not gt_dir.is_dir():
        raise InputError(
            f"the ground-truth folder of {spec.id} is missing; {_remedy(spec, ddir.parent)}", gt_dir
        )
    corrupt = set(spec.expected_corrupt)
    names = [n for n in _jpg_stems(ddir / "jpg") if n not in corrupt]
    if not names:
        raise InputError(f"no images of {spec.id}; {_remedy(spec, ddir.parent)}", ddir / "jpg")
    _check_count(spec, "usable images", len(names), spec.n_images, strict, ddir / "jpg")
    gt = read_gt_dir(gt_dir, db_names=names, dataset=spec.id)
    _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, gt_dir)
    return Benchmark(
        id=spec.id,
        gt=gt,
        database=_images(spec, ddir, gt.db_names, check=False),
        queries=_images(spec, ddir, gt.query_names),
        protocols=spec.protocols,
        root=ddir,
        crop=crop,
    )


def load_holidays(
    spec: DatasetSpec, ddir: Path, *, crop: CropConvention, strict: bool, options: dict[str, Any]
) -> Benchmark:
    """INRIA Holidays: ``holidays_images.dat`` plus ``jpg/`` (or ``jpg_rotated/``)."""
    from oxbench.formats.holidays import holidays_ground_truth, read_image_list

    orientation = str(options.get("orientation", "original"))
    folder = {"original": "jpg", "rotated": "jpg_rotated"}[orientation]
    names = read_image_list(_require_file(spec, ddir / "holidays_images.dat", "the image list"))
    gt = holidays_ground_truth(names, source=str(ddir / "holidays_images.dat"))
    _check_count(spec, "images", gt.n_db, spec.n_images, strict, ddir)
    _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
    if orientation == "rotated" and not (ddir / folder).is_dir():
        raise InputError(
            "orientation='rotated' needs the hand-rotated copy of the images in jpg_rotated/ "
            "(same 1,491 file names, turned upright); put it there or use orientation='original'",
            ddir / folder,
        )
    images = _images(spec, ddir, gt.db_names, folder)
    queries = _images(spec, ddir, gt.query_names, folder, check=False)
    return Benchmark(
        id=spec.id, gt=gt, database=images, queries=queries, protocols=spec.protocols, root=ddir,
        crop=crop, options={"orientation": orientation},
    )  # fmt: skip


def load_ukbench(
    spec: DatasetSpec, ddir: Path, *, crop: CropConvention, strict: bool, options: dict[str, Any]
) -> Benchmark:
    """UKBench: ``jpg/ukbench00000.jpg`` ... every image is a query."""
    from oxbench.formats.ukbench import ukbench_ground_truth

    n = spec.n_images
    if not strict:
        found = _jpg_stems(ddir / "jpg")
        n = len(found)
        if n == 0 or n % 4:
            raise InputError(
                f"found {n} UKBench images; need a positive multiple of 4", ddir / "jpg"
            )
        _check_count(spec, "images", n, spec.n_images, False, ddir / "jpg")
    gt = ukbench_ground_truth(n)
    images = _images(spec, ddir, gt.db_names)
    return Benchmark(
        id=spec.id,
        gt=gt,
        database=images,
        queries=images,
        protocols=spec.protocols,
        root=ddir,
        crop=crop,
    )


@dataclass(frozen=True, eq=False)
class ListedImages:
    """Images named by a list of relative file paths below a folder; paths are built on demand.

    Used for R1M, whose 1,001,001 list entries (``revisitop1m.txt``) are paths relative to
    ``jpg/`` with their extension; keeping the strings instead of a million ``Path`` objects saves
    memory. ``names[i]`` is ``files[i]`` without its extension.

    Attributes:
        folder: the image folder.
        files: relative paths (``/``-separated), in the official order.
    """

    folder: Path
    files: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.files)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.name(i) for i in range(len(self.files)))

    def name(self, i: int) -> str:
        f = self.files[i]
        dot = f.rfind(".")
        return f[:dot] if dot > f.rfind("/") else f

    def path(self, i: int) -> Path:
        return self.folder / self.files[i]

    def read(self, i: int) -> NDArray[np.uint8]:
        return read_image(self.path(i))

    def head(self, n: int) -> ListedImages:
        """The first ``n`` images."""
        return ListedImages(self.folder, self.files[:n])


def distractor_files(spec: DatasetSpec, ddir: Path) -> ListedImages:
    """The images of a distractor set as listed (no presence check).

    R1M: the entries of ``revisitop1m.txt`` (paths below ``jpg/``; an entry without an
    extension gets ``.jpg``). Oxford 100K (no official list): the sorted relative paths of the
    ``.jpg`` files below ``jpg/``.
    """
    if spec.id == "revisitop1m":
        lst = _require_file(spec, ddir / "revisitop1m.txt", "the image list")
        entries = [ln.strip() for ln in lst.read_text(encoding="utf-8").splitlines() if ln.strip()]
        files = tuple(e if "." in e.rsplit("/", 1)[-1] else e + _IMAGE_EXT for e in entries)
        if len(set(files)) != len(files):
            raise InputError("the image list names an image twice", lst)
    else:
        img_dir = ddir / "jpg"
        files = tuple(
            sorted(p.relative_to(img_dir).as_posix() for p in img_dir.rglob(f"*{_IMAGE_EXT}"))
        )
    return ListedImages(ddir / "jpg", files)


def load_distractor_set(
    spec: DatasetSpec, ddir: Path, *, strict: bool = True, limit: int | None = None
) -> ListedImages:
    """The images of a distractor set (R1M, Oxford 100K), in their official order.

    Only a deterministic sample of about 1,000 files is checked for presence here (a million
    ``stat`` calls can take minutes on network storage); ``verify`` checks every file.

    Raises:
        InputError: missing list or folder, a count that differs (``strict``), sampled files
            missing, ``limit`` larger than the set.
    """
    _require_dir(spec, ddir)
    imgs = distractor_files(spec, ddir)
    _check_count(spec, "images", len(imgs), spec.n_images, strict, ddir)
    if limit is not None:
        if limit < 0 or limit > len(imgs):
            raise InputError(f"asked for {limit} distractors but {spec.id} has {len(imgs)}", ddir)
        imgs = imgs.head(limit)
    step = max(1, len(imgs) // 1000)
    missing = [i for i in range(0, len(imgs), step) if not imgs.path(i).is_file()]
    if missing:
        raise InputError(
            f"image files of {spec.id} are missing (e.g. {imgs.files[missing[0]]}); "
            f"{_remedy(spec, ddir.parent)}",
            ddir / "jpg",
        )
    return imgs


def _default_distractors(spec: DatasetSpec) -> str:
    from oxbench.datasets.spec import DATASETS

    for other in DATASETS:
        if spec.id in get_spec(other).distractors_for:
            return other
    raise InputError(f"{spec.id} has no distractor set; pass a distractor set id")


def load(
    dataset_id: str,
    root: str | Path | None = None,
    *,
    distractors: str | int | None = None,
    crop: CropConvention = "python",
    strict: bool = True,
    progress: bool = True,
    **options: Any,
) -> Benchmark:
    """Load a benchmark from ``<root>/<dataset_id>/``.

    Args:
        dataset_id: a catalog id (``oxbench data list``).
        root: data root (``--root``; default ``$OXBENCH_DATA`` or the per-user default).
        distractors: a distractor set id (``"revisitop1m"``, ``"oxford100k"``) attached after the
            database -- distractor ``j`` has ranking index ``n_db + j``, as in
            ``oxbench evaluate --distractors`` -- or an int: the first N images of the dataset's
            default distractor set (for ``synthetic``: N generated distractors).
        crop: query-crop convention, ``"python"`` (default) or ``"matlab"``; recorded.
        strict: refuse counts that differ from the official ones (False: warn; for subsets).
        options: dataset options, e.g. ``orientation="original"|"rotated"`` for Holidays;
            recorded in ``Benchmark.options``.

    Raises:
        InputError: unknown id or option, missing files (with the fetch/import remedy),
            malformed ground truth, counts that differ (``strict``).
    """
    spec = get_spec(dataset_id)
    if crop not in ("python", "matlab"):
        raise InputError(f"unknown crop convention {crop!r}; use 'python' or 'matlab'")
    for key, value in options.items():
        allowed = spec.options.get(key)
        if allowed is None:
            known = ", ".join(sorted(spec.options)) or "none"
            raise InputError(f"{spec.id} has no option {key!r} (options: {known})")
        if str(value) not in allowed:
            raise InputError(
                f"{spec.id} option {key}={value!r} must be one of {', '.join(allowed)}"
            )
    base = data_root(root)
    ddir = base / spec.id
    if spec.synthetic:
        from oxbench.datasets.synthetic import ensure_default, load_synthetic

        ensure_default(base, progress=progress)  # generates (or finishes) the default cities; a no-op when complete
        if distractors is not None and not isinstance(distractors, int):
            raise InputError("the synthetic benchmark takes a number of generated distractors")
        return load_synthetic(ddir, distractors=distractors, crop=crop)
    if spec.distractors_for:
        raise InputError(
            f"{spec.id} is a distractor set; load it with "
            f"load({spec.distractors_for[0]!r}, distractors={spec.id!r})"
        )
    _require_dir(spec, ddir)
    loader = spec.resolve_loader()
    bench: Benchmark = loader(spec, ddir, crop=crop, strict=strict, options=dict(options))
    recorded = dict(bench.options)
    if not strict:
        recorded["strict"] = "false"
    if distractors is None:
        if recorded != dict(bench.options):
            bench = _replace(bench, options=recorded)
        return bench
    limit = None
    if isinstance(distractors, int) and not isinstance(distractors, bool):
        limit, distractors = distractors, _default_distractors(spec)
    dspec = get_spec(str(distractors))
    if not dspec.distractors_for:
        raise InputError(
            f"{dspec.id} is not a distractor set (distractor sets: revisitop1m, oxford100k)"
        )
    if spec.id not in dspec.distractors_for:
        log.warning(
            "%s is usually paired with %s, not %s",
            dspec.id,
            ", ".join(dspec.distractors_for),
            spec.id,
        )
    dimgs = load_distractor_set(dspec, base / dspec.id, strict=strict, limit=limit)
    recorded["distractors"] = dspec.id if limit is None else f"{dspec.id}[:{limit}]"
    return _replace(bench, distractors=dimgs, options=recorded)


def _replace(bench: Benchmark, **changes: Any) -> Benchmark:
    from dataclasses import replace

    return replace(bench, **changes)


def load_ground_truth(
    dataset_id: str, root: str | Path | None = None, *, strict: bool = True
) -> GroundTruth:
    """Only the ground truth of a dataset -- what scoring needs (``oxbench evaluate --dataset``).

    Image files are not checked, except that Oxford 5K / Paris 6K need their ``jpg/`` listing:
    their database order is the sorted image names (as in :func:`load`).

    Raises:
        InputError: unknown id, a distractor set, missing ground-truth files (with the remedy).
    """
    spec = get_spec(dataset_id)
    base = data_root(root)
    ddir = base / spec.id
    if spec.synthetic:
        return load(dataset_id, root).gt
    if spec.distractors_for:
        raise InputError(f"{spec.id} is a distractor set; it has no ground truth")
    _require_dir(spec, ddir)
    fam = spec.loader.rsplit(":", 1)[-1]
    if fam == "load_revisited":
        from oxbench.formats.revisitop import read_gnd

        gt = read_gnd(
            _require_file(spec, ddir / f"gnd_{spec.id}.pkl", "the ground truth"), dataset=spec.id
        )
        _check_count(spec, "database images", gt.n_db, spec.n_images, strict, ddir)
        return gt
    if fam == "load_holidays":
        from oxbench.formats.holidays import holidays_ground_truth, read_image_list

        lst = _require_file(spec, ddir / "holidays_images.dat", "the image list")
        return holidays_ground_truth(read_image_list(lst), source=str(lst))
    if fam == "load_ukbench":
        from oxbench.formats.ukbench import ukbench_ground_truth

        return ukbench_ground_truth(spec.n_images)
    return load(dataset_id, root, strict=strict).gt


def distractor_count(dataset_id: str, root: str | Path | None = None) -> int:
    """Number of images of a distractor set on disk (``len(revisitop1m.txt)`` for R1M)."""
    spec = get_spec(dataset_id)
    if not spec.distractors_for:
        raise InputError(
            f"{spec.id} is not a distractor set (distractor sets: revisitop1m, oxford100k)"
        )
    ddir = data_root(root) / spec.id
    _require_dir(spec, ddir)
    return len(distractor_files(spec, ddir))
