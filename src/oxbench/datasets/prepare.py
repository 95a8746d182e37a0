"""Getting a dataset onto disk: ``fetch`` from the owners, or ``import`` a copy the user has.

Both lay the files out in the canonical layout of the catalog (``<root>/<id>/jpg/...`` plus the
ground-truth files, see :mod:`oxbench.datasets.families`) and record what they checked in the data
root's lock file. Library functions; the ``oxbench data`` commands are thin wrappers.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oxbench.datasets.archive import extract_archive, is_archive, remove_stale_extractions
from oxbench.datasets.catalog import get_spec
from oxbench.datasets.fetch import (
    MIRROR_ENV,
    DownloadResult,
    DownloadTask,
    Expected,
    candidate_urls,
    check_free_space,
    check_mirror,
    download_many,
)
from oxbench.datasets.lock import LockFile
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import DatasetSpec, Placement, RemoteFile
from oxbench.errors import InputError
from oxbench.fileio import (
    TEMP_PREFIX,
    atomic_copy,
    check_output_path,
    checksum_mismatch,
    file_digests,
    file_mode,
    file_sha256,
    make_folder,
    os_reason,
    progress_bar,
    remove_stale_temps,
)

log = logging.getLogger(__name__)

_ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip", ".tar.bz2", ".tar.xz")


class TermsNotAccepted(InputError):
    """The dataset's terms of use were not accepted for this data root."""


@dataclass
class PrepareReport:
    """What ``fetch`` or ``import`` did.

    Attributes:
        dataset: the id.
        root: the dataset folder.
        files: one dict per downloaded/imported source file (name, url or source, size, sha256,
            skipped, placed = number of files laid out from it).
        placed: total files laid out.
        notes: warnings a user should read (unrecorded checksums, replaced files...).
        not_images: imported files (source paths) that matched the layout but are none of the
            dataset's images; they were not laid out.
    """

    dataset: str
    root: Path
    files: list[dict[str, Any]] = field(default_factory=list)
    placed: int = 0
    notes: list[str] = field(default_factory=list)
    not_images: list[str] = field(default_factory=list)


class _ImageTest:
    """``import``'s test of a destination against the dataset's images (its family's
    ``image_test``), rebuilt after a ground-truth or list file is laid out: images that come after
    the pickle in the same import are checked against the names it lists."""

    def __init__(self, spec: DatasetSpec, ddir: Path) -> None:
        self.spec, self.ddir = spec, ddir
        self._test: Callable[[str], bool] | None = None

    def __call__(self, target_rel: str) -> bool:
        if not target_rel.endswith(".jpg"):
            self._test = None  # it may be the image list: ask the family again for the next image
            return True
        if self._test is None:
            self._test = self.spec.family.image_test(self.spec, self.ddir)
        return self._test(target_rel)


def ensure_writable(root: Path) -> None:
    """Create ``root`` if needed and check that files can be written there.

    Raises:
        InputError: not creatable or not writable (with the remedy).
    """
    remedy = "choose another --root (or set OXBENCH_DATA) or fix its permissions"
    try:
        make_folder(root)
    except InputError as exc:
        raise InputError(f"data root is not writable ({exc.problem}); {remedy}", root) from None
    probe = root / f"{TEMP_PREFIX}write-test.{os.getpid()}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode()))
        os.unlink(probe)
    except OSError as exc:
        raise InputError(f"data root is not writable ({os_reason(exc)}); {remedy}", root) from None


def _remove_stale(ddir: Path) -> None:
    """Temporary files and extraction folders a killed fetch or import left in ``ddir``.

    Extraction folders are judged by their owner's pid (an R1M archive can take longer to extract
    than any age limit), the rest by age.
    """
    remove_stale_extractions(ddir)
    remove_stale_temps(ddir, patterns=(".extract-*", ".import-*", ".*.importing"))


def _extraction_target(ddir: Path, name: str) -> Path:
    """A fresh folder name in ``ddir`` for extracting archive ``name`` (two runs never share one)."""
    return ddir / f"{TEMP_PREFIX}extract-{name}.{os.getpid()}.{threading.get_ident()}"


def _expected(f: RemoteFile, lock: LockFile) -> Expected:
    if f.checksum_policy == "published":
        return Expected(size=f.size, sha256=f.sha256, md5=f.md5)
    rec = lock.file_record(f.name)
    if rec is None:
        return Expected(size=f.size)
    return Expected(size=rec.get("size", f.size), sha256=rec.get("sha256"), md5=rec.get("md5"))


def _place_file(src: Path, dest: Path, *, link: bool, move: bool) -> None:
    """Lay ``src`` out at ``dest`` (move, hard link or copy); ``dest`` appears only when complete."""
    if not move:
        atomic_copy(src, dest, link=link)
        return
    check_output_path(dest)
    make_folder(dest.parent)
    try:
        os.replace(src, dest)
    except OSError as exc:
        raise InputError(f"cannot write: {os_reason(exc)}", dest) from None


def _placement_for(rel: str, placements: tuple[Placement, ...]) -> Placement | None:
    for p in placements:
        if p.matches(rel):
            return p
    return None


def _place_tree(
    tree: Path,
    placements: tuple[Placement, ...],
    ddir: Path,
    *,
    link: bool,
    move: bool,
    seen: dict[str, Path],
    nested: list[Path] | None = None,
    bar: Any = None,
    before_place: Callable[[str, Path], None] | None = None,
    keep: Callable[[str], bool] | None = None,
    left_out: list[str] | None = None,
) -> int:
    """Lay out every file below ``tree`` that a placement matches; return how many.

    Files that match nothing but are archives are appended to ``nested`` (when given).
    Two different source files mapping to one destination is an error (names must be unique).
    A destination that ``keep`` refuses is not laid out; its path relative to ``tree`` goes to
    ``left_out``.
    """
    n = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        for fname in sorted(filenames):
            src = Path(dirpath) / fname
            if src.is_symlink() and not src.resolve().is_relative_to(tree.resolve()):
                log.warning("skipping %s: a link out of the imported folder", src)
                continue
            rel = src.relative_to(tree).as_posix()
            if fname.startswith("._") or "__MACOSX/" in rel:  # macOS resource forks, not images
                continue
            rule = _placement_for(rel, placements)
            if rule is None:
                if nested is not None and fname.lower().endswith(_ARCHIVE_SUFFIXES):
                    nested.append(src)
                continue
            target_rel = rule.target(rel)
            if keep is not None and not keep(target_rel):
                if left_out is not None:
                    left_out.append(rel)
                continue
            dest = ddir / target_rel
            if target_rel in seen:
                if seen[target_rel] != src and file_sha256(seen[target_rel]) != file_sha256(src):
                    raise InputError(
                        f"two different files map to {target_rel}: {seen[target_rel]} and {src}",
                        tree,
                    )
                continue
            seen[target_rel] = dest if move else src
            if dest.exists() and not move:
                try:
                    if os.path.samefile(src, dest):
                        n += 1
                        continue
                except OSError:
                    pass
            if before_place is not None:
                before_place(fname, src)
            _place_file(src, dest, link=link, move=move)
            n += 1
            if bar is not None:
                bar.update(1)
    return n


def _install_archive(f: RemoteFile, archive: Path, ddir: Path) -> int:
    """Extract ``archive`` next to the dataset and move its matching members into place."""
    tmp = _extraction_target(ddir, f.name)
    extract_archive(archive, tmp)
    try:
        n = _place_tree(tmp, f.placements, ddir, link=False, move=True, seen={})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if n == 0:
        raise InputError(
            "the archive holds none of the expected files (wrong or damaged archive?)", archive
        )
    return n


def space_needed(files: list[RemoteFile], ddir: Path, *, jobs: int, keep_archives: bool) -> int:
    """Bytes a fetch of ``files`` needs at its peak.

    Extracted content is counted at the archive's size (JPEGs do not compress). Without
    ``keep_archives`` each archive is deleted once laid out, so at most ``jobs`` archives exist
    at a time. Bytes already in ``.part`` files are not counted again.
    """

    def size(f: RemoteFile) -> int:
        return f.size if f.size is not None else (f.approx_size or 0)

    def partial(f: RemoteFile) -> int:
        part = ddir / (f.local_path + ".part")
        return part.stat().st_size if part.exists() else 0

    content = sum(size(f) for f in files)
    archives = sorted((max(0, size(f) - partial(f)) for f in files if f.archive), reverse=True)
    in_flight = sum(archives) if keep_archives else sum(archives[: max(1, jobs)])
    plain_partial = sum(partial(f) for f in files if not f.archive)
    return max(0, content - plain_partial) + in_flight


def _reuse_shared_archive(dataset_id: str, f: RemoteFile, base: Path, lock: LockFile) -> int:
    """Lay out ``f``'s files by hard-linking them from another dataset that installed ``f``.

    The Oxford image archive serves ``oxford5k`` and ``roxford5k``, the Paris ones ``paris6k``
    and ``rparis6k``: the second fetch need not download 2 GB again. Only archives whose
    placements are flat with base-name patterns qualify. Returns the number of files laid out
    (0: nothing to reuse).
    """
    from oxbench.datasets.catalog import DATASETS

    if not f.archive or any(p.mode != "flat" or "/" in p.pattern for p in f.placements):
        return 0
    for other_id in DATASETS:
        other = get_spec(other_id)
        if other_id == dataset_id or f.name not in lock.installed(other_id):
            continue
        if f not in other.files:
            continue
        n = 0
        for p in f.placements:
            src_dir = base / other_id / (p.into if p.into not in ("", ".") else "")
            if not src_dir.is_dir():
                continue
            for entry in sorted(os.scandir(src_dir), key=lambda e: e.name):
                if entry.is_file() and p.matches(entry.name):
                    src = Path(entry.path)
                    dest = base / dataset_id / p.target(entry.name)
                    if not (dest.exists() and os.path.samefile(src, dest)):
                        _place_file(src, dest, link=True, move=False)
                    n += 1
        if n:
            lock.mark_installed(dataset_id, f.name)
            return n
    return 0


def fetch_dataset(
    dataset_id: str,
    root: str | Path | None = None,
    *,
    accept_terms: bool = False,
    mirror: str | None = None,
    also_owners: bool = False,
    jobs: int = 4,
    keep_archives: bool = False,
    force: bool = False,
    progress: bool = True,
    **download_options: Any,
) -> PrepareReport:
    """Download, check and lay out ``dataset_id`` under ``<root>/<dataset_id>/``.

    Files already installed (per the lock file) are skipped; a partial download resumes. Archives
    are extracted safely and deleted afterwards unless ``keep_archives``.

    Args:
        dataset_id: catalog id.
        root: data root (default: ``$OXBENCH_DATA`` or the per-user default).
        accept_terms: accept the dataset's terms of use (required once per data root).
        mirror: base URL replacing the owners' host (default ``$OXBENCH_MIRROR``); with a
            mirror, the owners' hosts are not contacted unless ``also_owners``.
        also_owners: with a mirror, fall back to the owners' URLs when the mirror fails.
        jobs: parallel downloads.
        keep_archives: keep ``downloads/*.tgz`` after extraction (``verify`` then re-checks them).
        force: download and lay out again files the lock file says are installed.
        progress: tqdm bars.
        download_options: passed to :func:`oxbench.datasets.fetch.download_file` (``retries``,
            ``backoff``, ``timeout``, ``sleep``).

    Raises:
        InputError: unknown id, terms not accepted, root not writable, not enough disk space,
            or a failed/mismatching download (nothing incomplete is left looking complete).
    """
    spec = get_spec(dataset_id)
    if mirror is not None:
        mirror = check_mirror(mirror)
    elif os.environ.get(MIRROR_ENV):
        mirror = check_mirror(os.environ[MIRROR_ENV], MIRROR_ENV)
    base = data_root(root)
    if spec.synthetic:
        from oxbench.datasets.synthetic import ensure_default

        ensure_writable(base)
        ensure_default(base)
        return PrepareReport(spec.id, base / spec.id, notes=["generated locally"])
    if not spec.files:
        raise InputError(
            f"{spec.id} has no public download any more; import your copy with "
            f"`oxbench data import {spec.id} --from PATH`"
        )
    ensure_writable(base)
    ddir = base / spec.id
    lock = LockFile(base)
    if not lock.terms_accepted(spec.id):
        if not accept_terms:
            raise TermsNotAccepted(
                f"the terms of use of {spec.id} were not accepted; read them with "
                f"`oxbench data info {spec.id}` and pass --accept-terms"
            )
        lock.accept_terms(spec.id)
    installed = {} if force else lock.installed(spec.id)
    todo = [
        f
        for f in spec.files
        if f.name not in installed or (not f.archive and not (ddir / f.local_path).exists())
    ]
    report = PrepareReport(spec.id, ddir)
    if not force:
        for f in list(todo):
            n = _reuse_shared_archive(spec.id, f, base, lock)
            if n:
                todo.remove(f)
                report.placed += n
                report.files.append(
                    {
                        "name": f.name,
                        "url": None,
                        "size": 0,
                        "sha256": "",
                        "skipped": True,
                        "resumed": False,
                        "placed": n,
                        "reused": True,
                    }
                )
                report.notes.append(
                    f"{f.name}: reused {n} file(s) another dataset installed from it (hard links)"
                )
    if not todo:
        if not report.files:
            report.notes.append(
                "already installed; nothing to download (run `oxbench data verify`)"
            )
        return report
    check_free_space(
        ddir if ddir.exists() else base,
        space_needed(todo, ddir, jobs=jobs, keep_archives=keep_archives),
    )
    make_folder(ddir)
    _remove_stale(ddir)

    by_dest = {ddir / f.local_path: f for f in todo}

    report_guard = threading.Lock()

    def on_done(task: DownloadTask, res: DownloadResult) -> None:
        f = by_dest[task.dest]
        placed = 0
        if f.archive:
            try:
                placed = _install_archive(f, res.path, ddir)
            except InputError:
                # A bad archive is not kept (nor recorded): the next fetch downloads it afresh.
                res.path.unlink(missing_ok=True)
                raise
        # "First verified download": recorded only once the file proved usable.
        if f.checksum_policy == "lock" and lock.file_record(f.name) is None:
            lock.record_file(
                f.name, size=res.size, sha256=res.sha256, md5=res.md5, url=res.url or ""
            )
            report.notes.append(
                f"recorded the checksum of {f.name} in the lock file (first download)"
            )
        if f.archive and not keep_archives:
            res.path.unlink(missing_ok=True)
        lock.mark_installed(spec.id, f.name)
        with report_guard:
            report.files.append(
                {
                    "name": f.name,
                    "url": res.url,
                    "size": res.size,
                    "sha256": res.sha256,
                    "skipped": res.skipped,
                    "resumed": res.resumed,
                    "placed": placed,
                }
            )
            report.placed += placed

    tasks = [
        DownloadTask(
            tuple(candidate_urls(f.urls, mirror, also_owners=also_owners)),
            ddir / f.local_path,
            _expected(f, lock),
            f.optional,
        )
        for f in todo
    ]
    download_many(tasks, jobs=jobs, progress=progress, on_done=on_done, **download_options)
    try:
        shutil.rmtree(ddir / "downloads") if not keep_archives and not any(
            (ddir / "downloads").iterdir()
        ) else None
    except OSError:
        pass
    return report


def _check_against_lock(
    name: str, path: Path, lock: LockFile, spec_file: RemoteFile | None, report: PrepareReport
) -> None:
    """Compare an imported source file with the published/recorded checksum; record if new."""
    digests = file_digests(path, ("sha256", "md5"))
    size, sha, md5 = path.stat().st_size, digests["sha256"], digests["md5"]
    if spec_file is not None and spec_file.checksum_policy == "published":
        exp = Expected(spec_file.size, spec_file.sha256, spec_file.md5)
    else:
        rec = lock.file_record(name)
        if rec is None:
            lock.record_file(name, size=size, sha256=sha, md5=md5, url=f"import:{path}")
            report.notes.append(f"recorded the checksum of {name} in the lock file (first import)")
            return
        exp = Expected(rec.get("size"), rec.get("sha256"), rec.get("md5"))
    problem = checksum_mismatch(
        {"size": exp.size, "sha256": exp.sha256, "md5": exp.md5},
        {"size": size, "sha256": sha, "md5": md5},
    )
    if problem is not None:
        raise InputError(
            f"differs from the recorded/published checksum of {name} ({problem}); it is not the "
            "file the owners published, or the lock file records another version",
            path,
        )


def import_dataset(
    dataset_id: str,
    source: str | Path,
    root: str | Path | None = None,
    *,
    link: bool = True,
    progress: bool = True,
) -> PrepareReport:
    """Lay out a local copy of ``dataset_id`` (folders and/or archives) in the canonical layout.

    ``source`` may be a folder (searched recursively: images, ground-truth files, and archives
    such as ``oxbuild_images-v1.tgz`` found in it), an archive, or a single file (a gnd pickle).
    Files are hard-linked when possible (same file system), else copied, each through a temporary
    name. Archives and ground-truth files named in the catalog are checked against the published
    or recorded checksum (and recorded on first sight).

    Raises:
        InputError: unknown id, missing source, unwritable root, nothing usable found, two
            different files claiming one name, a checksum mismatch, a corrupt archive.
    """
    spec = get_spec(dataset_id)
    if spec.synthetic:
        raise InputError(f"{spec.id} is generated, not imported; use `oxbench data synth`")
    src = Path(source).expanduser()
    if not src.exists():
        raise InputError("import source not found", src)
    base = data_root(root)
    ensure_writable(base)
    ddir = make_folder(base / spec.id)
    _remove_stale(ddir)
    lock = LockFile(base)
    report = PrepareReport(spec.id, ddir)
    known = {f.name: f for f in spec.files}
    seen: dict[str, Path] = {}
    archives: list[Path] = []
    with progress_bar(
        desc=f"import {spec.id}", unit=" files", enabled=progress, leave=False
    ) as bar:
        _import_sources(spec, src, ddir, lock, report, known, seen, archives, link=link, bar=bar)
    if report.not_images:
        log.warning(
            "%d file(s) match no image of %s and were not laid out, e.g. %s",
            len(report.not_images),
            spec.id,
            report.not_images[0],
        )
    if report.placed == 0:
        others = (
            f" ({len(report.not_images)} .jpg file(s) match no image of {spec.id}, e.g. "
            f"{report.not_images[0].rsplit('/', 1)[-1]})"
            if report.not_images
            else ""
        )
        raise InputError(
            f"found no file of {spec.id} (images, ground truth) in the import source{others}", src
        )
    for f in spec.files:
        if not f.archive and (ddir / f.local_path).exists():
            lock.mark_installed(spec.id, f.name)
    return report


def _import_sources(
    spec: DatasetSpec,
    src: Path,
    ddir: Path,
    lock: LockFile,
    report: PrepareReport,
    known: dict[str, RemoteFile],
    seen: dict[str, Path],
    archives: list[Path],
    *,
    link: bool,
    bar: Any,
) -> None:
    """The body of :func:`import_dataset`: place ``src`` (file, folder, archives) into ``ddir``."""

    def check(name: str, path: Path) -> None:  # before a catalogued plain file is laid out
        if name in known and not known[name].archive:
            _check_against_lock(name, path, lock, known[name], report)

    keep = _ImageTest(spec, ddir)

    def place_tree(
        tree: Path,
        source: Path,
        *,
        link: bool,
        move: bool,
        nested: list[Path] | None,
        where: Callable[[str], str],
    ) -> None:
        """Lay out a folder (or an extracted archive) and record what was placed and left out."""
        left_out: list[str] = []
        n = _place_tree(
            tree,
            spec.layout,
            ddir,
            link=link,
            move=move,
            seen=seen,
            nested=nested,
            bar=bar,
            before_place=check,
            keep=keep,
            left_out=left_out,
        )
        report.not_images += [where(rel) for rel in left_out]
        report.placed += n
        report.files.append({"name": source.name, "source": str(source), "placed": n})

    if src.is_file() and _placement_for(src.name, spec.layout) is None:
        if not (is_archive(src) or src.name.lower().endswith(_ARCHIVE_SUFFIXES)):
            raise InputError(f"neither an archive nor a file of {spec.id}", src)
        archives.append(src)
    elif src.is_file():
        rule = _placement_for(src.name, spec.layout)
        assert rule is not None
        if not keep(rule.target(src.name)):
            report.not_images.append(str(src))
            return
        if src.name in known:
            _check_against_lock(src.name, src, lock, known[src.name], report)
        _place_file(src, ddir / rule.target(src.name), link=link, move=False)
        report.placed += 1
        report.files.append({"name": src.name, "source": str(src), "placed": 1})
    else:
        place_tree(
            src, src, link=link, move=False, nested=archives, where=lambda rel: str(src / rel)
        )

    for arch in archives:
        if arch.name in known:
            _check_against_lock(arch.name, arch, lock, known[arch.name], report)
        tmp = _extraction_target(ddir, arch.name)
        extract_archive(arch, tmp)
        try:
            place_tree(
                tmp,
                arch,
                link=False,
                move=True,
                nested=None,
                where=functools.partial("{}:{}".format, arch),
            )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if arch.name in known:
            lock.mark_installed(spec.id, arch.name)
