"""Global-descriptor methods: one vector per image, whitening, exact or FAISS search, QE, DBA, diffusion.

A :class:`GlobalConfig` describes the whole chain; :class:`GlobalDescriptors` runs it through the
method interface (the family's presets are registered at the end of this module):

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

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.cache import CorruptCache, check_stands_for
from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.features.deep import MODELS_PREFIX, check_fc6_backbone, resolve_weights_path
from oxbench.features.descstore import DescriptorStore, fill_store
from oxbench.features.sift import SiftConfig
from oxbench.features.store import FeatureStore
from oxbench.fileio import file_lock, json_digest
from oxbench.index.footprint import Footprint, array_bytes, disk_bytes
from oxbench.index.vocabulary import Vocabulary
from oxbench.index.whitening import LearnedWhitening, PCAWhitening, l2_normalize, load_whitening
from oxbench.pipelines.featurefiles import (
    benchmark_features,
    feature_provenance,
    fit_file_whitening,
    test_rows_in_training,
)
from oxbench.pipelines.globalchain import SearchChain, array_digest, check_search_settings
from oxbench.pipelines.method import (
    MethodConfig,
    RetrievalMethod,
    RunContext,
    SearchResult,
    register_method,
)
from oxbench.pipelines.rerankers import Pipeline
from oxbench.pipelines.sources import LocalSource
from oxbench.pipelines.steps import (
    VocabularySpec,
    dataset_key,
    load_vocabulary,
    open_store,
    part_names,
    parts_of,
    reopen_store,
    step_features,
    step_vocabulary,
    store_spec,
)
from oxbench.pipelines.steps.settings import CLASSIC_FEATURES
from oxbench.schema import setting, validate
from oxbench.train.loop import TrainConfig, benchmark_training_set
from oxbench.train.loop import train as train_network
from oxbench.train.pairs import matching_pairs

log = logging.getLogger(__name__)


def _no_model_file(path: Path) -> InputError:
    return InputError(
        "no model file here: train it with oxbench train, or pass --set weights=PATH", path
    )


#: The settings of each descriptor kind (VLAD's: the local features it aggregates too); the others
#: are the family's (whitening, search, the stages and their local source). A setting of another
#: kind than the method's is refused in one line, and ``oxbench methods NAME`` leaves it out.
KIND_SETTINGS: dict[str, tuple[str, ...]] = {
    "cnn": (
        "backbone", "weights", "pooling", "rmac_grid", "gem_p", "max_side", "query_resize",
        "scales", "precision", "model_whitening", "fit_network", "train_epochs", "seed",
        "batch_size", "device",
    ),
    "vlad": (
        "features", "vlad_k", "vlad_iter", "vlad_max_points_per_centroid", "vlad_seed", "power", "intra_norm",
    ),
    "features": (
        "db_features", "query_features", "train_features", "train_pairs", "layout", "key",
        "query_key", "query_layout", "db_names", "query_names", "row_order",
    ),
}  # fmt: skip
_KIND_OF = {name: kind for kind, names in KIND_SETTINGS.items() for name in names}


@dataclass(frozen=True)
class GlobalConfig(MethodConfig, Pipeline):
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
        pooling: ``cnn``: ``"mac"``, ``"spoc"``, ``"gem"``, ``"rmac"``, or ``"fc6"`` (the first
            fully connected layer of a VGG / AlexNet classifier, 4,096-D: Babenko et al.'s neural
            codes; refused for a backbone without one).
        rmac_grid: ``cnn`` with R-MAC: the region arithmetic, ``"float32"`` (default: cirtorch's,
            which a published R-MAC model's descriptors need) or ``"float64"`` (double precision;
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
        fit_network: ``cnn`` with a model file as ``weights``: when the file does not exist, ``fit``
            trains it on the training set (:func:`oxbench.train.loop.train` with ``oxbench train``'s
            settings for this backbone, ``train_epochs`` epochs; resumable) and writes it there, the
            same file ``oxbench train`` writes; an existing file is used as it is.
        train_epochs: ``fit_network``: epochs (``None``: ``oxbench train``'s default).
        seed: ``cnn``: initialisation seed of random weights.
        batch_size, device: ``cnn``: images per forward pass; ``"auto"`` (GPU when torch sees
            one), ``"cpu"`` or ``"cuda"``. Neither changes the descriptors beyond float rounding,
            so neither is part of the descriptor cache key.
        vlad_k: codebook size (the descriptor has ``vlad_k * features.dim`` dimensions).
        vlad_iter, vlad_max_points_per_centroid, vlad_seed: codebook k-means settings.
        power: signed power normalisation exponent of every component (0.5: signed square root;
            1: none).
        intra_norm: L2-normalise each centroid's residual sum before the final L2 (intra-norm).
        whitening: ``"none"``, ``"pca"`` (PCA-whitening learned on the training set) or
            ``"learned"`` (learned whitening from the training set's matching pairs).
        whitening_dim: output dimension of the whitening (``None``: as many as the training set
            supports, at most the input dimension).
        whitening_power, whitening_shrinkage: see :class:`~oxbench.index.whitening.PCAWhitening`.
        search: ``"exact"``, ``"faiss-flat"`` (FAISS IndexFlatIP) or ``"faiss-ivfpq"``.
        search_k: ranked-list length (``None``: the whole index up to 100,000 images, else 10,000).
        nlist, pq_m, pq_nbits, nprobe: IVF-PQ cells, sub-quantisers, bits per code, cells visited.
        index_seed: IVF-PQ: the seed of faiss's k-means for the cells and the product quantisers.
        rerank: the stages after the first ranking (:class:`~oxbench.pipelines.rerankers.Pipeline`),
            in order: ``dba`` (database-side augmentation at index time, settings ``dba.*``),
            ``aqe`` / ``alpha-qe`` (query expansion over the top ``qe.k``, settings ``qe.*``),
            ``diffusion`` (Iscen et al. 2017, settings ``diffusion.*``:
            :class:`~oxbench.rerank.diffusion.DiffusionSettings`), or any registered re-ranker
            that works on dense vectors.
        db_features, query_features: with ``descriptor="features"``, the user's descriptor files
            (rows in database / query order of the dataset).
        train_features: the user's training descriptors, for ``whitening`` (never the test set's
            unless the user says so); train_pairs: ``[m, 2]`` matching pairs of its rows
            (``.npy``), for ``whitening="learned"``.
        layout: ``"n-d"`` (``[n, d]``, one row per image) or ``"d-n"`` (``[d, n]``, revisitop's
            MATLAB files) in the files, as ``oxbench evaluate --layout`` reads them.
        key: the array inside an ``.npz`` / ``.mat`` file.
        query_key, query_layout: the query file's own array name and layout (default: ``key``,
            ``layout``), so one revisitop ``.mat`` holding ``X`` and ``Q`` serves both files.
    """

    family: ClassVar[str] = "global"

    name: str
    descriptor: Literal["vlad", "cnn", "features"] = setting(
        "vlad", S.Choice("vlad", "cnn", "features"), doc="how an image becomes one vector"
    )
    features: SiftConfig = field(default_factory=SiftConfig)
    backbone: str = setting(
        "resnet50", S.Str(min_len=1, max_len=256), doc="cnn: torchvision trunk or timm:<name>"
    )
    weights: str | None = setting(
        "imagenet",
        S.Optional(S.Str(min_len=1, max_len=4096)),
        doc="cnn: random, imagenet, a model file or models:<file>",
    )
    pooling: Literal["mac", "spoc", "gem", "rmac", "fc6"] = setting(
        "gem", S.Choice("mac", "spoc", "gem", "rmac", "fc6"), doc="cnn: pooling head"
    )
    rmac_grid: Literal["float64", "float32"] = setting(
        "float32", S.Choice("float64", "float32"), doc="cnn R-MAC: region arithmetic"
    )
    gem_p: float = setting(3.0, S.Float(lo=0, lo_open=True, hi=100), doc="cnn: GeM exponent")
    max_side: int = setting(1024, S.Int(lo=16, hi=1 << 16), doc="cnn: longer image side (px)")
    query_resize: Literal["full-image", "crop"] = setting(
        "full-image", S.Choice("full-image", "crop"), doc="cnn: how a query crop is shrunk"
    )
    scales: tuple[float, ...] = setting(
        (1.0, 2.0**-0.5, 0.5),
        S.FloatTuple(S.Float(lo=0, lo_open=True, hi=4), max_len=16),
        doc="cnn: multi-scale factors",
    )
    precision: Literal["fp32", "bf16"] = setting(
        "fp32", S.Choice("fp32", "bf16"), doc="cnn: trunk precision"
    )
    model_whitening: bool = setting(False, S.Bool(), doc="cnn: the model file's learned whitening")
    fit_network: bool = setting(False, S.Bool(), doc="cnn: fit trains a missing model file")
    train_epochs: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=10_000)), doc="fit_network: epochs"
    )
    seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="cnn: seed of random weights")
    batch_size: int = setting(8, S.Int(lo=1, hi=4096), doc="cnn: images per forward pass")
    device: str = setting("auto", S.DEVICE, doc="cnn: auto, cpu, cuda or cuda:<n>")
    vlad_k: int = setting(64, S.Int(lo=2, hi=1 << 16), doc="vlad: codebook size")
    vlad_iter: int = setting(20, S.Int(lo=1, hi=1000), doc="vlad: k-means iterations")
    vlad_max_points_per_centroid: int | None = setting(
        256, S.Optional(S.Int(lo=1, hi=1 << 20)), doc="vlad: training descriptors per word"
    )
    vlad_seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="vlad: k-means seed")
    power: float = setting(
        0.5, S.Float(lo=0, lo_open=True, hi=1), doc="vlad: signed power normalisation"
    )
    intra_norm: bool = setting(True, S.Bool(), doc="vlad: intra-normalisation")
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
    search: Literal["exact", "faiss-flat", "faiss-ivfpq"] = setting(
        "exact", S.Choice("exact", "faiss-flat", "faiss-ivfpq"), doc="search index"
    )
    search_k: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1 << 24)), doc="ranked-list length"
    )
    nlist: int = setting(256, S.Int(lo=1, hi=1 << 20), doc="IVF-PQ cells")
    pq_m: int = setting(16, S.Int(lo=1, hi=4096), doc="IVF-PQ sub-quantisers")
    pq_nbits: int = setting(8, S.Int(lo=1, hi=16), doc="IVF-PQ bits per code")
    nprobe: int = setting(16, S.Int(lo=1, hi=1 << 20), doc="IVF-PQ cells visited")
    index_seed: int = setting(
        0, S.Int(lo=0, hi=2**32 - 1), doc="IVF-PQ: k-means seed of the cell and PQ quantisers"
    )
    db_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: database descriptor file", input=True
    )
    query_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: query descriptor file", input=True
    )
    train_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: training descriptors", input=True
    )
    train_pairs: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: matching pairs (.npy)", input=True
    )
    layout: Literal["n-d", "d-n"] = setting(
        "n-d", S.Choice("n-d", "d-n"), doc="features: rows or columns per image", input=True
    )
    key: str | None = setting(
        None,
        S.Optional(S.Str(min_len=1, max_len=256)),
        doc="features: array in .npz/.mat",
        input=True,
    )
    query_key: str | None = setting(
        None,
        S.Optional(S.Str(min_len=1, max_len=256)),
        doc="features: query array in .npz/.mat (default: key; revisitop .mat: Q)",
        input=True,
    )
    query_layout: Literal["n-d", "d-n"] | None = setting(
        None,
        S.Optional(S.Choice("n-d", "d-n")),
        doc="features: query file's layout (default: layout)",
        input=True,
    )
    db_names: str | None = setting(
        None,
        S.Optional(S.PathSetting()),
        doc="features: names of db_features' rows (.txt, or strings in .npz/.h5/.mat)",
        input=True,
    )
    query_names: str | None = setting(
        None,
        S.Optional(S.PathSetting()),
        doc="features: names of query_features' rows (as db_names)",
        input=True,
    )
    row_order: Literal["dataset", "sorted"] = setting(
        "dataset",
        S.Choice("dataset", "sorted"),
        doc="features: rows in the ground truth's order, or in sorted image-name order",
        input=True,
    )

    def __post_init__(self) -> None:
        validate(self)  # every setting's type and range (one line naming it)
        self._check_kind_settings()
        if self.descriptor == "cnn":
            self._check_cnn()
        check_search_settings(self)

    def _check_kind_settings(self) -> None:
        """A setting of another descriptor kind than the method's, changed from its default, is
        one line (it would do nothing); :func:`~oxbench.pipelines.method.resolve_method` also
        refuses one set to its default."""
        for f in dataclasses.fields(self):
            if self.inapplicable(f.name) is None:
                continue
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]
            value = getattr(self, f.name)
            if value == default:
                continue
            name = f.name  # a nested setting by its dotted name (features.max_side)
            if type(value) is type(default) and dataclasses.is_dataclass(value):
                name += "." + next(
                    g.name
                    for g in dataclasses.fields(value)
                    if getattr(value, g.name) != getattr(default, g.name)
                )
            raise InputError(self.inapplicable(name) or name)

    def inapplicable(self, setting: str) -> str | None:
        """The settings of another descriptor kind than the method's (the family's own --
        whitening, search, the stages and their local source -- always apply)."""
        kind = _KIND_OF.get(setting.split(".", 1)[0], self.descriptor)
        if kind == self.descriptor:
            return None
        return (
            f"method {self.name}: {setting} is a setting of descriptor={kind}, and {self.name} "
            f"describes images with descriptor={self.descriptor}"
        )

    def _check_cnn(self) -> None:
        if self.pooling == "fc6":
            check_fc6_backbone(self.backbone)
        if self.model_whitening and self.weights in ("random", "imagenet"):
            raise InputError(
                f"method {self.name}: model_whitening needs a model file that carries one (weights=PATH)"
            )
        if self.model_whitening and self.whitening != "none":
            raise InputError(
                f"method {self.name}: model_whitening already whitens; set whitening=none"
            )

    def shorthand(self, option: str) -> str | None:
        """``max_side``: the CNN's own setting for ``descriptor="cnn"``; ``vocab_size``: none."""
        if option == "max_side" and self.descriptor == "cnn":
            return "max_side"
        if option == "vocab_size":
            return None
        return super().shorthand(option)

    @property
    def local_features(self) -> SiftConfig | None:
        """The local features VLAD aggregates; a CNN and the user's files extract none."""
        return self.features if self.descriptor == "vlad" else None

    @property
    def needs_training(self) -> bool:
        """VLAD learns its codebook; a CNN descriptor learns only a whitening, when asked for; user
        feature files learn nothing on a benchmark (their whitening uses ``train_features``)."""
        if self.descriptor == "features":
            return False
        return self.descriptor == "vlad" or self.whitening != "none" or self.trains_network

    @property
    def trains_network(self) -> bool:
        """Whether ``fit`` trains the network into its model file (``fit_network`` with a file)."""
        return (
            self.descriptor == "cnn"
            and self.fit_network
            and self.weights not in (None, "random", "imagenet")
        )

    @property
    def reads_images(self) -> bool:
        """User feature files replace every step that reads pixels."""
        return self.descriptor != "features"

    def check_inputs(self, root: Path | None = None) -> None:
        """A model file that is neither there nor to be trained (``fit_network``), and descriptor
        files that are not regular files, are refused before any data is loaded."""
        from oxbench.fileio import require_regular_file

        if (
            self.descriptor == "cnn"
            and self.weights not in (None, "random", "imagenet")
            and not self.trains_network
        ):
            assert self.weights is not None
            path = resolve_weights_path(self.weights, root)
            if not path.exists():
                raise _no_model_file(path)
            require_regular_file(path)
        if self.descriptor == "features":
            for name in (
                "db_features",
                "query_features",
                "train_features",
                "train_pairs",
                "db_names",
                "query_names",
            ):
                value = getattr(self, name)
                if value is not None:
                    try:
                        require_regular_file(value)
                    except InputError as exc:
                        raise InputError(f"{name}: {exc.problem}", value) from None

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """The descriptor files, and a model file given as ``weights`` (not one ``fit`` trains)."""
        out = super().input_files(root)
        if self.descriptor != "features":
            out = {}
        if (
            self.descriptor == "cnn"
            and self.weights not in (None, "random", "imagenet")
            and not self.trains_network
        ):
            assert self.weights is not None
            out["weights"] = resolve_weights_path(self.weights, root)
        return out

    def test_data_in_training(self, bench: Benchmark) -> str | None:
        """User feature files: ``train_features`` holding the test descriptors
        (:func:`~oxbench.pipelines.featurefiles.test_rows_in_training`)."""
        if self.descriptor != "features":
            return None
        return test_rows_in_training(self, bench)

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """A CNN's torch and torchvision (timm for a ``timm:`` trunk), VLAD's SIFT and k-means, a FAISS index."""
        out: list[tuple[str, str]] = []
        if self.descriptor == "cnn":
            out += [("torch", "deep"), ("torchvision", "deep")]
            if self.backbone.startswith("timm:"):
                out.append(("timm", "deep"))
        elif self.descriptor == "vlad":
            out += [("cv2", "classic"), ("faiss", "classic")]
        if self.search.startswith("faiss") and ("faiss", "classic") not in out:
            out.append(("faiss", "classic"))
        return tuple(out)

    def build(self) -> GlobalDescriptors:
        return GlobalDescriptors(self)

    def ram_bytes_per_image(self) -> int | None:
        """The raw descriptors and the searched (whitened) vectors, both ``float32`` while the index
        is built, plus an IVF-PQ code and id; ``None`` when the dimension is unknown from the
        settings (a CNN or the user's files)."""
        if self.descriptor != "vlad":
            return None
        raw = self.vlad_k * self.features.dim
        out = min(self.whitening_dim or raw, raw) if self.whitening != "none" else raw
        code = self.pq_m * self.pq_nbits // 8 + 8 if self.search == "faiss-ivfpq" else 0
        return 4 * (raw + out) + code

    def codebook(self) -> VocabularySpec:
        """The flat k-means vocabulary VLAD uses (the shared vocabulary step trains it)."""
        return VocabularySpec(
            self.features,
            self.vlad_k,
            "flat",
            self.vlad_iter,
            self.vlad_max_points_per_centroid,
            seed=self.vlad_seed,
        )

    def descriptor_settings(self) -> dict[str, Any]:
        """What determines one image's descriptor (cache key, with the codebook or the weights)."""
        if self.descriptor == "cnn":
            return {
                "descriptor": "cnn",
                "backbone": self.backbone,
                "pooling": self.pooling,
                "gem_p": self.gem_p,
                "max_side": self.max_side,
                "scales": list(self.scales),
                "precision": self.precision,
                **({"rmac_grid": self.rmac_grid} if self.pooling == "rmac" else {}),
            }
        return {
            "descriptor": self.descriptor,
            "features": self.features.to_dict(),
            "vlad_k": self.vlad_k,
            "power": self.power,
            "intra_norm": self.intra_norm,
        }


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


class VladImage:
    """Picklable job: the VLAD vector of image ``i`` of a part (its features reopened where it runs)."""

    def __init__(
        self,
        config: GlobalConfig,
        store: tuple[Path, Any, dict[str, object]],
        voc: Vocabulary,
        names: list[str],
        what: str,
    ) -> None:
        self.config, self.store_spec, self.voc, self.names, self.what = (
            config,
            store,
            voc,
            names,
            what,
        )
        self.dim = config.vlad_k * config.features.dim
        self._store: FeatureStore | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_store": None}

    def __call__(self, i: int) -> NDArray[np.float32]:
        if self._store is None:
            self._store = reopen_store(self.store_spec)
        m, centroids = self.config, self.voc.centroids_
        assert centroids is not None
        x = m.features.finish(self._store.get_raw(self.names[i]).descriptors)
        if not len(x):
            log.warning(
                "%s: image %s has no features; its descriptor is zero (ranks last)",
                self.what,
                self.names[i],
            )
            return np.zeros(self.dim, np.float32)
        words = self.voc.kneighbors(x, 1)[1][:, 0]
        return vlad(x, words, centroids, power=m.power, intra_norm=m.intra_norm)


#: Images per descriptor shard: a CNN task of a minute or more on a GPU (the plan is fixed by it).
CNN_SHARD_SIZE = 512
#: Images per VLAD descriptor shard.
VLAD_SHARD_SIZE = 2048


class VladShard:
    """Picklable :data:`~oxbench.features.descstore.Compute`: the VLAD vectors of some images."""

    def __init__(self, image: VladImage) -> None:
        self.image = image

    def __call__(self, positions: list[int]) -> tuple[list[int], NDArray[np.float32]]:
        rows = [self.image(i) for i in positions]
        return positions, np.stack(rows) if rows else np.zeros((0, self.image.dim), np.float32)


@dataclass(frozen=True)
class NetSpec:
    """What builds a method's network again where a task runs (another process, a GPU worker)."""

    backbone: str
    pooling: str
    weights: str | Path
    p: float
    seed: int
    rmac_grid: Any

    def build(self) -> Any:
        """The :class:`~oxbench.features.deep.model.LoadedModel`."""
        from oxbench.features.deep.model import build_net

        model = build_net(
            self.backbone, self.pooling, weights=self.weights, p=self.p, seed=self.seed
        )
        if self.pooling == "rmac":
            model.net.pool.grid = self.rmac_grid
        return model


class CnnShard:
    """Picklable :data:`~oxbench.features.descstore.Compute`: CNN descriptors of some images.

    The network is built once per process that runs it, on its first task (here the driver's
    network is reused). With a CUDA device it asks for a ``GPU`` resource, so that a Dask cluster
    runs it only on a worker that offers one (``dask worker --resources GPU=1``).
    """

    def __init__(
        self,
        spec: NetSpec,
        options: Any,
        read: Callable[[int], NDArray[np.uint8]],
        names: list[str],
        *,
        allow_partial: bool,
        model: Any = None,
    ) -> None:
        self.spec, self.options, self.read, self.names = spec, options, read, names
        self.allow_partial = allow_partial
        self.resources = {"GPU": 1} if str(options.device).startswith("cuda") else None
        self._model = model
        self._extractor: Any = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_model": None, "_extractor": None}

    def __call__(self, positions: list[int]) -> tuple[list[int], NDArray[np.float32]]:
        if self._extractor is None:
            from oxbench.execution import available_cores
            from oxbench.features.deep.extract import Extractor

            model = self._model if self._model is not None else self.spec.build()
            threads = min(self.options.decode_threads, available_cores())
            self._extractor = Extractor(
                model.net, dataclasses.replace(self.options, decode_threads=threads)
            )
        return self._extractor.describe_sources(
            self.read, positions, self.names, allow_undecodable=self.allow_partial
        )


class GlobalDescriptors(RetrievalMethod):
    """Runs a :class:`GlobalConfig`: codebook and whitening on the training set, exact search, QE."""

    offers_vectors = True

    def __init__(self, config: GlobalConfig) -> None:
        self.config: GlobalConfig = config
        self.codebook_path_: Path | None = None
        self.whitening_: PCAWhitening | None = None
        self.trained_on_: str | None = None
        self._chain: SearchChain | None = None
        self._indexed: str | None = None
        self.model_: Any = None  # cnn: oxbench.features.deep.model.LoadedModel
        self.undecodable_: dict[str, list[str]] = {}
        self._index_stores: dict[str, list[Path]] = {}  # what the index keeps on disk, by kind

    # --- descriptors -----------------------------------------------------------------------
    def _store(self, bench: Benchmark, part: str, ctx: RunContext) -> FeatureStore:
        step_features(bench, self.config.features, ctx, parts=[part])
        return open_store(ctx.cache, bench, self.config.features, part)

    def _descriptor_path(self, bench: Benchmark, part: str, ctx: RunContext) -> Path:
        """The descriptor store folder of one part (:class:`~oxbench.features.descstore.DescriptorStore`)."""
        return (
            Path(ctx.cache)
            / dataset_key(bench)
            / "global"
            / json_digest(self._store_settings(ctx, part), 12)
            / part
        )

    def _store_settings(self, ctx: RunContext, part: str = "database") -> dict[str, Any]:
        if self.config.descriptor == "cnn":
            extra = {"query_resize": self.config.query_resize} if part == "queries" else {}
            return {
                **self.config.descriptor_settings(),
                "weights": self._model(ctx).weights,
                **extra,
            }
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
        if (
            self.config.descriptor == "features"
        ):  # the user's own files: nothing to compute or cache
            return benchmark_features(self.config, bench, part)
        names = part_names(bench, part)
        path = self._descriptor_path(bench, part, ctx)
        with file_lock(path.with_name(path.name + ".lock"), wait=24 * 3600.0, what=str(path)):
            store = DescriptorStore.open(path, self._store_settings(ctx, part))
            hit = not store.missing(names)
            failed: list[str] = []
            if not hit:
                kind = self.config.descriptor
                compute = (
                    self._cnn_compute(bench, part, names, ctx)
                    if kind == "cnn"
                    else self._vlad_compute(bench, part, names, ctx)
                )
                failed = fill_store(
                    store,
                    names,
                    compute,
                    executor=ctx.executor,
                    shard_size=CNN_SHARD_SIZE if kind == "cnn" else VLAD_SHARD_SIZE,
                    progress=ctx.progress,
                    desc=f"{kind} {bench.id} {part}",
                )
        ctx.record_step(f"descriptors.{part}", hit=hit)
        if failed:
            self.undecodable_[f"{bench.id}/{part}"] = failed
        x = store.get(names, missing_as_zero=ctx.allow_partial)
        if self.config.model_whitening:
            x = self._model_whitening(ctx, x)
        return x

    def describe_parts(
        self,
        bench: Benchmark,
        ctx: RunContext,
        *,
        training: bool = False,
        partition: tuple[int, int] | None = None,
    ) -> dict[str, int]:
        """A CNN's descriptor shards of every part (of a training set: what the whitening reads);
        VLAD's local features (its descriptor shards need the codebook, learned in ``fit``); the
        user's files: nothing. A test set's local source (GeM + SV) too, as
        ``local_source.<part>``."""
        m = self.config
        if m.descriptor != "cnn":
            out = super().describe_parts(bench, ctx, training=training, partition=partition)
        elif training:
            parts = ["database"] + (["queries"] if m.whitening == "learned" else [])
            out = {part: self._describe_shards(bench, part, ctx, partition) for part in parts}
        else:
            out = {p: self._describe_shards(bench, p, ctx, partition) for p in parts_of(bench)}
        if m.local_source is not None and not training:
            done = step_features(bench, m.local_source, ctx, partition=partition)
            out.update({f"local_source.{part}": res.computed for part, res in done.items()})
        return out

    def _describe_shards(
        self, bench: Benchmark, part: str, ctx: RunContext, partition: tuple[int, int] | None
    ) -> int:
        """Describe the planned CNN descriptor shards of one part (of ``partition`` when given);
        returns the images described."""
        names = part_names(bench, part)
        path = self._descriptor_path(bench, part, ctx)
        store = DescriptorStore.open(path, self._store_settings(ctx, part))
        before = len(store)
        fill_store(
            store,
            names,
            self._cnn_compute(bench, part, names, ctx),
            executor=ctx.executor,
            shard_size=CNN_SHARD_SIZE,
            progress=ctx.progress,
            desc=f"cnn {bench.id} {part}",
            partition=partition,
        )
        return len(store) - before

    def vectors(self, bench: Benchmark, parts: list[str], ctx: RunContext) -> NDArray[np.float32]:
        """The descriptors of ``parts`` as the method searches with them (:meth:`finish`)."""
        raw = [self.describe(bench, p, ctx) for p in parts]
        return self.finish(np.concatenate(raw) if len(raw) > 1 else raw[0])

    def _vlad_compute(
        self, bench: Benchmark, part: str, names: list[str], ctx: RunContext
    ) -> VladShard:
        assert self.codebook_path_ is not None
        store = self._store(bench, part, ctx)
        return VladShard(
            VladImage(
                self.config,
                store_spec(store),
                load_vocabulary(self.codebook_path_, self.config.features),
                names,
                f"{bench.id} {part}",
            )
        )

    # --- deep descriptors ----------------------------------------------------------------------
    def _net_spec(self, ctx: RunContext) -> NetSpec:
        """What builds the network (weights resolved; the model file must exist)."""
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
                raise _no_model_file(weights)
        return NetSpec(m.backbone, m.pooling, weights, m.gem_p, m.seed, m.rmac_grid)

    def _model(self, ctx: RunContext) -> Any:
        """The network (built once per method; weights loaded here, never in a constructor)."""
        if self.model_ is None:
            self.model_ = self._net_spec(ctx).build()
        return self.model_

    def _cnn_compute(
        self, bench: Benchmark, part: str, names: list[str], ctx: RunContext
    ) -> CnnShard:
        from oxbench.features.deep.extract import ExtractOptions

        m = self.config
        workers = max(1, ctx.workers)
        opts = ExtractOptions(
            max_side=m.max_side,
            scales=m.scales,
            precision=m.precision,
            batch_size=m.batch_size,
            device=m.device,
            decode_threads=max(1, ctx.decode_threads // workers),
        )
        read: Callable[[int], NDArray[np.uint8]]
        if part == "database":
            read = bench.database.read
        elif part == "queries":
            read = QueryCrops(bench, m.query_resize, m.max_side)
        else:
            assert bench.distractors is not None
            read = bench.distractors.read
        here = (
            ctx.executor.backend == "serial"
        )  # the driver's network, unless the tasks run elsewhere
        return CnnShard(
            self._net_spec(ctx),
            opts,
            read,
            names,
            allow_partial=ctx.allow_partial,
            model=self._model(ctx) if here else None,
        )

    def _model_whitening(self, ctx: RunContext, x: NDArray[np.float32]) -> NDArray[np.float32]:
        lw = self._model(ctx).whitening(multiscale=len(self.config.scales) > 1)
        if lw is None:
            raise InputError(
                f"method {self.config.name}: model_whitening is set but the model file carries no learned whitening"
            )
        mean, proj = lw
        return l2_normalize((x.astype(np.float64) - mean) @ proj.T)

    def finish(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        """Descriptors as the method searches with them: whitened when it whitens, L2-normalised."""
        return self.whitening_.transform(x) if self.whitening_ is not None else l2_normalize(x)

    # --- the interface ---------------------------------------------------------------------
    def fit(self, train: Benchmark | None, ctx: RunContext) -> GlobalDescriptors:
        if self.config.descriptor == "features":
            with ctx.timed("whitening"):
                self.whitening_ = fit_file_whitening(self.config)
            return self
        if train is None:
            if not self.config.needs_training:
                return self
            what = "a codebook" if self.config.descriptor == "vlad" else "a whitening"
            raise InputError(f"method {self.config.name} learns {what}: it needs a training set")
        if self.config.descriptor == "vlad":
            with ctx.timed("codebook"):
                res = step_vocabulary(self.config.codebook(), train, ctx)
            self.codebook_path_ = res.path
            ctx.record_step("codebook", hit=res.hit)
        self.trained_on_ = train.id
        if self.config.trains_network:
            with ctx.timed("network"):
                hit = self._fit_network(train, ctx)
            ctx.record_step("network", hit=hit)
        if self.config.whitening != "none":
            with ctx.timed("whitening"):
                self.whitening_ = self._fit_whitening(train, ctx)
        return self

    def _fit_network(self, train: Benchmark, ctx: RunContext) -> bool:
        """Train the network into its model file unless the file exists; ``True``: it existed."""
        m = self.config
        assert m.weights is not None
        path = resolve_weights_path(m.weights, ctx.root)
        if path.exists():
            return True
        config = TrainConfig(backbone=m.backbone, pooling=m.pooling, dataset=train.id, seed=m.seed)
        if m.train_epochs is not None:
            config = dataclasses.replace(config, epochs=m.train_epochs)
        log.info(
            "training %s + %s on %s into %s (resumable)", m.backbone, m.pooling, train.id, path
        )
        ts = benchmark_training_set(train, config.image_size, progress=ctx.progress)
        train_network(config, ts, path, progress=ctx.progress)
        self.model_ = None  # load what was written
        return False

    def _fit_whitening(self, train: Benchmark, ctx: RunContext) -> PCAWhitening:
        m = self.config
        settings = {
            "descriptors": self._descriptor_path(train, "database", ctx).parent.name,
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
        with ctx.timed("index"):
            db = self.finish(np.concatenate(raw) if len(raw) > 1 else raw[0])
        cache_dir = Path(ctx.cache) / dataset_key(bench) / "global" / "index"
        local = None
        if self.config.local_source is not None:  # GeM + SV: a short list verified locally
            local = LocalSource(
                self.config.local_source, self.config.stage("spatial").verification()
            )
            local.prepare(bench, ctx)
        self._chain = SearchChain(self.config, db, ctx, cache_dir, local=local)
        self._indexed = bench.id
        self._index_stores = self._stores_on_disk(bench, parts, ctx)
        return self

    def _stores_on_disk(
        self, bench: Benchmark, parts: list[str], ctx: RunContext
    ) -> dict[str, list[Path]]:
        m = self.config
        if m.descriptor == "features":
            return {"descriptor_files": [Path(m.db_features)] if m.db_features else []}
        out = {"descriptors": [self._descriptor_path(bench, p, ctx) for p in parts]}
        if m.descriptor == "vlad":  # the local features VLAD was aggregated from stay in the cache
            out["local_features"] = [
                open_store(ctx.cache, bench, m.features, p).directory for p in parts
            ]
        return out

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
        fixed_disk = (
            {"codebook": disk_bytes(self.codebook_path_)} if self.codebook_path_ is not None else {}
        )
        return Footprint(
            chain.db.shape[0], ram=ram, disk=disk, fixed_ram=fixed, fixed_disk=fixed_disk
        )

    def search(self, bench: Benchmark, ctx: RunContext) -> SearchResult:
        if self._chain is None or self._indexed != bench.id:
            raise InputError(f"method {self.config.name}: index {bench.id} before searching it")
        with ctx.timed("features"):
            q = self.finish(self.describe(bench, "queries", ctx))
        result = self._chain.search(q, ctx)
        assert result.scores is not None
        return dataclasses.replace(result, scores=result.scores.astype(np.float32))

    def provenance(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trained_on": self.trained_on_}
        if self.config.descriptor == "features":
            out["feature_files"] = feature_provenance(self.config)
        if self.model_ is not None:
            out["model"] = {**self.model_.net.describe(), "weights": self.model_.weights}
        if self.undecodable_:
            out["undecodable_images"] = dict(self.undecodable_)
        if self.codebook_path_ is not None:
            out["codebook_path"] = str(self.codebook_path_)
        if self.whitening_ is not None:
            out["whitening"] = {
                "kind": self.whitening_.kind,
                "fitted_on": self.whitening_.fitted_on_,
                "dim": self.whitening_.dim,
            }
        return out


class QueryCrops:
    """Picklable reader of query ``i``'s crop as the CNN describes it: with
    ``query_resize="full-image"`` already shrunk by its full image's factor
    (:func:`~oxbench.features.deep.extract.resize_query_crop`), with ``"crop"`` as cut (the
    extractor shrinks it to ``max_side``)."""

    def __init__(self, bench: Benchmark, query_resize: str, max_side: int) -> None:
        self.bench, self.query_resize, self.max_side = bench, query_resize, max_side

    def __call__(self, i: int) -> NDArray[np.uint8]:
        if self.query_resize == "crop":
            return self.bench.query_crop(i)
        from oxbench.features.deep.extract import resize_query_crop

        crop, full_hw = self.bench.query_crop_and_size(i)
        return resize_query_crop(crop, full_hw, self.max_side)


# --- presets -------------------------------------------------------------------------------------

# VLAD over RootSIFT (64 words x 128 = 8,192 dimensions), as a framework-free global descriptor.
register_method(GlobalConfig("rootsift-vlad"))
register_method(GlobalConfig("rootsift-vlad-w", whitening="pca"))
register_method(GlobalConfig("rootsift-vlad-w-aqe", whitening="pca", rerank=("aqe",)))
register_method(GlobalConfig("rootsift-vlad-w-alpha-qe", whitening="pca", rerank=("alpha-qe",)))

# --- deep global descriptors (descriptor="cnn"; needs oxbench[deep]) -------------------------------
# Multi-scale (1, 1/sqrt(2), 1/2) at 1024 px, as the published GeM models are evaluated. "+w" is the
# PCA-whitening learned on the training set (the other city), or for gem-r101 the learned whitening
# that came with the published model; "+aqe" / "+alpha-qe" re-rank by query expansion.

# The published ResNet-101 GeM (Radenovic et al. 2018, cirtorch retrievalSfM120k-resnet101-gem): the
# user supplies the weights, converted once with `oxbench import-checkpoint CHECKPOINT --out MODEL.pt`,
# and runs `oxbench run --dataset roxford5k --method gem-r101+w --set weights=MODEL.pt`.


def _cnn(name: str, backbone: str, pooling: str, weights: str | None, **more: Any) -> GlobalConfig:
    return register_method(
        GlobalConfig(
            name,
            descriptor="cnn",
            backbone=backbone,
            pooling=pooling,  # type: ignore[arg-type]
            weights=weights,
            **more,
        )
    )  # type: ignore[return-value]


_cnn("gem-r101", "resnet101", "gem", None)
_cnn("gem-r101+w", "resnet101", "gem", None, model_whitening=True)
_cnn("gem-r101+w+alpha-qe", "resnet101", "gem", None, model_whitening=True, rerank=("alpha-qe",))

# Off-the-shelf ImageNet trunks (torchvision's weights, from its cache) with each pooling head.
_cnn("gem-r50-imagenet", "resnet50", "gem", "imagenet")
_cnn("gem-r50-imagenet+w", "resnet50", "gem", "imagenet", whitening="pca")
_cnn("gem-r50-imagenet+w+aqe", "resnet50", "gem", "imagenet", whitening="pca", rerank=("aqe",))
_cnn(
    "gem-r50-imagenet+w+alpha-qe",
    "resnet50",
    "gem",
    "imagenet",
    whitening="pca",
    rerank=("alpha-qe",),
)
_cnn("mac-r50-imagenet", "resnet50", "mac", "imagenet")
_cnn("spoc-r50-imagenet", "resnet50", "spoc", "imagenet")
_cnn("rmac-r50-imagenet", "resnet50", "rmac", "imagenet")
_cnn("rmac-r50-imagenet+w", "resnet50", "rmac", "imagenet", whitening="pca")

# The seed's CNN rows (docs/deep.md says what each needs and the number it would reproduce).
# Babenko et al. ECCV 2014, "neural codes": the fc6 layer (4,096-D, after its ReLU, L2-normalised)
# of an ImageNet classifier, the image (a query: its crop) shrunk to the classifier's 224 px, one
# scale; "+pca": plain PCA (no whitening: power 0) to 256-D learned on the training set (the other
# city).
_FC6: dict[str, Any] = {"max_side": 224, "scales": (1.0,), "query_resize": "crop"}
_PCA256: dict[str, Any] = {"whitening": "pca", "whitening_dim": 256, "whitening_power": 0.0}
_cnn("neural-codes-alexnet", "alexnet", "fc6", "imagenet", **_FC6)
_cnn("neural-codes-alexnet+pca", "alexnet", "fc6", "imagenet", **_FC6, **_PCA256)
_cnn("neural-codes-vgg16", "vgg16", "fc6", "imagenet", **_FC6)
_cnn("neural-codes-vgg16+pca", "vgg16", "fc6", "imagenet", **_FC6, **_PCA256)
# Tolias et al. ICLR 2016: R-MAC of ImageNet VGG16 (512-D) at one scale, 1024 px, PCA-whitened with
# the whitening learned on the other city.
_cnn("rmac-vgg16-imagenet+w", "vgg16", "rmac", "imagenet", whitening="pca", scales=(1.0,))

# ResNet-18 GeM trained from scratch on the synthetic training city by `oxbench train`, which writes
# <data root>/_models/gem-r18-synthetic.pt ($OXBENCH_MODELS overrides the folder). Described at the
# size it was trained at (160 px, one scale: a network trained from scratch on small images has not
# learned the features of large ones). "+lw": the learned whitening stored in the model file.
_R18 = "models:gem-r18-synthetic.pt"
# On a fresh data root, fit trains the model file (fit_network), exactly as `oxbench train` would.
_R18_SIZE: dict[str, Any] = {"max_side": 160, "scales": (1.0,), "fit_network": True}
_cnn("gem-r18-synthetic", "resnet18", "gem", _R18, **_R18_SIZE)
_cnn("gem-r18-synthetic+w", "resnet18", "gem", _R18, whitening="pca", **_R18_SIZE)
_cnn("gem-r18-synthetic+lw", "resnet18", "gem", _R18, model_whitening=True, **_R18_SIZE)
_cnn(
    "gem-r18-synthetic+w+alpha-qe",
    "resnet18",
    "gem",
    _R18,
    whitening="pca",
    rerank=("alpha-qe",),
    **_R18_SIZE,
)

# --- your own descriptors ------------------------------------------------------------------------

# The user's database / query descriptor files (--set db_features=PATH --set query_features=PATH),
# through the same whitening, search, QE, DBA and diffusion (oxbench.pipelines.featurefiles).
register_method(GlobalConfig("features", descriptor="features"))
register_method(GlobalConfig("features-aqe", descriptor="features", rerank=("aqe",)))
register_method(GlobalConfig("features-alpha-qe", descriptor="features", rerank=("alpha-qe",)))
register_method(GlobalConfig("features-dba", descriptor="features", rerank=("dba",)))
register_method(GlobalConfig("features-diffusion", descriptor="features", rerank=("diffusion",)))
register_method(GlobalConfig("features-ivfpq", descriptor="features", search="faiss-ivfpq"))

# --- hybrid rows: a global short list verified with local features (pipelines/sources.py) ---------
# RootSIFT at the classic presets' settings, descriptor-matched (no vocabulary): "+sv" verifies the
# top spatial.top_r of the global ranking; the local features are the bag-of-words presets' store.
register_method(
    GlobalConfig(
        "rootsift-vlad-w+sv", whitening="pca", local_source=CLASSIC_FEATURES, rerank=("spatial",)
    )
)
_cnn(
    "gem-r101+w+sv",
    "resnet101",
    "gem",
    None,
    model_whitening=True,
    local_source=CLASSIC_FEATURES,
    rerank=("spatial",),
)
