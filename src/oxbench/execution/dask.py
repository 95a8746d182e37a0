"""The Dask backend of the execution seam: the same stages on a Dask cluster.

``--engine dask`` runs the parallel stages of a run (:mod:`oxbench.execution`) on Dask distributed,
the optional extra ``oxbench[dask]`` (imported only when the backend is used):

- without an address: an embedded ``LocalCluster`` of ``workers`` worker processes with one thread
  each, listening on 127.0.0.1 only (ports the system picks), without a dashboard, started on the
  first stage that needs it and stopped when the run ends (:meth:`DaskExecutor.close`; the worker processes also end when
  this process dies, as Dask's nannies hold a pipe to their parent) -- the zero-setup way to use one
  big machine;
- with ``address`` (``--cluster tcp://host:8786`` or ``$OXBENCH_CLUSTER``): the scheduler of an
  existing cluster (started by hand, by dask-jobqueue on SLURM / PBS, by a Kubernetes operator).
  Its workers must see the data root and the cache at the same paths (a shared file system):
  :meth:`DaskExecutor.check_paths` asks every worker at the start of the run and names the first
  worker and path that fail. The address is checked by a handshake first
  (:func:`probe_scheduler`): an unreachable scheduler, or anything that is not a Dask scheduler
  (a web server, junk bytes), fails within one total deadline (:data:`CONNECT_TIMEOUT_S`, or
  ``$OXBENCH_CLUSTER_TIMEOUT`` seconds) in one line naming the address, leaving nothing running.

What a stage hands over is the same job as for local processes: a worker plugin installs it once in
every worker process (also in workers that are restarted or join later; never pickled per item),
each item is one Dask task, and the results come back in item order. A result is fetched as soon as
its task ends and then released, so a worker that dies later costs no finished work. The heavy stages write their data themselves, as write-once shards
(:mod:`oxbench.features.store`), and return receipts.

Failures: a task whose worker dies (``kill -9``, out of memory, a lost node) is run again on another
worker -- at most :attr:`DaskExecutor.retries` times, Dask's ``allowed-failures`` -- and so is a task
that raises (``retries=``); the retries of each stage are counted and recorded in the run record. A
task that fails on every attempt stops the run with one line naming the item (the shard).

Resources: a job with a ``resources`` attribute (``{"GPU": 1}``) has its tasks run only on workers
that offer it (``dask worker --resources GPU=1``), as many at once as they offer.

Threads: each task caps the numeric libraries of its worker process to ``cores of its machine //
task slots on that machine`` (:func:`oxbench.execution.limit_threads`), so ``workers x threads``
never exceeds the cores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from oxbench.errors import InputError, require
from oxbench.execution.executors import (
    EXECUTORS,
    Executor,
    available_cores,
    keep_freed_memory,
    limit_threads,
    thread_cap,
)
from oxbench.fileio import TEMP_PREFIX, atomic_write_text, make_folder, progress_bar
from oxbench.schema import Float, Int, Str

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Environment variable naming the scheduler of an existing cluster (as ``--cluster``).
CLUSTER_ENV = "OXBENCH_CLUSTER"
#: Seconds to wait for a scheduler (and, with ``--workers``, for that many workers) before failing:
#: one total deadline for the handshake, the connection and the workers.
CONNECT_TIMEOUT_S = 15.0
#: Environment variable setting that deadline (seconds, 0.1 .. 3600).
CLUSTER_TIMEOUT_ENV = "OXBENCH_CLUSTER_TIMEOUT"
#: Environment variable that lets an embedded cluster start more workers than there are cores.
OVERSUBSCRIBE_ENV = "OXBENCH_OVERSUBSCRIBE"
#: The largest handshake a Dask scheduler sends (its first message is under 100 bytes).
_HANDSHAKE_LIMIT = 1 << 16
#: How long ``--wait-workers`` may be: a week of a batch queue (also refuses NaN and 1e30).
WAIT_WORKERS = Float(lo=0.1, hi=7 * 24 * 3600.0)
#: Seconds between the lines that report the workers connected while waiting for them.
WAIT_REPORT_S = 30.0
#: Attempts of a task beyond the first (a worker that died under it, or an exception).
DEFAULT_RETRIES = 3
#: How many retries one may ask for.
MAX_RETRIES = 100

_ADDRESS_RE = re.compile(
    r"^(tcp|tls)://(?:[^@/\s]*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):([0-9]{1,5})$"
)


def check_cluster_address(text: object, *, what: str = "--cluster") -> str:
    """A scheduler address ``tcp://host:port`` (or ``tls://``), else one line naming ``what``.

    Credentials written into the address (``tcp://user:secret@host:port``) are refused: Dask
    authenticates with TLS certificates, and an address is recorded in the run record.
    """
    if not isinstance(text, str) or not (m := _ADDRESS_RE.match(text.strip())):
        raise InputError(
            f"{what}: expected a scheduler address tcp://HOST:PORT (or tls://), got {text!r}"
        )
    if "@" in text:
        raise InputError(
            f"{what}: a scheduler address carries no credentials (use TLS certificates), "
            f"got {safe_address(text)!r}"
        )
    port = int(m.group(3))
    if not 1 <= port <= 65535:
        raise InputError(f"{what}: port must be 1 .. 65535, got {port}")
    host = m.group(2)
    if not host.startswith("[") and (
        len(host) > 253 or any(not 1 <= len(label) <= 63 for label in host.rstrip(".").split("."))
    ):
        raise InputError(
            f"{what}: {host[:40]}{'...' if len(host) > 40 else ''} is not a host name "
            "(at most 253 characters, labels of 1 to 63)"
        )
    return text.strip()


def _tls_settings() -> list[str]:
    """The Dask TLS settings a ``tls://`` address needs that are not set."""
    import dask

    need = ("ca-file", "client.cert")
    return [k for k in need if not dask.config.get(f"distributed.comm.tls.{k}", None)]


def probe_scheduler(address: str, timeout_s: float) -> None:
    """Check that ``address`` answers as a Dask scheduler does, within ``timeout_s`` in all.

    A scheduler sends its handshake as soon as a connection opens: one length-prefixed message
    of a few frames, a msgpack map naming its Python and pickle protocol. Anything else -- no
    connection, nothing sent (a web server waiting for a request), an HTTP answer, junk bytes --
    is refused in one line naming the address before Dask reads a single length from it (a
    length read from ``HTTP/1.1`` asks for exabytes). A ``tls://`` address needs Dask's TLS
    settings (a CA file and a client certificate); its handshake is left to Dask.

    Raises:
        InputError: not a Dask scheduler, not reachable, or TLS without its settings.
    """
    import threading

    shown = safe_address(address)
    m = _ADDRESS_RE.match(address)
    assert m is not None  # checked by check_cluster_address
    scheme, host, port = m.group(1), m.group(2).strip("[]"), int(m.group(3))
    if scheme == "tls":
        missing = _tls_settings()
        if missing:
            raise InputError(
                f"{shown}: a tls:// scheduler needs Dask's TLS settings "
                f"({', '.join('distributed.comm.tls.' + k for k in missing)} unset)"
            )
        return
    outcome: list[str | None] = []

    def run() -> None:
        try:
            outcome.append(_handshake_problem(host, port, timeout_s))
        except Exception as exc:  # noqa: BLE001 - whatever the name or the peer does
            outcome.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:120]}")

    # name resolution has no timeout of its own: the probe runs in a daemon thread, given up at
    # the deadline (it holds only a socket, closed when it returns or the process ends)
    thread = threading.Thread(target=run, name="oxbench-cluster-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    problem = outcome[0] if outcome else f"no answer within {timeout_s:g} s"
    if problem is not None and problem.startswith("cannot connect"):
        raise InputError(
            f"cannot reach the Dask scheduler at {shown} within {timeout_s:g} s "
            f"({problem.removeprefix('cannot connect: ')}); is it running, and reachable from here?"
        )
    if problem is not None:
        raise InputError(
            f"{shown} is not a Dask scheduler that answers within {timeout_s:g} s ({problem}); "
            "is it running, and is this its address?"
        )


def _recv_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"the connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


def _handshake_problem(host: str, port: int, timeout_s: float) -> str | None:
    """``None`` when ``host:port`` sends a Dask handshake within ``timeout_s``, else what it did."""
    import struct

    import msgpack

    deadline = time.monotonic() + timeout_s
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except (OSError, UnicodeError) as exc:
        return f"cannot connect: {type(exc).__name__}"
    with sock:
        try:
            (length,) = struct.unpack("<Q", _recv_exactly(sock, 8, deadline))
            if not 16 <= length <= _HANDSHAKE_LIMIT:
                return f"it sent a message of {length:,} bytes, not a handshake"
            body = _recv_exactly(sock, length, deadline)
        except TimeoutError:
            return "it sent nothing a Dask scheduler sends"
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
    (n_frames,) = struct.unpack_from("<Q", body)
    if not 1 <= n_frames <= 16 or 8 + 8 * n_frames > length:
        return "it sent no Dask frames"
    sizes = struct.unpack_from(f"<{n_frames}Q", body, 8)
    start = 8 + 8 * n_frames
    if start + sum(sizes) != length:
        return "it sent no Dask frames"
    for size in sizes:
        try:
            msg = msgpack.unpackb(body[start : start + size], raw=False)
        except Exception:  # noqa: BLE001, S112 - another frame may hold the map
            msg = None
        if isinstance(msg, dict) and "pickle-protocol" in msg:
            return None
        start += size
    return "its first message is not a Dask handshake"


def safe_address(address: str) -> str:
    """``address`` without any ``user:password@`` part (what a record or a message may show)."""
    return re.sub(r"^([a-z]+://)[^@/]*@", r"\1", address)


def _dask_modules() -> tuple[Any, Any]:
    """``dask`` and ``distributed``, or one line naming the pip command."""
    return require("dask", "dask"), require("distributed", "dask")


# ------------------------------------------------------------------ what runs on a worker
#: The jobs installed in this worker process, by the token of the stage that installed them.
_JOBS: dict[str, Callable[[Any], Any]] = {}


def _job_installer(token: str, job: Callable[[Any], Any]) -> Any:
    """A worker plugin that installs ``job`` in every worker, including workers that join or are
    restarted later (a worker killed and restarted by its nanny gets it again)."""
    from distributed.diagnostics.plugin import WorkerPlugin

    class InstallJob(WorkerPlugin):
        def __init__(self) -> None:
            self.token, self.job = token, job

        # this class travels by value: the registry is reached through the worker's own module
        def setup(self, worker: Any) -> None:
            import oxbench.execution.dask as here

            here._JOBS[self.token] = self.job

        def teardown(self, worker: Any) -> None:
            import oxbench.execution.dask as here

            here._JOBS.pop(self.token, None)

    return InstallJob()


def _run_item(token: str, item: Any, per_host: Mapping[str, int]) -> Any:
    """One task: cap this worker's threads and keep its freed buffers (once per worker process),
    then run the installed job."""
    from distributed import get_worker

    host = get_worker().address.rsplit(":", 1)[0].split("://")[-1]
    threads = max(1, available_cores() // max(1, per_host.get(host, 1)))
    if thread_cap() != threads:
        keep_freed_memory()
        limit_threads(threads)
    return _JOBS[token](item)


def _worker_facts(dask_worker: Any) -> dict[str, Any]:
    """On a worker (``Client.run`` passes it): its pid, host name, cores and task slots."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "cores": available_cores(),
        "nthreads": int(dask_worker.state.nthreads),
    }


def _missing_paths(paths: Mapping[str, str], probe: tuple[str, str] | None) -> str | None:
    """On a worker: the first of ``paths`` it cannot see, or a probe file with other content."""
    for what, path in paths.items():
        if not os.path.isdir(path):
            return f"the {what} {path}"
    if probe is not None:
        path, token = probe
        try:
            with open(path, encoding="utf-8") as fh:
                if fh.read() == token:
                    return None
        except OSError:
            pass
        return f"the file {path} this process just wrote there (not the same file system)"
    return None


def _allowed_failures(dask_scheduler: Any) -> int:
    """On the scheduler: how many workers may die under one task before it is given up."""
    return int(dask_scheduler.allowed_failures)


def _task_attempts(dask_scheduler: Any, keys: Sequence[str], retries: int) -> int:
    """On the scheduler: how many attempts beyond the first the tasks ``keys`` took."""
    extra = 0
    for key in keys:
        ts = dask_scheduler.tasks.get(key)
        if ts is not None:
            extra += int(ts.suspicious) + max(0, retries - int(ts.retries))
    return extra


def wait_for_workers(
    client: Any,
    n: int,
    timeout_s: float,
    shown: str,
    *,
    report_s: float = WAIT_REPORT_S,
    said_s: float | None = None,
) -> int:
    """Wait until the scheduler behind ``client`` has ``n`` workers, at most ``timeout_s`` seconds.

    Says how many have connected when it starts waiting and every ``report_s`` seconds after
    (warnings, shown without ``-v``: workers submitted as batch jobs may sit in a queue for
    minutes). Returns the number connected.

    ``said_s``: the time the message names (default ``timeout_s``; the whole deadline when the
    wait is what is left of it).

    Raises:
        InputError: fewer than ``n`` workers after ``timeout_s`` (names the scheduler).
    """
    t0 = time.monotonic()
    deadline, last_report, reported = t0 + timeout_s, t0, -1
    while True:
        have = len(client.scheduler_info().get("workers", {}))
        now = time.monotonic()
        if have >= n:
            if reported >= 0:
                log.warning("dask: %d worker(s) connected after %.0f s", have, now - t0)
            return have
        if now >= deadline:
            raise InputError(
                f"the Dask scheduler at {shown} has {have} worker(s) after "
                f"{round(timeout_s if said_s is None else said_s, 1):g} s, "
                f"fewer than --workers {n} (--wait-workers SECONDS waits longer)"
            )
        if reported < 0 or now - last_report >= report_s:
            log.warning(
                "dask: %d of %d worker(s) connected to %s, waiting up to %.0f s more",
                have,
                n,
                shown,
                deadline - now,
            )
            last_report, reported = now, have
        with contextlib.suppress(OSError, TimeoutError):  # wakes early when workers join
            client.wait_for_workers(n, timeout=max(0.1, min(1.0, deadline - now)))


# ------------------------------------------------------------------ the executor
class DaskExecutor(Executor):
    """Runs the items of a stage as Dask tasks, on an embedded LocalCluster or an existing one.

    Args:
        workers: LocalCluster: its worker processes. Existing cluster: wait (up to
            :data:`CONNECT_TIMEOUT_S`) until at least this many workers are connected.
        cores: LocalCluster: the cores its workers share (default: this process's).
        address: an existing scheduler (default ``$OXBENCH_CLUSTER``; unset: a LocalCluster).
        retries: attempts of a task beyond the first (``0 .. MAX_RETRIES``).
        connect_timeout_s: how long to wait in all for the scheduler's handshake, the
            connection and the workers before failing (default ``$OXBENCH_CLUSTER_TIMEOUT``,
            else :data:`CONNECT_TIMEOUT_S`).
        wait_workers_s: existing cluster: how long to wait for ``workers`` of its workers once
            connected (``--wait-workers``; default: what is left of ``connect_timeout_s``): a
            batch system's workers start when their jobs leave the queue. See
            :func:`wait_for_workers`.

    Use it as a context manager, or call :meth:`close`: the LocalCluster stops there.
    """

    backend = "dask"
    options = {
        "address": Str(min_len=1),
        "retries": Int(lo=0, hi=MAX_RETRIES),
        "connect_timeout_s": Float(lo=0.1, hi=3600),
        "wait_workers_s": WAIT_WORKERS,
    }

    @classmethod
    def default_workers(cls, options: Mapping[str, Any]) -> int:
        """An existing cluster's workers are its own (wait for 1); a LocalCluster: one per core."""
        if options.get("address") or os.environ.get(CLUSTER_ENV):
            return 1
        return available_cores()

    def __init__(
        self,
        workers: int = 1,
        *,
        cores: int | None = None,
        address: str | None = None,
        retries: int = DEFAULT_RETRIES,
        connect_timeout_s: float | None = None,
        wait_workers_s: float | None = None,
    ) -> None:
        super().__init__(workers, cores=cores)
        self.wait_workers_s = (
            None
            if wait_workers_s is None
            else float(WAIT_WORKERS.check("wait_workers_s", wait_workers_s))
        )
        if address is None and os.environ.get(CLUSTER_ENV):
            address = check_cluster_address(os.environ[CLUSTER_ENV], what=CLUSTER_ENV)
        self.address = None if address is None else check_cluster_address(address)
        if (
            self.address is None
            and self.workers > self.cores
            and os.environ.get(OVERSUBSCRIBE_ENV) != "1"
        ):
            raise InputError(
                f"--workers {self.workers}: an embedded Dask cluster starts one worker process per "
                f"core at most, and {self.cores} are available (set {OVERSUBSCRIBE_ENV}=1 to start "
                "more anyway)"
            )
        if (
            isinstance(retries, bool)
            or not isinstance(retries, int)
            or not 0 <= retries <= MAX_RETRIES
        ):
            raise InputError(
                f"retries must be a whole number from 0 to {MAX_RETRIES}, got {retries!r}"
            )
        self.retries = retries
        what = "connect_timeout_s"
        if connect_timeout_s is None:
            text = os.environ.get(CLUSTER_TIMEOUT_ENV, "").strip()
            what, connect_timeout_s = CLUSTER_TIMEOUT_ENV, CONNECT_TIMEOUT_S
            if text:
                try:
                    connect_timeout_s = float(text) if len(text) <= 32 else float("nan")
                except ValueError:
                    connect_timeout_s = float("nan")
        if not 0.1 <= connect_timeout_s <= 3600:  # also refuses NaN
            raise InputError(f"{what} must be 0.1 .. 3600 seconds, got {connect_timeout_s!r}")
        self.connect_timeout_s = float(connect_timeout_s)
        self.retried = 0  # attempts beyond the first, over every stage so far
        self.allowed_failures = (
            retries  # deaths of a task's worker tolerated (the scheduler's own, with an address)
        )
        self.stages: list[dict[str, Any]] = []
        self._client: Any = None
        self._cluster: Any = None
        self._per_host: dict[str, int] = {}
        self._facts: dict[str, dict[str, Any]] = {}

    # ---------------------------------------------------------------- connecting
    @property
    def client(self) -> Any:
        """The ``distributed.Client`` (the cluster is started or reached on first use)."""
        if self._client is None:
            self._connect()
        return self._client

    def _connect(self) -> None:
        dask, distributed = _dask_modules()
        config = {
            "distributed.scheduler.allowed-failures": self.retries,
            "distributed.comm.timeouts.connect": f"{self.connect_timeout_s}s",
            "distributed.worker.daemon": True,
            "distributed.admin.system-monitor.gil.enabled": False,
        }
        t0 = time.perf_counter()
        with dask.config.set(config):
            if self.address is None:
                self._cluster = distributed.LocalCluster(
                    n_workers=self.workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    scheduler_port=0,
                    dashboard_address="127.0.0.1:0",
                    worker_dashboard_address=None,
                    memory_limit=0,
                    silence_logs=logging.ERROR,
                    scheduler_kwargs={"dashboard": False},
                )
                try:
                    self._client = distributed.Client(self._cluster, timeout=self.connect_timeout_s)
                except BaseException:
                    self._cluster.close()
                    self._cluster = None
                    raise
            else:
                shown = safe_address(self.address)
                deadline = time.monotonic() + self.connect_timeout_s
                probe_scheduler(self.address, self.connect_timeout_s)  # one line, or a scheduler
                try:
                    self._client = distributed.Client(
                        self.address, timeout=max(0.1, deadline - time.monotonic())
                    )
                except Exception as exc:  # noqa: BLE001 - whatever a failed handshake raises
                    raise InputError(
                        f"cannot reach the Dask scheduler at {shown} within {self.connect_timeout_s:g} s "
                        f"({type(exc).__name__}); is it running, and reachable from here?"
                    ) from None
                try:
                    if self.wait_workers_s is not None:
                        wait_for_workers(self._client, self.workers, self.wait_workers_s, shown)
                    else:  # what is left of the one deadline, named as the deadline
                        left = max(0.1, deadline - time.monotonic())
                        wait_for_workers(
                            self._client, self.workers, left, shown, said_s=self.connect_timeout_s
                        )
                except InputError:
                    self.close()
                    raise
        if self.address is not None:  # a running scheduler keeps its own bound for dead workers
            with contextlib.suppress(Exception):
                self.allowed_failures = int(self._client.run_on_scheduler(_allowed_failures))
        self._facts = self._client.run(_worker_facts)
        hosts: dict[str, int] = {}
        for addr, facts in self._facts.items():
            host = addr.rsplit(":", 1)[0].split("://")[-1]
            hosts[host] = hosts.get(host, 0) + int(facts["nthreads"])
        self._per_host = hosts
        log.info(
            "dask: %d worker(s) at %s, ready in %.1f s",
            len(self._facts),
            self.scheduler,
            time.perf_counter() - t0,
        )

    @property
    def scheduler(self) -> str | None:
        """The scheduler's address, without credentials (``None`` before the first connection)."""
        if self._client is None:
            return None if self.address is None else safe_address(self.address)
        return safe_address(str(self._client.scheduler.address))

    @property
    def worker_pids(self) -> dict[str, int]:
        """``{worker address: pid}`` of the connected workers (asks them now)."""
        return {addr: int(f["pid"]) for addr, f in self.client.run(_worker_facts).items()}

    def check_paths(self, paths: Mapping[str, str | os.PathLike[str]]) -> None:
        """With an existing cluster: make sure every worker sees ``paths`` (``{what: folder}``).

        The last folder also gets a probe file, which each worker must read back, so a worker with
        an empty local folder of the same name is caught too. Nothing is checked for a
        LocalCluster, whose workers share this machine's file system.

        Raises:
            InputError: one line naming the first worker and the path it cannot see.
        """
        if self.address is None or not paths:
            return
        folders = {
            what: str(make_folder(Path(p).resolve())) for what, p in paths.items()
        }  # the driver's side
        last = Path(list(folders.values())[-1])
        token = uuid.uuid4().hex
        probe = last / f"{TEMP_PREFIX}probe-{token}"
        atomic_write_text(probe, token)
        try:
            answers = self.client.run(_missing_paths, folders, (str(probe), token))
        finally:
            probe.unlink(missing_ok=True)
        for addr, missing in sorted(answers.items()):
            if missing is not None:
                host = self._facts.get(addr, {}).get("host", "?")
                raise InputError(
                    f"dask worker {addr} (host {host}) cannot see {missing}; the workers need the "
                    "data root and the cache at the same paths, on a shared file system"
                )

    # ---------------------------------------------------------------- running
    def map(
        self,
        job: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str | None = None,
        unit: str = "item",
        progress: bool = False,
    ) -> Generator[R, None, None]:
        if not items:
            return
        from distributed import KilledWorker, as_completed

        client = self.client
        t0 = time.perf_counter()
        stage = desc or "stage"
        token = uuid.uuid4().hex[:8]
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", stage)[:40]
        plugin = f"oxbench-job-{slug}-{token}"
        client.register_plugin(_job_installer(token, job), name=plugin)
        # a job that needs a scarce resource says so (``resources = {"GPU": 1}``): its tasks then run
        # only on workers started with it (``dask worker --resources GPU=1``), one per unit
        resources = getattr(job, "resources", None) or None
        futures = [
            client.submit(
                _run_item,
                token,
                item,
                self._per_host,
                key=f"oxbench-{slug}-{token}-{i}",
                retries=self.retries,
                pure=False,
                resources=resources,
            )
            for i, item in enumerate(items)
        ]
        index = {f.key: i for i, f in enumerate(futures)}
        results: dict[int, Any] = {}
        fetched: list[
            Any
        ] = []  # futures whose result is here, released in batches after their attempts are counted
        retried = 0
        bar = progress_bar(total=len(items), desc=desc, enabled=progress, unit=unit)
        done = False
        last_release = time.monotonic()
        nxt = 0
        try:
            for future, result in as_completed(futures, with_results=True, raise_errors=False):
                i = index[future.key]
                if future.status != "finished":
                    exc = result[1] if isinstance(result, tuple) and len(result) == 3 else result
                    if isinstance(exc, KilledWorker):
                        raise InputError(
                            f"{stage}: {items[i]} failed on every attempt: a worker died under each of "
                            f"its {self.allowed_failures + 1} attempts (out of memory? a crashing "
                            "library?)"
                        ) from None
                    if isinstance(exc, BaseException):
                        raise exc.with_traceback(result[2] if isinstance(result, tuple) else None)
                    raise InputError(f"{stage}: {items[i]} ended as {future.status}")
                results[i] = result
                bar.update(1)
                fetched.append(future)
                if len(fetched) >= 64 or time.monotonic() - last_release > 2.0:
                    retried += self._release(fetched, futures)
                    last_release = time.monotonic()
                while nxt in results:  # in item order, as soon as the next one is here
                    yield results.pop(nxt)
                    nxt += 1
            done = True
        finally:
            bar.close()
            retried += self._release(fetched, futures)
            if not done:
                with contextlib.suppress(Exception):
                    client.cancel(futures)
            with contextlib.suppress(Exception):
                client.unregister_worker_plugin(plugin)
            self.retried += retried
            self.stages.append(
                {
                    "stage": stage,
                    "tasks": len(items),
                    "retried": retried,
                    "complete": done,
                    "seconds": round(time.perf_counter() - t0, 3),
                }
            )
            if retried:
                log.warning(
                    "%s: %d task attempt(s) retried (a worker died, or a task failed)",
                    stage,
                    retried,
                )

    def _release(self, fetched: list[Any], futures: list[Any]) -> int:
        """Count the extra attempts of the tasks in ``fetched`` (on the scheduler), then release
        them: a result the driver holds is not recomputed when its worker dies later."""
        if not fetched:
            return 0
        keys = [f.key for f in fetched]
        extra = 0
        with contextlib.suppress(Exception):
            extra = int(
                self.client.run_on_scheduler(_task_attempts, keys=keys, retries=self.retries)
            )
        for f in fetched:
            f.release()
        fetched.clear()
        return extra

    @property
    def threads_per_worker(self) -> int:
        if self._per_host and self._facts:
            return min(
                max(
                    1,
                    int(f["cores"]) // self._per_host.get(a.rsplit(":", 1)[0].split("://")[-1], 1),
                )
                for a, f in self._facts.items()
            )
        return super().threads_per_worker

    def describe(self) -> dict[str, Any]:
        """Backend, cluster kind, scheduler address (no credentials), workers, the retry bounds
        (``retries`` of a task that raises, ``allowed_failures`` of a task whose worker dies), the
        attempts ``retried`` beyond the first, and per stage its tasks, retries and wall time."""
        return {
            "backend": self.backend,
            "cluster": "local" if self.address is None else "address",
            "scheduler": self.scheduler,
            "workers": len(self._facts) if self._facts else self.workers,
            "threads_per_worker": self.threads_per_worker,
            "retries": self.retries,
            "allowed_failures": self.allowed_failures,
            "retried": self.retried,
            "stages": list(self.stages),
        }

    @classmethod
    def check_facts(cls, facts: Mapping[str, Any]) -> None:
        """The facts :meth:`describe` adds: ``cluster`` (``local`` or ``address``), ``scheduler`` (an
        address without credentials, or null), ``retries``, ``allowed_failures`` and ``retried``
        (non-negative integers), and ``stages``: per parallel stage its ``stage`` name, ``tasks``,
        ``retried``, ``complete`` and wall ``seconds``."""

        def need(ok: bool, message: str) -> None:
            if not ok:
                raise InputError(f"'execution.{message}")

        def count(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= 0

        for key in ("retries", "allowed_failures", "retried"):
            need(key not in facts or count(facts[key]), f"{key}' must be a non-negative integer")
        need(
            facts.get("cluster", "local") in ("local", "address"),
            "cluster' must be 'local' or 'address'",
        )
        scheduler = facts.get("scheduler")
        need(
            scheduler is None
            or (isinstance(scheduler, str) and scheduler != "" and "@" not in scheduler),
            "scheduler' must be an address without credentials, or null",
        )
        stages = facts.get("stages", [])
        need(isinstance(stages, list), "stages' must be a list")
        for st in stages:
            ok = (
                isinstance(st, dict)
                and isinstance(st.get("stage"), str)
                and bool(st["stage"])
                and count(st.get("tasks"))
                and count(st.get("retried"))
                and isinstance(st.get("complete"), bool)
                and isinstance(st.get("seconds"), int | float)
                and not isinstance(st.get("seconds"), bool)
            )
            need(ok, "stages' entries need stage, tasks, retried, complete, seconds")

    def close(self) -> None:
        """Disconnect, and stop the LocalCluster (its worker processes end)."""
        client, cluster = self._client, self._cluster
        self._client = self._cluster = None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=self.connect_timeout_s)
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close(timeout=self.connect_timeout_s)


EXECUTORS.register(DaskExecutor.backend, DaskExecutor)
