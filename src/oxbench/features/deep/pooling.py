"""Pooling heads: a ``[B, C, H, W]`` activation map to one ``[B, C]`` vector per image.

Every head returns the *unnormalised* pooled vector; :class:`~oxbench.features.deep.model.RetrievalNet`
L2-normalises it (as cirtorch's network does after its pooling layer).

- MAC (Tolias et al. ICLR 2016, Razavian et al. 2016): ``max_{h,w} x[c, h, w]``;
- SPoC (Babenko & Lempitsky ICCV 2015, without the centring prior): ``mean_{h,w} x[c, h, w]``;
- GeM (Radenovic et al. TPAMI 2018): ``(mean_{h,w} max(x, eps) ** p) ** (1 / p)`` with a learnable
  ``p`` (a 1-element parameter named ``p``, as in cirtorch checkpoints);
- R-MAC (Tolias et al. ICLR 2016): MAC of square regions at ``L`` scales plus the whole map, each
  region vector L2-normalised (``v / (||v|| + eps)``), all summed; regions by :func:`rmac_regions`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from oxbench.errors import require

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn
else:
    torch = require("torch", "deep")
    nn = torch.nn

#: Overlap of neighbouring R-MAC regions that the region rule aims for (Tolias et al. 2016).
RMAC_OVERLAP = 0.4


def rmac_regions(height: int, width: int, levels: int = 3, overlap: float = RMAC_OVERLAP) -> list[tuple[int, int, int]]:
    """The R-MAC regions of a ``height x width`` map: ``(top, left, side)`` squares, coarse first.

    At level ``l = 1 .. levels`` the regions are squares of side ``floor(2 * min(H, W) / (l + 1))``:
    ``l`` of them along the short side and ``l + extra`` along the long side, spread evenly from
    edge to edge (top-left corners ``floor(c + k * step) - c`` with ``c = floor(side / 2 - 1)``).
    ``extra`` (0 for a square map) is chosen once per map: the number of extra regions ``e`` in
    ``1 .. 6`` whose step ``b = (max - min) / e`` makes the overlap of two neighbouring
    ``min``-sized regions, ``(min^2 - min * b) / min^2``, closest to ``overlap`` (the first such
    ``e`` on ties). This is the region rule of Tolias et al.'s MATLAB code and of cirtorch.
    The whole map (MAC) is not in the list.
    """
    w = min(width, height)
    extra_w = extra_h = 0
    if width != height:
        best = min(range(1, 7), key=lambda e: abs((w * w - w * ((max(height, width) - w) / e)) / (w * w) - overlap))
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
        tops = _starts(height, side, level + extra_h, c)
        lefts = _starts(width, side, level + extra_w, c)
        out.extend((t, left, side) for t in tops for left in lefts)
    return out


def _starts(length: int, side: int, n: int, c: int) -> list[int]:
    step = 0.0 if n == 1 else (length - side) / (n - 1)
    return [math.floor(c + k * step) - c for k in range(n)]


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
    """

    def __init__(self, levels: int = 3, eps: float = 1e-6) -> None:
        super().__init__()
        if levels < 1:
            raise ValueError(f"R-MAC levels must be >= 1, got {levels}")
        self.levels = levels
        self.eps = eps

    def forward(self, x):  # noqa: ANN001, ANN201
        h, w = int(x.shape[-2]), int(x.shape[-1])
        v = self._l2n(x.amax(dim=(-2, -1)))
        for top, left, side in rmac_regions(h, w, self.levels):
            v = v + self._l2n(x[..., top : top + side, left : left + side].amax(dim=(-2, -1)))
        return v

    def _l2n(self, v):  # noqa: ANN001, ANN202
        return v / (v.norm(dim=-1, keepdim=True) + self.eps)

    def extra_repr(self) -> str:
        return f"levels={self.levels}"


#: Pooling heads by name (``GlobalConfig.pooling``).
POOLING = {"mac": MAC, "spoc": SPoC, "gem": GeM, "rmac": RMAC}


def make_pooling(name: str, *, p: float = 3.0):  # noqa: ANN201 - an nn.Module
    """A pooling head by name (``mac``, ``spoc``, ``gem`` with initial ``p``, ``rmac``)."""
    if name not in POOLING:
        raise ValueError(f"unknown pooling {name!r}; use one of {sorted(POOLING)}")
    return GeM(p) if name == "gem" else POOLING[name]()
