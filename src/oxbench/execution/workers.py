"""The package's one process pool: workers that die with their parent, and stop with it.

Every multi-process step (``oxbench data synth -j N``, feature extraction in ``oxbench run
--workers N``) gets its pool from :func:`worker_pool`:

- ``spawn`` start method: a forked child would inherit OpenCV's / OpenMP's thread pools in
  whatever state the parent left them and can deadlock in them;
- each worker asks the kernel to kill it when its parent dies (``PR_SET_PDEATHSIG`` through
  ``prctl`` on Linux) and, everywhere, runs a watchdog thread that exits the worker once its
  parent process is gone -- so ``kill -9`` of the parent never leaves orphans writing files;
- workers ignore SIGINT: a Ctrl-C reaches the whole process group, and only the parent decides
  (it cancels what is queued and stops the workers, see :meth:`WorkerPool.abort`), so no worker
  prints a traceback;
- leaving the pool's ``with`` block by an exception (an error, Ctrl-C, or SIGTERM, which the CLI
  turns into an exception) stops the workers at once instead of waiting for every
  queued task.

This module is internal.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

#: How often a worker's watchdog checks that its parent is alive (seconds).
WATCHDOG_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with(parent_pid: int) -> None:
    """Make this process end as soon as ``parent_pid`` is no longer its parent."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError):  # pragma: no cover - no usable libc: the watchdog remains
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)  # the parent is gone: nothing will read what we compute
            time.sleep(WATCHDOG_INTERVAL_S)

    # The parent may have died before prctl took effect: the watchdog's first check sees it.
    threading.Thread(target=watch, name="oxbench-parent-watchdog", daemon=True).start()


def _init_worker(
    parent_pid: int, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(parent_pid)
    if initializer is not None:
        initializer(*initargs)


class WorkerPool(ProcessPoolExecutor):
    """A :class:`~concurrent.futures.ProcessPoolExecutor` whose workers die with the parent.

    Use it as a context manager: a normal exit waits for the work as usual; an exception
    (any ``BaseException``: Ctrl-C, SIGTERM) calls :meth:`abort`.
    """

    def __init__(
        self,
        workers: int,
        *,
        initializer: Callable[..., Any] | None = None,
        initargs: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(
            max_workers=workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(os.getpid(), initializer, initargs),
        )

    def abort(self, timeout: float = 5.0) -> None:
        """Cancel the queued tasks and stop the workers now (SIGTERM, then SIGKILL)."""
        processes = list((getattr(self, "_processes", None) or {}).values())
        self.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            with contextlib.suppress(OSError, ValueError):
                p.terminate()
        deadline = time.monotonic() + timeout
        for p in processes:
            with contextlib.suppress(OSError, ValueError, AssertionError):
                p.join(max(0.0, deadline - time.monotonic()))
                if p.is_alive():
                    p.kill()
                    p.join(1.0)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        if exc_type is not None:
            self.abort()
            return False
        return super().__exit__(exc_type, exc, tb)


def worker_pool(
    workers: int, *, initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()
) -> WorkerPool:
    """A pool of ``workers`` spawned processes that die with this one (see the module docstring).

    Args:
        workers: number of processes (>= 1).
        initializer: run once in each worker after the parent-death guard is in place.
        initargs: its arguments.
    """
    return WorkerPool(workers, initializer=initializer, initargs=initargs)
