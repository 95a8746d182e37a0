"""Speed of the classic pipeline's stages, each against a baseline measured in the same run.

1. Local features per second per core at 1024 px: RootSIFT against plain SIFT (the RootSIFT
   overhead) and against 512 px (the default of the synthetic run). Images: the real ROxford/RParis
   subset images when ``$OXBENCH_SHARED_DATA`` names the real data folder (1024 x 768), else synthetic-default images
   upscaled to 1024 px.
2. Inverted-file query time at 10K and 100K database images (random bags of words with a Zipf word
   distribution, ~800 features per image, 16,384 words): the sparse inverted file (posting lists of
   the query's words only) against brute force over every database vector (forward index: CSR
   ``[n_db, K] @ q``) and, at 10K, a dense float32 ``[n_db, K] @ q`` matrix product.
3. Spatial verification time per query for R = 100 and 500 on the synthetic default (its cached
   features and words; run ``oxbench run`` first, or this builds them), against the BoW search
   time of the same query.

CPU time per process (``time.process_time``) with one BLAS/OpenCV thread, so the numbers are per
core and robust to other jobs on the machine. Usage::

    python bench/bench_pipeline.py [--root DATA_ROOT] [--images 12] [--queries 10] [--skip features,ivf,sv]
    python bench/bench_pipeline.py --ablation 4096 16384     # mAP table: BoW -> +SV -> +QE
    python bench/bench_pipeline.py --cost --cache CACHE      # cost per query, today's vs chosen default
    python bench/bench_pipeline.py --scaling --cache CACHE   # word assignment / verification, 1..N workers
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# The real data folder (never part of the repository), named as for the tests.
_SHARED = os.environ.get("OXBENCH_SHARED_DATA")
SUBSET = Path(_SHARED) / "revisited_pixel_retrieval_subset" if _SHARED else None
CACHE: Path | None = None


def cpu(fn, repeat: int = 1):  # noqa: ANN001, ANN201
    """Best CPU seconds of ``repeat`` calls, and the last result."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def bench_features(n_images: int, root: Path | None) -> None:
    import cv2

    from oxbench.datasets.base import read_image
    from oxbench.features.sift import SiftConfig, extract_features

    cv2.setNumThreads(1)
    if SUBSET is not None and SUBSET.is_dir():
        paths = sorted((SUBSET / "db_images").glob("*.jpg"))[:n_images]
        images = [read_image(p) for p in paths]
        what = f"{len(images)} real ROxford/RParis images (1024 px)"
    else:
        from oxbench.datasets.synthetic import ensure_default, load_synthetic

        test_dir, _ = ensure_default(root)
        bench = load_synthetic(test_dir)
        images = [
            cv2.resize(bench.database.read(i), (1024, 768), interpolation=cv2.INTER_CUBIC)
            for i in range(n_images)
        ]
        what = f"{len(images)} synthetic images upscaled to 1024 px"
    print(f"\n== local features, one core, {what}")
    extract_features(images[0], SiftConfig())  # warm-up (OpenCV initialisation)
    rows = []
    for label, cfg in (
        ("SIFT 1024 px (baseline)", SiftConfig(descriptor="sift", max_side=1024, n_features=0)),
        ("RootSIFT 1024 px", SiftConfig(descriptor="rootsift", max_side=1024, n_features=0)),
        (
            "RootSIFT 512 px, <=1000",
            SiftConfig(descriptor="rootsift", max_side=512, n_features=1000),
        ),
    ):
        t, feats = cpu(lambda cfg=cfg: [extract_features(im, cfg) for im in images], repeat=2)
        n = sum(len(f) for f in feats)
        rows.append((label, len(images) / t, n / len(images), n / t))
    # the RootSIFT step alone, on the raw histograms of the same images
    from oxbench.features.sift import extract_raw_sift, rootsift

    raws = [extract_raw_sift(im, SiftConfig(max_side=1024, n_features=0))[1] for im in images]
    t_root, _ = cpu(lambda: [rootsift(r) for r in raws], repeat=3)
    base = rows[0][1]
    print(
        f"  RootSIFT transform alone: {1e3 * t_root / len(images):.2f} ms/image = "
        f"{100 * (t_root / len(images)) * base:.2f}% of a SIFT 1024 px extraction"
    )
    for label, ips, fpi, fps in rows:
        print(
            f"  {label:26s} {ips:6.2f} images/s/core  {fps:8.0f} features/s/core  {fpi:6.0f} features/image"
            f"  x{ips / base:5.2f} images/s vs SIFT 1024"
        )


def zipf_bows(rng: np.random.Generator, n: int, n_words: int, per_image: int):  # noqa: ANN201
    from oxbench.index.inverted import bow_matrix

    p = 1.0 / np.arange(1, n_words + 1) ** 0.8
    p /= p.sum()
    perm = rng.permutation(n_words)
    words = [perm[rng.choice(n_words, size=per_image, p=p)] for _ in range(n)]
    return bow_matrix(words, n_words)


def bench_inverted_file(n_queries: int) -> None:
    import scipy.sparse as sp

    from oxbench.index.inverted import InvertedFile

    rng = np.random.default_rng(0)
    n_words, per_image = 16384, 800
    print(
        f"\n== inverted file, {n_words} words, {per_image} features/image, {n_queries} queries, one core"
    )
    q_tf = zipf_bows(rng, n_queries, n_words, per_image)
    for n_db in (10_000, 100_000):
        parts = [
            zipf_bows(rng, min(10_000, n_db - s), n_words, per_image)
            for s in range(0, n_db, 10_000)
        ]
        db_tf = sp.vstack(parts).tocsr()
        t_fit, ivf = cpu(lambda db_tf=db_tf: InvertedFile(n_words).fit(db_tf))
        q_vecs = ivf.transform(q_tf)
        t_ivf, s_ivf = cpu(lambda ivf=ivf, q=q_vecs: ivf.scores_of_vectors(q), repeat=3)
        fwd = ivf.db_vectors_
        q_dense = q_vecs.toarray().astype(np.float32)
        t_fwd, s_fwd = cpu(lambda fwd=fwd, q=q_dense: np.asarray(fwd @ q.T).T, repeat=3)
        assert np.allclose(s_ivf, s_fwd, atol=1e-5)
        line = (
            f"  n_db {n_db:>7,}: build {t_fit:5.2f} s; per query: inverted file {1e3 * t_ivf / n_queries:7.2f} ms, "
            f"forward-index brute force {1e3 * t_fwd / n_queries:7.2f} ms (x{t_fwd / t_ivf:4.1f})"
        )
        if n_db <= 10_000:
            dense = fwd.toarray()
            t_dense, s_dense = cpu(lambda dense=dense, q=q_dense: q @ dense.T, repeat=3)
            assert np.allclose(s_ivf, s_dense, atol=1e-4)
            line += f", dense matmul {1e3 * t_dense / n_queries:7.2f} ms (x{t_dense / t_ivf:4.1f})"
            del dense
        else:
            line += ", dense matmul skipped (would need 6.5 GB)"
        print(line)


def bench_spatial(root: Path | None, n_queries: int) -> None:
    from oxbench.datasets.synthetic import ensure_default, load_synthetic
    from oxbench.pipelines import RunContext, resolve_method

    test_dir, train_dir = ensure_default(root)
    bench, train = load_synthetic(test_dir), load_synthetic(train_dir)
    cache = test_dir.parent / "_cache"
    print(
        f"\n== spatial verification per query, synthetic default ({bench.gt.n_queries} queries), one core"
    )
    base = None
    for r in (100, 500):
        m = resolve_method("rootsift-bow-sv", **{"spatial.top_r": r})
        ctx = RunContext(cache, progress=False)
        method = m.build().fit(train, ctx).index(bench, ctx)
        timings = ctx.timings
        t, out = cpu(lambda method=method, ctx=ctx: method.search(bench, ctx))
        n_queries = bench.gt.n_queries
        per_query_sv = timings["spatial"] / n_queries
        per_query_bow = timings["search"] / n_queries
        base = base or per_query_sv
        print(
            f"  R = {r:3d}: {1e3 * per_query_sv:7.1f} ms/query spatial (x{per_query_sv / base:4.2f} vs R=100), "
            f"BoW search {1e3 * per_query_bow:6.2f} ms/query, "
            f"verified {np.mean(out.info['verified_per_query']):.1f} images/query"
        )


def ablation(root: Path | None, sizes: list[int]) -> None:
    """BoW -> + spatial re-ranking -> + query expansion at several vocabulary sizes (mAP, mP@10)."""
    from oxbench.datasets.synthetic import ensure_default, load_synthetic
    from oxbench.evaluation import evaluate
    from oxbench.execution import ProcessExecutor
    from oxbench.pipelines import RunContext, resolve_method

    test_dir, train_dir = ensure_default(root)
    bench, train = load_synthetic(test_dir), load_synthetic(train_dir)
    cache = test_dir.parent / "_cache"
    print("\n== ablation on the synthetic default (vocabulary trained on synthetic-train)")
    print(
        f"{'method':22s} {'words':>6s} {'structure':9s}   {'E':>6s} {'M':>6s} {'H':>6s}   "
        f"{'E@10':>6s} {'M@10':>6s} {'H@10':>6s}"
    )
    for k in sizes:
        for name in ("rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"):
            m = resolve_method(name, **{"vocabulary.size": k})
            ctx = RunContext(
                cache, executor=ProcessExecutor(len(os.sched_getaffinity(0))), progress=False
            )
            out = m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
            res = evaluate(bench.gt, out.ranks).setups
            maps = " ".join(f"{100 * res[s].map:6.2f}" for s in ("easy", "medium", "hard"))
            p10 = " ".join(f"{100 * res[s].mp_at_k[10]:6.2f}" for s in ("easy", "medium", "hard"))
            print(f"{name:22s} {k:6d} {m.resolved_vocab_structure:9s}   {maps}   {p10}", flush=True)


def full_matrix_matches(q: np.ndarray, d: np.ndarray, ratio: float = 0.8) -> np.ndarray:
    """The baseline of ``descriptor_matches``: the whole ``[n_q, n_d]`` distance matrix, top two of
    each row by argpartition and each column's nearest by argmin (the library's first version)."""
    d2 = q @ d.T
    d2 *= -2.0
    d2 += np.einsum("ij,ij->i", d, d)[None, :]
    d2 += np.einsum("ij,ij->i", q, q)[:, None]
    two = np.argpartition(d2, 1, axis=1)[:, :2]
    a = np.take_along_axis(d2, two, axis=1)
    nearest = np.where(a[:, 1] < a[:, 0], two[:, 1], two[:, 0])
    passed = np.maximum(a.min(axis=1), 0.0) < (ratio * ratio) * np.maximum(a.max(axis=1), 0.0)
    back = d2.argmin(axis=0)
    qi = np.flatnonzero(passed & (back[nearest] == np.arange(q.shape[0])))
    return np.stack((qi, nearest[qi]), axis=1).astype(np.int64)


def cost_per_query(n_queries: int, n_pairs: int) -> None:
    """Cost per query of today's default against the chosen one, at 10K and 100K database images.

    Search: the inverted file over random Zipf bags (today: 16,384 words, 800 features per image;
    chosen: 65,536 words, 3,500 features per image, what RootSIFT at 1024 px gives on real photos).
    Re-ranking: spatial verification of the short list (today: R = 200, shared words, affine
    MAGSAC; chosen: R = 100, mutual-NN + ratio descriptor matches, fast spatial matching) timed
    per pair on the real subset's cached features (``--cache``; RootSIFT 1024 px, <= 4,000) and
    scaled to R. Verification does not depend on the database size; one core.
    """
    import scipy.sparse as sp

    from oxbench.features.store import FeatureStore
    from oxbench.index.inverted import InvertedFile
    from oxbench.refinement.spatial import (
        Verification,
        descriptor_matches,
        tentative_matches,
        verify_pair,
    )

    rng = np.random.default_rng(0)
    print(f"\n== cost per query ({n_queries} queries), one core")
    setups = {"today": (16384, 800, 200), "chosen": (65536, 3500, 100)}
    search = {}
    for label, (n_words, per_image, _) in setups.items():
        q_tf = zipf_bows(rng, n_queries, n_words, per_image)
        for n_db in (10_000, 100_000):
            parts = [
                zipf_bows(rng, min(2_000, n_db - s), n_words, per_image)
                for s in range(0, n_db, 2_000)
            ]
            ivf = InvertedFile(n_words).fit(sp.vstack(parts).tocsr())
            q_vecs = ivf.transform(q_tf)
            t, _ = cpu(lambda ivf=ivf, q=q_vecs: ivf.scores_of_vectors(q), repeat=2)
            search[label, n_db] = t / n_queries
            del ivf, parts
    stores = (
        sorted(p.parent for p in CACHE.glob("*-pixel-subset-*/features/*/database/meta.json"))
        if CACHE
        else []
    )
    stores = [
        d
        for d in stores
        if json.loads((d / "meta.json").read_text())["config"]["n_features"] == 4000
    ]
    if not stores:
        print("  (no cached real-subset features under --cache: run bench/real_subset.py first)")
        return
    meta = json.loads((stores[0] / "meta.json").read_text())
    from oxbench.features.sift import SiftConfig

    cfg = {k: v for k, v in meta["config"].items() if k not in ("kind", "dim")}
    store = FeatureStore.open(
        stores[0],
        SiftConfig(**cfg),
        extra={k: v for k, v in meta.items() if k not in ("format", "config", "digest")},
        create=False,
    )
    names = store.names
    feats = [store.get(n) for n in names[: 2 * n_pairs]]
    words = [rng.integers(0, 65536, len(f)) for f in feats]
    pairs = [
        (feats[2 * i], feats[2 * i + 1], words[2 * i], words[2 * i + 1]) for i in range(n_pairs)
    ]

    def today() -> None:
        for qf, df, qw, dw in pairs:
            m = tentative_matches(qw % 16384, dw % 16384, max_per_word=8)
            verify_pair(
                qf.keypoints,
                df.keypoints,
                m,
                Verification(model="affine", method="magsac", min_inliers=8),
                q_size=qf.image_size,
                d_size=df.image_size,
            )

    def chosen(match=descriptor_matches) -> None:  # noqa: ANN001
        for qf, df, _, _ in pairs:
            m = match(qf.descriptors, df.descriptors)
            verify_pair(
                qf.keypoints,
                df.keypoints,
                m,
                Verification(model="similarity", method="fsm", min_inliers=4),
                q_size=qf.image_size,
                d_size=df.image_size,
            )

    same = all(
        np.array_equal(
            descriptor_matches(q.descriptors, d.descriptors),
            full_matrix_matches(q.descriptors, d.descriptors),
        )
        for q, d, _, _ in pairs
    )
    print(f"  blocked matching == full-matrix matching on every pair: {same}")
    per_pair = {
        "today": cpu(today)[0] / n_pairs,
        "chosen, full matrix": cpu(lambda: chosen(full_matrix_matches))[0] / n_pairs,
        "chosen": cpu(chosen)[0] / n_pairs,
    }
    print(f"  features per image in the pairs: {np.mean([len(f) for f in feats]):.0f}")
    print(
        f"  {'':19s} {'words':>6s} {'feat/img':>8s} {'R':>4s} {'SV ms/pair':>10s} {'SV s/query':>10s} "
        f"{'search 10K':>10s} {'search 100K':>11s} {'total 10K':>9s} {'total 100K':>10s}"
    )
    for label, pair_s in per_pair.items():
        setup = label.split(",")[
            0
        ]  # "chosen, full matrix" is the chosen setup with the baseline matching
        n_words, per_image, r = setups[setup]
        sv = pair_s * r
        s10, s100 = search[setup, 10_000], search[setup, 100_000]
        print(
            f"  {label:19s} {n_words:6d} {per_image:8d} {r:4d} {1e3 * pair_s:10.2f} {sv:10.2f} "
            f"{1e3 * s10:8.1f}ms {1e3 * s100:9.1f}ms {sv + s10:8.2f}s {sv + s100:9.2f}s"
        )


def worker_scaling(workers: list[int]) -> None:
    """Wall time of word assignment and spatial verification with 1..N worker processes.

    ``rootsift-bow-sv`` on the ROxford subset city (the real subset's images), vocabulary trained
    on the RParis subset: features and vocabulary come from ``--cache`` (copied into a fresh
    cache per worker count), words and verification are computed afresh each time. Wall time (the
    point is parallelism), so run it on an otherwise idle machine.
    """
    import shutil
    import tempfile

    from oxbench.execution import ProcessExecutor
    from oxbench.pipelines import RunContext
    from oxbench.pipelines.presets import resolve_method
    from pixel_subset import load_subset_city  # bench/, beside this script

    if SUBSET is None or CACHE is None or not (CACHE / "vocabularies").is_dir():
        print("  (needs $OXBENCH_SHARED_DATA and a --cache that bench/real_subset.py filled)")
        return
    ox, pa = load_subset_city(SUBSET, "roxford5k"), load_subset_city(SUBSET, "rparis6k")
    method = resolve_method("rootsift-bow-sv")
    print(
        f"\n== worker scaling: rootsift-bow-sv, {ox.bench.gt.n_queries} queries, "
        f"{ox.bench.gt.n_db} images; wall seconds (os.cpu_count() = {os.cpu_count()})"
    )
    base: dict[str, float] = {}
    for n in workers:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(CACHE / "vocabularies", Path(tmp) / "vocabularies")
            for d in CACHE.glob("*-pixel-subset-*"):
                if (d / "features").is_dir():
                    shutil.copytree(d / "features", Path(tmp) / d.name / "features")
            ctx = RunContext(Path(tmp), executor=ProcessExecutor(n), progress=False)
            method.build().fit(pa.bench, ctx).index(ox.bench, ctx).search(ox.bench, ctx)
        t = {k: ctx.timings.get(k, 0.0) for k in ("assign", "spatial")}
        base = base or t
        print(
            f"  {n:2d} workers: "
            + ", ".join(f"{k} {v:6.1f} s ({base[k] / v:.2f}x)" for k, v in t.items())
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--root",
        type=Path,
        default=None,
        help="data root holding (or receiving) the synthetic default",
    )
    ap.add_argument("--images", type=int, default=12)
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--skip", default="", help="comma-separated: features, ivf, sv")
    ap.add_argument(
        "--cost",
        action="store_true",
        help="cost per query, today's default vs the chosen one, instead",
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path("runs") / "cache-real-subset",
        help="--cost: the cache of bench/real_subset.py (real features)",
    )
    ap.add_argument(
        "--scaling",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="worker scaling of word assignment and verification (default: 1 and every core)",
    )
    ap.add_argument(
        "--ablation",
        type=int,
        nargs="*",
        default=None,
        metavar="WORDS",
        help="run the BoW/+SV/+QE ablation at these vocabulary sizes instead (default 4096 16384)",
    )
    args = ap.parse_args()
    if args.ablation is not None:
        from oxbench.datasets.paths import data_root

        ablation(data_root(args.root), args.ablation or [4096, 16384])
        return
    global CACHE
    CACHE = args.cache
    if args.cost:
        cost_per_query(args.queries, 20)
        return
    if args.scaling is not None:
        worker_scaling(args.scaling or sorted({1, os.cpu_count() or 1}))
        return
    skip = set(filter(None, args.skip.split(",")))
    if "features" not in skip:
        bench_features(args.images, args.root)
    if "ivf" not in skip:
        bench_inverted_file(args.queries)
    if "sv" not in skip:
        from oxbench.datasets.paths import data_root

        bench_spatial(data_root(args.root), args.queries)


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
