"""The compressed, memory-mapped inverted file against the in-RAM scipy one, on the same index.

Data: ``--images`` database images of ``--features`` visual words each, drawn from a Zipf-like law
over ``--words`` words (frequent words are long lists, as in real photos), weighted and normalised
by :class:`oxbench.index.inverted.InvertedFile`; queries are fresh bags of the same law. Measured in
the same run, as ratios against the in-RAM file:

- bytes per database image: the in-RAM file's two CSR copies (image vectors and posting lists)
  against the compressed file's one copy on disk (ids as delta + variable-byte, float32 or float16
  weights);
- CPU seconds per query (process time of this process): the scipy product ``q @ postings`` against
  decoding and accumulating the query's lists from the memory-mapped files (the page cache warm);
- that the float32 scores are identical.

Usage: ``python bench/bench_postings.py [--images 20000] [--features 1000] [--words 65536] [--queries 20]``
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from oxbench.index.inverted import InvertedFile, bow_matrix
from oxbench.index.postings import CompressedPostings


def bags(rng: np.random.Generator, n: int, features: int, words: int) -> list[np.ndarray]:
    p = 1.0 / np.arange(1, words + 1) ** 0.8
    p /= p.sum()
    perm = rng.permutation(words)
    return [perm[rng.choice(words, features, p=p)] for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=1000)
    ap.add_argument("--words", type=int, default=65_536)
    ap.add_argument("--queries", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    ivf = InvertedFile(args.words).fit(
        bow_matrix(bags(rng, args.images, args.features, args.words), args.words)
    )
    q = ivf.transform(bow_matrix(bags(rng, args.queries, args.features, args.words), args.words))
    assert ivf.db_vectors_ is not None and ivf.postings_ is not None
    ram = sum(
        m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in (ivf.db_vectors_, ivf.postings_)
    )
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for dtype in ("float32", "float16"):
            cp = CompressedPostings.write(ivf.postings_, Path(tmp) / dtype, weights=dtype)  # type: ignore[arg-type]
            cp.scores_of_vectors(q[:1])  # map the pages once
            c0 = time.process_time()
            got = cp.scores_of_vectors(q)
            t_cp = (time.process_time() - c0) / args.queries
            c0 = time.process_time()
            want = ivf.scores_of_vectors(q)
            t_ram = (time.process_time() - c0) / args.queries
            same = (
                "identical"
                if np.array_equal(got, want)
                else f"max diff {np.abs(got - want).max():.2e}"
            )
            rows.append(
                (dtype, cp.nbytes / args.images, ram / args.images, t_cp * 1e3, t_ram * 1e3, same)
            )
    print(
        f"{args.images} images x {args.features} words of {args.words}; {ivf.postings_.nnz:,} postings; "
        f"{args.queries} queries"
    )
    print(
        "| weights | compressed B/image | in-RAM B/image | ratio | compressed ms/query | in-RAM ms/query | ratio | scores |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for dtype, b_cp, b_ram, t_cp, t_ram, same in rows:
        print(
            f"| {dtype} | {b_cp:,.0f} | {b_ram:,.0f} | {b_cp / b_ram:.2f} | {t_cp:.1f} | {t_ram:.1f} | "
            f"{t_cp / t_ram:.2f} | {same} |"
        )


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
