"""Safe extraction of tar / tar.gz / zip archives.

No dataset archive needs anything but regular files and folders, so nothing else is extracted:

- a member that is a symbolic link, a hard link, a device node, a FIFO or anything else that is
  not a regular file or a folder makes the whole archive refused (the error names the member and
  what it is) -- in tar and zip alike (a zip member is a link when its Unix mode, in
  ``external_attr``, says ``S_IFLNK``). Links are refused rather than skipped because an archive
  that carries them is not one the owners published, and the data root must not record it as
  verified ("trust on first use");
- an absolute member name, a drive letter, a NUL byte or a ``..`` component is refused too;
- every member is written below a fresh private folder (``mkdtemp``: a unique name, mode 0700,
  nothing else can write there), each file opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` after
  the real path of its folder was checked to lie inside that private folder -- so even a link
  that got there some other way could not redirect a write;
- the private folder is renamed to the target only when every member is out, so an interrupted
  or failed extraction never leaves a folder that looks complete. Private folders of a process
  that was killed meanwhile are removed by the next extraction into the same parent folder.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from oxbench.errors import InputError
from oxbench.fileio import TEMP_PREFIX, file_mode

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_SUFFIX = ".extracting"
#: A private folder whose process is alive is still removed once it is this old (pid reuse).
_STALE_AFTER_S = 24 * 3600.0
_REFUSE = "dataset archives hold only files and folders; refusing to extract"


def is_archive(path: str | Path) -> bool:
    """Whether ``path`` names a file oxbench can extract (by content, not by name)."""
    path = Path(path)
    if not path.is_file():
        return False
    try:
        return tarfile.is_tarfile(path) or zipfile.is_zipfile(path)
    except (OSError, EOFError, tarfile.TarError, zlib.error):
        return False


def _safe_rel(name: str, source: Path) -> PurePosixPath:
    """The member name as a relative path that stays inside the target, or InputError."""
    norm = name.replace("\\", "/")
    if "\x00" in norm:
        raise InputError(
            f"archive member {name!r} has a NUL byte in its name; refusing to extract", source
        )
    if norm.startswith("/") or (len(norm) > 1 and norm[1] == ":"):
        raise InputError(
            f"archive member {name!r} has an absolute path; refusing to extract", source
        )
    parts = [p for p in PurePosixPath(norm).parts if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InputError(
            f"archive member {name!r} leaves the target folder ('..'); refusing to extract", source
        )
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def _tar_kind(m: tarfile.TarInfo) -> str | None:
    """``"file"``, ``"dir"``, or ``None`` after naming what else it is."""
    if m.isfile():
        return "file"
    if m.isdir():
        return "dir"
    return None


def _tar_what(m: tarfile.TarInfo) -> str:
    if m.issym():
        return f"a symbolic link (to {m.linkname!r})"
    if m.islnk():
        return f"a hard link (to {m.linkname!r})"
    if m.ischr() or m.isblk():
        return "a device node"
    if m.isfifo():
        return "a FIFO"
    return f"a special member (tar type {m.type!r})"


def _zip_mode_what(mode: int) -> str | None:
    """What a zip member's Unix file type is, when it is neither a file nor a folder."""
    kind = stat.S_IFMT(mode)
    if kind in (0, stat.S_IFREG, stat.S_IFDIR):  # 0: no Unix mode recorded (e.g. Windows zips)
        return None
    if kind == stat.S_IFLNK:
        return "a symbolic link"
    if kind in (stat.S_IFCHR, stat.S_IFBLK):
        return "a device node"
    if kind == stat.S_IFIFO:
        return "a FIFO"
    return f"a special member (Unix mode {mode:o})"


def _refuse(name: str, what: str, source: Path) -> InputError:
    return InputError(f"archive member {name!r} is {what}; {_REFUSE}", source)


class _Writer:
    """Creates folders and files strictly below one private folder."""

    def __init__(self, root: Path, source: Path) -> None:
        self.root = root
        self.real_root = os.path.realpath(root)
        self.source = source

    def _inside(self, path: Path, name: str) -> None:
        real = os.path.realpath(path)
        if real != self.real_root and not real.startswith(self.real_root + os.sep):
            raise InputError(
                f"archive member {name!r} would be written outside the target folder "
                f"({real}); refusing to extract",
                self.source,
            )

    def mkdir(self, rel: PurePosixPath, name: str) -> Path:
        path = self.root
        for part in rel.parts:
            path = path / part
            try:
                os.mkdir(path)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise InputError(
                        f"archive member {name!r} needs the folder {part!r}, which the archive "
                        "gives as a file; refusing to extract",
                        self.source,
                    ) from None
            self._inside(path, name)
        return path

    @contextlib.contextmanager
    def open_file(self, rel: PurePosixPath, name: str) -> Iterator[IO[bytes]]:
        if rel == PurePosixPath("."):
            raise InputError(f"archive member {name!r} is a file without a name", self.source)
        parent = self.mkdir(rel.parent, name)
        dest = parent / rel.name
        self._inside(dest, name)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(dest, flags, file_mode())
        except FileExistsError:
            st = os.lstat(dest)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(
                    f"archive member {name!r} is both a folder and a file; refusing to extract",
                    self.source,
                ) from None
            os.unlink(dest)  # a tar may hold a file twice: the later copy wins, as with tar(1)
            fd = os.open(dest, flags, file_mode())
        with os.fdopen(fd, "wb") as fh:
            yield fh


def _extract_tar(path: Path, out: Path) -> int:
    n = 0
    writer = _Writer(out, path)
    with tarfile.open(path, "r:*") as tar:
        members = []
        for m in tar.getmembers():
            rel = _safe_rel(m.name, path)
            kind = _tar_kind(m)
            if kind is None:
                raise _refuse(m.name, _tar_what(m), path)
            members.append((m, rel, kind))
        for m, rel, kind in members:
            if kind == "dir":
                writer.mkdir(rel, m.name)
                continue
            src = tar.extractfile(m)
            if src is None:  # pragma: no cover - isfile() members always have data
                raise _refuse(m.name, _tar_what(m), path)
            with src, writer.open_file(rel, m.name) as fh:
                shutil.copyfileobj(src, fh, _CHUNK)
            n += 1
    return n


def _extract_zip(path: Path, out: Path) -> int:
    n = 0
    writer = _Writer(out, path)
    with zipfile.ZipFile(path) as zf:
        infos = []
        for info in zf.infolist():
            rel = _safe_rel(info.filename, path)
            what = _zip_mode_what(info.external_attr >> 16)
            if what is not None:
                raise _refuse(info.filename, what, path)
            infos.append((info, rel))
        for info, rel in infos:
            if info.is_dir():
                writer.mkdir(rel, info.filename)
                continue
            with zf.open(info) as src, writer.open_file(rel, info.filename) as fh:
                shutil.copyfileobj(src, fh, _CHUNK)
            n += 1
    return n


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: alive, another user's
        return True
    return True


def remove_stale_extractions(folder: str | Path) -> int:
    """Remove the private extraction folders that killed processes left in ``folder``.

    A private folder is named ``.oxbench-tmp-<target>.<pid>.<random>.extracting``; it is stale when
    process ``<pid>`` is gone (or, against pid reuse, when it is more than a day old). Folders of
    a live extraction are left alone. Returns how many were removed.
    """
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    now = time.time()
    for entry in entries:
        name = entry.name
        if not (name.startswith(TEMP_PREFIX) and name.endswith(_SUFFIX)):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            continue
        pid_text = name[: -len(_SUFFIX)].rsplit(".", 2)
        pid = (
            int(pid_text[1])
            if len(pid_text) == 3
            and pid_text[1].isascii()
            and pid_text[1].isdigit()
            and len(pid_text[1]) <= 10
            else None
        )
        dead = pid is None or (pid != os.getpid() and not _pid_alive(pid))
        if dead or now - st.st_mtime > _STALE_AFTER_S:
            shutil.rmtree(entry.path, ignore_errors=True)
            if not os.path.lexists(entry.path):
                log.info("removed %s, left by an interrupted extraction", entry.path)
                removed += 1
    return removed


def _dir_mode() -> int:
    """A folder's mode under the user's umask: execute wherever read is allowed."""
    mode = file_mode()
    return mode | ((mode & 0o444) >> 2)


def extract_archive(archive: str | Path, target: str | Path) -> Path:
    """Extract ``archive`` (tar, tar.gz/bz2/xz, zip) into the new folder ``target``, safely.

    Only regular files and folders are extracted; see the module docstring for what is refused.
    The members go to a fresh private folder beside ``target`` first; ``target`` appears (by
    rename) only once all of them are out.

    Args:
        archive: the archive file.
        target: a folder that must not exist yet.

    Returns:
        ``target``.

    Raises:
        InputError: not an archive, corrupt or truncated archive, a link/device/FIFO member, a
            member outside the target, or ``target`` already exists. Nothing is left at
            ``target`` (nor outside it) on failure.
    """
    archive, target = Path(archive), Path(target)
    if os.path.lexists(target):
        raise InputError("extraction target already exists; remove it first", target)
    if not archive.is_file():
        raise InputError("archive not found", archive)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_extractions(target.parent)
        tmp = Path(
            tempfile.mkdtemp(
                prefix=f"{TEMP_PREFIX}{target.name}.{os.getpid()}.",
                suffix=_SUFFIX,
                dir=target.parent,
            )
        )
    except OSError as exc:
        raise InputError(f"cannot extract here: {exc.strerror or exc}", target) from None
    try:
        if tarfile.is_tarfile(archive):
            n = _extract_tar(archive, tmp)
        elif zipfile.is_zipfile(archive):
            n = _extract_zip(archive, tmp)
        else:
            raise InputError(
                "not a tar or zip archive (corrupt or truncated download?); delete it and fetch "
                "again",
                archive,
            )
        os.chmod(tmp, _dir_mode())
        os.rename(tmp, target)
    except InputError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno == errno.ENAMETOOLONG:
            raise InputError(
                f"an archive member's name is too long ({exc.strerror})", archive
            ) from None
        if exc.errno is not None:  # a real I/O problem (disk full, permissions), not bad data
            raise InputError(
                f"cannot extract: {exc.strerror}; free space or fix permissions", target
            ) from None
        raise InputError(
            f"corrupt or truncated archive ({type(exc).__name__}: {exc}); delete it and fetch again",
            archive,
        ) from None
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        zlib.error,
        EOFError,
        NotImplementedError,
        ValueError,
    ) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(
            f"corrupt or truncated archive ({type(exc).__name__}: {exc}); delete it and fetch again",
            archive,
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("extracted %d files from %s", n, archive)
    return target
