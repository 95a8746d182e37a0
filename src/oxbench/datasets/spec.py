"""The shape of a dataset entry.

This module holds only the mechanism: :class:`DatasetSpec` (what a benchmark is made of),
:class:`RemoteFile` (one file as its owners publish it) and :class:`DatasetFamily` (what a kind of
benchmark knows: its layout, its ground truth, the images it needs, how to load it). The families
and their entries are one module each in :mod:`oxbench.datasets.families`; the catalog of entries
by id is :mod:`oxbench.datasets.catalog`.

Checksums: where the owners publish none (none of these benchmarks does for its images), the entry
says ``checksum_policy == "lock"``: the first verified download records size and SHA-256 in the data
root's lock file (``oxbench.lock.json``) and every later ``fetch``/``verify`` checks against it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, ClassVar, Literal

from oxbench.errors import InputError

if TYPE_CHECKING:
    from oxbench.datasets.base import Benchmark, CropConvention
    from oxbench.groundtruth import GroundTruth

ExtractMode = Literal["flat", "tree"]

#: A dataset id: its folder's name under the data root.
_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_HEX = {"sha256": re.compile(r"[0-9a-f]{64}"), "md5": re.compile(r"[0-9a-f]{32}")}
#: The schemes a download may use.
URL_SCHEMES = ("https://", "http://", "ftp://")


def _inside(path: str | None, what: str, *, single: bool = False) -> None:
    """Refuse a declared path that could leave the dataset folder (absolute, ``..``, a drive, a
    NUL); ``single``: a plain file name, no folder part. The one check of every path an entry
    declares, so a plugin's entry cannot make fetch, import or verify write or read outside it."""
    if path is None:
        return
    parts = PurePosixPath(path).parts if isinstance(path, str) else ()
    bad = (
        not isinstance(path, str)
        or not path
        or "\x00" in path
        or "\\" in path
        or path.startswith("/")
        or ".." in parts
        or (len(path) > 1 and path[1] == ":")
        or (single and (len(parts) != 1 or path in (".", "")))
    )
    if bad:
        kind = "a plain file name" if single else "a relative path inside the dataset folder"
        raise InputError(f"{what} must be {kind}, got {path!r}")


#: Name of the lock file kept at the data root.
LOCK_FILE = "oxbench.lock.json"

#: Text shown by ``info`` for files without a published checksum.
LOCK_POLICY_TEXT = (
    "no checksum is published by the owners: the first verified download records size and SHA-256 "
    f"in the data root's lock file ({LOCK_FILE}) and every later fetch/verify checks against it"
)


@dataclass(frozen=True)
class Placement:
    """Where the members of an archive (or the files of an imported folder) go.

    Attributes:
        pattern: ``fnmatch`` pattern on the file's base name (``"*.jpg"``, ``"*_query.txt"``).
        into: folder relative to the dataset folder (``"jpg"``, ``"gt_files_170407"``).
        mode: ``"flat"`` puts every match directly in ``into`` (Oxford/Paris/Holidays archives nest
            their images in varying folders); ``"tree"`` keeps the member's relative path below
            ``into`` (R1M, whose list names sub-folders), dropping a leading ``strip`` folder.
        strip: leading folder dropped in ``"tree"`` mode (``"jpg"``).
        exclude: ``fnmatch`` pattern on the relative path of files to leave out (UKBench's
            ``thumbnails/``).

    Patterns are matched against the file's relative path (``/``-separated) when they contain a
    ``/``, else against its base name.
    """

    pattern: str
    into: str
    mode: ExtractMode = "flat"
    strip: str | None = None
    exclude: str | None = None

    def __post_init__(self) -> None:
        _inside(self.into, f"placement {self.pattern!r}: into")
        if self.mode not in ("flat", "tree"):
            raise InputError(
                f"placement {self.pattern!r}: mode must be flat or tree, got {self.mode!r}"
            )

    def matches(self, rel_path: str) -> bool:
        """Whether a file at ``rel_path`` (relative, ``/``-separated) is placed by this rule."""
        from fnmatch import fnmatchcase

        subject = rel_path if "/" in self.pattern else rel_path.rsplit("/", 1)[-1]
        if not fnmatchcase(subject, self.pattern):
            return False
        return not (self.exclude and fnmatchcase(rel_path, self.exclude))

    def target(self, rel_path: str) -> str:
        """Destination of a matching file, relative to the dataset folder."""
        if self.mode == "flat":
            rel = rel_path.rsplit("/", 1)[-1]
        else:
            parts = rel_path.split("/")
            if self.strip and len(parts) > 1 and parts[0] == self.strip:
                parts = parts[1:]
            rel = "/".join(parts)
        return rel if self.into in (".", "") else f"{self.into}/{rel}"


@dataclass(frozen=True)
class RemoteFile:
    """One file as published by the dataset owners.

    Attributes:
        name: local file name (in ``<root>/<id>/downloads/`` for archives, or at ``dest``).
        urls: official URLs, preferred first (later ones are mirrors the owners name).
        size: exact size in bytes when known, else ``None``.
        approx_size: rough size in bytes, for the free-disk check when ``size`` is unknown.
        sha256, md5: published checksums, when known (else the lock-file policy applies).
        archive: True if the file is an archive to extract with ``placements``.
        dest: for plain files, the path relative to the dataset folder (default: ``name``).
        placements: how archive members are laid out (archives only).
        optional: a file the dataset can do without (e.g. Paris ``corrupt.txt``): a failed
            download is a warning, not an error.
    """

    name: str
    urls: tuple[str, ...]
    size: int | None = None
    approx_size: int | None = None
    sha256: str | None = None
    md5: str | None = None
    archive: bool = False
    dest: str | None = None
    placements: tuple[Placement, ...] = ()
    optional: bool = False

    def __post_init__(self) -> None:
        _inside(self.name, "file name", single=True)
        _inside(self.dest, f"file {self.name}: dest")
        if not self.urls or any(
            not isinstance(u, str) or not u.startswith(URL_SCHEMES) or any(c.isspace() for c in u)
            for u in self.urls
        ):
            raise InputError(
                f"file {self.name}: urls must be one or more {', '.join(URL_SCHEMES)} addresses, "
                f"got {self.urls!r}"
            )
        for what in ("size", "approx_size"):
            value = getattr(self, what)
            if value is not None and (type(value) is not int or value < 0):
                raise InputError(
                    f"file {self.name}: {what} must be a whole number of bytes, got {value!r}"
                )
        for what, pattern in _HEX.items():
            value = getattr(self, what)
            if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
                raise InputError(
                    f"file {self.name}: {what} must be lower-case hex digits, got {value!r}"
                )

    @property
    def checksum_policy(self) -> Literal["published", "lock"]:
        """``"published"`` when a checksum is pinned here, else ``"lock"`` (first download records)."""
        return "published" if (self.sha256 or self.md5) else "lock"

    @property
    def local_path(self) -> str:
        """Path of the downloaded file relative to the dataset folder."""
        if self.archive:
            return f"downloads/{self.name}"
        return self.dest or self.name


@dataclass(frozen=True)
class CountCheck:
    """One count ``verify`` compares with the official figure.

    Attributes:
        what: what is counted (``"database images"``).
        expected: the official figure.
        files: the image files (relative to the dataset folder) this count is about; unless
            ``found`` is given, ``verify`` counts those present on disk.
        listed: how many the ground truth or list names, where one does.
        found: a count that is not about image files (queries in the text ground truth).
    """

    what: str
    expected: int
    files: tuple[str, ...] = ()
    listed: int | None = None
    found: int | None = None


@dataclass(frozen=True)
class VerifyPlan:
    """What ``verify`` must check in one dataset folder, as its family sees it.

    Attributes:
        files: every image file to check, relative to the dataset folder (``"jpg/x.jpg"``).
        counts: the counts to compare with the official figures.
        ground_truth: problems found in the ground truth while planning (one line each).
        sha256: expected SHA-256 of image files, where recorded (generated sets).
        checksums: problems with other recorded checksums (one line each).
        checksums_ok: names of files whose recorded checksum matched.
    """

    files: tuple[str, ...]
    counts: tuple[CountCheck, ...] = ()
    ground_truth: tuple[str, ...] = ()
    sha256: Mapping[str, str] = field(default_factory=dict)
    checksums: tuple[str, ...] = ()
    checksums_ok: tuple[str, ...] = ()


class DatasetFamily(ABC):
    """A kind of benchmark (revisited, original Oxford/Paris, Holidays, ...): one object per entry.

    The one place that knows how such a dataset sits in ``<root>/<id>/``: the files it needs, its
    ground truth, the images ``verify`` checks and how ``load`` builds a
    :class:`~oxbench.datasets.base.Benchmark`. Implementations: :mod:`oxbench.datasets.families`.
    Methods receive the entry (counts, id) and the dataset folder; they do no I/O outside it.
    """

    #: True for a dataset generated locally (nothing to fetch or import).
    generated: ClassVar[bool] = False
    #: True for a family that makes its own distractors (``load`` gets the ``distractors`` asked
    #: for); the others get ``None`` and :func:`oxbench.datasets.load` attaches a distractor set.
    own_distractors: ClassVar[bool] = False

    @abstractmethod
    def layout(self, spec: DatasetSpec) -> tuple[Placement, ...]:
        """Where imported images and ground-truth files go."""

    @abstractmethod
    def required_files(self, spec: DatasetSpec) -> tuple[str, ...]:
        """Files or folders besides the images that an installed copy has (relative paths)."""

    @abstractmethod
    def expected_image_files(self, spec: DatasetSpec, ddir: Path) -> int:
        """How many image files below ``jpg/`` a complete copy has."""

    @abstractmethod
    def ground_truth(self, spec: DatasetSpec, ddir: Path, *, strict: bool) -> GroundTruth:
        """The ground truth, reading as few image files as the family allows.

        Raises:
            InputError: missing or malformed files (with the remedy); counts that differ from
                the official ones (``strict``); a set without ground truth.
        """

    @abstractmethod
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
        """The benchmark (see :func:`oxbench.datasets.load`; options are already validated)."""

    @abstractmethod
    def verify_plan(self, spec: DatasetSpec, ddir: Path) -> VerifyPlan:
        """What ``verify`` checks; problems met on the way go in the plan, not raised."""

    def image_free_options(self, spec: DatasetSpec, ddir: Path) -> dict[str, str] | None:
        """What identifies the copy in ``ddir`` when it is read from its ground truth alone (a run
        that reads no pixel), recorded in ``Benchmark.options`` beside ``images: not used``; ``None``
        when there is no copy to read yet and :meth:`load` must make it (a generated set not
        generated). Default: nothing more (``{}``)."""
        return {}

    def write_example(self, spec: DatasetSpec, ddir: Path) -> None:
        """Write a tiny copy of the dataset into ``ddir`` in its layout: a few images, the ground
        truth files (what :func:`oxbench.testing.check_dataset` loads and scores; load it with
        ``strict=False``, its counts are not the official ones)."""
        raise NotImplementedError(
            f"{type(self).__name__} writes no example copy: implement write_example(spec, ddir)"
        )

    def image_test(self, spec: DatasetSpec, ddir: Path) -> Callable[[str], bool]:
        """Whether a file laid out at a path (relative to the dataset folder) belongs there.

        Used by ``import`` to leave out images that are none of the dataset's. The default takes
        every file; families with an image list (on disk in ``ddir``) or a known naming scheme
        refuse ``.jpg`` files outside it.
        """
        return _take_all


def _take_all(rel_path: str) -> bool:
    return True


@dataclass(frozen=True)
class DatasetSpec:
    """A benchmark as a declarative entry.

    Attributes:
        id: the id used everywhere (``roxford5k``); the data lives in ``<root>/<id>/``.
        title: human name.
        homepage: the owners' page.
        description: one paragraph: what it is, quirks a user must know.
        n_images: expected database size (as loaded; see ``counts_note``).
        n_queries: expected number of queries (0 for distractor sets).
        counts_note: the official vs. practical counts (5,062 vs 5,063 ...).
        protocols: scoring protocols that apply (``("revisited",)``...); empty for distractor sets.
        files: what to download.
        terms: terms of use, shown before the first fetch.
        belongs_with: ids this set is used together with (ROxford + R1M).
        distractors_for: for a distractor set, the ids it is added to.
        expected_corrupt: image names (no extension) known to be undecodable in the official
            archives; ``verify`` reports them as expected, not as errors.
        family: the kind of benchmark (:class:`DatasetFamily`): it knows the layout, ground truth,
            needed images and loading; :attr:`layout` comes from it.
        options: the accepted ``load(..., **options)`` keys with their allowed values.
        citation: the paper to cite.
    """

    id: str
    title: str
    homepage: str
    description: str
    n_images: int
    n_queries: int
    counts_note: str
    protocols: tuple[str, ...]
    files: tuple[RemoteFile, ...]
    terms: str
    family: DatasetFamily
    belongs_with: tuple[str, ...] = ()
    distractors_for: tuple[str, ...] = ()
    expected_corrupt: tuple[str, ...] = ()
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    citation: str = ""

    def __post_init__(self) -> None:
        if not (isinstance(self.id, str) and _ID.fullmatch(self.id)):
            raise InputError(
                f"dataset id must be 1-64 of a-z 0-9 . _ - (its folder's name), got {self.id!r}"
            )
        for what in ("n_images", "n_queries"):
            value = getattr(self, what)
            if type(value) is not int or value < 0:
                raise InputError(f"dataset {self.id}: {what} must be a whole number, got {value!r}")
        names = [f.name for f in self.files]
        if len(set(names)) != len(names):
            raise InputError(f"dataset {self.id}: two files are named alike ({sorted(names)})")

    @property
    def layout(self) -> tuple[Placement, ...]:
        """How an imported folder or archive is laid out (see :class:`Placement`): the family's
        images and ground truth, plus every plain (non-archive) file the entry downloads."""
        own = tuple(self.family.layout(self))
        if not all(isinstance(p, Placement) for p in own):
            raise InputError(
                f"dataset {self.id}: its family's layout() must give Placement entries, got "
                f"{sorted({type(p).__name__ for p in own})}"
            )
        plain = tuple(
            Placement(f.name, f.local_path.rpartition("/")[0] or ".")
            for f in self.files
            if not f.archive
        )
        return own + tuple(p for p in plain if p not in own)

    @property
    def synthetic(self) -> bool:
        """Whether the dataset is generated locally rather than downloaded or imported."""
        return self.family.generated

    @property
    def checksum_policy(self) -> str:
        """One line saying how the files are checked."""
        policies = {f.checksum_policy for f in self.files}
        if not self.files:
            if self.synthetic:
                return "generated locally; nothing to download"
            return (
                "oxbench downloads none of its files: import a copy you have (oxbench data import)"
            )
        if policies == {"published"}:
            return "published checksums are pinned in the catalog"
        return LOCK_POLICY_TEXT

    @property
    def download_size(self) -> int:
        """Rough total download size in bytes (exact where sizes are known)."""
        return sum(f.size if f.size is not None else (f.approx_size or 0) for f in self.files)
