"""Worker processes die with their parent: ``kill -9``, SIGTERM and SIGINT of a multi-worker job.

The job is a real ``python -m oxbench data synth -j 2`` (Linux: processes are read from /proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oxbench.execution.workers import worker_pool

pytest.importorskip("cv2")
pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")

SRC = Path(__file__).resolve().parents[1] / "src"


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
    return out


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper does nothing: it counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _start_synth(out: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    args = [
        sys.executable,
        "-m",
        "oxbench",
        "data",
        "synth",
        "-j",
        "2",
        "--out",
        str(out),
        "--db-size",
        "5000",
        "--landmarks",
        "2",
        "--queries-per-landmark",
        "1",
        "--image-size",
        "320x240",
        "--no-progress",
    ]
    return subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_for_workers(proc: subprocess.Popen[str], out: Path, timeout: float = 60.0) -> set[int]:
    """The worker pids, once two workers exist and images are being written."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        workers = {c for c in _children(proc.pid) if "spawn_main" in _cmdline(c)}
        if len(workers) >= 2 and any((out / "jpg").glob("*.jpg")):
            return workers
        time.sleep(0.05)
    proc.kill()
    pytest.fail("the workers did not start")


def _wait_dead(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = {p for p in pids if _alive(p)}
        if not alive:
            return set()
        time.sleep(0.05)
    return {p for p in pids if _alive(p)}


def _cleanup(proc: subprocess.Popen[str], pids: set[int]) -> None:
    """Kill what a failed test left running (survivors hold the output pipes open)."""
    if proc.poll() is None:
        proc.kill()
    for p in pids | _children(proc.pid):
        cmd = _cmdline(p)
        if _alive(p) and ("spawn_main" in cmd or "resource_tracker" in cmd):
            os.kill(p, signal.SIGKILL)
    proc.communicate(timeout=30)


def test_kill_9_of_the_parent_leaves_no_worker(tmp_path: Path) -> None:
    out = tmp_path / "synth"
    proc = _start_synth(out)
    everyone: set[int] = set()
    try:
        workers = _wait_for_workers(proc, out)
        everyone = workers | _children(proc.pid)  # the resource tracker too
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        survivors = _wait_dead(everyone, 10.0)
        assert not survivors, {p: _cmdline(p) for p in survivors}
        n_images = len(list((out / "jpg").glob("*")))
        time.sleep(0.5)
        assert len(list((out / "jpg").glob("*"))) == n_images  # nobody is writing any more
    finally:
        _cleanup(proc, everyone)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_stop_the_whole_job_with_exit_130(
    tmp_path: Path, sig: signal.Signals
) -> None:
    out = tmp_path / "synth"
    proc = _start_synth(out)
    workers: set[int] = set()
    try:
        workers = _wait_for_workers(proc, out)
        t0 = time.monotonic()
        proc.send_signal(sig)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{sig.name} did not stop the job within 20 s")
        took = time.monotonic() - t0
        assert proc.returncode == 130, err
        assert err.strip().splitlines() == [f"oxbench: interrupted by {sig.name}"], err
        assert took < 10, took
        assert not _wait_dead(workers, 5.0)
        assert not list(out.glob("manifest.json"))  # the set does not look complete
    finally:
        _cleanup(proc, workers)


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_an_exception_in_the_pool_block_stops_the_workers_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), worker_pool(2) as pool:
        futures = [pool.submit(_sleep, 2.0) for _ in range(20)]  # 20 s of queued work
        time.sleep(0.2)
        pids = set(pool._processes)
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 8  # the spawn itself takes a moment; the queue is not run
    # (read from /proc: the pool's manager thread may reap a worker before Process.is_alive does)
    assert len(pids) == 2 and not _wait_dead(pids, 2.0)
    assert sum(f.cancelled() for f in futures) >= 16
