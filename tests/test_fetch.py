"""The verified fetcher against a real HTTP server on 127.0.0.1 that misbehaves on purpose."""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.datasets import fetch
from oxbench.datasets.fetch import (
    DownloadTask,
    Expected,
    apply_mirror,
    candidate_urls,
    download_file,
    download_many,
)
from oxbench.errors import InputError


@dataclass
class Behaviour:
    """How the server answers one path."""

    body: bytes
    mode: str = "ok"  # ok | drop | wrong | 404 | 500 | norange | flaky
    drop_times: int = 1  # "drop": first N requests are cut half-way; "flaky": first N answer 500
    served: int = 0
    ranges: list[str | None] = field(default_factory=list)
    if_ranges: list[str | None] = field(default_factory=list)
    etag: str | None = None


class Server:
    """A threaded HTTP server whose per-path behaviour the tests set."""

    def __init__(self) -> None:
        self.paths: dict[str, Behaviour] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802
                b = outer.paths.get(self.path)
                if b is None:
                    self.send_error(404)
                    return
                b.served += 1
                rng = self.headers.get("Range")
                b.ranges.append(rng)
                b.if_ranges.append(self.headers.get("If-Range"))
                if b.mode == "404":
                    self.send_error(404)
                    return
                if b.mode == "500" or (b.mode == "flaky" and b.served <= b.drop_times):
                    self.send_error(500)
                    return
                body = b.body
                if b.mode == "wrong":
                    body = bytes(255 - x for x in body)
                start = 0
                if_range = self.headers.get("If-Range")
                if rng and b.mode != "norange" and (if_range is None or if_range == b.etag):
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                chunk = body[start:]
                if b.etag:
                    self.send_header("ETag", b.etag)
                self.send_header("Content-Length", str(len(chunk)))
                self.send_header("Connection", "close")
                self.end_headers()
                if b.mode == "drop" and b.served <= b.drop_times:
                    self.wfile.write(chunk[: len(chunk) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(chunk)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, path: str) -> str:
        return self.base + path

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


def _payload(n: int = 300_000, seed: int = 7) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


FAST = {"retries": 3, "backoff": 0.0, "timeout": 5.0, "progress": False, "sleep": lambda s: None}


def _no_part_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".part")]


def test_plain_download_with_checksum(server: Server, tmp_path: Path) -> None:
    body = _payload()
    server.paths["/a.bin"] = Behaviour(body)
    sha = hashlib.sha256(body).hexdigest()
    res = download_file(
        [server.url("/a.bin")], tmp_path / "a.bin", expected=Expected(len(body), sha), **FAST
    )
    assert (tmp_path / "a.bin").read_bytes() == body
    assert res.sha256 == sha and res.md5 == hashlib.md5(body).hexdigest() and not res.skipped
    # idempotent: a second call skips without a request
    again = download_file(
        [server.url("/a.bin")], tmp_path / "a.bin", expected=Expected(len(body), sha), **FAST
    )
    assert again.skipped and server.paths["/a.bin"].served == 1


def test_dropped_connection_resumes_with_range(server: Server, tmp_path: Path) -> None:
    body = _payload()
    b = server.paths["/big.tgz"] = Behaviour(body, mode="drop", drop_times=2)
    res = download_file(
        [server.url("/big.tgz")], tmp_path / "big.tgz", expected=Expected(len(body)), **FAST
    )
    assert (tmp_path / "big.tgz").read_bytes() == body
    assert res.resumed and b.served == 3 and res.sha256 == hashlib.sha256(body).hexdigest()
    assert b.ranges[0] is None and b.ranges[1] is not None and b.ranges[1].startswith("bytes=")
    assert not _no_part_files(tmp_path)


def test_file_changed_between_attempts_is_not_spliced(server: Server, tmp_path: Path) -> None:
    old, new = _payload(seed=1), _payload(seed=2)
    b = server.paths["/c.bin"] = Behaviour(old, mode="drop", drop_times=1, etag='"v1"')
    with pytest.raises(InputError):
        download_file([server.url("/c.bin")], tmp_path / "c.bin", **{**FAST, "retries": 0})
    assert (tmp_path / "c.bin.part").exists() and (
        tmp_path / "c.bin.part.validator"
    ).read_text() == '"v1"'
    # the owners replace the file: the resume carries If-Range "v1", the server sends the new whole body
    b.body, b.etag = new, '"v2"'
    download_file([server.url("/c.bin")], tmp_path / "c.bin", **FAST)
    assert (tmp_path / "c.bin").read_bytes() == new
    assert b.if_ranges[-1] == '"v1"' and not (tmp_path / "c.bin.part.validator").exists()


def test_server_ignoring_range_restarts_from_zero(server: Server, tmp_path: Path) -> None:
    body = _payload()
    # A stale partial file from an earlier run, and a server that answers 200 to Range requests.
    (tmp_path / "x.bin.part").write_bytes(body[:1000])
    b = server.paths["/x.bin"] = Behaviour(body, mode="norange")
    res = download_file([server.url("/x.bin")], tmp_path / "x.bin", **FAST)
    assert (tmp_path / "x.bin").read_bytes() == body  # not body[:1000] + body
    assert b.ranges == ["bytes=1000-"] and not res.resumed


def test_wrong_bytes_fail_loudly_and_leave_nothing_complete(server: Server, tmp_path: Path) -> None:
    body = _payload()
    server.paths["/w.bin"] = Behaviour(body, mode="wrong")
    sha = hashlib.sha256(body).hexdigest()
    with pytest.raises(InputError, match="sha256 .* differs from the expected"):
        download_file(
            [server.url("/w.bin")], tmp_path / "w.bin", expected=Expected(sha256=sha), **FAST
        )
    assert not (tmp_path / "w.bin").exists() and not _no_part_files(tmp_path)


def test_wrong_bytes_on_mirror_fall_back_to_official(server: Server, tmp_path: Path) -> None:
    body = _payload()
    server.paths["/mirror/data/f.bin"] = Behaviour(body, mode="wrong")
    server.paths["/data/f.bin"] = Behaviour(body)
    # (the owners are tried only when asked for: see test_with_a_mirror_the_owners_are_not_...)
    urls = candidate_urls([server.url("/data/f.bin")], server.url("/mirror"), also_owners=True)
    assert urls[0] == server.url("/mirror/data/f.bin")
    res = download_file(
        urls, tmp_path / "f.bin", expected=Expected(sha256=hashlib.sha256(body).hexdigest()), **FAST
    )
    assert res.url == server.url("/data/f.bin") and (tmp_path / "f.bin").read_bytes() == body


@pytest.mark.parametrize("mode", ["404", "500"])
def test_http_errors_fail_loudly(server: Server, tmp_path: Path, mode: str) -> None:
    server.paths["/e.bin"] = Behaviour(b"x", mode=mode)
    with pytest.raises(InputError, match=f"HTTP {mode}"):
        download_file([server.url("/e.bin")], tmp_path / "e.bin", **FAST)
    assert not (tmp_path / "e.bin").exists()
    # 404 is permanent (one request); 500 is retried
    assert server.paths["/e.bin"].served == (1 if mode == "404" else 4)


def test_flaky_then_recovers(server: Server, tmp_path: Path) -> None:
    body = _payload(50_000)
    server.paths["/f.bin"] = Behaviour(body, mode="flaky", drop_times=2)
    waits: list[float] = []
    opts = {**FAST, "backoff": 0.5, "sleep": waits.append}
    download_file([server.url("/f.bin")], tmp_path / "f.bin", **opts)
    assert (tmp_path / "f.bin").read_bytes() == body
    assert waits == [0.5, 1.0]  # exponential backoff


def test_drop_every_time_keeps_only_a_part_file(server: Server, tmp_path: Path) -> None:
    body = _payload()
    server.paths["/d.bin"] = Behaviour(body, mode="drop", drop_times=100)
    with pytest.raises(InputError, match="partial file kept for resume"):
        download_file([server.url("/d.bin")], tmp_path / "d.bin", **{**FAST, "retries": 1})
    assert not (tmp_path / "d.bin").exists()
    assert (tmp_path / "d.bin.part").exists()


def test_existing_mismatching_file_is_downloaded_again(server: Server, tmp_path: Path) -> None:
    body = _payload(10_000)
    server.paths["/m.bin"] = Behaviour(body)
    (tmp_path / "m.bin").write_bytes(b"half" * 10)
    res = download_file(
        [server.url("/m.bin")], tmp_path / "m.bin", expected=Expected(size=len(body)), **FAST
    )
    assert not res.skipped and (tmp_path / "m.bin").read_bytes() == body


def test_download_many_parallel_and_one_failure(server: Server, tmp_path: Path) -> None:
    bodies = {f"/p{i}.bin": _payload(20_000, seed=i) for i in range(6)}
    for path, body in bodies.items():
        server.paths[path] = Behaviour(body, mode="drop" if path == "/p2.bin" else "ok")
    tasks = [DownloadTask((server.url(p),), tmp_path / p.strip("/")) for p in bodies]
    done: list[str] = []
    download_many(
        tasks,
        jobs=3,
        on_done=lambda t, r: done.append(t.dest.name),
        **{k: v for k, v in FAST.items() if k != "progress"},
        progress=False,
    )
    assert sorted(done) == sorted(p.strip("/") for p in bodies)
    for p, body in bodies.items():
        assert (tmp_path / p.strip("/")).read_bytes() == body
    server.paths["/gone.bin"] = Behaviour(b"", mode="404")
    bad = [*tasks, DownloadTask((server.url("/gone.bin"),), tmp_path / "gone.bin")]
    with pytest.raises(InputError, match="gone.bin"):
        download_many(
            bad, jobs=2, progress=False, **{k: v for k, v in FAST.items() if k != "progress"}
        )
    opt = [DownloadTask((server.url("/gone.bin"),), tmp_path / "gone.bin", optional=True)]
    assert download_many(
        opt, jobs=1, progress=False, **{k: v for k, v in FAST.items() if k != "progress"}
    ) == [None]


def test_apply_mirror_replaces_scheme_and_host() -> None:
    url = "https://www.robots.ox.ac.uk/~vgg/data/oxbuildings/gt_files_170407.tgz"
    assert (
        apply_mirror(url, "http://lab.example/mirror/")
        == "http://lab.example/mirror/~vgg/data/oxbuildings/gt_files_170407.tgz"
    )
    assert candidate_urls([url], None) == [url]


def test_free_space_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fetch, "disk_free", lambda p: 5_000)
    with pytest.raises(InputError, match="not enough free disk space"):
        fetch.check_free_space(tmp_path, 10_000, margin=0)
    fetch.check_free_space(tmp_path, 1_000, margin=0)


# --- properties ---------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(cut=st.integers(min_value=1, max_value=49_999), drops=st.integers(min_value=1, max_value=3))
def test_any_drop_point_ends_with_the_exact_bytes(
    tmp_path_factory: pytest.TempPathFactory, cut: int, drops: int
) -> None:
    body = _payload(50_000, seed=cut)
    tmp = tmp_path_factory.mktemp("drop")
    (tmp / "f.bin.part").write_bytes(body[:cut])  # an earlier run stopped at an arbitrary byte
    s = Server()
    try:
        s.paths["/f.bin"] = Behaviour(body, mode="drop", drop_times=drops)
        res = download_file(
            [s.url("/f.bin")],
            tmp / "f.bin",
            expected=Expected(sha256=hashlib.sha256(body).hexdigest()),
            **FAST,
        )
    finally:
        s.close()
    assert (tmp / "f.bin").read_bytes() == body and res.resumed


# --- mirrors and unreachable hosts -----------------------------------------------------------------


def _closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_with_a_mirror_the_owners_are_not_contacted_unless_asked(
    server: Server, tmp_path: Path
) -> None:
    owners = Server()
    try:
        body = _payload(5_000)
        owners.paths["/data/f.bin"] = Behaviour(body)
        server.paths["/mirror/data/f.bin"] = Behaviour(body, mode="404")
        urls = candidate_urls([owners.url("/data/f.bin")], server.url("/mirror"))
        assert urls == [server.url("/mirror/data/f.bin")]
        with pytest.raises(
            InputError, match=f"from 127.0.0.1:{server.httpd.server_address[1]}: .*HTTP 404"
        ):
            download_file(urls, tmp_path / "f.bin", **FAST)
        assert owners.paths["/data/f.bin"].served == 0
        asked = candidate_urls([owners.url("/data/f.bin")], server.url("/mirror"), also_owners=True)
        assert asked == [server.url("/mirror/data/f.bin"), owners.url("/data/f.bin")]
        res = download_file(asked, tmp_path / "f.bin", **FAST)
        assert res.url == owners.url("/data/f.bin") and owners.paths["/data/f.bin"].served == 1
    finally:
        owners.close()


@pytest.mark.parametrize(
    "mirror",
    [
        "lab.example/mirror",
        "127.0.0.1:8000/m",
        "/srv/mirror",
        "file:///srv/m",
        "http://",
        "http://[::1/x",
        "",
    ],
)
def test_a_mirror_without_scheme_and_host_is_refused(mirror: str) -> None:
    with pytest.raises(InputError, match="must be a URL with a scheme and a host"):
        candidate_urls(["https://www.robots.ox.ac.uk/~vgg/x.tgz"], mirror or " ")
    with pytest.raises(InputError, match="OXBENCH_MIRROR must be a URL"):
        fetch.check_mirror(mirror, "OXBENCH_MIRROR")


def test_connection_refused_fails_within_seconds_naming_the_host(tmp_path: Path) -> None:
    import time

    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(InputError) as exc:  # the default retries and backoff: no 'sleep' override
        download_file([f"http://127.0.0.1:{port}/x.bin"], tmp_path / "x.bin", progress=False)
    took = time.monotonic() - t0
    msg = str(exc.value)
    assert took < 5, took
    assert (
        f"cannot connect to 127.0.0.1:{port}: connection refused" in msg
        and "after 2 attempt(s)" in msg
    )
    assert "\n" not in msg and not list(tmp_path.iterdir())


def test_fetch_cli_with_a_refused_mirror_contacts_nobody_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import time
    import urllib.request

    from oxbench.cli import main

    contacted: list[str] = []
    real = urllib.request.urlopen

    def spy(req, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        host = urllib.parse.urlsplit(req.full_url).hostname
        contacted.append(str(host))
        if host != "127.0.0.1":  # never the network from a test
            raise urllib.error.URLError(ConnectionRefusedError(111, "refused by the test"))
        return real(req, *a, **kw)

    import urllib.error
    import urllib.parse

    monkeypatch.setattr(urllib.request, "urlopen", spy)
    monkeypatch.setattr(fetch, "disk_free", lambda p: 10**13)
    monkeypatch.delenv("OXBENCH_MIRROR", raising=False)
    port = _closed_port()
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "data",
                "fetch",
                "roxford5k",
                "--root",
                str(tmp_path / "root"),
                "--mirror",
                f"http://127.0.0.1:{port}/m",
                "--accept-terms",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and time.monotonic() - t0 < 10
    errors = [line for line in err.splitlines() if line.startswith("oxbench: error:")]
    assert (
        len(errors) == 1
        and f"127.0.0.1:{port}: connection refused" in errors[0]
        and "Traceback" not in err
    )
    assert contacted and set(contacted) == {"127.0.0.1"}  # the owners' hosts were not tried


def test_fetch_cli_refuses_a_mirror_without_scheme_before_writing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.cli import main

    for env, args in ((None, ["--mirror", "lab.example/data"]), ("lab.example/data", [])):
        if env is None:
            monkeypatch.delenv("OXBENCH_MIRROR", raising=False)
        else:
            monkeypatch.setenv("OXBENCH_MIRROR", env)
        with pytest.raises(SystemExit) as exc:
            main(
                [
                    "data",
                    "fetch",
                    "roxford5k",
                    "--root",
                    str(tmp_path / "root"),
                    *args,
                    "--accept-terms",
                    "--no-progress",
                ]
            )
        err = [
            line
            for line in capsys.readouterr().err.splitlines()
            if line.startswith("oxbench: error:")
        ]
        assert exc.value.code == 2 and len(err) == 1
        assert ("OXBENCH_MIRROR" if env else "--mirror") + " must be a URL with a scheme" in err[0]
        assert not (tmp_path / "root").exists()
