"""Hamming embedding with weak geometric consistency over RootSIFT (Jegou, Douze & Schmid, ECCV 2008).

A bag of words whose matches are filtered inside each word: every feature carries a 64-bit
signature of where it lies in its word's cell (:class:`oxbench.index.hamming.HammingEmbedding`:
a seeded random orthogonal projection and per-word medians learned on the training set), two
features match when they share a word and their signatures are within ``he.ht`` bits, and a match
weighs ``idf^2 exp(-h^2 / he.sigma^2)`` (Jegou et al., IJCV 2010; ``he.weighting=none``: idf^2
only). Weak geometric consistency (``wgc``) then keeps, per image, only the matches that agree on
one rotation and one scale change (the smaller maximum of the orientation- and log-scale-difference
histograms, :func:`oxbench.index.hamming.wgc_scores`). Scores are normalised by the tf-idf norms of
both images (:class:`oxbench.index.hamming.HammingIndex` in RAM, or with
``inverted_file=mapped`` the same postings and scores in per-word lists on disk, memory-mapped and
built by chunks of images: :class:`oxbench.index.he_file.HammingInvertedFile`).

``fit`` trains (or reuses) the vocabulary of the shared step and learns the embedding on the
training set's database features (cached under ``<cache>/hamming``, keyed by the vocabulary
file); ``index`` signs every database feature and builds the postings; ``search`` scores the
query crops. The re-ranking stages are the shared ones: spatial verification of the short list,
and query expansion from verified images, which expands and ranks again in the tf-idf space of
the same words (the family offers the tf-idf vectors as its ``vectors``, built only when such a
stage reads them; the expanded query has no signatures). Presets are registered at the end of
this module.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import CorruptCache, entry_lock, lock_path
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.features.local import training_extractor
from oxbench.fileio import json_digest, remove_stale_temps
from oxbench.index.footprint import Footprint, array_bytes
from oxbench.index.hamming import (
    WGC_SPEC,
    HammingEmbedding,
    HammingIndex,
    HeSettings,
    Wgc,
    WgcOff,
)
from oxbench.index.he_file import HammingInvertedFile, HeEntries, in_ram_index, lists_folder
from oxbench.index.inverted import InvertedFile, bow_matrix
from oxbench.pipelines.method import MethodConfig, Ranking, RunContext
from oxbench.pipelines.presets import register_method
from oxbench.pipelines.quantising import QuantisingMethod
from oxbench.pipelines.rerankers import Pipeline
from oxbench.pipelines.steps import (
    LocalQuantisation,
    dataset_key,
    last_if_empty,
    load_vocabulary,
    open_store,
    part_names,
    training_descriptors,
)
from oxbench.pipelines.steps.footprint import local_footprint, local_ram_per_image
from oxbench.schema import setting

log = logging.getLogger(__name__)

#: Images whose features are signed and written at a time by the build.
INDEX_CHUNK = 2048
#: The in-RAM build's peak per posting (:meth:`HeConfig.ram_bytes_per_feature`).
HE_BUILD_BYTES_PER_FEATURE = 120.0


@dataclass(frozen=True)
class HeConfig(MethodConfig, LocalQuantisation, Pipeline):
    """Hamming embedding (+ weak geometric consistency) over RootSIFT; features, vocabulary and
    spatial verification are the shared :class:`~oxbench.pipelines.steps.settings.LocalQuantisation`
    settings.

    Attributes:
        name: preset name.
        he: the embedding and its matching (:class:`~oxbench.index.hamming.HeSettings`:
            ``he.ht``, ``he.weighting``, ``he.sigma``, ``he.seed``, ``he.train_max``).
        idf: tf-idf weighting (``idf^2`` per match).
        wgc: weak geometric consistency on orientation and log-scale differences: ``off`` or
            ``on`` (:class:`~oxbench.index.hamming.Wgc`: ``wgc.angle_bins``, ``wgc.scale_bins``,
            ``wgc.scale_range``).
        inverted_file: ``memory`` (the postings in RAM, 24 bytes each) or ``mapped`` (per-word
            lists on disk, 20 bytes a posting, memory-mapped and built by chunks of images; the
            same scores: :mod:`oxbench.index.he_file`).
        rerank: the stages after the first ranking: ``spatial``, then ``aqe-verified`` (query
            expansion from verified images, in tf-idf space), as in
            :class:`~oxbench.pipelines.families.bow.BowConfig`.
    """

    family: ClassVar[str] = "he"

    name: str
    he: HeSettings = field(default_factory=HeSettings)
    idf: bool = setting(True, S.Bool(), doc="tf-idf weighting")
    wgc: WgcOff | Wgc = setting(
        spec=WGC_SPEC, default_factory=WgcOff, doc="weak geometric consistency (a wgc kind)"
    )
    inverted_file: Literal["memory", "mapped"] = setting(
        "memory",
        S.Choice("memory", "mapped"),
        doc="postings in RAM, or per-word lists on disk (memory-mapped)",
    )

    shorthands: ClassVar[Mapping[str, str]] = LocalQuantisation.SHORTHANDS
    renamed: ClassVar[Mapping[str, str]] = {
        **LocalQuantisation.RENAMED_VOCABULARY,
        **{f"he_{n}": f"he.{n}" for n in ("ht", "weighting", "sigma", "seed", "train_max")},
        **{
            f"wgc_{n}": f"wgc.{n} (with wgc=on)"
            for n in ("angle_bins", "scale_bins", "scale_range")
        },
    }

    def __post_init__(self) -> None:
        self.check_local_settings(self.name)
        self.build_stages(HammingEmbeddingMethod.capabilities)  # unservable stage: one line

    def inapplicable(self, setting: str) -> str | None:
        """``he.sigma`` weighs matches only with ``he.weighting=gaussian``."""
        if setting == "he.sigma" and self.he.weighting != "gaussian":
            return (
                f"method {self.name}: he.sigma weighs matches only with he.weighting=gaussian "
                f"(it is {self.he.weighting})"
            )
        return None

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """SIFT (OpenCV) and the vocabulary's k-means and assignment (faiss)."""
        return (("cv2", "classic"), ("faiss", "classic"))

    def build(self) -> HammingEmbeddingMethod:
        return HammingEmbeddingMethod(self)

    def ram_bytes_per_image(self) -> int | None:
        """At most: every image at the features cap (:meth:`ram_bytes_per_feature` each)."""
        cap = getattr(self.features, "n_features", 0)
        return local_ram_per_image(cap, self.ram_bytes_per_feature()) if cap else None

    def ram_bytes_per_feature(self) -> float:
        """At the build's peak, per database feature: the in-RAM postings' build, measured at
        119.5 B a posting (bench/README.md, "100K and 1M images": 11,887 MiB for 104.3M postings,
        built as the family builds them), of which 24 are kept; nothing with
        ``inverted_file=mapped`` (one chunk of images at a time). Query expansion adds the tf-idf
        inverted file (bag of words' 3 x 8 bytes a posting)."""
        own = 0.0 if self.inverted_file == "mapped" else HE_BUILD_BYTES_PER_FEATURE
        return own + (3 * 8 if self.reads_vectors else 0)


def embedding_path(cache: Path, vocab_path: Path, config: HeConfig, train: Benchmark) -> Path:
    """Where the embedding learned for ``vocab_path`` on ``train`` is cached."""
    key = {
        "vocabulary": vocab_path.name,
        "train": dataset_key(train),
        "seed": config.he.seed,
        "max": config.he.train_max,
        "features": config.features.to_dict(),
    }
    return Path(cache) / "hamming" / f"{vocab_path.stem}-he-{json_digest(key, 12)}.npz"


def _log2_scales(kp: NDArray[np.float32]) -> NDArray[np.float32]:
    return np.log2(np.maximum(kp[:, 2].astype(np.float64), 1e-6)).astype(np.float32)


class HammingEmbeddingMethod(QuantisingMethod):
    """A :class:`HeConfig` through the method interface (see the module docstring)."""

    config: HeConfig

    def __init__(self, config: HeConfig) -> None:
        super().__init__(config)
        self.embedding_: HammingEmbedding | None = None
        self.index_: HammingIndex | HammingInvertedFile | None = None
        self._ivf: InvertedFile | None = None

    def fit(self, train: Benchmark | None, ctx: RunContext) -> HammingEmbeddingMethod:
        super().fit(train, ctx)
        assert train is not None and self.vocab_path_ is not None
        path = embedding_path(ctx.cache, self.vocab_path_, self.config, train)
        remove_stale_temps(path.parent)
        with entry_lock(lock_path(path), what=f"the Hamming embedding {path}"):
            if path.exists():
                try:
                    self.embedding_ = HammingEmbedding.load(path)
                    ctx.record_step("hamming_embedding", hit=True)
                    return self
                except CorruptCache as exc:
                    log.warning("%s; learning it again", exc)
            with ctx.timed("hamming_embedding"):
                m = self.config
                store = open_store(ctx.cache, train, training_extractor(m.features), "database")
                x = training_descriptors(
                    store, part_names(train, "database"), m.he.train_max, seed=m.he.seed
                )
                voc = load_vocabulary(self.vocab_path_, m.features)
                words = voc.kneighbors(x, 1)[1][:, 0]
                self.embedding_ = HammingEmbedding(voc.n_words, seed=m.he.seed).fit(x, words)
                path.parent.mkdir(parents=True, exist_ok=True)
                self.embedding_.save(path)
                self.embedding_.file_digest_ = HammingEmbedding.load(path).file_digest_
            ctx.record_step("hamming_embedding", hit=False)
        return self

    def features_of(self, part: str, name: str) -> tuple[NDArray, NDArray, NDArray, NDArray]:
        """``(words, signatures, angles, log2 scales)`` of one image's features."""
        assert self._parts is not None and self.embedding_ is not None
        store = self._parts.stores[part]
        feats = store.get_raw(name)
        kp, raw = feats.keypoints, feats.descriptors
        w = self._parts.words[part].of(name)[0][:, 0].astype(np.int64)
        sig = self.embedding_.signatures(store.config.finish(raw), w)
        return w, sig, kp[:, 3].astype(np.float32), _log2_scales(kp)

    def index(self, bench: Benchmark, ctx: RunContext) -> HammingEmbeddingMethod:
        if self.embedding_ is None:
            raise InputError(f"method {self.config.name}: fit before index")
        parts = self.index_parts(bench, ctx)
        n_words = parts.vocabulary.n_words
        with ctx.timed("index"):
            if self.config.inverted_file == "mapped":
                folder = self.index_folder(bench, parts, ctx, "he-lists")
                binding = self.lists_binding(parts, embedding=self.embedding_.file_digest_)
                self.index_ = self.reuse_lists(
                    ctx,
                    "he-lists",
                    lists_folder(folder),
                    lambda: HammingInvertedFile.open(folder, stands_for=binding),
                    lambda: HammingInvertedFile.build(
                        self._entries(parts.index_parts),
                        n_words,
                        folder,
                        idf=self.config.idf,
                        stands_for=binding,
                    ),
                )
            else:
                self.index_ = in_ram_index(
                    self._entries(parts.index_parts), n_words, idf=self.config.idf
                )
            if self.config.reads_vectors:  # query expansion ranks again in tf-idf space
                tf = bow_matrix(
                    [parts.words[p].of(nm)[0][:, 0] for p, nm in parts.index_parts], n_words
                )
                self._ivf = InvertedFile(n_words, idf=self.config.idf, burst="none").fit(tf)
        self.prepare_pipeline(bench, ctx)
        return self

    def footprint(self) -> Footprint | None:
        """The postings (in RAM, or their per-image norms with the lists on disk), the tf-idf
        file when query expansion needs it, and the words; feature stores and words on disk."""
        index = self.index_
        if index is None or self._parts is None:
            return None
        fixed = {"idf_offsets": array_bytes([index.idf_, index.offsets_])}
        if isinstance(index, HammingInvertedFile):
            ram = {"norms": array_bytes(index.norms_)}
        else:
            ram = {
                "postings": array_bytes(
                    [index.images_, index.signatures_, index.angles_, index.log_scales_]
                ),
                "norms": array_bytes(index.norms_),
            }
        if self._ivf is not None:
            ram["tf_idf"] = array_bytes([self._ivf.postings_, self._ivf.db_vectors_])
        out = local_footprint(self._parts, self.vocab_path_, ram=ram, fixed_ram=fixed)
        if isinstance(index, HammingInvertedFile):
            disk = index.disk_bytes - fixed["idf_offsets"] - ram["norms"]
            out = dataclasses.replace(out, disk={**out.disk, "he_lists": disk})
        return out

    def _entries(self, index_parts: list[tuple[str, str]]) -> Iterator[HeEntries]:
        """The indexed images' features, :data:`INDEX_CHUNK` images at a time."""
        for a in range(0, len(index_parts), INDEX_CHUNK):
            feats = [self.features_of(p, n) for p, n in index_parts[a : a + INDEX_CHUNK]]
            sizes = [len(f[0]) for f in feats]
            cols = [np.concatenate([f[j] for f in feats]) for j in range(4)]
            yield HeEntries(
                len(feats),
                np.repeat(np.arange(len(feats), dtype=np.int64), sizes),
                cols[0].astype(np.int64),
                cols[1].astype(np.uint64),
                cols[2].astype(np.float32),
                cols[3].astype(np.float32),
            )

    def first_ranking(
        self, bench: Benchmark, ctx: RunContext
    ) -> tuple[HammingEmbeddingMethod, Ranking]:
        parts = self.indexed_parts(bench)
        m, index, ivf = self.config, self.index_, self._ivf
        assert index is not None
        with ctx.timed("assign"):
            q_words = parts.assign(bench, "queries", ctx)
        names = parts.names["queries"]
        scores = np.zeros((len(names), index.n_images), np.float32)
        wgc = m.wgc if isinstance(m.wgc, Wgc) else Wgc()  # its bins are read only when it is on
        with ctx.timed("search"):
            for qi, name in enumerate(names):
                w, sig, ang, ls = self.features_of("queries", name)
                if len(w):
                    scores[qi] = index.scores(
                        w,
                        sig,
                        ang,
                        ls,
                        ht=m.he.ht,
                        sigma=m.he.sigma if m.he.weighting == "gaussian" else None,
                        wgc=isinstance(m.wgc, Wgc),
                        angle_bins=wgc.angle_bins,
                        scale_bins=wgc.scale_bins,
                        scale_range=wgc.scale_range,
                    )
            scores = (
                np.stack([last_if_empty(row, self.empty_) for row in scores])
                if len(scores)
                else scores
            )
            ranks = ranks_from_scores(scores.T)
            q_vecs = (
                ivf.transform(
                    bow_matrix([q_words.of(n)[0][:, 0] for n in names], parts.vocabulary.n_words)
                )
                if ivf is not None
                else None
            )
        self.warn_empty_queries(parts)
        info: dict[str, object] = {
            **self.index_facts_,
            "n_index": len(parts.index_parts),
            "he_ht": m.he.ht,
            "wgc": isinstance(m.wgc, Wgc),
        }
        ranking = Ranking(
            ranks, np.take_along_axis(scores, ranks, axis=1).astype(np.float32), q_vecs, info=info
        )
        return self, ranking

    # --- what the re-ranking stages use (RerankSpace) ----------------------------------------------
    capabilities = frozenset({"vectors", "local"})

    @property
    def database(self) -> Any:
        """The tf-idf database vectors (sparse rows) that query expansion averages."""
        assert self._ivf is not None and self._ivf.db_vectors_ is not None
        return self._ivf.db_vectors_

    def rank(self, queries: Any) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """``(scores, ranks)`` of tf-idf query vectors (an expanded query) by cosine similarity."""
        assert self._ivf is not None
        scores = self._ivf.scores_of_vectors(queries)
        scores = (
            np.stack([last_if_empty(row, self.empty_) for row in scores]) if len(scores) else scores
        )
        ranks = ranks_from_scores(scores.T)
        return np.take_along_axis(scores, ranks, axis=1).astype(np.float32), ranks


# --- presets -------------------------------------------------------------------------------------

SV, QE = ("spatial",), ("spatial", "aqe-verified")
register_method(
    HeConfig("rootsift-he"),
    about="RootSIFT Hamming embedding, 64-bit signatures (Jegou et al. 2008)",
)
register_method(
    HeConfig("rootsift-he-sv", rerank=SV),
    about="Hamming embedding + spatial verification (Jegou et al. 2008; Philbin et al. 2007)",
)
register_method(
    HeConfig("rootsift-he-sv-qe", rerank=QE),
    about="Hamming embedding + spatial verification + AQE from verified images (Jegou et al. 2008; Chum et al. 2007)",
)
register_method(
    HeConfig("rootsift-he-wgc", wgc=Wgc()),
    about="Hamming embedding + weak geometric consistency (Jegou et al. 2008)",
)
register_method(
    HeConfig("rootsift-he-wgc-sv", wgc=Wgc(), rerank=SV),
    about="HE + WGC + spatial verification (Jegou et al. 2008)",
)
register_method(
    HeConfig("rootsift-he-wgc-sv-qe", wgc=Wgc(), rerank=QE),
    about="HE + WGC + spatial verification + AQE (Jegou et al. 2008; Chum et al. 2007)",
)
