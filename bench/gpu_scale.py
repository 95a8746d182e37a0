"""The streamed exact search and the k-NN graph on a GPU (issue 42 item 6), one prepared run.

For a session lent a GPU machine: ``--n`` random L2-normalised descriptors of ``--dim`` dimensions
(seeded Gaussian, ``--dtype`` shards written with :func:`oxbench.index.mapped.write_shards`), then

1. the streamed search of ``--queries`` queries (database rows plus noise), top ``--k``, with torch
   on ``--device`` (``cuda``; ``cpu`` for the tiny mode the tests run): wall seconds of the batch
   after one warm-up batch;
2. the k-NN graph of the first ``--graph-rows`` database rows against the whole database, top
   ``--graph-k`` (:func:`oxbench.index.mapped.knn_graph`, pieces of ``--piece-rows``): wall seconds;
   a second call reuses every piece (counted);
3. the CPU's ranks (numpy, the same canonical scores) on a sample (``--check`` queries and graph
   rows): ``same_ranks_search`` and ``same_ranks_graph`` must be true.

Everything goes to one JSON file (``--out``, default ``$OUT/gpu_scale.json``), written after each
step, so a run cut short still says what it measured. Nothing is kept but the JSON (the shards are
removed unless ``--keep``).

On the device machine (shards on its local disk)::

    python bench/gpu_scale.py --n 1000000 --dim 2048 --device cuda --work /tmp/gpu_scale

Tiny mode, on any CPU (what tests/test_streamed.py runs)::

    python bench/gpu_scale.py --n 3000 --dim 16 --queries 5 --graph-rows 300 --device cpu \\
        --work /tmp/gs --out /tmp/gs.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--dtype", default="float16", choices=("float16", "float32"))
    p.add_argument("--queries", type=int, default=70)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--graph-rows", type=int, default=100_000)
    p.add_argument("--graph-k", type=int, default=50)
    p.add_argument("--piece-rows", type=int, default=16384)
    p.add_argument("--block", type=int, default=131072)
    p.add_argument("--ram-gb", type=float, default=16.0)
    p.add_argument("--shard-vectors", type=int, default=1 << 18)
    p.add_argument("--check", type=int, default=5, help="sampled queries / rows checked on the CPU")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def random_chunks(n: int, dim: int, seed: int, chunk: int = 65536):  # noqa: ANN201
    for i, a in enumerate(range(0, n, chunk)):
        x = np.random.default_rng([seed, i]).standard_normal((min(chunk, n - a), dim))
        yield (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    from oxbench.index.mapped import MappedSearch, knn_graph, search_shards, write_shards

    args = parse(sys.argv[1:] if argv is None else argv)
    out_path = args.out or Path(os.environ.get("OUT", ".")) / "gpu_scale.json"
    record: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
    record["machine"] = {"cpu": platform.processor() or platform.machine()}

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(record, indent=1))

    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("gpu_scale.py: --device cuda, but torch sees no CUDA device", file=sys.stderr)
            return 2
        record["machine"]["gpu"] = torch.cuda.get_device_name(0)
    record["machine"]["torch"] = torch.__version__
    st = MappedSearch(
        ram_gb=args.ram_gb, block=args.block, shard_vectors=args.shard_vectors, dtype=args.dtype
    )
    folder = args.work / "shards"
    shutil.rmtree(args.work, ignore_errors=True)
    try:
        t0 = time.perf_counter()
        db = write_shards(
            random_chunks(args.n, args.dim, args.seed),
            folder,
            stands_for={"random": args.n, "dim": args.dim, "seed": args.seed},
            dtype=args.dtype,
            shard_vectors=args.shard_vectors,
        )
        record["build"] = {
            "wall_s": time.perf_counter() - t0,
            "disk_bytes": db.disk_bytes,
            "shards": len(db.shards),
        }
        save()
        rng = np.random.default_rng(args.seed + 1)
        picks = rng.choice(args.n, args.queries, replace=False)
        q = db.rows(picks) + 0.05 * rng.standard_normal((args.queries, args.dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)

        search_shards(q, db, args.k, st, engine=args.device)  # warm-up: kernels, page cache
        _sync(args.device)
        t0 = time.perf_counter()
        scores, ids = search_shards(q, db, args.k, st, engine=args.device)
        _sync(args.device)
        wall = time.perf_counter() - t0
        c = min(args.check, args.queries)
        cpu_s, cpu_i = search_shards(q[:c], db, args.k, st, engine="numpy")
        record["search"] = {
            "queries": args.queries,
            "k": args.k,
            "wall_s": wall,
            "ms_per_query": wall / args.queries * 1e3,
            "checked": c,
            "same_ranks_search": bool(
                np.array_equal(cpu_i, ids[:c]) and np.array_equal(cpu_s, scores[:c])
            ),
        }
        save()

        rows = min(args.graph_rows, args.n)
        t0 = time.perf_counter()
        g_s, g_i, reused = knn_graph(
            db, args.graph_k, args.work / "graph", st, piece_rows=args.piece_rows, rows=rows,
            engine=args.device,
        )  # fmt: skip
        _sync(args.device)
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        _, _, reused_again = knn_graph(
            db, args.graph_k, args.work / "graph", st, piece_rows=args.piece_rows, rows=rows,
            engine=args.device,
        )  # fmt: skip
        sample = np.sort(rng.choice(rows, min(args.check, rows), replace=False))
        cs, ci = search_shards(db.rows(sample), db, args.graph_k, st, engine="numpy")
        record["graph"] = {
            "rows": rows,
            "k": args.graph_k,
            "wall_s": wall,
            "rows_per_s": rows / wall,
            "pieces_reused_first": reused,
            "pieces_reused_rerun": reused_again,
            "rerun_wall_s": time.perf_counter() - t1,
            "checked": len(sample),
            "same_ranks_graph": bool(
                np.array_equal(ci, g_i[sample]) and np.array_equal(cs, g_s[sample])
            ),
        }
        save()
    finally:
        if not args.keep:
            shutil.rmtree(args.work, ignore_errors=True)
    print(json.dumps(record))
    ok = record.get("search", {}).get("same_ranks_search") and record.get("graph", {}).get(
        "same_ranks_graph"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from interrupt import run_script

    run_script(main)
