"""The deep global-descriptor table on the synthetic default: random-init GeM (the floor) vs GeM
trained by ``oxbench train`` on the synthetic training city, + whitening, + alpha-QE, + diffusion.

Every row is an ordinary ``oxbench.run`` of the ``gem-r18-synthetic`` preset (the model file
``oxbench train`` writes, ``<root>/_models/gem-r18-synthetic.pt``) with ``--set`` overrides, so each
line is a normal run folder. Whitening is learned on the *training* city (PCA: its database; learned:
its database + query crops with the query-positive pairs), never on the test set. Every row uses the
same extraction setting (``--max-side``, ``--scales``).

Usage: ``python bench/deep_synthetic.py --root DATA [--max-side 160] [--scales 1]`` after
``oxbench train --root DATA``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from oxbench.pipelines import RecordOptions, Session, run

ROWS: list[tuple[str, str, dict[str, object]]] = [
    ("random-init GeM (floor)", "gem-r18-synthetic", {"descriptor.weights": "random"}),
    ("GeM trained by oxbench train", "gem-r18-synthetic", {}),
    ("+ PCA-whitening", "gem-r18-synthetic", {"whitening": "pca"}),
    ("+ PCA-whitening to 64 dimensions", "gem-r18-synthetic", {"whitening": "pca", "whitening_dim": 64}),
    ("+ learned whitening", "gem-r18-synthetic", {"whitening": "learned", "whitening_shrinkage": 0.1}),
    ("+ learned whitening stored by oxbench train", "gem-r18-synthetic+lw", {}),
    ("+ learned whitening + alpha-QE", "gem-r18-synthetic", {"whitening": "learned", "whitening_shrinkage": 0.1,
                                                             "rerank": "alpha-qe"}),
    ("+ learned whitening + diffusion", "gem-r18-synthetic", {"whitening": "learned", "whitening_shrinkage": 0.1,
                                                              "rerank": "diffusion"}),
    ("random-init GeM + learned whitening", "gem-r18-synthetic", {"descriptor.weights": "random", "whitening": "learned",
                                                                  "whitening_shrinkage": 0.1}),
]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--max-side", type=int, default=160)
    ap.add_argument("--scales", default="1", help="comma-separated multi-scale factors")
    ap.add_argument("--work", default="/tmp/oxbench-deep-synthetic")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    common = {
        "descriptor.max_side": args.max_side,
        "descriptor.scales": [float(s) for s in args.scales.split(",")],
    }
    work = Path(args.work)
    print(f"synthetic default, max_side {args.max_side}, scales {common['descriptor.scales']}")
    print("| method | E | M | H | mP@10 E | mP@10 M | mP@10 H | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for label, method, extra in ROWS:
        t0 = time.perf_counter()
        out = run(
            "synthetic",
            method,
            overrides={**common, **extra},
            session=Session(root=args.root, cache=work / "cache", progress=False),
            record=RecordOptions(runs_dir=work / "runs"),
        )
        s = out.result.setups
        cells = [f"{100 * s[k].map:.2f}" for k in ("easy", "medium", "hard")]
        cells += [f"{100 * s[k].mp_at_k[10]:.2f}" for k in ("easy", "medium", "hard")]
        print(f"| {label} | " + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |")
        rows.append({"label": label, "overrides": extra, "cells": cells})
        sys.stdout.flush()
    (work / "table.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
