"""Executors: the serial and local-process backends, the backend registry and the thread caps.

The execution seam: where the parallel stages of a run execute.

A stage never starts processes itself. It hands the executor a *job* (a picklable callable holding
everything the stage needs, opened lazily where it runs) and the items to run it on, and reads the
results back in item order::

    for result in ctx.executor.map(job, items, desc="assign"):
        ...

The executor decides where the items run, as scikit-learn's ``n_jobs`` lets joblib pick the
backend. The job travels once per worker (it is installed in each worker process the first time
that worker meets it, never pickled per item), and results come back in the order of ``items``, so what a stage
writes does not depend on the backend or the number of workers.

Backends (:data:`EXECUTORS`; one module each, registered by name):

- ``serial`` -- every item in this process, in order;
- ``processes`` -- ``workers`` spawned processes of :mod:`oxbench.execution.workers` (they die with this
  process and stop with it on Ctrl-C or an error);
- ``dask`` -- Dask distributed (:mod:`oxbench.execution.dask`, the extra ``oxbench[dask]``): an
  embedded LocalCluster, or an existing cluster's scheduler (``address``);
- a plugin's, through the ``oxbench.executors`` entry-point group (:mod:`oxbench.registry`).

A backend's own settings are one mapping, checked by the specs it declares
(:attr:`Executor.options`): ``make_executor("dask", options={"address": "tcp://host:8786"})``,
``--engine dask --engine-option address=tcp://host:8786`` (``--cluster`` is its shorthand).

An executor may hold resources across stages (a cluster): use it as a context manager, or call
:meth:`Executor.close` when the run ends.

Threads: a worker runs BLAS / OpenMP / OpenCV / faiss / torch with :attr:`Executor.threads_per_worker`
threads, so that ``workers x threads`` never exceeds the cores the executor was given
(:func:`limit_threads`, called in each worker before its first item).
"""

from __future__ import annotations

import logging
import os
import pickle
import shutil
import sys
import tempfile
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from oxbench.errors import InputError
from oxbench.execution.workers import WorkerPool, worker_pool
from oxbench.fileio import progress_bar
from oxbench.registry import GROUPS, Registry

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.schema import Spec

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

#: Most workers one executor may be asked for.
MAX_WORKERS = 1024

#: Environment variables that size the thread pools of BLAS / OpenMP libraries loaded after them.
THREAD_ENV = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process, its finished child processes and the live
    workers of its :class:`ProcessExecutor` pools.

    A stage's CPU cost is the difference of two readings around it. Other live children (a Dask
    LocalCluster's workers) count once they have exited.
    """
    import resource

    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _live_workers_cpu()


#: glibc malloc settings of :func:`keep_freed_memory`: buffers up to this size come from the heap...
MALLOC_MMAP_THRESHOLD = 64 << 20
#: ...and up to this much freed heap stays mapped for the next allocation.
MALLOC_TRIM_THRESHOLD = 128 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_MALLOC_TUNED = False


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse the large buffers numeric code frees instead of unmapping them.

    glibc serves a large allocation (above 128 KiB, raised adaptively) with fresh pages from the
    kernel and unmaps it when freed. Image pyramids (SIFT's scale space) and blocked distance
    products allocate megabytes per image and per pair, so every image paid for page faults and
    the kernel zeroing new pages (measured in bench/README.md, "The main job"). With
    :data:`MALLOC_MMAP_THRESHOLD` and :data:`MALLOC_TRIM_THRESHOLD` the same memory is reused, at
    the price of up to the trim threshold of freed memory staying with the process. Called by the
    command line and in every worker; left alone where the environment sets
    ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` and where the C library is not glibc.

    Returns:
        Whether the settings are in effect (applied now or before).
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return True
    if any(v in os.environ for v in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    import ctypes
    import ctypes.util
    import platform

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1 and ok
    except (OSError, AttributeError):  # pragma: no cover - no usable libc
        return False
    _MALLOC_TUNED = ok
    return ok


_THREAD_CAP: int | None = None


def thread_cap() -> int | None:
    """The thread count :func:`limit_threads` set in this process (``None``: never set)."""
    return _THREAD_CAP


def limit_threads(n: int) -> None:
    """Run the numeric libraries of this process with ``n`` threads each.

    Sets OpenCV's and faiss's (OpenMP) pools and torch's intra-op pool when those libraries are
    loaded, the BLAS / OpenMP pools of numpy and scipy through ``threadpoolctl``, and the cap that
    libraries loaded later read (:func:`thread_cap`, the ``*_NUM_THREADS`` variables). Called once
    in each worker process, before its first item; libraries that are not installed are left alone.
    """
    global _THREAD_CAP
    n = max(1, int(n))
    _THREAD_CAP = n
    for var in THREAD_ENV:
        os.environ[var] = str(n)  # libraries loaded from now on start with n threads
    try:
        import cv2

        cv2.setNumThreads(n)
    except ImportError:  # pragma: no cover - opencv is an extra
        pass
    faiss = sys.modules.get("faiss")
    if faiss is not None:
        faiss.omp_set_num_threads(n)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(n)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)


class Executor(ABC):
    """Runs a job over items and returns the results in item order.

    Attributes:
        workers: how many items may run at once (processes, or cluster workers).
        cores: the cores the executor may use in all (default: those of this process).
    """

    backend: ClassVar[str] = ""
    #: The backend's own options (keyword arguments of ``__init__`` beyond ``workers`` and
    #: ``cores``), each with the spec that parses and checks it (:mod:`oxbench.schema`); what
    #: ``make_executor(options=...)`` and ``--engine-option KEY=VALUE`` accept.
    options: ClassVar[Mapping[str, Spec]] = {}

    def __init__(self, workers: int = 1, *, cores: int | None = None) -> None:
        self.workers = check_workers(workers)
        self.cores = max(1, cores if cores is not None else available_cores())

    @classmethod
    def default_workers(cls, options: Mapping[str, Any]) -> int:
        """How many workers when none are asked for (with these options): one per available core."""
        return available_cores()

    @property
    def threads_per_worker(self) -> int:
        """Numeric-library threads of each worker: ``workers x threads <= cores``."""
        return max(1, self.cores // self.workers)

    @abstractmethod
    def map(
        self,
        job: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str | None = None,
        unit: str = "item",
        progress: bool = False,
    ) -> Generator[R, None, None]:
        """``job(item)`` for every item, yielded in the order of ``items``.

        Args:
            job: a picklable callable; backends that run items elsewhere install it once per
                worker.
            items: picklable, small (indices, names, short lists): data travels by file.
            desc, unit, progress: the progress bar (one update per finished item).

        Leaving the iteration early (an error, Ctrl-C) stops the work that is still queued.
        """

    def describe(self) -> dict[str, Any]:
        """What the run record says about where the work ran: ``backend``, ``workers`` and
        ``threads_per_worker``, and any facts of the backend's own (a cluster's address), which
        :meth:`check_facts` checks when the record is read back."""
        return {
            "backend": self.backend,
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
        }

    @classmethod
    def check_facts(cls, facts: Mapping[str, Any]) -> None:
        """Check the facts of the backend's own in a run record (what :meth:`describe` adds to
        the three every backend gives); a backend with facts of its own overrides this. Every
        value is JSON data already.

        Raises:
            InputError: one line naming the fact.
        """
        return None  # the three common facts are the record's to check

    def check_paths(self, paths: Mapping[str, str | os.PathLike[str]]) -> None:  # noqa: B027 - optional hook
        """Make sure the workers see ``paths`` (``{what: folder}``: the data root, the cache).

        Local backends share this process's file system and check nothing; a cluster's workers
        may not (:class:`oxbench.execution.dask.DaskExecutor`).
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the executor holds across stages (a cluster); local backends hold nothing."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SerialExecutor(Executor):
    """Every item in this process, in order (the numeric libraries keep their own thread counts)."""

    backend = "serial"

    def __init__(self, workers: int = 1, *, cores: int | None = None) -> None:
        super().__init__(1, cores=cores)

    @property
    def threads_per_worker(self) -> int:
        return self.cores

    def map(
        self,
        job: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str | None = None,
        unit: str = "item",
        progress: bool = False,
    ) -> Generator[R, None, None]:
        bar = progress_bar(total=len(items), desc=desc, enabled=progress, unit=unit)
        try:
            for item in items:
                yield job(item)
                bar.update(1)
        finally:
            bar.close()


_JOB: Callable[[Any], Any] | None = None
_JOB_TOKEN: str | None = None


def _start_worker(threads: int) -> None:
    """Worker start-up: cap the numeric libraries' threads and keep freed buffers for reuse."""
    keep_freed_memory()
    limit_threads(threads)


def _call(token: str, path: str, item: Any) -> Any:
    """Run one item of the job ``token`` (read from ``path`` the first time this worker meets it)."""
    global _JOB, _JOB_TOKEN
    if token != _JOB_TOKEN:
        _JOB = None  # the previous stage's job (a vocabulary, open stores) goes first
        with open(path, "rb") as fh:
            _JOB = pickle.load(fh)  # written by this worker's parent into its private folder
        _JOB_TOKEN = token
    assert _JOB is not None
    return _JOB(item)


#: Pools whose workers are alive: :func:`cpu_seconds` reads their CPU time from ``/proc``.
_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


def _live_workers_cpu() -> float:
    """CPU seconds (user + system) of the live workers of every open pool (Linux ``/proc``; 0 elsewhere)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for pool in list(_LIVE_POOLS):
        for pid in list((getattr(pool, "_processes", None) or {}).keys()):
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                continue  # not Linux, or the worker has just exited (then it counts as a child)
    return total


def _close_pool(pool: WorkerPool, jobs: Path, *, abort: bool = False) -> None:
    """Stop a pool's workers (at once with ``abort``), then forget it and its job files."""
    try:
        if abort:
            pool.abort()
        else:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        _LIVE_POOLS.discard(pool)  # its workers are reaped now: they count as finished children
        shutil.rmtree(jobs, ignore_errors=True)


class ProcessExecutor(Executor):
    """``workers`` spawned local processes that die with this one (:mod:`oxbench.execution.workers`).

    The pool starts with the first stage that has work for more than one worker and serves every
    later stage until :meth:`close` (or until the executor is garbage-collected): each worker
    imports the libraries once per run, not once per stage. A stage's job is pickled once into a
    private temporary folder and read by each worker the first time it meets it. One item, or one
    worker, runs in this process instead, with the thread count of a single worker.
    """

    backend = "processes"

    def __init__(self, workers: int = 1, *, cores: int | None = None) -> None:
        super().__init__(workers, cores=cores)
        self._pool: WorkerPool | None = None
        self._jobs: Path | None = None
        self._finalizer: weakref.finalize[Any, ProcessExecutor] | None = None

    def _started(self) -> tuple[WorkerPool, Path]:
        if self._pool is None or self._jobs is None:
            self._jobs = Path(tempfile.mkdtemp(prefix="oxbench-jobs-"))
            self._pool = worker_pool(
                self.workers, initializer=_start_worker, initargs=(self.threads_per_worker,)
            )
            _LIVE_POOLS.add(self._pool)
            self._finalizer = weakref.finalize(self, _close_pool, self._pool, self._jobs)
        return self._pool, self._jobs

    def _stop(self, *, abort: bool = False) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._pool is not None and self._jobs is not None:
            _close_pool(self._pool, self._jobs, abort=abort)
        self._pool = self._jobs = self._finalizer = None

    def close(self) -> None:
        """Stop the workers (they also stop when this process ends)."""
        self._stop()

    def map(
        self,
        job: Callable[[T], R],
        items: Sequence[T],
        *,
        desc: str | None = None,
        unit: str = "item",
        progress: bool = False,
    ) -> Generator[R, None, None]:
        if self.workers == 1 or len(items) <= 1:
            yield from SerialExecutor(cores=self.cores).map(
                job, items, desc=desc, unit=unit, progress=progress
            )
            return
        pool, jobs = self._started()
        token = uuid.uuid4().hex
        path = jobs / f"{token}.pickle"
        path.write_bytes(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        bar = progress_bar(total=len(items), desc=desc, enabled=progress, unit=unit)
        futures = [pool.submit(_call, token, str(path), item) for item in items]
        finished = False
        try:
            for future in futures:
                yield future.result()
                bar.update(1)
            finished = True
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):
                self._stop(
                    abort=True
                )  # an error or Ctrl-C / SIGTERM: stop the workers now, not after the queue
            raise
        finally:
            bar.close()
            for future in futures:
                future.cancel()
            if finished:  # a worker may still read the file of a map left early (until close)
                path.unlink(missing_ok=True)


#: Modules of the backends that live outside this module, imported (by name, as plugins) the first
#: time :data:`EXECUTORS` is asked for a name; each registers its class. They import this module,
#: never the other way round.
BACKEND_MODULES = ("oxbench.execution.dask",)


def _load_backends() -> None:
    import importlib

    for module in BACKEND_MODULES:
        importlib.import_module(module)  # registers its backend; imports no dask until used


#: Execution backends by name; a new backend is one module that registers its class here, or an
#: ``oxbench.executors`` entry point naming the class (:mod:`oxbench.registry`).
EXECUTORS: Registry[type[Executor]] = Registry(
    "execution backend", loader=_load_backends, group=GROUPS["executors"]
)
EXECUTORS.register(SerialExecutor.backend, SerialExecutor)
EXECUTORS.register(ProcessExecutor.backend, ProcessExecutor)


def check_workers(workers: object) -> int:
    """``workers`` as an int in ``1 .. MAX_WORKERS``, else one :class:`InputError` line."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise InputError(f"workers must be a whole number from 1 to {MAX_WORKERS}, got {workers!r}")
    return workers


def make_executor(
    backend: str = "processes",
    workers: int | None = None,
    *,
    cores: int | None = None,
    options: Mapping[str, object] | None = None,
) -> Executor:
    """The executor of ``backend`` with ``workers`` workers and the backend's own ``options``.

    Args:
        backend: a name of :data:`EXECUTORS` (built-in or from a plugin).
        workers: how many items run at once (default: :meth:`Executor.default_workers`, one per
            available core; with an existing Dask cluster, 1: its workers are its own).
        cores: the cores the executor may use.
        options: the backend's options by name (:attr:`Executor.options`; ``{"address":
            "tcp://host:8786"}`` for ``dask``), typed values or text (``--engine-option``), each
            parsed and checked by the backend's declared spec.

    Raises:
        InputError: an unknown backend or option, a bad option value, a worker count that is not
            1 .. :data:`MAX_WORKERS`.
    """
    cls = EXECUTORS.get(backend)
    given = dict(options or {})
    unknown = sorted(set(given) - set(cls.options))
    if unknown:
        known = ", ".join(sorted(cls.options)) or "none"
        raise InputError(
            f"execution backend {backend!r} has no option {unknown[0]!r} (its options: {known})"
        )
    typed = {
        k: cls.options[k].coerce(k, v, what=f"{backend} engine option") for k, v in given.items()
    }
    if workers is None:
        workers = cls.default_workers(typed)
    return cls(workers, cores=cores, **typed)
