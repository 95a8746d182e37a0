"""Safe extraction of tar / tar.gz / zip archives.

Every member is checked before anything is written: absolute paths, ``..`` components, device
files, and symbolic or hard links whose target leaves the extraction folder are refused (the whole
archive is refused: a dataset archive that tries any of these is not one we should half-trust).
Extraction goes to a temporary sibling folder that is renamed into place only when every member is
out, so an interrupted or failed extraction never leaves a folder that looks complete.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from oxbench.errors import InputError

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


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


def _link_stays_inside(member_rel: PurePosixPath, target: str, *, hard: bool) -> bool:
    """Whether a link at ``member_rel`` pointing to ``target`` resolves inside the root."""
    if target.startswith("/") or "\\" in target:
        return False
    base = PurePosixPath() if hard else member_rel.parent
    depth = 0
    for part in (base / target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part not in ("", "."):
            depth += 1
    return depth > 0


def _check_tar(tar: tarfile.TarFile, source: Path) -> list[tuple[tarfile.TarInfo, PurePosixPath]]:
    members = []
    for m in tar.getmembers():
        rel = _safe_rel(m.name, source)
        if m.issym() or m.islnk():
            if not _link_stays_inside(rel, m.linkname, hard=m.islnk()):
                raise InputError(
                    f"archive member {m.name!r} is a link to {m.linkname!r} outside the target "
                    "folder; refusing to extract",
                    source,
                )
        elif not (m.isfile() or m.isdir()):
            raise InputError(
                f"archive member {m.name!r} is a device or special file; refusing to extract",
                source,
            )
        members.append((m, rel))
    return members


def _extract_tar(path: Path, out: Path) -> int:
    n = 0
    with tarfile.open(path, "r:*") as tar:
        members = _check_tar(tar, path)
        for m, rel in members:
            dest = out / rel
            if m.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if m.issym():
                os.symlink(m.linkname, dest)
            elif m.islnk():
                os.link(out / _safe_rel(m.linkname, path), dest)
            else:
                src = tar.extractfile(m)
                assert src is not None
                with src, open(dest, "wb") as fh:
                    shutil.copyfileobj(src, fh, _CHUNK)
                n += 1
    return n


def _extract_zip(path: Path, out: Path) -> int:
    n = 0
    with zipfile.ZipFile(path) as zf:
        infos = []
        for info in zf.infolist():
            rel = _safe_rel(info.filename, path)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                target = zf.read(info).decode("utf-8", "replace")
                if not _link_stays_inside(rel, target, hard=False):
                    raise InputError(
                        f"archive member {info.filename!r} is a link to {target!r} outside the target "
                        "folder; refusing to extract",
                        path,
                    )
            infos.append((info, rel, mode))
        for info, rel, mode in infos:
            dest = out / rel
            if info.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if stat.S_ISLNK(mode):
                os.symlink(zf.read(info).decode("utf-8"), dest)
                continue
            with zf.open(info) as src, open(dest, "wb") as fh:
                shutil.copyfileobj(src, fh, _CHUNK)
            n += 1
    return n


def extract_archive(archive: str | Path, target: str | Path) -> Path:
    """Extract ``archive`` (tar, tar.gz/bz2/xz, zip) into the new folder ``target``, safely.

    The members go to a temporary sibling folder first; ``target`` appears (by rename) only once
    all of them are out.

    Args:
        archive: the archive file.
        target: a folder that must not exist yet.

    Returns:
        ``target``.

    Raises:
        InputError: not an archive, corrupt or truncated archive, unsafe member, or ``target``
            already exists. Nothing is left at ``target`` on failure.
    """
    archive, target = Path(archive), Path(target)
    if target.exists():
        raise InputError("extraction target already exists; remove it first", target)
    if not archive.is_file():
        raise InputError("archive not found", archive)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".extracting", dir=target.parent))
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
        os.replace(tmp, target)
    except InputError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno is not None:  # a real I/O problem (disk full, permissions), not bad data
            raise InputError(
                f"cannot extract: {exc.strerror}; free space or fix permissions", target
            ) from None
        raise InputError(
            f"corrupt or truncated archive ({type(exc).__name__}: {exc}); delete it and fetch again",
            archive,
        ) from None
    except (tarfile.TarError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
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
