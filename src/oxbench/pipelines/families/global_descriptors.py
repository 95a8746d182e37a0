"""Global-descriptor methods: one vector per image, whitening, exact or FAISS search, QE, DBA, diffusion.

A :class:`GlobalConfig` describes the whole chain; :class:`GlobalDescriptors` runs it through the
method interface (the family's presets are registered at the end of this module):

1. ``fit`` -- learn what the descriptor kind learns (VLAD's codebook; a CNN's model file with
   ``descriptor.fit_network``) and, with ``whitening="pca"``, a PCA-whitening of the training set's
   database descriptors, or with ``whitening="learned"``, the learned whitening of Radenovic et al.
   from the training set's matching pairs (each query crop with each of its positives:
   :func:`oxbench.train.pairs.matching_pairs`) -- never the test set's;
2. ``index`` -- describe the database (and distractors), whiten, L2-normalise, run the index-time
   stages (``dba``) and build the search index (``search=exact``: blocked matrix product;
   ``"faiss-flat"`` / ``"faiss-ivfpq"``: a FAISS index persisted in the cache) and, for diffusion,
   the database's k-NN graph;
3. ``search`` -- describe the query crops the same way, rank by inner product (ties to the lower
   index), then run the query-time stages (query expansion, diffusion, spatial verification with a
   ``local_source``).

How an image becomes one vector is the ``descriptor`` setting: a descriptor kind by name
(:mod:`oxbench.pipelines.descriptors`) with settings of its own -- ``vlad`` (VLAD over RootSIFT,
no deep learning framework), ``cnn`` (a CNN / ViT activation map pooled by MAC, SPoC, GeM, R-MAC
or fc6; needs ``oxbench[deep]``), ``features`` (the user's descriptor files), or a plugin's kind:
``--set descriptor=cnn --set descriptor.pooling=rmac``. This module holds only what every kind
shares (whitening, search, stages) and never asks which kind it runs.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import CorruptCache, check_stands_for
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.features.local import LocalExtractor
from oxbench.fileio import json_digest
from oxbench.index.footprint import Footprint, array_bytes, disk_bytes
from oxbench.index.mapped import MappedSearch
from oxbench.index.search import SEARCH_SPEC, ExactSearch, FlatSearch, IvfPqSearch
from oxbench.index.whitening import LearnedWhitening, PCAWhitening, l2_normalize, load_whitening
from oxbench.pipelines.descriptors import (
    DESCRIPTOR_FIELD,
    DESCRIPTOR_SPEC,
    Describer,
    DescriptorKind,
)
from oxbench.pipelines.descriptors.cnn import CnnDescriptor
from oxbench.pipelines.descriptors.files import FeatureFilesDescriptor
from oxbench.pipelines.descriptors.vit import VitDescriptor
from oxbench.pipelines.descriptors.vlad import VladDescriptor
from oxbench.pipelines.globalchain import (
    DatabaseChunks,
    SearchChain,
    array_digest,
    check_search_settings,
)
from oxbench.pipelines.method import (
    MethodConfig,
    Ranking,
    RetrievalMethod,
    RunContext,
    SearchResult,
)
from oxbench.pipelines.presets import register_method
from oxbench.pipelines.rerankers import Pipeline
from oxbench.pipelines.sources import LocalSource
from oxbench.pipelines.steps import dataset_key, step_features
from oxbench.pipelines.steps.settings import CLASSIC_FEATURES
from oxbench.schema import setting, validate
from oxbench.train.pairs import matching_pairs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlobalConfig(MethodConfig, Pipeline):
    """A global-descriptor retrieval method.

    Attributes:
        name: preset name.
        descriptor: how an image becomes one vector: a descriptor kind with its own settings
            (:class:`~oxbench.pipelines.descriptors.vlad.VladDescriptor` by default,
            :class:`~oxbench.pipelines.descriptors.cnn.CnnDescriptor`,
            :class:`~oxbench.pipelines.descriptors.files.FeatureFilesDescriptor`, or a plugin's);
            from text a kind's name with its defaults (``--set descriptor=cnn``), its settings as
            ``descriptor.<name>`` (``--set descriptor.pooling=rmac``), from a record its
            ``to_dict()``.
        whitening: ``"none"``, ``"pca"`` (PCA-whitening learned on the training set, or on the
            user's ``descriptor.train_features``) or ``"learned"`` (learned whitening from the
            training set's matching pairs).
        whitening_dim: output dimension of the whitening (``None``: as many as the training set
            supports, at most the input dimension).
        whitening_power, whitening_shrinkage: see :class:`~oxbench.index.whitening.PCAWhitening`.
        search: how the database is searched, a kind with its own settings
            (:data:`~oxbench.index.search.SEARCH_SPEC`): ``exact``, ``faiss-flat`` (FAISS
            IndexFlatIP), ``faiss-ivfpq`` (``search.nlist``, ``search.m``, ``search.nbits``,
            ``search.nprobe``, ``search.seed``) or ``mapped`` (exact, streamed from shards on
            disk: ``search.ram_gb``, ``search.block``, ``search.dtype``, ``search.device``,
            :mod:`oxbench.index.mapped`).
        list_length: ranked-list length (``None``: the whole index up to 100,000 images, else
            10,000).
        rerank: the stages after the first ranking (:class:`~oxbench.pipelines.rerankers.Pipeline`),
            in order: ``dba`` (database-side augmentation at index time, settings ``dba.*``),
            ``aqe`` / ``alpha-qe`` (query expansion over the top ``k``, settings ``aqe.*`` /
            ``alpha-qe.*``),
            ``diffusion`` (Iscen et al. 2017, settings ``diffusion.*``:
            :class:`~oxbench.refinement.diffusion.DiffusionSettings`), ``spatial`` (with a
            ``local_source``), or any registered re-ranker that works on dense vectors.
    """

    family: ClassVar[str] = "global"

    name: str
    descriptor: DescriptorKind = setting(
        spec=DESCRIPTOR_SPEC,
        default_factory=VladDescriptor,
        doc="how an image becomes one vector (a descriptor kind)",
    )
    whitening: Literal["none", "pca", "learned"] = setting(
        "none", S.Choice("none", "pca", "learned"), doc="whitening learned on the training set"
    )
    whitening_dim: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1 << 16)), doc="whitened dimension"
    )
    whitening_power: float = setting(0.5, S.Float(lo=0, hi=1), doc="PCA whitening power")
    whitening_shrinkage: float = setting(
        0.0, S.Float(lo=0, hi=1, hi_open=True), doc="whitening shrinkage"
    )
    search: ExactSearch | FlatSearch | IvfPqSearch | MappedSearch = setting(
        spec=SEARCH_SPEC, default_factory=ExactSearch, doc="search index (a search kind)"
    )
    list_length: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1 << 24)), doc="ranked-list length"
    )

    #: Settings of earlier versions and where they are now (refused in one line naming them).
    renamed: ClassVar[Mapping[str, str]] = {
        "search_k": "list_length",
        "nlist": "search.nlist (with search=faiss-ivfpq)",
        "pq_m": "search.m (with search=faiss-ivfpq)",
        "pq_nbits": "search.nbits (with search=faiss-ivfpq)",
        "nprobe": "search.nprobe (with search=faiss-ivfpq)",
        "index_seed": "search.seed (with search=faiss-ivfpq)",
    }

    def __post_init__(self) -> None:
        validate(self)  # every setting's type and range (one line naming it)
        self.descriptor.check_with(self)
        check_search_settings(self)

    shorthands: ClassVar[Mapping[str, str]] = {"top_r": "spatial.top_r"}

    def shorthand(self, option: str) -> str | None:
        """``max_side`` and ``vocab_size``: the descriptor kind's (the CNN's own side, VLAD's
        local features' and codebook's); ``top_r``: the short list of a ``spatial`` stage."""
        if option in ("max_side", "vocab_size"):
            sub = self.descriptor.shorthand(option)
            return f"{DESCRIPTOR_FIELD}.{sub}" if sub else None
        return super().shorthand(option)

    @property
    def local_features(self) -> LocalExtractor | None:
        """The local features the descriptor kind extracts (VLAD's); none for the others."""
        return self.descriptor.local_features

    @property
    def needs_training(self) -> bool:
        """The kind learns something on the training set (VLAD's codebook, a CNN's model file),
        or the whitening learns on the training set's descriptors (the user's files bring their
        own training descriptors)."""
        kind = self.descriptor
        return bool(kind.learns) or (self.whitening != "none" and kind.whitens_on_training_set)

    @property
    def reads_images(self) -> bool:
        return self.descriptor.reads_images

    @property
    def learns_on_test_set(self) -> bool:
        return self.needs_training and self.descriptor.learns_on_test_set

    def check_inputs(self, root: Path | None = None) -> None:
        """The descriptor kind's input files (a model file, the user's descriptor files) are
        refused before any data is loaded when they are not there."""
        self.descriptor.check_inputs(root)

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """The descriptor kind's input files, by the kind's setting name (``db_features``,
        ``weights``: the names runs recorded before kinds were a registry, so that the ``@digest``
        of a run's label, which hashes them, stays the same for the same files)."""
        return {**super().input_files(root), **self.descriptor.input_files(root)}

    def test_data_in_training(self, bench: Benchmark) -> str | None:
        return self.descriptor.test_data_in_training(bench, self)

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """The descriptor kind's extras, and FAISS for a FAISS index."""
        out = list(self.descriptor.requires)
        if isinstance(self.search, FlatSearch | IvfPqSearch) and ("faiss", "classic") not in out:
            out.append(("faiss", "classic"))
        return tuple(out)

    def build(self) -> GlobalDescriptors:
        return GlobalDescriptors(self)

    def ram_bytes_per_image(self) -> int | None:
        """The raw descriptors and the searched (whitened) vectors, both ``float32`` while the index
        is built (the raw ones only when the build streams them into ``search=mapped``'s shards:
        :meth:`SearchChain.streams`), plus an IVF-PQ code and id; ``None`` when the settings do
        not fix the dimension (a CNN, the user's files)."""
        raw = self.descriptor.dim
        if raw is None:
            return None
        out = min(self.whitening_dim or raw, raw) if self.whitening != "none" else raw
        st = self.search
        code = st.m * st.nbits // 8 + 8 if isinstance(st, IvfPqSearch) else 0
        if SearchChain.streams(self):
            out = 0
        return 4 * (raw + out) + code


class GlobalDescriptors(RetrievalMethod):
    """Runs a :class:`GlobalConfig`: what its descriptor kind learns and the whitening on the
    training set, then the search chain."""

    offers_vectors = True

    def __init__(self, config: GlobalConfig) -> None:
        self.config: GlobalConfig = config
        self.describer: Describer = config.descriptor.build(config)
        self.whitening_: PCAWhitening | None = None
        self.trained_on_: str | None = None
        self._chain: SearchChain | None = None
        self._indexed: str | None = None
        self._index_stores: dict[str, list[Path]] = {}  # what the index keeps on disk, by kind

    # --- descriptors -----------------------------------------------------------------------
    def describe(self, bench: Benchmark, part: str, ctx: RunContext) -> NDArray[np.float32]:
        """Raw (unwhitened) descriptors ``float32 [n, D]`` of one part, names in part order (the
        kind's :meth:`~oxbench.pipelines.descriptors.Describer.describe`: cached and resumable
        for a kind that computes them)."""
        return self.describer.describe(bench, part, ctx)

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """The descriptor kind's describe step (a CNN's descriptor shards; VLAD's local features,
        its descriptors needing the codebook learned in ``fit``; the user's files: nothing), and
        a test set's local source (GeM + SV) too, as ``local_source.<part>``."""
        m = self.config
        out = self.describer.describe_parts(bench, ctx, training=training, partition=partition)
        if m.local_source is not None and not training:
            done = step_features(bench, m.local_source, ctx, partition=partition)
            out.update({f"local_source.{part}": res.computed for part, res in done.items()})
        return out

    def vectors(self, bench: Benchmark, parts: list[str], ctx: RunContext) -> NDArray[np.float32]:
        """The descriptors of ``parts`` as the method searches with them (:meth:`finish`)."""
        raw = [self.describe(bench, p, ctx) for p in parts]
        return self.finish(np.concatenate(raw) if len(raw) > 1 else raw[0])

    def finish(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Descriptors as the method searches with them: whitened when it whitens, L2-normalised."""
        return self.whitening_.transform(x) if self.whitening_ is not None else l2_normalize(x)

    # --- the interface ---------------------------------------------------------------------
    def fit(self, train: Benchmark | None, ctx: RunContext) -> GlobalDescriptors:
        kind = self.config.descriptor
        if not kind.whitens_on_training_set:  # the kind's own training files (the user's)
            with ctx.timed("whitening"):
                self.whitening_ = self.describer.fit_whitening()
            return self
        if train is None:
            if not self.config.needs_training:
                return self
            what = kind.learns or "a whitening"
            raise InputError(f"method {self.config.name} learns {what}: it needs a training set")
        self.describer.fit(train, ctx)
        self.trained_on_ = train.id
        if self.config.whitening != "none":
            with ctx.timed("whitening"):
                self.whitening_ = self._fit_whitening(train, ctx)
        return self

    def _fit_whitening(self, train: Benchmark, ctx: RunContext) -> PCAWhitening:
        m = self.config
        settings = {
            "descriptors": self._store_name(train, ctx),
            "train": dataset_key(train),
            "dim": m.whitening_dim,
            "power": m.whitening_power,
            "shrinkage": m.whitening_shrinkage,
            **({"kind": "learned"} if m.whitening == "learned" else {}),
        }
        path = Path(ctx.cache) / "whitening" / f"{train.id}-{json_digest(settings, 12)}.npz"
        x = self.describe(train, "database", ctx)  # cached; what the entry must stand for
        record = {"whitening": settings, "train_descriptors": array_digest(x)}
        if path.exists():
            try:
                w = load_whitening(path)
                check_stands_for(w.stands_for_, record, what="the cached whitening", path=path)
                ctx.record_step("whitening", hit=True)
                return w
            except (InputError, CorruptCache) as exc:
                log.warning("%s; learning the whitening again", exc)
        log.info(
            "learning the %s whitening of %s from %d x %d training descriptors",
            m.whitening,
            m.name,
            *x.shape,
        )
        if m.whitening == "learned":
            pairs = matching_pairs(train.gt)
            x = np.concatenate((x, self.describe(train, "queries", ctx)))
            w = LearnedWhitening(m.whitening_dim, shrinkage=m.whitening_shrinkage).fit(
                x,
                pairs,
                fitted_on=f"{train.id} database + query crops ({len(x)} images, {len(pairs)} query-positive pairs)",
            )
        else:
            w = PCAWhitening(
                m.whitening_dim, power=m.whitening_power, shrinkage=m.whitening_shrinkage
            )
            w.fit(x, fitted_on=f"{train.id} database ({len(x)} images)")
        w.save(path, stands_for=record)
        ctx.record_step("whitening", hit=False)
        return w

    def index(self, bench: Benchmark, ctx: RunContext) -> GlobalDescriptors:
        parts = ["database"] + (["distractors"] if bench.distractors is not None else [])
        with ctx.timed("features"):
            raw = [self.describe(bench, p, ctx) for p in parts]
        db: NDArray[np.float32] | DatabaseChunks
        if SearchChain.streams(self.config):  # whitened chunk by chunk into the shards
            db = DatabaseChunks(raw, self.finish, self.finish(raw[0][:1]).shape[1])
        else:
            if isinstance(self.config.search, MappedSearch):
                log.info(
                    "method %s: a stage of rerank=%s needs the whole database in RAM; it is "
                    "whitened in RAM, then written to the shards",
                    self.config.name,
                    ",".join(self.config.rerank),
                )
            with ctx.timed("index"):
                db = self.finish(np.concatenate(raw) if len(raw) > 1 else raw[0])
        cache_dir = Path(ctx.cache) / dataset_key(bench) / "global" / "index"
        local = None
        if self.config.local_source is not None:  # GeM + SV: a short list verified locally
            local = LocalSource(self.config.local_source)
            local.prepare(bench, ctx)
        chain = SearchChain(self.config, db, ctx, cache_dir, local=local)
        # index-phase stages (DBA) change the database before the search index is built on it
        chain.info.update(self.prepare_stages(chain, ctx, phase="index"))
        chain.build_index()
        chain.info.update(self.prepare_stages(chain, ctx, phase="query"))
        self._chain = chain
        self._indexed = bench.id
        self._index_stores = self.describer.stores_on_disk(bench, parts, ctx)
        return self

    def _store_name(self, train: Benchmark, ctx: RunContext) -> str:
        """What names the training set's database descriptors in the whitening's cache key."""
        path = self.describer.store_path(train, "database", ctx)
        if path is None:  # a kind that caches nothing: its settings name them
            return json_digest(self.config.descriptor.to_dict(), 12)
        return path.parent.name

    def footprint(self) -> Footprint | None:
        """The vectors and FAISS index in RAM; descriptor stores (and VLAD's local-feature stores,
        or the user's database file) and the FAISS index file on disk; codebook, whitening and the
        trained quantisers fixed."""
        chain = self._chain
        if chain is None:
            return None
        ram, fixed, chain_disk = chain.footprint()
        disk = {
            kind: sum(disk_bytes(p) for p in paths) for kind, paths in self._index_stores.items()
        }
        disk.update({k: v for k, v in chain_disk.items() if v})
        if chain.index_path is not None:
            disk["faiss_index"] = disk_bytes(chain.index_path)
        if self.whitening_ is not None:
            fixed["whitening"] = array_bytes(
                [getattr(self.whitening_, a, None) for a in vars(self.whitening_)]
            )
        fixed_disk = self.describer.fixed_disk()
        return Footprint(chain.shape[0], ram=ram, disk=disk, fixed_ram=fixed, fixed_disk=fixed_disk)

    # --- what the re-ranking stages use: the search chain's dense vectors ---------------------------
    capabilities = SearchChain.capabilities

    def first_ranking(self, bench: Benchmark, ctx: RunContext) -> tuple[SearchChain, Ranking]:
        if self._chain is None or self._indexed != bench.id:
            raise InputError(f"method {self.config.name}: index {bench.id} before searching it")
        with ctx.timed("features"):
            q = self.finish(self.describe(bench, "queries", ctx))
        return self._chain, self._chain.first_ranking(q, ctx)

    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        result = super().search(bench, ctx)
        assert result.scores is not None
        return dataclasses.replace(result, scores=result.scores.astype(np.float32))

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trained_on": self.trained_on_, **self.describer.provenance()}
        if self.whitening_ is not None:
            out["whitening"] = {
                "kind": self.whitening_.kind,
                "fitted_on": self.whitening_.fitted_on_,
                "dim": self.whitening_.dim,
            }
        return out


# --- presets -------------------------------------------------------------------------------------

# VLAD over RootSIFT (64 words x 128 = 8,192 dimensions), as a framework-free global descriptor.
register_method(
    GlobalConfig("rootsift-vlad"), about="VLAD of RootSIFT, 64 words (Jegou et al. 2010)"
)
register_method(
    GlobalConfig("rootsift-vlad-w", whitening="pca"),
    about="VLAD + PCA whitening from the training set (Jegou & Chum 2012)",
)
register_method(
    GlobalConfig("rootsift-vlad-w-aqe", whitening="pca", rerank=("aqe",)),
    about="whitened VLAD + average query expansion (Chum et al. 2007)",
)
register_method(
    GlobalConfig("rootsift-vlad-w-alpha-qe", whitening="pca", rerank=("alpha-qe",)),
    about="whitened VLAD + alpha query expansion (Radenovic et al. 2018)",
)

# --- deep global descriptors (descriptor=cnn; needs oxbench[deep]) ---------------------------------
# Multi-scale (1, 1/sqrt(2), 1/2) at 1024 px, as the published GeM models are evaluated. "+w" is the
# PCA-whitening learned on the training set (the other city), or for gem-r101 the learned whitening
# that came with the published model; "+aqe" / "+alpha-qe" re-rank by query expansion.

# The published ResNet-101 GeM (Radenovic et al. 2018, cirtorch retrievalSfM120k-resnet101-gem): the
# user supplies the weights, converted once with `oxbench import-checkpoint CHECKPOINT --out MODEL.pt`,
# and runs `oxbench run --dataset roxford5k --method gem-r101+w --set descriptor.weights=MODEL.pt`.
_R101 = CnnDescriptor(backbone="resnet101", pooling="gem", weights=None)
_R101_LW = dataclasses.replace(_R101, model_whitening=True)
register_method(
    GlobalConfig("gem-r101", descriptor=_R101),
    about="ResNet-101 GeM, the published retrieval-SfM-120k weights (give the model file; Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("gem-r101+w", descriptor=_R101_LW),
    about="ResNet-101 GeM + the model's learned whitening (Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("gem-r101+w+alpha-qe", descriptor=_R101_LW, rerank=("alpha-qe",)),
    about="ResNet-101 GeM + learned whitening + alpha-QE (Radenovic et al. 2018)",
)

# Off-the-shelf ImageNet trunks (torchvision's weights, from its cache) with each pooling head.
_GEM50 = CnnDescriptor(backbone="resnet50", pooling="gem", weights="imagenet")
register_method(
    GlobalConfig("gem-r50-imagenet", descriptor=_GEM50),
    about="ImageNet ResNet-50 trunk, GeM pooling, off the shelf (Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("gem-r50-imagenet+w", descriptor=_GEM50, whitening="pca"),
    about="ImageNet ResNet-50 GeM + PCA whitening from the training set (Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("gem-r50-imagenet+w+aqe", descriptor=_GEM50, whitening="pca", rerank=("aqe",)),
    about="ImageNet ResNet-50 GeM + whitening + average QE (Chum et al. 2007)",
)
register_method(
    GlobalConfig(
        "gem-r50-imagenet+w+alpha-qe", descriptor=_GEM50, whitening="pca", rerank=("alpha-qe",)
    ),
    about="ImageNet ResNet-50 GeM + whitening + alpha-QE (Radenovic et al. 2018)",
)
_ABOUT_POOLING = {
    "mac": "ImageNet ResNet-50, MAC (max) pooling (Tolias et al. 2016)",
    "spoc": "ImageNet ResNet-50, SPoC (sum) pooling (Babenko & Lempitsky 2015)",
    "rmac": "ImageNet ResNet-50, R-MAC regional pooling (Tolias et al. 2016)",
}
for _pooling in ("mac", "spoc", "rmac"):
    register_method(
        GlobalConfig(
            f"{_pooling}-r50-imagenet", descriptor=dataclasses.replace(_GEM50, pooling=_pooling)
        ),
        about=_ABOUT_POOLING[_pooling],
    )
register_method(
    GlobalConfig(
        "rmac-r50-imagenet+w",
        descriptor=dataclasses.replace(_GEM50, pooling="rmac"),
        whitening="pca",
    ),
    about="ImageNet ResNet-50 R-MAC + PCA whitening (Tolias et al. 2016)",
)

# The seed's CNN rows (docs/deep.md says what each needs and the number it would reproduce).
# Babenko et al. ECCV 2014, "neural codes": the fc6 layer (4,096-D, after its ReLU, L2-normalised)
# of an ImageNet classifier, the image (a query: its crop) shrunk to the classifier's 224 px, one
# scale; "+pca": plain PCA (no whitening: power 0) to 256-D learned on the training set (the other
# city).
_PCA256: dict[str, Any] = {"whitening": "pca", "whitening_dim": 256, "whitening_power": 0.0}
ABOUT_NEURAL_CODES = "Neural codes: fc6 of ImageNet {trunk}, 4,096-D (Babenko et al. 2014)"
ABOUT_NEURAL_CODES_PCA = (
    "Neural codes: {trunk} fc6, PCA to 256-D learned on the other city (Babenko et al. 2014)"
)
for _trunk in ("alexnet", "vgg16"):
    _fc6 = CnnDescriptor(
        backbone=_trunk,
        pooling="fc6",
        weights="imagenet",
        max_side=224,
        scales=(1.0,),
        query_resize="crop",
    )
    _name = {"alexnet": "AlexNet", "vgg16": "VGG16"}[_trunk]
    register_method(
        GlobalConfig(f"neural-codes-{_trunk}", descriptor=_fc6),
        about=ABOUT_NEURAL_CODES.format(trunk=_name),
    )
    register_method(
        GlobalConfig(f"neural-codes-{_trunk}+pca", descriptor=_fc6, **_PCA256),
        about=ABOUT_NEURAL_CODES_PCA.format(trunk=_name),
    )
# Tolias et al. ICLR 2016: R-MAC of ImageNet VGG16 (512-D) at one scale, 1024 px, PCA-whitened with
# the whitening learned on the other city.
register_method(
    GlobalConfig(
        "rmac-vgg16-imagenet+w",
        descriptor=CnnDescriptor(backbone="vgg16", pooling="rmac", scales=(1.0,)),
        whitening="pca",
    ),
    about="ImageNet VGG16 R-MAC, 512-D, PCA whitening learned on the other city (Tolias et al. 2016)",
)

# ResNet-18 GeM trained from scratch on the synthetic training city by `oxbench train`, which writes
# <data root>/_models/gem-r18-synthetic.pt ($OXBENCH_MODELS overrides the folder). Described at the
# size it was trained at (160 px, one scale: a network trained from scratch on small images has not
# learned the features of large ones). "+lw": the learned whitening stored in the model file.
# On a fresh data root, fit trains the model file (fit_network), exactly as `oxbench train` would.
_R18 = CnnDescriptor(
    backbone="resnet18",
    pooling="gem",
    weights="models:gem-r18-synthetic.pt",
    max_side=160,
    scales=(1.0,),
    fit_network=True,
)
register_method(
    GlobalConfig("gem-r18-synthetic", descriptor=_R18),
    about="ResNet-18 GeM trained by `oxbench train` on the synthetic training city (contrastive loss, hard negatives: Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("gem-r18-synthetic+w", descriptor=_R18, whitening="pca"),
    about="the synthetic-trained ResNet-18 GeM + PCA whitening",
)
register_method(
    GlobalConfig(
        "gem-r18-synthetic+lw", descriptor=dataclasses.replace(_R18, model_whitening=True)
    ),
    about="the synthetic-trained ResNet-18 GeM + its learned whitening (Radenovic et al. 2018)",
)
register_method(
    GlobalConfig(
        "gem-r18-synthetic+w+alpha-qe", descriptor=_R18, whitening="pca", rerank=("alpha-qe",)
    ),
    about="the synthetic-trained ResNet-18 GeM + whitening + alpha-QE (Radenovic et al. 2018)",
)

# --- foundation models (descriptor=vit; needs oxbench[deep]) -------------------------------------
# Frozen ViTs by their timm names, weights from the Hugging Face cache (weights=pretrained: never
# downloaded; a missing file is one line saying where to put it). The class token at a longer side of
# 518 px, one scale, the revisited query crop; docs/deep.md names each figure's source and what its
# preprocessing was. Figures: ROxford Hard mAP as each model card reports it.
_FOUNDATION: list[tuple[str, str, Literal["cls", "head"], str]] = [
    # preset, timm model, pooling, what it is and the figure it would reproduce
    ("dinov2-vits14", "vit_small_patch14_dinov2", "cls", "DINOv2 ViT-S/14, class token; its model card: ROxford Hard 43.2 (Oquab et al. 2023)"),
    ("dinov2-vitb14", "vit_base_patch14_dinov2", "cls", "DINOv2 ViT-B/14, class token; its model card: ROxford Hard 49.5 (Oquab et al. 2023)"),
    ("dinov2-vitl14", "vit_large_patch14_dinov2", "cls", "DINOv2 ViT-L/14, class token; its model card: ROxford Hard 54.0 (Oquab et al. 2023)"),
    ("dinov2-vitg14", "vit_giant_patch14_dinov2", "cls", "DINOv2 ViT-g/14, class token; its model card: ROxford Hard 52.3 (Oquab et al. 2023)"),
    ("dinov2-vits14-reg", "vit_small_patch14_reg4_dinov2", "cls", "DINOv2 ViT-S/14 with 4 registers, class token; no ROxford figure quoted (Darcet et al. 2024)"),
    ("dinov2-vitb14-reg", "vit_base_patch14_reg4_dinov2", "cls", "DINOv2 ViT-B/14 with 4 registers, class token; no ROxford figure quoted (Darcet et al. 2024)"),
    ("dinov2-vitl14-reg", "vit_large_patch14_reg4_dinov2", "cls", "DINOv2 ViT-L/14 with 4 registers, class token; no ROxford figure quoted (Darcet et al. 2024)"),
    ("dinov2-vitg14-reg", "vit_giant_patch14_reg4_dinov2", "cls", "DINOv2 ViT-g/14 with 4 registers, class token; no ROxford figure quoted (Darcet et al. 2024)"),
    ("dinov3-vits16", "vit_small_patch16_dinov3", "cls", "DINOv3 ViT-S/16, class token; its model card: ROxford Hard 49.5 (Simeoni et al. 2025)"),
    ("dinov3-vitb16", "vit_base_patch16_dinov3", "cls", "DINOv3 ViT-B/16, class token; its model card: ROxford Hard 58.5 (Simeoni et al. 2025)"),
    ("dinov3-vitl16", "vit_large_patch16_dinov3", "cls", "DINOv3 ViT-L/16, class token; its model card: ROxford Hard 63.1 (Simeoni et al. 2025)"),
    ("clip-vitb16-openai", "vit_base_patch16_clip_224.openai", "cls", "OpenAI CLIP ViT-B/16 image tower, class token before the projection; no ROxford figure quoted (Radford et al. 2021)"),
    ("siglip-vitb16", "vit_base_patch16_siglip_224", "head", "SigLIP ViT-B/16 image tower, its attention-pool embedding; no ROxford figure quoted (Zhai et al. 2023)"),
]  # fmt: skip
for _name, _model, _pooling, _about in _FOUNDATION:
    register_method(
        GlobalConfig(_name, descriptor=VitDescriptor(model=_model, token_pooling=_pooling)),
        about=_about,
    )

# --- your own descriptors ------------------------------------------------------------------------

# The user's database / query descriptor files (--set descriptor.db_features=PATH
# --set descriptor.query_features=PATH), through the same whitening, search, QE, DBA and diffusion
# (oxbench.pipelines.descriptors.files, oxbench.pipelines.featurefiles).
_FILES = FeatureFilesDescriptor()
register_method(
    GlobalConfig("features", descriptor=_FILES),
    about="your own global descriptor files, exact search",
)
register_method(
    GlobalConfig("features-aqe", descriptor=_FILES, rerank=("aqe",)),
    about="your descriptors + average query expansion (Chum et al. 2007)",
)
register_method(
    GlobalConfig("features-alpha-qe", descriptor=_FILES, rerank=("alpha-qe",)),
    about="your descriptors + alpha query expansion (Radenovic et al. 2018)",
)
register_method(
    GlobalConfig("features-dba", descriptor=_FILES, rerank=("dba",)),
    about="your descriptors + database-side augmentation; alpha-DBA: Radenovic et al. 2018 (Arandjelovic & Zisserman 2012)",
)
register_method(
    GlobalConfig("features-diffusion", descriptor=_FILES, rerank=("diffusion",)),
    about="your descriptors + diffusion on the k-NN graph (Iscen et al. 2017)",
)
register_method(
    GlobalConfig("features-ivfpq", descriptor=_FILES, search=IvfPqSearch()),
    about="your descriptors in a FAISS IVF-PQ index (Jegou et al. 2011)",
)

# --- hybrid rows: a global short list verified with local features (pipelines/sources.py) ---------
# RootSIFT at the classic presets' settings, descriptor-matched (no vocabulary): "+sv" verifies the
# top spatial.top_r of the global ranking; the local features are the bag-of-words presets' store.
register_method(
    GlobalConfig(
        "rootsift-vlad-w+sv", whitening="pca", local_source=CLASSIC_FEATURES, rerank=("spatial",)
    ),
    about="hybrid: whitened VLAD short list verified with RootSIFT by descriptor matching; Philbin et al. 2007 (Jegou et al. 2010)",
)
register_method(
    GlobalConfig(
        "gem-r101+w+sv",
        descriptor=_R101_LW,
        local_source=CLASSIC_FEATURES,
        rerank=("spatial",),
    ),
    about="hybrid: ResNet-101 GeM + learned whitening, short list verified with RootSIFT, a model file given (GeM + SV, Radenovic et al. 2018)",
)
