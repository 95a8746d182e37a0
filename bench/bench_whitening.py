"""PCA whitening learnt on fewer vectors than dimensions: the n x n Gram route against the d x d
covariance route it replaced (issue 43 case 8).

VLAD of 64 words is 8,192-D, and the default training city gives it a few hundred images: the
covariance route eigendecomposed an 8,192 x 8,192 matrix (250 of a run's 268 s on the tiny set);
:class:`oxbench.index.whitening.PCAWhitening` now takes the eigenpairs of ``xc @ xc.T``. Both routes
are timed on the same random training matrix in the same run (CPU seconds, one BLAS thread), and
the whitened vectors compared (their largest difference).

Usage: ``python bench/bench_whitening.py [--n 300] [--dims 1024 2048 4096]``
"""

from __future__ import annotations

import argparse
import os
import time

# Per-core numbers: one BLAS thread, and CPU time (robust to other jobs on the machine).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from oxbench.index.whitening import PCAWhitening  # noqa: E402


def covariance_route(x: np.ndarray) -> np.ndarray:
    """The replaced route, written out: eigh of the d x d covariance, whitened training vectors."""
    xc = x - x.mean(axis=0)
    w, v = np.linalg.eigh(xc.T @ xc / (len(x) - 1))
    order = np.argsort(w)[::-1][: len(x) - 1]
    rows = v[:, order].T
    return (xc @ rows.T) / np.sqrt(w[order])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="training vectors")
    ap.add_argument("--dims", type=int, nargs="+", default=[1024, 2048, 4096])
    args = ap.parse_args(argv)
    for d in args.dims:
        x = np.random.default_rng(0).normal(size=(args.n, d)) * np.linspace(2.0, 0.5, d)
        t = time.process_time()
        ref = covariance_route(x)
        cov_s = time.process_time() - t
        t = time.process_time()
        got = PCAWhitening().fit(x).transform(x, normalize=False)
        gram_s = time.process_time() - t
        diff = float(np.abs(np.abs(got) - np.abs(ref)).max())  # eigenvector signs are arbitrary
        print(
            f"n={args.n} d={d}: covariance route {cov_s:.2f} CPU-s, Gram route {gram_s:.3f} "
            f"CPU-s, ratio {cov_s / gram_s:.0f}x, largest difference {diff:.1e}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
