"""The RootSIFT bag-of-words pipeline as resumable steps.

Steps (each takes a config and paths, returns its output path, and skips work already done):

1. :func:`step_features` -- local features of a benchmark's database / query crops / distractors
   into :class:`~oxbench.features.store.FeatureStore` folders
   (``<cache>/<dataset-key>/features/<sift-digest>/<part>/``);
2. :func:`step_vocabulary` -- a vocabulary trained on ANOTHER benchmark's database features
   (``<cache>/vocabularies/<train>-<digest>.npz``);
3. :func:`step_assign` -- visual words (``k`` nearest, with squared distances) of every feature of a
   store (``<cache>/<dataset-key>/words/<vocab>-k<k>/<part>.npz``);
4. :func:`search` -- tf-idf inverted file, query, spatial re-ranking of the top R, average query
   expansion over the verified images; returns the internal ranks ``[n_queries, n_index]``.

:func:`run_bow` chains them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.features.sift import SiftConfig, finish_descriptors
from oxbench.features.store import DescribeImages, DescribeQueries, FeatureStore, extract_to_store
from oxbench.groundtruth import GroundTruth
from oxbench.index.inverted import InvertedFile, bow_matrix, rank_scores, soft_assignment_weights
from oxbench.index.vocabulary import Vocabulary
from oxbench.pipelines.presets import BowMethod

log = logging.getLogger(__name__)

PARTS = ("database", "queries", "distractors")

#: Default training set of the vocabulary for each test set: never the test set itself.
DEFAULT_TRAIN_DATASET: dict[str, str] = {
    "synthetic": "synthetic-train",
    "synthetic-train": "synthetic",
    "roxford5k": "rparis6k",
    "rparis6k": "roxford5k",
    "oxford5k": "paris6k",
    "paris6k": "oxford5k",
    "holidays": "synthetic-train",
    "ukbench": "synthetic-train",
}


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
) -> dict[str, Path]:
    """Describe the database, the query crops (and distractors) of a benchmark; resumable.

    Args:
        bench: the benchmark.
        sift: extraction settings.
        cache: the cache root.
        parts: which parts (default: database, queries, and distractors when present).
        workers: extraction processes.
        progress: tqdm bars.

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
            job, n, store, workers=workers, progress=progress, desc=f"{bench.id} {part}"
        )
    return out


def _part_names(bench: Benchmark, part: str) -> list[str]:
    src = {"database": bench.database, "queries": bench.queries, "distractors": bench.distractors}[part]
    assert src is not None
    return [src.name(i) for i in range(len(src))]


def training_descriptors(
    store: FeatureStore, names: Sequence[str], n_target: int, seed: int = 0
) -> NDArray[np.float32]:
    """A seeded sample of about ``n_target`` descriptors spread evenly over ``names``' images."""
    store.require_all(names)
    rng = np.random.default_rng(seed)
    counts = [store.count(name) for name in names]
    total = int(sum(counts))
    if total == 0:
        raise InputError("the training images have no features", store.directory)
    frac = min(1.0, n_target / total)
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
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache) / "vocabularies" / f"{train.id}-k{method.vocab_size}-{digest}.npz"


def step_vocabulary(
    method: BowMethod,
    train: Benchmark,
    cache: Path,
    *,
    workers: int = 1,
    progress: bool = True,
    threads: int | None = None,
) -> Path:
    """Train (or reuse) the vocabulary of ``method`` on ``train``'s database features.

    Returns:
        The ``.npz`` path. An existing file is checked for the descriptor type and dimension.
    """
    path = vocabulary_path(cache, method, train)
    if path.exists():
        Vocabulary.load(path, descriptor=method.features.descriptor, dim=method.features.dim)
        return path
    step_features(train, method.features, cache, parts=["database"], workers=workers, progress=progress)
    store = open_store(cache, train, method.features, "database")
    n_target = method.vocab_size * method.vocab_max_points_per_centroid
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
    """

    names: tuple[str, ...]
    offsets: NDArray[np.int64]
    words: NDArray[np.int32]
    sq_dists: NDArray[np.float32]
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
        """Read a words file written by :func:`step_assign`."""
        try:
            with np.load(path, allow_pickle=False) as z:
                return cls(tuple(z["names"].tolist()), z["offsets"], z["words"], z["sq_dists"])
        except (OSError, KeyError, ValueError) as exc:
            raise InputError(f"unreadable visual-words file ({exc})", path) from None


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
) -> Path:
    """Assign every feature of ``names`` to its ``k`` nearest words; skipped when done.

    Returns:
        ``out_path`` (an ``.npz`` with ``names``, ``offsets``, ``words``, ``sq_dists``).
    """
    from tqdm.auto import tqdm

    if out_path.exists():
        existing = Words.load(out_path)
        if list(existing.names) == list(names) and existing.words.shape[1] == k:
            return out_path
        log.info("visual words at %s are for other images; recomputing", out_path)
    store.require_all(names)
    voc = Vocabulary.load(vocab_path, descriptor=store.config.descriptor, dim=store.config.dim, threads=threads)
    offsets = np.zeros(len(names) + 1, np.int64)
    words_parts, dist_parts = [], []
    for s in tqdm(range(0, len(names), batch_images), disable=not progress, desc="assign", unit="batch"):
        chunk = names[s : s + batch_images]
        raws = [store.get_raw(n)[2] for n in chunk]
        for j, r in enumerate(raws):
            offsets[s + j + 1] = len(r)
        x = finish_descriptors(np.concatenate(raws) if raws else np.zeros((0, 128), np.uint8), store.config.descriptor)
        if len(x):
            d, w = voc.kneighbors(x, k)
        else:
            d, w = np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        words_parts.append(w.astype(np.int32))
        dist_parts.append(d.astype(np.float32))
    np.cumsum(offsets, out=offsets)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.savez(
            fh,
            names=np.array(list(names)),
            offsets=offsets,
            words=np.concatenate(words_parts) if words_parts else np.zeros((0, k), np.int32),
            sq_dists=np.concatenate(dist_parts) if dist_parts else np.zeros((0, k), np.float32),
        )
    os.replace(tmp, out_path)
    return out_path


# ---------------------------------------------------------------------- search


@dataclass
class SearchOutput:
    """What :func:`search` / :func:`run_bow` return.

    Attributes:
        ranks: ``int64 [n_queries, n_index]`` internal ranks (database then distractors).
        timings: seconds per stage.
        info: what was used (vocabulary provenance, number of features, verified counts).
    """

    ranks: NDArray[np.int64]
    timings: dict[str, float]
    info: dict[str, object]


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


def search(
    method: BowMethod,
    bench: Benchmark,
    cache: Path,
    vocab_path: Path,
    *,
    progress: bool = True,
    threads: int | None = None,
    timings: dict[str, float] | None = None,
) -> SearchOutput:
    """Inverted-file search, then spatial re-ranking and query expansion as the method says.

    Features must exist (:func:`step_features`); visual words are computed here (cached).

    Returns:
        :class:`SearchOutput` with full rankings over database + distractors.
    """
    from tqdm.auto import tqdm

    timings = {} if timings is None else timings
    voc = Vocabulary.load(vocab_path, descriptor=method.features.descriptor, dim=method.features.dim)
    k = method.soft_k if method.assignment == "soft" else 1
    parts = ["database", "queries"] + (["distractors"] if bench.distractors is not None else [])
    stores = {p: open_store(cache, bench, method.features, p) for p in parts}
    words: dict[str, Words] = {}
    names = {p: _part_names(bench, p) for p in parts}
    t0 = time.perf_counter()
    for p in parts:
        out = Path(cache) / dataset_key(bench) / "words" / f"{vocab_path.stem}-k{k}" / f"{p}.npz"
        step_assign(vocab_path, stores[p], names[p], out, k=k, progress=progress, threads=threads)
        words[p] = Words.load(out)
    timings["assign"] = time.perf_counter() - t0

    # database index = database images then distractors
    index_parts = [("database", n) for n in names["database"]]
    if "distractors" in names:
        index_parts += [("distractors", n) for n in names["distractors"]]

    t0 = time.perf_counter()
    db_tf = _tf(method, words["database"], names["database"], voc.n_words)
    if "distractors" in names:
        import scipy.sparse as sp

        db_tf = sp.vstack([db_tf, _tf(method, words["distractors"], names["distractors"], voc.n_words)]).tocsr()
    ivf = InvertedFile(voc.n_words, idf=method.idf, burst=method.burst).fit(db_tf)
    timings["index"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    q_vecs = ivf.transform(_tf(method, words["queries"], names["queries"], voc.n_words))
    scores = ivf.scores_of_vectors(q_vecs)
    ranks = rank_scores(scores)
    timings["search"] = time.perf_counter() - t0

    info: dict[str, object] = {
        "vocabulary": voc.describe(),
        "n_index": len(index_parts),
        "features_per_image": float(np.mean(np.diff(words["database"].offsets))) if names["database"] else 0.0,
    }
    if not method.spatial:
        return SearchOutput(ranks, timings, info)

    from oxbench.rerank.spatial import spatial_rerank

    t_sv = t_qe = 0.0
    n_verified = []
    final = np.empty_like(ranks)
    for qi in tqdm(range(ranks.shape[0]), disable=not progress, desc="spatial", unit="query"):
        t0 = time.perf_counter()
        qname = names["queries"][qi]
        _, q_kp, _, q_size = stores["queries"].get_raw(qname)
        q_words = words["queries"].of(qname)[0][:, 0].astype(np.int64)
        order = ranks[qi]
        r = min(method.spatial_top_r, len(order))
        cands = []
        for idx in order[:r].tolist():
            part, name = index_parts[idx]
            _, kp, _, size = stores[part].get_raw(name)
            cands.append((kp, words[part].of(name)[0][:, 0].astype(np.int64), size))
        res = spatial_rerank(
            q_kp, q_words, cands, order,
            top_r=r, model=method.spatial_model, min_inliers=method.spatial_min_inliers,
            threshold_px=method.spatial_threshold_px, query_size=q_size,
        )
        t_sv += time.perf_counter() - t0
        verified = np.asarray(res.verified, np.int64)
        n_verified.append(len(verified))
        new_order = np.asarray(res.order, np.int64)
        if method.qe == "aqe" and len(verified):
            t0 = time.perf_counter()
            from oxbench.rerank.qe import average_query_expansion

            assert ivf.db_vectors_ is not None
            use = verified[: method.qe_max_verified]
            q_new = average_query_expansion(q_vecs[qi], ivf.db_vectors_[use])
            s_new = ivf.scores_of_vectors(q_new)[0]
            rest = rank_scores(s_new[None, :])[0]
            rest = rest[~np.isin(rest, verified)]
            new_order = np.concatenate([verified, rest])
            t_qe += time.perf_counter() - t0
        final[qi] = new_order
    timings["spatial"] = t_sv
    if method.qe != "none":
        timings["query_expansion"] = t_qe
    info["verified_per_query"] = n_verified
    return SearchOutput(final, timings, info)


def run_bow(
    method: BowMethod,
    bench: Benchmark,
    train: Benchmark,
    cache: str | Path,
    *,
    workers: int = 1,
    progress: bool = True,
    threads: int | None = None,
) -> SearchOutput:
    """Features, vocabulary (trained on ``train``), words, search: the whole method on ``bench``.

    Training on the test set itself (``train.id == bench.id``) is allowed but recorded in
    ``info["trained_on_test_set"]``.
    """
    cache = Path(cache)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if not vocabulary_path(cache, method, train).exists():
        step_features(train, method.features, cache, parts=["database"], workers=workers, progress=progress)
    timings["train_features"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    vocab_path = step_vocabulary(method, train, cache, workers=workers, progress=progress, threads=threads)
    timings["vocabulary"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    step_features(bench, method.features, cache, workers=workers, progress=progress)
    timings["features"] = time.perf_counter() - t0
    out = search(method, bench, cache, vocab_path, progress=progress, threads=threads, timings=timings)
    out.info["vocabulary_path"] = str(vocab_path)
    out.info["trained_on"] = train.id
    out.info["trained_on_test_set"] = dataset_key(train) == dataset_key(bench) or train.id == bench.id
    return out
