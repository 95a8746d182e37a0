"""The one verified downloader: resume, retry, mirrors, checksums, atomic completion.

:func:`download_file` fetches one file to ``dest``:

- bytes go to ``dest.part``; an interrupted download resumes with an HTTP ``Range`` request
  guarded by ``If-Range`` (the ETag/Last-Modified of the first answer, kept in
  ``dest.part.validator``), so a file replaced meanwhile is fetched whole, never spliced; a
  server that ignores ``Range`` (answers 200) is detected and the file restarts from zero;
- transient failures (dropped connections, timeouts, 5xx, short bodies) are retried with
  exponential backoff; 404/403 move on to the next URL; a host that refuses the connection or
  whose name does not resolve gets one quick second try, not minutes of backoff;
- with a mirror, only the mirror is contacted unless the owners are asked for too
  (:func:`candidate_urls`); a mirror must be a URL with a scheme and a host;
- SHA-256 and MD5 are computed while streaming; size and checksums are compared with the
  published values or, failing those, with the lock-file record (see :mod:`oxbench.datasets.lock`);
- only a checked file is renamed to ``dest`` -- a file at ``dest`` is always complete;
- a ``dest`` that exists and matches is skipped (idempotent).

:func:`download_many` runs several downloads in a bounded thread pool, after a free-disk check.
Everything here uses the standard library only (``urllib``); HTTP(S) and FTP URLs are accepted
(FTP cannot resume: it restarts).
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import re
import shutil
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from oxbench.errors import InputError, OxbenchError
from oxbench.fileio import checksum_mismatch, file_digests

log = logging.getLogger(__name__)

MIRROR_ENV = "OXBENCH_MIRROR"
_CHUNK = 1 << 16
_USER_AGENT = "oxbench (+https://pypi.org/project/oxbench)"


class DownloadError(OxbenchError):
    """A transient failure of one attempt (retried); not raised to callers."""


class _Permanent(OxbenchError):
    """A failure that retrying this URL will not fix (404, wrong size, wrong bytes)."""


class _Unreachable(DownloadError):
    """The host refused the connection or its name does not resolve: one quick retry at most."""


_MIRROR_SCHEMES = ("http", "https", "ftp")


@dataclass(frozen=True)
class Expected:
    """What a downloaded file must be; any field may be unknown (``None``)."""

    size: int | None = None
    sha256: str | None = None
    md5: str | None = None

    @property
    def has_checksum(self) -> bool:
        return bool(self.sha256 or self.md5)


@dataclass(frozen=True)
class DownloadResult:
    """The outcome of one :func:`download_file`.

    Attributes:
        path: the complete, checked file.
        url: where it came from (``None`` when skipped as already present).
        size, sha256, md5: of the file on disk.
        skipped: it was already there and matched.
        resumed: at least one attempt continued a partial file.
        attempts: HTTP attempts made.
    """

    path: Path
    url: str | None
    size: int
    sha256: str
    md5: str
    skipped: bool = False
    resumed: bool = False
    attempts: int = 0


def _header_count(text: str | None) -> int | None:
    """A byte count from an HTTP header: 1 to 20 ASCII digits, else ``None`` (unknown)."""
    return int(text) if text is not None and re.fullmatch(r"[0-9]{1,20}", text.strip()) else None


def apply_mirror(url: str, mirror: str) -> str:
    """``url`` with its scheme and host replaced by the mirror base URL.

    ``apply_mirror("https://www.robots.ox.ac.uk/~vgg/data/x.tgz", "http://lab/m")`` is
    ``"http://lab/m/~vgg/data/x.tgz"``: a lab mirror keeps the owners' paths below its base.
    """
    parts = urllib.parse.urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return mirror.rstrip("/") + "/" + path.lstrip("/")


def check_mirror(mirror: str, what: str = "--mirror") -> str:
    """``mirror`` if it is an http(s)/ftp URL with a host; else InputError naming ``what``.

    ``lab.example/data`` (no scheme) would otherwise be taken for a relative path and fail deep
    inside the downloader.
    """
    text = mirror.strip()
    try:
        parts = urllib.parse.urlsplit(text)
        ok = parts.scheme.lower() in _MIRROR_SCHEMES and bool(parts.hostname)
    except ValueError:  # e.g. a malformed IPv6 host or port
        ok = False
    if not ok:
        raise InputError(
            f"{what} must be a URL with a scheme and a host, e.g. https://mirror.example/data; "
            f"got {mirror!r}"
        )
    return text


def candidate_urls(
    urls: Sequence[str], mirror: str | None, *, also_owners: bool = False
) -> list[str]:
    """The URLs to try, in order.

    Without a mirror: the owners' URLs. With a mirror: only the mirror's copies, so the owners'
    hosts are not contacted unless ``also_owners`` (then they are tried after the mirror).

    Raises:
        InputError: the mirror is not a URL with a scheme and a host.
    """
    if not urls:
        return []
    if not mirror:
        return list(urls)
    mirror = check_mirror(mirror)
    out = [apply_mirror(u, mirror) for u in urls]
    return out + [u for u in urls if u not in out] if also_owners else out


def _host(url: str) -> str:
    """``host[:port]`` of a URL, for messages."""
    try:
        return urllib.parse.urlsplit(url).netloc or url
    except ValueError:
        return url


def disk_free(path: str | Path) -> int:
    """Free bytes on the file system holding ``path`` (its nearest existing ancestor)."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(path: str | Path, needed: int, *, margin: int = 100_000_000) -> None:
    """Refuse to start when ``path``'s file system has less than ``needed + margin`` bytes free.

    Raises:
        InputError: not enough space (names both numbers and the remedy).
    """
    free = disk_free(path)
    if free < needed + margin:
        raise InputError(
            f"not enough free disk space: need about {_human(needed + margin)}, have {_human(free)}; "
            "free some space or choose another --root (or OXBENCH_DATA)",
            path,
        )


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return str(n)  # pragma: no cover


class _Digest:
    """SHA-256 + MD5 + byte count, updated chunk by chunk."""

    def __init__(self) -> None:
        self.sha256 = hashlib.sha256()
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.size = 0

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        self.md5.update(chunk)
        self.size += len(chunk)

    @classmethod
    def of_file(cls, path: str | Path) -> _Digest:
        d = cls()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                d.update(chunk)
        return d


def _mismatch(size: int, sha256: str, md5: str, expected: Expected) -> str | None:
    return checksum_mismatch(
        {"size": expected.size, "sha256": expected.sha256, "md5": expected.md5},
        {"size": size, "sha256": sha256, "md5": md5},
    )


def _progress(total: int | None, initial: int, desc: str, enabled: bool):  # noqa: ANN202
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        unit="B",
        unit_scale=True,
        leave=False,
        disable=not enabled,
    )


def _validator_path(part: Path) -> Path:
    """Sidecar of a ``.part`` file holding the server's ETag / Last-Modified for ``If-Range``."""
    return part.with_name(part.name + ".validator")


def _attempt(url: str, part: Path, *, timeout: float, progress: bool) -> tuple[bool, _Digest]:
    """One HTTP attempt appending to ``part``; returns ``(resumed, digest of the whole part)``.

    Raises:
        DownloadError: transient (retry); _Permanent: this URL will not work.
    """
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": _USER_AGENT}
    validator_file = _validator_path(part)
    if offset:
        headers["Range"] = f"bytes={offset}-"
        # If-Range: resume only if the file is still the one the partial came from; a changed
        # file is answered with 200 and the whole new body (never a splice of two versions).
        if validator_file.exists():
            headers["If-Range"] = validator_file.read_text(encoding="utf-8").strip()
    try:
        req = urllib.request.Request(url, headers=headers)
        resp = urllib.request.urlopen(req, timeout=timeout)  # noqa: S310 - http(s)/ftp by design
    except ValueError as exc:  # not a URL urllib can fetch ("unknown url type")
        raise _Permanent(f"not a usable URL ({exc})") from None
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and offset:  # our partial is at/over the end: start over
            part.unlink(missing_ok=True)
            raise DownloadError(f"HTTP 416 for a resume at {offset}; restarting") from None
        if exc.code in (400, 401, 403, 404, 410):
            raise _Permanent(f"HTTP {exc.code} {exc.reason}") from None
        raise DownloadError(f"HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            raise _Unreachable(f"cannot connect to {_host(url)}: connection refused") from None
        if isinstance(reason, socket.gaierror):
            raise _Unreachable(
                f"cannot resolve the host {_host(url)} ({reason.strerror})"
            ) from None
        raise DownloadError(f"cannot connect to {_host(url)} ({reason})") from None

    with resp:
        status = getattr(resp, "status", None) or 200
        length = resp.headers.get("Content-Length") if resp.headers else None
        resumed = False
        if offset and status == 206:
            crange = resp.headers.get("Content-Range", "")
            try:
                start = int(crange.split()[1].split("-")[0])
            except (IndexError, ValueError):
                start = -1
            if start != offset:
                part.unlink(missing_ok=True)
                raise DownloadError(f"server resumed at {start} instead of {offset}; restarting")
            total, rest = _header_count(crange.rsplit("/", 1)[-1]), _header_count(length)
            if total is None and rest is not None:
                total = offset + rest
            mode, resumed = "ab", True
        else:
            if offset:
                log.info("%s ignored the Range request; downloading from the start", url)
            offset = 0
            total = _header_count(length)
            mode = "wb"
            validator = (
                resp.headers.get("ETag") or resp.headers.get("Last-Modified")
                if resp.headers
                else None
            )
            if validator and not validator.startswith(
                "W/"
            ):  # weak ETags may not be used in If-Range
                validator_file.write_text(validator, encoding="utf-8")
            else:
                validator_file.unlink(missing_ok=True)
        received = offset
        # Hash while streaming; a resumed file first hashes the bytes it already has.
        digest = _Digest.of_file(part) if mode == "ab" else _Digest()
        bar = _progress(total, offset, part.name.removesuffix(".part"), progress)
        try:
            with open(part, mode) as fh:
                while True:
                    try:
                        chunk = resp.read(_CHUNK)
                    except (TimeoutError, http.client.IncompleteRead, OSError) as exc:
                        raise DownloadError(
                            f"connection dropped at byte {received} ({type(exc).__name__})"
                        ) from None
                    if not chunk:
                        break
                    fh.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        except OSError as exc:  # writing failed: disk full, permissions
            raise InputError(f"cannot write the download ({exc.strerror})", part) from None
        finally:
            bar.close()
    if total is not None and received != total:
        raise DownloadError(f"connection dropped at byte {received} of {total}")
    return resumed, digest


def download_file(
    urls: Sequence[str],
    dest: str | Path,
    *,
    expected: Expected = Expected(),
    retries: int = 4,
    backoff: float = 1.0,
    max_backoff: float = 60.0,
    timeout: float = 60.0,
    progress: bool = True,
    sleep: Callable[[float], None] | None = None,
) -> DownloadResult:
    """Download ``dest`` from the first of ``urls`` that works, verified and atomically.

    Args:
        urls: candidate URLs in order (mirror first, see :func:`candidate_urls`).
        dest: the final path; only a complete, checked file ever appears there.
        expected: size/checksums the file must have (published or from the lock file).
        retries: extra attempts per URL after a transient failure.
        backoff: first wait in seconds; doubles after each failure, capped at ``max_backoff``.
        timeout: socket timeout per attempt.
        progress: show a tqdm bar.
        sleep: the wait function (default ``time.sleep``; tests pass a no-op).

    Returns:
        What was downloaded (or skipped as already present).

    Raises:
        InputError: every URL failed, or the bytes do not match ``expected`` (the message names
            the file, the last problem and the remedy). A partial ``dest.part`` may be kept for a
            later resume; it never looks complete.
    """
    dest = Path(dest)
    sleep = sleep or time.sleep
    if dest.exists():
        digests = file_digests(dest, ("sha256", "md5"))
        size, sha, md5 = dest.stat().st_size, digests["sha256"], digests["md5"]
        problem = _mismatch(size, sha, md5, expected)
        if problem is None:
            return DownloadResult(dest, None, size, sha, md5, skipped=True)
        log.warning("%s exists but does not match (%s); downloading it again", dest, problem)
        dest.unlink()
    if not urls:
        raise InputError(
            "no URL to download from; import a local copy with `oxbench data import`", dest
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    attempts = 0
    resumed_any = False
    problems: list[str] = []
    for url in urls:
        wait = backoff
        for attempt in range(retries + 1):
            attempts += 1
            try:
                resumed, digest = _attempt(url, part, timeout=timeout, progress=progress)
                resumed_any |= resumed
            except _Permanent as exc:
                problems.append(f"{url}: {exc}")
                break
            except _Unreachable as exc:
                # Nobody listens there (or no such host): retrying with backoff only wastes
                # minutes. One quick second try covers a server that is just restarting.
                problems.append(f"{url}: {exc}")
                if attempt >= 1 or attempt >= retries:
                    break
                sleep(min(wait, 0.5))
                continue
            except DownloadError as exc:
                problems.append(f"{url}: {exc}")
                log.info(
                    "download of %s failed (%s); attempt %d/%d", url, exc, attempt + 1, retries + 1
                )
                if attempt < retries:
                    sleep(wait)
                    wait = min(2 * wait, max_backoff)
                continue
            size, sha, md5 = digest.size, digest.sha256.hexdigest(), digest.md5.hexdigest()
            problem = _mismatch(size, sha, md5, expected)
            if problem is not None:
                # Wrong bytes: resuming cannot fix them. Drop the part; try the next URL.
                part.unlink(missing_ok=True)
                _validator_path(part).unlink(missing_ok=True)
                problems.append(f"{url}: {problem}")
                log.info(
                    "%s from %s does not match: %s", dest.name, url, problem
                )  # the final error says it
                break
            os.replace(part, dest)
            _validator_path(part).unlink(missing_ok=True)
            return DownloadResult(dest, url, size, sha, md5, resumed=resumed_any, attempts=attempts)
    last = problems[-1] if problems else "no attempt made"
    kept = " (partial file kept for resume: run the command again)" if part.exists() else ""
    mismatch = any("expected" in p for p in problems)
    hosts = ", ".join(dict.fromkeys(_host(u) for u in urls))
    remedy = (
        "the file differs from the published/recorded checksum: try another --mirror, or if the "
        "owners replaced it, `oxbench data verify` shows the record to drop from oxbench.lock.json"
        if mismatch
        else "check the network or the --mirror URL (or OXBENCH_MIRROR), then run the same command again"
    )
    raise InputError(
        f"download failed after {attempts} attempt(s) from {hosts}: {last}{kept}; {remedy}", dest
    )


@dataclass(frozen=True)
class DownloadTask:
    """One file for :func:`download_many`."""

    urls: tuple[str, ...]
    dest: Path
    expected: Expected = Expected()
    optional: bool = False


def download_many(
    tasks: Sequence[DownloadTask],
    *,
    jobs: int = 4,
    progress: bool = True,
    on_done: Callable[[DownloadTask, DownloadResult], None] | None = None,
    **kwargs: object,
) -> list[DownloadResult | None]:
    """Run :func:`download_file` for each task in a pool of at most ``jobs`` threads.

    Every task is attempted even if another fails; ``on_done`` is called (in the worker thread)
    after each success, e.g. to extract and record it. Optional tasks that fail give ``None``.

    Raises:
        InputError: at least one required download failed (the first failure's message, and
            how many failed).
    """
    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    results: list[DownloadResult | None] = [None] * len(tasks)
    errors: list[tuple[int, Exception]] = []

    def run(i: int) -> DownloadResult:
        t = tasks[i]
        res = download_file(t.urls, t.dest, expected=t.expected, progress=progress, **kwargs)  # type: ignore[arg-type]
        if on_done is not None:
            on_done(t, res)
        return res

    with ThreadPoolExecutor(max_workers=min(jobs, max(1, len(tasks)))) as pool:
        futures = {pool.submit(run, i): i for i in range(len(tasks))}
        for fut in as_completed(futures):
            i = futures[fut]
            try:
                results[i] = fut.result()
            except (InputError, OxbenchError) as exc:
                if tasks[i].optional:
                    log.warning("optional file %s not downloaded: %s", tasks[i].dest.name, exc)
                else:
                    errors.append((i, exc))
    if errors:
        errors.sort(key=lambda e: e[0])
        first = errors[0][1]
        more = f" ({len(errors) - 1} more download(s) failed too)" if len(errors) > 1 else ""
        raise InputError(f"{first}{more}")
    return results
