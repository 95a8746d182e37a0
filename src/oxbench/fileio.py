"""The package's one place for files: atomic writes, digests, checksums, locks, progress bars.

Every file oxbench writes goes through :func:`atomic_open` (or a typed wrapper): the bytes go to a
uniquely named temporary file in the destination folder, which is renamed over the final name only
when complete, so a crash, a full disk or a second process never leaves a half-written file under
the final name. The final path must be absent or a regular file: a symlink, FIFO, device or folder
there is refused rather than replaced (:func:`check_output_path`). Written files get the user's
umask, like any file the user's shell would create.

Inputs are read through :func:`read_input_bytes`, which refuses non-regular files (``/dev/zero``,
FIFOs) and files larger than a stated limit, so a hostile path can neither hang nor exhaust memory.

This module is internal: the public API lives in the subpackages.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import hashlib
import io
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from oxbench.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from tqdm import tqdm as Tqdm

#: Prefix of every temporary file and folder oxbench creates beside a final name.
TEMP_PREFIX = ".oxbench-tmp-"

#: Default size limit of an input file read whole into memory (ground truth, lists, results).
DEFAULT_INPUT_LIMIT = 1 << 30

#: Temporary files and folders this process is writing now (:func:`atomic_open`,
#: :func:`make_temp_folder`), for :func:`remove_own_temporaries`.
_IN_FLIGHT: set[str] = set()


@contextlib.contextmanager
def temporary_in_flight(path: str | Path) -> Iterator[None]:
    """Count ``path`` (a temporary file or folder this process made and removes itself when the
    block fails) among those :func:`remove_own_temporaries` removes while the block runs."""
    _IN_FLIGHT.add(str(path))
    try:
        yield
    finally:
        _IN_FLIGHT.discard(str(path))


def remove_own_temporaries() -> None:
    """Remove the temporary files and folders this process is still writing (those of
    :func:`atomic_open` and :func:`make_temp_folder`; nothing else), for a process that must end
    at once (a signal that found the main thread in a long compiled computation,
    :func:`oxbench.cli.stop_on_signals`) and will run no ``finally`` block."""
    for path in list(_IN_FLIGHT):
        with contextlib.suppress(OSError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        _IN_FLIGHT.discard(path)


def _umask() -> int:
    # os.umask can only be read by setting it; do it once per process, restoring it at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK: int | None = None


def file_mode() -> int:
    """The mode a new regular file gets under this process's umask (``0o666 & ~umask``)."""
    global _UMASK
    if _UMASK is None:
        _UMASK = _umask()
    return 0o666 & ~_UMASK


def os_reason(exc: OSError) -> str:
    """The OS's own words for a failed call (``No space left on device``)."""
    return exc.strerror or str(exc)


def check_output_path(path: str | Path) -> Path:
    """Refuse a final output path that is not absent or a regular file.

    A symlink (even to a regular file), FIFO, device node, socket or folder at ``path`` is refused:
    writing through or over it would clobber something that is not ours.

    Raises:
        InputError: ``path`` exists and is not a regular file, or its parent is not a folder.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:
        raise InputError("cannot write here: a parent of this path is a file", path) from None
    except OSError as exc:
        raise InputError(f"cannot write: {os_reason(exc)}", path) from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise InputError("refusing to write over a symbolic link", path)
        if stat.S_ISDIR(st.st_mode):
            raise InputError("refusing to write: this path is a folder", path)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("refusing to write over a special file (FIFO, device or socket)", path)
    return path


def _make_parent(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError("cannot write here: a parent of this path is a file", path) from None
    except OSError as exc:
        raise InputError(f"cannot create its folder: {os_reason(exc)}", path) from None


def make_folder(folder: str | Path) -> Path:
    """Create ``folder`` and its parents when missing, for writing into.

    Raises:
        InputError: ``folder`` or one of its parents is a file, or the OS refuses (names the
            folder and the OS reason: read-only file system, no space, permission).
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(
            "cannot create this folder: it, or one of its parents, is a file", folder
        ) from None
    except OSError as exc:
        raise InputError(f"cannot create this folder: {os_reason(exc)}", folder) from None
    return folder


@contextlib.contextmanager
def atomic_open(path: str | Path, *, fsync: bool = False) -> Iterator[IO[bytes]]:
    """A binary file handle whose content appears at ``path`` only when the block completes.

    The data is written to ``<dir>/.oxbench-tmp-<name>.<random>`` and renamed over ``path`` at the
    end; on any exception the temporary file is removed and ``path`` is untouched.

    Raises:
        InputError: ``path`` is a symlink or special file, or the OS refuses the write (names the
            path and the OS reason: read-only folder, full disk, parent is a file).
    """
    path = check_output_path(path)
    _make_parent(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write: {os_reason(exc)}", path) from None
    _IN_FLIGHT.add(tmp)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        check_output_path(path)  # nothing swapped a link in while we wrote
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InputError(f"cannot write: {os_reason(exc)}", path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        _IN_FLIGHT.discard(tmp)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_open`). Returns ``path``."""
    with atomic_open(path) as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, data: Any, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON (sorted keys, a final newline) to ``path`` atomically."""
    text = json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n"
    return atomic_write_text(path, text)


def atomic_write_npy(path: str | Path, array: np.ndarray) -> Path:
    """Write one array as ``.npy`` (no pickles) to ``path`` atomically."""
    with atomic_open(path) as fh:
        np.save(fh, np.asarray(array), allow_pickle=False)
    return Path(path)


def atomic_write_npz(
    path: str | Path, arrays: Mapping[str, np.ndarray], *, compress: bool = False
) -> Path:
    """Write named arrays as ``.npz`` (no pickles) to ``path`` atomically."""
    buf = io.BytesIO()
    save = np.savez_compressed if compress else np.savez
    save(buf, allow_pickle=False, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return atomic_write_bytes(path, buf.getvalue())


def atomic_copy(src: str | Path, dest: str | Path, *, link: bool = False) -> Path:
    """Lay ``src`` out at ``dest`` atomically: a hard link when ``link`` and the file system
    allows one, else a copy (written like any other output: unique temp name, umask mode).

    Raises:
        InputError: ``src`` is unreadable, or ``dest`` cannot be written (see :func:`atomic_open`).
    """
    dest = check_output_path(dest)
    _make_parent(dest)
    if link:
        tmp = dest.parent / f"{TEMP_PREFIX}{dest.name}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            os.link(src, tmp)
        except OSError:  # another file system, or links not allowed: copy
            pass
        else:
            try:
                check_output_path(dest)
                os.replace(tmp, dest)
                return dest
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
    try:
        fin = open(src, "rb")  # noqa: SIM115 - closed below, after the atomic write
    except OSError as exc:
        raise InputError(f"cannot read: {os_reason(exc)}", src) from None
    with fin, atomic_open(dest) as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
    return dest


def make_temp_folder(final: str | Path, *, tag: str = "") -> Path:
    """A new, uniquely named, empty temporary folder beside ``final`` (user's umask mode), to be
    filled and then committed by :func:`commit_folder`.

    Its name starts with :data:`TEMP_PREFIX` and the name of ``final``, then ``tag`` (e.g. the
    token of the run that owns it, so that run can clean up its own dead attempts).

    Raises:
        InputError: the parent cannot be created or written.
    """
    final = Path(final)
    _make_parent(final)
    try:
        tmp = tempfile.mkdtemp(
            prefix=f"{TEMP_PREFIX}{final.name}.{tag}{'.' if tag else ''}", dir=final.parent
        )
        file_mode()  # reads the umask once
        os.chmod(
            tmp, 0o777 & ~(_UMASK or 0)
        )  # mkdtemp makes 0700; a shared cache needs the umask's
    except OSError as exc:
        raise InputError(f"cannot create a folder: {os_reason(exc)}", final.parent) from None
    _IN_FLIGHT.add(tmp)
    return Path(tmp)


def commit_folder(tmp: str | Path, final: str | Path) -> bool:
    """Commit the complete folder ``tmp`` as ``final`` by one rename; the first commit wins.

    Returns ``True`` when this call committed it, ``False`` when ``final`` already existed (another
    attempt committed first): then ``tmp`` is removed and ``final`` is left as it is. Either way
    ``tmp`` is gone afterwards. ``final`` must never be a link.

    Raises:
        InputError: the OS refuses the rename for another reason (names the path and the reason).
    """
    tmp, final = Path(tmp), Path(final)
    _IN_FLIGHT.discard(str(tmp))
    try:
        if os.path.lexists(final):  # rename(2) would replace an empty folder, or a link's target
            raise FileExistsError(errno.EEXIST, "exists")
        os.rename(tmp, final)
        return True
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY) or isinstance(exc, FileExistsError):
            return False
        raise InputError(f"cannot commit: {os_reason(exc)}", final) from None


def discard_folder(folder: str | Path) -> None:
    """Remove a committed folder so that it disappears at once (renamed to a temporary name, then
    deleted): a reader sees it whole or not at all."""
    folder = Path(folder)
    trash = folder.with_name(
        f"{TEMP_PREFIX}{folder.name}.discarded.{os.getpid()}.{time.monotonic_ns()}"
    )
    try:
        os.rename(folder, trash)
    except FileNotFoundError:
        return
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def refuse_link(path: str | Path, *, what: str = "cache folder") -> Path:
    """``path`` unless it is a symbolic link: a link planted in oxbench's own folders would have
    it read, write or clean another place's file.

    Raises:
        InputError: ``path`` is a symlink (names it).
    """
    if os.path.islink(path):
        raise InputError(f"refusing a {what} that is a symbolic link", path)
    return Path(path)


def refuse_linked_folder(folder: str | Path, *, below: str | Path) -> Path:
    """``folder`` if neither it nor any folder between ``below`` (excluded) and it is a symlink.

    A cache folder replaced by a link would have oxbench write (and clean temporaries) in the
    link's target, outside the cache: refused instead.

    Raises:
        InputError: ``folder`` or one of its parents up to ``below`` is a symlink (names it).
    """
    folder, below = Path(folder), Path(below)
    path = folder
    while (
        path != below and path.parent != path
    ):  # ``below`` itself (the user's cache) may be a link
        refuse_link(path)
        path = path.parent
    return folder


def remove_stale_temps(
    folder: str | Path, *, older_than_s: float = 3600.0, patterns: tuple[str, ...] = ()
) -> int:
    """Delete temporary files and folders that a killed process left in ``folder`` (not recursive).

    Only names with :data:`TEMP_PREFIX` (or matching one of the ``fnmatch`` ``patterns``, for
    temporary names chosen elsewhere) older than ``older_than_s`` are touched, so a write in
    progress in another process is left alone. Returns how many were removed.
    """
    folder = Path(folder)
    if os.path.islink(folder):  # never delete through a link into someone else's folder
        return 0
    removed = 0
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for entry in entries:
        if not (
            entry.name.startswith(TEMP_PREFIX)
            or any(fnmatch.fnmatchcase(entry.name, p) for p in patterns)
        ):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if now - st.st_mtime < older_than_s:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
            removed += 1
        except OSError:
            continue
    return removed


# --- reading -----------------------------------------------------------------------------------


def require_regular_file(path: str | Path) -> os.stat_result:
    """``stat`` of an input file that must exist and be a regular file (links are followed).

    Raises:
        InputError: missing, unreadable, a folder, or a FIFO/device/socket (names the file).
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except NotADirectoryError:
        raise InputError("file not found (a parent of this path is a file)", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {os_reason(exc)}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder, expected a file", path)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (FIFO, device or socket); give a file", path)
    return st


def read_input_bytes(path: str | Path, *, limit: int = DEFAULT_INPUT_LIMIT) -> bytes:
    """The bytes of an input file, refusing special files and files over ``limit`` bytes.

    Raises:
        InputError: missing, unreadable, not a regular file, or larger than ``limit``.
    """
    st = require_regular_file(path)  # before opening: opening a FIFO would block
    if st.st_size > limit:
        raise InputError(
            f"file is {st.st_size:,} bytes; the limit for this input is {limit:,}", path
        )
    try:
        with open(path, "rb") as fh:
            # the file opened may be a newer one than the file stat'ed (replaced by a rename meanwhile)
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise InputError("not a regular file (FIFO, device or socket); give a file", path)
            if st.st_size > limit:
                raise InputError(
                    f"file is {st.st_size:,} bytes; the limit for this input is {limit:,}", path
                )
            # read(n) allocates n bytes up front: ask for the size seen (+1 to notice growth), not the limit
            data = fh.read(min(st.st_size, limit) + 1)
            if len(data) > st.st_size:
                data += fh.read(limit + 1 - len(data))
    except OSError as exc:
        raise InputError(f"cannot read: {os_reason(exc)}", path) from None
    if len(data) > limit:
        raise InputError(f"file grew past the limit of {limit:,} bytes while being read", path)
    if len(data) > st.st_size:
        raise InputError("file grew while being read; read it again when it is complete", path)
    return data


# --- digests and checksums -----------------------------------------------------------------------


def file_digests(
    path: str | Path, algorithms: tuple[str, ...] = ("sha256",), *, block: int = 1 << 20
) -> dict[str, str]:
    """Hex digests of a file's bytes, read once in blocks: ``{"sha256": ..., "md5": ...}``."""
    hashers = {a: hashlib.new(a) for a in algorithms}
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(block), b""):
            for h in hashers.values():
                h.update(chunk)
    return {a: h.hexdigest() for a, h in hashers.items()}


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, as hex."""
    return file_digests(path, ("sha256",))["sha256"]


def text_digest(text: str, n: int | None = None) -> str:
    """SHA-256 of a string, as hex (the first ``n`` characters when given)."""
    d = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return d if n is None else d[:n]


def json_digest(data: Any, n: int | None = None) -> str:
    """SHA-256 of a JSON-able value in canonical form (sorted keys), as hex (first ``n`` chars)."""
    return text_digest(json.dumps(data, sort_keys=True, default=str), n)


def checksum_mismatch(
    expected: Mapping[str, str | int | None], found: Mapping[str, str | int | None]
) -> str | None:
    """Compare recorded and found checksums/sizes; the first difference as words, or ``None``.

    Keys are ``size`` and digest names (``sha256``, ``md5``), compared in that order (size,
    sha256, then the others by name); a key missing or ``None`` on either side is not compared.
    Digests compare case-insensitively.
    """
    # sha256 before the weaker digests: the message names the checksum people compare
    for key in ("size", "sha256", *sorted(k for k in expected if k not in ("size", "sha256"))):
        want, got = expected.get(key), found.get(key)
        if want is None or got is None:
            continue
        if key == "size":
            if int(want) != int(got):
                return f"size {int(got):,} bytes differs from the expected {int(want):,}"
        elif str(want).lower() != str(got).lower():
            return f"{key} {got} differs from the expected {want}"
    return None


def sampled_digest(path: str | Path, *, sample: int = 1 << 16) -> str:
    """A cheap content fingerprint: SHA-256 of the size, the first/middle/last ``sample`` bytes.

    For cache artifacts too large to hash in full on every load; catches truncation and most
    corruption (a flipped byte outside the samples is not caught: use :func:`file_sha256` where
    that matters).
    """
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as fh:
        for start in sorted({0, max(0, size // 2 - sample // 2), max(0, size - sample)}):
            fh.seek(start)
            h.update(fh.read(sample))
    return h.hexdigest()


# --- locks ---------------------------------------------------------------------------------------


class LockBusy(InputError):
    """Another process holds the lock."""


@contextlib.contextmanager
def file_lock(path: str | Path, *, wait: float = 0.0, what: str = "this folder") -> Iterator[Path]:
    """Hold an exclusive advisory lock on ``path`` (created if absent) for the block.

    Locks are released by the OS when the holder dies, so a killed run never leaves a stale lock.

    Args:
        path: the lock file (e.g. ``<run folder>.lock``).
        wait: seconds to wait for another holder before giving up (0: fail at once).
        what: what the lock protects, for the error message.

    Raises:
        LockBusy: another process holds it after ``wait`` seconds.
    """
    path = Path(path)
    _make_parent(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, file_mode())
    except OSError as exc:
        raise InputError(f"cannot create the lock file: {os_reason(exc)}", path) from None
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise InputError(f"cannot lock: {os_reason(exc)}", path) from None
                if time.monotonic() >= deadline:
                    raise LockBusy(
                        f"another oxbench process is writing {what}; wait for it to finish "
                        "or use another folder",
                        path,
                    ) from None
                time.sleep(0.1)
        yield path
    finally:
        os.close(fd)


# --- progress ------------------------------------------------------------------------------------


def progress_bar(
    iterable: Any = None,
    *,
    enabled: bool = True,
    total: int | None = None,
    desc: str | None = None,
    unit: str = "it",
    initial: int = 0,
    leave: bool = True,
) -> Tqdm:
    """The package's progress bar: ``tqdm`` (``disable=True`` when not ``enabled``)."""
    from tqdm.auto import tqdm

    return tqdm(
        iterable,
        total=total,
        desc=desc,
        unit=unit,
        initial=initial,
        leave=leave,
        disable=not enabled,
    )
