"""Where the work of a run executes: executors, Dask, worker processes, shards, determinism.

- :mod:`~oxbench.execution.executors` -- the seam every parallel stage hands its jobs to
  (``serial``, local ``processes``, the backend registry, thread caps);
- :mod:`~oxbench.execution.dask` -- the Dask distributed backend (``oxbench[dask]``);
- :mod:`~oxbench.execution.workers` -- the one pool of worker processes that die with their parent;
- :mod:`~oxbench.execution.shards` -- write-once shards committed by rename, read back in order;
- :mod:`~oxbench.execution.determinism` -- one BLAS / faiss thread in the learned steps.
"""

from oxbench.execution.executors import (
    EXECUTORS,
    Executor,
    ProcessExecutor,
    SerialExecutor,
    available_cores,
    check_workers,
    cpu_seconds,
    keep_freed_memory,
    limit_threads,
    make_executor,
    thread_cap,
)

__all__ = [
    "EXECUTORS",
    "Executor",
    "ProcessExecutor",
    "SerialExecutor",
    "available_cores",
    "check_workers",
    "cpu_seconds",
    "keep_freed_memory",
    "limit_threads",
    "make_executor",
    "thread_cap",
]
