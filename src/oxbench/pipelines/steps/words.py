"""Step: visual words of every local feature of a benchmark's parts.

``<cache>/<dataset-key>/words/<vocabulary>-k<k>/<part>.npz`` holds the ``k`` nearest words (and
squared distances) of every feature of one part, assigned in batches of images through the run's
executor. :func:`describe_and_assign` is what a family that quantises local features runs at index
time: the features of every part, then the words of the indexed parts (:class:`WordedParts`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, entry_lock, load_npz, lock_path, save_npz
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.features.local import LocalExtractor
from oxbench.features.store import FeatureStore
from oxbench.fileio import remove_stale_temps
from oxbench.index.vocabulary import Vocabulary
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps.keys import StepResult, dataset_key, part_names, parts_of
from oxbench.pipelines.steps.local import open_store, step_features
from oxbench.pipelines.steps.vocabulary import load_vocabulary

log = logging.getLogger(__name__)


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

    @property
    def counts(self) -> NDArray[np.int64]:
        """Features per image, in the order of ``names``."""
        return np.diff(self.offsets)

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


def store_spec(store: FeatureStore) -> tuple[Path, LocalExtractor, dict[str, object]]:
    """What reopens ``store`` in another process: ``(folder, extractor, extra metadata)``."""
    extra = {k: v for k, v in store.meta.items() if k not in ("format", "config", "digest")}
    return store.directory, store.config, extra


def reopen_store(spec: tuple[Path, LocalExtractor, dict[str, object]]) -> FeatureStore:
    """The store :func:`store_spec` describes (it must exist)."""
    directory, config, extra = spec
    return FeatureStore.open(directory, config, extra=extra, create=False)


class AssignBatch:
    """Picklable job: the ``k`` nearest words of every feature of a batch of images.

    Pickled, it carries the vocabulary's arrays and the store's folder (reopened where it runs);
    faiss there runs with the executor's threads per worker.
    """

    def __init__(self, voc: Vocabulary, store: FeatureStore, k: int) -> None:
        self.voc = voc
        self.store = store
        self.k = k

    def __getstate__(self) -> dict[str, object]:
        return {"voc": self.voc, "k": self.k, "store": store_spec(self.store)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.voc = state["voc"]
        self.voc.threads = None  # the worker's thread cap (oxbench.execution.limit_threads)
        self.k = int(state["k"])
        self.store = reopen_store(state["store"])

    def __call__(self, chunk: Sequence[str]) -> tuple[NDArray[np.int64], NDArray[np.int32], NDArray[np.float32]]:
        raws = [self.store.get_raw(n)[2] for n in chunk]
        counts = np.array([len(r) for r in raws], np.int64)
        cfg = self.store.config
        x = cfg.finish(np.concatenate(raws) if raws else np.zeros((0, cfg.dim), cfg.stored_dtype))
        if len(x):
            d, w = self.voc.kneighbors(x, self.k)
        else:
            d, w = np.zeros((0, self.k), np.float32), np.zeros((0, self.k), np.int64)
        return counts, w.astype(np.int32), d.astype(np.float32)


def words_path(cache: Path, bench: Benchmark, vocab_path: Path, k: int, part: str) -> Path:
    """Where the words of one part, assigned ``k`` per feature with ``vocab_path``, are cached."""
    return Path(cache) / dataset_key(bench) / "words" / f"{vocab_path.stem}-k{k}" / f"{part}.npz"


def step_assign(
    vocab_path: Path,
    store: FeatureStore,
    names: Sequence[str],
    out_path: Path,
    ctx: RunContext,
    *,
    k: int = 1,
    batch_images: int = 256,
) -> StepResult:
    """Assign every feature of ``names`` to its ``k`` nearest words; skipped when done.

    Batches of images go through ``ctx.executor`` (every worker gets work even when all images
    fit one batch); the file is the same whatever the executor.

    Returns:
        ``StepResult(out_path, hit)``: an ``.npz`` with ``names``, ``offsets``, ``words``,
        ``sq_dists``, their digest and the digest of the vocabulary used. An existing file is
        reused when intact and made for these images with this very vocabulary; a corrupt one is
        computed again, with a warning.
    """
    out_path = Path(out_path)
    remove_stale_temps(out_path.parent)
    voc = load_vocabulary(vocab_path, store.config)
    with entry_lock(lock_path(out_path), what=f"the visual words {out_path}"):
        if out_path.exists():
            try:
                existing = Words.load(out_path)
                if (list(existing.names), existing.words.shape[1], existing.vocabulary) == (
                    list(names), k, voc.file_digest_
                ):
                    return StepResult(out_path, hit=True)
                log.info("visual words at %s are for other images or another vocabulary; recomputing", out_path)
            except CorruptCache as exc:
                log.warning("%s; assigning the words again", exc)
        store.require_all(names)
        size = max(1, min(batch_images, -(-len(names) // ctx.executor.workers)))
        batches = [list(names[s : s + size]) for s in range(0, len(names), size)]
        results = list(ctx.executor.map(AssignBatch(voc, store, k), batches, desc="assign", unit="batch",
                                        progress=ctx.progress))  # fmt: skip
        _save_words(voc, names, results, out_path, k=k)
        return StepResult(out_path, hit=False, computed=len(names))


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


@dataclass
class WordedParts:
    """A benchmark's local features and visual words, part by part (what quantising families index).

    Attributes:
        bench_key: :func:`~oxbench.pipelines.steps.keys.dataset_key` of the benchmark.
        vocab_path: the vocabulary file.
        vocabulary: the vocabulary.
        k: words per feature.
        stores: ``{part: FeatureStore}`` of every part.
        names: ``{part: image names}`` in part order.
        words: ``{part: Words}`` of the parts assigned so far.
        words_paths: ``{part: words file}``.
    """

    bench_key: str
    vocab_path: Path
    vocabulary: Vocabulary
    k: int
    stores: dict[str, FeatureStore]
    names: dict[str, list[str]]
    words: dict[str, Words] = field(default_factory=dict)
    words_paths: dict[str, Path] = field(default_factory=dict)

    @property
    def index_parts(self) -> list[tuple[str, str]]:
        """``(part, image name)`` of every index position: the database, then the distractors."""
        return [(p, n) for p in ("database", "distractors") if p in self.names for n in self.names[p]]

    def empty(self) -> NDArray[np.bool_]:
        """``bool [n_index]``: index images without features (they rank last)."""
        counts = [self.words[p].counts for p in ("database", "distractors") if p in self.words]
        return np.concatenate(counts) == 0 if counts else np.zeros(0, bool)

    def assign(self, bench: Benchmark, part: str, ctx: RunContext) -> Words:
        """The words of one part (computed through :func:`step_assign` or read from the cache)."""
        out = words_path(ctx.cache, bench, self.vocab_path, self.k, part)
        res = step_assign(self.vocab_path, self.stores[part], self.names[part], out, ctx, k=self.k)
        ctx.record_step(f"words.{part}", hit=res.hit)
        self.words[part] = Words.load(out)
        self.words_paths[part] = out
        return self.words[part]


def describe_and_assign(
    bench: Benchmark, features: LocalExtractor, vocab_path: Path, k: int, ctx: RunContext
) -> WordedParts:
    """Local features of every part of ``bench``, and the words of its database and distractors.

    Records the steps ``features`` (a hit only when no part described an image) and
    ``words.<part>``; times ``features`` and ``assign``. The query crops are assigned later, by
    :meth:`WordedParts.assign` at search time.
    """
    with ctx.timed("features"):
        done = step_features(bench, features, ctx)
    ctx.record_step("features", hit=all(r.hit for r in done.values()))
    parts = parts_of(bench)
    worded = WordedParts(
        dataset_key(bench), vocab_path, load_vocabulary(vocab_path, features), k,
        stores={p: open_store(ctx.cache, bench, features, p) for p in parts},
        names={p: part_names(bench, p) for p in parts},
    )  # fmt: skip
    with ctx.timed("assign"):
        for p in parts:
            if p != "queries":
                worded.assign(bench, p, ctx)
    return worded
