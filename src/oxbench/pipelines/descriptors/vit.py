"""Foundation-model descriptors (``descriptor=vit``): a frozen vision transformer's tokens pooled into
one vector -- DINOv2, DINOv3, CLIP and SigLIP image towers by their timm names (needs
``oxbench[deep]``).

What an image goes through (every choice is written into the run's preprocessing card,
:meth:`VitDescriber.preprocessing`):

- resize: the image is shrunk so its longer side is at most ``max_side`` (Pillow thumbnail, Lanczos,
  never enlarged: the rule of :mod:`oxbench.features.deep.extract`), normalised with the model's
  own mean / std (timm's pretrained config), and at each scale each side is resized (bilinear,
  antialiased) to the nearest multiple of the patch size (at least one patch); the position
  embeddings are interpolated to that grid (timm's ``dynamic_img_size``);
- query crop (``query_crop``): ``revisited`` -- the query's box, shrunk by its full image's factor,
  as the revisited protocol and every other deep kind describe queries
  (:class:`~oxbench.pipelines.descriptors.cnn.QueryCrops`); ``full`` -- the whole query image, box
  ignored (not the protocol: dinov2 issue 44's lower numbers came from it); ``crop-resize`` -- the box,
  resized (up or down) to the model's own input size (``pretrained_cfg["input_size"]``, a square for
  every preset) before the resize above;
- token pooling (``token_pooling``), over ``forward_features``' ``[B, prefix + h * w, C]`` tokens:
  ``cls`` -- the class token (token 0); ``gem`` -- GeM over the patch tokens only (the tokens after
  the model's ``num_prefix_tokens``: register tokens are never pooled); ``cls+gem`` -- both
  L2-normalised, concatenated, L2-normalised again (``2C`` dimensions); ``head`` -- the model's
  own pooled embedding before any classifier (``forward_head(pre_logits=True)``: SigLIP's
  attention pool, DINOv3's average of patch tokens). The vector is L2-normalised; several scales
  are combined by the power mean (GeM's ``p`` for ``gem``, the plain mean otherwise) as the CNN kind
  combines them.

Weights (``weights``): ``pretrained`` -- timm's pretrained weights of the model, read from the
Hugging Face cache only (this kind never downloads; a missing file is one line naming where to put
it); ``random`` -- seeded initialisation (tests, timing); or a local ``.safetensors`` / ``.pth``
file of the timm model's ``state_dict``, read without running code (``safetensors`` /
``torch.load(weights_only=True)``), at most :data:`WEIGHTS_LIMIT` bytes, every key and shape the
model's (a classifier or projection ``head.*`` the trunk does not use is dropped). The file's SHA-256
goes into the descriptor cache key and the run record.
"""

from __future__ import annotations

import io
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError, require
from oxbench.pipelines.descriptors import (
    DescriptorKind,
    FamilySettings,
    PartImages,
    StoredDescriber,
    register_descriptor,
)
from oxbench.pipelines.descriptors.cnn import CnnShard, QueryCrops
from oxbench.pipelines.method import RunContext
from oxbench.schema import setting

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark

log = logging.getLogger(__name__)

#: Largest weights file read (a ViT-g/14 in float32 is 4.5 GB).
WEIGHTS_LIMIT = 8 << 30

#: Weights that name no file.
_NOT_A_FILE = ("pretrained", "random")

#: The file suffixes a weights file may have, and how each is read.
WEIGHTS_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")

#: The resize rule, in words (the preprocessing card's ``resize``).
RESIZE_RULE = (
    "longer side shrunk to at most max_side (Lanczos, never enlarged); each side then resized to "
    "the nearest multiple of the patch size (bilinear, antialiased), position embeddings "
    "interpolated"
)

#: Each query-crop rule, in words (the preprocessing card's ``query_crop_rule``).
QUERY_CROP_RULES = {
    "revisited": "the query box, shrunk by its full image's factor (the revisited protocol)",
    "full": "the whole query image; the box is ignored (not the protocol's rule)",
    "crop-resize": "the query box resized to the model's input size, then the resize rule",
}


@dataclass(frozen=True)
class VitDescriptor(DescriptorKind):
    """A frozen vision transformer's tokens, pooled.

    Attributes:
        model: a timm vision-transformer name, with an optional pretrained tag
            (``vit_small_patch14_dinov2``, ``vit_base_patch16_clip_224.openai``).
        weights: ``"pretrained"`` (timm's weights, from the Hugging Face cache), ``"random"``
            (seeded by ``seed``) or a ``.safetensors`` / ``.pth`` file of the model's state dict.
        token_pooling: ``"cls"``, ``"gem"`` (patch tokens), ``"cls+gem"`` or ``"head"`` (the
            model's own).
        gem_p: GeM's exponent.
        max_side: longer image side (px) before the patch-size rounding (never enlarged).
        query_crop: ``"revisited"``, ``"full"`` or ``"crop-resize"`` (module docstring).
        scales: multi-scale factors.
        precision: ``"fp32"`` or ``"bf16"`` (autocast of the transformer).
        seed: initialisation seed of random weights.
        batch_size, device: images per forward pass; ``auto``, ``cpu``, ``cuda`` or
            ``cuda:<n>`` (neither is part of the cache key).
    """

    kind: ClassVar[str] = "vit"

    model: str = setting(
        "vit_small_patch14_dinov2",
        S.Str(1, 200, pattern=r"[A-Za-z0-9][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)?"),
        doc="vit: timm model name",
    )
    weights: str | None = setting(
        "pretrained",
        S.Optional(S.Str(min_len=1, max_len=4096)),  # the cnn kind's spec: one name, one spec
        doc="vit: pretrained, random or a .safetensors / .pth file",
    )
    token_pooling: Literal["cls", "gem", "cls+gem", "head"] = setting(
        "cls", S.Choice("cls", "gem", "cls+gem", "head"), doc="vit: token pooling"
    )
    gem_p: float = setting(3.0, S.Float(lo=0, lo_open=True, hi=100), doc="vit: GeM exponent")
    max_side: int = setting(518, S.Int(lo=16, hi=1 << 16), doc="vit: longer image side (px)")
    query_crop: Literal["revisited", "full", "crop-resize"] = setting(
        "revisited", S.Choice("revisited", "full", "crop-resize"), doc="vit: query crop rule"
    )
    scales: tuple[float, ...] = setting(
        (1.0,),
        S.FloatTuple(S.Float(lo=0, lo_open=True, hi=4), max_len=16),
        doc="vit: multi-scale factors",
    )
    precision: Literal["fp32", "bf16"] = setting(
        "fp32", S.Choice("fp32", "bf16"), doc="vit: transformer precision"
    )
    seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="vit: seed of random weights")
    batch_size: int = setting(8, S.Int(lo=1, hi=4096), doc="vit: images per forward pass")
    device: str = setting("auto", S.DEVICE, doc="vit: auto, cpu, cuda or cuda:<n>")

    def check(self) -> None:
        if self.weights is None:
            raise InputError(
                "descriptor.weights: give pretrained, random or a .safetensors / .pth file"
            )
        if self.weights not in _NOT_A_FILE and not self.weights.lower().endswith(WEIGHTS_SUFFIXES):
            raise InputError(
                f"descriptor.weights={_short(self.weights)}: expected pretrained, random or a "
                f"weights file ending in {', '.join(WEIGHTS_SUFFIXES)}"
            )

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        return (("torch", "deep"), ("timm", "deep"))

    def shorthand(self, option: str) -> str | None:
        return "max_side" if option == "max_side" else None

    def cache_key(self) -> dict[str, Any]:
        return {
            "descriptor": "vit",
            "model": self.model,
            "token_pooling": self.token_pooling,
            "gem_p": self.gem_p if "gem" in self.token_pooling else None,
            "max_side": self.max_side,
            "resize": "max-side+patch-multiple",
            "scales": list(self.scales),
            "precision": self.precision,
        }

    def input_files(self, root: Path | None = None) -> dict[str, Path]:
        """A weights file given as ``weights``."""
        if self.weights is None or self.weights in _NOT_A_FILE:
            return {}
        return {"weights": Path(self.weights).expanduser()}

    def build(self, m: FamilySettings) -> VitDescriber:
        return VitDescriber(self, m)


register_descriptor(VitDescriptor)


def _short(text: str) -> str:
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")


# --- the network ---------------------------------------------------------------------------------


def pool_tokens(
    tokens: Any, prefix: int, pooling: str, p: float, head: Callable[[Any], Any]
) -> Any:
    """One unnormalised-then-L2 vector ``[B, D]`` of ``forward_features`` tokens
    ``[B, prefix + n, C]`` (float32): see the module docstring for each pooling."""
    import torch
    from torch.nn import functional as F

    if pooling == "head":
        return F.normalize(head(tokens).float(), dim=-1)
    cls = F.normalize(tokens[:, 0], dim=-1)
    if pooling == "cls":
        return cls
    patches = tokens[:, prefix:]
    gem = F.normalize(patches.clamp(min=1e-6).pow(p).mean(dim=1).pow(1.0 / p), dim=-1)
    if pooling == "gem":
        return gem
    return F.normalize(torch.cat([cls, gem], dim=-1), dim=-1)


def patch_multiple(side: int, patch: int) -> int:
    """``side`` rounded to the nearest multiple of ``patch`` (halves up), at least ``patch``.

    Example:
        >>> patch_multiple(100, 14), patch_multiple(7, 14), patch_multiple(21, 14)
        (98, 14, 28)
    """
    return max(patch, math.floor(side / patch + 0.5) * patch)


class TokenNet:
    """A timm ViT as :class:`~oxbench.features.deep.extract.Extractor` drives a network: images
    ``[B, 3, H, W]`` (normalised) to unit vectors ``[B, D]``, with ``mean`` / ``std`` / ``dim`` /
    ``multiscale_power``."""

    def __init__(self, model: Any, pooling: str, p: float, mean: Any, std: Any) -> None:
        if pooling in ("cls", "cls+gem") and getattr(model, "cls_token", None) is None:
            raise InputError(
                f"descriptor.token_pooling={pooling}: the model has no class token (a SigLIP "
                "tower pools by attention); use token_pooling=head or gem"
            )
        self.model, self.pooling, self.p = model, pooling, float(p)
        self.mean, self.std = tuple(mean), tuple(std)
        self.prefix = int(model.num_prefix_tokens)
        patch = model.patch_embed.patch_size
        self.patch = (int(patch[0]), int(patch[1]))
        width = int(model.num_features)
        self.dim = 2 * width if pooling == "cls+gem" else width
        self.multiscale_power = self.p if pooling == "gem" else 1.0

    def to(self, device: Any) -> TokenNet:
        self.model.to(device)
        return self

    def eval(self) -> TokenNet:
        self.model.eval()
        return self

    def input_side(self, h: int, w: int) -> tuple[int, int]:
        """The ``(H, W)`` the transformer reads for an image of ``h x w`` px."""
        return patch_multiple(h, self.patch[0]), patch_multiple(w, self.patch[1])

    def __call__(self, x: Any) -> Any:
        import torch
        from torch.nn import functional as F

        size = self.input_side(int(x.shape[-2]), int(x.shape[-1]))
        if size != tuple(x.shape[-2:]):
            x = F.interpolate(x, size=size, mode="bilinear", align_corners=False, antialias=True)
        tokens = self.model.forward_features(x)
        with torch.autocast(device_type=tokens.device.type, enabled=False):
            return pool_tokens(
                tokens.float(),
                self.prefix,
                self.pooling,
                self.p,
                lambda t: self.model.forward_head(t, pre_logits=True),
            )


@dataclass(frozen=True, eq=False)
class LoadedVit:
    """A built :class:`TokenNet` (``net``) and what identifies its weights."""

    net: TokenNet
    weights: str
    sha256: str | None
    input_size: tuple[int, int]


@dataclass(frozen=True)
class VitSpec:
    """What builds the network again where a task runs (picklable)."""

    model: str
    weights: str
    pooling: str
    p: float
    seed: int

    def build(self) -> LoadedVit:
        """The network with its weights (random, from the cache, or from the file)."""
        import torch

        from oxbench.features.deep.backbones import TIMM_PREFIX, build_trunk

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            trunk = build_trunk(TIMM_PREFIX + self.model)
        if trunk.kind != "timm-tokens":
            raise InputError(
                f"descriptor.model={self.model} is not a vision transformer (no patch tokens); "
                "use descriptor=cnn with backbone=timm:<name>"
            )
        model = trunk.module
        ident, digest = f"random:seed={self.seed}", None
        if self.weights != "random":
            path = (
                pretrained_file(model, self.model)
                if self.weights == "pretrained"
                else Path(self.weights).expanduser()
            )
            load_weights(model, path)
            from oxbench.provenance import input_record

            digest = input_record(path).sha256
            ident = f"{'timm-cache' if self.weights == 'pretrained' else 'file'}:sha256={digest}"
        cfg = getattr(model, "pretrained_cfg", {}) or {}
        size = tuple(int(s) for s in cfg.get("input_size", (3, 224, 224))[-2:])
        net = TokenNet(model.eval(), self.pooling, self.p, trunk.mean, trunk.std)
        return LoadedVit(net, ident, digest, (size[0], size[1]))


def pretrained_file(model: Any, name: str) -> Path:
    """The file of timm's pretrained weights of ``model`` in the Hugging Face cache (never fetched).

    Raises:
        InputError: not there -- one line naming the file to put where.
    """
    hub = require("huggingface_hub", "deep")
    from huggingface_hub import constants

    cfg = getattr(model, "pretrained_cfg", {}) or {}
    repo = cfg.get("hf_hub_id")
    if not repo:
        raise InputError(
            f"timm has no Hugging Face weights for {name}; give a weights file with "
            "--set descriptor.weights=FILE.safetensors"
        )
    names = [cfg.get("hf_hub_filename"), "model.safetensors", "pytorch_model.bin"]
    for filename in [n for n in names if n]:
        found = hub.try_to_load_from_cache(repo, filename)
        if isinstance(found, str):
            return Path(found)
    where = Path(constants.HF_HUB_CACHE) / ("models--" + repo.replace("/", "--"))
    raise InputError(
        f"the pretrained weights of {name} are not in the Hugging Face cache: put "
        f"model.safetensors from https://huggingface.co/{repo} into {where}/snapshots/<revision>/ "
        "(huggingface-cli download " + repo + " model.safetensors, on a machine with a network), "
        "or pass --set descriptor.weights=FILE.safetensors"
    )


def read_state_dict(path: Path) -> dict[str, Any]:
    """A ``.safetensors`` or torch state-dict file read without running code (bounded, regular
    file only; a ``{"state_dict": ...}`` / ``{"model": ...}`` wrapper is unwrapped).

    Raises:
        InputError: one line naming the file.
    """
    from oxbench.features.descstore import read_bounded

    data = read_bounded(path, WEIGHTS_LIMIT)
    if path.name.lower().endswith(".safetensors"):
        st = require("safetensors.torch", "deep")
        try:
            state: Any = st.load(data)
        except Exception as exc:  # safetensors raises its own error types
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise InputError(f"not a readable safetensors file ({reason})", path) from None
    else:
        import torch

        from oxbench.features.deep.modelfile import check_plain, torch_load_reason

        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # pickle and zip errors come in many types
            reason = torch_load_reason(exc)
            raise InputError(f"not a plain torch weights file ({reason})", path) from None
        check_plain(state, path, what="weights file")
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not state:
        raise InputError("not a state dict (a mapping of parameter names to tensors)", path)
    return state


def load_weights(model: Any, path: Path) -> None:
    """Load the weights file at ``path`` into ``model``: keys and shapes exactly the model's, but
    for a ``head.*`` the trunk does not have (a classifier or CLIP's projection).

    Raises:
        InputError: unreadable, non-finite, or keys / shapes of another model (one line).
    """
    from oxbench.features.deep.model import load_matching_state
    from oxbench.features.deep.modelfile import check_finite_weights

    state = read_state_dict(path)
    own = model.state_dict()
    state = {k: v for k, v in state.items() if k in own or not k.startswith("head.")}
    check_finite_weights(state, path)
    load_matching_state(model, state, what=f"timm model {type(model).__name__}", source=path)


# --- describing ----------------------------------------------------------------------------------


class QueryImages:
    """Picklable reader of query ``i`` as ``query_crop`` says (module docstring)."""

    def __init__(
        self, bench: Benchmark, query_crop: str, max_side: int, input_size: tuple[int, int]
    ) -> None:
        self.bench, self.query_crop = bench, query_crop
        self.max_side, self.input_size = max_side, input_size
        self.revisited = QueryCrops(bench, "full-image", max_side)

    def __call__(self, i: int) -> NDArray[np.uint8]:
        if self.query_crop == "full":
            return self.bench.queries.read(i)
        if self.query_crop == "revisited":
            return self.revisited(i)
        pil = require("PIL.Image", "images")
        crop = pil.fromarray(self.bench.query_crop(i))
        h, w = self.input_size
        return np.asarray(crop.resize((w, h), pil.Resampling.BICUBIC))


class VitDescriber(StoredDescriber):
    """Builds the transformer (weights loaded here, never in a constructor) and describes images."""

    #: Images per descriptor shard.
    shard_size: ClassVar[int] = 512
    from_pixels: ClassVar[bool] = True
    kind: VitDescriptor

    def __init__(self, kind: VitDescriptor, m: FamilySettings) -> None:
        super().__init__(kind, m)
        self.model_: LoadedVit | None = None

    def _spec(self) -> VitSpec:
        k = self.kind
        assert k.weights is not None  # check() refused None
        return VitSpec(k.model, k.weights, k.token_pooling, k.gem_p, k.seed)

    def _model(self) -> LoadedVit:
        if self.model_ is None:
            self.model_ = self._spec().build()
        return self.model_

    def store_key(self, ctx: RunContext, part: str) -> dict[str, Any]:
        extra = {"query_crop": self.kind.query_crop} if part == "queries" else {}
        return {**self.kind.cache_key(), "weights": self._model().weights, **extra}

    def compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext) -> CnnShard:
        from oxbench.features.deep.extract import ExtractOptions

        k = self.kind
        opts = ExtractOptions(
            max_side=k.max_side,
            scales=k.scales,
            precision=k.precision,
            batch_size=k.batch_size,
            device=k.device,
            decode_threads=max(1, ctx.decode_threads // max(1, ctx.workers)),
        )
        loaded = self._model()
        read: Callable[[int], NDArray[np.uint8]] = (
            QueryImages(bench, k.query_crop, k.max_side, loaded.input_size)
            if part == "queries"
            else PartImages(bench, part)
        )
        # the driver's network where the tasks run here (a pickled shard drops it and builds its own)
        return CnnShard(
            self._spec(), opts, read, names, allow_partial=ctx.allow_partial, model=loaded
        )

    def preprocessing(self) -> dict[str, Any]:
        """The run's preprocessing card: how pixels became the descriptor (run records show it)."""
        k = self.kind
        loaded = self._model()
        net = loaded.net
        return {
            "model": k.model,
            "resize": RESIZE_RULE,
            "max_side": k.max_side,
            "patch": list(net.patch),
            "query_crop": k.query_crop,
            "query_crop_rule": QUERY_CROP_RULES[k.query_crop],
            "model_input_size": list(loaded.input_size),
            "scales": list(k.scales),
            "mean": [round(float(v), 8) for v in net.mean],
            "std": [round(float(v), 8) for v in net.std],
            "token_pooling": k.token_pooling,
            **({"gem_p": k.gem_p} if "gem" in k.token_pooling else {}),
            "prefix_tokens": net.prefix,
            "precision": k.precision,
            "weights": loaded.weights,
            "weights_sha256": loaded.sha256,
        }

    def provenance(self) -> dict[str, Any]:
        out = super().provenance()
        if self.model_ is not None:
            out["preprocessing"] = self.preprocessing()
        return out
