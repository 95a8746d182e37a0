"""Benchmark: ILIAS mAP@1k over a simulated 5M-image database, 1,232 queries, from a top-k stream.

The simulation (seeded): an ILIAS-shaped ground truth -- 1,000 instances, 1,232 image queries,
4,715 positives with scales and clutters -- and a database of the positives followed by
distractors up to ``--n-db`` images (5,000,000: mini-ILIAS). Every (image, query) pair has a score:
a distractor's is N(0, 1), a positive's N(mu, 1) with mu ~ U(1, 4) per (query, positive), so the
positives spread from the top of the lists deep into the distractors. The database is scored
``--chunk`` images at a time (the only block of scores ever in memory: chunk x queries); each query
keeps its running top k (the candidates of a chunk above its current k-th score, merged by
``argpartition``), and after the last chunk the top-k lists stream into
:class:`oxbench.evaluation.protocols.ilias.IliasScorer` one query at a time. No database x queries
matrix exists: at 5M x 1,232 it would be 24.6 GB of float32.

Baseline in the same run, at ``--n-small`` images (100,000): the naive in-RAM scorer -- the whole
``n_small x queries`` matrix in memory, every query scored on its full column
(``Ilias.evaluate_scores``: ``argsort`` of all its scores, as the official code does given a full
list) -- against the streaming path on the same scores (the matrix read chunk by chunk). Their
per-query APs must be equal (checked); the ratio of CPU seconds is printed.

Prints one JSON object (CPU seconds per phase, the mAP, the memory each path holds for scores);
``--out DIR`` also writes it to ``DIR/bench_ilias.json``. Sizes for a quick check: ``--small``.
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.evaluation.protocols.ilias import ILIAS, IliasScorer
from oxbench.execution.executors import cpu_seconds
from oxbench.formats.ilias import IliasGroundTruth
from oxbench.groundtruth import Query


def simulated_truth(
    rng: np.random.Generator, n_instances: int, n_queries: int, n_positives: int
) -> tuple[IliasGroundTruth, np.ndarray]:
    """ILIAS-shaped ground truth (queries of ``n_instances`` objects, positives first in the
    database) and, per query, the instance it shows."""
    per_instance = 1 + rng.multinomial(
        n_positives - n_instances, np.full(n_instances, 1 / n_instances)
    )
    owner = np.repeat(np.arange(n_instances), per_instance)
    query_instance = np.concatenate(
        [np.arange(n_instances), rng.choice(n_instances, n_queries - n_instances)]
    )
    query_instance.sort()
    first = np.concatenate([[0], np.cumsum(per_instance)])
    names = tuple(
        f"inst_{i:04d}/pos/P{j:02d}" for i, j in zip(owner, range(len(owner)), strict=True)
    )
    queries = tuple(
        Query(
            f"inst_{i:04d}/query/Q{n:04d}",
            good=np.arange(first[i], first[i + 1], dtype=np.int64),
        )
        for n, i in enumerate(query_instance)
    )
    gt = IliasGroundTruth(
        "ilias-simulated",
        ILIAS,
        names,
        queries,
        scale=rng.uniform(0.0, 0.5, len(names)),
        clutter=rng.integers(0, 100, len(names)).astype(np.float64),
    )
    return gt.validate(), query_instance


class ScoreSource:
    """The scores of database rows ``[a, b)`` for every query, chunk by chunk (seeded per chunk:
    the same rows always get the same scores)."""

    def __init__(self, gt: IliasGroundTruth, seed: int) -> None:
        self.gt, self.seed = gt, seed
        rng = np.random.default_rng([seed, 1 << 30])
        pairs = [(int(p), q) for q, query in enumerate(gt.queries) for p in query.good]
        self.pos_rows = np.array([p for p, _ in pairs], dtype=np.int64)
        self.pos_queries = np.array([q for _, q in pairs], dtype=np.int64)
        self.pos_mu = rng.uniform(1.0, 4.0, len(pairs)).astype(np.float32)

    def block(self, a: int, b: int, chunk: int) -> np.ndarray:
        """``float32 [b - a, n_queries]`` (``a`` a multiple of ``chunk``, ``b - a <= chunk``)."""
        rng = np.random.default_rng([self.seed, a // chunk])
        s = rng.standard_normal((b - a, self.gt.n_queries), dtype=np.float32)
        hit = (self.pos_rows >= a) & (self.pos_rows < b)
        s[self.pos_rows[hit] - a, self.pos_queries[hit]] += self.pos_mu[hit]
        return s


def stream_top_k(blocks: Any, n_queries: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top ``k`` (scores, database rows) over blocks ``(first row, scores [c, nq])``,
    holding one block at a time."""
    top_s = np.full((n_queries, k), -np.inf, dtype=np.float32)
    top_i = np.full((n_queries, k), -1, dtype=np.int64)
    for a, s in blocks:
        threshold = top_s.min(axis=1)
        rows, cols = np.nonzero(s > threshold[None, :])
        if rows.size == 0:
            continue
        order = np.argsort(cols, kind="stable")
        rows, cols = rows[order], cols[order]
        bounds = np.searchsorted(cols, np.arange(n_queries + 1))
        for q in np.flatnonzero(np.diff(bounds)):
            r = rows[bounds[q] : bounds[q + 1]]
            cand_s = np.concatenate([top_s[q], s[r, q]])
            cand_i = np.concatenate([top_i[q], r + a])
            keep = np.argpartition(-cand_s, k - 1)[:k]
            top_s[q], top_i[q] = cand_s[keep], cand_i[keep]
    return top_s, top_i


def score_stream(gt: IliasGroundTruth, top_s: np.ndarray, top_i: np.ndarray, k: int) -> Any:
    """The top-k lists, one query at a time, into the scorer (distractors: -1)."""
    scorer = IliasScorer(gt, k)
    for q in range(gt.n_queries):
        keep = top_i[q] >= 0
        ids = np.where(top_i[q][keep] < gt.n_db, top_i[q][keep], -1)
        scorer.add(q, ids, top_s[q][keep])
    return scorer.result()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-db", type=int, default=5_000_000)
    ap.add_argument("--n-small", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=1232)
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--positives", type=int, default=4715)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small", action="store_true", help="a quick check (20K images, 60 queries)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.small:
        args.n_db, args.n_small, args.queries, args.instances = 20_000, 6_000, 60, 50
        args.positives, args.k, args.chunk = 200, 100, 2_500
    gt, _ = simulated_truth(
        np.random.default_rng(args.seed), args.instances, args.queries, args.positives
    )
    source = ScoreSource(gt, args.seed)
    nq, k, chunk = gt.n_queries, args.k, args.chunk
    out: dict[str, Any] = {
        "queries": nq,
        "positives": gt.n_db,
        "k": k,
        "chunk": chunk,
        "n_db": args.n_db,
        "n_small": args.n_small,
    }

    # -- the baseline at n_small: the whole matrix in RAM, every query on its full column --------
    c0 = cpu_seconds()
    matrix = np.concatenate(
        [
            source.block(a, min(a + chunk, args.n_small), chunk)
            for a in range(0, args.n_small, chunk)
        ]
    )
    out["small_simulate_cpu_s"] = cpu_seconds() - c0
    c0 = cpu_seconds()
    naive = ILIAS.evaluate_scores(gt, matrix, n_distractors=args.n_small - gt.n_db, k=k)
    out["small_naive_score_cpu_s"] = cpu_seconds() - c0
    c0 = cpu_seconds()
    blocks = ((a, matrix[a : a + chunk]) for a in range(0, args.n_small, chunk))
    top_s, top_i = stream_top_k(blocks, nq, k)
    streamed = score_stream(gt, top_s, top_i, k)
    out["small_stream_cpu_s"] = cpu_seconds() - c0
    out["small_naive_bytes"] = int(matrix.nbytes)
    del matrix
    same = np.array_equal(naive.setups["ilias"].ap, streamed.setups["ilias"].ap)
    out["small_equal"] = bool(same)
    out["small_map"] = naive.summary["map"]
    out["small_stream_vs_naive_cpu"] = out["small_stream_cpu_s"] / max(
        out["small_naive_score_cpu_s"], 1e-9
    )
    if not same:
        raise SystemExit("the streaming and the in-RAM scorer disagree")

    # -- the full size: the stream only ---------------------------------------------------------
    c0 = cpu_seconds()
    blocks = (
        (a, source.block(a, min(a + chunk, args.n_db), chunk)) for a in range(0, args.n_db, chunk)
    )
    top_s, top_i = stream_top_k(blocks, nq, k)
    out["stream_simulate_and_top_k_cpu_s"] = cpu_seconds() - c0
    c0 = cpu_seconds()
    result = score_stream(gt, top_s, top_i, k)
    out["stream_score_cpu_s"] = cpu_seconds() - c0
    out["map"] = result.summary["map"]
    out["oracle"] = result.summary["oracle"]
    out["stream_bytes"] = int(chunk * nq * 4 + top_s.nbytes + top_i.nbytes)
    out["matrix_bytes_avoided"] = int(args.n_db) * nq * 4
    out["max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps(out, indent=1))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_ilias.json").write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
