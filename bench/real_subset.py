"""The classic presets on real ROxford/RParis images, in both evaluation settings of the subset.

Data: ``revisited_pixel_retrieval_subset`` in the real data folder (``--data``, default
``$OXBENCH_SHARED_DATA/revisited_pixel_retrieval_subset``; 16 cropped ROxford/RParis queries, each
with the 20 database images a retrieval system returned for it: 5 true positives -- all revisited
*hard* positives -- and 15 false positives) and the full revisited ground truth
(``$OXBENCH_SHARED_DATA/{roxford5k,rparis6k}/gnd_*.pkl``). Skips (exit 0) when absent.

Two settings, per city:

- **20 candidates**: each query's ranking restricted to its 20 labelled candidates (TP positive,
  junk ignored; random order gives about 30 mAP). The method indexes the city's 140 subset images.
- **all 280**: the 280 subset images as one database, each query scored with its full revisited
  labels restricted to them (Medium and Hard mAP).

The vocabulary (or ASMK codebook) of a city is never trained on it: the other city's subset images
(``--train other``, default) or the synthetic training city (``--train synthetic``). Nothing here
is tuned on these queries: presets run as they are (settings may be overridden for ablations).

``--deep`` runs the rows of the synthetic deep table instead (``deep_synthetic.ROWS``: the
``gem-r18-synthetic`` preset with each row's overrides, the random-init floor included), so the
real-image rows use exactly the settings chosen on the synthetic set. A method's whitening is
learned on the training set above, never on the evaluated city. The network itself is the model
file ``oxbench train`` wrote in the data root (``--root`` / ``$OXBENCH_DATA``), which every method
here runs with as its data root.

Usage::

    python bench/real_subset.py [--methods rootsift-bow-sv-qe ...] [--train other|synthetic]
        [--set KEY=VALUE ...] [--workers 2] [--cache DIR]
    python bench/real_subset.py --deep [--train other|synthetic] [--root DATA]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

_SHARED = os.environ.get("OXBENCH_SHARED_DATA")
DATA = Path(_SHARED) if _SHARED else None


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main() -> int:
    from oxbench.errors import InputError
    from oxbench.evaluation import evaluate
    from oxbench.execution import ProcessExecutor
    from oxbench.pipelines import RunContext
    from oxbench.pipelines.presets import resolve_method
    from pixel_subset import (  # bench/, beside this script
        load_subset_all,
        load_subset_city,
        rank_subset_city,
        subset_folder,
    )

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the real data folder")
    ap.add_argument(
        "--methods", nargs="+", default=["rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"]
    )
    ap.add_argument("--train", choices=("other", "synthetic"), default="other")
    ap.add_argument(
        "--deep",
        action="store_true",
        help="the rows of the synthetic deep table (deep_synthetic.ROWS)",
    )
    ap.add_argument(
        "--root",
        type=Path,
        default=None,
        help="data root of the synthetic sets (--train synthetic) and of oxbench train's models",
    )
    ap.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="method overrides (ablations)"
    )
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("runs") / "cache-real-subset")
    args = ap.parse_args()
    subset = subset_folder(args.data)
    if subset is None:
        return 0
    overrides = dict(kv.split("=", 1) for kv in args.set)
    cities = {d: load_subset_city(subset, d) for d in ("roxford5k", "rparis6k")}
    from oxbench.datasets.paths import data_root

    root = data_root(
        args.root
    )  # the synthetic sets and oxbench train's models (models:<file> weights)
    synth_train = None
    if args.train == "synthetic":
        from oxbench.datasets.synthetic import ensure_default, load_synthetic

        _, train_dir = ensure_default(root)
        synth_train = load_synthetic(train_dir)
    if overrides:
        print(f"overrides: {overrides}")
    rows: list[tuple[str, str, dict[str, object]]] = [(name, name, {}) for name in args.methods]
    if args.deep:
        from deep_synthetic import ROWS  # bench/, beside this script

        rows = ROWS
    width = max(22, *(len(label) for label, _, _ in rows))
    print(
        f"{'method':{width}s} {'city':10s} {'trained on':26s} {'20 cand.':>8s} {'all-280 M':>9s} {'H':>6s}  "
        f"verified/q  time"
    )
    table = []
    for label, name, extra in rows:
        method = resolve_method(name, **{**extra, **{k: _value(v) for k, v in overrides.items()}})
        cells = []
        for dataset, city in cities.items():
            other = "rparis6k" if dataset == "roxford5k" else "roxford5k"
            train = synth_train if synth_train is not None else cities[other].bench
            t0 = time.perf_counter()
            try:
                cand = rank_subset_city(
                    city, train, args.cache, method, workers=args.workers, root=root
                )
                bench_all = load_subset_all(subset, dataset, args.data)
                ctx = RunContext(
                    args.cache, executor=ProcessExecutor(args.workers), progress=False, root=root
                )
                out = method.build().fit(train, ctx).index(bench_all, ctx).search(bench_all, ctx)
            except InputError as exc:  # e.g. a learned whitening the training set is too small for
                print(f"{label:{width}s} {dataset:10s} {train.id:26s} n/a: {exc}", flush=True)
                cells += ["n/a", "n/a"]
                continue
            setups = evaluate(bench_all.gt, out.ranks).setups
            dt = time.perf_counter() - t0
            verified = sum(cand["verified"]) / len(cand["verified"])  # type: ignore[arg-type]
            cells += [
                f"{100 * cand['map']:.2f}",  # type: ignore[operator]
                f"{100 * setups['medium'].map:.2f} / {100 * setups['hard'].map:.2f}",
            ]
            print(
                f"{label:{width}s} {dataset:10s} {train.id:26s} {100 * cand['map']:8.2f} "  # type: ignore[operator]
                f"{100 * setups['medium'].map:9.2f} {100 * setups['hard'].map:6.2f}  {verified:10.2f}  {dt:4.0f} s",
                flush=True,
            )
        table.append(f"| {label} | " + " | ".join(cells) + " |")
    print(
        "\n| method | ROxford 20 cand. | ROxford all-280 M / H | RParis 20 cand. | RParis all-280 M / H |"
    )
    print("|---|---|---|---|---|")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
