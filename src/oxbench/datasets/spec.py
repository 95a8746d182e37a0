"""The shape of a dataset entry, and the registry of entries.

This module holds only the mechanism: :class:`DatasetSpec` (what a benchmark is made of) and
:class:`RemoteFile` (one file as its owners publish it). The entries themselves are short
declarations in :mod:`oxbench.datasets.catalog`, imported on the first lookup.

Checksums: where the owners publish none (none of these benchmarks does for its images), the entry
says ``checksum_policy == "lock"``: the first verified download records size and SHA-256 in the data
root's lock file (``oxbench.lock.json``) and every later ``fetch``/``verify`` checks against it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Literal

from oxbench.registry import Registry

ExtractMode = Literal["flat", "tree"]

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
        layout: how an imported folder or archive is laid out (see :class:`Placement`).
        terms: terms of use, shown before the first fetch.
        belongs_with: ids this set is used together with (ROxford + R1M).
        distractors_for: for a distractor set, the ids it is added to.
        expected_corrupt: image names (no extension) known to be undecodable in the official
            archives; ``verify`` reports them as expected, not as errors.
        loader: ``"module:function"`` that builds the :class:`~oxbench.datasets.base.Benchmark`.
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
    layout: tuple[Placement, ...]
    terms: str
    loader: str
    belongs_with: tuple[str, ...] = ()
    distractors_for: tuple[str, ...] = ()
    expected_corrupt: tuple[str, ...] = ()
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)
    citation: str = ""
    synthetic: bool = False

    @property
    def checksum_policy(self) -> str:
        """One line saying how the files are checked."""
        policies = {f.checksum_policy for f in self.files}
        if not self.files:
            return "generated locally; nothing to download"
        if policies == {"published"}:
            return "published checksums are pinned in the catalog"
        return LOCK_POLICY_TEXT

    @property
    def download_size(self) -> int:
        """Rough total download size in bytes (exact where sizes are known)."""
        return sum(f.size if f.size is not None else (f.approx_size or 0) for f in self.files)

    def resolve_loader(self):  # noqa: ANN201 - a callable
        """Import and return the loader function named by :attr:`loader`."""
        module, _, attr = self.loader.partition(":")
        return getattr(importlib.import_module(module), attr)


def _load_catalog() -> None:
    importlib.import_module("oxbench.datasets.catalog")


#: All dataset entries, by id. Entries are declared in :mod:`oxbench.datasets.catalog`.
DATASETS: Registry[DatasetSpec] = Registry("dataset", loader=_load_catalog)


def get_spec(dataset_id: str) -> DatasetSpec:
    """The entry of ``dataset_id``.

    Raises:
        InputError: unknown id (the message lists the known ones).
    """
    return DATASETS.get(dataset_id)


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add an entry to :data:`DATASETS` (used by the catalog)."""
    return DATASETS.register(spec.id, spec)
