"""Cache artifacts that cannot lie, and one writer per cache entry.

Every cache artifact oxbench writes (feature-store shards and their metadata, vocabularies, visual
words) records a digest of its content when it is written, and the digest is checked when the
artifact is read. An artifact that fails the check -- truncated, bytes flipped, unreadable, or
written by an older oxbench that recorded no digest -- raises :class:`CorruptCache`; the pipeline
steps catch it, log a warning naming the file, delete it and compute it again. A corrupt cache never
gives a traceback and is never used.

``.npz`` artifacts written by :func:`save_npz` carry the SHA-256 of all their arrays (names, dtypes,
shapes and bytes) as one more entry; :func:`load_npz` reads them and checks it (a full hash). Large
members can be memory-mapped instead of read (``mapped=``: the archive is uncompressed, each member
an ``.npy`` at a known offset), and a process that opens a file another process has already checked
can skip the hash when the file is still the one checked (:class:`FileIdentity`: same inode, size,
modification time and recorded digest).

Writers of one cache entry are serialised by a file lock (:func:`entry_lock`, on
``<entry>.lock``): a second process that wants the same entry waits, says so in the log, and then
reuses what the first one wrote. Lock files stay in place (removing a lock file another process may
be about to open would break the exclusion); the OS releases the lock itself when its holder dies.

A digest proves that an entry is intact, not that it is the right one: an intact entry copied over
another (or two swapped) would pass it. So an entry also names, inside its content, what it stands
for (:func:`stands_for_record`: its query, its inputs' digests, the settings), and a reader passes the
record it expects; :func:`load_npz` compares the two and raises :class:`CorruptCache` (recompute,
with one warning) when they differ. Every cache kind binds its entries this one way.

A file that is memory-mapped (database vectors, posting lists) is paged in as it is used, never
hashed in full on a warm run; it is written with :func:`record_written` (its identity at write time
-- inode, size, modification and change times -- and what it stands for, in
``<file>.written.json``) and opened only through :func:`open_written`, which refuses a file that is
not the one written for that record (replaced, rewritten, its modification time restored: the change
time cannot be set back).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import struct
import zipfile
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import (
    LockBusy,
    atomic_open,
    atomic_write_json,
    file_lock,
    read_input_bytes,
    require_regular_file,
)

log = logging.getLogger(__name__)

#: The entry of a cache ``.npz`` holding the SHA-256 of its other entries.
DIGEST_KEY = "content_sha256"
#: The entry of a cache ``.npz`` naming what it stands for (:func:`stands_for_record`).
STANDS_FOR_KEY = "stands_for"


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


def stands_for_record(record: Mapping[str, object]) -> NDArray[np.str_]:
    """The member that binds a cache entry to what it stands for: ``record`` (JSON-able: the
    query, the digests of the inputs, the settings) as one canonical JSON string.

    Give it to :func:`save_npz` (``stands_for=``) when writing and the same record to
    :func:`load_npz` when reading: an intact entry of another query or other inputs (two entries
    swapped, one copied over another, a file left from an older input) is then refused.
    """
    return np.array(json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False))


def _check_stands_for(
    found: object,
    expected: Mapping[str, object],
    corrupt: Callable[[str], CorruptCache],
    what: str,
) -> None:
    """Raise ``corrupt`` unless ``found`` (the stored :func:`stands_for_record`, ``None`` when
    there is none) is the record ``expected``."""
    if found is None:
        raise corrupt(f"{what} does not say what it stands for (written by an older oxbench?)")
    if str(found) == str(stands_for_record(expected)):
        return
    try:
        record = json.loads(str(found))
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise corrupt(f"{what} holds an unreadable record of what it stands for")
    differ = sorted(k for k in set(record) | set(expected) if record.get(k) != expected.get(k))
    raise corrupt(f"{what} stands for another {', '.join(differ)} than the one asked for")


def check_stands_for(
    found: object, expected: Mapping[str, object], *, what: str, path: str | Path
) -> None:
    """For a file of another layout than :func:`save_npz`'s: raise :class:`CorruptCache` unless
    its stored :func:`stands_for_record` ``found`` (``None``: none stored) is ``expected``."""
    _check_stands_for(found, expected, lambda problem: CorruptCache(problem, path), what)


def save_npz(
    path: str | Path,
    arrays: Mapping[str, NDArray],
    *,
    stands_for: Mapping[str, object] | None = None,
) -> Path:
    """Write named arrays as ``.npz`` with their digest, atomically (no pickles, uncompressed).

    ``stands_for``: the record of what the entry stands for, stored inside it and covered by the
    digest (:func:`stands_for_record`; :func:`load_npz` checks it when given the same record).
    """
    return save_npz_pieces(
        path, {k: [np.asarray(v)] for k, v in arrays.items()}, stands_for=stands_for
    )


#: Bytes written (and hashed) at a time by :func:`save_npz_pieces`.
_CHUNK = 1 << 24


def save_npz_pieces(
    path: str | Path,
    arrays: Mapping[str, NDArray | Sequence[NDArray]],
    *,
    stands_for: Mapping[str, object] | None = None,
) -> Path:
    """:func:`save_npz` of arrays given in pieces, never held whole: a member given as a sequence
    of arrays is their concatenation along the first axis, written (and hashed) piece by piece.
    The file is the one :func:`save_npz` writes for the concatenated arrays (same members, same
    digest), uncompressed, so :func:`load_npz` can memory-map its members. ``stands_for``: as
    :func:`save_npz`'s.

    Raises:
        ValueError: pieces of one member differ in dtype or trailing shape.
        InputError: the file cannot be written (see :func:`~oxbench.fileio.atomic_open`).
    """
    for reserved in (DIGEST_KEY, STANDS_FOR_KEY):
        if reserved in arrays:
            raise ValueError(f"{reserved!r} is reserved (the digest, what the entry stands for)")
    if stands_for is not None:
        arrays = {**arrays, STANDS_FOR_KEY: stands_for_record(stands_for)}
    members: dict[str, list[NDArray]] = {
        k: [np.asarray(a) for a in v] if isinstance(v, list | tuple) else [np.asarray(v)]
        for k, v in arrays.items()
    }
    h = hashlib.sha256()
    with (
        atomic_open(path) as fh,
        zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED, allowZip64=True) as zf,
    ):
        for name in sorted(members):
            pieces = members[name]
            if not pieces:
                raise ValueError(f"member {name!r} has no pieces (give an empty array)")
            first = pieces[0]
            if first.dtype.hasobject:
                raise ValueError(
                    f"member {name!r} holds Python objects (no pickles in cache files)"
                )
            if any(
                p.dtype != first.dtype or p.shape[1:] != first.shape[1:] or p.ndim == 0
                for p in pieces[1:]
            ):
                raise ValueError(f"the pieces of member {name!r} differ in dtype or trailing shape")
            shape = (
                (sum(int(p.shape[0]) for p in pieces), *map(int, first.shape[1:]))
                if first.ndim
                else ()
            )
            hashed_shape = shape or (
                1,
            )  # as arrays_digest sees it: np.ascontiguousarray makes 0-d 1-d
            h.update(f"{name}\0{first.dtype.str}\0{hashed_shape}\0".encode())
            with zf.open(f"{name}.npy", "w", force_zip64=True) as out:
                header = {
                    "descr": np.lib.format.dtype_to_descr(first.dtype),
                    "fortran_order": False,
                    "shape": shape,
                }
                np.lib.format.write_array_header_1_0(out, header)
                for piece in pieces:
                    flat = np.ascontiguousarray(piece).reshape(-1).view(np.uint8)
                    for i in range(0, len(flat), _CHUNK):
                        chunk = flat[i : i + _CHUNK].data
                        out.write(chunk)
                        h.update(chunk)
        with zf.open(f"{DIGEST_KEY}.npy", "w") as out:
            np.lib.format.write_array(out, np.array(h.hexdigest()), allow_pickle=False)
    return Path(path)


@dataclass(frozen=True)
class FileIdentity:
    """A cache file as one process checked it: what lets another process trust it without hashing.

    Attributes:
        inode, size, mtime_ns: of the file when it was checked (an atomic replacement or any write
            changes one of them).
        digest: the content digest it recorded and matched.
    """

    inode: int
    size: int
    mtime_ns: int
    digest: str

    @classmethod
    def of(cls, st: os.stat_result, digest: str) -> FileIdentity:
        return cls(int(st.st_ino), int(st.st_size), int(st.st_mtime_ns), digest)

    def same_file(self, st: os.stat_result) -> bool:
        return (self.inode, self.size, self.mtime_ns) == (
            int(st.st_ino),
            int(st.st_size),
            int(st.st_mtime_ns),
        )


def load_npz(
    path: str | Path,
    *,
    what: str,
    discard: tuple[Path, ...] | None = None,
    lock: Path | None = None,
    mapped: Collection[str] = (),
    trusted: FileIdentity | None = None,
    stands_for: Mapping[str, object] | None = None,
) -> dict[str, NDArray]:
    """Read a ``.npz`` written by :func:`save_npz` and check its digest (and what it stands for).

    The returned arrays include the verified digest under :data:`DIGEST_KEY` (an identity of the
    content, e.g. to record which vocabulary other artifacts were computed with).

    Args:
        path: the file.
        what: what it holds, for messages (``"vocabulary"``).
        discard, lock: passed to :class:`CorruptCache` (what to delete on corruption).
        mapped: members returned as read-only memory maps of the file instead of read into memory
            (each must be stored uncompressed, C-ordered, of a plain numeric dtype).
        trusted: the file as another process checked it: when the file is still that one (same
            inode, size, modification time and recorded digest) the content is not hashed again.
        stands_for: the record the entry must have been written for (:func:`stands_for_record`); the
            record is left out of the returned arrays.

    Raises:
        InputError: the file is missing or not a regular file.
        CorruptCache: unreadable, no digest, the digest does not match the content, a mapped
            member that cannot be mapped (compressed, truncated, objects), or an entry written for
            another record than ``stands_for``.
    """
    path = Path(path)
    try:
        before = require_regular_file(path)
    except InputError as exc:
        raise InputError(f"{what}: {exc.problem}", path) from None

    def corrupt(problem: str) -> CorruptCache:
        return CorruptCache(problem, path, discard=discard, lock=lock)

    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files if k not in mapped}
            missing = [k for k in mapped if k not in z.files]
        if mapped:
            with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
                infos = {i.filename.removesuffix(".npy"): i for i in zf.infolist()}
                arrays.update(
                    {k: _map_member(path, fh, infos[k], corrupt) for k in mapped if k in infos}
                )
    except CorruptCache:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a damaged file raises (BadZipFile, EOFError...)
        raise corrupt(f"unreadable {what} ({type(exc).__name__}: {exc})") from None
    if missing:
        raise corrupt(f"{what} without {', '.join(map(repr, missing))}")
    stored = arrays.pop(DIGEST_KEY, None)
    if stored is None:
        raise corrupt(f"{what} without a content digest (written by an older oxbench?)")
    after = os.stat(path)
    if (before.st_ino, before.st_size, before.st_mtime_ns) != (
        after.st_ino,
        after.st_size,
        after.st_mtime_ns,
    ):
        raise corrupt(f"{what} changed while it was being read")
    if not (trusted is not None and trusted.same_file(after) and trusted.digest == str(stored)):
        if str(stored) != arrays_digest(arrays):
            raise corrupt(f"{what} does not match its recorded digest")
    if stands_for is not None:
        _check_stands_for(arrays.get(STANDS_FOR_KEY), stands_for, corrupt, what)
        arrays.pop(STANDS_FOR_KEY)
    arrays[DIGEST_KEY] = stored
    return arrays


#: A zip local file header: signature, ..., name length, extra length (the last two at 26:30).
_LOCAL_HEADER = 30


def _map_member(
    path: Path, fh: BinaryIO, info: zipfile.ZipInfo, corrupt: Callable[[str], CorruptCache]
) -> NDArray:
    """A read-only memory map of one uncompressed ``.npy`` member of an archive (checked to fit)."""
    name = info.filename
    if info.compress_type != zipfile.ZIP_STORED:
        raise corrupt(f"member {name} is compressed and cannot be memory-mapped")
    fh.seek(info.header_offset)
    head = fh.read(_LOCAL_HEADER)
    if len(head) != _LOCAL_HEADER or head[:4] != b"PK\x03\x04":
        raise corrupt(f"member {name}: no local file header at its recorded offset")
    n_name, n_extra = struct.unpack("<HH", head[26:30])
    start = info.header_offset + _LOCAL_HEADER + n_name + n_extra
    fh.seek(start)
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:
        raise corrupt(f"member {name}: .npy format {version} cannot be memory-mapped")
    if fortran or dtype.hasobject or dtype.kind not in "biufU":
        raise corrupt(
            f"member {name}: a {'Fortran-ordered ' if fortran else ''}{dtype} array cannot be mapped"
        )
    data = fh.tell()
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if data - start + nbytes != info.file_size or data + nbytes > os.fstat(fh.fileno()).st_size:
        raise corrupt(
            f"member {name}: {nbytes:,} bytes of {dtype} {shape} do not fit its stored size"
        )
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data, shape=shape)


#: The suffix of the record :func:`record_written` keeps beside a file.
WRITTEN_SUFFIX = ".written.json"


def _written_path(path: Path) -> Path:
    return path.with_name(path.name + WRITTEN_SUFFIX)


def _identity_of(st: os.stat_result) -> dict[str, int]:
    return {
        "inode": int(st.st_ino),
        "size": int(st.st_size),
        "mtime_ns": int(st.st_mtime_ns),
        "ctime_ns": int(st.st_ctime_ns),
    }


def record_written(path: str | Path, stands_for: Mapping[str, object]) -> Path:
    """Record, beside a file just written, its identity and what it stands for (the digest of
    what it was computed from), for :func:`open_written`. Returns ``path``."""
    path = Path(path)
    atomic_write_json(
        _written_path(path),
        {"file": _identity_of(os.stat(path)), STANDS_FOR_KEY: str(stands_for_record(stands_for))},
    )
    return path


def open_written(
    path: str | Path,
    *,
    what: str,
    stands_for: Mapping[str, object],
    open_file: Callable[[Path], object],
) -> object:
    """Open (``open_file(path)``: memory-map) a file written with :func:`record_written` only
    when it is still the very file written, for ``stands_for``.

    Raises:
        CorruptCache: no record, a record of another input, or a file that is not the one written
            (other inode, size, modification or change time); the file and its record are what
            :meth:`CorruptCache.remove` deletes.
    """
    path = Path(path)
    written = check_written(path, what=what, stands_for=stands_for)
    opened = open_file(path)
    if _identity_of(os.stat(path)) != written:
        raise CorruptCache(
            f"{what} changed while it was being opened", path, discard=(path, _written_path(path))
        )
    return opened


def check_written(
    path: str | Path, *, what: str, stands_for: Mapping[str, object]
) -> dict[str, int]:
    """The check of :func:`open_written` alone (for a file opened some other way): ``path`` is
    the file :func:`record_written` recorded, for ``stands_for``. Returns its recorded identity.

    Raises:
        CorruptCache: as :func:`open_written`.
    """
    path = Path(path)
    record_path = _written_path(path)

    def corrupt(problem: str) -> CorruptCache:
        return CorruptCache(problem, path, discard=(path, record_path))

    try:
        record = json.loads(read_input_bytes(record_path, limit=1 << 16))
        written = {k: int(v) for k, v in record["file"].items()}
        found = record[STANDS_FOR_KEY]
    except (InputError, ValueError, KeyError, TypeError, AttributeError):
        raise corrupt(f"{what} has no readable record of how it was written") from None
    _check_stands_for(found, stands_for, corrupt, what)
    try:
        now = _identity_of(os.stat(path))
    except OSError:
        raise corrupt(f"{what} is missing") from None
    if now != written:
        raise corrupt(f"{what} is not the file written (replaced or changed since)")
    return written
