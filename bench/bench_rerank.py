"""Spatial verification time per query for R = 100 and R = 500 short lists.

Synthetic but realistically sized: every image has 1000-2000 keypoints (1024 px images), words come
from a 20k vocabulary with a Zipf-like frequency (so unrelated images share ~100 words by chance, as
real ones do), and 8% of the short list really shows the query object (20-400 features under an
affine map plus 1.5 px noise, 70% of them quantised to the query's word).

Compared in the same run (ratios printed):
- tentative matching: the vectorised :func:`tentative_matches` against a Python-loop baseline
  (dict of word -> positions);
- the full :func:`spatial_rerank` per query with affine (default) vs homography models and
  USAC MAGSAC++ (default) vs USAC_ACCURATE vs classic RANSAC vs fast spatial matching (``fsm``:
  exhaustive single-correspondence hypotheses, Philbin et al. 2007).

Usage: ``python bench/bench_rerank.py [--queries 3] [--r 100 500]``
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

# Per-core numbers: one BLAS / OpenCV thread, and CPU time (robust to other jobs on the machine).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from oxbench.refinement.spatial import (  # noqa: E402
    Verification,
    _group_words,
    _matches_from_groups,
    spatial_rerank,
    tentative_matches,
)

VOCAB = 20_000


def zipf_probabilities(vocab: int = VOCAB, offset: float = 500.0, power: float = 0.7) -> np.ndarray:
    p = (np.arange(vocab) + offset) ** -power
    return p / p.sum()


def make_image(rng, probs, n):
    kp = np.zeros((n, 4), dtype=np.float32)
    kp[:, :2] = rng.uniform(0, 1024, (n, 2))
    kp[:, 2] = rng.uniform(2, 30, n)
    kp[:, 3] = rng.uniform(0, 360, n)
    return kp, rng.choice(len(probs), n, p=probs).astype(np.int64)


def make_query_and_shortlist(rng, probs, r, relevant_fraction=0.08):
    q_kp, q_words = make_image(rng, probs, int(rng.integers(1000, 2001)))
    cands = []
    relevant = rng.random(r) < relevant_fraction
    for i in range(r):
        kp, words = make_image(rng, probs, int(rng.integers(1000, 2001)))
        if relevant[i]:
            k = int(rng.integers(20, 401))
            idx = rng.choice(len(q_words), k, replace=False)
            ang, s = rng.uniform(-0.4, 0.4), rng.uniform(0.6, 1.6)
            a = np.array([[s * np.cos(ang), -s * np.sin(ang)], [s * np.sin(ang), s * np.cos(ang)]])
            a = a @ np.array([[1.0, rng.uniform(-0.2, 0.2)], [0.0, rng.uniform(0.8, 1.2)]])
            xy = q_kp[idx, :2] @ a.T + rng.uniform(-200, 200, 2) + rng.normal(0, 1.5, (k, 2))
            kp[:k, :2] = xy
            # Sizes and orientations follow the local similarity part (as SIFT's would).
            kp[:k, 2] = q_kp[idx, 2] * s * rng.uniform(0.9, 1.1, k)
            kp[:k, 3] = (q_kp[idx, 3] + np.rad2deg(ang) + rng.normal(0, 5, k)) % 360
            keep = rng.random(k) < 0.7
            words[:k] = np.where(keep, q_words[idx], words[:k])
        cands.append((kp, words))
    return q_kp, q_words, cands, relevant


def naive_tentative_matches(q_words, d_words, max_per_word=8):
    """Baseline: the obvious Python loops over features."""
    q_pos, d_pos = defaultdict(list), defaultdict(list)
    for i, w in enumerate(q_words.tolist()):
        q_pos[w].append(i)
    for j, w in enumerate(d_words.tolist()):
        d_pos[w].append(j)
    pairs = []
    for w, qs in q_pos.items():
        ds = d_pos.get(w)
        if ds and len(qs) * len(ds) <= max_per_word:
            pairs.extend((i, j) for i in qs for j in ds)
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def timed(fn, repeat=1):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--r", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import cv2

    cv2.setNumThreads(1)  # per-core numbers
    rng = np.random.default_rng(args.seed)
    probs = zipf_probabilities()
    print(
        f"vocabulary {VOCAB}, 1000-2000 keypoints per image, {args.queries} queries per setting;"
        " CPU time of one thread (ms per query)"
    )
    for r in args.r:
        data = [make_query_and_shortlist(rng, probs, r) for _ in range(args.queries)]
        n_matches = [
            len(tentative_matches(q, c[1], max_per_word=8))
            for _, q, cands, _ in data
            for c in cands
        ]
        print(
            f"\n== R = {r}: tentative matches per pair: mean {np.mean(n_matches):.0f}, "
            f"median {np.median(n_matches):.0f}, max {np.max(n_matches)}"
        )

        def all_matches(fn, data=data):
            for _, q_words, cands, _ in data:
                for _, d_words in cands:
                    fn(q_words, d_words)

        def grouped_matches(data=data):
            # As spatial_rerank does it: the query's words are grouped once per query.
            for _, q_words, cands, _ in data:
                groups = _group_words(q_words)
                for _, d_words in cands:
                    _matches_from_groups(groups, d_words, 8)

        t_fast, _ = timed(lambda: all_matches(tentative_matches), repeat=2)
        t_grouped, _ = timed(grouped_matches, repeat=2)
        t_naive, _ = timed(lambda: all_matches(naive_tentative_matches))
        nq = len(data)
        print(
            f"tentative matching ms/query: python loops {1e3 * t_naive / nq:.1f}, "
            f"tentative_matches() {1e3 * t_fast / nq:.1f} (x{t_naive / t_fast:.1f}), "
            f"query grouped once {1e3 * t_grouped / nq:.1f} (x{t_naive / t_grouped:.1f})"
        )

        rows = []
        for model, method in [
            ("affine", "magsac"),
            ("affine", "accurate"),
            ("affine", "ransac"),
            ("homography", "magsac"),
            ("affine", "fsm"),
            ("homography", "fsm"),
        ]:

            def run(model=model, method=method, data=data, r=r):
                res = []
                for q_kp, q_words, cands, _ in data:
                    res.append(
                        spatial_rerank(
                            q_kp,
                            q_words,
                            cands,
                            np.arange(r),
                            Verification(model=model, method=method),
                            top_r=r,
                        )
                    )
                return res

            t, results = timed(run)
            recall = np.mean(
                [
                    np.isin(np.flatnonzero(rel), res.verified).mean()
                    for res, (_, _, _, rel) in zip(results, data, strict=True)
                ]
            )
            false_pos = np.mean(
                [
                    (~rel[res.verified]).sum()
                    for res, (_, _, _, rel) in zip(results, data, strict=True)
                ]
            )
            neg_inliers = np.concatenate(
                [res.inliers[~rel] for res, (_, _, _, rel) in zip(results, data, strict=True)]
            )
            rows.append((f"{model}/{method}", 1e3 * t / nq, recall, false_pos, neg_inliers.max()))
        base = rows[0][1]
        print(
            f"{'spatial_rerank':20s} {'ms/query':>9s} {'ratio':>6s} {'recall':>7s} {'false+':>7s}"
            f" {'max inliers of a non-match':>27s}"
        )
        for name, ms, recall, fp, neg_max in rows:
            print(f"{name:20s} {ms:9.1f} {ms / base:6.2f} {recall:7.3f} {fp:7.2f} {neg_max:27d}")


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
