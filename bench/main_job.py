"""The main job's cost: `oxbench run` cold from an empty data root, then warm, stage by stage.

    python bench/main_job.py [--workers 2] [--method rootsift-bow-sv-qe] [--keep DIR]
        [--baseline-src OTHER_CHECKOUT/src]

Runs the README's main job as a newcomer does (``python -m oxbench run`` in a fresh process, a new
empty data root: data generation included), then the same command again (warm). For each run it
prints the wall time and the CPU seconds of every stage from the run's own ``timings.json``
(``<stage>_cpu``: the stage's CPU over this process and the worker processes it waited for), the
CPU seconds of the whole process tree (``getrusage`` of the finished child, user + system), the
printed mAP line, and the load average before and after (other work on the machine inflates wall
time far more than CPU time).

``--baseline-src`` runs the same cold + warm pair first with another checkout's ``src`` (e.g. the
commit before a change, from ``git worktree add``), in the same session, and prints the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(src: Path, root: Path, runs: Path, method: str, workers: int) -> dict[str, object]:
    """``oxbench run`` once with ``src`` on the data root ``root``; its timings and costs."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    cmd = [
        sys.executable,
        "-m",
        "oxbench",
        "run",
        "--root",
        str(root),
        "--out",
        str(runs),
        "--method",
        method,
        "--workers",
        str(workers),
        "--no-progress",
    ]
    load_before = os.getloadavg()[0]
    c0, t0 = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(
            f"main_job: {' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}"
        )
    newest = max(runs.glob("*/timings.json"), key=lambda p: p.parent.name)
    mline = next((ln for ln in proc.stdout.splitlines() if "mAP" in ln), "")
    return {
        "wall": wall,
        "cpu": cpu,
        "timings": json.loads(newest.read_text()),
        "map": mline.strip(),
        "load": (load_before, os.getloadavg()[0]),
    }


def table(name: str, res: dict[str, object]) -> str:
    t: dict[str, float] = res["timings"]  # type: ignore[assignment]
    stages = [s for s in t if not s.endswith("_cpu") and s != "total"]
    stages.sort(key=lambda s: -t.get(f"{s}_cpu", t[s]))
    lines = [
        f"{name}: {res['wall']:.1f} s wall, {res['cpu']:.1f} CPU-s over all processes, "
        f"load {res['load'][0]:.1f} -> {res['load'][1]:.1f}; {res['map']}",  # type: ignore[index]
        "| stage | wall s | CPU s |",
        "|---|---|---|",
    ]
    for s in stages:
        cpu = t.get(f"{s}_cpu")
        lines.append(f"| {s} | {t[s]:.1f} | {'' if cpu is None else f'{cpu:.1f}'} |")
    lines.append(
        f"| total (in the run) | {t['total']:.1f} | {t.get('total_cpu', float('nan')):.1f} |"
    )
    return "\n".join(lines)


def cold_and_warm(
    src: Path, where: Path, method: str, workers: int
) -> tuple[dict[str, object], dict[str, object]]:
    root, runs = where / "data", where / "runs"
    cold = one_run(src, root, runs, method, workers)
    warm = one_run(src, root, runs, method, workers)
    return cold, warm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--method", default="rootsift-bow-sv-qe")
    ap.add_argument(
        "--keep", type=Path, default=None, help="keep data roots and runs under this folder"
    )
    ap.add_argument(
        "--baseline-src", type=Path, default=None, help="another checkout's src, run first"
    )
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent / "src"
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="oxbench-main-job-"))
    try:
        results = {}
        todo = ([("baseline", args.baseline_src.resolve())] if args.baseline_src else []) + [
            ("this", here)
        ]
        for label, src in todo:
            where = base / label
            if where.exists():
                shutil.rmtree(where)
            cold, warm = cold_and_warm(src, where, args.method, args.workers)
            results[label] = (cold, warm)
            print(table(f"{label} cold ({src})", cold), "\n", flush=True)
            print(table(f"{label} warm", warm), "\n", flush=True)
        if "baseline" in results:
            (bc, bw), (tc, tw) = results["baseline"], results["this"]
            print(
                f"ratios baseline / this: cold CPU {bc['cpu'] / tc['cpu']:.2f}x, cold wall {bc['wall'] / tc['wall']:.2f}x, "
                f"warm wall {bw['wall'] / tw['wall']:.2f}x"
            )  # type: ignore[operator]
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
