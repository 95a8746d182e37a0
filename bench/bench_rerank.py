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

``--stages`` measures the re-ranking stages over global descriptors instead (issue 40): plain
ranking, alpha-QE, diffusion, k-reciprocal, SuperGlobal, EGT, CAS and stages combined, each an ordinary
``oxbench.run`` of the ``features`` preset on the real 128-D Oxford descriptors (the lopq fc7
vectors of ``$OXBENCH_SHARED_DATA``, full-image query rows, the real ROxford ground truth; E / M / H),
and, with ``--synthetic-root DATA``, of ``gem-r18-synthetic`` on the default synthetic set (the data
root where that preset already ran, so its model and descriptors are reused). Each row: mAP, the
CPU seconds of the whole run and their ratio to the plain run, and the stage's own seconds.

Usage: ``python bench/bench_rerank.py [--queries 3] [--r 100 500]``;
``python bench/bench_rerank.py --stages [--synthetic-root DATA]``
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict
from pathlib import Path

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


#: The stage rows: label, ``rerank`` setting (``""``: none) and further settings.
STAGE_ROWS: list[tuple[str, str, dict[str, object]]] = [
    ("plain ranking", "", {}),
    ("alpha-QE (k 5, alpha 3)", "alpha-qe", {}),
    ("diffusion (k 50, R 1000)", "diffusion", {}),
    ("k-reciprocal (20 / 6 / 0.3, joint graph, top 1000)", "k-reciprocal", {}),
    ("k-reciprocal, graph=database", "k-reciprocal", {"k-reciprocal.graph": "database"}),
    ("superglobal (400 / 9 / 0.15)", "superglobal", {}),
    ("egt (250 / 0.42 / 5000)", "egt", {}),
    ("cas (5 / 20 / 25 / 6 / 25, joint graph)", "cas", {}),
    ("alpha-QE + k-reciprocal", "alpha-qe,k-reciprocal", {}),
    ("alpha-QE + diffusion", "alpha-qe,diffusion", {}),
    ("k-reciprocal + egt", "k-reciprocal,egt", {}),
    ("superglobal + k-reciprocal", "superglobal,k-reciprocal", {}),
    ("alpha-QE + cas", "alpha-qe,cas", {}),
]

#: The timings a stage records (its graph, built at index time, included).
STAGE_TIMINGS = (
    "query_expansion",
    "diffusion_graph",
    "diffusion",
    "k_reciprocal_graph",
    "k_reciprocal",
    "superglobal",
    "egt_graph",
    "egt",
    "cas",
)


def _cpu() -> float:
    """CPU seconds of this process and its finished children (a run's workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def stage_table(dataset: str, method: str, root: Path, base: dict[str, object], work: Path) -> None:
    """One ``oxbench.run`` per row of :data:`STAGE_ROWS`; a markdown table on stdout."""
    from oxbench.pipelines import RecordOptions, Session, run

    session = Session(root=root, strict=False, progress=False)  # the root's own cache, reused
    print(f"\n{dataset}, {method}")
    print("| stages | E | M | H | CPU s (run) | ratio to plain | stage wall s |")
    print("|---|---|---|---|---|---|---|")
    plain = None
    for i, (label, rerank, extra) in enumerate(STAGE_ROWS):
        overrides = {**base, **extra, "rerank": rerank or "none"}
        t0 = _cpu()
        outcome = run(
            dataset,
            method,
            session,
            RecordOptions(out=work / f"runs/{dataset}-{i}", overwrite=True),
            overrides=overrides,
        )
        cpu = _cpu() - t0
        plain = cpu if plain is None else plain
        e, m, h = (outcome.result.setups[s].map * 100 for s in ("easy", "medium", "hard"))
        spent = sum(outcome.timings.get(k, 0.0) for k in STAGE_TIMINGS)
        print(
            f"| {label} | {e:.2f} | {m:.2f} | {h:.2f} | {cpu:.1f} | {cpu / plain:.2f} | "
            f"{spent:.2f} |",
            flush=True,
        )


def real_oxford_inputs(shared: Path, work: Path) -> tuple[Path, dict[str, object]]:
    """A data root with the real ROxford ground truth alone, and the lopq descriptor files in
    ROxford's database / query order (full-image query rows)."""
    from oxbench.formats.arrays import read_features
    from oxbench.formats.revisitop import read_gnd

    old = read_gnd(shared / "oxford5k/gnd_oxford5k.pkl")
    x = read_features(shared / "oxford5k/lopq_features/oxford_features.fvecs")
    row = {n: i for i, n in enumerate(sorted(old.db_names))}
    rev = read_gnd(shared / "roxford5k/gnd_roxford5k.pkl")
    np.save(work / "db.npy", x[[row[n] for n in rev.db_names]])
    np.save(work / "q.npy", x[[row[n] for n in rev.query_names]])
    gnd = work / "data" / "roxford5k" / "gnd_roxford5k.pkl"
    gnd.parent.mkdir(parents=True, exist_ok=True)
    if not gnd.exists():
        gnd.symlink_to(shared / "roxford5k/gnd_roxford5k.pkl")
    files = {
        "descriptor.db_features": str(work / "db.npy"),
        "descriptor.query_features": str(work / "q.npy"),
    }
    return work / "data", files


def stages_main(args: argparse.Namespace) -> None:
    import platform
    import tempfile

    shared = os.environ.get("OXBENCH_SHARED_DATA")
    work = Path(args.work or tempfile.mkdtemp(prefix="oxbench-bench-stages-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {platform.processor() or platform.machine()}; one BLAS thread; work {work}")
    if shared and (Path(shared) / "oxford5k/lopq_features/oxford_features.fvecs").exists():
        root, files = real_oxford_inputs(Path(shared), work)
        stage_table("roxford5k", "features", root, files, work)
    else:
        print("no $OXBENCH_SHARED_DATA: the real rows are skipped")
    if args.synthetic_root:
        stage_table("synthetic", "gem-r18-synthetic", Path(args.synthetic_root), {}, work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=3)
    parser.add_argument("--r", type=int, nargs="+", default=[100, 500])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stages", action="store_true", help="the global re-ranking stage table")
    parser.add_argument(
        "--synthetic-root", help="--stages: a data root where gem-r18-synthetic ran"
    )
    parser.add_argument("--work", help="--stages: folder for runs and caches (default: a temp one)")
    args = parser.parse_args()
    if args.stages:
        stages_main(args)
        return

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
