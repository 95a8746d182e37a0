"""mAP of re-ranking each real query's 20 labelled candidates: BoW, then BoW + spatial re-ranking.

Data: ``revisited_pixel_retrieval_subset`` in the real data folder (``--data``, default
``$OXBENCH_SHARED_DATA/revisited_pixel_retrieval_subset``; 16 cropped ROxford/RParis queries, each
with the 20 database images a retrieval system returned for it: 5 true positives -- all revisited
*hard* positives -- and 15 false positives). Skips (exit 0) when the folder is absent.

The vocabulary is never trained on the evaluated city: ROxford queries use a vocabulary trained on
the RParis images of the subset and vice versa (``--train other``, default), or on the synthetic
training city (``--train synthetic``). idf comes from the evaluated city's subset images (its
database). Per query the 20 candidates are ranked by tf-idf cosine, then the spatially verified
ones move to the top (:func:`oxbench.rerank.spatial.spatial_rerank`). Chance level: a random order
of 5 positives among 20 gives mAP of about 0.30.

Usage::

    python bench/real_subset.py [--train other|synthetic] [--max-side 1024] [--n-features 2000]
                                [--vocab-size 8192] [--cache DIR] [--root DATA_ROOT]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

# The real data folder (never part of the repository), named as for the tests.
_SHARED = os.environ.get("OXBENCH_SHARED_DATA")
SUBSET = Path(_SHARED) / "revisited_pixel_retrieval_subset" if _SHARED else None


def main() -> int:
    from oxbench.pipelines.presets import resolve_method
    from pixel_subset import load_subset_city, rank_subset_city  # bench/, beside this script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SUBSET)
    ap.add_argument("--train", choices=("other", "synthetic"), default="other")
    ap.add_argument("--root", type=Path, default=None, help="data root of the synthetic sets (--train synthetic)")
    ap.add_argument("--max-side", type=int, default=1024)
    ap.add_argument("--n-features", type=int, default=2000)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--min-inliers", type=int, default=8)
    ap.add_argument("--model", default="affine")
    ap.add_argument("--cache", type=Path, default=Path("runs") / "cache-real-subset")
    args = ap.parse_args()
    if args.data is None or not args.data.is_dir():
        print(f"skipped: {args.data or 'the subset (set OXBENCH_SHARED_DATA or pass --data)'} is absent")
        return 0
    method = resolve_method(
        "rootsift-bow-sv", vocab_size=args.vocab_size, spatial_min_inliers=args.min_inliers,
        spatial_model=args.model,
        **{"features.max_side": args.max_side, "features.n_features": args.n_features},
    )
    cities = {d: load_subset_city(args.data, d) for d in ("roxford5k", "rparis6k")}
    synth_train = None
    if args.train == "synthetic":
        from oxbench.datasets.paths import data_root
        from oxbench.datasets.synthetic import ensure_default, load_synthetic

        _, train_dir = ensure_default(data_root(args.root))
        synth_train = load_synthetic(train_dir)
    print(f"method: RootSIFT {args.max_side} px (<= {args.n_features} features), {args.vocab_size} words, "
          f"{args.model} verification, >= {args.min_inliers} inliers")
    print(f"{'city':10s} {'vocabulary from':28s} {'BoW mAP':>8s} {'+SV mAP':>8s}  verified/query  time")
    results = []
    for dataset, city in cities.items():
        other = "rparis6k" if dataset == "roxford5k" else "roxford5k"
        train = synth_train if synth_train is not None else cities[other].bench
        t0 = time.perf_counter()
        res = rank_subset_city(city, train, args.cache, method, progress=False)
        dt = time.perf_counter() - t0
        results.append(res)
        verified = sum(res["verified"]) / len(res["verified"])
        print(f"{dataset:10s} {train.id:28s} {100 * res['bow']:8.2f} {100 * res['bow_sv']:8.2f}  "
              f"{verified:14.2f}  {dt:5.0f} s")
    n = sum(len(r["ap_bow"]) for r in results)
    all_bow = sum(sum(r["ap_bow"]) for r in results) / n
    all_sv = sum(sum(r["ap_bow_sv"]) for r in results) / n
    print(f"{'all 16':10s} {'':28s} {100 * all_bow:8.2f} {100 * all_sv:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
