"""The data root's lock file, ``<root>/oxbench.lock.json``: what was verified, and when.

Where the dataset owners publish no checksum, the first verified download of a file records its
size and SHA-256 here ("trust on first use"); every later fetch and ``verify`` compares against it.
The file also records which terms were accepted and which archives were installed. Layout::

    {"version": 1,
     "files": {"<file name>": {"size": int, "sha256": str, "md5": str, "url": str, "recorded": iso}},
     "installed": {"<dataset id>": {"<file name>": iso}},
     "terms_accepted": {"<dataset id>": iso}}

Files are keyed by their published name, so an archive shared by two entries (the Oxford images
serve ``oxford5k`` and ``roxford5k``) has one record. Writes are atomic and serialised, between
threads and between processes (a file lock on ``oxbench.lock.json.lock``): two ``oxbench data``
commands updating one root never lose each other's records.
"""

from __future__ import annotations

import json
import os
import re
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oxbench.datasets.spec import LOCK_FILE
from oxbench.errors import InputError
from oxbench.fileio import atomic_write_json, file_lock, read_input_bytes

_GUARD = threading.Lock()
_MAX_LOCK_BYTES = 64 << 20
_HEX = re.compile(r"[0-9a-fA-F]*")
_DIGEST_LENGTHS = {"sha256": 64, "md5": 32}


def _layout_problem(data: Any) -> str | None:
    """What is wrong with a parsed lock file (the layout in the module docstring), or ``None``."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if data.get("version", 1) != 1 or isinstance(data.get("version"), bool):
        return f"unknown version {data.get('version')!r} (this oxbench reads version 1)"
    for key in ("files", "installed", "terms_accepted"):
        if not isinstance(data.get(key, {}), dict):
            return f"{key!r} must be an object"
    for name, rec in data.get("files", {}).items():
        if not isinstance(rec, dict):
            return f"files[{name!r}] must be an object"
        size = rec.get("size")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            return f"files[{name!r}].size must be a non-negative integer, got {size!r:.40}"
        for algo, length in _DIGEST_LENGTHS.items():
            digest = rec.get(algo)
            if digest is not None and not (
                isinstance(digest, str) and len(digest) == length and _HEX.fullmatch(digest)
            ):
                return f"files[{name!r}].{algo} must be {length} hex digits, got {digest!r:.80}"
        for key in ("url", "recorded"):
            if not isinstance(rec.get(key, ""), str):
                return f"files[{name!r}].{key} must be a string"
    for dataset, files in data.get("installed", {}).items():
        if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
            return f"installed[{dataset!r}] must map file names to times"
    if not all(isinstance(v, str) for v in data.get("terms_accepted", {}).values()):
        return "terms_accepted must map dataset ids to times"
    return None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class LockFile:
    """Read and update ``<root>/oxbench.lock.json`` (thread-safe within one process).

    Args:
        root: the data root.
    """

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / LOCK_FILE

    def read(self) -> dict[str, Any]:
        """The lock file's content (an empty skeleton when the file does not exist).

        Raises:
            InputError: the file is not a regular file, too large, not JSON, or does not have the
                layout above (every record is checked: a size is a non-negative integer, a digest
                is hex of the right length, times and URLs are strings).
        """
        if not os.path.lexists(self.path):
            return {"version": 1, "files": {}, "installed": {}, "terms_accepted": {}}
        raw = read_input_bytes(self.path, limit=_MAX_LOCK_BYTES)
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(
                f"unreadable lock file ({reason}); fix or delete it", self.path
            ) from None
        problem = _layout_problem(data)
        if problem is not None:
            raise InputError(f"malformed lock file: {problem}; fix or delete it", self.path)
        for key in ("files", "installed", "terms_accepted"):
            data.setdefault(key, {})
        return data

    def _update(self, fn) -> None:  # noqa: ANN001 - a callable on the dict
        # the whole read-modify-write under the lock: another process's update is never lost
        flock = self.path.with_name(self.path.name + ".lock")
        with _GUARD, file_lock(flock, wait=60.0, what=f"the lock file {self.path}"):
            data = self.read()
            fn(data)
            atomic_write_json(self.path, data)

    def file_record(self, name: str) -> dict[str, Any] | None:
        """The recorded size/checksums of file ``name``, or ``None``."""
        return self.read()["files"].get(name)

    def record_file(self, name: str, *, size: int, sha256: str, md5: str, url: str) -> None:
        """Record a verified file (overwrites an older record of the same name)."""

        def fn(data: dict[str, Any]) -> None:
            data["files"][name] = {
                "size": size,
                "sha256": sha256,
                "md5": md5,
                "url": url,
                "recorded": _now(),
            }

        self._update(fn)

    def forget_file(self, name: str) -> None:
        """Drop the record of ``name`` (to accept a file the owners replaced)."""
        self._update(lambda data: data["files"].pop(name, None))

    def installed(self, dataset_id: str) -> dict[str, str]:
        """File name -> time, for the archives/files installed into ``dataset_id``."""
        return dict(self.read()["installed"].get(dataset_id, {}))

    def mark_installed(self, dataset_id: str, name: str) -> None:
        """Record that ``name`` is fully downloaded, checked and laid out in ``dataset_id``."""
        self._update(
            lambda data: data["installed"].setdefault(dataset_id, {}).__setitem__(name, _now())
        )

    def terms_accepted(self, dataset_id: str) -> bool:
        """Whether the terms of ``dataset_id`` were accepted for this data root."""
        return dataset_id in self.read()["terms_accepted"]

    def accept_terms(self, dataset_id: str) -> None:
        """Record the acceptance of the terms of ``dataset_id``."""
        self._update(lambda data: data["terms_accepted"].__setitem__(dataset_id, _now()))
