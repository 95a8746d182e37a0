"""ASMK over RootSIFT: aggregated selective match kernels (Tolias, Avrithis & Jegou, ICCV 2013).

An image is described per visual word: the residuals ``x - c_w`` of its features assigned to word
``w`` are summed and binarised by sign (one 128-bit code per word and image, the *aggregated*
binary residual). Two images are compared word by word over the words they share: with the
normalised Hamming similarity ``u = 1 - 2 h / 128`` of their codes, the selectivity function
``sigma_alpha(u) = u^alpha if u > tau else 0`` (``alpha = 3``, ``tau = 0``) keeps strong matches
and silences weak ones, and the sum is normalised by each image's number of words (idf optional).
Multiple assignment on the query side (its ``k`` nearest words) recovers matches across cell
borders, as in HOW + ASMK (Tolias et al., ECCV 2020), which uses the same kernel over learned
local features.

Two inverted files hold the database (``inverted_file``): ``memory``, the ``asmk`` package's
(one growing array per word in RAM, a Python callback per query word), and ``mapped``,
:class:`oxbench.index.asmk_file.AsmkInvertedFile` (contiguous per-word lists of packed codes and
image ids, on disk, memory-mapped; a query word's list scored with vectorised popcounts), which
gives the same scores (``tests/test_asmk_file.py``) and keeps a query under a second at a million
images (``bench/README.md``, "simulated_index.py").

The codebook is the classic pipeline's vocabulary (:func:`oxbench.pipelines.steps.step_vocabulary`,
trained on another dataset, refused for another descriptor or dimension); binarisation, the
inverted file and the kernel come from the maintained ``asmk`` package (``pip install
"oxbench[asmk]"``), imported when a run needs it. Residual aggregation is done here, vectorised
(the package's per-word Python loop is its slow part). ``rootsift-asmk-sv`` spatially re-ranks the
ASMK short list exactly as ``rootsift-bow-sv`` does (the shared verification step). The family is
composed from the shared steps (:mod:`oxbench.pipelines.steps`); its presets are registered at the
end of this module.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError, require
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.index.asmk_file import (
    AsmkEntries,
    AsmkInvertedFile,
    AsmkSettings,
    binarize_residuals,
    lists_folder,
)
from oxbench.index.footprint import Footprint, array_bytes
from oxbench.index.vocabulary import VocabularySettings
from oxbench.pipelines.method import MethodConfig, Ranking, RunContext
from oxbench.pipelines.presets import register_method
from oxbench.pipelines.quantising import QuantisingMethod
from oxbench.pipelines.rerankers import Pipeline
from oxbench.pipelines.steps import (
    LocalQuantisation,
    last_if_empty,
)
from oxbench.pipelines.steps.footprint import local_footprint, local_ram_per_image
from oxbench.schema import setting

log = logging.getLogger(__name__)

#: Images aggregated at once by the mapped build (one chunk's entries in RAM).
BUILD_CHUNK_IMAGES = 1024
#: Most queries scored together by the mapped inverted file (a float64 row of scores each).
QUERY_BATCH = 16
#: Bytes of score rows a batch may hold. A batch reads each word's list once for all its
#: queries, but once its rows leave the CPU's caches every add misses: measured with the
#: compiled kernel on simulated indexes (bench/README.md, "100K and 1M images"), batches of 4-8
#: rows (3-6 MB) were the fastest at 100K images and 16 (13 MB) slower than one at a time; at 1M
#: (8 MB a row) one query at a time took 0.25-0.32 CPU-s against ~1 s in a batch.
SCORE_ROWS_BYTES = 4 << 20


def query_batch(n_images: int) -> int:
    """Queries the mapped inverted file scores together over ``n_images`` images: as many rows
    of scores as :data:`SCORE_ROWS_BYTES` holds, 1 .. :data:`QUERY_BATCH`.

    Example:
        >>> query_batch(10_000), query_batch(100_000), query_batch(1_000_000)
        (16, 5, 1)
    """
    return max(1, min(QUERY_BATCH, SCORE_ROWS_BYTES // (8 * max(n_images, 1))))


@dataclass(frozen=True)
class AsmkConfig(MethodConfig, LocalQuantisation, Pipeline):
    """ASMK over RootSIFT; features and codebook (``vocabulary.*``) are the shared
    :class:`~oxbench.pipelines.steps.settings.LocalQuantisation` settings, the stages
    (``rerank=spatial``, ``spatial.*``) the :class:`~oxbench.pipelines.rerankers.Pipeline`'s.

    Attributes:
        name: preset name.
        asmk: the match kernel and the query's multiple assignment
            (:class:`~oxbench.index.asmk_file.AsmkSettings`: ``asmk.alpha``, ``asmk.tau``,
            ``asmk.query_ma``).
        idf: weight words by ``log(N / df)^2`` as the package does (HOW + ASMK: off).
        inverted_file: ``memory`` (the ``asmk`` package's, in RAM) or ``mapped`` (contiguous
            per-word lists on disk, memory-mapped: :mod:`oxbench.index.asmk_file`; same scores).
        vocabulary: as bag of words', but ``vocabulary.sample`` is ``None`` by default: the
            codebook is trained on every training descriptor, as the ``asmk`` package trains it
            (a number: a seeded sample of that many per word; bag-of-words' default is 32).
    """

    family: ClassVar[str] = "asmk"

    name: str
    asmk: AsmkSettings = field(default_factory=AsmkSettings)
    idf: bool = setting(False, S.Bool(), doc="idf weighting of words")
    inverted_file: Literal["memory", "mapped"] = setting(
        "memory",
        S.Choice("memory", "mapped", renamed={"package": "memory"}),
        doc="the asmk package's inverted file in RAM, or contiguous lists on disk (memory-mapped)",
    )
    vocabulary: VocabularySettings = field(
        default_factory=lambda: VocabularySettings(sample=None), kw_only=True
    )

    shorthands: ClassVar[Mapping[str, str]] = LocalQuantisation.SHORTHANDS
    renamed: ClassVar[Mapping[str, str]] = {
        **LocalQuantisation.RENAMED_VOCABULARY,
        "asmk_alpha": "asmk.alpha",
        "asmk_tau": "asmk.tau",
        "asmk_query_ma": "asmk.query_ma",
        "asmk_idf": "idf",
    }

    def __post_init__(self) -> None:
        self.check_local_settings(self.name)
        self.build_stages(Asmk.capabilities)  # a stage the family cannot serve: one line

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """SIFT (OpenCV), the codebook's k-means (faiss) and, for its inverted file, the ``asmk``
        package (not with ``inverted_file=mapped``)."""
        classic = (("cv2", "classic"), ("faiss", "classic"))
        return classic if self.inverted_file == "mapped" else (*classic, ("asmk", "asmk"))

    def build(self) -> Asmk:
        return Asmk(self)

    def ram_bytes_per_image(self) -> int | None:
        """At most: every image at the features cap, each feature its own word
        (:meth:`ram_bytes_per_feature`); the words are memory-mapped."""
        cap = getattr(self.features, "n_features", 0)
        return local_ram_per_image(cap, self.ram_bytes_per_feature()) if cap else None

    def ram_bytes_per_feature(self) -> float:
        """Each feature its own word: a 16-byte binary residual and an ``int64`` image id in the
        package's inverted file; with ``inverted_file=mapped`` the build holds one chunk of images
        and the lists are on disk: nothing per feature."""
        return 0.0 if self.inverted_file == "mapped" else 16 + 8


def aggregate_residuals(
    descriptors: NDArray[np.float32], words: NDArray[np.integer], centroids: NDArray[np.float32]
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Per-word sums of residuals of one image's features (each feature in all its words).

    Args:
        descriptors: ``[n, d]``.
        words: ``[n]`` or ``[n, k]`` word ids of each feature (multiple assignment: every listed
            word receives the feature's residual to that word).
        centroids: ``[K, d]`` the codebook.

    Returns:
        ``(residual sums [u, d], words [u])`` for the ``u`` distinct words, ascending.

    Example:
        >>> c = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
        >>> aggregate_residuals(np.array([[1.0, 0.0], [0.0, 1.0]], np.float32), np.array([0, 0]), c)
        (array([[1., 1.]], dtype=float32), array([0]))
    """
    w = np.asarray(words, dtype=np.int64)
    if w.ndim == 1:
        w = w[:, None]
    if w.shape[0] != descriptors.shape[0]:
        raise InputError(f"{descriptors.shape[0]} descriptors but {w.shape[0]} word rows")
    feature = np.repeat(np.arange(w.shape[0]), w.shape[1])
    flat = w.reshape(-1)
    if flat.size == 0:
        return np.zeros((0, descriptors.shape[1]), np.float32), np.zeros(0, np.int64)
    order = np.argsort(flat, kind="stable")
    flat, feature = flat[order], feature[order]
    residuals = descriptors[feature] - centroids[flat]
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]])
    return np.add.reduceat(residuals, starts, axis=0).astype(np.float32), flat[starts]


class Asmk(QuantisingMethod):
    """ASMK through the method interface (fit: codebook; index: binary aggregated residuals; search)."""

    config: AsmkConfig

    def __init__(self, config: AsmkConfig) -> None:
        super().__init__(config)
        self._asmk: tuple[Any, Any, NDArray[np.float32]] | None = None
        self._mapped: AsmkInvertedFile | None = None
        self._centroids: NDArray[np.float32] | None = None
        self._n_index = 0

    @property
    def k(self) -> int:
        """Words assigned per feature (the query's multiple assignment; the database uses the first)."""
        return max(self.config.asmk.query_ma, 1)

    def _aggregate(
        self, part: str, names: list[str], ma: int, hamming: Any, centroids: NDArray[np.float32]
    ):  # noqa: ANN202
        assert self._parts is not None
        codes, words, owners = [], [], []
        store, word_file = self._parts.stores[part], self._parts.words[part]
        for i, name in enumerate(names):
            raw = store.get_raw(name).descriptors
            w = word_file.of(name)[0][:, :ma]
            res, uw = aggregate_residuals(store.config.finish(raw), w, centroids)
            if len(uw):
                codes.append(
                    hamming.binarize_and_pack_2D(np.ascontiguousarray(res, dtype=np.float32))
                )
                words.append(uw)
                owners.append(np.full(len(uw), i, np.int64))
        return codes, words, owners

    def _entries(
        self, part: str, names: list[str], ma: int, centroids: NDArray[np.float32], offset: int = 0
    ) -> Iterator[AsmkEntries]:
        """The part's images' ASMK entries in chunks of :data:`BUILD_CHUNK_IMAGES` (codes packed
        by :func:`~oxbench.index.asmk_file.binarize_residuals`)."""
        assert self._parts is not None
        store, word_file = self._parts.stores[part], self._parts.words[part]
        for a in range(0, len(names), BUILD_CHUNK_IMAGES):
            chunk = names[a : a + BUILD_CHUNK_IMAGES]
            owners, words, codes = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], []
            for i, name in enumerate(chunk):
                raw = store.get_raw(name).descriptors
                res, uw = aggregate_residuals(
                    store.config.finish(raw), word_file.of(name)[0][:, :ma], centroids
                )
                owners.append(np.full(len(uw), i, np.int64))
                words.append(uw)
                codes.append(binarize_residuals(res.reshape(len(uw), centroids.shape[1])))
            yield AsmkEntries(
                len(chunk), np.concatenate(owners), np.concatenate(words), np.concatenate(codes)
            )

    def index(self, bench: Benchmark, ctx: RunContext) -> Asmk:
        parts = self.index_parts(bench, ctx)
        centroids = parts.vocabulary.centroids_
        assert centroids is not None
        self._centroids = centroids
        if self.config.inverted_file == "mapped":
            with ctx.timed("index"):

                def chunks() -> Iterator[AsmkEntries]:
                    for p in ("database", "distractors"):
                        if p in parts.names:
                            yield from self._entries(p, parts.names[p], 1, centroids)

                folder = self.index_folder(bench, parts, ctx, "asmk-lists")
                binding = self.lists_binding(parts)
                self._mapped = self.reuse_lists(
                    ctx,
                    "asmk-lists",
                    lists_folder(folder),
                    lambda: AsmkInvertedFile.open(folder, stands_for=binding),
                    lambda: AsmkInvertedFile.build(
                        chunks(),
                        parts.vocabulary.n_words,
                        centroids.shape[1],
                        folder,
                        use_idf=self.config.idf,
                        stands_for=binding,
                    ),
                )
                self._n_index = self._mapped.n_images
            self.prepare_pipeline(bench, ctx)
            return self
        require("asmk", "asmk")
        from asmk import hamming
        from asmk.inverted_file import IVF

        with ctx.timed("index"):
            codes, words, owners = [], [], []
            offset = 0
            for p in ("database", "distractors"):
                if p not in parts.names:
                    continue
                c, w, o = self._aggregate(p, parts.names[p], 1, hamming, centroids)
                codes += c
                words += w
                owners += [x + offset for x in o]
                offset += len(parts.names[p])
            ivf = IVF.initialize_empty(
                codebook_size=parts.vocabulary.n_words, use_idf=self.config.idf
            )
            if codes:
                ivf.add(np.concatenate(codes), np.concatenate(words), np.concatenate(owners))
            self._asmk = (ivf, hamming, centroids)
            self._n_index = offset
        self.prepare_pipeline(bench, ctx)
        return self

    def footprint(self) -> Footprint | None:
        """The ``asmk`` inverted file's arrays as allocated (binary residuals, image ids, counts,
        norms) and the words in RAM; feature stores and words files on disk."""
        if self._parts is None:
            return None
        if self._mapped is not None:
            lists = self._mapped  # the lists on disk, mapped; per image its norm in RAM
            out = local_footprint(
                self._parts,
                self.vocab_path_,
                ram={"norms": array_bytes(lists.norms_)},
                fixed_ram={"offsets_idf": lists.ram_bytes - 2 * array_bytes(lists.norms_)},
            )
            return dataclasses.replace(out, disk={**out.disk, "asmk_lists": lists.disk_bytes})
        if self._asmk is None:
            return None
        ivf = self._asmk[0]
        ram = {"inverted_file": array_bytes([ivf.ivf_vecs, ivf.ivf_image_ids, ivf.norm_factor])}
        fixed = {"counts_idf": array_bytes([ivf.counts, ivf.idf])}
        return local_footprint(self._parts, self.vocab_path_, ram=ram, fixed_ram=fixed)

    def first_ranking(self, bench: Benchmark, ctx: RunContext) -> tuple[Asmk, Ranking]:
        parts = self.indexed_parts(bench)
        m = self.config
        with ctx.timed("assign"):
            q_words = parts.assign(bench, "queries", ctx)
        names = parts.names["queries"]
        scores = np.zeros((len(names), self._n_index), np.float32)
        with ctx.timed("search"):
            nonempty = [i for i, n in enumerate(names) if q_words.of(n)[0].shape[0]]
            if self._mapped is not None:
                assert self._centroids is not None
                lists = self._mapped
                queried = [names[i] for i in nonempty]
                done = 0  # a batch of queries shares each word's list (scores as one by one)
                size = query_batch(lists.n_images)
                for e in self._entries("queries", queried, m.asmk.query_ma, self._centroids):
                    for a in range(0, e.n_images, size):
                        batch = [
                            (e.codes[e.owners == j], e.words[e.owners == j])
                            for j in range(a, min(a + size, e.n_images))
                        ]
                        rows = [nonempty[done + j] for j in range(a, a + len(batch))]
                        scores[rows] = lists.scores_of_queries(
                            batch, alpha=m.asmk.alpha, tau=m.asmk.tau
                        )
                    done += e.n_images
                words_per_image = lists.n_postings / max(lists.n_images, 1)
            else:
                assert self._asmk is not None
                from asmk import functional

                ivf, hamming, centroids = self._asmk
                codes, words, _ = self._aggregate(
                    "queries", names, m.asmk.query_ma, hamming, centroids
                )
                for qi, c, w in zip(nonempty, codes, words, strict=True):
                    scores[qi] = self._query_scores(ivf, hamming, functional, c, w)
                words_per_image = float(ivf.stats["vectors_per_image"])
            scores = (
                np.stack([last_if_empty(row, self.empty_) for row in scores])
                if len(scores)
                else scores
            )
            ranks = ranks_from_scores(scores.T)
        self.warn_empty_queries(parts)
        info: dict[str, object] = {
            **self.index_facts_,
            "n_index": len(parts.index_parts),
            "kernel": "asmk",
            "inverted_file": m.inverted_file,
            "words_per_image": words_per_image,
        }
        ranking = Ranking(
            ranks, np.take_along_axis(scores, ranks, axis=1).astype(np.float32), info=info
        )
        return self, ranking

    # --- what the re-ranking stages use (RerankSpace): local features only -------------------------
    capabilities = frozenset({"local"})
    database = None

    def rank(self, queries: Any) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        raise InputError(f"method {self.config.name}: ASMK offers no query vectors to rank again")

    def _query_scores(
        self, ivf: Any, hamming: Any, functional: Any, codes: NDArray, words: NDArray
    ) -> NDArray:
        m = self.config

        def similarity(qvec: NDArray, vecs: NDArray, image_ids: NDArray) -> tuple[NDArray, NDArray]:
            sim = 1.0 - 2.0 * hamming.hamming_cdist_packed(qvec.reshape(1, -1), vecs).squeeze(0)
            return functional.asmk_kernel(
                sim, image_ids, alpha=m.asmk.alpha, similarity_threshold=m.asmk.tau
            )

        ranked, values = ivf.search(codes, words, similarity_func=similarity, topk=None)
        out = np.zeros(self._n_index, np.float32)
        out[np.asarray(ranked, np.int64)] = values
        return out


# --- presets -------------------------------------------------------------------------------------

register_method(
    AsmkConfig("rootsift-asmk"),
    about="RootSIFT aggregated selective match kernel (Tolias et al. 2013)",
)
register_method(
    AsmkConfig("rootsift-asmk-sv", rerank=("spatial",)),
    about="ASMK + spatial verification (Tolias et al. 2013)",
)
# the 2018 revisit's hybrid rows: ASMK + SV, then diffusion over a global method's vectors started
# from the query's nearest images and its verified ones (pipelines/sources.py)
_DFS = ("spatial", "diffusion-verified")
register_method(
    AsmkConfig("rootsift-asmk-sv+vlad-dfs", rerank=_DFS, global_source="rootsift-vlad-w"),
    about="hybrid: ASMK + SV, then diffusion over whitened VLAD started from the verified images (the ASMK* + SP -> GeM + DFS row of Radenovic et al. 2018)",
)
register_method(
    AsmkConfig("rootsift-asmk-sv+gem-r101-dfs", rerank=_DFS, global_source="gem-r101+w"),
    about="hybrid: ASMK + SV, then diffusion over the published ResNet-101 GeM (a model file) from the verified images (Radenovic et al. 2018)",
)
