"""Deterministic mode: learned steps whose result does not depend on the core or BLAS thread count.

``oxbench run --deterministic`` (``oxbench.run(..., deterministic=True)``) runs the method's steps
inside :func:`single_threaded`: numpy's and scipy's BLAS / OpenMP pools at one thread
(``threadpoolctl``) and faiss's OpenMP pool at one thread (:func:`oxbench.index.faiss_setup.load_faiss`
consults :func:`active`). A job made inside the block for a worker process (word assignment:
:class:`~oxbench.pipelines.steps.words.AssignShard`) records :func:`active` when it is made and
runs its item the same way, so the words do not depend on ``--workers`` or the threads each worker
gets. A vocabulary trained in this mode is cached under its own key (``"deterministic": true``), so
a deterministic run never reuses one trained with many threads.

What it does not cover: OpenCV's SIFT takes its CPU's SIMD code path (SSE / AVX2 / AVX-512
kernels round differently) whatever the thread count, so keypoints and descriptors can differ
between CPU kinds; a BLAS library picks its kernels by CPU model in the same way (one thread makes
the order of every sum fixed on one machine, not across kernels); CNN descriptors and training run
torch with its own threads and kernels; whitening, IVF-PQ and HE files cached before are reused.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextvars import ContextVar

_ACTIVE: ContextVar[bool] = ContextVar("oxbench_deterministic", default=False)


def active() -> bool:
    """Whether this code runs inside :func:`single_threaded` (deterministic mode)."""
    return _ACTIVE.get()


def cache_key() -> dict[str, bool]:
    """What a learned artifact's cache key adds in deterministic mode (nothing outside it, so keys
    made without the mode keep their digest)."""
    return {"deterministic": True} if active() else {}


@contextlib.contextmanager
def single_threaded(enabled: bool = True) -> Iterator[None]:
    """Run the block with one BLAS / OpenMP thread in numpy, scipy and faiss (deterministic mode);
    a no-op when ``enabled`` is false. The thread counts before the block are restored after it."""
    if not enabled:
        yield
        return
    from threadpoolctl import threadpool_limits

    token = _ACTIVE.set(True)
    faiss = sys.modules.get("faiss")
    before = faiss.omp_get_max_threads() if faiss is not None else None
    try:
        with threadpool_limits(limits=1):
            if faiss is not None:
                faiss.omp_set_num_threads(1)
            yield
    finally:
        _ACTIVE.reset(token)
        faiss = sys.modules.get("faiss")
        if faiss is not None:
            if before is None:
                from oxbench.execution.executors import available_cores, thread_cap

                before = thread_cap() or available_cores()
            faiss.omp_set_num_threads(before)
