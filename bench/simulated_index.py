"""Large indexes measured by simulation: compact BoW, HE, ASMK and IVF-PQ at 100K or 1M images.

    python bench/simulated_index.py --cache CACHE [--words-dir DIR] --sizes 20000,100000
        [--methods bow,asmk,he,he-memory,ivfpq] [--seed 0] [--chunk 2048] [--json sim.json]

Reads the visual words of a benchmark's database and queries from a run's cache (``DIR`` holds
``database.npz`` and ``queries.npz``; default: the most recent words folder of the synthetic test
set under ``CACHE``), measures their bag statistics (:class:`oxbench.index.simulate.BagStatistics`),
and for each size builds the compact index (``inverted_file=mapped``: idf pass, compressed
lists written by chunks) over the database followed by that many simulated distractors. Reports
per size: the build's CPU seconds, its peak of numpy/Python allocations (``tracemalloc``) and the
process's peak RSS, the lists' disk and the query time of the real queries (CPU per query:
weighting, scoring every image from the mapped lists, the full ranking), first on the pages the
build left (``query_cpu_s``), then one at a time (``single_query_cpu_s``: scoring and full
ranking, each apart too); with the compiled kernel, every query again with numpy's after them
(``single_query_cpu_numpy_s``, ``OXBENCH_NO_ACCEL=1``; scores checked equal to the bit, ranks
equal). No accuracy: the simulated bags have no content (module docstring of
:mod:`oxbench.index.simulate`).
A size past 1 .. 10,000,000 is one line and exit 2.

Other methods (``--methods``); each method and size runs in its own process, so each peak RSS
is its own:

- ``asmk``: the real database's ASMK entries (its features aggregated per word with the
  vocabulary's centroids and binarised, as the family does) followed by simulated images' entries
  (the distinct words of a drawn bag, each with a real code of that word resampled), built into
  the memory-mapped :class:`~oxbench.index.asmk_file.AsmkInvertedFile`; the real queries' entries
  (``k5`` words: the preset's multiple assignment) score every image, all together first
  (``query_cpu_s``: the batch's CPU per query, each word's list read once), then one at a time
  (``single_query_*``), the scores checked equal, then together again (``query_cpu_warm_s``);
  with the compiled kernel, one at a time again with numpy's (``single_query_cpu_numpy_s``,
  ``OXBENCH_NO_ACCEL=1``; the scores checked equal to the bit).
- ``he``: Hamming-embedding postings -- the real database's words with their keypoints'
  orientations and scales, then a drawn bag's features per simulated image (64 uniform bits,
  a uniform orientation, a measured log-scale) -- in the memory-mapped
  :class:`~oxbench.index.he_file.HammingInvertedFile`; ``he-memory``: the same postings in the
  in-RAM :class:`~oxbench.index.hamming.HammingIndex`. The real queries' words with uniform
  signatures and orientations score every image (``ht`` 24, sigma 16: the presets'), each query
  first on the pages the build left (``query_cpu_first_s``), then again (``query_cpu_s``) and
  with weak geometric consistency (``query_cpu_wgc_s``); with the mapped
  file and the compiled kernel, without it again with numpy's (``query_cpu_numpy_s``, the scores
  checked equal to the bit).
- ``ivfpq``: the set's cached global descriptors (randomly projected to ``--ivfpq-dim``
  dimensions) resampled plus noise, in a FAISS IVF-PQ with oxbench's default settings (nlist
  1024, m 16, 8 bits, nprobe 16) trained on at most 65,536 of them and filled chunk by chunk;
  the real queries' vectors, top 100.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
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


def rss_anon_bytes() -> int:
    """The process's anonymous resident memory now (what it holds, not the file pages it maps)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def one_size(db, queries, stats, n: int, folder: Path, seed: int, chunk: int) -> dict[str, Any]:  # noqa: ANN001
    from oxbench.evaluation.kernels import accelerated
    from oxbench.evaluation.ranking import ranks_from_scores
    from oxbench.index import postings
    from oxbench.index.inverted import bow_matrix
    from oxbench.index.postings import CompressedPostings
    from oxbench.index.simulate import build_simulated_compact

    tracemalloc.start()
    built, ivf = build_simulated_compact(db, stats, n, folder, seed=seed, chunk=chunk)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    lists = CompressedPostings.open(folder)
    vectors = [ivf.transform(bow_matrix([q], stats.n_words)) for q in queries]  # type: ignore[attr-defined]
    t0 = time.process_time()  # first, on the pages the build left
    for q in queries:
        vec = ivf.transform(bow_matrix([q], stats.n_words))  # type: ignore[attr-defined]
        lists.search(vec)
    query_cpu = (time.process_time() - t0) / len(queries)

    def one(vec):  # noqa: ANN001, ANN202
        """(scores, ranks, scoring CPU s, ranking CPU s) of one query."""
        t0 = time.process_time()
        scores = lists.scores_of_vectors(vec)
        t1 = time.process_time()
        ranks = ranks_from_scores(scores.T)
        return scores, ranks, t1 - t0, time.process_time() - t1

    compiled = postings._bow_scatter is not None and accelerated()
    times: dict[str, list[float]] = {"score": [], "rank": [], "score_numpy": [], "rank_numpy": []}
    kept = []
    for vec in vectors:  # one query at a time (the compiled kernel's when built)
        scores, ranks, ts, tr = one(vec)
        times["score"].append(ts)
        times["rank"].append(tr)
        kept.append((scores, ranks))
    if compiled:  # then numpy's, after every compiled query (its temporaries evict the caches)
        os.environ["OXBENCH_NO_ACCEL"] = "1"
        try:
            for vec, (scores, ranks) in zip(vectors, kept, strict=True):
                again, ranks_again, ts, tr = one(vec)
                assert np.array_equal(scores.view(np.uint32), again.view(np.uint32))  # to the bit
                assert np.array_equal(ranks, ranks_again)
                times["score_numpy"].append(ts)
                times["rank_numpy"].append(tr)
        finally:
            del os.environ["OXBENCH_NO_ACCEL"]
    offsets = lists._offsets[:, 1]
    visited = sum(int((offsets[v.indices + 1] - offsets[v.indices]).sum()) for v in vectors)
    per_query = np.add(times["score"], times["rank"])
    numpy_per_query = np.add(times["score_numpy"], times["rank_numpy"])
    return {
        "n_index": built.n_index,
        "simulated": n,
        "postings": built.postings,
        "build_cpu_s": built.build_cpu_s,
        "build_peak_traced_bytes": peak,
        "process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "disk_bytes": built.disk_bytes,
        "ram_fixed_bytes": lists.offsets_bytes + 4 * stats.n_words,
        "steady_ram_bytes": lists.offsets_bytes + 4 * stats.n_words,
        "rss_anon_bytes": rss_anon_bytes(),
        "postings_visited_per_query": visited / len(vectors),
        "query_cpu_s": query_cpu,
        "single_query_cpu_s": float(per_query.mean()),
        "single_query_cpu_max_s": float(per_query.max()),
        "single_query_scoring_cpu_s": float(np.mean(times["score"])),
        "single_query_ranking_cpu_s": float(np.mean(times["rank"])),
        "compiled_kernel": compiled,
        "single_query_cpu_numpy_s": float(numpy_per_query.mean()) if compiled else None,
        "single_query_scoring_cpu_numpy_s": float(np.mean(times["score_numpy"]))
        if compiled
        else None,
    }


def _store(folder: Path, config: Any = None):  # noqa: ANN202
    """The feature store in ``folder`` (its extractor from its ``meta.json`` unless given)."""
    from oxbench.features.extractors import local_extractor_from_dict
    from oxbench.features.store import FeatureStore

    meta = json.loads((folder / "meta.json").read_text())
    extra = {k: v for k, v in meta.items() if k not in ("format", "config", "digest")}
    config = config or local_extractor_from_dict(meta["config"])
    return FeatureStore.open(folder, config, extra=extra, create=False)


def database_store(folder: Path):  # noqa: ANN201
    """The cached database feature store the words of ``folder`` were assigned from."""
    from oxbench.pipelines.steps import Words

    db = Words.load(folder / "database.npz")
    for meta_path in sorted(folder.parents[1].glob("features/*/database/meta.json")):
        store = _store(meta_path.parent)
        if all(
            n in store and store.count(n) == c for n, c in zip(db.names, db.counts, strict=True)
        ):
            return store
    raise SystemExit(f"simulated_index.py: no feature store of the words in {folder}")


def asmk_entries(folder: Path, part: str, k: int):  # noqa: ANN201
    """``(AsmkEntries of the part's images, n_words)``: each image's features aggregated per word
    (its ``k`` nearest words, from the ``-k{k}`` words folder) and binarised, as the family does."""
    from oxbench.index.asmk_file import AsmkEntries, binarize_residuals
    from oxbench.index.vocabulary import Vocabulary
    from oxbench.pipelines.families.asmk import aggregate_residuals
    from oxbench.pipelines.steps import Words

    stem = folder.name.removesuffix("-k1")
    vocab = Vocabulary.load(folder.parents[2] / "vocabularies" / f"{stem}.npz")
    words_dir = folder.parent / f"{stem}-k{k}"
    if not (words_dir / f"{part}.npz").exists():
        raise SystemExit(f"simulated_index.py: no {part} words with k={k} in {words_dir}")
    w = Words.load(words_dir / f"{part}.npz")
    db_store = database_store(folder)
    store = (
        db_store
        if part == "database"
        else _store(db_store.directory.parent / part, db_store.config)
    )
    centroids = vocab.centroids_
    assert centroids is not None
    owners, words, codes = [], [], []
    for i, name in enumerate(w.names):
        desc = store.config.finish(store.get_raw(name).descriptors)
        res, uw = aggregate_residuals(desc, w.of(name)[0][:, :k], centroids)
        owners.append(np.full(len(uw), i, np.int64))
        words.append(uw)
        codes.append(binarize_residuals(res))
    entries = AsmkEntries(
        len(w.names), np.concatenate(owners), np.concatenate(words), np.concatenate(codes)
    )
    return entries, int(vocab.n_words)


def one_asmk(folder: Path, stats, n: int, out: Path, seed: int, chunk: int) -> dict[str, Any]:  # noqa: ANN001
    from oxbench.evaluation.kernels import accelerated
    from oxbench.index import word_lists
    from oxbench.index.asmk_file import AsmkInvertedFile
    from oxbench.index.simulate import SignaturePool, simulated_asmk_entries

    db, n_words = asmk_entries(folder, "database", 1)
    queries, _ = asmk_entries(folder, "queries", 5)
    pool = SignaturePool.from_entries(db.words, db.codes, n_words)

    def chunks():  # noqa: ANN202
        yield db
        yield from simulated_asmk_entries(stats, pool, n, seed=seed, chunk=chunk)

    t0 = time.process_time()
    ivf = AsmkInvertedFile.build(chunks(), n_words, 64 * db.codes.shape[1], out)
    build = time.process_time() - t0
    build_peak = peak_rss_bytes()
    del ivf
    ivf = AsmkInvertedFile.open(out)
    batch = [
        (queries.codes[queries.owners == i], queries.words[queries.owners == i])
        for i in range(queries.n_images)
    ]
    t0, w0 = time.process_time(), time.perf_counter()  # first, on the pages the build left
    together = ivf.scores_of_queries(batch)
    batch_cpu, batch_wall = time.process_time() - t0, time.perf_counter() - w0
    per_query, walls = [], []
    for i, (c, w) in enumerate(batch):
        t0, w0 = time.process_time(), time.perf_counter()
        alone = ivf.scores(c, w)
        per_query.append(time.process_time() - t0)
        walls.append(time.perf_counter() - w0)
        assert np.array_equal(alone, together[i])
    t0 = time.process_time()  # again, on the pages the passes above left
    ivf.scores_of_queries(batch)
    warm_cpu = time.process_time() - t0
    numpy_per_query = []  # one at a time with the numpy kernel, when the compiled one was used
    if word_lists._asmk_scatter is not None and accelerated():
        os.environ["OXBENCH_NO_ACCEL"] = "1"
        try:
            for i, (c, w) in enumerate(batch):
                t0 = time.process_time()
                alone = ivf.scores(c, w)
                numpy_per_query.append(time.process_time() - t0)
                assert np.array_equal(alone, together[i])  # the same scores, to the bit
        finally:
            del os.environ["OXBENCH_NO_ACCEL"]
    visited = sum(int((ivf._offsets[w + 1] - ivf._offsets[w]).sum()) for _, w in batch)
    return {
        "method": "asmk",
        "n_index": ivf.n_images,
        "simulated": n,
        "postings": ivf.n_postings,
        "real_entries_per_image": len(db.owners) / db.n_images,
        "query_entries_per_image": len(queries.owners) / queries.n_images,
        "build_cpu_s": build,
        "build_peak_rss_bytes": build_peak,
        "process_peak_rss_bytes": peak_rss_bytes(),
        "steady_ram_bytes": ivf.ram_bytes,
        "rss_anon_bytes": rss_anon_bytes(),
        "disk_bytes": ivf.disk_bytes,
        "postings_visited_per_query": visited / len(batch),
        "query_cpu_s": batch_cpu / len(batch),
        "query_wall_s": batch_wall / len(batch),
        "query_cpu_warm_s": warm_cpu / len(batch),
        "single_query_cpu_s": float(np.mean(per_query)),
        "single_query_cpu_max_s": float(np.max(per_query)),
        "single_query_wall_s": float(np.mean(walls)),
        "compiled_kernel": bool(numpy_per_query),
        "single_query_cpu_numpy_s": float(np.mean(numpy_per_query)) if numpy_per_query else None,
    }


def he_entries(folder: Path, db_bags, seed: int):  # noqa: ANN001, ANN201
    """``(HeEntries of the database's real words, its keypoints' log2 scales)``: the words of
    ``folder`` with their real orientations and scales, and uniform signatures (a simulated
    signature is uniform too: :func:`oxbench.index.simulate.simulated_he_entries`)."""
    from oxbench.index.he_file import HeEntries
    from oxbench.pipelines.steps import Words

    store = database_store(folder)
    names = Words.load(folder / "database.npz").names
    kps = [store.get_raw(name).keypoints for name in names]
    assert [len(k) for k in kps] == [len(b) for b in db_bags]
    kp = np.concatenate(kps) if kps else np.zeros((0, 4), np.float32)
    log_scales = np.log2(np.maximum(kp[:, 2].astype(np.float64), 1e-6)).astype(np.float32)
    rng = np.random.default_rng([seed, 1 << 30])
    words = np.concatenate(db_bags).astype(np.int64)
    entries = HeEntries(
        len(db_bags),
        np.repeat(np.arange(len(db_bags)), [len(b) for b in db_bags]).astype(np.int64),
        words,
        rng.integers(0, 2**64 - 1, len(words), dtype=np.uint64, endpoint=True),
        kp[:, 3].astype(np.float32),
        log_scales,
    )
    return entries, log_scales


def one_he(  # noqa: PLR0913
    folder: Path,
    db_bags,
    queries,
    stats,
    n: int,
    out: Path,
    seed: int,
    chunk: int,
    mapped: bool,  # noqa: ANN001
) -> dict[str, Any]:
    """HE at ``n`` simulated images: the mapped file (``he``) or the in-RAM index (``he-memory``);
    the real queries' words with uniform signatures and orientations, measured scales, scored
    without and with weak geometric consistency (ht 24, sigma 16: the presets')."""
    from oxbench.evaluation.kernels import accelerated
    from oxbench.index import word_lists
    from oxbench.index.he_file import HammingInvertedFile, in_ram_index
    from oxbench.index.simulate import simulated_he_entries

    db, log_scales = he_entries(folder, db_bags, seed)

    def chunks():  # noqa: ANN202
        yield db
        yield from simulated_he_entries(stats, n, log_scales=log_scales, seed=seed, chunk=chunk)

    t0 = time.process_time()
    if mapped:
        index: Any = HammingInvertedFile.build(chunks(), stats.n_words, out)
        build = time.process_time() - t0
        build_peak = peak_rss_bytes()
        del index
        index = HammingInvertedFile.open(out)
        held, disk = index.ram_bytes, index.disk_bytes
    else:
        index = in_ram_index(chunks(), stats.n_words)
        build = time.process_time() - t0
        build_peak = peak_rss_bytes()
        held = sum(
            a.nbytes for a in (index.images_, index.signatures_, index.angles_, index.log_scales_)
        )
        held += index.norms_.nbytes + index.idf_.nbytes + index.offsets_.nbytes
        disk = 0
    rng = np.random.default_rng([seed, 1 << 31])
    batch = [
        (
            q,
            rng.integers(0, 2**64 - 1, len(q), dtype=np.uint64, endpoint=True),
            (rng.random(len(q)) * 360).astype(np.float32),
            log_scales[rng.integers(0, len(log_scales), len(q))],
        )
        for q in queries
    ]
    times: dict[str, list[float]] = {"first": [], "plain": [], "wgc": [], "numpy": []}
    matches = []
    for q in batch:  # the first pass over a query's lists pays for paging them in: timed apart
        t0 = time.process_time()
        plain = index.scores(*q, ht=24, sigma=16.0)
        times["first"].append(time.process_time() - t0)
        t0 = time.process_time()
        again = index.scores(*q, ht=24, sigma=16.0)
        times["plain"].append(time.process_time() - t0)
        assert np.array_equal(plain, again)
        t0 = time.process_time()
        index.scores(*q, ht=24, sigma=16.0, wgc=True)
        times["wgc"].append(time.process_time() - t0)
        if mapped and word_lists._asmk_scatter is not None and accelerated():
            os.environ["OXBENCH_NO_ACCEL"] = "1"
            try:
                t0 = time.process_time()
                again = index.scores(*q, ht=24, sigma=16.0)
                times["numpy"].append(time.process_time() - t0)
            finally:
                del os.environ["OXBENCH_NO_ACCEL"]
            assert np.array_equal(plain, again)  # the same scores, to the bit
        matches.append(int((plain > 0).sum()))
    visited = sum(int((index.offsets_[q + 1] - index.offsets_[q]).sum()) for q in queries)
    return {
        "method": "he" if mapped else "he-memory",
        "n_index": index.n_images,
        "simulated": n,
        "postings": int(index.offsets_[-1]),
        "build_cpu_s": build,
        "build_peak_rss_bytes": build_peak,
        "process_peak_rss_bytes": peak_rss_bytes(),
        "steady_ram_bytes": held,
        "rss_anon_bytes": rss_anon_bytes(),
        "disk_bytes": disk,
        "postings_visited_per_query": visited / len(queries),
        "images_matched_per_query": float(np.mean(matches)),
        "query_cpu_first_s": float(np.mean(times["first"])),
        "query_cpu_first_max_s": float(np.max(times["first"])),
        "query_cpu_s": float(np.mean(times["plain"])),
        "query_cpu_max_s": float(np.max(times["plain"])),
        "query_cpu_wgc_s": float(np.mean(times["wgc"])),
        "query_cpu_wgc_max_s": float(np.max(times["wgc"])),
        "compiled_kernel": bool(times["numpy"]),
        "query_cpu_numpy_s": float(np.mean(times["numpy"])) if times["numpy"] else None,
    }


def global_vectors(folder: Path, part: str) -> np.ndarray:
    """The cached global descriptors of a part of the words' test set (the first store found)."""
    found = sorted(folder.parents[1].glob(f"global/*/{part}/shard-*/shard.npz"))
    if not found:
        raise SystemExit(f"simulated_index.py: no cached global descriptors in {folder.parents[1]}")
    store = found[0].parent.parent
    return np.concatenate(
        [np.load(p)["descriptors"] for p in sorted(store.glob("shard-*/shard.npz"))]
    ).astype(np.float32)


def one_ivfpq(folder: Path, n: int, dim: int, seed: int) -> dict[str, Any]:
    from oxbench.index.faiss_setup import load_faiss
    from oxbench.index.search import IvfPqSearch
    from oxbench.index.simulate import simulated_vectors

    faiss = load_faiss(1)
    db, q = global_vectors(folder, "database"), global_vectors(folder, "queries")
    proj = np.random.default_rng(seed).standard_normal((db.shape[1], dim)).astype(np.float32)
    db, q = db @ proj, q @ proj
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    st = IvfPqSearch(nlist=1024)
    t0 = time.process_time()
    index = faiss.IndexIVFPQ(
        faiss.IndexFlatIP(dim), dim, st.nlist, st.m, st.nbits, faiss.METRIC_INNER_PRODUCT
    )
    index.cp.seed = st.seed
    index.pq.cp.seed = st.seed
    index.train(next(simulated_vectors(db, min(n, 65536), seed=seed + 1, chunk=65536)))
    index.nprobe = st.nprobe
    index.add(db)
    for v in simulated_vectors(db, n, seed=seed + 2):
        index.add(v)
    build = time.process_time() - t0
    t0 = time.process_time()
    for i in range(len(q)):
        index.search(q[i : i + 1], 100)
    query = (time.process_time() - t0) / len(q)
    return {
        "method": "ivfpq",
        "n_index": int(index.ntotal),
        "simulated": n,
        "dim": dim,
        "build_cpu_s": build,
        "process_peak_rss_bytes": peak_rss_bytes(),
        "steady_ram_bytes": int(index.ntotal) * (int(index.code_size) + 8),
        "rss_anon_bytes": rss_anon_bytes(),
        "disk_bytes": 0,
        "query_cpu_s": query,
    }


def run_one(args: argparse.Namespace, method: str, n: int) -> dict[str, Any]:
    """One method at one size, in this process."""
    from oxbench.index.simulate import BagStatistics

    folder = args.words_dir or words_folder(args.cache)
    db, queries = bags(folder / "database.npz"), bags(folder / "queries.npz")
    stats = BagStatistics.from_bags(db, n_words_of(folder))
    out = args.cache / f"simulated-{method}-{n}"
    try:
        if method == "bow":
            return {"method": "bow", **one_size(db, queries, stats, n, out, args.seed, args.chunk)}
        if method == "asmk":
            return one_asmk(folder, stats, n, out, args.seed, args.chunk)
        if method in ("he", "he-memory"):
            return one_he(folder, db, queries, stats, n, out, args.seed, args.chunk, method == "he")
        return one_ivfpq(folder, n, args.ivfpq_dim, args.seed)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def in_child(argv: list[str], method: str, n: int) -> dict[str, Any]:
    """``--one method:n`` in a fresh process (its own peak RSS); its last line is the JSON."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *argv, "--one", f"{method}:{n}"],
        check=False,
        stdout=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
    )
    if done.returncode:
        return {"method": method, "simulated": n, "failed": done.returncode}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def one_at_a_time(p: dict[str, Any]) -> str:
    """`` 1 query: compiled ms / numpy ms (ratio) |`` where both were measured, else ``""``."""
    fast, slow = p.get("single_query_cpu_s"), p.get("single_query_cpu_numpy_s")
    if fast is None or slow is None:
        return ""
    return (
        f" 1 query: {1e3 * fast:.1f} ms compiled / {1e3 * slow:.1f} ms numpy ({slow / fast:.1f}x) |"
    )


def main(argv: list[str] | None = None) -> int:
    from oxbench.errors import InputError
    from oxbench.index.simulate import BagStatistics, check_simulated_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", type=Path, required=True)
    ap.add_argument("--words-dir", type=Path, default=None)
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument(
        "--methods",
        default="bow",
        help="bow, asmk, he (mapped), he-memory, ivfpq (comma-separated)",
    )
    ap.add_argument("--ivfpq-dim", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        sizes = [check_simulated_size(int(s)) for s in args.sizes.split(",") if s.strip()]
    except (ValueError, InputError) as exc:
        print(f"simulated_index.py: --sizes {args.sizes}: {exc}", file=sys.stderr)
        return 2
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(methods) - {"bow", "asmk", "he", "he-memory", "ivfpq"})
    if unknown or not methods:
        print(f"simulated_index.py: --methods {args.methods}: not {unknown}", file=sys.stderr)
        return 2
    if args.one:
        method, n = args.one.split(":")
        print(json.dumps(run_one(args, method, int(n))))
        return 0
    folder = args.words_dir or words_folder(args.cache)
    db = bags(folder / "database.npz")
    stats = BagStatistics.from_bags(db, n_words_of(folder))
    print(
        f"measured on {len(db):,} images ({folder}): {stats.bag_sizes.mean():.0f} features an "
        f"image, {stats.n_words:,} words, {int((stats.word_probabilities > 0).sum()):,} seen"
    )
    points = []
    for method in methods:
        for n in sizes:
            p = in_child(sys.argv[1:] if argv is None else argv, method, n)
            points.append(p)
            if "failed" in p:
                print(f"| {method} | +{n:,} | failed (exit {p['failed']}) |", flush=True)
            else:
                print(
                    f"| {method} | {p['n_index']:,} | {p['build_cpu_s']:.0f} | "
                    f"{p['process_peak_rss_bytes'] / 2**20:,.0f} MiB | "
                    f"{p['steady_ram_bytes'] / 2**20:,.0f} MiB | "
                    f"{p['disk_bytes'] / 2**30:.2f} GiB | {1e3 * p['query_cpu_s']:.1f} ms |"
                    + one_at_a_time(p),
                    flush=True,
                )
            if args.json is not None:
                args.json.write_text(json.dumps({"points": points}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from interrupt import run_script

    run_script(main)
