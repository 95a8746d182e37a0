"""Where the classic pipeline loses on real photos: per-stage counts next to exhaustive matching.

On the real ROxford/RParis subset (``$OXBENCH_SHARED_DATA/revisited_pixel_retrieval_subset``; 16
cropped queries, each with 20 labelled candidates: 5 hard positives, 15 negatives), for each
query-candidate pair:

- features per image and distinct visual words per image;
- tentative correspondences from shared visual words (per-word cap, optional multiple assignment on
  the query side) and the inliers of spatial verification, per positive and per negative pair;
- the same for exhaustive RootSIFT matching of the same features (mutual nearest neighbours with
  Lowe's ratio test), i.e. what a bag-of-words with a large vocabulary approximates;
- the mAP of ranking each query's 20 candidates by each count.

The vocabulary of a city is trained on the OTHER city's subset images (never on the evaluated
one). Nothing here is tuned: it prints what each setting gives.

Usage::

    python bench/classic_diagnosis.py [--max-side 1024] [--n-features 0] [--vocab-size 16384]
        [--model similarity] [--method fsm] [--min-inliers 5] [--query-ma 1] [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

_SHARED = os.environ.get("OXBENCH_SHARED_DATA")
SUBSET = Path(_SHARED) / "revisited_pixel_retrieval_subset" if _SHARED else None


def main() -> int:  # noqa: PLR0915 - a report, read top to bottom
    from oxbench.execution import ProcessExecutor
    from oxbench.pipelines import RunContext, steps
    from oxbench.pipelines.presets import resolve_method
    from oxbench.refinement.spatial import (
        Verification,
        descriptor_matches,
        expand_query_words,
        tentative_matches,
        verify_pair,
    )

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pixel_subset import candidate_map, load_subset_city

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SUBSET)
    ap.add_argument("--max-side", type=int, default=1024)
    ap.add_argument("--n-features", type=int, default=4000)
    ap.add_argument("--vocab-size", type=int, default=65536)
    ap.add_argument("--model", default="similarity")
    ap.add_argument("--method", default="fsm")
    ap.add_argument("--threshold", type=float, default=8.0)
    ap.add_argument("--min-inliers", type=int, default=4)
    ap.add_argument("--max-per-word", type=int, default=8)
    ap.add_argument(
        "--query-ma", type=int, default=1, help="words per query feature for tentative matches"
    )
    ap.add_argument("--ratio", type=float, default=0.8)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cache", type=Path, default=Path("runs") / "cache-real-subset")
    args = ap.parse_args()
    if args.data is None or not args.data.is_dir():
        print(
            f"skipped: {args.data or 'the subset (set OXBENCH_SHARED_DATA or pass --data)'} is absent"
        )
        return 0
    method = resolve_method(
        "rootsift-bow-sv",
        **{"vocabulary.size": args.vocab_size},
        **{"features.max_side": args.max_side, "features.n_features": args.n_features},
    )
    cities = {d: load_subset_city(args.data, d) for d in ("roxford5k", "rparis6k")}
    print(
        f"features: RootSIFT {args.max_side} px, <= {args.n_features or 'all'}; {args.vocab_size} words from the "
        f"other city; tentative: cap {args.max_per_word}/word, query MA {args.query_ma}; verification "
        f"{args.model}/{args.method}, {args.threshold} px, >= {args.min_inliers} inliers; exhaustive: mutual NN + "
        f"ratio {args.ratio}"
    )
    verify_kw = {
        "model": args.model,
        "method": args.method,
        "threshold_px": args.threshold,
        "min_inliers": args.min_inliers,
    }
    rows = []
    for dataset, city in cities.items():
        other = cities["rparis6k" if dataset == "roxford5k" else "roxford5k"].bench
        bench = city.bench
        ctx = RunContext(args.cache, executor=ProcessExecutor(args.workers), progress=False)
        vocab = steps.step_vocabulary(method.vocabulary(), other, ctx).path
        steps.step_features(bench, method.features, ctx)
        stores = {
            p: steps.open_store(args.cache, bench, method.features, p)
            for p in ("database", "queries")
        }
        words = {}
        k = max(1, args.query_ma)
        for p in ("database", "queries"):
            out = steps.words_path(args.cache, bench, vocab, k, p)
            steps.step_assign(vocab, stores[p], steps.part_names(bench, p), out, ctx, k=k)
            words[p] = steps.Words.load(out)
        stat: dict[str, list[float]] = {
            key: []
            for key in (
                "feat",
                "words",
                "tent_pos",
                "tent_neg",
                "inl_pos",
                "inl_neg",
                "ex_pos",
                "ex_neg",
                "exinl_pos",
                "exinl_neg",
            )
        }
        ranked = {"tent": [], "inl": [], "ex": [], "exinl": []}
        for qi, cand in enumerate(city.candidates):
            qn = bench.queries.name(qi)
            qf = stores["queries"].get(qn)
            qw, _ = words["queries"].of(qn)
            q_words, q_index = expand_query_words(qw[:, : args.query_ma])
            positives = set(bench.gt.queries[qi].hard.tolist())
            counts = {key: np.zeros(len(cand)) for key in ranked}
            for j, idx in enumerate(cand.tolist()):
                dn = bench.gt.db_names[idx]
                df = stores["database"].get(dn)
                dw = words["database"].of(dn)[0][:, 0]
                stat["feat"].append(len(df))
                stat["words"].append(len(np.unique(dw)))
                tm = tentative_matches(q_words, dw, max_per_word=args.max_per_word)
                tm[:, 0] = q_index[tm[:, 0]]
                tm = np.unique(tm, axis=0)
                res = verify_pair(
                    qf.keypoints,
                    df.keypoints,
                    tm,
                    Verification(**verify_kw),
                    q_size=qf.image_size,
                    d_size=df.image_size,
                )
                ex = descriptor_matches(qf.descriptors, df.descriptors, ratio=args.ratio)
                exres = verify_pair(
                    qf.keypoints,
                    df.keypoints,
                    ex,
                    Verification(**verify_kw),
                    q_size=qf.image_size,
                    d_size=df.image_size,
                )
                tag = "pos" if idx in positives else "neg"
                stat[f"tent_{tag}"].append(len(tm))
                stat[f"inl_{tag}"].append(res.n_inliers)
                stat[f"ex_{tag}"].append(len(ex))
                stat[f"exinl_{tag}"].append(exres.n_inliers)
                counts["tent"][j] = len(tm)
                counts["inl"][j] = res.n_inliers if res.verified else 0
                counts["ex"][j] = len(ex)
                counts["exinl"][j] = exres.n_inliers if exres.verified else 0
            for key in ranked:
                score = counts[key] + 1e-3 * counts["tent"] / max(
                    1.0, counts["tent"].max()
                )  # ties: by matches
                ranked[key].append(cand[np.argsort(-score, kind="stable")])
        maps = {key: candidate_map(city, r)[0] for key, r in ranked.items()}
        q_feat = np.mean(
            [stores["queries"].count(bench.queries.name(i)) for i in range(bench.gt.n_queries)]
        )
        rows.append((dataset, stat, maps, q_feat))
    print(
        "\n| city | feat/img (db, query) | words/img | tentative pos / neg | inliers pos / neg | "
        "exhaustive pos / neg | exh. inliers pos / neg |"
    )
    print("|---|---|---|---|---|---|---|")
    for dataset, s, _, q_feat in rows:

        def pn(key: str, s: dict = s) -> str:
            return f"{np.median(s[key + '_pos']):.0f} / {np.median(s[key + '_neg']):.0f}"

        print(
            f"| {dataset} | {np.mean(s['feat']):.0f}, {q_feat:.0f} | {np.mean(s['words']):.0f} | {pn('tent')} | "
            f"{pn('inl')} | {pn('ex')} | {pn('exinl')} |"
        )
    print("\n(medians per pair) mAP of ranking the 20 candidates by:")
    print(
        "| city | tentative count | verified inliers | exhaustive count | exhaustive + verification |"
    )
    print("|---|---|---|---|---|")
    for dataset, _, m, _ in rows:
        print(
            f"| {dataset} | {100 * m['tent']:.1f} | {100 * m['inl']:.1f} | {100 * m['ex']:.1f} | {100 * m['exinl']:.1f} |"
        )
    avg = {key: np.mean([r[2][key] for r in rows]) for key in rows[0][2]}
    print(
        f"| both | {100 * avg['tent']:.1f} | {100 * avg['inl']:.1f} | {100 * avg['ex']:.1f} | {100 * avg['exinl']:.1f} |"
    )
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
