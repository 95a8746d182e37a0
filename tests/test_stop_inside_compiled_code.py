"""A run stops within seconds of SIGTERM even inside a long compiled computation (issue 43 case 8).

Python runs a signal handler only between bytecodes, so a run inside LAPACK (the 8,192-D whitening's
``eigh`` took minutes) kept running 84-121 s after SIGTERM. The command now ends a few seconds after
the signal whatever the main thread is doing, with exit code 130 and nothing half-written: no run
folder, no cache entry of the step it was in, no temporary file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from oxbench.cli import FORCED_EXIT_SECONDS

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

#: The run, with the whitening's eigendecomposition replaced by a long one in LAPACK (20,000
#: ``eigvalsh`` of 300 x 300 in one call: minutes, no Python bytecode until it returns).
_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    import oxbench.index.whitening as whitening

    def long_compiled_call(xc, dim):
        a = np.random.default_rng(0).normal(size=(300, 300))
        batch = np.broadcast_to(a + a.T, (20000, 300, 300))  # one gufunc call, no copy
        sys.stderr.write("LONG CALL\\n")
        sys.stderr.flush()
        np.linalg.eigvalsh(batch)
        raise AssertionError("the signal did not stop the run")

    whitening._leading_eigenpairs = long_compiled_call
    from oxbench.cli import main
    main(sys.argv[1:])
    """
)


def test_sigterm_inside_a_long_compiled_call_ends_the_run_at_once_leaving_nothing(
    tmp_path: Path,
) -> None:
    from oxbench.testing import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    cache, out = tmp_path / "cache", tmp_path / "runs"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }
    args = ["--root", str(root), "--cache", str(cache), "--out", str(out), "--no-progress"]
    args += ["--method", "rootsift-vlad-w", "--set", "descriptor.vocabulary.size=8"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCRIPT, "run", *args, "--max-side", "320"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # the run's log lines, until it is inside the long call
            if line.startswith("LONG CALL"):
                break
        else:
            pytest.fail(f"the run ended before the whitening: {proc.wait()}")
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert took < FORCED_EXIT_SECONDS + 4, took
    assert "oxbench: interrupted by SIGTERM" in err and "Traceback" not in err
    assert not out.exists() or not any(out.rglob("*")), sorted(out.rglob("*"))
    assert not list(cache.rglob(".oxbench-tmp-*")), sorted(cache.rglob(".oxbench-tmp-*"))
    assert not (cache / "whitening").exists() or not any((cache / "whitening").iterdir())
