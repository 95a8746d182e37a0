"""Backbones: the convolutional trunk (or the ViT patch tokens) that a pooling head reads.

Architecture names:

- torchvision: ``resnet18``, ``resnet34``, ``resnet50``, ``resnet101``, ``resnet152`` (every layer up
  to ``layer4``: the model without its average pooling and classifier) and ``vgg11``, ``vgg13``,
  ``vgg16``, ``vgg19`` and ``alexnet`` (``features`` without the last max pooling, so the map ends
  with a ReLU; the fc6 head, :class:`~oxbench.features.deep.pooling.FC6`, applies that pooling).
  These are the trunks of cirtorch's ``ImageRetrievalNet``, with the same module indices, so a
  cirtorch ``state_dict`` loads into them unchanged (``features.0.weight`` is ``conv1.weight``).
- timm: ``timm:<model name>`` (any name ``timm.list_models()`` knows, with its pretrained tag if
  any: ``timm:convnext_tiny``, ``timm:vit_small_patch14_dinov2.lvd142m``). The trunk is the model's
  ``forward_features``. For vision transformers (models with patch tokens) the prefix tokens (class
  and register tokens) are dropped and the patch tokens are reshaped to their ``[C, H/patch,
  W/patch]`` grid, so every pooling head applies to them as to a CNN map; ViTs are built with
  timm's ``dynamic_img_size`` (position embeddings interpolated to each image's grid) and
  ``dynamic_img_pad`` (the image padded to a multiple of the patch size). Token values can be
  negative: GeM clamps them at ``eps`` as it does CNN activations, so MAC or SPoC may suit a ViT
  better.

Building a trunk does no I/O: it is randomly initialised (seed it with ``torch.manual_seed``).
:func:`imagenet_state_dict` loads the library's own pretrained weights as an explicit step, from the
library's standard cache (``$TORCH_HOME/hub/checkpoints`` for torchvision, the Hugging Face cache for
timm), downloading only when they are not cached and the network allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from oxbench.errors import InputError, require

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
else:
    torch = require("torch", "deep")
    nn = torch.nn

#: torchvision trunks and their output channels.
TORCHVISION_DIMS: dict[str, int] = {
    "resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048, "resnet152": 2048,
    "vgg11": 512, "vgg13": 512, "vgg16": 512, "vgg19": 512, "alexnet": 256,
}  # fmt: skip

#: Prefix of timm model names.
TIMM_PREFIX = "timm:"

#: ImageNet mean / std (RGB, 0..1), the torchvision models' normalisation.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True, eq=False)
class Trunk:
    """A backbone without its classifier.

    Attributes:
        architecture: the name it was built from (``resnet101``, ``timm:vit_small_patch14_dinov2``).
        module: the ``nn.Module`` (its ``state_dict`` is what a model file stores under ``features.``).
        dim: channels of the map it produces.
        mean, std: the input normalisation its weights expect (RGB, 0..1 scale).
        kind: ``"map"`` (``module(x)`` is ``[B, C, h, w]``), ``"timm-map"`` (``forward_features``
            is the map) or ``"timm-tokens"`` (``forward_features`` is ``[B, prefix + h * w, C]``).
    """

    architecture: str
    module: Any
    dim: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    kind: Literal["map", "timm-map", "timm-tokens"]


#: A timm model name with its optional pretrained tag (``vit_small_patch14_dinov2.lvd142m``): no
#: ``hf-hub:`` / ``local-dir:`` prefix, no path, so building it never reads or fetches anything.
_TIMM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]*(\.[A-Za-z0-9_\-]+)?\Z")


def known_architecture(architecture: str) -> bool:
    """Whether ``architecture`` names a torchvision trunk or is ``timm:`` + a plain model name
    (the name is looked up in timm's registry by :func:`check_architecture`)."""
    if architecture in TORCHVISION_DIMS:
        return True
    name = architecture[len(TIMM_PREFIX) :] if architecture.startswith(TIMM_PREFIX) else ""
    return len(name) <= 200 and bool(_TIMM_NAME.match(name))


def check_architecture(architecture: str, *, source: str | Path | None = None) -> None:
    """Refuse an architecture name that is not a torchvision trunk or a model in timm's offline
    registry (``timm.is_model``): a hub (``timm:hf-hub:...``) or path prefix is never passed to timm.

    Raises:
        InputError: one line naming the name (and ``source``, e.g. the model file it came from).
    """
    if architecture in TORCHVISION_DIMS:
        return
    shown = architecture if len(architecture) <= 80 else architecture[:77] + "..."
    if not known_architecture(architecture):
        raise InputError(
            f"unknown backbone {shown!r}; use one of {', '.join(TORCHVISION_DIMS)} or timm:<model name> "
            "(a name from timm.list_models(), without a hub or path prefix)",
            source,
        )
    timm = require("timm", "deep")
    if not timm.is_model(architecture[len(TIMM_PREFIX) :]):
        raise InputError(
            f"timm does not know the model {shown[len(TIMM_PREFIX) :]!r} (timm.list_models() lists them)",
            source,
        )


def build_trunk(architecture: str) -> Trunk:
    """A randomly initialised trunk (no I/O, no download).

    Raises:
        InputError: unknown architecture.
    """
    if architecture in TORCHVISION_DIMS:
        tv = require("torchvision", "deep")
        full = tv.models.get_model(architecture, weights=None)
        return Trunk(
            architecture,
            _cut_torchvision(architecture, full),
            TORCHVISION_DIMS[architecture],
            IMAGENET_MEAN,
            IMAGENET_STD,
            "map",
        )
    if architecture.startswith(TIMM_PREFIX):
        check_architecture(architecture)
        model = _timm_model(architecture, pretrained=False)
        timm = require("timm", "deep")
        cfg = timm.data.resolve_model_data_config(model)
        kind: Literal["timm-map", "timm-tokens"] = "timm-tokens" if _is_vit(model) else "timm-map"
        return Trunk(
            architecture, model, int(model.num_features), _rgb(cfg["mean"]), _rgb(cfg["std"]), kind
        )
    raise InputError(
        f"unknown backbone {architecture!r}; use one of {', '.join(TORCHVISION_DIMS)} or timm:<model name>"
    )


def _rgb(values: Any) -> tuple[float, float, float]:
    v = tuple(float(x) for x in values)
    if len(v) != 3:
        raise InputError(f"expected 3 (RGB) normalisation values, got {len(v)}")
    return v[0], v[1], v[2]


def _cut_torchvision(architecture: str, full: Any) -> Any:
    if architecture.startswith("resnet"):
        return nn.Sequential(*list(full.children())[:-2])
    return nn.Sequential(*list(full.features.children())[:-1])


def _is_vit(model: Any) -> bool:
    return hasattr(model, "patch_embed") and hasattr(model, "num_prefix_tokens")


def _timm_model(architecture: str, *, pretrained: bool) -> Any:
    timm = require("timm", "deep")
    name = architecture[len(TIMM_PREFIX) :]
    base = {"pretrained": pretrained, "num_classes": 0}
    try:
        try:
            return timm.create_model(name, dynamic_img_size=True, dynamic_img_pad=True, **base)
        except TypeError:  # not a ViT: no dynamic image size
            return timm.create_model(name, **base)
    except RuntimeError as exc:
        if "Unknown model" in str(exc):
            raise InputError(
                f"timm does not know the model {name!r} (timm.list_models() lists them)"
            ) from None
        raise


def imagenet_state_dict(architecture: str) -> tuple[dict[str, Any], str]:
    """The library's pretrained weights of a trunk, and what identifies them.

    Loads from the library's standard cache and downloads into it when the weights are not there
    (the only place oxbench lets torchvision or timm reach the network).

    Returns:
        ``(state_dict of the trunk, identity)``: the identity (weights enum or hub id) goes into
        cache keys and run records.

    Raises:
        InputError: the weights are neither cached nor downloadable (one line saying what to do).
    """
    try:
        if architecture in TORCHVISION_DIMS:
            tv = require("torchvision", "deep")
            weights = tv.models.get_model_weights(architecture).DEFAULT
            full = tv.models.get_model(architecture, weights=None)
            full.load_state_dict(weights.get_state_dict(progress=False, check_hash=True))
            return _cut_torchvision(architecture, full).state_dict(), f"torchvision:{weights}"
        if architecture.startswith(TIMM_PREFIX):
            check_architecture(architecture)
            model = _timm_model(architecture, pretrained=True)
            cfg = getattr(model, "pretrained_cfg", {}) or {}
            ident = cfg.get("hf_hub_id") or cfg.get("url") or architecture
            return model.state_dict(), f"timm:{ident}"
    except InputError:
        raise
    except Exception as exc:  # network, cache and hub errors come in many types
        raise _no_imagenet_weights(architecture, exc) from None
    raise InputError(f"unknown backbone {architecture!r}")


def imagenet_fc6_state_dict(architecture: str) -> dict[str, Any]:
    """The ``state_dict`` of the first fully connected layer of a VGG / AlexNet ImageNet classifier
    (torchvision's weights, from its cache as :func:`imagenet_state_dict` reads them): the weights
    of :class:`~oxbench.features.deep.pooling.FC6`'s ``fc``.

    Raises:
        InputError: not a backbone with fc6, or the weights neither cached nor downloadable.
    """
    from oxbench.features.deep import check_fc6_backbone

    check_fc6_backbone(architecture)
    tv = require("torchvision", "deep")
    try:
        weights = tv.models.get_model_weights(architecture).DEFAULT
        full = tv.models.get_model(architecture, weights=None)
        full.load_state_dict(weights.get_state_dict(progress=False, check_hash=True))
    except Exception as exc:  # network, cache and hub errors come in many types
        raise _no_imagenet_weights(architecture, exc) from None
    first = next(m for m in full.classifier if isinstance(m, nn.Linear))
    return first.state_dict()


def _no_imagenet_weights(architecture: str, exc: Exception) -> InputError:
    reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    cache = (
        "$TORCH_HOME/hub/checkpoints"
        if architecture in TORCHVISION_DIMS
        else "the Hugging Face cache"
    )
    return InputError(
        f"the ImageNet weights of {architecture} are not in {cache} and could not be downloaded "
        f"({reason}); run once with a network, copy them into that cache, or pass a model file "
        "with --set descriptor.weights=PATH"
    )
