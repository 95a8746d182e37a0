"""Search and diffusion speed: exact blocked top-k vs FAISS IVF-PQ, and diffusion at 100K.

Data: unit descriptors (``--dim``, 128 by default) drawn around ``n / 50`` random centres (noise 0.5
per dimension before normalising), so every query has a real neighbourhood; queries are fresh draws.

Measured in the same run, each against its baseline (ratios printed):

- **exact search** (:func:`oxbench.index.search.exact_search`, numpy, blocked top-100) against the
  plain way: the full score matrix of a chunk of queries and ``np.argsort`` of every row;
- **IVF-PQ** (:class:`oxbench.index.search.FaissIndex`, ``nlist`` 1024, ``m`` 16 x 8 bits, ``nprobe``
  16 and 64) against exact search: ms/query, recall@100 (share of the exact top 100 found in the
  IVF-PQ top 100), 1-recall@100 (exact nearest neighbour inside the top 100), bytes per database
  image, training time;
- **diffusion** at 100K (``--diffusion-n``): the offline k-NN graph (k 50, FAISS flat) once, then the
  online truncated solve per query (R = 1000, 20 CG iterations) against the same solve on the whole
  100K graph (no truncation) and against the exact search that gives the initial ranking.

Usage: ``python bench/bench_search.py [--sizes 100000 1000000] [--queries 200] [--dim 128]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from oxbench.index.search import FaissIndex, IvfPqSearch, exact_search, recall_at


def data(n: int, n_q: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(n // 50, 1), dim)).astype(np.float32)
    x = np.empty((n, dim), np.float32)
    for s in range(0, n, 100_000):
        m = min(100_000, n - s)
        x[s : s + m] = centres[rng.integers(0, len(centres), m)] + 0.5 * rng.normal(
            size=(m, dim)
        ).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = centres[rng.integers(0, len(centres), n_q)] + 0.5 * rng.normal(size=(n_q, dim)).astype(
        np.float32
    )
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    return x, q.astype(np.float32)


def naive_topk(q: np.ndarray, x: np.ndarray, k: int, chunk: int = 20) -> np.ndarray:
    out = []
    for s in range(0, len(q), chunk):
        scores = q[s : s + chunk] @ x.T
        out.append(np.argsort(-scores, axis=1, kind="stable")[:, :k])
    return np.vstack(out)


def timed(fn, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN201
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0


def bench_size(n: int, n_q: int, dim: int, nlist: int, m: int, nprobes: list[int]) -> None:
    x, q = data(n, n_q, dim)
    print(f"\n## n = {n:,}, d = {dim}, {n_q} queries, float32 {x.nbytes / 2**20:.0f} MiB")
    (_, truth), t_exact = timed(exact_search, q, x, 100, backend="numpy")
    naive, t_naive = timed(naive_topk, q, x, 100)
    assert (naive == truth).mean() > 0.999
    ms_exact = 1000 * t_exact / n_q
    print(
        f"exact blocked top-100: {ms_exact:.2f} ms/query; naive full argsort {1000 * t_naive / n_q:.2f} "
        f"ms/query -> {t_naive / t_exact:.1f}x; {4 * dim} bytes/image"
    )
    index, t_train = timed(FaissIndex(IvfPqSearch(nlist=nlist, m=m, nprobe=nprobes[0])).fit, x)
    print(
        f"IVF-PQ nlist {nlist}, m {m} x 8 bits: train + add {t_train:.1f} s, {index.bytes_per_vector} bytes/image "
        f"({4 * dim / index.bytes_per_vector:.1f}x smaller)"
    )
    for nprobe in nprobes:
        index.index_.nprobe = nprobe
        index.search(q[:10], 100)  # warm
        (_, found), t = timed(index.search, q, 100)
        one = np.mean([t_[0] in f for f, t_ in zip(found, truth, strict=True)])
        print(
            f"  nprobe {nprobe}: {1000 * t / n_q:.3f} ms/query ({t_exact / t:.1f}x faster than exact), "
            f"recall@100 {recall_at(found, truth, 100):.3f}, 1-recall@100 {one:.3f}"
        )


def bench_diffusion(n: int, n_q: int, dim: int) -> None:
    from oxbench.refinement.diffusion import (
        Diffusion,
        DiffusionSettings,
        diffuse,
        normalize_affinity,
    )

    x, q = data(n, n_q, dim, seed=1)
    print(
        f"\n## diffusion, n = {n:,}, d = {dim}, {n_q} queries (k 50, query_k 10, R 1000, 20 CG iterations)"
    )
    d, t_graph = timed(Diffusion(DiffusionSettings()).fit, x)
    assert d.affinity_ is not None
    print(
        f"offline mutual 50-NN graph (FAISS flat): {t_graph:.1f} s, {d.affinity_.nnz // 2:,} edges"
    )
    (_, ranks), t_search = timed(exact_search, q, x, 1000)
    _, t_diff = timed(d.rerank, q, ranks)
    w = normalize_affinity(d.affinity_)
    t0 = time.perf_counter()
    for qi in range(n_q):
        y = np.zeros(n)
        top = ranks[qi, :10]
        y[top] = np.clip(x[top] @ q[qi], 0, None) ** 3
        diffuse(w, y, alpha=0.99, iterations=20)
    t_full = time.perf_counter() - t0
    print(
        f"online truncated diffusion: {1000 * t_diff / n_q:.2f} ms/query; on the whole graph "
        f"{1000 * t_full / n_q:.2f} ms/query -> truncation {t_full / t_diff:.1f}x faster; initial exact "
        f"search {1000 * t_search / n_q:.2f} ms/query (diffusion costs {t_diff / t_search:.1f}x the search)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--nlist", type=int, default=1024)
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--nprobe", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--diffusion-n", type=int, default=100_000)
    ap.add_argument("--diffusion-queries", type=int, default=50)
    args = ap.parse_args()
    from oxbench.index.faiss_setup import load_faiss
    from oxbench.pipelines.runner import host_facts

    load_faiss()
    print(host_facts())
    for n in args.sizes:
        bench_size(n, args.queries, args.dim, args.nlist, args.m, args.nprobe)
    if args.diffusion_n:
        bench_diffusion(args.diffusion_n, args.diffusion_queries, args.dim)


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
