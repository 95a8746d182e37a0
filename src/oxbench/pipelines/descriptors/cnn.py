"""CNN / ViT descriptors (``descriptor=cnn``): an activation map pooled by MAC, SPoC, GeM or R-MAC,
multi-scale, or a classifier's fc6 layer (:mod:`oxbench.features.deep`; needs ``oxbench[deep]``).

The network comes from its ``weights``: random (seeded), the library's ImageNet weights, or a model
file (``oxbench import-checkpoint`` / ``oxbench train``); with ``fit_network`` a missing model file
is trained on the training set in ``fit``. Descriptors are cached per part keyed by the settings
that determine them and the weights' digest; ``batch_size`` and ``device`` change nothing but float
rounding and are not part of the key.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.features.deep import MODELS_PREFIX, check_fc6_backbone, resolve_weights_path
from oxbench.index.whitening import l2_normalize
from oxbench.pipelines.descriptors import (
    DescriptorKind,
    FamilySettings,
    PartImages,
    StoredDescriber,
    register_descriptor,
)
from oxbench.pipelines.method import RunContext
from oxbench.schema import setting

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark

log = logging.getLogger(__name__)

#: Weights that name no file.
_NOT_A_FILE = (None, "random", "imagenet")

#: The resize rule, in words (the preprocessing card's ``resize``).
RESIZE_RULE = "longer side shrunk to at most max_side (Lanczos, never enlarged)"


def _no_model_file(path: Path) -> InputError:
    return InputError(
        "no model file here: train it with oxbench train, or pass --set descriptor.weights=PATH",
        path,
    )


@dataclass(frozen=True)
class CnnDescriptor(DescriptorKind):
    """A pooled CNN / ViT activation map.

    Attributes:
        backbone: ``resnet18/34/50/101/152``, ``vgg11/13/16/19``, ``alexnet`` (torchvision) or
            ``timm:<model name>`` (:mod:`oxbench.features.deep.backbones`).
        weights: ``"random"`` (seeded by ``seed``), ``"imagenet"`` (the library's pretrained
            weights, from its cache or downloaded into it), a model file path
            (``oxbench import-checkpoint`` / ``oxbench train``), or ``"models:<file>"`` (a file in
            :func:`oxbench.features.deep.models_dir`); ``None``: the user must supply a file.
        pooling: ``"mac"``, ``"spoc"``, ``"gem"``, ``"rmac"``, or ``"fc6"`` (the first fully
            connected layer of a VGG / AlexNet classifier, 4,096-D: Babenko et al.'s neural codes;
            refused for a backbone without one).
        rmac_grid: with R-MAC, the region arithmetic: ``"float32"`` (default: cirtorch's, which a
            published R-MAC model's descriptors need) or ``"float64"``
            (:func:`~oxbench.features.deep.pooling.rmac_regions`).
        gem_p: GeM's exponent for random / ImageNet weights (a model file brings its own).
        max_side: longer image side (px) before description (never enlarged).
        query_resize: how a query crop is shrunk: ``"full-image"`` (by the factor that brings its
            full image to ``max_side``, as cirtorch evaluates the published models) or ``"crop"``
            (the crop itself to ``max_side``). Same result when the full image is within
            ``max_side``.
        scales: multi-scale factors, combined by the power mean with GeM's ``p``.
        precision: ``"fp32"`` or ``"bf16"`` (autocast of the trunk).
        model_whitening: apply the learned whitening stored in the model file (cirtorch's ``Lw``:
            the multi-scale one with several scales) to the descriptors.
        fit_network: with a model file as ``weights``: when the file does not exist, ``fit``
            trains it on the training set (:func:`oxbench.train.loop.train` with ``oxbench
            train``'s settings for this backbone, ``train_epochs`` epochs; resumable) and writes it
            there, the same file ``oxbench train`` writes; an existing file is used as it is.
        train_epochs: ``fit_network``: epochs (``None``: ``oxbench train``'s default).
        seed: initialisation seed of random weights (and of the training with ``fit_network``).
        batch_size, device: images per forward pass; ``"auto"`` (GPU when torch sees one),
            ``"cpu"`` or ``"cuda"``. Neither changes the descriptors beyond float rounding, so
            neither is part of the descriptor cache key.
    """

    kind: ClassVar[str] = "cnn"

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

    def check(self) -> None:
        if self.pooling == "fc6":
            check_fc6_backbone(self.backbone)
        if self.model_whitening and self.weights in ("random", "imagenet"):
            raise InputError(
                "descriptor.model_whitening needs a model file that carries one "
                "(descriptor.weights=PATH)"
            )

    def check_with(self, m: FamilySettings) -> None:
        if self.model_whitening and m.whitening != "none":
            raise InputError(
                f"method {m.name}: descriptor.model_whitening already whitens; set whitening=none"
            )

    @property
    def trains_network(self) -> bool:
        """Whether ``fit`` trains the network into its model file (``fit_network`` with a file)."""
        return self.fit_network and self.weights not in _NOT_A_FILE

    @property
    def learns(self) -> str:
        return "a network" if self.trains_network else ""

    def weights_file(self, root: Path | None = None) -> Path:
        """The model file ``weights`` names; one a ``fit`` trains is one per seed.

        Seed 0 trains ``<file>`` itself, seed ``s`` ``<stem>.seed<s><suffix>`` beside it, so the
        members of ``--seeds 0,1,2`` train and load three networks, not one.
        """
        assert self.weights is not None and self.weights not in _NOT_A_FILE
        path = resolve_weights_path(self.weights, root)
        if self.trains_network and self.seed:
            path = path.with_name(f"{path.stem}.seed{self.seed}{path.suffix}")
        return path

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """torch and torchvision (timm for a ``timm:`` trunk)."""
        out = [("torch", "deep"), ("torchvision", "deep")]
        if self.backbone.startswith("timm:"):
            out.append(("timm", "deep"))
        return tuple(out)

    def shorthand(self, option: str) -> str | None:
        """``max_side``: the CNN's own."""
        return "max_side" if option == "max_side" else None

    def cache_key(self) -> dict[str, Any]:
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

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """A model file given as ``weights`` (not one ``fit`` trains)."""
        if self.weights in _NOT_A_FILE or self.trains_network:
            return {}
        return {"weights": self.weights_file(root)}

    def check_inputs(self, root: Path | None = None) -> None:
        """A model file that is neither there nor to be trained (``fit_network``) is refused."""
        from oxbench.fileio import require_regular_file

        for path in self.input_files(root).values():
            if not path.exists():
                raise _no_model_file(path)
            require_regular_file(path)

    def build(self, m: FamilySettings) -> CnnDescriber:
        return CnnDescriber(self, m)


register_descriptor(CnnDescriptor)


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


class BuildsNet(Protocol):
    """What a :class:`CnnShard` builds its network from where it runs (:class:`NetSpec`, or
    another deep kind's spec): ``build()`` gives an object whose ``net`` an
    :class:`~oxbench.features.deep.extract.Extractor` drives."""

    def build(self) -> Any: ...


class CnnShard:
    """Picklable :data:`~oxbench.features.descstore.Compute`: CNN descriptors of some images.

    The network is built once per process that runs it, on its first task (here the driver's
    network is reused). With a CUDA device it asks for a ``GPU`` resource, so that a Dask cluster
    runs it only on a worker that offers one (``dask worker --resources GPU=1``).
    """

    def __init__(
        self,
        spec: BuildsNet,
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


class CnnDescriber(StoredDescriber):
    """Builds (or trains) the network and describes images with it."""

    #: Images per descriptor shard: a CNN task of a minute or more on a GPU.
    shard_size: ClassVar[int] = 512
    from_pixels: ClassVar[bool] = True
    kind: CnnDescriptor

    def __init__(self, kind: CnnDescriptor, m: FamilySettings) -> None:
        super().__init__(kind, m)
        self.model_: Any = None  # oxbench.features.deep.model.LoadedModel

    # --- learning ------------------------------------------------------------------------------
    def fit(self, train: Benchmark, ctx: RunContext) -> None:
        if self.kind.trains_network:
            with ctx.timed("network"):
                hit = self._fit_network(train, ctx)
            ctx.record_step("network", hit=hit)

    def _fit_network(self, train: Benchmark, ctx: RunContext) -> bool:
        """Train the network into its model file unless the file exists; ``True``: it existed."""
        from oxbench.train.loop import TrainConfig, benchmark_training_set
        from oxbench.train.loop import train as train_network

        k = self.kind
        path = k.weights_file(ctx.root)
        if path.exists():
            return True
        config = TrainConfig(backbone=k.backbone, pooling=k.pooling, dataset=train.id, seed=k.seed)
        if k.train_epochs is not None:
            config = dataclasses.replace(config, epochs=k.train_epochs)
        log.info(
            "training %s + %s on %s into %s (resumable)", k.backbone, k.pooling, train.id, path
        )
        ts = benchmark_training_set(train, config.image_size, progress=ctx.progress)
        train_network(config, ts, path, progress=ctx.progress)
        self.model_ = None  # load what was written
        return False

    # --- the network ---------------------------------------------------------------------------
    def _net_spec(self, ctx: RunContext) -> NetSpec:
        """What builds the network (weights resolved; the model file must exist)."""
        k = self.kind
        if k.weights is None:
            raise InputError(
                f"method {self.m.name} needs a model file: pass --set descriptor.weights=MODEL.pt "
                "(e.g. the published cirtorch weights converted with oxbench import-checkpoint "
                "CHECKPOINT --out MODEL.pt)"
            )
        weights: str | Path = k.weights
        if k.weights not in _NOT_A_FILE:
            weights = k.weights_file(ctx.root)
            if k.weights.startswith(MODELS_PREFIX) and not weights.exists():
                raise _no_model_file(weights)
        return NetSpec(k.backbone, k.pooling, weights, k.gem_p, k.seed, k.rmac_grid)

    def _model(self, ctx: RunContext) -> Any:
        """The network (built once per method; weights loaded here, never in a constructor)."""
        if self.model_ is None:
            self.model_ = self._net_spec(ctx).build()
        return self.model_

    # --- describing ----------------------------------------------------------------------------
    def store_key(self, ctx: RunContext, part: str) -> dict[str, Any]:
        extra = {"query_resize": self.kind.query_resize} if part == "queries" else {}
        return {**self.kind.cache_key(), "weights": self._model(ctx).weights, **extra}

    def compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext) -> CnnShard:
        from oxbench.features.deep.extract import ExtractOptions

        k = self.kind
        workers = max(1, ctx.workers)
        opts = ExtractOptions(
            max_side=k.max_side,
            scales=k.scales,
            precision=k.precision,
            batch_size=k.batch_size,
            device=k.device,
            decode_threads=max(1, ctx.decode_threads // workers),
        )
        read: Callable[[int], NDArray[np.uint8]] = (
            QueryCrops(bench, k.query_resize, k.max_side)
            if part == "queries"
            else PartImages(bench, part)
        )
        here = ctx.executor.backend == "serial"  # the driver's network, unless tasks run elsewhere
        return CnnShard(
            self._net_spec(ctx),
            opts,
            read,
            names,
            allow_partial=ctx.allow_partial,
            model=self._model(ctx) if here else None,
        )

    def finish_stored(self, x: NDArray[np.float32], ctx: RunContext) -> NDArray[np.float32]:
        """With ``model_whitening``: the model file's learned whitening applied."""
        if not self.kind.model_whitening:
            return x
        lw = self._model(ctx).whitening(multiscale=len(self.kind.scales) > 1)
        if lw is None:
            raise InputError(
                f"method {self.m.name}: descriptor.model_whitening is set but the model file "
                "carries no learned whitening"
            )
        mean, proj = lw
        return l2_normalize((x.astype(np.float64) - mean) @ proj.T)

    def preprocessing(self) -> dict[str, Any]:
        """The run's preprocessing card (as :class:`~oxbench.pipelines.descriptors.vit.VitDescriber`
        writes one): how pixels became the descriptor."""
        k, net = self.kind, self.model_.net
        weights = str(self.model_.weights)
        return {
            "backbone": k.backbone,
            "resize": RESIZE_RULE,
            "max_side": k.max_side,
            "query_resize": k.query_resize,
            "scales": list(k.scales),
            "mean": [round(float(v), 8) for v in net.mean],
            "std": [round(float(v), 8) for v in net.std],
            "pooling": k.pooling,
            "precision": k.precision,
            "weights": weights,
            "weights_sha256": weights.rsplit("sha256=", 1)[1] if "sha256=" in weights else None,
        }

    def provenance(self) -> dict[str, Any]:
        out = super().provenance()
        if self.model_ is not None:
            out["model"] = {**self.model_.net.describe(), "weights": self.model_.weights}
            out["preprocessing"] = self.preprocessing()
        return out
