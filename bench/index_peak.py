"""The RAM a bag-of-words index build peaks at, against what the index keeps (issue 19).

    python bench/index_peak.py [--root DIR] [--methods rootsift-bow-sv,rootsift-bow-sv-compact]
        [--distractors 0,20000] [--set KEY=VALUE ...] [--json peak.json]

Runs each method through ``oxbench.run`` on the synthetic benchmark with N generated distractors
(one process, ``--workers 1``), the family's index stage under ``tracemalloc``: its *peak* is the
most that numpy and Python held at once while the index was built, its *kept* what the index holds
afterwards, both as bytes over what was allocated when the stage began. Beside them the run
record's measured RAM per image (``footprint``) and the mAP. Memory-mapped files (the words, the
compressed lists) are not allocations and do not count. ``tracemalloc`` slows allocation-heavy
code, so the run's times here are not the method's. Run the scale curve first (or accept that the
first point extracts the distractors' features).
"""

from __future__ import annotations

import argparse
import json
import tracemalloc
from pathlib import Path
from typing import Any

from oxbench.pipelines import RecordOptions, Session
from scale_curve import counts

DEFAULT_METHODS = "rootsift-bow-sv,rootsift-bow-sv-compact"


def measure(
    method: str, distractors: int, args: argparse.Namespace, overrides: dict[str, object]
) -> dict[str, Any]:
    import oxbench
    from oxbench.pipelines.families import bow

    seen: dict[str, int] = {}
    original = bow.BagOfWords.index

    def index(self: Any, bench: Any, ctx: Any) -> Any:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = original(self, bench, ctx)
        kept, peak = tracemalloc.get_traced_memory()
        seen.update(peak=peak - base, kept=kept - base)
        return out

    bow.BagOfWords.index = index  # type: ignore[method-assign]
    tracemalloc.start()
    try:
        outcome = oxbench.run(
            "synthetic",
            method,
            distractors=distractors or None,
            overrides=overrides,
            session=Session(root=args.root, workers=1, progress=False),
            record=RecordOptions(runs_dir=args.runs),
        )
    finally:
        tracemalloc.stop()
        bow.BagOfWords.index = original  # type: ignore[method-assign]
    if not seen:
        raise SystemExit(
            f"{method} is not a bag-of-words method (its index stage was not measured)"
        )
    fp = outcome.record["footprint"]
    n = int(fp["n_index"])
    return {
        "method": method,
        "distractors": distractors,
        "n_index": n,
        "peak_bytes": seen["peak"],
        "kept_bytes": seen["kept"],
        "peak_bytes_per_image": seen["peak"] / n,
        "ram_bytes_per_image": fp["ram_bytes_per_image"],
        "map": {s: 100 * outcome.result.setups[s].map for s in ("easy", "medium", "hard")},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--root", default=None, help="data root (default: $OXBENCH_DATA or the per-user default)"
    )
    ap.add_argument("--runs", default="runs", help="parent of the run folders")
    ap.add_argument(
        "--methods", default=DEFAULT_METHODS, help="bag-of-words presets, comma-separated"
    )
    ap.add_argument(
        "--distractors", type=counts, default="0", help="distractor counts, comma-separated"
    )
    ap.add_argument(
        "--set", dest="settings", action="append", default=[], help="KEY=VALUE for every method"
    )
    ap.add_argument("--json", type=Path, default=None, help="write the points here")
    args = ap.parse_args()
    overrides: dict[str, object] = dict(s.partition("=")[::2] for s in args.settings)
    points = []
    for n in args.distractors:
        for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
            p = measure(method, n, args, overrides)
            points.append(p)
            print(
                f"{method} +{n:,} ({p['n_index']:,} images): build peak {p['peak_bytes'] / 1e6:,.0f} MB "
                f"({p['peak_bytes_per_image'] / 1e3:.1f} KB/img), kept {p['kept_bytes'] / 1e6:,.0f} MB, "
                f"record RAM {p['ram_bytes_per_image']:,.0f} B/img, mAP M {p['map']['medium']:.2f} "
                f"H {p['map']['hard']:.2f}",
                flush=True,
            )
            if args.json is not None:
                args.json.write_text(json.dumps(points, indent=1))
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
