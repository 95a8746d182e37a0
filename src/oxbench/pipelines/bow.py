"""The RootSIFT bag-of-words pipeline as resumable steps.

Steps (each takes a config and paths, returns its output path, and skips work already done):

1. :func:`step_features` -- local features of a benchmark's database / query crops / distractors
   into :class:`~oxbench.features.store.FeatureStore` folders
   (``<cache>/<dataset-key>/features/<sift-digest>/<part>/``);
2. :func:`step_vocabulary` -- a vocabulary trained on ANOTHER benchmark's database features
   (``<cache>/vocabularies/<train>-<digest>.npz``);
3. :func:`step_assign` -- visual words (``k`` nearest, with squared distances) of every feature of a
   store (``<cache>/<dataset-key>/words/<vocab>-k<k>/<part>.npz``);
4. :class:`BagOfWords` -- the method interface over these steps: ``fit`` (vocabulary), ``index``
   (features, words, tf-idf inverted file), ``search`` (query, spatial re-ranking of the top R,
   average query expansion over the verified images).

Every cached artifact carries a digest checked when it is reused (:mod:`oxbench.cache`): a corrupt
one is logged as a warning naming the file and computed again, never used. Each cache entry (a
feature store, a vocabulary, a words file) has one writer at a time: a second process running the
same step waits for the first (saying so in the log) and then reuses its result.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, entry_lock, load_npz, lock_path, save_npz
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.features.sift import SiftConfig, finish_descriptors
from oxbench.features.store import (
    DescribeImages,
    DescribeQueries,
    FeatureStore,
    extract_to_store,
    process_pool,
)
from oxbench.fileio import json_digest, progress_bar, remove_stale_temps
from oxbench.groundtruth import GroundTruth
from oxbench.index.inverted import InvertedFile, bow_matrix, soft_assignment_weights
from oxbench.index.vocabulary import Vocabulary, training_sample_size
from oxbench.pipelines.method import RetrievalMethod, RunContext, SearchResult
from oxbench.pipelines.presets import BowMethod

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.rerank.spatial import GeometricModel, RobustMethod

log = logging.getLogger(__name__)

PARTS = ("database", "queries", "distractors")

def gt_digest(gt: GroundTruth) -> str:
    """sha256 of the ground truth's content (names, boxes, labels): identifies a dataset version."""
    h = hashlib.sha256()
    h.update(json.dumps([gt.dataset, gt.protocol, list(gt.db_names)]).encode())
    for q in gt.queries:
        h.update(json.dumps([q.name, q.bbox]).encode())
        for name, arr in sorted(q.labels().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
    return h.hexdigest()


def dataset_key(bench: Benchmark) -> str:
    """Cache folder name of a benchmark: its id plus a digest of its ground truth and options.

    The options carry what else identifies the images (the synthetic sets record the sha256 of
    their images there), so regenerated images never meet features cached from older ones.
    """
    h = hashlib.sha256(gt_digest(bench.gt).encode())
    h.update(json.dumps(dict(bench.options), sort_keys=True, default=str).encode())
    return f"{bench.id}-{h.hexdigest()[:10]}"


def _sources(
    bench: Benchmark, part: str, sift: SiftConfig
) -> tuple[DescribeImages | DescribeQueries, int, dict[str, object]]:
    """The extraction job of one part, its size, and what identifies its store."""
    if part == "database":
        return DescribeImages(bench.database, sift), len(bench.database), {"role": "database"}
    if part == "queries":
        return DescribeQueries(bench, sift), bench.gt.n_queries, {"role": "queries", "crop": bench.crop}
    if part == "distractors":
        if bench.distractors is None:
            raise InputError(f"{bench.id} has no distractors")
        return DescribeImages(bench.distractors, sift), len(bench.distractors), {"role": "distractors"}
    raise InputError(f"unknown part {part!r}; use one of {PARTS}")


def features_dir(cache: Path, bench: Benchmark, sift: SiftConfig, part: str) -> Path:
    """Where the feature store of one part of a benchmark lives."""
    return Path(cache) / dataset_key(bench) / "features" / sift.digest() / part


def open_store(cache: Path, bench: Benchmark, sift: SiftConfig, part: str, *, create: bool = False) -> FeatureStore:
    """Open the feature store of one part (``create=False``: it must exist)."""
    _, _, extra = _sources(bench, part, sift)
    return FeatureStore.open(
        features_dir(cache, bench, sift, part), sift, extra={**extra, "dataset": bench.id}, create=create
    )


def step_features(
    bench: Benchmark,
    sift: SiftConfig,
    cache: Path,
    *,
    parts: Sequence[str] | None = None,
    workers: int = 1,
    progress: bool = True,
    full_check: bool = False,
) -> dict[str, Path]:
    """Describe the database, the query crops (and distractors) of a benchmark; resumable.

    Args:
        bench: the benchmark.
        sift: extraction settings.
        cache: the cache root.
        parts: which parts (default: database, queries, and distractors when present).
        workers: extraction processes.
        progress: tqdm bars.
        full_check: hash the stored features in full before reusing them (not only sampled).

    Returns:
        ``{part: store folder}``.
    """
    if parts is None:
        parts = ["database", "queries"] + (["distractors"] if bench.distractors is not None else [])
    out: dict[str, Path] = {}
    for part in parts:
        job, n, _ = _sources(bench, part, sift)
        store = open_store(cache, bench, sift, part, create=True)
        out[part] = extract_to_store(
            job, n, store, workers=workers, progress=progress, desc=f"{bench.id} {part}",
            full_check=full_check,
        )
    return out


def _part_names(bench: Benchmark, part: str) -> list[str]:
    src = {"database": bench.database, "queries": bench.queries, "distractors": bench.distractors}[part]
    assert src is not None
    return [src.name(i) for i in range(len(src))]


def training_descriptors(
    store: FeatureStore, names: Sequence[str], n_target: int | None, seed: int = 0
) -> NDArray[np.float32]:
    """A seeded sample of about ``n_target`` descriptors spread evenly over ``names``' images (``None``: all)."""
    store.require_all(names)
    rng = np.random.default_rng(seed)
    counts = [store.count(name) for name in names]
    total = int(sum(counts))
    if total == 0:
        raise InputError("the training images have no features", store.directory)
    frac = 1.0 if n_target is None else min(1.0, n_target / total)
    parts = []
    for name, c in zip(names, counts, strict=True):
        if c == 0:
            continue
        _, _, raw, _ = store.get_raw(name)
        take = c if frac >= 1.0 else int(rng.binomial(c, frac))
        if take < c:
            raw = raw[np.sort(rng.choice(c, size=take, replace=False))]
        parts.append(raw)
    return finish_descriptors(np.concatenate(parts), store.config.descriptor)


def vocabulary_path(cache: Path, method: BowMethod, train: Benchmark) -> Path:
    """Where the vocabulary of ``method`` trained on ``train`` is cached."""
    settings = {**method.vocabulary_settings(), "train": dataset_key(train)}
    return Path(cache) / "vocabularies" / f"{train.id}-k{method.vocab_size}-{json_digest(settings, 12)}.npz"


def step_vocabulary(
    method: BowMethod,
    train: Benchmark,
    cache: Path,
    *,
    workers: int = 1,
    progress: bool = True,
    threads: int | None = None,
    full_check: bool = False,
) -> Path:
    """Train (or reuse) the vocabulary of ``method`` on ``train``'s database features.

    Returns:
        The ``.npz`` path. An existing file is checked for its digest (a corrupt one is trained
        again, with a warning), the descriptor type and the dimension.
    """
    path = vocabulary_path(cache, method, train)
    remove_stale_temps(path.parent)
    with entry_lock(lock_path(path), what=f"the vocabulary {path}"):
        if path.exists():
            try:
                Vocabulary.load(path, descriptor=method.features.descriptor, dim=method.features.dim)
                return path
            except CorruptCache as exc:
                log.warning("%s; training it again", exc)
        return _train_vocabulary(method, train, cache, path, workers=workers, progress=progress,
                                 threads=threads, full_check=full_check)  # fmt: skip


def _train_vocabulary(
    method: BowMethod, train: Benchmark, cache: Path, path: Path, *,
    workers: int, progress: bool, threads: int | None, full_check: bool,
) -> Path:  # fmt: skip
    step_features(train, method.features, cache, parts=["database"], workers=workers, progress=progress,
                  full_check=full_check)  # fmt: skip
    store = open_store(cache, train, method.features, "database")
    n_target = training_sample_size(method.vocab_size, method.vocab_max_points_per_centroid)
    x = training_descriptors(store, _part_names(train, "database"), n_target, seed=method.vocab_seed)
    log.info("training %d words on %d descriptors of %s", method.vocab_size, len(x), train.id)
    voc = Vocabulary(
        method.vocab_size,
        structure=method.resolved_vocab_structure,
        n_iter=method.vocab_iter,
        max_points_per_centroid=method.vocab_max_points_per_centroid,
        n_probe=method.vocab_n_probe,
        descriptor=method.features.descriptor,
        seed=method.vocab_seed,
        threads=threads,
    ).fit(x, trained_on=train.id)
    return voc.save(path)


@dataclass(frozen=True)
class Words:
    """Visual words of every feature of one store part, ``k`` nearest per feature.

    Attributes:
        names: image names, in the order of ``offsets``.
        offsets: ``int64 [n_images + 1]``; image ``i``'s features are rows ``offsets[i]:offsets[i+1]``.
        words: ``int32 [n_features, k]`` nearest words, nearest first.
        sq_dists: ``float32 [n_features, k]`` squared distances to them.
        vocabulary: the content digest of the vocabulary file they were assigned with.
    """

    names: tuple[str, ...]
    offsets: NDArray[np.int64]
    words: NDArray[np.int32]
    sq_dists: NDArray[np.float32]
    vocabulary: str = ""
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._index.update({n: i for i, n in enumerate(self.names)})

    def of(self, name: str) -> tuple[NDArray[np.int32], NDArray[np.float32]]:
        """``(words [n, k], sq_dists [n, k])`` of one image."""
        try:
            i = self._index[name]
        except KeyError:
            raise InputError(f"no visual words for image {name!r}") from None
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.words[a:b], self.sq_dists[a:b]

    @classmethod
    def load(cls, path: Path) -> Words:
        """Read a words file written by :func:`step_assign`, checking its digest (in full).

        Raises:
            InputError: the file is missing.
            CorruptCache: the file is damaged or does not match its digest.
        """
        z = load_npz(path, what="visual-words file")
        try:
            return cls(tuple(z["names"].tolist()), z["offsets"], z["words"], z["sq_dists"], str(z["vocabulary"]))
        except KeyError as exc:
            raise CorruptCache(f"visual-words file without {exc}", path) from None


def step_assign(
    vocab_path: Path,
    store: FeatureStore,
    names: Sequence[str],
    out_path: Path,
    *,
    k: int = 1,
    batch_images: int = 256,
    progress: bool = True,
    threads: int | None = None,
    workers: int = 1,
) -> Path:
    """Assign every feature of ``names`` to its ``k`` nearest words; skipped when done.

    With ``workers > 1`` batches of images are assigned in that many processes (one faiss thread
    each, :func:`oxbench.features.store.process_pool`); the result is the same file.

    Returns:
        ``out_path`` (an ``.npz`` with ``names``, ``offsets``, ``words``, ``sq_dists`` and their
        digest and the digest of the vocabulary used). An existing file is reused when intact and
        made for these images with this very vocabulary; a corrupt one is computed again, with a
        warning.
    """
    out_path = Path(out_path)
    remove_stale_temps(out_path.parent)
    voc = Vocabulary.load(vocab_path, descriptor=store.config.descriptor, dim=store.config.dim, threads=threads)
    with entry_lock(lock_path(out_path), what=f"the visual words {out_path}"):
        if out_path.exists():
            try:
                existing = Words.load(out_path)
                if (list(existing.names), existing.words.shape[1], existing.vocabulary) == (
                    list(names), k, voc.file_digest_
                ):
                    return out_path
                log.info("visual words at %s are for other images or another vocabulary; recomputing", out_path)
            except CorruptCache as exc:
                log.warning("%s; assigning the words again", exc)
        store.require_all(names)
        job = AssignBatch(voc, store, k)
        # every worker gets work even when all images fit one batch
        size = max(1, min(batch_images, -(-len(names) // max(1, workers))))
        batches = [list(names[s : s + size]) for s in range(0, len(names), size)]
        bar = progress_bar(total=len(batches), enabled=progress, desc="assign", unit="batch")
        try:
            if workers > 1 and len(batches) > 1:
                with process_pool(min(workers, len(batches)), _init_assign, job) as pool:
                    results = []
                    for res in pool.map(_run_assign, batches):
                        results.append(res)
                        bar.update(1)
            else:
                results = []
                for b in batches:
                    results.append(job(b))
                    bar.update(1)
        finally:
            bar.close()
        return _save_words(voc, names, results, out_path, k=k)


class AssignBatch:
    """Picklable job: the ``k`` nearest words of every feature of a batch of images.

    Pickled, it carries the vocabulary's arrays and the store's folder (reopened in the worker
    process, with one faiss thread).
    """

    def __init__(self, voc: Vocabulary, store: FeatureStore, k: int) -> None:
        self.voc = voc
        self.store = store
        self.k = k

    def __getstate__(self) -> dict[str, object]:
        st = self.store
        return {"voc": self.voc, "k": self.k, "store": (st.directory, st.config, _store_extra(st))}

    def __setstate__(self, state: dict[str, Any]) -> None:
        directory, config, extra = state["store"]
        self.voc = state["voc"]
        self.voc.threads = 1
        self.k = int(state["k"])
        self.store = FeatureStore.open(directory, config, extra=extra, create=False)

    def __call__(self, chunk: Sequence[str]) -> tuple[NDArray[np.int64], NDArray[np.int32], NDArray[np.float32]]:
        raws = [self.store.get_raw(n)[2] for n in chunk]
        counts = np.array([len(r) for r in raws], np.int64)
        x = finish_descriptors(np.concatenate(raws) if raws else np.zeros((0, 128), np.uint8),
                               self.store.config.descriptor)  # fmt: skip
        if len(x):
            d, w = self.voc.kneighbors(x, self.k)
        else:
            d, w = np.zeros((0, self.k), np.float32), np.zeros((0, self.k), np.int64)
        return counts, w.astype(np.int32), d.astype(np.float32)


_ASSIGN_JOB: AssignBatch | None = None


def _init_assign(job: AssignBatch) -> None:
    global _ASSIGN_JOB
    _ASSIGN_JOB = job


def _run_assign(chunk: Sequence[str]) -> tuple[NDArray[np.int64], NDArray[np.int32], NDArray[np.float32]]:
    assert _ASSIGN_JOB is not None
    return _ASSIGN_JOB(chunk)


def _save_words(
    voc: Vocabulary, names: Sequence[str],
    results: Sequence[tuple[NDArray[np.int64], NDArray[np.int32], NDArray[np.float32]]], out_path: Path, *, k: int,
) -> Path:  # fmt: skip
    offsets = np.zeros(len(names) + 1, np.int64)
    if results:
        np.cumsum(np.concatenate([r[0] for r in results]), out=offsets[1:])
    words_parts = [r[1] for r in results]
    dist_parts = [r[2] for r in results]
    return save_npz(out_path, {
        "names": np.array(list(names)),
        "offsets": offsets,
        "words": np.concatenate(words_parts) if words_parts else np.zeros((0, k), np.int32),
        "sq_dists": np.concatenate(dist_parts) if dist_parts else np.zeros((0, k), np.float32),
        "vocabulary": np.array(voc.file_digest_),
    })  # fmt: skip


# ---------------------------------------------------------------------- the method


def _tf(method: BowMethod, words: Words, names: Sequence[str], n_words: int):  # noqa: ANN202
    ws, wts = [], []
    for n in names:
        w, d = words.of(n)
        if method.assignment == "soft":
            k = min(method.soft_k, w.shape[1])
            ws.append(w[:, :k])
            wts.append(soft_assignment_weights(d[:, :k], method.soft_sigma2))
        else:
            ws.append(w[:, 0])
            wts.append(np.ones(len(w), np.float32))
    return bow_matrix(ws, n_words, wts)


class BagOfWords(RetrievalMethod):
    """RootSIFT bag-of-words through the method interface.

    ``fit`` trains (or reuses) the vocabulary on the training set's database features; ``index``
    describes the benchmark's database (and distractors), assigns visual words and builds the
    tf-idf inverted file; ``search`` describes the query crops, ranks the index, spatially
    re-ranks the top R and expands the queries as the config says.
    """

    def __init__(self, config: BowMethod) -> None:
        self.config: BowMethod = config
        self.vocab_path_: Path | None = None
        self.trained_on_: str | None = None
        self._ivf: InvertedFile | None = None
        self._words: dict[str, Words] = {}
        self._stores: dict[str, FeatureStore] = {}
        self._names: dict[str, list[str]] = {}
        self._indexed: str | None = None
        self._words_paths: dict[str, Path] = {}
        self._empty: NDArray[np.bool_] | None = None

    @property
    def k(self) -> int:
        """Words assigned per feature: the soft-assignment ``k``, or the query-side multiple assignment."""
        soft = self.config.soft_k if self.config.assignment == "soft" else 1
        ma = self.config.spatial_query_ma if self.config.spatial and self.config.spatial_matching == "words" else 1
        return max(soft, ma)

    def fit(self, train: Benchmark | None, ctx: RunContext) -> BagOfWords:
        if train is None:
            raise InputError(f"method {self.config.name} trains a vocabulary: it needs a training set")
        m = self.config
        hit = vocabulary_path(ctx.cache, m, train).exists()
        with ctx.timed("train_features"):
            if ctx.full_check or not hit:
                step_features(train, m.features, ctx.cache, parts=["database"], workers=ctx.workers,
                              progress=ctx.progress, full_check=ctx.full_check)  # fmt: skip
        with ctx.timed("vocabulary"):
            self.vocab_path_ = step_vocabulary(m, train, ctx.cache, workers=ctx.workers, progress=ctx.progress,
                                               threads=ctx.threads, full_check=ctx.full_check)  # fmt: skip
        ctx.record_step("vocabulary", hit=hit)
        self.trained_on_ = train.id
        return self

    def use_vocabulary(self, path: Path) -> BagOfWords:
        """Use an already trained vocabulary file instead of :meth:`fit`."""
        self.vocab_path_ = Path(path)
        return self

    def _assign(self, bench: Benchmark, part: str, ctx: RunContext) -> None:
        assert self.vocab_path_ is not None
        out = Path(ctx.cache) / dataset_key(bench) / "words" / f"{self.vocab_path_.stem}-k{self.k}" / f"{part}.npz"
        ctx.record_step(f"words.{part}", hit=out.exists())
        step_assign(self.vocab_path_, self._stores[part], self._names[part], out, k=self.k, progress=ctx.progress,
                    threads=ctx.threads, workers=ctx.workers)  # fmt: skip
        self._words[part] = Words.load(out)
        self._words_paths[part] = out

    def index(self, bench: Benchmark, ctx: RunContext) -> BagOfWords:
        if self.vocab_path_ is None:
            raise InputError(f"method {self.config.name}: fit (or use_vocabulary) before index")
        m = self.config
        with ctx.timed("features"):
            stores_done = {p: features_dir(ctx.cache, bench, m.features, p).exists() for p in _parts(bench)}
            step_features(bench, m.features, ctx.cache, workers=ctx.workers, progress=ctx.progress,
                          full_check=ctx.full_check)  # fmt: skip
        ctx.record_step("features", hit=all(stores_done.values()))
        self._voc = Vocabulary.load(self.vocab_path_, descriptor=m.features.descriptor, dim=m.features.dim)
        for p in _parts(bench):
            self._stores[p] = open_store(ctx.cache, bench, m.features, p)
            self._names[p] = _part_names(bench, p)
        with ctx.timed("assign"):
            for p in _parts(bench):
                if p != "queries":
                    self._assign(bench, p, ctx)
        with ctx.timed("index"):
            db_tf = _tf(m, self._words["database"], self._names["database"], self._voc.n_words)
            if "distractors" in self._names:
                import scipy.sparse as sp

                dis_tf = _tf(m, self._words["distractors"], self._names["distractors"], self._voc.n_words)
                db_tf = sp.vstack([db_tf, dis_tf]).tocsr()
            self._ivf = InvertedFile(self._voc.n_words, idf=m.idf, burst=m.burst).fit(db_tf)
        counts = [np.diff(self._words[p].offsets) for p in ("database", "distractors") if p in self._words]
        self._empty = np.concatenate(counts) == 0
        if self._empty.any():
            names = [n for p in ("database", "distractors") if p in self._names for n in self._names[p]]
            bad = [names[i] for i in np.flatnonzero(self._empty)[:5]]
            log.warning("%d database image(s) have no features and rank last, e.g. %s",
                        int(self._empty.sum()), ", ".join(bad))  # fmt: skip
        self._indexed = dataset_key(bench)
        return self

    def provenance(self) -> dict[str, object]:
        if self.vocab_path_ is None:
            return {}
        voc = Vocabulary.load(self.vocab_path_, descriptor=self.config.features.descriptor, dim=self.config.features.dim)
        return {"vocabulary": voc.describe(), "vocabulary_path": str(self.vocab_path_), "trained_on": self.trained_on_}

    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        if self._ivf is None or self._indexed != dataset_key(bench):
            raise InputError(f"method {self.config.name}: index {bench.id} before searching it")
        m = self.config
        ivf = self._ivf
        with ctx.timed("assign"):
            self._assign(bench, "queries", ctx)
        index_parts = [("database", n) for n in self._names["database"]]
        if "distractors" in self._names:
            index_parts += [("distractors", n) for n in self._names["distractors"]]
        with ctx.timed("search"):
            q_vecs = ivf.transform(_tf(m, self._words["queries"], self._names["queries"], self._voc.n_words))
            scores = ivf.scores_of_vectors(q_vecs)
            scores = np.stack([_last_if_empty(row, self._empty) for row in scores]) if len(scores) else scores
            ranks = ranks_from_scores(scores.T)
        no_features = [n for n, c in zip(self._names["queries"], np.diff(self._words["queries"].offsets), strict=True)
                       if c == 0]  # fmt: skip
        if no_features:
            log.warning("%d query crop(s) have no features, their lists are in index order: %s",
                        len(no_features), ", ".join(no_features[:5]))  # fmt: skip
        info: dict[str, object] = {
            "n_index": len(index_parts),
            "features_per_image": float(np.mean(np.diff(self._words["database"].offsets)))
            if self._names["database"] else 0.0,
        }
        final_scores = np.take_along_axis(scores, ranks, axis=1).astype(np.float32)
        if not m.spatial:
            return SearchResult(ranks, final_scores, info)
        return self._rerank(ranks, scores, q_vecs, index_parts, info, ctx)

    def _rerank(
        self,
        ranks: NDArray[np.int64],
        scores: NDArray[np.float32],
        q_vecs,  # noqa: ANN001 - sparse query vectors
        index_parts: list[tuple[str, str]],
        info: dict[str, object],
        ctx: RunContext,
    ) -> SearchResult:
        """Spatial verification of the top R (in ``ctx.workers`` processes), then average query
        expansion and verification of the expanded query's new results."""
        m = self.config
        r = min(m.spatial_top_r, ranks.shape[1])
        if m.spatial_top_r > ranks.shape[1]:
            log.warning("short list of %d is longer than the index (%d images): verifying all of them",
                        m.spatial_top_r, ranks.shape[1])  # fmt: skip
        verifier = ShortListVerifier(
            stores={p: (s.directory, s.config, _store_extra(s)) for p, s in self._stores.items()},
            words=dict(self._words_paths), index_parts=index_parts, settings=verification_settings(m),
        )
        queries = self._names["queries"]
        with ctx.timed("spatial"):
            results = verify_short_lists(
                verifier, [(qi, queries[qi], ranks[qi, :r]) for qi in range(ranks.shape[0])],
                workers=ctx.workers, progress=ctx.progress,
            )  # fmt: skip
        expanded: dict[int, tuple[NDArray[np.float32], NDArray[np.int64]]] = {}
        if m.qe == "aqe":
            with ctx.timed("query_expansion"):
                expanded = self._expand(ranks, q_vecs, results)
        second: dict[int, VerifiedList] = {}
        items: list[tuple[int, str, NDArray[np.int64]]] = []
        if expanded and m.qe_verify_top:
            # Chum et al. 2007: the expanded query's results are verified too (against the query);
            # only the images of its top qe_verify_top that the first short list did not hold
            for qi, (_, order) in expanded.items():
                new = order[: m.qe_verify_top]
                new = new[~np.isin(new, ranks[qi, :r])]
                if len(new):
                    items.append((qi, queries[qi], new))
            with ctx.timed("spatial_after_qe"):
                done = verify_short_lists(verifier, items, workers=ctx.workers, progress=ctx.progress)
            second = {it[0]: res for it, res in zip(items, done, strict=True)}
        n_verified = []
        final = np.empty_like(ranks)
        final_scores = np.empty(ranks.shape, np.float32)
        matches: dict[int, dict[int, NDArray[np.float32]]] = {}
        for qi, res in enumerate(results):
            verified, inliers = res.verified, res.inliers
            new_order = np.concatenate([res.head, ranks[qi, r:]])
            row_scores = scores[qi]
            if qi in expanded:
                row_scores, order = expanded[qi]
                if qi in second:
                    verified = np.concatenate([verified, second[qi].verified])
                    inliers = np.concatenate([inliers, second[qi].inliers])
                    by_inliers = np.argsort(-inliers, kind="stable")
                    verified, inliers = verified[by_inliers], inliers[by_inliers]
                new_order = np.concatenate([verified, order[~np.isin(order, verified)]])
            n_verified.append(len(verified))
            final[qi] = new_order
            # verified images carry their inlier count (>= min_inliers >= 1 > any cosine score)
            final_scores[qi] = row_scores[new_order]
            final_scores[qi, : len(verified)] = inliers
            found = {**res.matches, **(second[qi].matches if qi in second else {})}
            if found:
                matches[qi] = {v: found[v] for v in verified.tolist() if v in found}
        info["verified_per_query"] = n_verified
        if m.qe == "aqe" and m.qe_verify_top:
            info["pairs_verified_after_qe"] = [len(it[2]) for it in items]
            info["queries_expanded"] = len(expanded)
        return SearchResult(final, final_scores, info, matches=matches)

    def _expand(
        self, ranks: NDArray[np.int64], q_vecs, results: list[VerifiedList]  # noqa: ANN001
    ) -> dict[int, tuple[NDArray[np.float32], NDArray[np.int64]]]:
        """Average query expansion of each query with verified images strong enough to expand it:
        ``{query: (scores of the expanded query, its full order)}``."""
        from oxbench.rerank.qe import average_query_expansion

        m = self.config
        assert self._ivf is not None and self._ivf.db_vectors_ is not None
        out = {}
        for qi, res in enumerate(results):
            use = res.verified[res.inliers >= m.qe_min_inliers][: m.qe_max_verified]
            if len(use):
                q_new = average_query_expansion(q_vecs[qi], self._ivf.db_vectors_[use])
                row_scores = self._ivf.scores_of_vectors(q_new)[0]
                out[qi] = row_scores, ranks_from_scores(_last_if_empty(row_scores, self._empty)[:, None])[0]
        return out


@dataclass(frozen=True)
class VerifiedList:
    """Spatial verification of one query's short list.

    Attributes:
        head: ``int64 [r]`` the re-ranked short list (verified first, by inlier count).
        verified: ``int64 [v]`` the verified indices, best first (``head[:v]``).
        inliers: ``int64 [v]`` their inlier counts.
        matches: ``{index: float32 [m, 4]}`` inlier correspondences ``(x_q, y_q, x_db, y_db)`` in
            full-image pixels of the first :data:`MATCHES_FOR_VIEWERS` verified images.
    """

    head: NDArray[np.int64]
    verified: NDArray[np.int64]
    inliers: NDArray[np.int64]
    matches: dict[int, NDArray[np.float32]]


#: Verified images per query whose inlier correspondences a search returns (the top of the list).
MATCHES_FOR_VIEWERS = 20


@dataclass(frozen=True)
class VerifySettings:
    """The spatial-verification settings of a bag-of-words config (see :class:`BowMethod`)."""

    model: GeometricModel
    method: RobustMethod
    min_inliers: int
    threshold_px: float
    max_per_word: int
    matching: str
    ratio: float
    query_ma: int


def verification_settings(m: BowMethod) -> VerifySettings:
    """What :class:`ShortListVerifier` needs of a config."""
    return VerifySettings(
        m.spatial_model, m.spatial_method, m.spatial_min_inliers, m.spatial_threshold_px,
        m.spatial_max_per_word, m.spatial_matching, m.spatial_ratio, m.spatial_query_ma,
    )


def _store_extra(store: FeatureStore) -> dict[str, object]:
    return {k: v for k, v in store.meta.items() if k not in ("format", "config", "digest")}


class ShortListVerifier:
    """Picklable job: spatially verify one query's short list (reopens stores and words per process).

    Args:
        stores: ``{part: (folder, sift config, extra)}`` of the feature stores (queries, database,
            distractors).
        words: ``{part: words file}``.
        index_parts: ``(part, image name)`` of every index position.
        settings: :func:`verification_settings`.
    """

    def __init__(
        self,
        *,
        stores: dict[str, tuple[Path, SiftConfig, dict[str, object]]],
        words: dict[str, Path],
        index_parts: list[tuple[str, str]],
        settings: VerifySettings,
    ) -> None:
        self.stores = stores
        self.words = words
        self.index_parts = index_parts
        self.settings = settings
        self._open: tuple[dict[str, FeatureStore], dict[str, Words]] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_open": None}

    def _opened(self) -> tuple[dict[str, FeatureStore], dict[str, Words]]:
        if self._open is None:
            stores = {
                p: FeatureStore.open(d, cfg, extra=extra, create=False) for p, (d, cfg, extra) in self.stores.items()
            }
            self._open = stores, {p: Words.load(w) for p, w in self.words.items()}
        return self._open

    def __call__(self, item: tuple[int, str, NDArray[np.int64]]) -> VerifiedList:
        from oxbench.rerank.spatial import descriptor_matches, spatial_rerank

        _, qname, order = item
        stores, words = self._opened()
        st = self.settings
        _, q_kp, q_raw, q_size = stores["queries"].get_raw(qname)
        q_words = words["queries"].of(qname)[0][:, : st.query_ma]
        descriptor = stores["queries"].config.descriptor
        q_desc = finish_descriptors(q_raw, descriptor) if st.matching == "descriptors" else None
        cands, tentative = [], []
        for idx in order.tolist():
            part, name = self.index_parts[idx]
            _, kp, raw, size = stores[part].get_raw(name)
            cands.append((kp, words[part].of(name)[0][:, 0], size))
            if q_desc is not None:
                tentative.append(descriptor_matches(q_desc, finish_descriptors(raw, descriptor), ratio=st.ratio))
        res = spatial_rerank(
            q_kp, q_words, cands, order, top_r=len(order), model=st.model, method=st.method,
            min_inliers=st.min_inliers, threshold_px=st.threshold_px, max_per_word=st.max_per_word,
            query_size=q_size, tentative=tentative if q_desc is not None else None,
        )
        position = {int(v): i for i, v in enumerate(order.tolist())}
        verified = np.asarray(res.verified, np.int64)
        inliers = np.array([res.inliers[position[int(v)]] for v in verified], np.int64)
        matches: dict[int, NDArray[np.float32]] = {}
        for v in verified[:MATCHES_FOR_VIEWERS].tolist():
            pairs = res.inlier_matches[position[v]]
            assert pairs is not None
            d_kp = cands[position[v]][0]
            matches[v] = np.concatenate([q_kp[pairs[:, 0], :2], d_kp[pairs[:, 1], :2]], axis=1).astype(np.float32)
        return VerifiedList(np.asarray(res.order, np.int64), verified, inliers, matches)


_VERIFIER: ShortListVerifier | None = None


def _init_verifier(job: ShortListVerifier) -> None:
    global _VERIFIER
    _VERIFIER = job
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover
        pass


def _run_verifier(item: tuple[int, str, NDArray[np.int64]]) -> VerifiedList:
    assert _VERIFIER is not None
    return _VERIFIER(item)


def verify_short_lists(
    job: ShortListVerifier,
    items: Sequence[tuple[int, str, NDArray[np.int64]]],
    *,
    workers: int = 1,
    progress: bool = True,
) -> list[VerifiedList]:
    """Run ``job`` on every ``(query index, query name, short list)``, in ``workers`` processes.

    The pool is the one extraction uses (:func:`oxbench.features.store.process_pool`): spawned
    processes with one OpenCV thread each; results come back in the order of ``items``.
    """
    bar = progress_bar(total=len(items), desc="spatial", enabled=progress, unit="query")
    try:
        if workers <= 1 or len(items) <= 1:
            out = []
            for it in items:
                out.append(job(it))
                bar.update(1)
            return out
        with process_pool(min(workers, len(items)), _init_verifier, job) as pool:
            out = []
            for res in pool.map(_run_verifier, items, chunksize=1):
                out.append(res)
                bar.update(1)
            return out
    finally:
        bar.close()


def _last_if_empty(row_scores: NDArray[np.float32], empty: NDArray[np.bool_] | None) -> NDArray[np.float32]:
    """Scores with images that have no features set below every real score (they rank last)."""
    if empty is None or not empty.any():
        return row_scores
    out = np.array(row_scores, dtype=np.float32, copy=True)
    out[empty] = -1.0
    return out


def _parts(bench: Benchmark) -> list[str]:
    return ["database", "queries"] + (["distractors"] if bench.distractors is not None else [])
