"""One kind of cache folder: what it holds, what it stands for, and whether it is oxbench's own.

Every cache folder oxbench keeps (the feature and descriptor stores, the memory-mapped inverted
files of HE, ASMK and BoW) is a :class:`StoreFolder`: a folder with a ``meta.json`` that says what
kind of folder it is (its format), what it stands for (the content digests of its inputs and the
settings it was built with: :func:`oxbench.cache.stands_for_record`) and carries the digest of all
that, so a reader can tell three cases apart before it touches anything:

- **own**: ``meta.json`` is intact (its digest holds). oxbench may read the folder, check what it
  stands for (:meth:`StoreFolder.meta` refuses another binding with
  :class:`~oxbench.cache.CorruptCache`, which the caller turns into a rebuild with a warning) and
  clean the temporaries it left there;
- **absent** or **empty**: oxbench may create it;
- **foreign**: anything else -- a folder without an intact ``meta.json`` that holds files oxbench
  does not write there, or a symbolic link (:func:`StoreFolder.guard`). It is refused in one line,
  never written into and never cleaned: a cache path pointed at someone's folder must not cost
  them a file.

A folder written whole (the inverted files) is built in a temporary folder beside its final name
(:meth:`StoreFolder.building`) and appears by one rename when complete; the temporary folder names
what it builds (its name starts with ``.oxbench-tmp-<final name>.`` and it holds a
``.building.json`` that says so), and only such folders, older than an hour, are removed as what
a killed build left (:meth:`StoreFolder.remove_stale_builds`). A folder filled over time (the
feature stores' shards) writes its ``meta.json`` once, when created (:meth:`StoreFolder.create`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, TypeVar

from oxbench.cache import (
    WRITTEN_SUFFIX,
    CorruptCache,
    check_stands_for,
    entry_lock,
    lock_path,
    stands_for_record,
)
from oxbench.errors import InputError
from oxbench.fileio import (
    TEMP_PREFIX,
    atomic_write_json,
    commit_folder,
    discard_folder,
    json_digest,
    make_temp_folder,
    read_input_bytes,
    refuse_linked_folder,
    remove_stale_temps,
)

log = logging.getLogger(__name__)

#: The file that says what a folder is.
META_NAME = "meta.json"
#: The key of ``meta.json`` holding the digest of every other key.
META_DIGEST = "digest"
#: The key of ``meta.json`` holding what the folder stands for.
STANDS_FOR = "stands_for"
#: The file in a temporary build folder naming the folder it builds.
BUILDING_NAME = ".building.json"
#: Largest ``meta.json`` read.
META_LIMIT = 1 << 24

T = TypeVar("T")

State = Literal["absent", "empty", "own", "older", "foreign"]


def meta_digest(fields: Mapping[str, object]) -> str:
    """The digest ``meta.json`` records of its other keys (canonical JSON, SHA-256)."""
    return json_digest(fields)


def _canonical(fields: Mapping[str, object]) -> dict[str, Any]:
    """``fields`` as JSON gives them back (tuples as lists), so written and read metas compare."""
    return json.loads(json.dumps(dict(fields), sort_keys=True, default=str))  # type: ignore[no-any-return]


@dataclass(frozen=True)
class StoreFolder:
    """A cache folder of one kind (see the module docstring).

    Attributes:
        path: the folder.
        what: its kind in messages (``"Hamming inverted file"``).
        format: the format number its ``meta.json`` holds.
        files: the names (``fnmatch`` patterns: ``shard-*``) oxbench writes in such a folder:
            one holding only these and temporaries, without an intact ``meta.json``, is an older
            oxbench's or a damaged own one (rebuilt with a warning), not a foreign one.
    """

    path: Path
    what: str
    format: int
    files: frozenset[str] = field(default_factory=frozenset)

    # ------------------------------------------------------------------ what is there
    def guard(self, *, below: str | Path) -> StoreFolder:
        """This folder, after refusing a symbolic link at it or between ``below`` and it.

        Raises:
            InputError: a link (names it).
        """
        refuse_linked_folder(self.path, below=below)
        return self

    def state(self) -> State:
        """``absent``, ``empty``, ``own`` (intact ``meta.json``), ``older`` (an earlier oxbench's
        files only, or an own folder whose ``meta.json`` is damaged) or ``foreign``."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return "absent"
        except OSError:
            return "foreign"
        if not stat.S_ISDIR(st.st_mode):
            return "foreign"  # a link, a file
        try:
            if self.read_meta() is not None:
                return "own"
        except CorruptCache:
            pass
        try:
            names = set(os.listdir(self.path))
        except OSError:
            return "foreign"
        if not names:
            return "empty"
        known = (META_NAME, *self.files)
        if all(n.startswith(TEMP_PREFIX) or any(fnmatchcase(n, p) for p in known) for n in names):
            return "older"
        return "foreign"

    def refuse_foreign(self) -> State:
        """The folder's :meth:`state`, after refusing a foreign one.

        Raises:
            InputError: the folder is not oxbench's own (names it, says what to do).
        """
        state = self.state()
        if state == "foreign":
            raise InputError(
                f"refusing to use this folder as a {self.what}: it is not one oxbench wrote "
                "(no intact meta.json); move it away or give another cache folder",
                self.path,
            )
        return state

    # ------------------------------------------------------------------ meta.json
    def read_meta(self) -> dict[str, Any] | None:
        """The fields of an intact ``meta.json`` (without the digest); ``None`` when the folder
        has none or one without a digest (an earlier oxbench's).

        Raises:
            CorruptCache: a ``meta.json`` that cannot be read, or whose digest does not hold.
        """
        path = self.path / META_NAME
        if not path.is_file() or path.is_symlink():
            return None
        try:
            found = json.loads(read_input_bytes(path, limit=META_LIMIT))
        except (InputError, ValueError) as exc:
            problem = exc.problem if isinstance(exc, InputError) else str(exc)
            raise CorruptCache(
                f"unreadable {self.what} metadata ({problem})", path, lock=self.lock
            ) from None
        if not isinstance(found, dict) or META_DIGEST not in found:
            return None
        digest = found.pop(META_DIGEST)
        if digest != meta_digest(found):
            raise CorruptCache(
                f"{self.what} metadata does not match its recorded digest", path, lock=self.lock
            )
        return found

    def meta(self, *, stands_for: Mapping[str, object] | None = None) -> dict[str, Any]:
        """The fields of ``meta.json``, checked: intact, of this format, and (when given) written
        for ``stands_for``.

        Raises:
            InputError: no ``meta.json``.
            CorruptCache: damaged, another format, or another binding (names the keys that
                differ): the caller rebuilds the folder, with a warning.
        """
        path = self.path / META_NAME
        found = self.read_meta()
        if found is None:
            if path.is_file():
                raise CorruptCache(
                    f"{self.what} written by an older oxbench (its meta.json has no digest)",
                    path,
                    lock=self.lock,
                )
            raise InputError(f"no {self.what} here (no meta.json)", self.path)
        if found.get("format") != self.format:
            raise CorruptCache(
                f"{self.what} of format {found.get('format')!r}, this oxbench reads {self.format}",
                path,
                lock=self.lock,
            )
        if stands_for is not None:
            bound = found.get(STANDS_FOR)
            check_stands_for(
                None if not isinstance(bound, dict) else str(stands_for_record(bound)),
                _canonical(stands_for),
                what=self.what,
                path=path,
            )
        return found

    def fields(
        self, fields: Mapping[str, object], *, stands_for: Mapping[str, object] | None = None
    ) -> dict[str, Any]:
        """What :meth:`write_meta` writes (without the digest): ``fields``, the format, and
        ``stands_for`` when given, as :meth:`meta` reads them back."""
        out = {**fields, "format": self.format}
        if stands_for is not None:
            out[STANDS_FOR] = dict(stands_for)
        return _canonical(out)

    def write_meta(
        self, fields: Mapping[str, object], *, stands_for: Mapping[str, object] | None = None
    ) -> dict[str, Any]:
        """Write ``meta.json`` atomically: :meth:`fields` and their digest. Returns the fields."""
        out = self.fields(fields, stands_for=stands_for)
        atomic_write_json(self.path / META_NAME, {**out, META_DIGEST: meta_digest(out)})
        return out

    @property
    def lock(self) -> Path:
        """The lock of the folder as one cache entry: ``<folder>.lock`` beside it."""
        return lock_path(self.path)

    # ------------------------------------------------------------------ temporaries
    def remove_temps(self, *, older_than_s: float = 3600.0, patterns: tuple[str, ...] = ()) -> int:
        """Remove what a killed process left *inside* the folder (temporary names older than
        ``older_than_s``), only when the folder is oxbench's own. Returns how many."""
        if self.state() != "own":
            return 0
        return remove_stale_temps(self.path, older_than_s=older_than_s, patterns=patterns)

    def remove_stale_builds(self, *, older_than_s: float = 3600.0) -> int:
        """Remove the temporary build folders of *this* folder that a killed build left beside
        it: named ``.oxbench-tmp-<name>.*``, older than ``older_than_s``, and holding a
        ``.building.json`` that names this folder (or the discarded copy of an own folder).
        Returns how many."""
        parent, prefix = self.path.parent, f"{TEMP_PREFIX}{self.path.name}."
        removed, now = 0, time.time()
        try:
            entries = list(os.scandir(parent))
        except OSError:
            return 0
        for entry in entries:
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime < older_than_s:
                    continue
            except OSError:
                continue
            tmp = Path(entry.path)
            if _builds(tmp) == self.path.name or (
                ".discarded." in entry.name
                and StoreFolder(tmp, self.what, self.format, self.files).state() == "own"
            ):
                shutil.rmtree(tmp, ignore_errors=True)
                removed += 1
        return removed

    # ------------------------------------------------------------------ writing
    def create(
        self, fields: Mapping[str, object], *, stands_for: Mapping[str, object] | None = None
    ) -> dict[str, Any]:
        """Make an absent (or empty) folder this kind's, with its ``meta.json``: built beside,
        renamed in place (so a folder without its ``meta.json`` never appears). Another
        process that created it first wins. Returns the fields written.

        Raises:
            InputError: the folder is foreign.
        """
        with self.building() as tmp:
            StoreFolder(tmp, self.what, self.format).write_meta(fields, stands_for=stands_for)
        return self.fields(fields, stands_for=stands_for)

    @contextlib.contextmanager
    def building(self) -> Iterator[Path]:
        """A temporary folder beside this one to build its content in; when the block ends, it
        replaces this folder (an own, older or empty one; an absent one appears) by one rename.
        On an error the temporary folder is removed and the folder left as it was.

        Raises:
            InputError: the folder is foreign (before anything is written).
        """
        self.refuse_foreign()
        self.remove_stale_builds()
        tmp = make_temp_folder(self.path)
        try:
            atomic_write_json(tmp / BUILDING_NAME, {"builds": self.path.name, "pid": os.getpid()})
            yield tmp
            (tmp / BUILDING_NAME).unlink()
            state = self.refuse_foreign()  # nothing put a stranger's folder there meanwhile
            if state == "empty":
                with contextlib.suppress(OSError):
                    os.rmdir(self.path)
            elif state in ("own", "older"):
                discard_folder(self.path)
            if not commit_folder(tmp, self.path):
                self.refuse_foreign()  # another process committed first: theirs stands
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


def _builds(tmp: Path) -> str | None:
    """The folder name a temporary build folder's ``.building.json`` names (``None``: none)."""
    try:
        record = json.loads(read_input_bytes(tmp / BUILDING_NAME, limit=1 << 12))
    except (InputError, ValueError):
        return None
    return record.get("builds") if isinstance(record, dict) else None


def open_or_build(
    folder: StoreFolder,
    *,
    open_folder: Callable[[], T],
    build: Callable[[], T],
) -> tuple[T, bool]:
    """Open a folder written whole when it is oxbench's own and its checks pass (its binding, its
    content: whatever ``open_folder`` checks), else build it; ``(what was opened or built,
    whether it was opened)``. A check that fails is one warning and a rebuild; a foreign folder
    is refused. Writers of the folder are serialised by its lock (a second one waits, then
    opens what the first built).

    Raises:
        InputError: the folder is foreign, or the build fails.
    """
    with entry_lock(folder.lock, what=f"the {folder.what} {folder.path}"):
        state = folder.refuse_foreign()
        if state in ("own", "older"):
            try:
                return open_folder(), True
            except InputError as exc:  # CorruptCache included: another binding, damaged
                log.warning("%s; building it again", exc)
        return build(), False


def known_files(names: Collection[str], *, mapped: Collection[str] = ()) -> frozenset[str]:
    """The file names of a folder kind, with the write records of its ``mapped`` files
    (:func:`oxbench.cache.record_written`)."""
    return frozenset([*names, *(m + WRITTEN_SUFFIX for m in mapped)])


__all__ = [
    "BUILDING_NAME",
    "META_NAME",
    "StoreFolder",
    "known_files",
    "meta_digest",
    "open_or_build",
]
