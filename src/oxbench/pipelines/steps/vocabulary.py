"""Step: a visual vocabulary (k-means codebook) trained on ANOTHER benchmark's database features.

``<cache>/vocabularies/<train>-k<n_words>-<digest>.npz``, keyed by :meth:`VocabularySpec.settings`
and the training benchmark. Bag of words uses it as its vocabulary, ASMK as its codebook, VLAD as
its (flat, small) codebook.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, entry_lock, lock_path
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.execution import determinism
from oxbench.features.local import LocalExtractor, training_extractor
from oxbench.features.store import FeatureStore
from oxbench.fileio import json_digest, remove_stale_temps
from oxbench.index.vocabulary import AUTO_FLAT_MAX, Vocabulary, training_sample_size
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps.keys import StepResult, dataset_key, part_names
from oxbench.pipelines.steps.local import open_store, step_features

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VocabularySpec:
    """What determines a vocabulary, with the training benchmark.

    Attributes:
        features: the local features it quantises.
        n_words: number of words.
        structure: ``auto`` / ``flat`` / ``two-level`` (:class:`~oxbench.index.vocabulary.Vocabulary`).
        n_iter: k-means iterations.
        max_points_per_centroid: training-sample limit (descriptors per word; ``None``: every
            training descriptor).
        n_probe: coarse cells searched in two-level assignment.
        seed: seed of sampling and k-means.
    """

    features: LocalExtractor
    n_words: int
    structure: Literal["auto", "flat", "two-level"] = "auto"
    n_iter: int = 10
    max_points_per_centroid: int | None = 32
    n_probe: int = 4
    seed: int = 0

    @property
    def resolved_structure(self) -> Literal["flat", "two-level"]:
        """``flat`` or ``two-level``: what ``structure="auto"`` means at this size."""
        if self.structure != "auto":
            return self.structure
        return "flat" if self.n_words <= AUTO_FLAT_MAX else "two-level"

    def settings(self) -> dict[str, object]:
        """The settings that determine the vocabulary (with the training set): its cache key."""
        return {
            "features": self.features.to_dict(),
            "n_words": self.n_words,
            "structure": self.resolved_structure,
            "n_iter": self.n_iter,
            "max_points_per_centroid": self.max_points_per_centroid,
            "n_probe": self.n_probe,
            "seed": self.seed,
        }


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
        raw = store.get_raw(name).descriptors
        take = c if frac >= 1.0 else int(rng.binomial(c, frac))
        if take < c:
            raw = raw[np.sort(rng.choice(c, size=take, replace=False))]
        parts.append(raw)
    return store.config.finish(np.concatenate(parts))


def vocabulary_record(spec: VocabularySpec, train: Benchmark) -> dict[str, object]:
    """What the vocabulary of ``spec`` trained on ``train`` stands for (recorded inside its file)."""
    return {**spec.settings(), "train": dataset_key(train), **determinism.cache_key()}


def vocabulary_path(cache: Path, spec: VocabularySpec, train: Benchmark) -> Path:
    """Where the vocabulary of ``spec`` trained on ``train`` is cached."""
    settings = vocabulary_record(spec, train)
    return (
        Path(cache) / "vocabularies" / f"{train.id}-k{spec.n_words}-{json_digest(settings, 12)}.npz"
    )


def step_vocabulary(spec: VocabularySpec, train: Benchmark, ctx: RunContext) -> StepResult:
    """Train (or reuse) the vocabulary of ``spec`` on ``train``'s database features.

    An existing file is checked for its digest (a corrupt one is trained again, with a warning),
    the descriptor type and the dimension. The training set's features are described first when
    the vocabulary has to be trained (or when ``ctx.full_check`` asks for every artifact). Times
    ``train_features`` and ``vocabulary`` in ``ctx``.

    Returns:
        ``StepResult(the .npz path, hit)``.
    """
    path = vocabulary_path(ctx.cache, spec, train)
    remove_stale_temps(path.parent)
    features = training_extractor(spec.features)  # the training images' (their own file)
    with entry_lock(lock_path(path), what=f"the vocabulary {path}"):
        if path.exists():
            try:
                load_vocabulary(path, spec.features, stands_for=vocabulary_record(spec, train))
                if ctx.full_check:
                    step_features(train, features, ctx, parts=["database"])
                return StepResult(path, hit=True)
            except CorruptCache as exc:
                log.warning("%s; training it again", exc)
        with ctx.timed("train_features"):
            step_features(train, features, ctx, parts=["database"])
        with ctx.timed("vocabulary"):
            store = open_store(ctx.cache, train, features, "database")
            n_target = training_sample_size(spec.n_words, spec.max_points_per_centroid)
            x = training_descriptors(store, part_names(train, "database"), n_target, seed=spec.seed)
            log.info("training %d words on %d descriptors of %s", spec.n_words, len(x), train.id)
            voc = Vocabulary(
                spec.n_words,
                structure=spec.resolved_structure,
                n_iter=spec.n_iter,
                max_points_per_centroid=spec.max_points_per_centroid,
                n_probe=spec.n_probe,
                descriptor=_descriptor_name(spec.features),
                seed=spec.seed,
            ).fit(x, trained_on=train.id)
            saved = voc.save(path, stands_for=vocabulary_record(spec, train))
            return StepResult(saved, hit=False, computed=1)


def _descriptor_name(features: LocalExtractor) -> str:
    """The descriptor name a vocabulary file records (``rootsift``, ``sift``, or the extractor's kind)."""
    return str(getattr(features, "descriptor", None) or features.to_dict().get("kind"))


def load_vocabulary(
    path: Path,
    features: LocalExtractor,
    *,
    threads: int | None = None,
    stands_for: dict[str, object] | None = None,
) -> Vocabulary:
    """A vocabulary file, refused when it was trained for another descriptor or dimension (or,
    with ``stands_for``, :func:`vocabulary_record`, for anything else)."""
    return Vocabulary.load(
        path,
        descriptor=_descriptor_name(features),
        dim=features.dim,
        threads=threads,
        stands_for=stands_for,
    )
