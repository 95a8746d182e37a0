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
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from oxbench.datasets.spec import LOCK_FILE
from oxbench.errors import InputError
from oxbench.fileio import atomic_write_json, file_lock

_GUARD = threading.Lock()


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
        """The lock file's content (an empty skeleton when the file does not exist)."""
        if not self.path.exists():
            return {"version": 1, "files": {}, "installed": {}, "terms_accepted": {}}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"unreadable lock file ({exc}); fix or delete it", self.path) from None
        if not isinstance(data, dict) or not isinstance(data.get("files", {}), dict):
            raise InputError("malformed lock file; fix or delete it", self.path)
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
