"""A compact bag-of-words index at 100K or 1M images, measured by simulation.

    python bench/simulated_index.py --cache CACHE [--words-dir DIR] --sizes 20000,100000
        [--seed 0] [--chunk 2048] [--json sim.json]

Reads the visual words of a benchmark's database and queries from a run's cache (``DIR`` holds
``database.npz`` and ``queries.npz``; default: the most recent words folder of the synthetic test
set under ``CACHE``), measures their bag statistics (:class:`oxbench.index.simulate.BagStatistics`),
and for each size builds the compact index (``inverted_file=compressed``: idf pass, compressed
lists written by chunks) over the database followed by that many simulated distractors. Reports
per size: the build's CPU seconds, its peak of numpy/Python allocations (``tracemalloc``) and the
process's peak RSS, the lists' disk and the query time of the real queries (CPU per query:
weighting, scoring every image from the mapped lists, the full ranking). No accuracy: the
simulated bags have no content (module docstring of :mod:`oxbench.index.simulate`).
A size past 1 .. 10,000,000 is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np


def words_folder(cache: Path) -> Path:
    """The most recently written words folder of the synthetic test set under ``cache``."""
    found = [
        p.parent
        for p in cache.glob("synthetic-*/words/*-k1/queries.npz")
        if not p.parts[-4].startswith("synthetic-train")
    ]
    if not found:
        raise SystemExit(f"simulated_index.py: no words of the synthetic test set under {cache}")
    return max(found, key=lambda p: (p / "queries.npz").stat().st_mtime)


def bags(path: Path) -> list[np.ndarray]:
    from oxbench.pipelines.steps import Words

    w = Words.load(path)
    return [np.asarray(w.words[w.offsets[i] : w.offsets[i + 1], 0]) for i in range(len(w.names))]


def n_words_of(folder: Path) -> int:
    """The vocabulary size, from the vocabulary the words folder is named after."""
    from oxbench.index.vocabulary import Vocabulary

    stem = folder.name.removesuffix("-k1")
    return int(Vocabulary.load(folder.parents[2] / "vocabularies" / f"{stem}.npz").n_words)


def one_size(db, queries, stats, n: int, folder: Path, seed: int, chunk: int) -> dict[str, Any]:  # noqa: ANN001
    from oxbench.index.inverted import bow_matrix
    from oxbench.index.postings import CompressedPostings
    from oxbench.index.simulate import build_simulated_compact

    tracemalloc.start()
    built, ivf = build_simulated_compact(db, stats, n, folder, seed=seed, chunk=chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    lists = CompressedPostings.open(folder)
    t0 = time.process_time()
    for q in queries:
        vec = ivf.transform(bow_matrix([q], stats.n_words))  # type: ignore[attr-defined]
        lists.search(vec)
    query_cpu = (time.process_time() - t0) / len(queries)
    return {
        "n_index": built.n_index,
        "simulated": n,
        "postings": built.postings,
        "build_cpu_s": built.build_cpu_s,
        "build_peak_traced_bytes": peak,
        "process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "disk_bytes": built.disk_bytes,
        "ram_fixed_bytes": lists.offsets_bytes + 4 * stats.n_words,
        "query_cpu_s": query_cpu,
    }


def main(argv: list[str] | None = None) -> int:
    from oxbench.errors import InputError
    from oxbench.index.simulate import BagStatistics, check_simulated_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--words-dir", type=Path, default=None)
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        sizes = [check_simulated_size(int(s)) for s in args.sizes.split(",") if s.strip()]
    except (ValueError, InputError) as exc:
        print(f"simulated_index.py: --sizes {args.sizes}: {exc}", file=sys.stderr)
        return 2
    folder = args.words_dir or words_folder(args.cache)
    db, queries = bags(folder / "database.npz"), bags(folder / "queries.npz")
    stats = BagStatistics.from_bags(db, n_words_of(folder))
    print(
        f"measured on {len(db):,} images ({folder}): {stats.bag_sizes.mean():.0f} features an "
        f"image, {stats.n_words:,} words, {int((stats.word_probabilities > 0).sum()):,} seen"
    )
    points = []
    for n in sizes:
        out = args.cache / f"simulated-{n}"
        try:
            p = one_size(db, queries, stats, n, out, args.seed, args.chunk)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        points.append(p)
        print(
            f"| {p['n_index']:,} | {p['postings']:,} | {p['build_cpu_s']:.0f} | "
            f"{p['build_peak_traced_bytes'] / 2**20:.0f} MiB | "
            f"{p['process_peak_rss_bytes'] / 2**20:.0f} MiB | {p['disk_bytes'] / 2**30:.2f} GiB | "
            f"{1e3 * p['query_cpu_s']:.1f} ms |",
            flush=True,
        )
        if args.json is not None:
            args.json.write_text(json.dumps({"points": points}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from interrupt import run_script

    run_script(main)
