"""What a method that quantises local features does the same whatever its family.

:class:`QuantisingMethod` is the shared part of such a method (bag of words, ASMK): ``fit`` trains
(or reuses) the vocabulary of its :class:`~oxbench.pipelines.steps.settings.LocalQuantisation`
settings on the training set, :meth:`~QuantisingMethod.index_parts` describes and assigns a
benchmark's parts, :meth:`~QuantisingMethod.indexed_parts` checks a search meets the benchmark it
indexed, and :meth:`~QuantisingMethod.verify` runs the short-list verification step. A family
subclasses it and adds only its own index and scoring.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import arrays_digest
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.fileio import json_digest, refuse_linked_folder
from oxbench.pipelines.method import RetrievalMethod, RunContext
from oxbench.pipelines.sources import GlobalSource
from oxbench.pipelines.steps.keys import dataset_key
from oxbench.pipelines.steps.local import step_features
from oxbench.pipelines.steps.settings import LocalQuantisation
from oxbench.pipelines.steps.verify import VerifiedList, short_list_verifier, verify_ranked
from oxbench.pipelines.steps.vocabulary import load_vocabulary, step_vocabulary
from oxbench.pipelines.steps.words import WordedParts, describe_and_assign
from oxbench.refinement.spatial import Verification
from oxbench.storage import StoreFolder, open_or_build

log = logging.getLogger(__name__)

Self = TypeVar("Self", bound="QuantisingMethod")
T = TypeVar("T")


class QuantisingMethod(RetrievalMethod):
    """The shared part of a method over local features and a vocabulary (see the module docstring).

    Attributes:
        vocab_path_: the vocabulary file (after :meth:`fit` or :meth:`use_vocabulary`).
        trained_on_: the training set's id.
        empty_: ``bool [n_index]`` index images without features (after :meth:`index_parts`).
    """

    config: Any  # a MethodConfig with LocalQuantisation settings

    def __init__(self, config: LocalQuantisation) -> None:
        self.config = config
        self.vocab_path_: Path | None = None
        self.trained_on_: str | None = None
        self.empty_: NDArray[np.bool_] | None = None
        self._parts: WordedParts | None = None
        self._train: Benchmark | None = None
        self.global_source_: Any = None
        self.index_facts_: dict[str, Any] = {}

    @property
    def k(self) -> int:
        """Words assigned per feature (1 unless the family assigns more)."""
        return 1

    def fit(self: Self, train: Benchmark | None, ctx: RunContext) -> Self:
        if train is None:
            raise InputError(
                f"method {self.config.name} trains a vocabulary: it needs a training set"
            )
        res = step_vocabulary(self.config.vocabulary_spec(), train, ctx)
        ctx.record_step("vocabulary", hit=res.hit)
        self.vocab_path_, self.trained_on_ = res.path, train.id
        self._train = train
        return self

    def prepare_pipeline(self, bench: Benchmark, ctx: RunContext) -> dict[str, Any]:
        """After the index is built: the named global source (its method fitted on the training
        set this method learned on, ``bench`` described) and every stage's index-time work (DBA,
        a diffusion graph); the facts to record, also kept in :attr:`index_facts_`."""
        facts: dict[str, Any] = {}
        if self.config.global_source is not None:
            self.global_source_ = GlobalSource(self.config.global_source)
            facts.update(self.global_source_.prepare(self._train, bench, ctx))
        facts.update(self.prepare_stages(self, ctx))
        self.index_facts_ = facts
        return facts

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """The local features of every part of ``bench``, as a run describes them
        (:func:`~oxbench.pipelines.steps.step_features`), by their write-once extraction shards."""
        done = step_features(bench, self.config.features, ctx, partition=partition)
        return {part: res.computed for part, res in done.items()}

    @property
    def dense_database(self) -> NDArray[np.float32]:
        """``"dense"`` through a ``global_source``: its vectors of the index images."""
        if self.global_source_ is None or self.global_source_.database is None:
            raise InputError(f"method {self.config.name}: no global_source to give dense vectors")
        return self.global_source_.database  # type: ignore[no-any-return]

    def dense_queries(self, ranking: Any) -> NDArray[np.float32]:
        """``"dense"`` through a ``global_source``: its vectors of the queries."""
        if self.global_source_ is None or self.global_source_.queries is None:
            raise InputError(f"method {self.config.name}: no global_source to give dense vectors")
        return self.global_source_.queries  # type: ignore[no-any-return]

    def use_vocabulary(self: Self, path: str | Path) -> Self:
        """Use an already trained vocabulary file instead of :meth:`fit`."""
        self.vocab_path_ = Path(path)
        return self

    def provenance(self) -> dict[str, object]:
        if self.vocab_path_ is None:
            return {}
        voc = load_vocabulary(self.vocab_path_, self.config.features)
        return {
            "vocabulary": voc.describe(),
            "vocabulary_path": str(self.vocab_path_),
            "trained_on": self.trained_on_,
        }

    def index_parts(self, bench: Benchmark, ctx: RunContext) -> WordedParts:
        """Features of every part of ``bench`` and words of its index (names images without features)."""
        if self.vocab_path_ is None:
            raise InputError(f"method {self.config.name}: fit (or use_vocabulary) before index")
        parts = describe_and_assign(bench, self.config.features, self.vocab_path_, self.k, ctx)
        self.empty_ = parts.empty()
        if self.empty_.any():
            names = [n for _, n in parts.index_parts]
            # Not a fault: a featureless image (blank sky, a flat wall) gives the detector no
            # keypoint, has no word and so no score; it ranks last, as no official protocol's
            # list could retrieve it. Damaged images are named by verify, not here.
            log.info(
                "%d database image(s) have no features (the detector found no keypoint: a "
                "featureless image, not an error) and rank last, e.g. %s",
                int(self.empty_.sum()),
                ", ".join(names[i] for i in np.flatnonzero(self.empty_)[:5]),
            )
        self._parts = parts
        return parts

    def index_folder(
        self, bench: Benchmark, parts: WordedParts, ctx: RunContext, kind: str
    ) -> Path:
        """The cache folder of an on-disk index of ``kind`` (``postings``, ``asmk-lists``) over
        ``parts``: keyed by the method's settings, the vocabulary file's digest and the indexed
        parts, so another vocabulary or distractor set is another folder."""
        key = json_digest(
            {
                "method": self.config.digest(),
                "vocabulary": parts.vocabulary.file_digest_,
                "index": [list(p) for p in parts.index_parts],
            },
            16,
        )
        return refuse_linked_folder(
            Path(ctx.cache) / dataset_key(bench) / kind / key, below=Path(ctx.cache)
        )

    def lists_binding(self, parts: WordedParts, **inputs: object) -> dict[str, object]:
        """What an on-disk index over ``parts`` stands for (recorded in its folder and checked
        when a rerun opens it): the method's settings, the vocabulary's content digest and, per
        indexed part, its images, their features (the store's checksums) and their words (the
        words file's content digest), plus the family's own ``inputs`` (content digests)."""
        index = {}
        for part in ("database", "distractors"):
            if part not in parts.words:
                continue
            names, words = parts.names[part], parts.words[part]
            index[part] = {
                "names": json_digest(names),
                "features": parts.stores[part].features_digest(names),
                "words": words.source.digest
                if words.source is not None
                else arrays_digest({"offsets": words.offsets, "words": words.words}),
            }
        return {
            "method": self.config.digest(),
            "vocabulary": parts.vocabulary.file_digest_,
            "index": index,
            **inputs,
        }

    def reuse_lists(
        self,
        ctx: RunContext,
        kind: str,
        folder: StoreFolder,
        open_lists: Callable[[], T],
        build_lists: Callable[[], T],
    ) -> T:
        """The on-disk index in ``folder``: opened when a rerun finds it built for the same
        binding (:meth:`lists_binding`, checked by ``open_lists``) and intact, else built (with a
        warning when a check failed); recorded as the step ``kind`` (a hit when opened)."""
        lists, opened = open_or_build(folder, open_folder=open_lists, build=build_lists)
        ctx.record_step(kind, hit=opened)
        return lists

    def indexed_parts(self, bench: Benchmark) -> WordedParts:
        """The parts :meth:`index_parts` made for ``bench`` (refused for another benchmark)."""
        if self._parts is None or self._parts.bench_key != dataset_key(bench):
            raise InputError(f"method {self.config.name}: index {bench.id} before searching it")
        return self._parts

    def warn_empty_queries(self, parts: WordedParts) -> None:
        """Name the query crops without features (their lists are in index order)."""
        names = parts.names["queries"]
        none = [n for n, c in zip(names, parts.words["queries"].counts, strict=True) if c == 0]
        if none:
            log.warning(
                "%d query crop(s) have no features, their lists are in index order: %s",
                len(none),
                ", ".join(none[:5]),
            )

    def verify(
        self,
        ranks: NDArray[np.int64],
        r: int,
        ctx: RunContext,
        settings: Verification,
        *,
        rows: dict[int, NDArray[np.int64]] | None = None,
        stage: str = "spatial",
        query_part: str = "queries",
    ) -> list[VerifiedList]:
        """Spatially verify each query's top ``r`` (or, with ``rows``, those lists only, in order).

        ``query_part``: whose images the rows of ``ranks`` are (``database``: database images
        against their neighbours).
        """
        assert self._parts is not None
        job = short_list_verifier(self._parts, settings, query_part)
        names = self._parts.names[query_part]
        return verify_ranked(job, names, ranks, r, ctx, rows=rows, stage=stage)
