"""Global-descriptor methods: one vector per image, whitening, exact or FAISS search, QE, DBA, diffusion.

A :class:`GlobalMethod` config describes the whole chain; :class:`GlobalDescriptors` runs it through
the method interface:

1. ``fit`` -- learn what the descriptor needs (the VLAD codebook: a flat k-means vocabulary trained
   on the training set's local features, exactly as bag-of-words trains its vocabulary) and, with
   ``whitening="pca"``, a PCA-whitening of the training set's database descriptors, or with
   ``whitening="learned"``, the learned whitening of Radenovic et al. from the training set's
   matching pairs (each query crop with each of its positives: :func:`oxbench.train.pairs.matching_pairs`)
   -- never the test set's;
2. ``index`` -- describe the database (and distractors), whiten, L2-normalise, optionally replace
   each vector by its alpha-weighted mean with its top ``dba`` neighbours (database-side
   augmentation), and build the search index (``search="exact"``: blocked matrix product;
   ``"faiss-flat"`` / ``"faiss-ivfpq"``: a FAISS index persisted in the cache) and, for diffusion,
   the database's k-NN graph;
3. ``search`` -- describe the query crops the same way, rank by inner product (ties to the lower
   index), re-rank with average or alpha query expansion over the top neighbours (searching again),
   then with diffusion (:mod:`oxbench.rerank.diffusion`) when asked.

``descriptor="features"`` takes the descriptors from the user's files instead (``db_features``,
``query_features``, and ``train_features`` / ``train_pairs`` for whitening): the same chain, the same
runner and run folder (:mod:`oxbench.pipelines.featurefiles`).

Descriptors: VLAD over RootSIFT (Jegou et al. CVPR 2010; with intra-normalisation as in
Arandjelovic & Zisserman CVPR 2013 and signed square-root power normalisation), which needs no deep
learning framework, and ``descriptor="cnn"``: a CNN / ViT activation map pooled by MAC, SPoC, GeM or
R-MAC, multi-scale, from :mod:`oxbench.features.deep` (needs ``oxbench[deep]``). Descriptors are
cached per dataset part in a sharded, resumable :class:`~oxbench.features.descstore.DescriptorStore`
under the cache folder, keyed by every setting that determines them (for a CNN: the weights' digest),
each shard checked against its recorded digest when read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.features.sift import SiftConfig, finish_descriptors
from oxbench.fileio import file_lock, json_digest
from oxbench.index.whitening import LearnedWhitening, PCAWhitening, l2_normalize, load_whitening
from oxbench.pipelines.globalchain import SearchChain, check_search_settings
from oxbench.pipelines.method import MethodConfig, RetrievalMethod, RunContext, SearchResult

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.features.store import FeatureStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlobalMethod(MethodConfig):
    """A global-descriptor retrieval method.

    Attributes:
        name: preset name.
        descriptor: how an image becomes one vector (``"vlad"``: VLAD over local features;
            ``"cnn"``: a pooled CNN / ViT activation map, :mod:`oxbench.features.deep`).
        features: the local features VLAD aggregates (a query is described from its crop only).
        backbone: ``cnn``: ``resnet18/34/50/101/152``, ``vgg11/13/16/19`` (torchvision) or
            ``timm:<model name>`` (:mod:`oxbench.features.deep.backbones`).
        weights: ``cnn``: ``"random"`` (seeded by ``seed``), ``"imagenet"`` (the library's
            pretrained weights, from its cache or downloaded into it), a model file path
            (``oxbench import-checkpoint`` / ``oxbench train``), or ``"models:<file>"`` (a file in
            :func:`oxbench.features.deep.models_dir`); ``None``: the user must supply a file.
        pooling: ``cnn``: ``"mac"``, ``"spoc"``, ``"gem"`` or ``"rmac"``.
        rmac_grid: ``cnn`` with R-MAC: the region arithmetic, ``"float64"`` or ``"float32"``
            (cirtorch's, for a published R-MAC model's descriptors;
            :func:`~oxbench.features.deep.pooling.rmac_regions`).
        gem_p: GeM's exponent for random / ImageNet weights (a model file brings its own).
        max_side: ``cnn``: longer image side (px) before description (never enlarged).
        query_resize: ``cnn``: how a query crop is shrunk: ``"full-image"`` (by the factor that
            brings its full image to ``max_side``, as cirtorch evaluates the published models) or
            ``"crop"`` (the crop itself to ``max_side``). Same result when the full image is
            within ``max_side``.
        scales: ``cnn``: multi-scale factors, combined by the power mean with GeM's ``p``.
        precision: ``cnn``: ``"fp32"`` or ``"bf16"`` (autocast of the trunk).
        model_whitening: ``cnn``: apply the learned whitening stored in the model file (cirtorch's
            ``Lw``: the multi-scale one with several scales) to the descriptors.
        seed: ``cnn``: initialisation seed of random weights.
        batch_size, device: ``cnn``: images per forward pass; ``"auto"`` (GPU when torch sees
            one), ``"cpu"`` or ``"cuda"``. Neither changes the descriptors beyond float rounding,
            so neither is part of the descriptor cache key.
        vlad_k: codebook size (the descriptor has ``vlad_k * 128`` dimensions).
        vlad_iter, vlad_max_points_per_centroid, vlad_seed: codebook k-means settings.
        power: signed power normalisation exponent of every component (0.5: signed square root;
            1: none).
        intra_norm: L2-normalise each centroid's residual sum before the final L2 (intra-norm).
        whitening: ``"none"``, ``"pca"`` (PCA-whitening learned on the training set) or
            ``"learned"`` (learned whitening from the training set's matching pairs).
        whitening_dim: output dimension of the whitening (``None``: as many as the training set
            supports, at most the input dimension).
        whitening_power, whitening_shrinkage: see :class:`~oxbench.index.whitening.PCAWhitening`.
        qe: ``"none"``, ``"aqe"`` (average of the query and its top ``qe_k``) or ``"alpha-qe"``
            (weights ``similarity ** qe_alpha``, Radenovic et al. 2018).
        qe_k, qe_alpha: neighbours used by query expansion and the alpha exponent.
        search: ``"exact"``, ``"faiss-flat"`` (FAISS IndexFlatIP) or ``"faiss-ivfpq"``.
        search_k: ranked-list length (``None``: the whole index up to 100,000 images, else 10,000).
        nlist, pq_m, pq_nbits, nprobe: IVF-PQ cells, sub-quantisers, bits per code, cells visited.
        dba: database-side augmentation with this many neighbours (0: off).
        dba_alpha: DBA weights ``similarity ** dba_alpha`` (0: plain average).
        rerank: ``"none"`` or ``"diffusion"`` (Iscen et al. 2017).
        diffusion_k, diffusion_query_k, diffusion_alpha, diffusion_gamma, diffusion_truncation,
            diffusion_iterations, diffusion_normalise, diffusion_mode: see
            :class:`~oxbench.rerank.diffusion.DiffusionSettings` (``diffusion_k`` counts the image
            itself, as the reference code does; ``diffusion_normalise="full"`` slices the whole
            graph's normalisation, ``"subgraph"`` re-normalises the truncated graph;
            ``diffusion_mode="offline"`` precomputes every database image's diffusion).
        db_features, query_features: with ``descriptor="features"``, the user's descriptor files
            (rows in database / query order of the dataset).
        train_features: the user's training descriptors, for ``whitening`` (never the test set's
            unless the user says so); train_pairs: ``[m, 2]`` matching pairs of its rows
            (``.npy``), for ``whitening="learned"``.
        layout: ``"n-d"`` (``[n, d]``, one row per image) or ``"d-n"`` (``[d, n]``, revisitop's
            MATLAB files) in the files, as ``oxbench evaluate --layout`` reads them.
        key: the array inside an ``.npz`` / ``.mat`` file.
    """

    family: ClassVar[str] = "global"

    name: str
    descriptor: Literal["vlad", "cnn", "features"] = "vlad"
    features: SiftConfig = field(default_factory=SiftConfig)
    backbone: str = "resnet50"
    weights: str | None = "imagenet"
    pooling: Literal["mac", "spoc", "gem", "rmac"] = "gem"
    rmac_grid: Literal["float64", "float32"] = "float64"
    gem_p: float = 3.0
    max_side: int = 1024
    query_resize: Literal["full-image", "crop"] = "full-image"
    scales: tuple[float, ...] = (1.0, 2.0**-0.5, 0.5)
    precision: Literal["fp32", "bf16"] = "fp32"
    model_whitening: bool = False
    seed: int = 0
    batch_size: int = 8
    device: str = "auto"
    vlad_k: int = 64
    vlad_iter: int = 20
    vlad_max_points_per_centroid: int = 256
    vlad_seed: int = 0
    power: float = 0.5
    intra_norm: bool = True
    whitening: Literal["none", "pca", "learned"] = "none"
    whitening_dim: int | None = None
    whitening_power: float = 0.5
    whitening_shrinkage: float = 0.0
    qe: Literal["none", "aqe", "alpha-qe"] = "none"
    qe_k: int = 5
    qe_alpha: float = 3.0
    search: Literal["exact", "faiss-flat", "faiss-ivfpq"] = "exact"
    search_k: int | None = None
    nlist: int = 256
    pq_m: int = 16
    pq_nbits: int = 8
    nprobe: int = 16
    dba: int = 0
    dba_alpha: float = 3.0
    rerank: Literal["none", "diffusion"] = "none"
    diffusion_k: int = 50
    diffusion_query_k: int = 10
    diffusion_alpha: float = 0.99
    diffusion_gamma: float = 3.0
    diffusion_truncation: int = 1000
    diffusion_iterations: int = 20
    diffusion_normalise: Literal["full", "subgraph"] = "full"
    diffusion_mode: Literal["online", "offline"] = "online"
    db_features: str | None = None
    query_features: str | None = None
    train_features: str | None = None
    train_pairs: str | None = None
    layout: Literal["n-d", "d-n"] = "n-d"
    key: str | None = None

    def __post_init__(self) -> None:
        if self.descriptor not in ("vlad", "cnn", "features"):
            raise InputError(f"method {self.name}: unknown descriptor {self.descriptor!r} (known: vlad, cnn, features)")
        if self.descriptor == "cnn":
            self._check_cnn()
        check_search_settings(self)
        if self.vlad_k < 2:
            raise InputError(f"method {self.name}: vlad_k must be >= 2")
        if not 0.0 < self.power <= 1.0:
            raise InputError(f"method {self.name}: power must be in (0, 1]")
        if self.whitening not in ("none", "pca", "learned"):
            raise InputError(f"method {self.name}: unknown whitening {self.whitening!r} (none, pca, learned)")
        if self.qe not in ("none", "aqe", "alpha-qe"):
            raise InputError(f"method {self.name}: unknown query expansion {self.qe!r} (none, aqe, alpha-qe)")
        if self.qe_k < 1:
            raise InputError(f"method {self.name}: qe_k must be >= 1")

    def _check_cnn(self) -> None:
        try:
            scales = tuple(float(s) for s in self.scales)
        except (TypeError, ValueError):
            raise InputError(f"method {self.name}: scales must be a list of numbers, got {self.scales!r}") from None
        object.__setattr__(self, "scales", scales)
        if not scales or not all(0.0 < s <= 4.0 for s in scales):
            raise InputError(f"method {self.name}: scales must be numbers in (0, 4], got {list(scales)}")
        if self.pooling not in ("mac", "spoc", "gem", "rmac"):
            raise InputError(f"method {self.name}: unknown pooling {self.pooling!r} (mac, spoc, gem, rmac)")
        if not 0.0 < self.gem_p <= 100.0:
            raise InputError(f"method {self.name}: gem_p must be in (0, 100]")
        if self.max_side < 16:
            raise InputError(f"method {self.name}: max_side must be >= 16 px")
        if self.precision not in ("fp32", "bf16"):
            raise InputError(f"method {self.name}: precision must be fp32 or bf16")
        if self.rmac_grid not in ("float64", "float32"):
            raise InputError(f"method {self.name}: rmac_grid must be float64 or float32, got {self.rmac_grid!r}")
        if self.query_resize not in ("full-image", "crop"):
            raise InputError(f"method {self.name}: query_resize must be full-image or crop, got {self.query_resize!r}")
        if self.batch_size < 1:
            raise InputError(f"method {self.name}: batch_size must be >= 1")
        if self.weights is not None and (not isinstance(self.weights, str) or not self.weights):
            raise InputError(f"method {self.name}: weights must be random, imagenet or a model file path")
        if self.model_whitening and self.weights in ("random", "imagenet"):
            raise InputError(f"method {self.name}: model_whitening needs a model file that carries one (weights=PATH)")
        if self.model_whitening and self.whitening != "none":
            raise InputError(f"method {self.name}: model_whitening already whitens; set whitening=none")

    @property
    def needs_training(self) -> bool:
        """VLAD learns its codebook; a CNN descriptor learns only a whitening, when asked for; user
        feature files learn nothing on a benchmark (their whitening uses ``train_features``)."""
        if self.descriptor == "features":
            return False
        return self.descriptor == "vlad" or self.whitening != "none"

    @property
    def reads_images(self) -> bool:
        """User feature files replace every step that reads pixels."""
        return self.descriptor != "features"

    def build(self) -> GlobalDescriptors:
        return GlobalDescriptors(self)

    def codebook_method(self):  # noqa: ANN201 - a BowMethod
        """The flat k-means vocabulary VLAD uses, as the bag-of-words vocabulary step knows it."""
        from oxbench.pipelines.presets import BowMethod

        return BowMethod(
            name=f"{self.name}-codebook", features=self.features, vocab_size=self.vlad_k,
            vocab_structure="flat", vocab_iter=self.vlad_iter,
            vocab_max_points_per_centroid=self.vlad_max_points_per_centroid, vocab_seed=self.vlad_seed,
        )  # fmt: skip

    def descriptor_settings(self) -> dict[str, Any]:
        """What determines one image's descriptor (cache key, with the codebook or the weights)."""
        if self.descriptor == "cnn":
            return {
                "descriptor": "cnn", "backbone": self.backbone, "pooling": self.pooling, "gem_p": self.gem_p,
                "max_side": self.max_side, "scales": list(self.scales), "precision": self.precision,
                **({"rmac_grid": self.rmac_grid} if self.pooling == "rmac" else {}),
            }  # fmt: skip
        return {
            "descriptor": self.descriptor, "features": self.features.to_dict(), "vlad_k": self.vlad_k,
            "power": self.power, "intra_norm": self.intra_norm,
        }  # fmt: skip


def vlad(
    descriptors: NDArray[np.float32],
    words: NDArray[np.integer],
    centroids: NDArray[np.float32],
    *,
    power: float = 0.5,
    intra_norm: bool = True,
) -> NDArray[np.float32]:
    """The VLAD vector of one image.

    ``V[c] = sum_{i: words[i] == c} (x_i - mu_c)`` for every centroid ``c``; then each component is
    power-normalised (``sign(v) |v| ** power``), each centroid block L2-normalised when
    ``intra_norm``, and the whole ``k * d`` vector L2-normalised. No features give the zero vector.

    Args:
        descriptors: ``[n, d]`` local descriptors.
        words: ``[n]`` nearest centroid of each.
        centroids: ``[k, d]``.

    Example:
        >>> c = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
        >>> vlad(np.array([[1.0, 0.0]], np.float32), np.array([0]), c, power=1.0).tolist()
        [1.0, 0.0, 0.0, 0.0]
    """
    k, d = centroids.shape
    x = np.asarray(descriptors, np.float64)
    w = np.asarray(words, np.int64)
    if x.shape[0] != w.shape[0] or (x.size and x.shape[1] != d):
        raise ValueError(f"{x.shape} descriptors, {w.shape} words, {centroids.shape} centroids")
    v = np.zeros((k, d), np.float64)
    if len(x):
        np.add.at(v, w, x - centroids[w])
    if power != 1.0:
        v = np.sign(v) * np.abs(v) ** power
    if intra_norm:
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        v = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    flat = v.ravel()
    n = np.linalg.norm(flat)
    return (flat / n if n > 0 else flat).astype(np.float32)


class GlobalDescriptors(RetrievalMethod):
    """Runs a :class:`GlobalMethod`: codebook and whitening on the training set, exact search, QE."""

    def __init__(self, config: GlobalMethod) -> None:
        self.config: GlobalMethod = config
        self.codebook_path_: Path | None = None
        self.whitening_: PCAWhitening | None = None
        self.trained_on_: str | None = None
        self._chain: SearchChain | None = None
        self._indexed: str | None = None
        self.model_: Any = None  # cnn: oxbench.features.deep.model.LoadedModel
        self._extractor: Any = None
        self.undecodable_: dict[str, list[str]] = {}

    # --- descriptors -----------------------------------------------------------------------
    def _store(self, bench: Benchmark, part: str, ctx: RunContext) -> FeatureStore:
        from oxbench.pipelines import bow

        bow.step_features(bench, self.config.features, ctx.cache, parts=[part], workers=ctx.workers,
                          progress=ctx.progress, full_check=ctx.full_check)  # fmt: skip
        return bow.open_store(ctx.cache, bench, self.config.features, part)

    def _descriptor_path(self, bench: Benchmark, part: str, ctx: RunContext) -> Path:
        """The descriptor store folder of one part (:class:`~oxbench.features.descstore.DescriptorStore`)."""
        from oxbench.pipelines.bow import dataset_key

        return Path(ctx.cache) / dataset_key(bench) / "global" / json_digest(self._store_settings(ctx, part), 12) / part

    def _store_settings(self, ctx: RunContext, part: str = "database") -> dict[str, Any]:
        if self.config.descriptor == "cnn":
            extra = {"query_resize": self.config.query_resize} if part == "queries" else {}
            return {**self.config.descriptor_settings(), "weights": self._model(ctx).weights, **extra}
        if self.codebook_path_ is None:
            raise InputError(f"method {self.config.name}: fit before describing images")
        return {**self.config.descriptor_settings(), "codebook": self.codebook_path_.name}

    def describe(self, bench: Benchmark, part: str, ctx: RunContext) -> NDArray[np.float32]:
        """Raw (unwhitened) descriptors ``float32 [n, D]`` of one part, cached; names in part order.

        Descriptors are kept in a resumable :class:`~oxbench.features.descstore.DescriptorStore`:
        an interrupted run resumes with the images not yet described. Images that cannot be decoded
        stop the run, unless ``ctx.allow_partial``: then each is named in a warning, recorded in
        :meth:`provenance` and given the zero descriptor. With ``model_whitening`` the model file's
        learned whitening is applied to what the store holds.
        """
        from oxbench.features.descstore import DescriptorStore, fill_store
        from oxbench.pipelines.bow import _part_names

        if self.config.descriptor == "features":  # the user's own files: nothing to compute or cache
            from oxbench.pipelines.featurefiles import benchmark_features

            return benchmark_features(self.config, bench, part)
        names = _part_names(bench, part)
        path = self._descriptor_path(bench, part, ctx)
        with file_lock(path.with_name(path.name + ".lock"), wait=24 * 3600.0, what=str(path)):
            store = DescriptorStore.open(path, self._store_settings(ctx, part))
            hit = not store.missing(names)
            failed: list[str] = []
            if not hit:
                kind = self.config.descriptor
                compute = self._cnn_compute(bench, part, names, ctx) if kind == "cnn" else self._vlad_compute(bench, part, names, ctx)
                failed = fill_store(store, names, compute, shard_size=512 if kind == "cnn" else 2048,
                                    progress=ctx.progress, desc=f"{kind} {bench.id} {part}")
        ctx.record_step(f"descriptors.{part}", hit=hit)
        if failed:
            self.undecodable_[f"{bench.id}/{part}"] = failed
        x = store.get(names, missing_as_zero=ctx.allow_partial)
        if self.config.model_whitening:
            x = self._model_whitening(ctx, x)
        return x

    def _vlad_compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext):  # noqa: ANN202
        from oxbench.index.vocabulary import Vocabulary

        m = self.config
        assert self.codebook_path_ is not None
        store = self._store(bench, part, ctx)
        voc = Vocabulary.load(self.codebook_path_, descriptor=m.features.descriptor, dim=m.features.dim)
        centroids = voc.centroids_
        assert centroids is not None

        def compute(positions: list[int]) -> tuple[list[int], NDArray[np.float32]]:
            out = np.zeros((len(positions), m.vlad_k * m.features.dim), np.float32)
            for row, i in enumerate(positions):
                _, _, raw, _ = store.get_raw(names[i])
                x = finish_descriptors(raw, m.features.descriptor)
                words = voc.kneighbors(x, 1)[1][:, 0] if len(x) else np.zeros(0, np.int64)
                if not len(x):
                    log.warning("%s %s: image %s has no features; its descriptor is zero (ranks last)", bench.id, part, names[i])
                out[row] = vlad(x, words, centroids, power=m.power, intra_norm=m.intra_norm)
            return positions, out

        return compute

    # --- deep descriptors ----------------------------------------------------------------------
    def _model(self, ctx: RunContext) -> Any:
        """The network (built once per method; weights loaded here, never in a constructor)."""
        if self.model_ is None:
            from oxbench.features.deep import MODELS_PREFIX, resolve_weights_path
            from oxbench.features.deep.model import build_net

            m = self.config
            if m.weights is None:
                raise InputError(
                    f"method {m.name} needs a model file: pass --set weights=MODEL.pt (e.g. the published "
                    "cirtorch weights converted with oxbench import-checkpoint CHECKPOINT --out MODEL.pt)"
                )
            weights: str | Path = m.weights
            if m.weights not in ("random", "imagenet"):
                weights = resolve_weights_path(m.weights, ctx.root)
                if m.weights.startswith(MODELS_PREFIX) and not weights.exists():
                    raise InputError(
                        "no model file here: train it with oxbench train, or pass --set weights=PATH", weights
                    )
            self.model_ = build_net(m.backbone, m.pooling, weights=weights, p=m.gem_p, seed=m.seed)
            if m.pooling == "rmac":
                self.model_.net.pool.grid = m.rmac_grid
        return self.model_

    def _cnn_compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext):  # noqa: ANN202
        from oxbench.features.deep.extract import ExtractOptions, Extractor

        m = self.config
        if self._extractor is None:
            opts = ExtractOptions(max_side=m.max_side, scales=m.scales, precision=m.precision,
                                  batch_size=m.batch_size, device=m.device, workers=max(1, ctx.workers))
            self._extractor = Extractor(self._model(ctx).net, opts)
        read = {"database": bench.database.read, "queries": query_reader(bench, m)}.get(part)
        if read is None:
            assert bench.distractors is not None
            read = bench.distractors.read
        ext = self._extractor

        def compute(positions: list[int]) -> tuple[list[int], NDArray[np.float32]]:
            return ext.describe_sources(read, positions, names, allow_undecodable=ctx.allow_partial)

        return compute

    def _model_whitening(self, ctx: RunContext, x: NDArray[np.float32]) -> NDArray[np.float32]:
        lw = self._model(ctx).whitening(multiscale=len(self.config.scales) > 1)
        if lw is None:
            raise InputError(f"method {self.config.name}: model_whitening is set but the model file carries no learned whitening")
        mean, proj = lw
        return l2_normalize((x.astype(np.float64) - mean) @ proj.T)

    def _finish(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return self.whitening_.transform(x) if self.whitening_ is not None else l2_normalize(x)

    # --- the interface ---------------------------------------------------------------------
    def fit(self, train: Benchmark | None, ctx: RunContext) -> GlobalDescriptors:
        from oxbench.pipelines import bow

        if self.config.descriptor == "features":
            from oxbench.pipelines.featurefiles import fit_file_whitening

            with ctx.timed("whitening"):
                self.whitening_ = fit_file_whitening(self.config)
            return self
        if train is None:
            if not self.config.needs_training:
                return self
            what = "a codebook" if self.config.descriptor == "vlad" else "a whitening"
            raise InputError(f"method {self.config.name} learns {what}: it needs a training set")
        if self.config.descriptor == "vlad":
            cb = self.config.codebook_method()
            hit = bow.vocabulary_path(ctx.cache, cb, train).exists()
            with ctx.timed("codebook"):
                if ctx.full_check or not hit:
                    bow.step_features(train, cb.features, ctx.cache, parts=["database"], workers=ctx.workers,
                                      progress=ctx.progress, full_check=ctx.full_check)  # fmt: skip
                self.codebook_path_ = bow.step_vocabulary(cb, train, ctx.cache, progress=ctx.progress,
                                                          threads=ctx.threads, full_check=ctx.full_check)  # fmt: skip
            ctx.record_step("codebook", hit=hit)
        self.trained_on_ = train.id
        if self.config.whitening != "none":
            with ctx.timed("whitening"):
                self.whitening_ = self._fit_whitening(train, ctx)
        return self

    def _fit_whitening(self, train: Benchmark, ctx: RunContext) -> PCAWhitening:
        from oxbench.pipelines.bow import dataset_key

        m = self.config
        settings = {
            "descriptors": self._descriptor_path(train, "database", ctx).parent.name, "train": dataset_key(train),
            "dim": m.whitening_dim, "power": m.whitening_power, "shrinkage": m.whitening_shrinkage,
            **({"kind": "learned"} if m.whitening == "learned" else {}),
        }  # fmt: skip
        path = Path(ctx.cache) / "whitening" / f"{train.id}-{json_digest(settings, 12)}.npz"
        if path.exists():
            try:
                w = load_whitening(path)
                ctx.record_step("whitening", hit=True)
                return w
            except InputError as exc:
                log.warning("%s; learning the whitening again", exc)
        x = self.describe(train, "database", ctx)
        if m.whitening == "learned":
            from oxbench.train.pairs import matching_pairs

            pairs = matching_pairs(train.gt)
            x = np.concatenate((x, self.describe(train, "queries", ctx)))
            w = LearnedWhitening(m.whitening_dim, shrinkage=m.whitening_shrinkage).fit(
                x, pairs, fitted_on=f"{train.id} database + query crops ({len(x)} images, {len(pairs)} query-positive pairs)"
            )
        else:
            w = PCAWhitening(m.whitening_dim, power=m.whitening_power, shrinkage=m.whitening_shrinkage)
            w.fit(x, fitted_on=f"{train.id} database ({len(x)} images)")
        w.save(path)
        ctx.record_step("whitening", hit=False)
        return w

    def index(self, bench: Benchmark, ctx: RunContext) -> GlobalDescriptors:
        from oxbench.pipelines.bow import dataset_key

        parts = ["database"] + (["distractors"] if bench.distractors is not None else [])
        with ctx.timed("features"):
            raw = [self.describe(bench, p, ctx) for p in parts]
        with ctx.timed("index"):
            db = self._finish(np.concatenate(raw) if len(raw) > 1 else raw[0])
        cache_dir = Path(ctx.cache) / dataset_key(bench) / "global" / "index"
        self._chain = SearchChain(self.config, db, ctx, cache_dir)
        self._indexed = bench.id
        return self

    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        if self._chain is None or self._indexed != bench.id:
            raise InputError(f"method {self.config.name}: index {bench.id} before searching it")
        with ctx.timed("features"):
            q = self._finish(self.describe(bench, "queries", ctx))
        scores, ranks = self._chain.search(q, ctx)
        return SearchResult(ranks, scores.astype(np.float32), dict(self._chain.info))

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trained_on": self.trained_on_}
        if self.config.descriptor == "features":
            from oxbench.pipelines.featurefiles import feature_provenance

            out["feature_files"] = feature_provenance(self.config)
        if self.model_ is not None:
            out["model"] = {**self.model_.net.describe(), "weights": self.model_.weights}
        if self.undecodable_:
            out["undecodable_images"] = dict(self.undecodable_)
        if self.codebook_path_ is not None:
            out["codebook_path"] = str(self.codebook_path_)
        if self.whitening_ is not None:
            out["whitening"] = {"kind": self.whitening_.kind, "fitted_on": self.whitening_.fitted_on_, "dim": self.whitening_.dim}
        return out


def query_reader(bench: Benchmark, m: GlobalMethod) -> Callable[[int], NDArray[np.uint8]]:
    """Query ``i``'s crop as the CNN describes it: with ``query_resize="full-image"`` already
    shrunk by its full image's factor (:func:`~oxbench.features.deep.extract.resize_query_crop`),
    with ``"crop"`` as cut (the extractor shrinks it to ``max_side``)."""
    if m.query_resize == "crop":
        return bench.query_crop
    from oxbench.features.deep.extract import resize_query_crop

    def read(i: int) -> NDArray[np.uint8]:
        crop, full_hw = bench.query_crop_and_size(i)
        return resize_query_crop(crop, full_hw, m.max_side)

    return read


def expand_queries(
    queries: NDArray[np.float32], database: NDArray[np.float32], ranks: NDArray[np.int64], *, k: int, alpha: float
) -> NDArray[np.float32]:
    """Each query replaced by its alpha-weighted mean with its top ``k`` neighbours (alpha 0: AQE)."""
    from oxbench.rerank.qe import alpha_query_expansion

    out = np.empty_like(queries)
    for qi in range(queries.shape[0]):
        top = ranks[qi, :k]
        out[qi] = np.asarray(alpha_query_expansion(queries[qi], database[top], alpha=alpha), np.float32).ravel()
    return out
