"""Step: visual words of every local feature of a benchmark's parts.

``<cache>/<dataset-key>/words/<vocabulary>-k<k>/<part>.npz`` holds the ``k`` nearest words (and
squared distances) of every feature of one part, assigned in write-once shards of images through
the run's executor (:mod:`oxbench.execution.shards`). :func:`describe_and_assign` is what a family that quantises local features runs at index
time: the features of every part, then the words of the indexed parts (:class:`WordedParts`).
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import (
    DIGEST_KEY,
    CorruptCache,
    FileIdentity,
    entry_lock,
    load_npz,
    lock_path,
    save_npz_pieces,
)
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.execution import determinism
from oxbench.execution.shards import (
    ShardReceipt,
    ShardTask,
    check_receipts,
    committed_folders,
    in_partition,
    plan_digest,
    read_npz_shards,
    run_shard_tasks,
    write_npz_shard,
)
from oxbench.features.local import LocalExtractor
from oxbench.features.store import DEFAULT_SHARD_SIZE, FeatureStore
from oxbench.fileio import discard_folder, json_digest, remove_stale_temps
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
        source: the words file as :meth:`load` checked it (what lets another process open it
            without hashing it again); ``None`` when built in memory.

    :meth:`load` memory-maps ``words`` and ``sq_dists`` (read-only): an index over a million images
    keeps only the offsets in RAM, and a verification worker reads the pages of its short lists.
    """

    names: tuple[str, ...]
    offsets: NDArray[np.int64]
    words: NDArray[np.int32]
    sq_dists: NDArray[np.float32]
    vocabulary: str = ""
    source: FileIdentity | None = field(default=None, compare=False)
    _index: dict[str, int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        o, n = self.offsets, len(self.words)
        if (
            o.ndim != 1
            or len(o) != len(self.names) + 1
            or (len(o) and (o[0] != 0 or o[-1] != n))
            or bool(np.any(np.diff(o) < 0))
            or self.sq_dists.shape != self.words.shape
        ):
            raise InputError(
                f"visual words: offsets do not partition {n:,} features among {len(self.names):,} images"
            )
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
    def load(
        cls,
        path: Path,
        *,
        trusted: FileIdentity | None = None,
        stands_for: dict[str, object] | None = None,
    ) -> Words:
        """Open a words file written by :func:`step_assign`, checking its digest (in full, unless
        ``trusted`` names this very file as another process checked it); ``words`` and
        ``sq_dists`` are memory-mapped. ``stands_for``: the features it must have been assigned
        from (:func:`words_record`).

        Raises:
            InputError: the file is missing.
            CorruptCache: the file is damaged, does not match its digest, or was assigned from
                other features than ``stands_for``.
        """
        path = Path(path)
        z = load_npz(
            path,
            what="visual-words file",
            mapped=("words", "sq_dists"),
            trusted=trusted,
            stands_for=stands_for,
        )
        try:
            return cls(
                tuple(z["names"].tolist()),
                z["offsets"],
                z["words"],
                z["sq_dists"],
                str(z["vocabulary"]),
                source=FileIdentity.of(os.stat(path), str(z[DIGEST_KEY])),
            )
        except KeyError as exc:
            raise CorruptCache(f"visual-words file without {exc}", path) from None
        except InputError as exc:
            raise CorruptCache(exc.problem, path) from None


def store_spec(store: FeatureStore) -> tuple[Path, LocalExtractor, dict[str, object]]:
    """What reopens ``store`` in another process: ``(folder, extractor, extra metadata)``."""
    extra = {k: v for k, v in store.meta.items() if k not in ("format", "config", "digest")}
    return store.directory, store.config, extra


def words_record(store: FeatureStore, names: Sequence[str]) -> dict[str, object]:
    """What the words of ``names`` stand for: the features the store holds for them now
    (:meth:`~oxbench.features.store.FeatureStore.features_digest`; an image described again after
    its file changed makes them another record, :func:`oxbench.cache.stands_for_record`)."""
    return {"features": store.features_digest(names)}


def reopen_store(spec: tuple[Path, LocalExtractor, dict[str, object]]) -> FeatureStore:
    """The store :func:`store_spec` describes (it must exist)."""
    directory, config, extra = spec
    return FeatureStore.open(directory, config, extra=extra, create=False)


class AssignShard:
    """Picklable job of the shard protocol (:mod:`oxbench.execution.shards`): the ``k`` nearest words of every
    feature of one planned shard's images, committed as a shard; returns its receipt.

    Pickled, it carries the vocabulary's arrays and the store's folder (reopened where it runs);
    faiss there runs with the executor's threads per worker.
    """

    def __init__(
        self,
        voc: Vocabulary,
        store: FeatureStore,
        k: int,
        names: Sequence[str],
        directory: Path,
        *,
        plan: str,
        tag: str,
    ) -> None:
        self.voc = voc
        self.store = store
        self.k = k
        self.names = list(names)
        self.directory = Path(directory)
        self.plan = plan
        self.tag = tag
        self.deterministic = determinism.active()  # the driver's mode travels with the job

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "store": store_spec(self.store)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.voc.threads = None  # the worker's thread cap (oxbench.execution.limit_threads)
        self.store = reopen_store(state["store"])

    def assign(
        self, chunk: Sequence[str]
    ) -> tuple[NDArray[np.int64], NDArray[np.int32], NDArray[np.float32]]:
        """``(features per image, words [n, k], squared distances [n, k])`` of the images ``chunk``."""
        raws = [self.store.get_raw(n).descriptors for n in chunk]
        counts = np.array([len(r) for r in raws], np.int64)
        cfg = self.store.config
        x = cfg.finish(np.concatenate(raws) if raws else np.zeros((0, cfg.dim), cfg.stored_dtype))
        if len(x):
            d, w = self.voc.kneighbors(x, self.k)
        else:
            d, w = np.zeros((0, self.k), np.float32), np.zeros((0, self.k), np.int64)
        return counts, w.astype(np.int32), d.astype(np.float32)

    def __call__(self, task: ShardTask) -> ShardReceipt:
        t0 = time.perf_counter()
        chunk = [self.names[i] for i in task.items]
        with determinism.single_threaded(self.deterministic and not determinism.active()):
            counts, words, sq_dists = self.assign(chunk)
        arrays = {
            "names": np.array(chunk),
            "counts": counts,
            "words": words,
            "sq_dists": sq_dists,
            "vocabulary": np.array(self.voc.file_digest_),
            "features": np.array(self.store.features_digest(chunk)),
        }
        return write_npz_shard(
            self.directory,
            task,
            arrays,
            plan=self.plan,
            tag=self.tag,
            rows=len(words),
            seconds_from=t0,
        )


def words_path(cache: Path, bench: Benchmark, vocab_path: Path, k: int, part: str) -> Path:
    """Where the words of one part, assigned ``k`` per feature with ``vocab_path``, are cached.

    The distractors' file is named by its images (``distractors-<count>-<digest>.npz``), so runs
    with other distractor counts keep their own files side by side, and sizes can be run in any
    order (:func:`step_assign` cuts a smaller set's words from a larger one's).
    """
    folder = Path(cache) / dataset_key(bench) / "words" / f"{vocab_path.stem}-k{k}"
    if part != "distractors":
        return folder / f"{part}.npz"
    names = part_names(bench, part)
    return folder / f"{part}-{len(names)}-{json_digest(names, 10)}.npz"


#: A distractor words file named by its images (:func:`words_path`).
_PER_LIST = re.compile(r"^distractors-\d+-[0-9a-f]+\.npz$")


def _words_prefix_donor(
    out_path: Path, names: Sequence[str], k: int, vocabulary: str
) -> tuple[Path, Words] | None:
    """A words file (and its words) beside ``out_path``, of the same vocabulary and ``k``, whose images begin with
    ``names`` (the distractors of a larger run); ``None`` when there is none."""
    if not _PER_LIST.match(out_path.name):
        return None
    for other in sorted(out_path.parent.glob("distractors-*.npz")):
        if other == out_path or not _PER_LIST.match(other.name):
            continue
        try:
            donor = Words.load(other)
        except (CorruptCache, InputError):
            continue
        if (
            donor.vocabulary == vocabulary
            and donor.words.shape[1] == k
            and len(donor.names) >= len(names)
            and list(donor.names[: len(names)]) == list(names)
        ):
            return other, donor
    return None


def _save_words_prefix(donor: Words, n: int, out_path: Path) -> None:
    """The words of ``donor``'s first ``n`` images as a words file of their own (mapped slices
    written piece by piece, never read into memory whole)."""
    offsets = np.array(donor.offsets[: n + 1], np.int64)
    rows = int(offsets[-1])
    save_npz_pieces(
        out_path,
        {
            "names": np.array(list(donor.names[:n])),
            "offsets": offsets,
            "words": [donor.words[:rows]],
            "sq_dists": [donor.sq_dists[:rows]],
            "vocabulary": np.array(donor.vocabulary),
        },
    )


def _shard_checker(vocabulary: str, k: int, store: FeatureStore):  # noqa: ANN202 - read_npz_shards
    def check(z: dict[str, NDArray[Any]], names: list[str]) -> str | None:
        try:
            counts, words, dists = z["counts"], z["words"], z["sq_dists"]
            ok = (
                z["names"].tolist() == names
                and str(z["vocabulary"]) == vocabulary
                and str(z["features"]) == store.features_digest(names)
                and counts.shape == (len(names),)
                and words.dtype == np.int32
                and dists.dtype == np.float32
                and words.shape == dists.shape == (int(counts.sum()), k)
            )
        except (KeyError, AttributeError, ValueError):
            ok = False
        return None if ok else "is for other images or features, another vocabulary or another k"

    return check


def step_assign(
    vocab_path: Path,
    store: FeatureStore,
    names: Sequence[str],
    out_path: Path,
    ctx: RunContext,
    *,
    k: int = 1,
    shard_size: int = DEFAULT_SHARD_SIZE,
    partition: tuple[int, int] | None = None,
) -> StepResult:
    """Assign every feature of ``names`` to its ``k`` nearest words; skipped when done.

    The images go through ``ctx.executor`` as write-once shards of ``shard_size`` images
    (:mod:`oxbench.execution.shards`, in ``<out_path stem>.shards/``): each task commits its shard and returns
    a receipt, an interrupted step resumes with the shards not committed, and a shard tampered with
    is assigned again with a warning. The shards are then assembled into ``out_path``, the same
    file whatever the executor, and deleted.

    Args:
        partition: ``(i, n)``: commit only the planned shards numbered ``i`` modulo ``n`` and
            assemble nothing (an array job's share; a later call without it completes the step).

    Returns:
        ``StepResult(out_path, hit)``: an ``.npz`` with ``names``, ``offsets``, ``words``,
        ``sq_dists``, their digest and the digest of the vocabulary used. An existing file is
        reused when intact and made for these images with this very vocabulary; a corrupt one is
        computed again, with a warning.
    """
    out_path = Path(out_path)
    shards = out_path.with_suffix(".shards")
    remove_stale_temps(out_path.parent)
    voc = load_vocabulary(vocab_path, store.config)
    with entry_lock(lock_path(out_path), what=f"the visual words {out_path}"):
        if out_path.exists():
            try:
                existing = Words.load(out_path, stands_for=words_record(store, names))
                if (list(existing.names), existing.words.shape[1], existing.vocabulary) == (
                    list(names),
                    k,
                    voc.file_digest_,
                ):
                    return StepResult(out_path, hit=True)
                log.info(
                    "visual words at %s are for other images or another vocabulary; recomputing",
                    out_path,
                )
            except CorruptCache as exc:
                log.warning("%s; assigning the words again", exc)
        donor = _words_prefix_donor(out_path, names, k, voc.file_digest_)
        if donor is not None and partition is None:
            log.info("visual words of %s cut from %s", out_path.name, donor[0].name)
            _save_words_prefix(donor[1], len(names), out_path)
            return StepResult(out_path, hit=True)
        store.require_all(names)
        if shards.is_dir():
            remove_stale_temps(shards)
        check = _shard_checker(voc.file_digest_, k, store)
        done, todo = read_npz_shards(
            shards, names, shard_size, what="visual-words shard", check=check
        )
        todo = in_partition(todo, partition)
        if todo:
            tag = uuid.uuid4().hex[:12]
            job = AssignShard(
                voc, store, k, names, shards, plan=plan_digest(names, shard_size), tag=tag
            )
            receipts = run_shard_tasks(
                job, todo, shards, tag, executor=ctx.executor, desc="assign", progress=ctx.progress
            )
            check_receipts(
                todo,
                receipts,
                (p.name for f in committed_folders(shards).values() for p in f),
                shards,
            )
        computed = sum(len(t.items) for t in todo)
        if partition is not None:
            return StepResult(out_path, hit=False, computed=computed)
        done, todo = read_npz_shards(
            shards,
            names,
            shard_size,
            what="visual-words shard",
            check=check,
            mapped=("words", "sq_dists"),
        )
        if todo:
            raise InputError(f"{todo[0]}: visual words missing after its task returned", shards)
        _save_words(
            voc,
            names,
            [done[n] for n in sorted(done)],
            out_path,
            k=k,
            stands_for=words_record(store, names),
        )
        discard_folder(shards)
        return StepResult(out_path, hit=False, computed=computed)


def _save_words(
    voc: Vocabulary,
    names: Sequence[str],
    shards: Sequence[dict[str, NDArray[Any]]],
    out_path: Path,
    *,
    k: int,
    stands_for: dict[str, object] | None = None,
) -> Path:
    """The shards (memory-mapped) written one after another into the words file, never concatenated
    in memory: at a million images the words alone are gigabytes. ``stands_for``: the features
    they were assigned from (:func:`words_record`)."""
    offsets = np.zeros(len(names) + 1, np.int64)
    if shards:
        np.cumsum(np.concatenate([z["counts"] for z in shards]), out=offsets[1:])
    return save_npz_pieces(
        out_path,
        {
            "names": np.array(list(names)),
            "offsets": offsets,
            "words": [np.zeros((0, k), np.int32)] + [z["words"] for z in shards],
            "sq_dists": [np.zeros((0, k), np.float32)] + [z["sq_dists"] for z in shards],
            "vocabulary": np.array(voc.file_digest_),
        },
        stands_for=stands_for,
    )


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
        return [
            (p, n) for p in ("database", "distractors") if p in self.names for n in self.names[p]
        ]

    def empty(self) -> NDArray[np.bool_]:
        """``bool [n_index]``: index images without features (they rank last)."""
        counts = [self.words[p].counts for p in ("database", "distractors") if p in self.words]
        return np.concatenate(counts) == 0 if counts else np.zeros(0, bool)

    def assign(self, bench: Benchmark, part: str, ctx: RunContext) -> Words:
        """The words of one part (computed through :func:`step_assign` or read from the cache)."""
        out = words_path(ctx.cache, bench, self.vocab_path, self.k, part)
        res = step_assign(
            self.vocab_path,
            self.stores[part],
            self.names[part],
            out,
            ctx,
            k=self.k,
            shard_size=ctx.shard_size,
        )
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
    ctx.record_step(
        "features",
        hit=all(r.hit for r in done.values()),
        computed=sum(r.computed for r in done.values()),
    )
    parts = parts_of(bench)
    worded = WordedParts(
        dataset_key(bench),
        vocab_path,
        load_vocabulary(vocab_path, features),
        k,
        stores={p: open_store(ctx.cache, bench, features, p) for p in parts},
        names={p: part_names(bench, p) for p in parts},
    )
    with ctx.timed("assign"):
        for p in parts:
            if p != "queries":
                worded.assign(bench, p, ctx)
    return worded
