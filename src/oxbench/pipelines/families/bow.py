"""The bag-of-words family: RootSIFT, a large vocabulary, tf-idf, spatial re-ranking, query expansion.

Philbin et al. 2007 / 2008, Arandjelovic & Zisserman 2012. :class:`BowConfig` holds the settings,
:class:`BagOfWords` runs them through the method interface over the shared steps
(:mod:`oxbench.pipelines.steps`): ``fit`` trains (or reuses) the vocabulary on the training set's
database features; ``index`` describes the benchmark's database (and distractors), assigns visual
words and builds the tf-idf inverted file; ``search`` describes the query crops, ranks the index,
spatially verifies the top R and expands the queries as the config says. The presets of the family
are registered at the end of this module.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import arrays_digest
from oxbench.datasets.base import Benchmark
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.features.sift import SiftConfig
from oxbench.index.footprint import Footprint, array_bytes
from oxbench.index.inverted import (
    ASSIGNMENT_SPEC,
    HardAssignment,
    InvertedFile,
    SoftAssignment,
    bow_matrix,
    soft_assignment_weights,
)
from oxbench.index.postings import CompressedPostings, lists_folder
from oxbench.pipelines.method import MethodConfig, Ranking, RunContext
from oxbench.pipelines.presets import register_method
from oxbench.pipelines.quantising import QuantisingMethod
from oxbench.pipelines.rerankers import Pipeline
from oxbench.pipelines.steps import LocalQuantisation, Words, last_if_empty
from oxbench.pipelines.steps.footprint import local_footprint, local_ram_per_image
from oxbench.refinement.spatial import Verification
from oxbench.schema import setting

log = logging.getLogger(__name__)

#: Images whose term frequencies and vectors a build holds at once (the in-RAM build's chunks, and
#: the streamed build's with ``inverted_file=mapped`` without query expansion or augmentation).
BUILD_CHUNK_IMAGES = 2048


@dataclass(frozen=True)
class BowConfig(MethodConfig, LocalQuantisation, Pipeline):
    """The settings of a RootSIFT bag-of-words method.

    Features and vocabulary (``vocabulary.*``) are the shared settings of
    :class:`~oxbench.pipelines.steps.settings.LocalQuantisation`, the stages and their settings
    the :class:`~oxbench.pipelines.rerankers.Pipeline`'s; the family adds:

    Attributes:
        name: preset name.
        assignment: ``hard``, or ``soft`` (:class:`~oxbench.index.inverted.SoftAssignment`:
            each database feature counts for its ``assignment.k`` nearest words with Gaussian
            weights of ``assignment.sigma2``, and tf-idf is computed on these soft counts; query
            features stay hard-assigned, Philbin et al. 2008).
        burst: ``sqrt`` (damp repeated words) or ``none``.
        idf: tf-idf weighting.
        inverted_file: ``memory`` (the scipy inverted file, its two sparse copies in RAM) or
            ``mapped``: the posting lists written to the cache compressed, as delta + variable-byte ids
            and ``float32`` weights (:class:`~oxbench.index.postings.CompressedPostings`) and
            memory-mapped at query time, the same scores exactly; the database vectors stay in
            RAM only when query expansion needs them.
        rerank: the stages after the first ranking (:class:`~oxbench.pipelines.rerankers.Pipeline`):
            ``spatial`` (settings ``spatial.*``), then query expansion from verified images
            (``aqe-verified`` / ``dqe-verified``, settings ``aqe-verified.*``,
            ``dqe-verified.*``); ``dba-verified`` augments the database at index time from
            spatially verified neighbours (settings ``dba-verified.*``).
    """

    family: ClassVar[str] = "bow"

    name: str
    assignment: HardAssignment | SoftAssignment = setting(
        spec=ASSIGNMENT_SPEC,
        default_factory=HardAssignment,
        doc="database words per feature (an assignment kind)",
    )
    burst: Literal["none", "sqrt"] = setting(
        "sqrt", S.Choice("sqrt", "none"), doc="burstiness damping"
    )
    idf: bool = setting(True, S.Bool(), doc="tf-idf weighting")
    inverted_file: Literal["memory", "mapped"] = setting(
        "memory",
        S.Choice("memory", "mapped", renamed={"compressed": "mapped"}),
        doc="posting lists in RAM, or compressed on disk (memory-mapped)",
    )

    shorthands: ClassVar[Mapping[str, str]] = LocalQuantisation.SHORTHANDS
    renamed: ClassVar[Mapping[str, str]] = {
        **LocalQuantisation.RENAMED_VOCABULARY,
        "soft_k": "assignment.k (with assignment=soft)",
        "soft_sigma2": "assignment.sigma2 (with assignment=soft)",
    }

    def __post_init__(self) -> None:
        self.check_local_settings(self.name)
        self.build_stages(BagOfWords.capabilities)  # a stage the family cannot serve: one line

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """SIFT (OpenCV) and the vocabulary's k-means and assignment (faiss)."""
        return (("cv2", "classic"), ("faiss", "classic"))

    def build(self) -> BagOfWords:
        return BagOfWords(self)

    def ram_bytes_per_image(self) -> int | None:
        """At most: every image at the features cap (:meth:`ram_bytes_per_feature` each), plus
        the image's words offset (the words are memory-mapped)."""
        cap = getattr(self.features, "n_features", 0)
        per_feature = self.ram_bytes_per_feature()
        return None if not cap or per_feature is None else local_ram_per_image(cap, per_feature)

    def ram_bytes_per_feature(self) -> float | None:
        """At the build's peak, per database feature: a posting per assigned word, and three
        8-byte copies of every posting (the weighted chunks, their stacked rows, the posting
        lists; measured 21.2 B a posting, 16.1 kept: bench/README.md, "Estimates"), of which
        the in-RAM inverted file keeps two. The streamed compressed build holds one chunk of
        images at a time: nothing per feature."""
        return 0.0 if self.streamed_build else 3 * 8 * self.assignment.words

    @property
    def streamed_build(self) -> bool:
        """The index is built in chunks of images into compressed lists (nothing reads the
        database vectors: no query expansion, no augmentation)."""
        return self.inverted_file == "mapped" and not self.reads_vectors


def term_frequencies(  # noqa: ANN201
    method: BowConfig,
    words: Words,
    names: list[str],
    n_words: int,
    *,
    side: Literal["database", "query"],
):
    """Term frequencies ``[n_images, n_words]`` of images on one ``side`` (``database`` or ``query``).

    With ``assignment=soft`` a database feature counts for its ``assignment.k`` nearest words with
    Gaussian weights summing to 1 (:func:`~oxbench.index.inverted.soft_assignment_weights`); the
    query's features stay hard-assigned, as in Philbin et al. 2008 (soft-assigning one side already
    recovers the matches across cell borders, and the query's vector stays as sparse as it was).
    """
    ws, wts = [], []
    for n in names:
        w, d = words.of(n)
        soft = method.assignment
        if isinstance(soft, SoftAssignment) and side == "database":
            k = min(soft.k, w.shape[1])
            ws.append(w[:, :k])
            wts.append(soft_assignment_weights(d[:, :k], soft.sigma2))
        else:
            ws.append(w[:, 0])
            wts.append(np.ones(len(w), np.float32))
    return bow_matrix(ws, n_words, wts)


class BagOfWords(QuantisingMethod):
    """A :class:`BowConfig` through the method interface (see the module docstring)."""

    config: BowConfig

    def __init__(self, config: BowConfig) -> None:
        super().__init__(config)
        self._ivf: InvertedFile | None = None
        self._postings: CompressedPostings | None = None
        self.dba_neighbours_: NDArray[np.int64] | None = None

    @property
    def k(self) -> int:
        """Words assigned per feature: the soft-assignment ``k``, or the query-side multiple assignment."""
        m = self.config
        return max([m.assignment.words, *(stage.query_words for stage in self.stages)])

    def index(self, bench: Benchmark, ctx: RunContext) -> BagOfWords:
        m = self.config
        parts = self.index_parts(bench, ctx)
        n_words = parts.vocabulary.n_words
        self._postings = None
        if m.streamed_build:
            self._index_streamed(
                bench, parts, ctx
            )  # nothing reads the database vectors: never hold them
            return self
        with ctx.timed("index"):  # in chunks, as the streamed build: never every image's tf
            self._ivf = InvertedFile(n_words, idf=m.idf, burst=m.burst).fit_chunks(
                lambda: self._tf_chunks(parts)
            )
        self.prepare_pipeline(bench, ctx)  # DBA: before compression
        if m.inverted_file == "mapped":
            self._compress(bench, parts, ctx)
        return self

    def _tf_chunks(self, parts: Any) -> Iterator[Any]:
        """The index's term frequencies (database, then distractors) in chunks of
        :data:`BUILD_CHUNK_IMAGES` images."""
        m, n_words = self.config, parts.vocabulary.n_words
        for part in ("database", "distractors"):
            names = parts.names.get(part, [])
            for a in range(0, len(names), BUILD_CHUNK_IMAGES):
                yield term_frequencies(
                    m,
                    parts.words[part],
                    names[a : a + BUILD_CHUNK_IMAGES],
                    n_words,
                    side="database",
                )

    def _index_streamed(self, bench: Benchmark, parts: Any, ctx: RunContext) -> None:
        """The compressed inverted file built from the words in chunks of :data:`BUILD_CHUNK_IMAGES`
        images, twice over (idf, then the weighted vectors' posting lists): what it holds at once
        is one chunk's term frequencies and vectors and one block of lists, at any index size."""
        m, n_words = self.config, parts.vocabulary.n_words

        def chunks() -> Iterator[Any]:
            return self._tf_chunks(parts)

        with ctx.timed("index"):
            ivf = InvertedFile(n_words, idf=m.idf, burst=m.burst).fit_idf(chunks())
            folder = self.index_folder(bench, parts, ctx, "postings")
            binding = self.lists_binding(parts)
            self._postings = self.reuse_lists(
                ctx,
                "postings",
                lists_folder(folder),
                lambda: CompressedPostings.open(folder, stands_for=binding),
                lambda: CompressedPostings.build(
                    (ivf.transform(tf) for tf in chunks()), n_words, folder, stands_for=binding
                ),
            )
        self._ivf = ivf

    def _compress(self, bench: Benchmark, parts: Any, ctx: RunContext) -> None:
        """Write the posting lists compressed and memory-map them; drop the sparse copies (the
        database vectors are kept when query expansion reads them)."""
        ivf = self._ivf
        assert ivf is not None and ivf.postings_ is not None
        with ctx.timed("index"):
            folder = self.index_folder(bench, parts, ctx, "postings")
            p = ivf.postings_.tocsr()
            binding = {"postings": arrays_digest({"i": p.indptr, "j": p.indices, "x": p.data})}
            self._postings = self.reuse_lists(
                ctx,
                "postings",
                lists_folder(folder),
                lambda: CompressedPostings.open(folder, stands_for=binding),
                lambda: CompressedPostings.write(p, folder, stands_for=binding),
            )
        ivf.postings_ = None
        if not self.config.reads_vectors:
            ivf.db_vectors_ = None

    def footprint(self) -> Footprint | None:
        """The inverted file's two sparse copies (database rows, posting lists) and the words in
        RAM; feature stores and words files on disk; idf and vocabulary fixed."""
        if self._ivf is None or self._parts is None:
            return None
        ivf = self._ivf
        ram = {"postings": array_bytes(ivf.postings_), "db_vectors": array_bytes(ivf.db_vectors_)}
        out = local_footprint(
            self._parts, self.vocab_path_, ram=ram, fixed_ram={"idf": array_bytes(ivf.idf_)}
        )
        if (
            self._postings is not None
        ):  # the lists on disk, memory-mapped; only their offsets in RAM (fixed)
            cp = self._postings
            out = dataclasses.replace(
                out,
                ram={k: v for k, v in out.ram.items() if k != "postings"},
                disk={**out.disk, "postings": cp.nbytes - cp.offsets_bytes},
                fixed_ram={**out.fixed_ram, "postings offsets": cp.offsets_bytes},
            )
        return out

    def verified_neighbours(
        self, r: int, ctx: RunContext, settings: Verification, *, block: int = 1024
    ) -> NDArray[np.int64]:
        """``[n_index, r]`` each index image's spatially verified neighbours (``-1``: none).

        Each image's vector ranks the others (itself and featureless images excluded, ties to the
        lower index); its top ``r`` are verified, as ``settings`` say, with the image as the query.
        """
        assert self._ivf is not None and self._parts is not None and self.empty_ is not None
        db = self._ivf.db_vectors_
        assert db is not None
        n, r = db.shape[0], min(r, max(db.shape[0] - 1, 1))
        top = np.zeros((n, r), np.int64)
        for a in range(0, n, block):
            s = self._ivf.scores_of_vectors(db[a : a + block])
            s[np.arange(s.shape[0]), np.arange(a, a + s.shape[0])] = -np.inf
            s[:, self.empty_] = -np.inf
            top[a : a + s.shape[0]] = np.argsort(-s, axis=1, kind="stable")[:, :r]
        out = np.full((n, r), -1, np.int64)
        offset = 0
        for part in ("database", "distractors"):
            names = self._parts.names.get(part)
            if not names:
                continue
            rows = {j: top[offset + j] for j in range(len(names)) if not self.empty_[offset + j]}
            done = self.verify(
                top, 0, ctx, settings, rows=rows, stage=f"dba_spatial_{part}", query_part=part
            )
            for j, res in zip(rows, done, strict=True):
                out[offset + j, : len(res.verified)] = res.verified
            offset += len(names)
        self.dba_neighbours_ = out
        return out

    def use_database(self, database: Any) -> None:
        """Replace the tf-idf database vectors (database-side augmentation)."""
        assert self._ivf is not None
        self._ivf.use_database(database)

    def first_ranking(self, bench: Benchmark, ctx: RunContext) -> tuple[BagOfWords, Ranking]:
        parts = self.indexed_parts(bench)
        m, ivf = self.config, self._ivf
        assert ivf is not None
        with ctx.timed("assign"):
            q_words = parts.assign(bench, "queries", ctx)
        with ctx.timed("search"):
            q_tf = term_frequencies(
                m, q_words, parts.names["queries"], parts.vocabulary.n_words, side="query"
            )
            q_vecs = ivf.transform(q_tf)
            scores, ranks = self.rank(q_vecs)
        self.warn_empty_queries(parts)
        info: dict[str, object] = {
            **self.index_facts_,
            "n_index": len(parts.index_parts),
            "features_per_image": float(np.mean(parts.words["database"].counts))
            if parts.names["database"]
            else 0.0,
        }
        return self, Ranking(ranks, scores, q_vecs, info=info)

    # --- what the re-ranking stages use (RerankSpace) ----------------------------------------------
    capabilities = frozenset({"vectors", "local", "augment"})

    @property
    def database(self) -> Any:
        """The tf-idf database vectors (sparse rows)."""
        assert self._ivf is not None and self._ivf.db_vectors_ is not None
        return self._ivf.db_vectors_

    def rank(self, queries: Any) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """``(scores, ranks)`` of tf-idf query vectors over the whole index (featureless images last)."""
        assert self._ivf is not None
        if self._postings is not None:
            scores = self._postings.scores_of_vectors(queries)
        else:
            scores = self._ivf.scores_of_vectors(queries)
        scores = (
            np.stack([last_if_empty(row, self.empty_) for row in scores]) if len(scores) else scores
        )
        ranks = ranks_from_scores(scores.T)
        return np.take_along_axis(scores, ranks, axis=1).astype(np.float32), ranks


# --- presets -------------------------------------------------------------------------------------

SV, QE, DQE, DBA = (
    ("spatial",),
    ("spatial", "aqe-verified"),
    ("spatial", "dqe-verified"),
    "dba-verified",
)
register_method(
    BowConfig("rootsift-bow"),
    about="RootSIFT bag of words, tf-idf inverted file (Sivic & Zisserman 2003; Philbin et al. 2007; RootSIFT: Arandjelovic & Zisserman 2012)",
)
register_method(
    BowConfig("rootsift-bow-sv", rerank=SV),
    about="RootSIFT BoW + spatial verification of the top 100 (Philbin et al. 2007)",
)
# the same ranking from compressed, memory-mapped posting lists: the +1M-sized variant (docs/scale.md)
register_method(
    BowConfig("rootsift-bow-sv-compact", rerank=SV, inverted_file="mapped"),
    about="RootSIFT BoW + spatial verification from compressed, memory-mapped posting lists: the same ranking at +1M scale (Philbin et al. 2007)",
)
register_method(
    BowConfig("rootsift-bow-sv-qe", rerank=QE),
    about="RootSIFT BoW + spatial verification + AQE from verified images (Chum et al. 2007)",
)
register_method(
    BowConfig("rootsift-bow-sv-dqe", rerank=DQE),
    about="RootSIFT BoW + spatial verification + discriminative query expansion (Arandjelovic & Zisserman 2012)",
)
register_method(
    BowConfig("rootsift-bow-dba-sv-dqe", rerank=(DBA, *DQE)),
    about="RootSIFT BoW + database-side augmentation + spatial verification + DQE (Arandjelovic & Zisserman 2012)",
)
register_method(
    BowConfig(
        "rootsift-bow-sv+vlad-dfs",
        rerank=("spatial", "diffusion-verified"),
        global_source="rootsift-vlad-w",
    ),
    about="hybrid: RootSIFT BoW + SV, then diffusion over whitened VLAD started from the verified images (after Radenovic et al. 2018)",
)
register_method(
    BowConfig("rootsift-bow-sa", assignment=SoftAssignment()),
    about="RootSIFT BoW with soft assignment on the database side (Philbin et al. 2008)",
)
register_method(
    BowConfig("rootsift-bow-sa-sv", assignment=SoftAssignment(), rerank=SV),
    about="RootSIFT BoW, soft assignment + spatial verification (Philbin et al. 2008)",
)
register_method(
    BowConfig("rootsift-bow-sa-sv-qe", assignment=SoftAssignment(), rerank=QE),
    about="RootSIFT BoW, soft assignment + spatial verification + AQE (Philbin et al. 2008)",
)
register_method(
    BowConfig(
        "sift-bow-sv",
        features=SiftConfig(descriptor="sift", max_side=1024, n_features=4000),
        rerank=SV,
    ),
    about="SIFT (not RootSIFT) BoW + spatial verification of the top 100 (Philbin et al. 2007)",
)
