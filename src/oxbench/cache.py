"""Cache artifacts that cannot lie, and one writer per cache entry.

Every cache artifact oxbench writes (feature-store shards and their metadata, vocabularies, visual
words) records a digest of its content when it is written, and the digest is checked when the
artifact is read. An artifact that fails the check -- truncated, bytes flipped, unreadable, or
written by an older oxbench that recorded no digest -- raises :class:`CorruptCache`; the pipeline
steps catch it, log a warning naming the file, delete it and compute it again. A corrupt cache never
gives a traceback and is never used.

``.npz`` artifacts written by :func:`save_npz` carry the SHA-256 of all their arrays (names, dtypes,
shapes and bytes) as one more entry; :func:`load_npz` reads them whole and checks it (a full hash:
these files are read whole anyway).

Writers of one cache entry are serialised by a file lock (:func:`entry_lock`, on
``<entry>.lock``): a second process that wants the same entry waits, says so in the log, and then
reuses what the first one wrote. Lock files stay in place (removing a lock file another process may
be about to open would break the exclusion); the OS releases the lock itself when its holder dies.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import LockBusy, atomic_write_npz, file_lock, require_regular_file

log = logging.getLogger(__name__)

#: The entry of a cache ``.npz`` holding the SHA-256 of its other entries.
DIGEST_KEY = "content_sha256"


class CorruptCache(InputError):
    """A cache artifact failed its digest check (or could not be read): recompute it.

    Args:
        problem: what is wrong.
        path: the file found corrupt (named in the message).
        discard: the files to delete so that the entry is recomputed (default: ``path``).
        lock: the lock of the entry those files belong to (default: ``<path>.lock``).
    """

    def __init__(
        self,
        problem: str,
        path: str | Path,
        *,
        discard: tuple[Path, ...] | None = None,
        lock: Path | None = None,
    ) -> None:
        super().__init__(f"corrupt cache file: {problem}", path)
        self.path = Path(path)
        self.discard = discard if discard is not None else (self.path,)
        self.lock = lock if lock is not None else lock_path(self.path)

    def remove(self) -> None:
        """Delete the corrupt files (under the entry's lock) so that the next step recomputes them."""
        with entry_lock(self.lock, what=str(self.path)):
            for p in self.discard:
                p.unlink(missing_ok=True)


def lock_path(entry: str | Path) -> Path:
    """The lock file of a cache entry: ``<entry>.lock`` beside it."""
    entry = Path(entry)
    return entry.with_name(entry.name + ".lock")


@contextlib.contextmanager
def entry_lock(path: str | Path, *, what: str) -> Iterator[Path]:
    """Hold the lock file ``path`` of one cache entry; wait (logging that we wait) while another
    process holds it.

    The wait has no time limit: only a live process holds the lock (the OS releases a dead
    holder's), and it holds it only while it computes the entry.
    """
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(file_lock(path, wait=0.0, what=what))
        except LockBusy:
            log.warning("waiting for another oxbench process that is writing %s", what)
            stack.enter_context(file_lock(path, wait=float("inf"), what=what))
            log.info("the other process has finished %s; reusing what it wrote", what)
        yield Path(path)


def arrays_digest(arrays: Mapping[str, NDArray]) -> str:
    """SHA-256 over named arrays: each name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def save_npz(path: str | Path, arrays: Mapping[str, NDArray]) -> Path:
    """Write named arrays as ``.npz`` with their digest, atomically (no pickles)."""
    if DIGEST_KEY in arrays:
        raise ValueError(f"{DIGEST_KEY!r} is reserved for the digest")
    return atomic_write_npz(path, {**arrays, DIGEST_KEY: np.array(arrays_digest(arrays))})


def load_npz(path: str | Path, *, what: str, discard: tuple[Path, ...] | None = None,
             lock: Path | None = None) -> dict[str, NDArray]:  # fmt: skip
    """Read a ``.npz`` written by :func:`save_npz`, all of it, and check its digest.

    The returned arrays include the verified digest under :data:`DIGEST_KEY` (an identity of the
    content, e.g. to record which vocabulary other artifacts were computed with).

    Args:
        path: the file.
        what: what it holds, for messages (``"vocabulary"``).
        discard, lock: passed to :class:`CorruptCache` (what to delete on corruption).

    Raises:
        InputError: the file is missing or not a regular file.
        CorruptCache: unreadable, no digest, or the digest does not match the content.
    """
    path = Path(path)
    try:
        require_regular_file(path)
    except InputError as exc:
        raise InputError(f"{what}: {exc.problem}", path) from None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file raises (BadZipFile, EOFError...)
        raise CorruptCache(f"unreadable {what} ({type(exc).__name__}: {exc})", path,
                           discard=discard, lock=lock) from None  # fmt: skip
    stored = arrays.pop(DIGEST_KEY, None)
    if stored is None:
        raise CorruptCache(f"{what} without a content digest (written by an older oxbench?)", path,
                           discard=discard, lock=lock)  # fmt: skip
    if str(stored) != arrays_digest(arrays):
        raise CorruptCache(f"{what} does not match its recorded digest", path, discard=discard, lock=lock)
    arrays[DIGEST_KEY] = stored
    return arrays
