"""The Dask backend against the local process pool, on the same work in the same run.

1. Local-feature extraction (RootSIFT at 640 x 480, 1000 features, through the shard protocol
   into a fresh feature store each time): images per second with ``--engine processes`` and
   ``--engine dask`` at each worker count, and their ratio. The LocalCluster is started before the
   clock starts (its start-up is reported on its own line); the process pool starts inside its
   stage, as in a run.
2. Per-task overhead: wall time per item of a job that does nothing, serial / processes / dask.

Usage::

    python bench/bench_dask.py                          # 1 and 2 workers (what this machine has)
    python bench/bench_dask.py --workers 1,2,4,8,16 --images 512   # the 16-core host
    python bench/bench_dask.py --json out.json

Prints a markdown table for bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


class BenchImages:
    """Deterministic 640 x 480 textured images made on read (nothing large travels to workers)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def name(self, i: int) -> str:
        return f"bench{i:05d}"

    def path(self, i: int) -> Path | None:
        return None

    def read(self, i: int) -> np.ndarray:
        rng = np.random.default_rng(i)
        small = rng.integers(0, 256, (60, 80, 3), dtype=np.uint8)
        return np.repeat(np.repeat(small, 8, axis=0), 8, axis=1)


def _nothing(x: int) -> int:
    return x


def extraction(executor, n: int, shard_size: int, work: Path) -> float:  # noqa: ANN001
    """Seconds to describe ``n`` images into a fresh store through ``executor``."""
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store

    cfg = SiftConfig(n_features=1000, max_side=640)
    folder = work / f"store-{time.monotonic_ns()}"
    store = FeatureStore.open(folder, cfg)
    t0 = time.perf_counter()
    described = extract_to_store(
        DescribeImages(BenchImages(n), cfg),
        n,
        store,
        executor=executor,
        shard_size=shard_size,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    assert described == n
    shutil.rmtree(folder)
    return seconds


def overhead(executor, n: int) -> float:  # noqa: ANN001
    """Milliseconds of wall time per item of a job that does nothing."""
    t0 = time.perf_counter()
    assert list(executor.map(_nothing, list(range(n)))) == list(range(n))
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    from oxbench.execution import ProcessExecutor, SerialExecutor
    from oxbench.execution_dask import DaskExecutor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--shard-size", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=400, help="no-op tasks for the overhead")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        extraction(
            SerialExecutor(), args.shard_size, args.shard_size, work
        )  # imports, OpenCV warm-up
        serial_ms = overhead(SerialExecutor(), args.tasks)
        for w in counts:
            pool = ProcessExecutor(w)
            t_pool = extraction(pool, args.images, args.shard_size, work)
            pool_ms = overhead(pool, args.tasks)
            t0 = time.perf_counter()
            with DaskExecutor(w) as dask:
                dask.client  # noqa: B018 - start the LocalCluster before the clock starts
                startup = time.perf_counter() - t0
                t_dask = extraction(dask, args.images, args.shard_size, work)
                dask_ms = overhead(dask, args.tasks)
            rows.append(
                {
                    "workers": w,
                    "images": args.images,
                    "shards": -(-args.images // args.shard_size),
                    "processes_img_s": args.images / t_pool,
                    "dask_img_s": args.images / t_dask,
                    "ratio": t_pool / t_dask,
                    "dask_startup_s": startup,
                    "overhead_ms": {"serial": serial_ms, "processes": pool_ms, "dask": dask_ms},
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    print()
    print(
        "| workers | processes img/s | dask img/s | dask / processes | LocalCluster start | "
        "per task: serial / processes / dask |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o = r["overhead_ms"]
        print(
            f"| {r['workers']} | {r['processes_img_s']:.2f} | {r['dask_img_s']:.2f} | {r['ratio']:.2f} | "
            f"{r['dask_startup_s']:.1f} s | {o['serial']:.3f} / {o['processes']:.2f} / {o['dask']:.2f} ms |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
