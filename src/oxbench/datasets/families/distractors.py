"""Distractor sets: R1M (the order of its official list) and Oxford 100K (sorted names): images
only, attached after another dataset's database (distractor ``j`` has ranking index ``n_db + j``)
by :func:`oxbench.datasets.load`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark, CropConvention, read_image
from oxbench.datasets.catalog import register
from oxbench.datasets.families._oxford_paris import VGG_OX, VGG_TERMS
from oxbench.datasets.ondisk import (
    IMAGE_DIR,
    IMAGE_EXT,
    OnDisk,
    check_count,
    remedy,
    require_dir,
    require_file,
    write_tiny_jpegs,
)
from oxbench.datasets.spec import CountCheck, DatasetSpec, Placement, RemoteFile, VerifyPlan
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

_R1M = "http://ptak.felk.cvut.cz/revisitop/revisitop1m"
_GB = 1_000_000_000
_MB = 1_000_000


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
class Distractors(OnDisk):
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
        lst = require_file(spec, ddir, self.list_file, "the image list")
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
        check_count(spec, "images", len(imgs), spec.n_images, strict, ddir)
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

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Five distractor images (in two sub-folders, listed, where the set has a list)."""
        files = ["a/d0.jpg", "a/d1.jpg", "b/d2.jpg", "b/d3.jpg", "b/d4.jpg"]
        ddir.mkdir(parents=True, exist_ok=True)
        if self.list_file is not None:
            (ddir / self.list_file).write_text("".join(f"{f}\n" for f in files))
        write_tiny_jpegs(ddir / IMAGE_DIR, [f[: -len(IMAGE_EXT)] for f in files])


register(DatasetSpec(
    id="revisitop1m",
    title="Revisited 1M distractors (R1M)",
    homepage="http://cmp.felk.cvut.cz/revisitop/",
    description=(
        "1,001,001 distractor images from YFCC100M (1024x768), hard negatives for ROxford/RParis, "
        "in 100 archives revisitop1m.{1..100}.tar.gz plus the image list revisitop1m.txt. "
        "Distractor j gets ranking index n_db + j, in the list's order."
    ),
    n_images=1_001_001,
    n_queries=0,
    counts_note="1,001,001 images, listed in revisitop1m.txt",
    protocols=(),
    files=(
        RemoteFile(name="revisitop1m.txt", urls=(f"{_R1M}/revisitop1m.txt",), approx_size=40 * _MB),
        *(
            RemoteFile(
                name=f"revisitop1m.{i}.tar.gz",
                urls=(f"{_R1M}/jpg/revisitop1m.{i}.tar.gz",),
                approx_size=3 * _GB,
                archive=True,
                placements=(Placement("*.jpg", "jpg", mode="tree", strip="jpg"),),
            )
            for i in range(1, 101)
        ),
    ),
    terms=(
        "The R1M images come from the Yahoo Flickr Creative Commons 100M dataset (YFCC100M); each "
        "image keeps its own Creative Commons licence, recorded with the photo on Flickr. The set "
        "is distributed by CTU Prague (http://cmp.felk.cvut.cz/revisitop/) for research; cite "
        "Radenovic et al., CVPR 2018. About 300 GB of downloads."
    ),
    family=Distractors(list_file="revisitop1m.txt"),
    distractors_for=("roxford5k", "rparis6k"),
    citation="F. Radenovic et al., Revisiting Oxford and Paris, CVPR 2018",
))  # fmt: skip

register(DatasetSpec(
    id="oxford100k",
    title="Oxford 100K distractors (Flickr 100K)",
    homepage=f"{VGG_OX}/",
    description=(
        "99,782 Flickr images used as distractors for Oxford 5K / Paris 6K (Oxford 105K). Not "
        "cleaned: it contains some landmark images. VGG's page no longer offers the archive; "
        "import a copy you have with `oxbench data import oxford100k --from PATH`."
    ),
    n_images=99_782,
    n_queries=0,
    counts_note="99,782 images (distractor j gets ranking index n_db + j, in sorted name order)",
    protocols=(),
    files=(),
    terms=VGG_TERMS.format(name="Oxford 100K distractor", page=f"{VGG_OX}/"),
    family=Distractors(),  # no official list: distractor j is the j-th sorted name
    distractors_for=("oxford5k", "paris6k"),
    citation="J. Philbin et al., Object retrieval with large vocabularies and fast spatial matching, CVPR 2007",
))  # fmt: skip
