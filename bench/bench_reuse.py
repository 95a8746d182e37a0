"""A rerun opens the mapped lists it built (issue 42 item 2): build against reopen, in one run.

Two measurements, each a ratio against the build in the same run (CPU seconds of this process):

- the Hamming-embedding lists of ``--images`` random images of ``--features`` features each over
  ``--words`` words (:class:`oxbench.index.he_file.HammingInvertedFile`), built through
  :func:`oxbench.storage.open_or_build` into an empty folder, then asked for again with the same
  binding: opened (its ``meta.json``, binding, array digests and mapped files' records checked),
  not rebuilt; the same files (inodes);
- each mapped-list preset (``rootsift-he`` and ``rootsift-asmk`` with ``inverted_file=mapped``,
  ``rootsift-bow-sv-compact``) on the tiny synthetic set, index step of a first run against a
  second run with a fresh method over the same cache: the second run's step is a hit, its ranks
  the first's.

Usage: ``python bench/bench_reuse.py [--images 20000] [--features 200] [--words 20000]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from oxbench.index.he_file import HammingInvertedFile, HeEntries, lists_folder
from oxbench.storage import open_or_build


def random_entries(
    rng: np.random.Generator, images: int, features: int, words: int, chunk: int = 2048
):  # noqa: ANN201 - a generator of HeEntries
    for a in range(0, images, chunk):
        n = min(chunk, images - a)
        m = n * features
        yield HeEntries(
            n,
            np.repeat(np.arange(n, dtype=np.int64), features),
            rng.integers(0, words, m),
            rng.integers(0, 2**63, m, dtype=np.uint64),
            rng.uniform(-180, 180, m).astype(np.float32),
            rng.normal(0, 1, m).astype(np.float32),
        )


def he_lists(args: argparse.Namespace, tmp: Path) -> None:
    folder = tmp / "he-lists" / "entry"
    binding = {"inputs": "random", "seed": 0}

    def build() -> HammingInvertedFile:
        rng = np.random.default_rng(0)
        chunks = random_entries(rng, args.images, args.features, args.words)
        return HammingInvertedFile.build(chunks, args.words, folder, stands_for=binding)

    def reopen() -> HammingInvertedFile:
        return HammingInvertedFile.open(folder, stands_for=binding)

    times, hits = [], []
    for _ in range(2):
        c0 = time.process_time()
        lists, hit = open_or_build(lists_folder(folder), open_folder=reopen, build=build)
        times.append(time.process_time() - c0)
        hits.append(hit)
        inode = os.stat(folder / "signatures.npy").st_ino
    disk = sum(p.stat().st_size for p in folder.iterdir())
    print(
        f"HE lists, {args.images:,} images x {args.features} features ({lists.n_postings:,} "
        f"postings, {disk / 2**20:,.0f} MiB): build {times[0]:.2f} CPU-s, reopen "
        f"{times[1] * 1e3:.1f} CPU-ms ({times[0] / max(times[1], 1e-9):,.0f}x); "
        f"opened={hits[1]}, same inode={inode == os.stat(folder / 'signatures.npy').st_ino}"
    )


def presets(tmp: Path) -> None:
    from oxbench.datasets import load
    from oxbench.pipelines import RunContext, resolve_method
    from oxbench.testing import make_tiny_root

    root = make_tiny_root(tmp / "data")
    bench, train = load("synthetic", root, progress=False), load("synthetic-train", root)
    tiny = {"features.max_side": 320, "features.n_features": 300}
    rows = []
    for preset, extra, kind in (
        ("rootsift-he", {"inverted_file": "mapped"}, "he-lists"),
        ("rootsift-asmk", {"inverted_file": "mapped"}, "asmk-lists"),
        ("rootsift-bow-sv-compact", {"spatial.top_r": 20}, "postings"),
    ):
        out = []
        for _ in range(2):
            ctx = RunContext(tmp / "cache", progress=False)
            impl = (
                resolve_method(preset, **{"vocabulary.size": 200}, **tiny, **extra)
                .build()
                .fit(train, ctx)
            )
            c0 = time.process_time()
            impl.index(bench, ctx)
            out.append((time.process_time() - c0, ctx.steps[kind], impl.search(bench, ctx).ranks))
        (t1, s1, r1), (t2, s2, r2) = out
        rows.append((preset, t1, s1, t2, s2, bool(np.array_equal(r1, r2))))
    print(
        "| preset | index, first run (CPU-s) | lists | index, rerun (CPU-s) | lists | same ranks |"
    )
    print("|---|---:|---|---:|---|---|")
    for preset, t1, s1, t2, s2, same in rows:
        print(f"| {preset} | {t1:.2f} | {s1} | {t2:.2f} | {s2} | {same} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=200)
    ap.add_argument("--words", type=int, default=20_000)
    ap.add_argument("--no-presets", action="store_true", help="only the HE lists")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        he_lists(args, Path(tmp))
        if not args.no_presets:
            presets(Path(tmp))


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
