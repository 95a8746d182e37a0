"""The deep global-descriptor table on the synthetic default: random-init GeM vs GeM trained by
``oxbench train`` on the synthetic training city, + whitening, + alpha-QE, + diffusion.

Descriptors are extracted here with the training module's network (ResNet + GeM; images resized to a
longer side of ``--image-size``, query crops as the revisited protocol says), written as ``.npy``,
and evaluated through the ``features`` method family and the ordinary runner, so every line is a
normal run folder. Whitening is learned on the *training* city's descriptors (PCA: its database;
learned: its database + query crops with the query-positive pairs), never on the test set.

Usage: ``python bench/deep_synthetic.py --root DATA [--model MODEL.pt] [--image-size 128]``
(``--model random`` for the random-initialisation floor).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from oxbench.datasets import load
from oxbench.pipelines import run
from oxbench.train.loop import _resize, describe, fit_size
from oxbench.train.model import build_model
from oxbench.train.pairs import matching_pairs


def extract(model, bench, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    db = [bench.database.read(i) for i in range(bench.gt.n_db)]
    qs = [bench.query_crop(i) for i in range(bench.gt.n_queries)]
    db = [_resize(im, fit_size(im.shape, image_size)) for im in db]
    qs = [_resize(im, fit_size(im.shape, image_size)) for im in qs]
    return describe(model, db), describe(model, qs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--model", default="random")
    ap.add_argument("--image-size", type=int, default=128)
    ap.add_argument("--work", default="/tmp/oxbench-deep-synthetic")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    model = build_model("resnet18", init="random" if args.model == "random" else args.model, seed=0)
    work = Path(args.work) / (Path(args.model).stem + f"-{args.image_size}")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    test, train = load("synthetic", args.root), load("synthetic-train", args.root)
    tdb, tq = extract(model, train, args.image_size)
    db, q = extract(model, test, args.image_size)
    t_extract = time.perf_counter() - t0
    np.save(work / "db.npy", db)
    np.save(work / "q.npy", q)
    np.save(work / "train.npy", np.vstack([tdb, tq]))
    np.save(work / "train_db.npy", tdb)
    np.save(work / "pairs.npy", matching_pairs(train.gt))
    files = {"db_features": str(work / "db.npy"), "query_features": str(work / "q.npy")}
    pca = {"whitening": "pca", "train_features": str(work / "train_db.npy")}
    # 1,217 query-positive pairs of 55 queries span ~300 of 512 dimensions: shrink the intra-class covariance
    lw = {"whitening": "learned", "train_features": str(work / "train.npy"), "train_pairs": str(work / "pairs.npy"),
          "whitening_shrinkage": 0.1}
    rows = [
        ("GeM", "features", {}),
        ("GeM + PCA-w", "features", pca),
        ("GeM + Lw", "features", lw),
        ("GeM + Lw + alpha-QE", "features-alpha-qe", lw),
        ("GeM + Lw + diffusion", "features-diffusion", lw),
        ("GeM + Lw + alpha-QE + diffusion", "features-alpha-qe", {**lw, "rerank": "diffusion"}),
        ("GeM + diffusion", "features-diffusion", {}),
    ]
    print(f"model {args.model}, {args.image_size} px, extraction {t_extract:.1f} s ({test.gt.n_db + test.gt.n_queries + train.gt.n_db + train.gt.n_queries} images)")
    print("| method | E | M | H | mP@10 E | mP@10 M | mP@10 H |")
    print("|---|---|---|---|---|---|---|")
    for label, method, extra in rows:
        out = run("synthetic", method, root=args.root, out=work / "runs" / label.replace(" ", "_").replace("+", "p"),
                  cache=work / "cache", overrides={**files, **extra}, progress=False, overwrite=True)
        s = out.result.setups
        cells = [f"{100 * s[k].map:.2f}" for k in ("easy", "medium", "hard")]
        cells += [f"{100 * s[k].mp_at_k[10]:.2f}" for k in ("easy", "medium", "hard")]
        print(f"| {label} | " + " | ".join(cells) + " |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
