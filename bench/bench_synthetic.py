"""Synthetic benchmark: generation speed, trivial baselines, sample grid.

    python bench/bench_synthetic.py speed [--n 120] [--size 640x480] [--workers 2]
    python bench/bench_synthetic.py baselines [--root DIR]      # default sets under DIR
    python bench/bench_synthetic.py matchcheck [--root DIR]     # SIFT inliers per label
    python bench/bench_synthetic.py samples [--root DIR] [--out docs/synthetic_samples.jpg]

``speed`` renders the same images serially and with a process pool and, as a floor, times merely
JPEG-encoding a same-size image; it prints images/s and the ratios. ``baselines`` scores random
ranking and a tiny global colour-thumbnail descriptor with the official revisited protocol (E/M/H)
and prints the label counts and positive rates: random must score near the positive rate, and the
thumbnail must find Hard clearly harder than Easy.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def _size(text: str) -> tuple[int, int]:
    w, h = text.lower().split("x")
    return int(w), int(h)


def speed(n: int, size: tuple[int, int], workers: int) -> None:
    from oxbench.datasets.synthetic import SynthConfig, SyntheticDistractors, generate
    from oxbench.datasets.synthetic.plan import encode_jpeg, query_specs, render_db_image
    from oxbench.datasets.synthetic.scene import facade_level

    cfg = SynthConfig(db_size=n, image_size=size)
    n_images = n + cfg.landmarks * cfg.queries_per_landmark
    with tempfile.TemporaryDirectory() as tmp:
        facade_level.cache_clear()
        query_specs.cache_clear()
        t0 = time.perf_counter()
        generate(Path(tmp) / "serial", cfg, workers=1, progress=False)
        serial = n_images / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        generate(Path(tmp) / "pool", cfg, workers=workers, progress=False)
        pool_s = time.perf_counter() - t0
        pooled = n_images / pool_s
    # steady state: rendering only, facade textures already cached in this process
    t0 = time.perf_counter()
    for i in range(min(n, 100)):
        render_db_image(cfg, i)
    warm = min(n, 100) / (time.perf_counter() - t0)

    rng = np.random.default_rng(0)
    img = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    img = np.asarray(np.cumsum(img, axis=1) // np.arange(1, size[0] + 1)[None, :, None], np.uint8)
    t0 = time.perf_counter()
    for _ in range(100):
        encode_jpeg(img, 85)
    encode_only = 100 / (time.perf_counter() - t0)

    stream = SyntheticDistractors(cfg, 200)
    t0 = time.perf_counter()
    for j in range(len(stream)):
        stream.read(j)
    distr = len(stream) / (time.perf_counter() - t0)
    print(f"image size {size[0]}x{size[1]}, {n} database images + {n_images - n} queries")
    print(f"generate(), 1 process (cold):         {serial:7.1f} images/s")
    print(
        f"generate(), {workers} workers (cold):         {pooled:7.1f} images/s   ratio pool/serial {pooled / serial:.2f}   ({pool_s:.1f} s)"
    )
    print(f"render only, warm facade cache:       {warm:7.1f} images/s")
    print(
        f"JPEG encode only (floor):             {encode_only:7.1f} images/s   render costs {encode_only / warm:.1f}x an encode"
    )
    print(
        f"distractor stream, sequential read:   {distr:7.1f} images/s   ratio to warm render {distr / warm:.2f}"
    )


def _thumb(img: np.ndarray, side: tuple[int, int] = (8, 6)) -> np.ndarray:
    import cv2

    t = cv2.resize(img, side, interpolation=cv2.INTER_AREA).astype(np.float32).ravel()
    t -= t.mean()
    return t / (np.linalg.norm(t) + 1e-6)


def baselines(root: Path, repeats: int) -> dict[str, object]:
    from oxbench.datasets.synthetic import ensure_default, label_counts, load_synthetic
    from oxbench.evaluation import evaluate, evaluate_features

    test_dir, _ = ensure_default(root)
    bench = load_synthetic(test_dir)
    gt = bench.gt
    counts = label_counts(gt)
    print(f"{gt.dataset}: {gt.n_db} database images, {gt.n_queries} queries")
    for field in ("easy", "hard", "junk"):
        c = counts[field]
        print(
            f"  {field:5s} per query: min {c['min']}, mean {c['mean']}, max {c['max']} (total {c['total']})"
        )
    # expected AP of a random ranking ~ positives / (images left after removing the ignored ones)
    rates = {}
    for setup, pos, ign in (
        ("easy", ("easy",), ("hard", "junk")),
        ("medium", ("easy", "hard"), ("junk",)),
        ("hard", ("hard",), ("easy", "junk")),
    ):
        r = [
            sum(getattr(q, f).size for f in pos) / (gt.n_db - sum(getattr(q, f).size for f in ign))
            for q in gt.queries
            if sum(getattr(q, f).size for f in pos)
        ]
        rates[setup] = float(np.mean(r))
    print("positive rate (E/M/H): " + ", ".join(f"{100 * v:.2f}" for v in rates.values()))

    rng = np.random.default_rng(0)
    maps = []
    for _ in range(repeats):
        ranks = np.stack([rng.permutation(gt.n_db) for _ in range(gt.n_queries)]).astype(np.int64)
        res = evaluate(gt, ranks)
        maps.append([res.setups[s].map for s in ("easy", "medium", "hard")])
    rnd = np.mean(maps, axis=0)
    print(
        f"random ranking (mean of {repeats}): mAP E: {100 * rnd[0]:.2f}, M: {100 * rnd[1]:.2f}, H: {100 * rnd[2]:.2f}"
    )

    t0 = time.perf_counter()
    q = np.stack([_thumb(bench.query_crop(i)) for i in range(gt.n_queries)])
    db = np.stack([_thumb(bench.database.read(i)) for i in range(gt.n_db)])
    res = evaluate_features(gt, q, db)
    print(f"thumbnail 8x6 RGB ({time.perf_counter() - t0:.0f} s):")
    for line in res.lines():
        print("  " + line)
    th = [res.setups[s].map for s in ("easy", "medium", "hard")]
    return {"counts": counts, "positive_rate": rates, "random": rnd.tolist(), "thumbnail": th}


def matchcheck(root: Path, n_queries: int, per_label: int) -> None:
    """Median SIFT + RANSAC inliers between query crops and images of each label.

    Shows that the landmarks are matchable with local features (Easy > Hard > Unclear) and that
    negatives are confusable (shared window designs give some inliers) but separable.
    """
    import cv2

    from oxbench.datasets.synthetic import ensure_default, load_synthetic

    test_dir, _ = ensure_default(root)
    bench = load_synthetic(test_dir)
    gt = bench.gt
    sift = cv2.SIFT_create(nfeatures=2000)
    matcher = cv2.BFMatcher()
    rng = np.random.default_rng(0)

    def features(img: np.ndarray) -> tuple:
        return sift.detectAndCompute(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), None)

    out: dict[str, list[int]] = {"easy": [], "hard": [], "junk": [], "negative": []}
    for qi in rng.choice(gt.n_queries, min(n_queries, gt.n_queries), replace=False).tolist():
        q = gt.queries[qi]
        kq, dq = features(bench.query_crop(qi))
        neg = np.setdiff1d(np.arange(gt.n_db), np.concatenate([q.easy, q.hard, q.junk]))
        for label, pool in (
            ("easy", q.easy),
            ("hard", q.hard),
            ("junk", q.junk),
            ("negative", neg),
        ):
            for i in rng.choice(pool, min(per_label, len(pool)), replace=False).tolist():
                kd, dd = features(bench.database.read(i))
                inliers = 0
                if dq is not None and dd is not None and len(kd) >= 2:
                    good = [
                        a for a, b in matcher.knnMatch(dq, dd, k=2) if a.distance < 0.8 * b.distance
                    ]
                    if len(good) >= 8:
                        src = np.float32([kq[a.queryIdx].pt for a in good])
                        dst = np.float32([kd[a.trainIdx].pt for a in good])
                        _, mask = cv2.findHomography(src, dst, cv2.RANSAC, 6.0)
                        inliers = int(mask.sum()) if mask is not None else 0
                out[label].append(inliers)
    print(
        f"SIFT (2000 features) + ratio test 0.8 + RANSAC homography, {n_queries} queries x {per_label} images per label"
    )
    print(f"{'label':<9} {'median':>7} {'p10':>5} {'p90':>5}  inliers")
    for label, vals in out.items():
        v = np.asarray(vals)
        print(
            f"{label:<9} {np.median(v):7.0f} {np.percentile(v, 10):5.0f} {np.percentile(v, 90):5.0f}"
        )


def samples(root: Path, out: Path) -> None:
    import cv2
    from PIL import Image

    from oxbench.datasets.synthetic import ensure_default, load_synthetic, read_manifest

    test_dir, _ = ensure_default(root)
    bench = load_synthetic(test_dir)
    manifest = read_manifest(test_dir)
    assert manifest is not None
    gt = bench.gt
    q0 = 5  # bank_1
    query = gt.queries[q0]
    tile = (256, 192)
    tiles = []
    img = bench.queries.read(q0).copy()
    x1, y1, x2, y2 = (int(round(v)) for v in query.bbox)
    cv2.rectangle(img, (x1, y1), (x2, y2), (255, 40, 40), 3)
    tiles.append(("query " + query.name.split("_q_")[1], img))
    by = {"easy": query.easy, "hard": query.hard, "junk": query.junk}
    recs = {r["name"]: r for r in manifest["images"]}
    for field, k in (("easy", 3), ("hard", 4), ("junk", 2)):
        for i in by[field][:k].tolist():
            why = recs[gt.db_names[i]]["labels"][query.name]["why"]
            tiles.append(
                (f"{field}: " + (", ".join(why[:2]) if why else "ok"), bench.database.read(i))
            )
    negs = [i for i, n in enumerate(gt.db_names) if recs[n]["building"] != "bank"]
    for i in negs[:6]:
        tiles.append((f"negative: {recs[gt.db_names[i]]['building']}", bench.database.read(i)))
    tiles = tiles[:16]
    cells = []
    for caption, im in tiles:
        im = cv2.resize(im, tile, interpolation=cv2.INTER_AREA)
        cv2.rectangle(im, (0, 0), (tile[0], 18), (0, 0, 0), -1)
        cv2.putText(
            im,
            caption[:34],
            (4, 13),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.42,
            (255, 255, 255),
            1,
            cv2.LINE_AA,
        )
        cells.append(im)
    while len(cells) % 4:
        cells.append(np.full((tile[1], tile[0], 3), 255, np.uint8))
    grid = np.vstack([np.hstack(cells[i : i + 4]) for i in range(0, len(cells), 4)])
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).save(out, quality=80)
    print(f"wrote {out} ({out.stat().st_size // 1024} KB)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("speed")
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--size", type=_size, default=(640, 480))
    p.add_argument("--workers", type=int, default=2)
    p = sub.add_parser("baselines")
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "oxbench-synth-bench")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", type=Path)
    p = sub.add_parser("matchcheck")
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "oxbench-synth-bench")
    p.add_argument("--queries", type=int, default=12)
    p.add_argument("--per-label", type=int, default=5)
    p = sub.add_parser("samples")
    p.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "oxbench-synth-bench")
    p.add_argument("--out", type=Path, default=Path("docs/synthetic_samples.jpg"))
    args = ap.parse_args()
    if args.cmd == "speed":
        speed(args.n, args.size, args.workers)
    elif args.cmd == "baselines":
        result = baselines(args.root, args.repeats)
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
    elif args.cmd == "matchcheck":
        matchcheck(args.root, args.queries, args.per_label)
    else:
        samples(args.root, args.out)


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
