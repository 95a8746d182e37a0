"""Localisation of a method's predicted boxes on the synthetic set (boxes known by construction).

    python bench/localization.py [--root DIR] [--method rootsift-bow-sv-qe] [--workers 2]

Runs the method on the synthetic test city (generated under ``--root`` on first use; an existing
run of the same config is reused through the cache) and scores the boxes it recorded
(``boxes.json``: the query box projected by an affine fitted to the verification's inliers) with
``oxbench evaluate localization``'s protocol: each positive (Easy or Hard) image of each query
against the box of the query's region in it, a missing box scoring 0, the mean per query and then
over queries. Prints the retrieval line, the localisation line, and the split of predicted boxes
between the projected box and the inlier-box fallback.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections import Counter
from pathlib import Path

from oxbench.pipelines import RecordOptions, Session


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--root", type=Path, default=None, help="data root (default: a temporary folder)"
    )
    ap.add_argument("--method", default="rootsift-bow-sv-qe")
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args(argv)

    from oxbench.datasets.localization import localization_truth
    from oxbench.evaluation.localization import evaluate_localization
    from oxbench.pipelines.runner import run
    from oxbench.records import RunRecord

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root or Path(tmp) / "data"
        outcome = run(
            "synthetic",
            args.method,
            session=Session(root=root, workers=args.workers, progress=False),
            record=RecordOptions(runs_dir=Path(tmp) / "runs"),
        )
        print("\n".join(outcome.result.lines()))
        found = RunRecord.load(outcome.run_dir).boxes()
        if found is None:
            print(f"{args.method} predicts no boxes (no spatial verification)")
            return
        result = evaluate_localization(localization_truth("synthetic", root), found[1])
        print("\n".join(result.lines()))
        how = Counter(
            e["how"]
            for per in json.loads((outcome.run_dir / "boxes.json").read_text())["queries"].values()
            for e in per.values()
        )
        print(f"predicted boxes: {dict(how)}; {outcome.timings.get('total', 0.0):.1f} s")


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
