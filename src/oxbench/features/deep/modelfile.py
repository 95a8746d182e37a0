"""The schema of a model file, checked after the restricted load and before anything is built.

``torch.load(..., weights_only=True)`` guarantees that loading runs no code; it does not guarantee
that what comes back is sane. :func:`check_model_payload` checks the plain data of a model file
(the layout in :mod:`oxbench.features.deep.model`) before a network is built from it:

- the structure: containers of the expected types, at most :data:`MAX_DEPTH` deep and
  :data:`MAX_NODES` items, text of bounded length (a 300,000-deep ``architecture`` is one line,
  not a ``RecursionError``);
- the settings: an architecture from the known list (:func:`~oxbench.features.deep.backbones.check_architecture`:
  ``timm:`` names resolved in timm's offline registry, never a hub or path prefix, so a model file
  never makes timm reach the network), a known pooling, ``p`` finite and ``> 0``, ``whiten_dim``
  bounded (:data:`MAX_WHITEN_DIM`, so ``10**12`` allocates nothing), 3 finite ``mean`` and
  positive ``std`` values;
- the weights: every tensor finite (a NaN weight is refused when the file is read, not after an
  extraction), GeM's ``pool.p`` ``> 0``, the whitening layer's shape the one ``whiten_dim`` states.

:func:`torch_load_reason` turns torch's refusal of a non-plain file into one line without torch's
advice to load it with ``weights_only=False``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.errors import InputError
from oxbench.schema import Float, FloatTuple, Int, Optional, Size

#: Deepest nesting of containers in a model file (the layout's deepest is 4: lw/name/ss/m).
MAX_DEPTH = 12
#: Most containers and values a model file may hold (a ResNet-152 state dict has ~1,000 entries).
MAX_NODES = 200_000
#: Longest text value (architecture names, provenance strings).
MAX_TEXT = 4096
#: Largest output size of a whitening layer or a learned whitening's projection.
MAX_WHITEN_DIM = 1 << 16

#: The keys of a model file's top level.
MODEL_KEYS = frozenset(
    {
        "format",
        "version",
        "architecture",
        "pooling",
        "p",
        "whiten_dim",
        "mean",
        "std",
        "lw",
        "source",
        "state_dict",
    }
)

_P = Optional(Float(lo=0, lo_open=True, hi=1000))
_WHITEN_DIM = Optional(Size(lo=1, hi=MAX_WHITEN_DIM))
_MEAN = FloatTuple(Float(lo=-10, hi=10), min_len=3, max_len=3)
_STD = FloatTuple(Float(lo=0, lo_open=True, hi=10), min_len=3, max_len=3)
_VERSION = Int()
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class ModelPayload:
    """The checked settings of a model file, and its (not yet loaded) parts."""

    architecture: str
    pooling: str
    p: float
    whiten_dim: int | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    state_dict: Mapping[str, Any]
    lw: Mapping[str, Any]
    source: Mapping[str, Any]


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "dtype") and hasattr(x, "shape")


def check_plain(obj: Any, source: str | Path, *, what: str = "model file") -> None:
    """Refuse containers nested deeper than :data:`MAX_DEPTH`, more than :data:`MAX_NODES` items,
    keys that are not text, text longer than :data:`MAX_TEXT`, or values that are not plain data,
    tensors or numpy arrays. Iterative: any depth is one line, never a ``RecursionError``.

    Raises:
        InputError: naming ``source``.
    """
    stack: list[tuple[Any, int]] = [(obj, 0)]
    nodes = 0
    while stack:
        node, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InputError(
                f"{what} holds more than {MAX_NODES:,} values; not a model file", source
            )
        if isinstance(node, dict):
            if depth >= MAX_DEPTH:
                raise InputError(
                    f"{what} is nested deeper than {MAX_DEPTH} levels; not a model file", source
                )
            for k, v in node.items():
                if not isinstance(k, str) or len(k) > MAX_TEXT:
                    raise InputError(
                        f"{what} has a key that is not short text ({type(k).__name__})", source
                    )
                stack.append((v, depth + 1))
        elif isinstance(node, list | tuple):
            if depth >= MAX_DEPTH:
                raise InputError(
                    f"{what} is nested deeper than {MAX_DEPTH} levels; not a model file", source
                )
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            if len(node) > MAX_TEXT:
                raise InputError(
                    f"{what} holds a text value of {len(node):,} characters; at most {MAX_TEXT:,}",
                    source,
                )
        elif (
            node is None
            or isinstance(node, bool | int | float)
            or _is_tensor(node)
            or isinstance(node, np.ndarray)
        ):
            continue
        else:
            raise InputError(
                f"{what} holds a {type(node).__name__}, not plain data or tensors", source
            )


def check_finite_weights(state: Mapping[str, Any], source: str | Path) -> None:
    """Refuse a state dict whose floating tensors hold NaN or infinity (names the first one)."""
    import torch

    for name, t in state.items():
        if not _is_tensor(t):
            raise InputError(f"weight {name!r} is a {type(t).__name__}, not a tensor", source)
        if t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            raise InputError(
                f"weight {name!r} holds NaN or infinite values; the model file is damaged", source
            )


def check_model_payload(state: Any, source: str | Path) -> ModelPayload:
    """The checked content of a loaded model file (see the module docstring).

    Raises:
        InputError: one line naming ``source`` and the first problem.
    """
    from oxbench.features.deep.backbones import check_architecture
    from oxbench.features.deep.pooling import POOLING

    check_plain(state, source)
    if not isinstance(state, dict):
        raise InputError(
            "not an oxbench model file (written by oxbench import-checkpoint or oxbench train)",
            source,
        )
    extra = sorted(set(state) - MODEL_KEYS)
    if extra:
        raise InputError(
            f"model file has unknown entries {', '.join(map(repr, extra[:4]))}", source
        )
    missing = [
        k for k in ("architecture", "pooling", "mean", "std", "state_dict") if k not in state
    ]
    if missing:
        raise InputError(f"malformed model file: no {', '.join(missing)}", source)
    arch = state["architecture"]
    if not isinstance(arch, str):
        raise InputError(
            f"model file's architecture is a {type(arch).__name__}, not a name", source
        )
    check_architecture(arch, source=source)
    pooling = state["pooling"]
    if not isinstance(pooling, str) or pooling not in POOLING:
        raise InputError(
            f"model file has unknown pooling {_short(pooling)}; known: {', '.join(sorted(POOLING))}",
            source,
        )
    try:
        p = _P.check("p", state.get("p"))
        whiten_dim = _WHITEN_DIM.check("whiten_dim", state.get("whiten_dim"))
        mean = _MEAN.check("mean", _floats(state["mean"]))
        std = _STD.check("std", _floats(state["std"]))
    except InputError as exc:
        raise InputError(f"model file {exc}", source) from None
    sd = state["state_dict"]
    if not isinstance(sd, dict) or not sd:
        raise InputError(
            "model file's state_dict is not a mapping of parameter names to tensors", source
        )
    check_finite_weights(sd, source)
    pool_p = sd.get("pool.p")
    if pool_p is not None and pool_p.numel() and not bool((pool_p > 0).all()):
        raise InputError(
            f"model file's GeM exponent pool.p is {pool_p.flatten()[0].item():g}; it must be > 0",
            source,
        )
    w = sd.get("whiten.weight")
    if (w is None) != (whiten_dim is None):
        raise InputError(
            "model file's whiten_dim and its whitening layer (whiten.weight) disagree", source
        )
    if w is not None and (w.ndim != 2 or int(w.shape[0]) != whiten_dim):
        raise InputError(
            f"model file's whitening layer has shape {tuple(w.shape)}, expected [{whiten_dim}, D]",
            source,
        )
    lw = state.get("lw") or {}
    src = state.get("source") or {}
    if not isinstance(lw, dict) or not isinstance(src, dict):
        raise InputError("model file's lw and source must be mappings", source)
    return ModelPayload(arch, pooling, 3.0 if p is None else p, whiten_dim, mean, std, sd, lw, src)


def check_whitening_shape(rows: int, cols: int, dim: int, what: str, source: str | Path) -> None:
    """A learned whitening's ``P`` must be ``[D' <= MAX_WHITEN_DIM, dim]``."""
    if cols != dim or not 1 <= rows <= MAX_WHITEN_DIM:
        raise InputError(
            f"learned whitening {what}: P is [{rows}, {cols}], expected [D' <= {MAX_WHITEN_DIM}, {dim}]",
            source,
        )


def _floats(values: Any) -> Any:
    if _is_tensor(values) or isinstance(values, np.ndarray):
        return [float(v) for v in values.reshape(-1).tolist()]
    return values


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def torch_load_reason(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in one line without torch's advice.

    torch suggests re-running with ``weights_only=False``, which would run the file's code: that
    advice is never passed on.
    """
    text = _ANSI.sub("", str(exc))
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it holds a Python object ({found.group(1)}) where plain data and tensors belong; refused, since loading it could run code"
    if "Weights only load failed" in text or "weights_only" in text:
        return "it holds objects other than plain data and tensors; refused, since loading it could run code"
    if isinstance(exc, RecursionError):
        return "it is nested too deeply"
    line = " ".join(text.split())[:200]
    return line or type(exc).__name__
