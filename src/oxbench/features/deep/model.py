"""The retrieval network (trunk + pooling head + optional whitening layer), its weights, model files.

:class:`RetrievalNet` has cirtorch's ``ImageRetrievalNet`` parameter layout: ``features.*`` (the
trunk), ``pool.p`` (GeM's exponent) and, for networks trained with an end-to-end whitening,
``whiten.weight`` / ``whiten.bias``. Its output is one L2-normalised vector per image.

Weights (:func:`build_net`): ``"random"`` (seeded initialisation), ``"imagenet"`` (the library's
pretrained trunk, loaded from its cache as an explicit step, see
:func:`~oxbench.features.deep.backbones.imagenet_state_dict`) or a *model file*.

A model file (``.pt``, written by :func:`save_model`, by ``oxbench import-checkpoint`` and by
``oxbench train``) is a ``torch.save`` of plain data, read back with ``weights_only=True`` (no code
runs on load)::

    {"format": "oxbench-model", "version": 1,
     "architecture": "resnet101", "pooling": "gem", "p": 2.87, "whiten_dim": None | int,
     "mean": [3 floats], "std": [3 floats],
     "lw": {name: {"ss": {"m": [D, 1], "P": [D', D]}, "ms": {...}}},   # learned whitening(s)
     "source": {...},                                                 # provenance
     "state_dict": RetrievalNet.state_dict()}

``lw`` holds learned whitenings that came with the model (cirtorch's ``meta["Lw"]``: ``ss`` for
single-scale and ``ms`` for multi-scale descriptors, applied as ``P (x - m)`` then L2).

:func:`import_cirtorch` turns a cirtorch checkpoint (``{"meta": {...}, "state_dict": {...}}``) into a
model file, refusing one whose keys do not fit the architecture its meta names.
"""

from __future__ import annotations

import importlib
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.features.deep.backbones import (
    Trunk,
    build_trunk,
    imagenet_fc6_state_dict,
    imagenet_state_dict,
    known_architecture,
)
from oxbench.features.deep.modelfile import (
    MAX_WHITEN_DIM,
    check_finite_weights,
    check_model_payload,
    check_plain,
    check_whitening_shape,
    torch_load_reason,
)
from oxbench.features.deep.pooling import POOLING, make_pooling
from oxbench.features.descstore import read_bounded
from oxbench.fileio import atomic_write_bytes
from oxbench.provenance import input_record

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
else:
    torch = require("torch", "deep")
    nn = torch.nn
F = torch.nn.functional

MODEL_FORMAT = "oxbench-model"
MODEL_VERSION = 1
_MODEL_LIMIT = 8 << 30


class RetrievalNet(nn.Module):
    """Trunk + pooling head (+ whitening layer): images ``[B, 3, H, W]`` to unit vectors ``[B, D]``.

    Args:
        trunk: the backbone (:func:`~oxbench.features.deep.backbones.build_trunk`).
        pooling: ``mac``, ``spoc``, ``gem``, ``rmac`` or ``fc6`` (VGG / AlexNet).
        p: GeM's initial exponent.
        whiten_dim: add a learned linear whitening layer of this output size (cirtorch's ``whiten``;
            ``None``: none).
    """

    def __init__(
        self, trunk: Trunk, pooling: str, *, p: float = 3.0, whiten_dim: int | None = None
    ) -> None:
        super().__init__()
        self.architecture = trunk.architecture
        self.pooling = pooling
        self.kind = trunk.kind
        self.mean = trunk.mean
        self.std = trunk.std
        self.features = trunk.module
        self.pool = make_pooling(pooling, p=p, architecture=trunk.architecture)
        pooled = getattr(self.pool, "dim", trunk.dim)  # a fully connected head has its own size
        self.whiten = nn.Linear(pooled, whiten_dim, bias=True) if whiten_dim else None
        self.dim = whiten_dim or pooled

    def feature_map(self, x):  # noqa: ANN001, ANN201 - Tensor [B, 3, H, W] -> [B, C, h, w]
        """The trunk's activation map (ViT patch tokens reshaped to their grid)."""
        if self.kind == "map":
            return self.features(x)
        out = self.features.forward_features(x)
        if self.kind == "timm-map":
            return out
        h, w = self.features.patch_embed.dynamic_feat_size(tuple(x.shape[-2:]))
        tokens = out[:, self.features.num_prefix_tokens :, :]
        return tokens.reshape(tokens.shape[0], h, w, tokens.shape[-1]).permute(0, 3, 1, 2)

    def head(self, fmap):  # noqa: ANN001, ANN201 - [B, C, h, w] -> [B, D]
        """Pool, L2-normalise, and whiten + L2 when there is a whitening layer (always fp32)."""
        with torch.autocast(device_type=fmap.device.type, enabled=False):
            v = F.normalize(self.pool(fmap.float()), dim=-1)
            if self.whiten is not None:
                v = F.normalize(self.whiten(v), dim=-1)
        return v

    def forward(self, x):  # noqa: ANN001, ANN201
        return self.head(self.feature_map(x))

    @property
    def multiscale_power(self) -> float:
        """The exponent of the power mean over scales: GeM's ``p``, or 1 (cirtorch's rule: ``p``
        only for GeM without a whitening layer, whose outputs may be negative)."""
        if self.pooling == "gem" and self.whiten is None:
            return float(self.pool.p.detach().float().cpu()[0])
        return 1.0

    def describe(self) -> dict[str, Any]:
        """Architecture facts for run records."""
        out: dict[str, Any] = {
            "architecture": self.architecture,
            "pooling": self.pooling,
            "dim": self.dim,
            "mean": list(self.mean),
            "std": list(self.std),
            "whiten_layer": self.whiten is not None,
        }
        if self.pooling == "gem":
            out["p"] = float(self.pool.p.detach().float().cpu()[0])
        return out


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A network with its provenance and the learned whitenings that came with it.

    Attributes:
        net: the network (eval mode, CPU).
        weights: what identifies the weights (cache keys, run records).
        lw: learned whitenings ``{name: {"ss"|"ms": (m [D], P [D', D])}}`` (float64 numpy).
        source: provenance of a model file (empty otherwise).
    """

    net: RetrievalNet
    weights: str
    lw: Mapping[str, Mapping[str, tuple[NDArray[np.float64], NDArray[np.float64]]]] = field(
        default_factory=dict
    )
    source: Mapping[str, Any] = field(default_factory=dict)

    def whitening(self, multiscale: bool) -> tuple[NDArray[np.float64], NDArray[np.float64]] | None:
        """The model's learned whitening ``(m, P)`` for single- or multi-scale descriptors.

        With several named whitenings (cirtorch keys them by training set), the first in name order
        is used. ``None`` when the model has none.
        """
        for name in sorted(self.lw):
            entry = self.lw[name]
            key = "ms" if multiscale else "ss"
            if key in entry:
                return entry[key]
            if entry:
                return next(iter(entry.values()))
        return None


def build_net(
    architecture: str,
    pooling: str,
    *,
    weights: str | Path,
    p: float = 3.0,
    seed: int = 0,
) -> LoadedModel:
    """The network a method describes images with.

    Args:
        architecture: backbone name (:mod:`~oxbench.features.deep.backbones`).
        pooling: pooling head.
        weights: ``"random"`` (seeded), ``"imagenet"`` (the library's pretrained trunk, from its
            cache or downloaded into it), or the path of a model file (its architecture and pooling
            must be the ones asked for; its ``p`` replaces ``p``).
        p: GeM's exponent (random / ImageNet weights).
        seed: initialisation seed of random weights (and of the head).

    Raises:
        InputError: unknown architecture or pooling, weights not available, or a model file of
            another architecture / pooling.
    """
    if pooling not in POOLING:
        raise InputError(f"unknown pooling {pooling!r}; use one of {', '.join(sorted(POOLING))}")
    if not known_architecture(architecture):
        build_trunk(architecture)  # raises the one-line error naming the known ones
    if weights not in ("random", "imagenet"):
        loaded = load_model(weights)
        got = (loaded.net.architecture, loaded.net.pooling)
        if got != (architecture, pooling):
            raise InputError(
                f"model file is {got[0]} with {got[1]} pooling; the method asks for {architecture} with "
                f"{pooling} (change backbone= / pooling= or give another file)",
                weights,
            )
        return loaded
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = RetrievalNet(build_trunk(architecture), pooling, p=p)
    ident = f"random:seed={seed}"
    if weights == "imagenet":
        state, ident = imagenet_state_dict(architecture)
        net.features.load_state_dict(state)
        if pooling == "fc6":
            net.pool.fc.load_state_dict(imagenet_fc6_state_dict(architecture))
    return LoadedModel(net.eval(), ident)


# --- model files -----------------------------------------------------------------------------------


def save_model(
    path: str | Path,
    net: RetrievalNet,
    *,
    lw: Mapping[str, Mapping[str, tuple[NDArray[np.floating], NDArray[np.floating]]]] | None = None,
    source: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``net`` (+ learned whitenings, provenance) as a model file, atomically.

    ``oxbench train`` and ``oxbench import-checkpoint`` write their models with this.
    """
    payload = {
        "format": MODEL_FORMAT,
        "version": MODEL_VERSION,
        "architecture": net.architecture,
        "pooling": net.pooling,
        "p": net.describe().get("p"),
        "whiten_dim": None if net.whiten is None else int(net.whiten.out_features),
        "mean": [float(v) for v in net.mean],
        "std": [float(v) for v in net.std],
        "lw": {
            str(name): {
                str(k): {
                    "m": torch.as_tensor(np.asarray(m, np.float64).reshape(-1)),
                    "P": torch.as_tensor(np.asarray(p, np.float64)),
                }
                for k, (m, p) in entry.items()
            }
            for name, entry in (lw or {}).items()
        },
        "source": _plain(dict(source or {})),
        "state_dict": {k: v.detach().cpu() for k, v in net.state_dict().items()},
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    return atomic_write_bytes(path, buf.getvalue())


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def _torch_load(path: str | Path) -> Any:
    """``torch.load`` of a local file with ``weights_only=True`` (plain data, tensors, numpy arrays)."""
    data = read_bounded(path, _MODEL_LIMIT)
    # cirtorch stores Lw as numpy arrays: allow exactly what rebuilds one (under numpy 1 and 2 names)
    reconstruct = importlib.import_module("numpy._core.multiarray")._reconstruct
    safe: list[Any] = [
        np.ndarray,
        np.dtype,
        reconstruct,
        (reconstruct, "numpy.core.multiarray._reconstruct"),
    ]
    safe += [type(np.dtype(t)) for t in ("float16", "float32", "float64", "int32", "int64")]
    try:
        with torch.serialization.safe_globals(safe):
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle and zip errors come in many types
        raise InputError(
            f"not a readable torch checkpoint of plain data ({torch_load_reason(exc)})", path
        ) from None


def load_model(path: str | Path) -> LoadedModel:
    """Read a model file (see the module docstring).

    Raises:
        InputError: missing/unreadable file, not a model file (a cirtorch checkpoint is named as
            such, with the import command), or weights that do not fit its architecture.
    """
    state = _torch_load(path)
    if not isinstance(state, dict) or state.get("format") != MODEL_FORMAT:
        if isinstance(state, dict) and "meta" in state and "state_dict" in state:
            raise InputError(
                f"a cirtorch checkpoint, not an oxbench model file: convert it with "
                f"oxbench import-checkpoint {path} --out MODEL.pt",
                path,
            )
        raise InputError(
            "not an oxbench model file (written by oxbench import-checkpoint or oxbench train)",
            path,
        )
    version = state.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version != MODEL_VERSION:
        raise InputError(
            f"model file version {_short(version)}; this oxbench reads version {MODEL_VERSION}",
            path,
        )
    payload = check_model_payload(state, path)
    trunk = build_trunk(payload.architecture)
    trunk = Trunk(
        trunk.architecture, trunk.module, trunk.dim, payload.mean, payload.std, trunk.kind
    )
    w = payload.state_dict.get("whiten.weight")
    if (
        w is not None and int(w.shape[1]) != trunk.dim
    ):  # before the layer is built at the size it states
        raise InputError(
            f"model file's whitening layer has shape {tuple(w.shape)}, expected [{payload.whiten_dim}, {trunk.dim}]",
            path,
        )
    net = RetrievalNet(trunk, payload.pooling, p=payload.p, whiten_dim=payload.whiten_dim)
    load_matching_state(
        net,
        payload.state_dict,
        what=f"{payload.architecture} with {payload.pooling} pooling",
        source=path,
    )
    lw = _read_lw(payload.lw, net.dim, path)
    # the run recorded this file's digest already (oxbench.provenance): this process remembers it
    return LoadedModel(net.eval(), f"file:sha256={input_record(path).sha256}", lw, payload.source)


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _rgb3(values: Any, what: str) -> tuple[float, float, float]:
    v = [float(x) for x in values]
    if len(v) != 3 or not all(math.isfinite(x) for x in v):
        raise ValueError(f"{what} must be 3 finite numbers, got {values!r}")
    if what == "std" and min(v) <= 0:
        raise ValueError(f"std must be positive, got {v}")
    return v[0], v[1], v[2]


def _read_lw(
    raw: Any, dim: int, source: str | Path
) -> dict[str, dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]]:
    """Validate ``{name: {ss|ms: {m, P}}}``: ``m`` of ``dim`` values, ``P`` of ``[D', dim]``."""
    if not isinstance(raw, dict):
        raise InputError("learned whitening (Lw) is not a mapping", source)
    out: dict[str, dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise InputError(f"learned whitening {name!r} is not a mapping", source)
        out[str(name)] = {}
        for key, mp in entry.items():
            try:
                m = np.asarray(_to_numpy(mp["m"]), np.float64).reshape(-1)
                p = np.asarray(_to_numpy(mp["P"]), np.float64)
            except (KeyError, TypeError, ValueError) as exc:
                raise InputError(
                    f"learned whitening {name}/{key} lacks m and P ({exc})", source
                ) from None
            if m.shape != (dim,) or p.ndim != 2 or p.shape[1] != dim:
                raise InputError(
                    f"learned whitening {name}/{key}: m {m.shape} and P {p.shape} do not fit {dim}-D descriptors",
                    source,
                )
            check_whitening_shape(p.shape[0], p.shape[1], dim, f"{name}/{key}", source)
            if not (np.isfinite(m).all() and np.isfinite(p).all()):
                raise InputError(
                    f"learned whitening {name}/{key} holds NaN or infinite values", source
                )
            out[str(name)][str(key)] = (m, p)
    return out


def _to_numpy(x: Any) -> Any:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else x


def _key_list(keys: list[str]) -> str:
    head = ", ".join(keys[:4])
    return head + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")


def load_matching_state(net: Any, state: Any, *, what: str, source: str | Path) -> None:
    """Load ``state`` into ``net`` only if its keys and shapes are exactly the network's.

    Raises:
        InputError: one line naming the missing and unexpected keys (or the first mismatched
            shape) -- the checkpoint of another architecture.
    """
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise InputError("the state dict is not a mapping of parameter names to tensors", source)
    own = net.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise InputError(
            f"checkpoint does not fit {what}: {len(missing)} missing keys"
            + (f" ({_key_list(missing)})" if missing else "")
            + f", {len(unexpected)} unexpected keys"
            + (f" ({_key_list(unexpected)})" if unexpected else ""),
            source,
        )
    for k, v in own.items():
        got = state[k]
        if not hasattr(got, "shape") or tuple(got.shape) != tuple(v.shape):
            shape = tuple(got.shape) if hasattr(got, "shape") else type(got).__name__
            raise InputError(
                f"checkpoint does not fit {what}: {k} has shape {shape}, expected {tuple(v.shape)}",
                source,
            )
    net.load_state_dict(state, strict=True)


def import_cirtorch(path: str | Path, out: str | Path) -> Path:
    """Convert a cirtorch checkpoint into a model file.

    A cirtorch checkpoint is a ``torch.save`` of ``{"meta": {...}, "state_dict": {...}, ...}`` with
    ``meta`` naming ``architecture``, ``pooling``, ``mean``, ``std`` and optionally
    ``whitening`` (a ``whiten`` layer in the state dict), ``local_whitening`` / ``regional``
    (not supported: refused) and ``Lw`` (learned whitenings ``{name: {"ss"|"ms": {"m", "P"}}}``).

    Returns:
        ``out``.

    Raises:
        InputError: unreadable, not a cirtorch checkpoint, an unsupported variant, or a state dict
            that does not fit the architecture its meta names (missing / unexpected keys named).
    """
    state = _torch_load(path)
    check_plain(state, path, what="checkpoint")
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("meta"), dict)
        or not isinstance(state.get("state_dict"), dict)
    ):
        raise InputError("not a cirtorch checkpoint (a dict with 'meta' and 'state_dict')", path)
    meta = state["meta"]
    check_finite_weights(state["state_dict"], path)
    try:
        arch, pooling = str(meta["architecture"]), str(meta["pooling"])
        mean, std = _rgb3(meta["mean"], "mean"), _rgb3(meta["std"], "std")
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            f"cirtorch meta lacks architecture / pooling / mean / std ({exc})", path
        ) from None
    for flag in ("local_whitening", "regional"):
        if meta.get(flag):
            raise InputError(f"cirtorch networks with {flag} are not supported", path)
    if pooling not in POOLING:
        raise InputError(
            f"cirtorch pooling {pooling!r} is not supported (use one of {', '.join(sorted(POOLING))})",
            path,
        )
    if not known_architecture(arch) or arch.startswith("timm:"):
        raise InputError(f"cirtorch architecture {arch!r} is not supported here", path)
    trunk = build_trunk(arch)
    trunk = Trunk(arch, trunk.module, trunk.dim, mean, std, trunk.kind)
    sd = state["state_dict"]
    whiten_dim = None
    if meta.get("whitening"):
        w = sd.get("whiten.weight")
        whiten_dim = int(w.shape[0]) if hasattr(w, "shape") and len(w.shape) == 2 else trunk.dim
        if not 1 <= whiten_dim <= MAX_WHITEN_DIM:
            raise InputError(
                f"cirtorch whitening layer of {whiten_dim} outputs; at most {MAX_WHITEN_DIM}", path
            )
    net = RetrievalNet(trunk, pooling, whiten_dim=whiten_dim)
    load_matching_state(net, sd, what=f"{arch} with {pooling} pooling (its meta)", source=path)
    lw = _read_lw(meta.get("Lw") or {}, net.dim, path)
    source = {
        "format": "cirtorch",
        "path": str(Path(path).resolve()),
        "sha256": input_record(path).sha256,
        "meta": {
            k: meta[k] for k in ("architecture", "pooling", "whitening", "outputdim") if k in meta
        },
    }
    return save_model(out, net.eval(), lw=lw, source=source)
