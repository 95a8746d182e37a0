"""Global search at 10M images measured by simulation: streamed exact search (``search=mapped``)
and FAISS IVF-PQ over the same simulated descriptors.

The database: ``--n`` global descriptors resampled from measured ones plus Gaussian noise
(:func:`oxbench.index.simulate.simulated_vectors`: a measured vector drawn uniformly, noise of 0.1
of each dimension's measured deviation, L2-normalised) -- by default the 5,063 real 128-D Oxford
descriptors of ``$OXBENCH_SHARED_DATA/oxford5k/lopq_features/oxford_features.fvecs`` (``--measured``
any ``.npy``/``.fvecs``; ``--random-dim D`` draws Gaussian "measured" vectors, for a tiny run
without the data). The queries: ``--queries`` of the measured vectors (the real images'
descriptors), top ``--k``.

Each stage runs in its own process (its peak RSS its own), one JSON line each:

- ``build``: the shards written (``--dtype``, ``--shard-vectors`` rows a file) with their digests,
  then opened (every shard hashed once): build CPU-s, open CPU-s, disk, peak RSS;
- ``streamed``: one batch of all queries by :func:`oxbench.index.mapped.search_shards` in this
  process (numpy BLAS, this machine's cores), memory bound ``--ram-gb``: CPU-s of the batch and a
  query, wall, the resident memory before and its peak during the search (``/proc`` VmHWM reset
  after the open), and whether the growth stayed within the bound;
- ``dask-W`` for each ``--dask-workers`` W: the same batch over a local Dask cluster of W workers
  of one core each, one shard an item (wall, workers' CPU-s), ranks checked equal to ``streamed``;
- ``ivfpq``: a FAISS IVF-PQ with oxbench's default settings (nlist 1024, m 16, 8 bits, nprobe 16)
  trained on 65,536 simulated vectors and filled chunk by chunk from the same draw: build CPU-s,
  its RAM (codes and ids), peak RSS, CPU-s a query (one at a time), recall@1/10/100 against the
  streamed exact lists.

Usage (10M, ~2.6 GB of float16 shards under --work)::

    nice python bench/bench_streamed.py --n 10000000 --work /tmp/streamed --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

GIB = 1 << 30
FVECS = Path("oxford5k/lopq_features/oxford_features.fvecs")


def measured_vectors(args: argparse.Namespace) -> np.ndarray:
    """The vectors the database is drawn from (L2-normalised float32)."""
    if args.random_dim:
        x = np.random.default_rng(7).standard_normal((5000, args.random_dim)).astype(np.float32)
    else:
        from oxbench.formats.arrays import read_features

        path = args.measured
        if path is None:
            root = os.environ.get("OXBENCH_SHARED_DATA")
            if not root:
                raise SystemExit(
                    "bench_streamed.py: set OXBENCH_SHARED_DATA, or give --measured or --random-dim"
                )
            path = Path(root) / FVECS
        x = np.asarray(read_features(path), np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> bool:
    """Reset this process's peak resident size (VmHWM), where Linux allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_rss() -> int:
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def shard_record(args: argparse.Namespace, measured: np.ndarray) -> dict[str, Any]:
    from oxbench.cache import arrays_digest

    return {
        "simulated": args.n,
        "seed": args.seed,
        "measured": arrays_digest({"x": measured})[:16],
    }


def settings(args: argparse.Namespace, device: str = "cpu"):  # noqa: ANN201
    from oxbench.index.mapped import MappedSearch

    return MappedSearch(
        ram_gb=args.ram_gb,
        block=args.block,
        shard_vectors=args.shard_vectors,
        dtype=args.dtype,
        device=device,
    )


def stage_build(args: argparse.Namespace) -> dict[str, Any]:
    from oxbench.index.mapped import open_shards, write_shards
    from oxbench.index.simulate import simulated_vectors

    measured = measured_vectors(args)
    folder = args.work / "shards"
    shutil.rmtree(folder, ignore_errors=True)
    t0, w0 = time.process_time(), time.perf_counter()
    chunks = simulated_vectors(measured, args.n, seed=args.seed, chunk=65536)
    db = write_shards(
        chunks,
        folder,
        stands_for=shard_record(args, measured),
        dtype=args.dtype,
        shard_vectors=args.shard_vectors,
    )
    build = time.process_time() - t0
    t1 = time.process_time()
    open_shards(folder, stands_for=shard_record(args, measured), dtype=args.dtype)
    return {
        "stage": "build",
        "n": db.n,
        "dim": db.dim,
        "dtype": args.dtype,
        "shards": len(db.shards),
        "build_cpu_s": build,
        "build_wall_s": time.perf_counter() - w0,
        "open_cpu_s": time.process_time() - t1,
        "disk_bytes": db.disk_bytes,
        "peak_rss_bytes": peak_rss(),
    }


def _open(args: argparse.Namespace):  # noqa: ANN202
    from oxbench.index.mapped import open_shards

    measured = measured_vectors(args)
    db = open_shards(
        args.work / "shards", stands_for=shard_record(args, measured), dtype=args.dtype
    )
    return db, measured[: args.queries]


def stage_streamed(args: argparse.Namespace) -> dict[str, Any]:
    from oxbench.index.mapped import search_shards

    db, q = _open(args)
    search_shards(q[:1], db, 1, settings(args))  # imports and first pages outside the measure
    reset = reset_peak()
    before = _status("VmRSS")
    t0, w0 = time.process_time(), time.perf_counter()
    scores, ids = search_shards(q, db, args.k, settings(args))
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    np.save(args.work / "exact_ids.npy", ids)
    peak = peak_rss()
    return {
        "stage": "streamed",
        "n": db.n,
        "queries": len(q),
        "k": args.k,
        "block": args.block,
        "ram_gb": args.ram_gb,
        "batch_cpu_s": cpu,
        "cpu_s_per_query": cpu / len(q),
        "batch_wall_s": wall,
        "threads": len(os.sched_getaffinity(0)),
        "rss_before_bytes": before,
        "peak_rss_bytes": peak,
        "peak_reset": reset,
        "growth_bytes": peak - before,
        "within_bound": bool(reset and peak - before <= args.ram_gb * GIB),
        "ns_per_vector_query": cpu / len(q) / db.n * 1e9,
    }


def stage_dask(args: argparse.Namespace, workers: int) -> dict[str, Any]:
    import psutil

    from oxbench.execution.dask import DaskExecutor
    from oxbench.index.mapped import search_shards

    db, q = _open(args)
    want = np.load(args.work / "exact_ids.npy")
    w0 = time.perf_counter()
    with DaskExecutor(workers, cores=workers) as ex:
        procs = [psutil.Process(p) for p in ex.worker_pids.values()]
        search_shards(q[:1], db, 1, settings(args), executor=ex)  # warm the workers
        started = time.perf_counter() - w0
        c0 = sum(sum(p.cpu_times()[:2]) for p in procs)
        t0, w1 = time.process_time(), time.perf_counter()
        _, ids = search_shards(q, db, args.k, settings(args), executor=ex)
        wall = time.perf_counter() - w1
        driver = time.process_time() - t0
        cpu = sum(sum(p.cpu_times()[:2]) for p in procs) - c0
    return {
        "stage": f"dask-{workers}",
        "workers": workers,
        "n": db.n,
        "queries": len(q),
        "batch_wall_s": wall,
        "workers_cpu_s": cpu,
        "driver_cpu_s": driver,
        "cluster_start_and_warm_s": started,
        "same_ranks": bool(np.array_equal(ids, want)),
    }


def stage_ivfpq(args: argparse.Namespace) -> dict[str, Any]:
    from oxbench.index.faiss_setup import load_faiss
    from oxbench.index.search import IvfPqSearch, recall_at
    from oxbench.index.sharded import train_ivfpq
    from oxbench.index.simulate import simulated_vectors

    faiss = load_faiss(None)
    measured = measured_vectors(args)
    q = measured[: args.queries]
    st = IvfPqSearch(nlist=min(1024, args.n // 64 or 1))
    t0 = time.process_time()
    train = next(simulated_vectors(measured, min(args.n, 65536), seed=args.seed + 1, chunk=65536))
    index = train_ivfpq(train, measured.shape[1], st.nlist, st.m, st.nbits, seed=st.seed)
    index.nprobe = st.nprobe
    for v in simulated_vectors(measured, args.n, seed=args.seed, chunk=65536):
        index.add(v)
    build = time.process_time() - t0
    faiss.omp_set_num_threads(1)
    t0 = time.process_time()
    found = np.vstack([index.search(q[i : i + 1], args.k)[1] for i in range(len(q))])
    query = (time.process_time() - t0) / len(q)
    truth = np.load(args.work / "exact_ids.npy")
    return {
        "stage": "ivfpq",
        "n": int(index.ntotal),
        "nlist": st.nlist,
        "nprobe": st.nprobe,
        "m": st.m,
        "build_cpu_s": build,
        "ram_bytes": int(index.ntotal) * (int(index.code_size) + 8),
        "peak_rss_bytes": peak_rss(),
        "cpu_s_per_query": query,
        **{f"recall@{k}": recall_at(found, truth, k) for k in (1, 10, 100) if k <= args.k},
    }


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=10_000_000, help="simulated database vectors")
    p.add_argument("--work", type=Path, required=True, help="folder for the shards (removed after)")
    p.add_argument("--measured", type=Path, help="vectors to resample (.npy/.fvecs)")
    p.add_argument("--random-dim", type=int, default=0, help="Gaussian measured vectors of this D")
    p.add_argument("--queries", type=int, default=70)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--ram-gb", type=float, default=1.0)
    p.add_argument("--block", type=int, default=65536)
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--shard-vectors", type=int, default=1 << 20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", default="build,streamed,dask,ivfpq")
    p.add_argument("--dask-workers", default="1,2")
    p.add_argument("--keep", action="store_true", help="keep the shards")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    from oxbench.index.simulate import check_simulated_size

    check_simulated_size(args.n)
    return args


def in_child(argv: list[str], stage: str) -> dict[str, Any]:
    """One stage in a fresh process (its own peak RSS)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path[:1], *sys.path])}
    done = subprocess.run(
        [sys.executable, __file__, *argv, "--child", stage],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if done.returncode:
        raise SystemExit(f"bench_streamed.py: stage {stage} failed: {done.stderr.strip()[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    from oxbench.errors import InputError

    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
    except InputError as exc:
        print(f"bench_streamed.py: {exc}", file=sys.stderr)
        return 2
    if args.child:
        stage = args.child
        if stage.startswith("dask-"):
            out = stage_dask(args, int(stage.split("-")[1]))
        else:
            out = {"build": stage_build, "streamed": stage_streamed, "ivfpq": stage_ivfpq}[stage](
                args
            )
        print(json.dumps(out))
        return 0
    stages: list[str] = []
    for s in args.stages.split(","):
        stages += [f"dask-{w}" for w in args.dask_workers.split(",")] if s == "dask" else [s]
    rows = []
    try:
        for stage in stages:
            row = in_child(argv, stage)
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.work / "shards", ignore_errors=True)
    from oxbench.execution.executors import available_cores

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown",
    )
    record = {"cpu": cpu, "cores": available_cores(), "n": args.n, "rows": rows}
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from interrupt import run_script

    run_script(main)
