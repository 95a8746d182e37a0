"""The scale curve: mAP, query time and bytes per image as generated distractors grow the index.

    python bench/scale_curve.py [--root DIR] [--sizes 0,1000,5000] [--workers 2]
        [--methods rootsift-bow,rootsift-bow-sv,rootsift-asmk,rootsift-vlad] [--set [METHOD:]KEY=VALUE ...]
        [--json scale.json] [--plot scale.png] [--project 1001001]
    python bench/scale_curve.py --redraw bench/README.md --plot bench/scale_curve.png

Runs each method through ``oxbench.run`` on the synthetic benchmark (the default test city,
generated on first use, and its training city) with 0, 1K, 5K ... generated distractors of the same
city (``--distractors N``: never stored as images; their features are cached by name, so a larger
size reuses the features of a smaller one -- sizes run in ascending order). For every run it
reports mAP Easy / Medium / Hard, the query time (ranking the index plus re-ranking, per query: wall
and CPU seconds from the run's own ``timings.json``; the query's own feature extraction is left
out, it does not depend on the size), the measured RAM and disk per indexed image
(``record.json`` ``footprint``) and the CPU seconds of the whole run.

The projection to ``--project`` images (R1M: 1,001,001 distractors) is a least-squares line through
the measured points of each method for RAM and disk (``fixed + n * per_image``); the ranking time
grows in proportion to the index from the largest size measured (the time of a few milliseconds at
small sizes is too noisy for a line); re-ranking is taken as constant per query (it verifies a
fixed short list). It
assumes that the distractors' bags of words are the size of the generated ones (real photos at
1024 px have more features) and that nothing switches data structure on the way; it does not
project accuracy.

``--plot`` draws mAP (Medium, Hard), the query time and RAM per image against the index size, log x
(matplotlib), the legend outside the panels; ``--redraw bench/README.md --plot scale_curve.png``
draws it again from the measured table there without running anything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from oxbench.pipelines import RecordOptions, Session

#: Stages of a run that are not the answering of a query (left out of the query time).
NOT_QUERY = {
    "load",
    "features",
    "train_features",
    "assign",
    "index",
    "evaluate",
    "total",
    "vocabulary",
    "codebook",
    "whitening",
    "network",
    "dba",
}
DEFAULT_METHODS = "rootsift-bow,rootsift-bow-sv,rootsift-asmk,rootsift-vlad"
R1M = 1_001_001


def query_seconds(timings: dict[str, float], n_queries: int) -> dict[str, float]:
    """Per query: ``rank`` (the search stage) and ``rerank`` (every other query stage), wall and CPU."""
    stages = [k for k in timings if not k.endswith("_cpu") and k not in NOT_QUERY]
    rerank = [k for k in stages if k != "search"]
    out = {
        "rank_s": timings.get("search", 0.0) / n_queries,
        "rank_cpu_s": timings.get("search_cpu", 0.0) / n_queries,
        "rerank_s": sum(timings[k] for k in rerank) / n_queries,
        "rerank_cpu_s": sum(timings.get(f"{k}_cpu", 0.0) for k in rerank) / n_queries,
    }
    out["query_s"] = out["rank_s"] + out["rerank_s"]
    return out


def one_point(
    method: str, size: int, args: argparse.Namespace, overrides: dict[str, object]
) -> dict[str, Any]:
    import oxbench

    t0 = time.perf_counter()
    outcome = oxbench.run(
        "synthetic",
        method,
        distractors=size or None,
        overrides=overrides,
        session=Session(root=args.root, cache=args.cache, workers=args.workers, progress=False),
        record=RecordOptions(runs_dir=args.runs),
    )
    res, fp = outcome.result, outcome.record["footprint"]
    timings = dict(outcome.timings)
    return {
        "method": method,
        "distractors": size,
        "n_index": fp["n_index"],
        "map": {s: 100 * res.setups[s].map for s in ("easy", "medium", "hard")},
        **query_seconds(timings, len(res.setups["medium"].ap)),
        "ram_bytes_per_image": fp["ram_bytes_per_image"],
        "disk_bytes_per_image": fp["disk_bytes_per_image"],
        "ram_bytes": fp["ram_bytes"],
        "disk_bytes": fp["disk_bytes"],
        "fixed_ram_bytes": sum(fp["fixed_ram"].values()),
        "fixed_disk_bytes": sum(fp["fixed_disk"].values()),
        "run_cpu_s": timings.get("total_cpu", 0.0),
        "run_wall_s": time.perf_counter() - t0,
        "features_cpu_s": timings.get("features_cpu", 0.0),
        "run_dir": str(outcome.run_dir),
    }


def counts(text: str) -> list[int]:
    """An argparse type: comma-separated non-negative counts (``0,1000,5000``), ascending, unique."""
    try:
        values = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated whole numbers, got {text!r}"
        ) from None
    if not values or values[0] < 0 or values[-1] > 10 * R1M:
        raise argparse.ArgumentTypeError(
            f"expected counts between 0 and {10 * R1M:,}, got {text!r}"
        )
    return values


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` (one point: slope through the origin)."""
    import numpy as np

    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def project(points: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The linear projection of one method's points to ``n`` indexed images (module docstring)."""
    xs = [float(p["n_index"]) for p in points]
    out: dict[str, Any] = {"n_index": n}
    for key in ("ram", "disk"):
        growing = [p[f"{key}_bytes"] - p[f"fixed_{key}_bytes"] for p in points]
        a, b = fit_line(xs, growing)
        out[f"{key}_bytes_per_image"] = b
        out[f"{key}_bytes"] = points[-1][f"fixed_{key}_bytes"] + max(a, 0.0) + b * n
    largest = max(
        points, key=lambda p: p["n_index"]
    )  # small sizes' times are too short to fit a line
    out["rank_s"] = largest["rank_s"] * n / largest["n_index"]
    out["rerank_s"] = sum(p["rerank_s"] for p in points) / len(points)
    out["query_s"] = out["rank_s"] + out["rerank_s"]
    return out


def table(points: list[dict[str, Any]], projections: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| method | distractors | images | mAP E | mAP M | mAP H | query ms (rank + rerank) | RAM KiB/img | "
        "disk KiB/img | run CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        m = p["map"]
        rows.append(
            f"| {p['method']} | {p['distractors']:,} | {p['n_index']:,} | {m['easy']:.2f} | {m['medium']:.2f} | "
            f"{m['hard']:.2f} | {1e3 * p['query_s']:.1f} ({1e3 * p['rank_s']:.2f} + {1e3 * p['rerank_s']:.1f}) | "
            f"{p['ram_bytes_per_image'] / 1024:.1f} | {p['disk_bytes_per_image'] / 1024:.1f} | {p['run_cpu_s']:.0f} |"
        )
    rows += [
        "",
        "| method | projected images | RAM GiB | disk GiB | query ms (rank + rerank) |",
        "|---|---|---|---|---|",
    ]
    for method, pr in projections.items():
        rows.append(
            f"| {method} | {pr['n_index']:,} | {pr['ram_bytes'] / 2**30:.2f} | {pr['disk_bytes'] / 2**30:.1f} | "
            f"{1e3 * pr['query_s']:.0f} ({1e3 * pr['rank_s']:.0f} + {1e3 * pr['rerank_s']:.0f}) |"
        )
    return "\n".join(rows)


def readme_points(path: Path) -> list[dict[str, Any]]:
    """The points of the measured table in ``bench/README.md`` (its ``| method | distractors |
    images | mAP E ...`` rows): what ``--redraw`` plots without running anything again."""
    lines = path.read_text(encoding="utf-8").splitlines()
    head = next(
        (
            i
            for i, ln in enumerate(lines)
            if ln.startswith("| method | distractors | images | mAP E")
        ),
        None,
    )
    if head is None:
        raise SystemExit(
            f"{path}: no scale-curve table (| method | distractors | images | mAP E ...)"
        )
    cols = [c.strip() for c in lines[head].strip("|").split("|")]
    points = []
    for ln in lines[head + 2 :]:
        if not ln.startswith("|"):
            break
        row = dict(zip(cols, (c.strip() for c in ln.strip("|").split("|")), strict=True))
        query = row[next(c for c in cols if c.startswith("query ms"))]  # "519.2 (0.60 + 518.6)"
        total, parts = query.split(" (")
        rank, rerank = (float(v) / 1e3 for v in parts.rstrip(")").split(" + "))
        points.append(
            {
                "method": row["method"],
                "distractors": int(row["distractors"].replace(",", "")),
                "n_index": int(row["images"].replace(",", "")),
                "map": {s: float(row[f"mAP {s[0].upper()}"]) for s in ("easy", "medium", "hard")},
                "query_s": float(total) / 1e3,
                "rank_s": rank,
                "rerank_s": rerank,
                "ram_bytes_per_image": float(row["RAM KiB/img"]) * 1024,
                "disk_bytes_per_image": float(row["disk KiB/img"]) * 1024,
            }
        )
    return points


def plot(points: list[dict[str, Any]], path: Path, *, ram_note: str = "") -> None:
    """mAP (Medium, Hard), query time and RAM per image against the index size, log x; one legend
    outside the panels, so no point is covered."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax_map, ax_time, ax_ram = fig.subplots(1, 3)
    handles = []
    for i, method in enumerate(dict.fromkeys(p["method"] for p in points)):
        colour = f"C{i}"
        pts = [p for p in points if p["method"] == method]
        xs = [p["n_index"] for p in pts]
        ax_map.plot(xs, [p["map"]["medium"] for p in pts], "o-", color=colour)
        ax_map.plot(xs, [p["map"]["hard"] for p in pts], "s--", color=colour)
        ax_time.plot(xs, [1e3 * p["query_s"] for p in pts], "o-", color=colour)
        ax_ram.plot(xs, [p["ram_bytes_per_image"] / 1024 for p in pts], "o-", color=colour)
        handles.append(Line2D([], [], color=colour, marker="o", label=method))
    handles += [
        Line2D([], [], color="k", marker="o", ls="-", label="mAP Medium"),
        Line2D([], [], color="k", marker="s", ls="--", label="mAP Hard"),
    ]
    for ax, label in (
        (ax_map, "mAP (%)"),
        (ax_time, "query time, ms (rank + re-rank, wall)"),
        (ax_ram, "index RAM per image (KiB)"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel("indexed images (database + distractors)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.set_yscale("log")
    if ram_note:
        ax_ram.set_title(ram_note, fontsize=8)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8)
    fig.suptitle("synthetic benchmark with generated distractors")
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--root", default=None, help="data root (default: $OXBENCH_DATA or the per-user default)"
    )
    ap.add_argument("--cache", default=None, help="cache (default: <root>/_cache)")
    ap.add_argument("--runs", default="runs", help="parent of the run folders")
    ap.add_argument(
        "--sizes", type=counts, default="0,1000,5000", help="distractor counts, comma-separated"
    )
    ap.add_argument("--methods", default=DEFAULT_METHODS, help="presets, comma-separated")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        help="KEY=VALUE for every method, or METHOD:KEY=VALUE for one",
    )
    ap.add_argument(
        "--project", type=int, default=R1M, help="distractors of the projection (default R1M)"
    )
    ap.add_argument("--json", type=Path, default=None, help="write every point and projection here")
    ap.add_argument(
        "--plot", type=Path, default=None, help="write the figure here (needs matplotlib)"
    )
    ap.add_argument(
        "--redraw",
        type=Path,
        default=None,
        help="draw --plot from the measured table in this README (bench/README.md); run nothing",
    )
    args = ap.parse_args()
    if args.redraw is not None:
        if args.plot is None:
            ap.error("--redraw draws the figure: give --plot PATH")
        plot(
            readme_points(args.redraw),
            args.plot,
            ram_note="as measured then: the words in RAM\n(memory-mapped since: see bench/README.md)",
        )
        print(f"plot: {args.plot}", file=sys.stderr)
        return 0
    sizes = args.sizes
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    overrides: dict[str, dict[str, object]] = {m: {} for m in methods}
    for text in args.settings:
        key, _, value = text.partition("=")
        target, _, key = key.rpartition(":")
        for m in [target] if target else methods:
            overrides.setdefault(m, {})[key] = value
    points: list[dict[str, Any]] = []
    for size in sizes:  # ascending: a larger size reuses the smaller one's distractor features
        for method in methods:
            p = one_point(method, size, args, overrides[method])
            points.append(p)
            print(
                f"{method} +{size:,}: mAP M {p['map']['medium']:.2f} H {p['map']['hard']:.2f}, "
                f"query {1e3 * p['query_s']:.1f} ms, RAM {p['ram_bytes_per_image'] / 1024:.1f} KiB/img, "
                f"run {p['run_cpu_s']:.0f} CPU-s",
                flush=True,
            )
            if args.json is not None:
                args.json.write_text(json.dumps({"points": points}, indent=1))
    n_db = points[0]["n_index"] - points[0]["distractors"] if points else 0
    projections = {
        m: project([p for p in points if p["method"] == m], n_db + args.project) for m in methods
    }
    print(table(points, projections))
    if args.json is not None:
        args.json.write_text(json.dumps({"points": points, "projections": projections}, indent=1))
    if args.plot is not None:
        plot(points, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
