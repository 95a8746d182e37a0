"""Provenance of what a run reads: a file's or folder's absolute path, size and content digest.

:func:`input_record` is the one way oxbench identifies an input it did not make -- the user's
descriptor files, a model file, the ground-truth files, an image set. A run records it for every
input (``record.json`` ``"inputs"``), and the content digests of the files its settings name go into
the run's config and so into the config folder's digest: the same command run from another folder on
other files never lands in the same config folder.

Hashing a large file on every run would cost more than the run itself, so a digest is computed once
per *file identity* -- device, inode, size and modification time (``mtime_ns``) -- and kept in this
process and, given a ``cache`` folder, in one small JSON entry per file there. Any write or atomic
replacement changes the identity, so a changed file is hashed again; an unchanged one is only
``stat``-ed. A folder's digest covers every regular file below it (relative name, size and content
digest, in name order) and is cached by the identities of all its files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from oxbench.errors import InputError
from oxbench.fileio import (
    atomic_write_json,
    file_sha256,
    os_reason,
    require_regular_file,
    text_digest,
)

log = logging.getLogger(__name__)

#: Files at least this large keep their digest in the ``cache`` folder across runs (smaller ones are
#: hashed again by each process: a ``stat`` and a small read cost about the same).
CACHE_MIN_BYTES = 1 << 20

#: The subfolder of a cache root that holds the digest entries.
DIGESTS_FOLDER = "_digests"

#: Digests known to this process, by identity key.
_KNOWN: dict[str, str] = {}


@dataclass(frozen=True)
class InputRecord:
    """One input as a run records it.

    Attributes:
        path: absolute path (links resolved).
        kind: ``"file"`` or ``"folder"`` (a folder, or the chosen files under one).
        size: bytes (a folder: the sum over its files).
        files: how many files the digest covers (1 for a file).
        sha256: SHA-256 of the file's bytes; of a folder: of each file's relative name, size and
            SHA-256, in name order.
    """

    path: str
    kind: Literal["file", "folder"]
    size: int
    files: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "files": self.files,
            "sha256": self.sha256,
        }

    def content(self) -> dict[str, Any]:
        """What identifies the content wherever it lives (for config digests): size and digest."""
        return {"size": self.size, "files": self.files, "sha256": self.sha256}


def input_record(
    path: str | Path,
    *,
    files: Iterable[str | Path] | None = None,
    cache: str | Path | None = None,
) -> InputRecord:
    """Absolute path, size and SHA-256 content digest of a file or folder, hashed once per identity.

    Args:
        path: a regular file, or a folder (every regular file below it, links to files followed,
            links to folders not).
        files: with a folder ``path``: only these files (paths under ``path``, relative or
            absolute), e.g. the images of a dataset that shares its folder with other files.
        cache: a cache root; digests of files of :data:`CACHE_MIN_BYTES` or more (and of folders)
            are kept in ``<cache>/_digests/`` and reused while the file's identity (device, inode,
            size, ``mtime_ns``, ``ctime_ns``) is unchanged. ``None``: only this process remembers them.

    Raises:
        InputError: missing, unreadable, not a regular file or folder, a listed file outside the
            folder, or a file that changed while it was hashed.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = Path(d, "x.txt").write_text("abc")
        ...     r = input_record(Path(d, "x.txt"))
        >>> (r.kind, r.size, r.sha256[:12])
        ('file', 3, 'ba7816bf8f01')
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError("file not found", p) from None
    except OSError as exc:
        raise InputError(f"cannot read: {os_reason(exc)}", p) from None
    absolute = p.resolve()
    store = Path(cache) / DIGESTS_FOLDER if cache is not None else None
    if stat.S_ISREG(st.st_mode):
        if files is not None:
            raise InputError("a list of files is given for a file; give their folder", p)
        return InputRecord(str(absolute), "file", int(st.st_size), 1, _file_digest(absolute, store))
    if not stat.S_ISDIR(st.st_mode):
        raise InputError("not a regular file or folder (FIFO, device or socket)", p)
    members = (
        _listed(absolute, Path(os.path.abspath(p)), files) if files is not None else _walk(absolute)
    )
    listing = []
    for rel, fst in members:
        listing.append((rel, *_identity(fst)))
    key = text_digest(json.dumps(["folder", str(absolute), listing]))
    digest = _KNOWN.get(key) or _load_entry(store, key)
    if digest is None:
        h = hashlib.sha256()
        for rel, _dev, _ino, size, _mtime, _ctime in listing:
            sha = _file_digest(absolute / rel, store)
            h.update(f"{rel}\0{size}\0{sha}\n".encode())
        digest = h.hexdigest()
        _save_entry(store, key, str(absolute), digest)
    _KNOWN[key] = digest
    total = sum(row[3] for row in listing)
    return InputRecord(str(absolute), "folder", total, len(listing), digest)


def input_records(
    paths: Mapping[str, str | Path], *, cache: str | Path | None = None
) -> dict[str, InputRecord]:
    """:func:`input_record` of each named path (``{"db_features": ..., ...}``), names in order."""
    out = {}
    for name, path in sorted(paths.items()):
        try:
            out[name] = input_record(path, cache=cache)
        except InputError as exc:
            raise InputError(f"{name}: {exc.problem}", exc.source or path) from None
        if cache is not None:
            _warn_if_changed(name, out[name], Path(cache) / DIGESTS_FOLDER)
    return out


def _warn_if_changed(name: str, record: InputRecord, store: Path) -> None:
    """One warning when the file at this path held other bytes the last time a run in this cache
    read it (edited, replaced by ``mv``, relinked): what was computed from it is not reused."""
    key = text_digest(json.dumps(["last", record.path]))
    last = _load_entry(store, key)
    if last is not None and last != record.sha256:
        log.warning(
            "%s %s changed since the last run in this cache (sha256 %s..., was %s...): "
            "everything computed from it is computed again",
            name,
            record.path,
            record.sha256[:12],
            last[:12],
        )
    if last != record.sha256:
        _save_entry(store, key, record.path, record.sha256)


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A hint that a file is unchanged, never its identity (the digest is): ``ctime_ns`` is in it
    because a file edited in place with its ``mtime`` restored (``os.utime``) still moves it."""
    return (
        int(st.st_dev),
        int(st.st_ino),
        int(st.st_size),
        int(st.st_mtime_ns),
        int(st.st_ctime_ns),
    )


def _file_digest(path: Path, store: Path | None) -> str:
    """SHA-256 of a regular file, remembered by identity (on disk for large files)."""
    before = require_regular_file(path)
    key = text_digest(json.dumps(["file", str(path), _identity(before)]))
    disk = store if before.st_size >= CACHE_MIN_BYTES else None
    digest = _KNOWN.get(key) or _load_entry(disk, key)
    if digest is None:
        try:
            digest = file_sha256(path)
            after = os.stat(path)
        except OSError as exc:
            raise InputError(f"cannot read: {os_reason(exc)}", path) from None
        if _identity(after) != _identity(before):
            raise InputError(
                "file changed while it was being hashed; run again when it is complete", path
            )
        _save_entry(disk, key, str(path), digest)
    _KNOWN[key] = digest
    return digest


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    out = []
    for folder, dirs, names in os.walk(root, onerror=None, followlinks=False):
        dirs.sort()
        for name in names:
            full = Path(folder, name)
            try:
                fst = os.stat(full)
            except OSError:
                continue  # a dangling link holds no content
            if stat.S_ISREG(fst.st_mode):
                out.append((full.relative_to(root).as_posix(), fst))
    return sorted(out, key=lambda t: t[0])


def _listed(
    root: Path, given: Path, files: Iterable[str | Path]
) -> list[tuple[str, os.stat_result]]:
    """The files under ``root`` (resolved; ``given``: as the caller named it), by relative name."""
    out = {}
    for f in files:
        full = Path(os.path.abspath(f if Path(f).is_absolute() else given / f))
        for base in (given, root):
            if full.is_relative_to(base):
                rel = full.relative_to(base).as_posix()
                break
        else:
            raise InputError(f"{full} is not under the folder", root)
        out[rel] = require_regular_file(full)
    return sorted(out.items())


def _load_entry(store: Path | None, key: str) -> str | None:
    if store is None:
        return None
    entry = store / f"{key[:40]}.json"
    try:
        data = json.loads(entry.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent or damaged: hash again (and rewrite it)
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    sha = data.get("sha256")
    if isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha):
        return sha
    return None


def _save_entry(store: Path | None, key: str, path: str, digest: str) -> None:
    if store is None:
        return
    try:
        atomic_write_json(store / f"{key[:40]}.json", {"key": key, "path": path, "sha256": digest})
    except InputError as exc:  # a read-only cache costs a rehash next time, not the run
        log.warning("cannot keep the digest of %s: %s", path, exc)


def inputs_digest(records: Mapping[str, InputRecord]) -> str:
    """Short digest of the contents of named inputs (paths left out): tells runs on other files apart."""
    return text_digest(
        json.dumps({k: r.content() for k, r in sorted(records.items())}, sort_keys=True), 8
    )


#: Image sets larger than this are recorded by path and count only (hashing R1M's million images
#: would read ~100 GB before a run that may need none of them).
MAX_HASHED_IMAGES = 100_000


def image_set_record(paths: list[Path], *, cache: str | Path | None = None) -> dict[str, Any]:
    """:func:`input_record` of the image files of one part of a dataset (under their common folder);
    a set of more than :data:`MAX_HASHED_IMAGES` is recorded by folder and count, ``sha256`` ``None``."""
    paths = [Path(os.path.abspath(p)) for p in paths]  # relative to the working folder, as read
    root = Path(os.path.commonpath([str(p.parent) for p in paths]))
    if len(paths) > MAX_HASHED_IMAGES:
        return {
            "path": str(root.resolve()),
            "kind": "folder",
            "size": None,
            "files": len(paths),
            "sha256": None,
            "note": f"more than {MAX_HASHED_IMAGES:,} images: not hashed",
        }
    return input_record(root, files=paths, cache=cache).to_dict()
