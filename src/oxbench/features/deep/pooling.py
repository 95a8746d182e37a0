"""Pooling heads: a ``[B, C, H, W]`` activation map to one ``[B, C]`` vector per image.

Every head returns the *unnormalised* pooled vector; :class:`~oxbench.features.deep.model.RetrievalNet`
L2-normalises it (as cirtorch's network does after its pooling layer).

- MAC (Tolias et al. ICLR 2016, Razavian et al. 2016): ``max_{h,w} x[c, h, w]``;
- SPoC (Babenko & Lempitsky ICCV 2015, without the centring prior): ``mean_{h,w} x[c, h, w]``;
- GeM (Radenovic et al. TPAMI 2018): ``(mean_{h,w} max(x, eps) ** p) ** (1 / p)`` with a learnable
  ``p`` (a 1-element parameter named ``p``, as in cirtorch checkpoints);
- R-MAC (Tolias et al. ICLR 2016): MAC of square regions at ``L`` scales plus the whole map, each
  region vector L2-normalised (``v / (||v|| + eps)``), all summed; regions by :func:`rmac_regions`;
- fc6 (Babenko et al. ECCV 2014, "neural codes"): the first fully connected layer of a VGG or
  AlexNet classifier after its ReLU (Caffe's ``fc6`` blob, which the in-place ``relu6`` overwrites),
  4,096-D, over the trunk's map max-pooled by the layer the trunk leaves out and average-pooled to
  the classifier's grid (torchvision's ``AdaptiveAvgPool2d``: the identity at the 224-px input the
  classifier was trained on).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from oxbench.errors import require
from oxbench.features.deep import FC6_DIM, FC6_HEADS, check_fc6_backbone

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
else:
    torch = require("torch", "deep")
    nn = torch.nn

#: Overlap of neighbouring R-MAC regions that the region rule aims for (Tolias et al. 2016).
RMAC_OVERLAP = 0.4


#: How :func:`rmac_regions` does its arithmetic (``RMAC(grid=...)``, ``GlobalConfig.rmac_grid``).
RMAC_GRIDS = ("float64", "float32")


def rmac_regions(
    height: int,
    width: int,
    levels: int = 3,
    overlap: float = RMAC_OVERLAP,
    *,
    grid: str = "float32",
) -> list[tuple[int, int, int]]:
    """The R-MAC regions of a ``height x width`` map: ``(top, left, side)`` squares, coarse first.

    The rule (Tolias, Sicre & Jegou, ICLR 2016, Sec. 3; their MATLAB code and cirtorch's ``rmac``),
    with ``m = min(H, W)`` and ``M = max(H, W)``:

    1. extra regions on the long side (0 for a square map): for ``e = 1 .. 6`` the step
       ``b_e = (M - m) / e`` and the cost ``|(m^2 - m * b_e) / m^2 - overlap|`` (how far the overlap of
       two neighbouring ``m``-sized squares is from ``overlap``, 0.4); ``e`` is the first index of the
       smallest cost *as computed* -- in exact arithmetic several ``e`` can tie (``5 x 9``:
       ``e = 1`` and ``e = 2`` both cost 0.2), and which one wins depends on the rounding;
    2. at level ``l = 1 .. levels``: squares of side ``s = floor(2 m / (l + 1))`` (none when 0),
       ``l`` of them along the short side and ``l + e`` along the long one; with ``n`` squares along
       a side of length ``L``, ``c = floor(s / 2 - 1)`` and ``step = (L - s) / (n - 1)`` (0 when
       ``n = 1``), the ``k``-th starts at ``floor(c + k * step) - c``.

    ``grid="float32"`` (default) rounds as cirtorch's tensors do: ``b_e``, the cost (``m * b_e``, the difference, the quotient, minus
    ``overlap`` rounded to float32) and ``c + k * step`` (``step`` rounded to float32, then the
    product and the sum) each rounded to float32. The two differ on a few map sizes (of the 1,600
    from 1x1 to 40x40, 24: e.g. ``5 x 9`` gets 1 extra region instead of 2, ``2 x 32`` a last
    offset of 30 instead of 31); ``float32`` gives a published cirtorch R-MAC model's descriptors.
    ``grid="float64"`` evaluates both in double precision (the rule as written, kept as an option).
    The whole map (MAC) is not in the list.
    """
    if grid not in RMAC_GRIDS:
        raise ValueError(f"unknown R-MAC grid {grid!r}; use one of {RMAC_GRIDS}")
    f32 = grid == "float32"
    w = min(width, height)
    extra_w = extra_h = 0
    if width != height:
        best = (
            _extra_regions32(w, max(height, width), overlap)
            if f32
            else min(
                range(1, 7),
                key=lambda e: abs((w * w - w * ((max(height, width) - w) / e)) / (w * w) - overlap),
            )
        )
        if height < width:
            extra_w = best
        else:
            extra_h = best
    out: list[tuple[int, int, int]] = []
    for level in range(1, levels + 1):
        side = math.floor(2 * w / (level + 1))
        if side == 0:
            continue
        c = math.floor(side / 2 - 1)
        tops = _starts(height, side, level + extra_h, c, f32)
        lefts = _starts(width, side, level + extra_w, c, f32)
        out.extend((t, left, side) for t in tops for left in lefts)
    return out


def _extra_regions32(short: int, long_: int, overlap: float) -> int:
    """Step 1 of the rule in float32: the first ``e`` of the smallest float32 cost."""
    import numpy as np

    e = np.arange(1, 7, dtype=np.float32)
    b = (np.float32(1.0) / e) * np.float32(
        long_ - short
    )  # torch's number / tensor: reciprocal, times
    sq = np.float32(short * short)
    cost = np.abs((sq - np.float32(short) * b) / sq - np.float32(overlap))
    return int(np.argmin(cost)) + 1


def _starts(length: int, side: int, n: int, c: int, f32: bool = False) -> list[int]:
    step = 0.0 if n == 1 else (length - side) / (n - 1)
    if not f32:
        return [math.floor(c + k * step) - c for k in range(n)]
    import numpy as np

    pos = np.float32(c) + np.arange(n, dtype=np.float32) * np.float32(step)
    return [int(v) - c for v in np.floor(pos)]


class MAC(nn.Module):
    """Maximum activation of each channel."""

    def forward(self, x):  # noqa: ANN001, ANN201 - Tensor -> Tensor
        return x.amax(dim=(-2, -1))


class SPoC(nn.Module):
    """Average activation of each channel (sum pooling up to the L2 that follows)."""

    def forward(self, x):  # noqa: ANN001, ANN201
        return x.mean(dim=(-2, -1))


class GeM(nn.Module):
    """Generalised mean: ``(mean max(x, eps) ** p) ** (1 / p)``; ``p = 1`` is SPoC, ``p -> inf`` MAC.

    Args:
        p: initial exponent (3 as published).
        eps: activations are clamped to at least this (keeps the power defined and differentiable).
        learnable: train ``p`` with the network.
    """

    def __init__(self, p: float = 3.0, eps: float = 1e-6, *, learnable: bool = True) -> None:
        super().__init__()
        if not p > 0 or not math.isfinite(p):
            raise ValueError(f"GeM p must be a positive number, got {p}")
        self.p = nn.Parameter(torch.full((1,), float(p)), requires_grad=learnable)
        self.eps = eps

    def forward(self, x):  # noqa: ANN001, ANN201
        p = self.p.to(x.dtype)
        return x.clamp(min=self.eps).pow(p).mean(dim=(-2, -1)).pow(1.0 / p)

    def extra_repr(self) -> str:
        return f"p={float(self.p.detach()[0]):.4f}, eps={self.eps}"


class RMAC(nn.Module):
    """Regional MAC: the L2-normalised MAC of the whole map and of every region, summed.

    Args:
        levels: region scales ``L`` (3 as published).
        eps: added to each region vector's norm before dividing.
        grid: the region arithmetic of :func:`rmac_regions` (``"float32"``, the default:
            cirtorch's; ``"float64"``: double precision).
    """

    def __init__(self, levels: int = 3, eps: float = 1e-6, *, grid: str = "float32") -> None:
        super().__init__()
        if levels < 1:
            raise ValueError(f"R-MAC levels must be >= 1, got {levels}")
        if grid not in RMAC_GRIDS:
            raise ValueError(f"unknown R-MAC grid {grid!r}; use one of {RMAC_GRIDS}")
        self.levels = levels
        self.eps = eps
        self.grid = grid

    def forward(self, x):  # noqa: ANN001, ANN201
        h, w = int(x.shape[-2]), int(x.shape[-1])
        v = self._l2n(x.amax(dim=(-2, -1)))
        for top, left, side in rmac_regions(h, w, self.levels, grid=self.grid):
            v = v + self._l2n(x[..., top : top + side, left : left + side].amax(dim=(-2, -1)))
        return v

    def _l2n(self, v):  # noqa: ANN001, ANN202
        return v / (v.norm(dim=-1, keepdim=True) + self.eps)

    def extra_repr(self) -> str:
        return f"levels={self.levels}, grid={self.grid}"


class FC6(nn.Module):
    """The classifier's first fully connected layer as a head: ``relu(W avgpool(maxpool(x)) + b)``.

    The trunk (:func:`~oxbench.features.deep.backbones.build_trunk`) stops before its last max
    pooling, as cirtorch's does; this head applies that pooling, torchvision's adaptive average
    pooling to the classifier's ``grid x grid`` input, and the ``Linear`` layer named ``fc`` (its
    weights are the classifier's, :func:`~oxbench.features.deep.backbones.imagenet_fc6_state_dict`).

    Args:
        architecture: a backbone of :data:`~oxbench.features.deep.FC6_HEADS`.
    """

    def __init__(self, architecture: str) -> None:
        super().__init__()
        check_fc6_backbone(architecture)
        self.kernel, self.stride, self.grid, channels = FC6_HEADS[architecture]
        self.dim = FC6_DIM
        self.fc = nn.Linear(channels * self.grid * self.grid, FC6_DIM)

    def forward(self, x):  # noqa: ANN001, ANN201
        pad_h = max(0, self.kernel - int(x.shape[-2]))
        pad_w = max(0, self.kernel - int(x.shape[-1]))
        if pad_h or pad_w:  # a map smaller than the pooling window (a small query crop): the
            # trunk ends with a ReLU, so zeros on the right / bottom leave each maximum as it is
            x = torch.nn.functional.pad(x, (0, pad_w, 0, pad_h))
        x = torch.nn.functional.max_pool2d(x, self.kernel, self.stride)
        x = torch.nn.functional.adaptive_avg_pool2d(x, self.grid)
        return torch.relu(self.fc(torch.flatten(x, 1)))

    def extra_repr(self) -> str:
        return f"maxpool={self.kernel}/{self.stride}, grid={self.grid}"


#: Pooling heads by name (``GlobalConfig.pooling``).
POOLING = {"mac": MAC, "spoc": SPoC, "gem": GeM, "rmac": RMAC, "fc6": FC6}


def make_pooling(name: str, *, p: float = 3.0, architecture: str = ""):  # noqa: ANN201 - nn.Module
    """A pooling head by name (``mac``, ``spoc``, ``gem`` with initial ``p``, ``rmac``, ``fc6`` of
    the backbone ``architecture``)."""
    if name not in POOLING:
        raise ValueError(f"unknown pooling {name!r}; use one of {sorted(POOLING)}")
    if name == "fc6":
        return FC6(architecture)
    return GeM(p) if name == "gem" else POOLING[name]()
