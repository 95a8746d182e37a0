"""The dataset families: one class per kind of benchmark, one object behind each catalog entry.

Each family (see :class:`~oxbench.datasets.spec.DatasetFamily`) is the one place that knows, for
its kind of dataset, the layout in ``<root>/<id>/``, how to read the ground truth (without images
where the format allows), which images ``verify`` checks and how ``load`` builds the
:class:`~oxbench.datasets.base.Benchmark`:

- :class:`Revisited`: ROxford / RParis, ``gnd_<id>.pkl`` plus ``jpg/``;
- :class:`Original`: Oxford 5K / Paris 6K, the text ground truth plus every usable image in ``jpg/``;
- :class:`Holidays`: ``holidays_images.dat`` plus ``jpg/`` (or ``jpg_rotated/``);
- :class:`UKBench`: ``jpg/ukbench00000.jpg`` ...;
- :class:`Distractors`: R1M (the order of its official list) and Oxford 100K (sorted names);
- :class:`Synthetic`: the generated city, built on first ``load``.

Database order:

- revisited sets, Holidays: the order of the official list (``imlist``, ``holidays_images.dat``);
- Oxford 5K / Paris 6K (original protocol): the sorted image names found in ``jpg/`` (Paris minus
  its 20 corrupt images) -- the text files name images, not indices;
- UKBench: ``ukbench00000`` ... ``ukbench10199``;
- distractors: the order of the list file the entry declares (R1M's ``revisitop1m.txt``), else
  the sorted relative paths (Oxford 100K).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark, CropConvention, FileImages, read_image
from oxbench.datasets.spec import (
    DATASETS,
    CountCheck,
    DatasetFamily,
    DatasetSpec,
    Placement,
    VerifyPlan,
    get_spec,
)
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

IMAGE_EXT = ".jpg"
IMAGE_DIR = "jpg"


# --- helpers shared by the families whose files are fetched or imported -------------------------


def remedy(spec: DatasetSpec, root: Path) -> str:
    """How to get ``spec`` into the data root ``root`` (one clause for an error message)."""
    if spec.synthetic:
        return (
            f"make it with `oxbench data synth --name {spec.id} --root {root}` "
            "(or `oxbench run`, which builds it on first use)"
        )
    how = f"`oxbench data fetch {spec.id} --root {root}`" if spec.files else ""
    imp = f"`oxbench data import {spec.id} --root {root} --from PATH`"
    return f"get it with {how} or {imp}" if how else f"get it with {imp}"


def require_dir(spec: DatasetSpec, ddir: Path) -> None:
    """Refuse a dataset folder that does not exist (with the remedy)."""
    if not ddir.is_dir():
        raise InputError(f"dataset {spec.id} is not on disk; {remedy(spec, ddir.parent)}", ddir)


def _require_file(spec: DatasetSpec, ddir: Path, rel: str, what: str) -> Path:
    require_dir(spec, ddir)
    path = ddir / rel
    if not path.is_file():
        raise InputError(f"{what} of {spec.id} is missing; {remedy(spec, ddir.parent)}", path)
    return path


def _image_files(names: Sequence[str], folder: str = IMAGE_DIR) -> tuple[str, ...]:
    return tuple(f"{folder}/{n}{IMAGE_EXT}" for n in names)


def _images(
    spec: DatasetSpec,
    ddir: Path,
    names: Sequence[str],
    folder: str = IMAGE_DIR,
    *,
    check: bool = True,
) -> FileImages:
    img_dir = ddir / folder
    paths = tuple(img_dir / f"{n}{IMAGE_EXT}" for n in names)
    if check:
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise InputError(
                f"{len(missing)} of {len(paths)} image(s) of {spec.id} are missing (first: "
                f"{missing[0].name}); {remedy(spec, ddir.parent)}",
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


def jpg_stems(img_dir: Path) -> list[str]:
    """Sorted names (without ``.jpg``) of the images directly in ``img_dir`` (none if absent)."""
    if not img_dir.is_dir():
        return []
    return sorted(
        e.name[: -len(IMAGE_EXT)] for e in os.scandir(img_dir) if e.name.endswith(IMAGE_EXT)
    )


def _names_test(
    names: frozenset[str] | None, pattern: re.Pattern[str] | None
) -> Callable[[str], bool]:
    """``image_test`` from a set of image names (preferred) or a name pattern (else all taken)."""

    def test(rel: str) -> bool:
        if not rel.endswith(IMAGE_EXT) or not rel.startswith(f"{IMAGE_DIR}/"):
            return True  # ground truth, lists: checked against the lock file, not by name
        stem = rel[len(IMAGE_DIR) + 1 : -len(IMAGE_EXT)]
        if names is not None:
            return stem in names
        return pattern is None or pattern.fullmatch(stem) is not None

    return test


class _OnDisk(DatasetFamily):
    """A family whose files are fetched or imported: loading is ``_benchmark`` plus distractors."""

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return ()

    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        return spec.n_images

    #: Whether ``load`` checks that every database image exists (not where the database is the
    #: listing of ``jpg/`` itself).
    check_database: ClassVar[bool] = True

    def _benchmark(
        self,
        spec: DatasetSpec,
        ddir: Path,
        *,
        crop: CropConvention,
        strict: bool,
        options: Mapping[str, str],
    ) -> Benchmark:
        """Ground truth plus ``jpg/<name>.jpg`` for database and query images."""
        gt = self.ground_truth(spec, ddir, strict=strict)
        return Benchmark(
            id=spec.id,
            gt=gt,
            database=_images(spec, ddir, gt.db_names, check=self.check_database),
            queries=_images(spec, ddir, gt.query_names),
            protocols=spec.protocols,
            root=ddir,
            crop=crop,
        )

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
        require_dir(spec, ddir)
        bench = self._benchmark(spec, ddir, crop=crop, strict=strict, options=options)
        recorded = dict(bench.options)
        if not strict:
            recorded["strict"] = "false"
        if distractors is None:
            return bench if recorded == dict(bench.options) else replace(bench, options=recorded)
        limit = None
        if isinstance(distractors, int) and not isinstance(distractors, bool):
            limit, distractors = distractors, _default_distractors(spec)
        dspec = get_spec(str(distractors))
        if not isinstance(dspec.family, Distractors):
            raise not_a_distractor_set(dspec)
        if (
            spec.id not in dspec.distractors_for
        ):  # another benchmark's distractors give numbers no paper has
            try:
                right = f"; {spec.id}'s is {_default_distractors(spec)}"
            except InputError:
                right = ""
            raise InputError(
                f"{dspec.id} holds the distractors of {', '.join(dspec.distractors_for)}, not of {spec.id}{right}"
            )
        dimgs = dspec.family.images(dspec, ddir.parent / dspec.id, strict=strict, limit=limit)
        recorded["distractors"] = dspec.id if limit is None else f"{dspec.id}[:{limit}]"
        return replace(bench, distractors=dimgs, options=recorded)


def not_a_distractor_set(spec: DatasetSpec) -> InputError:
    """The error for a distractor set id that names another kind of dataset."""
    sets = ", ".join(i for i in DATASETS if isinstance(get_spec(i).family, Distractors))
    return InputError(f"{spec.id} is not a distractor set (distractor sets: {sets})")


def _default_distractors(spec: DatasetSpec) -> str:
    for other in DATASETS:
        if spec.id in get_spec(other).distractors_for:
            return other
    raise InputError(f"{spec.id} has no distractor set; pass a distractor set id")


# --- revisited --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Revisited(_OnDisk):
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
            _require_file(spec, ddir, self._gnd(spec), "the ground truth"), dataset=spec.id
        )

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        gt = self._read(spec, ddir)
        if gt.protocol not in spec.protocols:
            raise InputError(
                f"expected the revisited ground truth (easy/hard/junk), got {gt.protocol}",
                gt.source,
            )
        _check_count(spec, "database images", gt.n_db, spec.n_images, strict, ddir)
        _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
        return gt

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            gt = self._read(spec, ddir)
        except InputError as exc:
            return VerifyPlan(_image_files(jpg_stems(ddir / IMAGE_DIR)), ground_truth=(str(exc),))
        problems = []
        overlap = sorted(set(gt.query_names) & set(gt.db_names))
        if overlap:
            problems.append(f"{len(overlap)} query image(s) are in the database, e.g. {overlap[0]}")
        if gt.protocol not in spec.protocols:
            problems.append(
                f"{self._gnd(spec)} holds {gt.protocol}-protocol labels, not revisited ones"
            )
        db, queries = _image_files(gt.db_names), _image_files(gt.query_names)
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
        return _names_test(names, None if self.names is None else re.compile(self.names))


# --- original Oxford / Paris -------------------------------------------------------------------


def text_gt_placements(into: str) -> tuple[Placement, ...]:
    """The four text ground-truth files of each query, laid out in ``into``."""
    return tuple(Placement(f"*_{kind}.txt", into) for kind in ("good", "ok", "junk", "query"))


@dataclass(frozen=True)
class Original(_OnDisk):
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
        _check_count(spec, "usable images", len(names), spec.n_images, strict, ddir / IMAGE_DIR)
        gt = read_gt_dir(gt_dir, db_names=names, dataset=spec.id)
        _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, gt_dir)
        return gt

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        from oxbench.formats.oxford_gt import read_gt_dir

        on_disk = _image_files(jpg_stems(ddir / IMAGE_DIR))
        usable = self._usable(spec, ddir)
        counts = [CountCheck("usable images", spec.n_images, _image_files(usable))]
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
        return _names_test(None, None if self.names is None else re.compile(self.names))


# --- Holidays ----------------------------------------------------------------------------------


_HOLIDAYS_LIST = "holidays_images.dat"
_HOLIDAYS_FOLDERS = {"original": IMAGE_DIR, "rotated": "jpg_rotated"}


@dataclass(frozen=True)
class Holidays(_OnDisk):
    """INRIA Holidays: ``holidays_images.dat`` plus ``jpg/`` and, optionally, ``jpg_rotated/``
    (the same file names turned upright by hand; option ``orientation="rotated"``)."""

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        return (Placement(_HOLIDAYS_LIST, "."), Placement(f"*{IMAGE_EXT}", IMAGE_DIR))

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return (_HOLIDAYS_LIST,)

    def _read(self, spec: DatasetSpec, ddir: Path) -> GroundTruth:
        from oxbench.formats.holidays import holidays_ground_truth, read_image_list

        lst = _require_file(spec, ddir, _HOLIDAYS_LIST, "the image list")
        return holidays_ground_truth(read_image_list(lst), source=str(lst))

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        gt = self._read(spec, ddir)
        _check_count(spec, "images", gt.n_db, spec.n_images, strict, ddir)
        _check_count(spec, "queries", gt.n_queries, spec.n_queries, strict, ddir)
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
        images = _images(spec, ddir, gt.db_names, folder)
        queries = _images(spec, ddir, gt.query_names, folder, check=False)
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
            return VerifyPlan(_image_files(jpg_stems(ddir / IMAGE_DIR)), ground_truth=(str(exc),))
        images = _image_files(gt.db_names)
        counts = [
            CountCheck("images", spec.n_images, images, listed=gt.n_db),
            CountCheck(
                "query images", spec.n_queries, _image_files(gt.query_names), listed=gt.n_queries
            ),
        ]
        rotated = _HOLIDAYS_FOLDERS["rotated"]
        if (ddir / rotated).is_dir():  # the hand-rotated copy must hold the same images
            rot = _image_files(gt.db_names, rotated)
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
        return _names_test(names, re.compile(r"\d{6}"))


# --- UKBench -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class UKBench(_OnDisk):
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
            _check_count(spec, "images", n, spec.n_images, False, ddir / IMAGE_DIR)
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

    def _names(self, spec: DatasetSpec) -> list[str]:
        from oxbench.formats.ukbench import ukbench_name

        return [ukbench_name(i) for i in range(spec.n_images)]

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        files = _image_files(self._names(spec))
        return VerifyPlan(files, counts=(CountCheck("images", spec.n_images, files),))

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        return _names_test(frozenset(self._names(spec)), None)


# --- distractors -------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Distractors(_OnDisk):
    """A distractor set (R1M, Oxford 100K): images only, attached after another dataset's database.

    Distractor ``j`` has ranking index ``n_db + j``, so the order is part of the benchmark.

    Attributes:
        list_file: the official list whose order defines the distractor indices (R1M's
            ``revisitop1m.txt``: paths below ``jpg/``, an entry without an extension gets
            ``.jpg``); the images keep their sub-folders. ``None`` (Oxford 100K, which has no
            official list): the sorted relative paths of the ``.jpg`` files below ``jpg/``.
    """

    list_file: str | None = None

    @property
    def order(self) -> str:
        """``"listed"`` (the list file's order) or ``"sorted"`` (sorted relative paths)."""
        return "sorted" if self.list_file is None else "listed"

    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        if self.list_file is None:
            return (Placement(f"*{IMAGE_EXT}", IMAGE_DIR),)
        return (
            Placement(self.list_file, "."),
            Placement(f"*{IMAGE_EXT}", IMAGE_DIR, mode="tree", strip=IMAGE_DIR),
        )

    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        return () if self.list_file is None else (self.list_file,)

    def files(self, spec: DatasetSpec, ddir: Path) -> ListedImages:
        """The images as listed (no presence check)."""
        img_dir = ddir / IMAGE_DIR
        if self.list_file is None:
            require_dir(spec, ddir)
            files = tuple(
                sorted(p.relative_to(img_dir).as_posix() for p in img_dir.rglob(f"*{IMAGE_EXT}"))
            )
            return ListedImages(img_dir, files)
        lst = _require_file(spec, ddir, self.list_file, "the image list")
        entries = [ln.strip() for ln in lst.read_text(encoding="utf-8").splitlines() if ln.strip()]
        files = tuple(e if "." in e.rsplit("/", 1)[-1] else e + IMAGE_EXT for e in entries)
        if len(set(files)) != len(files):
            raise InputError("the image list names an image twice", lst)
        return ListedImages(img_dir, files)

    def images(
        self, spec: DatasetSpec, ddir: Path, *, strict: bool = True, limit: int | None = None
    ) -> ListedImages:
        """The images in their official order, for attaching after a database.

        Only a deterministic sample of about 1,000 files is checked for presence here (a million
        ``stat`` calls can take minutes on network storage); ``verify`` checks every file.

        Raises:
            InputError: missing list or folder, a count that differs (``strict``), sampled files
                missing, ``limit`` larger than the set.
        """
        require_dir(spec, ddir)
        imgs = self.files(spec, ddir)
        _check_count(spec, "images", len(imgs), spec.n_images, strict, ddir)
        if limit is not None:
            if limit < 0 or limit > len(imgs):
                raise InputError(
                    f"asked for {limit} distractors but {spec.id} has {len(imgs)}", ddir
                )
            imgs = imgs.head(limit)
        step = max(1, len(imgs) // 1000)
        missing = [i for i in range(0, len(imgs), step) if not imgs.path(i).is_file()]
        if missing:
            raise InputError(
                f"image files of {spec.id} are missing (e.g. {imgs.files[missing[0]]}); "
                f"{remedy(spec, ddir.parent)}",
                ddir / IMAGE_DIR,
            )
        return imgs

    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        raise InputError(f"{spec.id} is a distractor set; it has no ground truth")

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
        paired = spec.distractors_for[0] if spec.distractors_for else "roxford5k"
        raise InputError(
            f"{spec.id} is a distractor set; load it with load({paired!r}, distractors={spec.id!r})"
        )

    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        try:
            imgs = self.files(spec, ddir)
        except InputError as exc:
            return VerifyPlan((), ground_truth=(str(exc),))
        files = tuple(f"{IMAGE_DIR}/{f}" for f in imgs.files)
        listed = len(files) if self.list_file is not None else None
        return VerifyPlan(
            files, counts=(CountCheck("images", spec.n_images, files, listed=listed),)
        )

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        if self.list_file is None or not (ddir / self.list_file).is_file():
            return super().image_test(spec, ddir)
        try:
            listed = frozenset(self.files(spec, ddir).files)
        except InputError:
            return super().image_test(spec, ddir)
        prefix = f"{IMAGE_DIR}/"
        return lambda rel: (
            not (rel.startswith(prefix) and rel.endswith(IMAGE_EXT)) or rel[len(prefix) :] in listed
        )


# --- synthetic ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synthetic(DatasetFamily):
    """The generated city (:mod:`oxbench.datasets.synthetic`): ``manifest.json`` (written last,
    the mark of a complete set), ``gnd_<id>.pkl``, ``gt_files/`` and ``jpg/``.

    Only :meth:`load` generates: it builds the default test and training cities on first use.
    Reading the ground truth or verifying never does; they say how to make the set.
    """

    generated = True

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
        db_files, q_files = _image_files([n for n, _ in db]), _image_files([n for n, _ in qs])
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
