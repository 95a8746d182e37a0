"""The Dask backend against the local process pool, on the same work in the same run.

1. Local-feature extraction (RootSIFT at 640 x 480, 1000 features, through the shard protocol
   into a fresh feature store each time): images per second with ``--engine processes`` and
   ``--engine dask`` at each worker count, and their ratio. The LocalCluster is started before the
   clock starts (its start-up is reported on its own line); the process pool starts inside its
   stage, as in a run. Each engine runs ``--repeats`` times, the two interleaved (processes, dask,
   dask, processes, ...) so that a change of the machine's load hits both alike; the table gives
   the median and the min-max spread of each figure, and the CPU-seconds a run used (this process,
   its pool's workers and the LocalCluster's processes), which a loaded machine changes less than
   the wall time.
2. Per-task overhead: wall time per item of a job that does nothing, serial / processes / dask.

Usage::

    python bench/bench_dask.py                          # 1 and 2 workers (what this machine has), 3 repeats
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


def cpu_seconds() -> float:
    """CPU seconds of this process, its live descendants (the LocalCluster's nannies and workers)
    and its children that ended and were waited for (a process pool's workers)."""
    import resource

    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # ended meanwhile: counted by RUSAGE_CHILDREN once waited for
            continue
        total += t.user + t.system
    done = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + done.ru_utime + done.ru_stime


def extraction(executor, n: int, shard_size: int, work: Path) -> tuple[float, float]:  # noqa: ANN001
    """Wall and CPU seconds to describe ``n`` images into a fresh store through ``executor``."""
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store

    cfg = SiftConfig(n_features=1000, max_side=640)
    folder = work / f"store-{time.monotonic_ns()}"
    store = FeatureStore.open(folder, cfg)
    c0, t0 = cpu_seconds(), time.perf_counter()
    described = extract_to_store(
        DescribeImages(BenchImages(n), cfg),
        n,
        store,
        executor=executor,
        shard_size=shard_size,
        progress=False,
    )
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    assert described == n
    shutil.rmtree(folder)
    return seconds, cpu


def spread(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated measurements."""
    return {
        "median": float(np.median(values)),
        "min": float(min(values)),
        "max": float(max(values)),
    }


def overhead(executor, n: int) -> float:  # noqa: ANN001
    """Milliseconds of wall time per item of a job that does nothing."""
    t0 = time.perf_counter()
    assert list(executor.map(_nothing, list(range(n)))) == list(range(n))
    return (time.perf_counter() - t0) / n * 1000


def main() -> None:
    from oxbench.execution import ProcessExecutor, SerialExecutor
    from oxbench.execution.dask import DaskExecutor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--shard-size", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=400, help="no-op tasks for the overhead")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each engine, interleaved")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
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
            t0 = time.perf_counter()
            with DaskExecutor(w) as dask:
                dask.client  # noqa: B018 - start the LocalCluster before the clock starts
                startup = time.perf_counter() - t0
                runs: dict[str, list[tuple[float, float]]] = {"processes": [], "dask": []}
                for r in range(args.repeats):  # interleaved: P D, D P, P D ...
                    order = [("processes", pool), ("dask", dask)]
                    for name, ex in order if r % 2 == 0 else order[::-1]:
                        runs[name].append(extraction(ex, args.images, args.shard_size, work))
                pool_ms = overhead(pool, args.tasks)
                dask_ms = overhead(dask, args.tasks)
            img_s = {k: [args.images / wall for wall, _ in v] for k, v in runs.items()}
            rows.append(
                {
                    "workers": w,
                    "images": args.images,
                    "shards": -(-args.images // args.shard_size),
                    "repeats": args.repeats,
                    "processes_img_s": spread(img_s["processes"]),
                    "dask_img_s": spread(img_s["dask"]),
                    # per repeat, the pair run next to each other
                    "ratio": spread(
                        [
                            p / d
                            for (p, _), (d, _) in zip(runs["processes"], runs["dask"], strict=True)
                        ]
                    ),
                    "processes_cpu_s": spread([c for _, c in runs["processes"]]),
                    "dask_cpu_s": spread([c for _, c in runs["dask"]]),
                    "dask_startup_s": startup,
                    "overhead_ms": {"serial": serial_ms, "processes": pool_ms, "dask": dask_ms},
                }
            )
            print(json.dumps(rows[-1]), flush=True)

    def cell(s: dict[str, float], fmt: str = ".2f") -> str:
        return f"{s['median']:{fmt}} [{s['min']:{fmt}}, {s['max']:{fmt}}]"

    print()
    print(
        "| workers | processes img/s | dask img/s | wall processes / dask | CPU-s processes | "
        "CPU-s dask | LocalCluster start | per task: serial / processes / dask |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        o = r["overhead_ms"]
        print(
            f"| {r['workers']} | {cell(r['processes_img_s'])} | {cell(r['dask_img_s'])} | "
            f"{cell(r['ratio'])} | {cell(r['processes_cpu_s'], '.1f')} | {cell(r['dask_cpu_s'], '.1f')} | "
            f"{r['dask_startup_s']:.1f} s | {o['serial']:.3f} / {o['processes']:.2f} / {o['dask']:.2f} ms |"
        )
    print(f"(median [min, max] of {args.repeats} interleaved runs of each engine)")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
