"""Import faiss with a BLAS that knows this CPU, and with an explicit thread count.

faiss-cpu wheels bundle their own OpenBLAS (0.3.15 in faiss-cpu 1.15). On recent Xeons presented by a
hypervisor as a generic "Intel Xeon Processor", that OpenBLAS fails to identify the core and falls
back to the generic ``Prescott`` kernels: matrix products -- and so k-means and flat search -- run
many times slower than with the AVX-512 kernels (timings in ``bench/README.md``).

OpenBLAS reads ``OPENBLAS_CORETYPE`` when the library is loaded, so :func:`load_faiss` sets it from
the CPU flags *before the first faiss import*, unless the user set it already (or set
``OXBENCH_OPENBLAS_CORETYPE=keep`` to leave OpenBLAS's own detection alone). numpy is imported
earlier and keeps its own, correctly detected, kernels.

faiss's OpenMP threads wait for work *passively* (``OMP_WAIT_POLICY=PASSIVE``, set the same way,
unless the user set it): by default they spin between parallel regions, and k-means runs thousands
of short regions, so on a machine shared with other work the spinning threads took several times
the CPU of the work itself (measured in bench/README.md, "The main job").
"""

from __future__ import annotations

import logging
import os
import sys
from types import ModuleType

from oxbench.errors import require
from oxbench.execution import available_cores, determinism, thread_cap

log = logging.getLogger(__name__)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def suggested_coretype(flags: set[str] | None = None) -> str | None:
    """The OpenBLAS core type matching the CPU flags (``SkylakeX``, ``Haswell``), or ``None``."""
    flags = _cpu_flags() if flags is None else flags
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def load_faiss(threads: int | None = None) -> ModuleType:
    """Import faiss (extra ``classic``), choosing OpenBLAS kernels from the CPU flags first.

    Args:
        threads: OpenMP threads for faiss; default: the executor's cap in a worker process
            (:func:`oxbench.execution.limit_threads`), else the CPUs this process may use; always
            1 in deterministic mode (:mod:`oxbench.execution.determinism`).

    Returns:
        The ``faiss`` module.
    """
    if "faiss" not in sys.modules:
        choice = os.environ.get("OXBENCH_OPENBLAS_CORETYPE", "auto")
        if choice != "keep" and "OPENBLAS_CORETYPE" not in os.environ:
            core = suggested_coretype() if choice == "auto" else choice
            if core:
                log.debug("setting OPENBLAS_CORETYPE=%s before importing faiss", core)
                os.environ["OPENBLAS_CORETYPE"] = core
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    faiss = require("faiss", "classic")
    if determinism.active():  # one OpenMP thread, whatever the caller asks (deterministic mode)
        threads = 1
    elif threads is None:
        threads = thread_cap() or available_cores()
    faiss.omp_set_num_threads(max(1, int(threads)))
    return faiss
