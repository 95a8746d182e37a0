"""A --cluster address is checked by a handshake within one deadline (issue 31 item 4).

Every fake server here listens on 127.0.0.1 only. Main 18c1381 hung past 200 s at a plain HTTP
server, gave ``ValueError: Maximum allowed dimension exceeded`` on junk bytes, ``Unable to allocate
3.07 EiB`` on an HTTP answer, and tracebacks for tls:// without settings and a 300-character host.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.execution.dask import (  # noqa: E402
    DaskExecutor,
    check_cluster_address,
    probe_scheduler,
)


@contextlib.contextmanager
def _server(answer: bytes | None) -> Iterator[str]:
    """A TCP server on 127.0.0.1 that sends ``answer`` to each connection (``None``: it reads and
    never answers, as a web server waiting for a request does); its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conns.append(conn)
            if answer is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for c in conns:
            c.close()
        listener.close()


def _frames(*frames: bytes) -> bytes:
    body = struct.pack(f"<{len(frames) + 1}Q", len(frames), *map(len, frames)) + b"".join(frames)
    return struct.pack("<Q", len(body)) + body


HTTP = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
ANSWERS = {
    "a web server waiting for a request": (None, "sent nothing a Dask scheduler sends|no answer"),
    "an HTTP answer": (HTTP, "it sent a message of"),
    "junk bytes": (bytes(range(7, 250, 3)) * 4, "it sent a message of"),
    "a well-framed message that is no handshake": (
        _frames(b"\x93\x01\x02\x03"),
        "not a Dask handshake",
    ),
    "a short length, then junk": (struct.pack("<Q", 40) + b"\xff" * 40, "no Dask frames"),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_what_is_not_a_scheduler_is_one_line_within_the_deadline(case: str) -> None:
    answer, problem = ANSWERS[case]
    with _server(answer) as address:
        t0 = time.monotonic()
        with pytest.raises(InputError, match=problem) as err:
            probe_scheduler(address, 1.0)
        assert time.monotonic() - t0 < 3
    assert str(err.value).startswith(f"{address} is not a Dask scheduler")
    assert "\n" not in str(err.value)


def test_a_real_scheduler_passes_the_handshake() -> None:
    import asyncio

    from distributed import Scheduler

    async def probe() -> None:
        async with Scheduler(host="127.0.0.1", port=0, dashboard=False) as s:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, probe_scheduler, s.address, 5.0)

    asyncio.run(probe())


def test_the_cli_says_one_line_exits_2_and_leaves_nothing_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    psutil = pytest.importorskip("psutil")
    monkeypatch.setenv("OXBENCH_CLUSTER_TIMEOUT", "1.5")
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # other tests' helpers
    for answer in (None, HTTP):
        with _server(answer) as address:
            t0 = time.monotonic()
            with pytest.raises(SystemExit) as exc:
                main(
                    ["run", "--engine", "dask", "--cluster", address, "--root", str(tmp_path)]
                    + ["--no-progress", "--out", str(tmp_path / "runs")]
                )
            took = time.monotonic() - t0
        err = capsys.readouterr().err
        assert exc.value.code == 2 and took < 5, (took, err)
        assert err.startswith(
            f"oxbench: error: {address} is not a Dask scheduler that answers within 1.5 s"
        )
        assert len(err.strip().splitlines()) == 1
        assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
        assert not (tmp_path / "runs").exists()
    time.sleep(0.5)  # the probe thread gives up at the deadline
    assert not [t for t in threading.enumerate() if t.name == "oxbench-cluster-probe"]


def test_tls_without_settings_and_a_long_host_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InputError, match="tls:// scheduler needs Dask's TLS settings") as err:
        DaskExecutor(1, address="tls://127.0.0.1:8786", connect_timeout_s=1).client  # noqa: B018
    assert "distributed.comm.tls.ca-file" in str(err.value) and "\n" not in str(err.value)
    for host in ("a" * 300, "a" * 64 + ".example", "x..y"):
        with pytest.raises(InputError, match="is not a host name") as err:
            check_cluster_address(f"tcp://{host}:8786")
        assert len(str(err.value)) < 200
    monkeypatch.setenv("OXBENCH_CLUSTER_TIMEOUT", "nan")
    with pytest.raises(InputError, match="OXBENCH_CLUSTER_TIMEOUT must be 0.1 .. 3600 seconds"):
        DaskExecutor(1, address="tcp://127.0.0.1:8786")


def test_an_embedded_cluster_has_at_most_one_worker_per_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OXBENCH_OVERSUBSCRIBE", raising=False)
    with pytest.raises(
        InputError, match="one worker process per core at most, and 2 are available"
    ):
        DaskExecutor(1024, cores=2)
    DaskExecutor(2, cores=2)  # nothing starts before the first stage
    monkeypatch.setenv("OXBENCH_OVERSUBSCRIBE", "1")
    DaskExecutor(4, cores=2)
    DaskExecutor(1024, address="tcp://127.0.0.1:8786")  # an existing cluster's workers are its own
