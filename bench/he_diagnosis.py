"""Where weak geometric consistency gains or loses on real photos: match counts stage by stage.

On the real ROxford/RParis subset (``$OXBENCH_SHARED_DATA/revisited_pixel_retrieval_subset``; 16
cropped queries, each with 20 labelled candidates: 5 hard positives, 15 negatives), for each
query-candidate pair, with the ``rootsift-he`` preset (vocabulary and embedding trained on the
OTHER city's subset images):

- shared-word matches (every feature pair of a word: Hamming threshold 64);
- Hamming-embedding matches (within ``he.ht`` bits);
- what weak geometric consistency keeps of them: the smaller peak of the orientation- and
  log-scale-difference histograms (unit votes);

medians over the positive and the negative pairs, and the mAP of ranking each query's candidates
by each count. Nothing is tuned: it prints what the preset's settings give.

Usage::

    python bench/he_diagnosis.py [--set KEY=VALUE ...] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

_SHARED = os.environ.get("OXBENCH_SHARED_DATA")
SUBSET = Path(_SHARED) / "revisited_pixel_retrieval_subset" if _SHARED else None


def main() -> int:
    from oxbench.execution import ProcessExecutor
    from oxbench.index.hamming import N_BITS, Wgc, wgc_bins, wgc_scores
    from oxbench.pipelines import RunContext
    from oxbench.pipelines.families.he import HammingEmbeddingMethod
    from oxbench.pipelines.presets import resolve_method

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pixel_subset import candidate_map, load_subset_city
    from real_subset import _value  # a --set value as JSON, else the text

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SUBSET)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="method overrides")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("runs") / "cache-real-subset")
    args = ap.parse_args()
    if args.data is None or not args.data.is_dir():
        print(
            f"skipped: {args.data or 'the subset (set OXBENCH_SHARED_DATA or pass --data)'} is absent"
        )
        return 0
    config = resolve_method(
        "rootsift-he", **{k: _value(v) for k, v in (kv.split("=", 1) for kv in args.set)}
    )
    cities = {d: load_subset_city(args.data, d) for d in ("roxford5k", "rparis6k")}
    wgc = config.wgc if isinstance(config.wgc, Wgc) else Wgc()
    print(
        f"rootsift-he: h_t {config.he.ht}, WGC {wgc.angle_bins} x {wgc.scale_bins} bins, "
        f"+-{wgc.scale_range} octaves; medians over pairs (positive / negative); mAP of the 20 candidates"
    )
    print(
        f"{'city':10s} {'shared-word matches':>20s} {'HE matches':>14s} {'WGC peak':>12s}   "
        f"{'mAP words':>9s} {'mAP HE':>7s} {'mAP WGC':>8s}"
    )
    for dataset, city in cities.items():
        train = cities["rparis6k" if dataset == "roxford5k" else "roxford5k"].bench
        ctx = RunContext(args.cache, executor=ProcessExecutor(args.workers), progress=False)
        method = config.build().fit(train, ctx).index(city.bench, ctx)
        assert isinstance(method, HammingEmbeddingMethod) and method.index_ is not None
        index = method.index_
        method.indexed_parts(city.bench).assign(city.bench, "queries", ctx)
        counts: dict[str, list[np.ndarray]] = {"words": [], "he": [], "wgc": []}
        for qi, name in enumerate(city.bench.gt.query_names):
            w, sig, ang, ls = method.features_of("queries", name)
            cand = city.candidates[qi]
            for key, ht in (("words", N_BITS), ("he", config.he.ht)):
                feature, posting, _ = index.matches(w, sig, ht)
                image = index.images_[posting]
                if key == "he":
                    ab, sb = wgc_bins(
                        index.angles_[posting] - ang[feature],
                        index.log_scales_[posting] - ls[feature],
                        angle_bins=wgc.angle_bins,
                        scale_bins=wgc.scale_bins,
                        scale_range=wgc.scale_range,
                    )
                    peak = wgc_scores(
                        image,
                        np.ones(len(image)),
                        ab,
                        sb,
                        index.n_images,
                        wgc.angle_bins,
                        wgc.scale_bins,
                    )
                    counts["wgc"].append(peak[cand])
                counts[key].append(
                    np.bincount(image, minlength=index.n_images)[cand].astype(np.float64)
                )
        positive = [
            np.isin(cand, q.hard)
            for cand, q in zip(city.candidates, city.bench.gt.queries, strict=True)
        ]
        cells, maps = [], []
        for key in ("words", "he", "wgc"):
            pos = np.concatenate([c[p] for c, p in zip(counts[key], positive, strict=True)])
            neg = np.concatenate([c[~p] for c, p in zip(counts[key], positive, strict=True)])
            cells.append(f"{np.median(pos):.0f} / {np.median(neg):.0f}")
            ranked = [
                cand[np.argsort(-c, kind="stable")]
                for cand, c in zip(city.candidates, counts[key], strict=True)
            ]
            maps.append(100 * candidate_map(city, ranked)[0])
        print(
            f"{dataset:10s} {cells[0]:>20s} {cells[1]:>14s} {cells[2]:>12s}   "
            f"{maps[0]:9.2f} {maps[1]:7.2f} {maps[2]:8.2f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
