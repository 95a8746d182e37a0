"""Pooling heads and the multi-scale combination against slow numpy references of their formulas."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from oxbench.features.deep.pooling import MAC, RMAC, GeM, SPoC, make_pooling, rmac_regions  # noqa: E402

# --- slow references (one image, one channel vector at a time) -----------------------------------


def ref_mac(x: np.ndarray) -> np.ndarray:
    c, h, w = x.shape
    return np.array([max(x[k, i, j] for i in range(h) for j in range(w)) for k in range(c)])


def ref_spoc(x: np.ndarray) -> np.ndarray:
    c, h, w = x.shape
    return np.array(
        [sum(x[k, i, j] for i in range(h) for j in range(w)) / (h * w) for k in range(c)]
    )


def ref_gem(x: np.ndarray, p: float, eps: float = 1e-6) -> np.ndarray:
    c, h, w = x.shape
    return np.array(
        [
            (sum(max(x[k, i, j], eps) ** p for i in range(h) for j in range(w)) / (h * w))
            ** (1 / p)
            for k in range(c)
        ]
    )


def ref_regions(h: int, w: int, levels: int = 3, ovr: float = 0.4) -> list[tuple[int, int, int]]:
    """Tolias et al.'s rule, written out: squares of side 2*min/(l+1), l (+ extra on the long side)
    per side, evenly spread; extra chosen so neighbouring min-sized regions overlap closest to 40%."""
    short, long_ = min(h, w), max(h, w)
    extra = 0
    if h != w:
        costs = []
        for e in range(1, 7):
            step = (long_ - short) / e
            costs.append(abs((short * short - short * step) / (short * short) - ovr))
        extra = int(np.argmin(costs)) + 1
    regions = []
    for level in range(1, levels + 1):
        side = int(np.floor(2 * short / (level + 1)))
        if side == 0:
            continue
        half = int(np.floor(side / 2 - 1))
        n_h = level + (extra if h > w else 0)
        n_w = level + (extra if w > h else 0)
        step_h = 0 if n_h == 1 else (h - side) / (n_h - 1)
        step_w = 0 if n_w == 1 else (w - side) / (n_w - 1)
        for a in range(n_h):
            for b in range(n_w):
                top = int(np.floor(half + a * step_h)) - half
                left = int(np.floor(half + b * step_w)) - half
                regions.append((top, left, side))
    return regions


def ref_rmac(x: np.ndarray, levels: int = 3, eps: float = 1e-6) -> np.ndarray:
    _, h, w = x.shape
    v = ref_mac(x)
    total = v / (np.linalg.norm(v) + eps)
    for top, left, side in ref_regions(h, w, levels):
        r = ref_mac(x[:, top : top + side, left : left + side])
        total = total + r / (np.linalg.norm(r) + eps)
    return total


def _maps(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    # non-negative like ReLU outputs, with exact zeros (GeM's clamp matters)
    x = np.random.default_rng(seed).standard_normal(shape)
    return np.maximum(x, 0.0)


# --- the heads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 5, 4, 7), (1, 3, 1, 1), (3, 4, 9, 6)])
def test_heads_equal_their_references(shape: tuple[int, ...]) -> None:
    x = _maps(sum(shape), shape)
    t = torch.from_numpy(x)
    for head, ref in (
        (MAC(), ref_mac),
        (SPoC(), ref_spoc),
        (GeM(2.5), lambda a: ref_gem(a, 2.5)),
        (RMAC(grid="float64"), ref_rmac),
    ):
        got = head.double()(t).detach().numpy()
        want = np.stack([ref(x[b]) for b in range(shape[0])])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12, err_msg=type(head).__name__)


def test_rmac_regions_hand_worked() -> None:
    # 8x8: one 8x8 region, 4 of 5x5 at offsets 0/3, 9 of 4x4 at offsets 0/2/4
    assert rmac_regions(8, 8) == (
        [(0, 0, 8)]
        + [(t, s, 5) for t in (0, 3) for s in (0, 3)]
        + [(t, s, 4) for t in (0, 2, 4) for s in (0, 2, 4)]
    )
    # 6x10 (wider than tall): one extra region along the width (overlap 1/3 is closest to 0.4)
    assert rmac_regions(6, 10) == (
        [(0, 0, 6), (0, 4, 6)]
        + [(t, s, 4) for t in (0, 2) for s in (0, 3, 6)]
        + [(t, s, 3) for t in (0, 1, 3) for s in (0, 2, 4, 7)]
    )
    # the transpose gives the transposed regions
    assert sorted(rmac_regions(10, 6)) == sorted((s, t, side) for t, s, side in rmac_regions(6, 10))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(1, 4))
def test_rmac_regions_match_the_written_rule_and_stay_inside(h: int, w: int, levels: int) -> None:
    regions = rmac_regions(h, w, levels, grid="float64")
    assert regions == ref_regions(h, w, levels)
    for top, left, side in regions + rmac_regions(h, w, levels):
        assert side >= 1 and 0 <= top and top + side <= h and 0 <= left and left + side <= w
    # the first level covers the short side completely
    if regions:
        assert regions[0][2] == min(h, w)


def test_gem_p_is_learnable_and_bridges_spoc_and_mac() -> None:
    x = torch.from_numpy(_maps(3, (2, 6, 5, 5)) + 0.01)
    gem = GeM(3.0)
    assert gem.p.requires_grad and tuple(gem.p.shape) == (1,)
    gem.double()(x).sum().backward()
    assert (
        gem.p.grad is not None
        and torch.isfinite(gem.p.grad).all()
        and float(gem.p.grad.abs().sum()) > 0
    )
    np.testing.assert_allclose(GeM(1.0).double()(x).detach(), SPoC()(x), rtol=1e-9)
    big = GeM(80.0).double()(x).detach()
    np.testing.assert_allclose(big, MAC()(x), rtol=0.05)
    assert not GeM(3.0, learnable=False).p.requires_grad
    with pytest.raises(ValueError):
        GeM(0.0)
    with pytest.raises(ValueError):
        make_pooling("vlad")


def test_gem_clamps_at_eps() -> None:
    x = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    np.testing.assert_allclose(
        GeM(3.0, eps=1e-6).double()(x).detach(), np.full((1, 2), 1e-6), rtol=1e-9
    )


# --- the multi-scale combination -----------------------------------------------------------------


def test_multiscale_power_mean_equals_slow_reference() -> None:
    from oxbench.features.deep.backbones import Trunk
    from oxbench.features.deep.extract import ExtractOptions, Extractor
    from oxbench.features.deep.model import RetrievalNet

    torch.manual_seed(0)
    trunk_module = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
    )
    trunk = Trunk("tiny", trunk_module, 16, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), "map")
    net = RetrievalNet(trunk, "gem", p=2.5).eval()
    scales = (1.0, 2**-0.5, 0.5)
    ext = Extractor(net, ExtractOptions(max_side=64, scales=scales, batch_size=3, device="cpu"))
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (20, 28, 3), dtype=np.uint8) for _ in range(4)] + [
        rng.integers(0, 256, (31, 17, 3), dtype=np.uint8)
    ]
    got = ext.describe(images)

    mean = np.array([0.5, 0.4, 0.3]).reshape(3, 1, 1)
    std = np.array([0.2, 0.25, 0.3]).reshape(3, 1, 1)
    for i, im in enumerate(images):
        x = torch.from_numpy(
            ((im.transpose(2, 0, 1) / 255.0 - mean) / std)[None].astype(np.float32)
        )
        per_scale = []
        for s in scales:
            xs = (
                x
                if s == 1
                else torch.nn.functional.interpolate(
                    x, scale_factor=s, mode="bilinear", align_corners=False
                )
            )
            with torch.no_grad():
                fmap = trunk_module(xs)[0].double().numpy()
            v = ref_gem(fmap, 2.5)
            per_scale.append(v / np.linalg.norm(v))
        combined = np.mean([v**2.5 for v in per_scale], axis=0) ** (1 / 2.5)
        want = combined / np.linalg.norm(combined)
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-5)
    assert math.isclose(net.multiscale_power, 2.5)


# ---------------------------------------------------------------------------------------------
# cirtorch's float32 region arithmetic (issue 20), a slow scalar reference written from the rule:
# every intermediate rounded to float32 the way float32 tensors round them (a number divided by a
# tensor is the tensor's reciprocal times the number).


def _f(v: float) -> np.float32:
    return np.float32(v)


def ref_regions32(h: int, w: int, levels: int = 3, ovr: float = 0.4) -> list[tuple[int, int, int]]:
    short, long_ = min(h, w), max(h, w)
    extra = 0
    if h != w:
        best, best_cost = 0, None
        for e in range(1, 7):
            step = _f(_f(_f(1.0) / _f(e)) * _f(long_ - short))
            sq = _f(short * short)
            cost = abs(_f(_f(_f(sq - _f(_f(short) * step)) / sq) - _f(ovr)))
            if best_cost is None or cost < best_cost:  # the first of the smallest
                best, best_cost = e, cost
        extra = best
    regions = []
    for level in range(1, levels + 1):
        side = (2 * short) // (level + 1)
        if side == 0:
            continue
        half = int(np.floor(side / 2 - 1))
        n_h = level + (extra if h > w else 0)
        n_w = level + (extra if w > h else 0)
        step_h = _f(0.0 if n_h == 1 else (h - side) / (n_h - 1))
        step_w = _f(0.0 if n_w == 1 else (w - side) / (n_w - 1))
        for a in range(n_h):
            for b in range(n_w):
                top = int(np.floor(_f(_f(half) + _f(_f(a) * step_h)))) - half
                left = int(np.floor(_f(_f(half) + _f(_f(b) * step_w)))) - half
                regions.append((top, left, side))
    return regions


def test_rmac_float32_grid_on_the_sizes_where_rounding_decides() -> None:
    # 5 x 9: e = 1 and e = 2 tie in exact arithmetic (cost 0.2); float32 picks 1, float64 picks 2
    assert rmac_regions(5, 9, grid="float32") == [
        (0, 0, 5),
        (0, 4, 5),
        (0, 0, 3),
        (0, 3, 3),
        (0, 6, 3),
        (2, 0, 3),
        (2, 3, 3),
        (2, 6, 3),
        (0, 0, 2),
        (0, 2, 2),
        (0, 4, 2),
        (0, 7, 2),
        (1, 0, 2),
        (1, 2, 2),
        (1, 4, 2),
        (1, 7, 2),
        (3, 0, 2),
        (3, 2, 2),
        (3, 4, 2),
        (3, 7, 2),
    ]
    assert len(rmac_regions(5, 9, grid="float64")) == 26
    assert rmac_regions(5, 9) == rmac_regions(5, 9, grid="float32")  # cirtorch's is the default
    # 2 x 32, level 2 (side 1, 8 along the width): 7 * (31 / 7) lands just below 31 in float32
    level2 = [
        left for top, left, side in rmac_regions(2, 32, grid="float32") if side == 1 and top == 0
    ][:8]
    assert level2 == [0, 4, 8, 13, 17, 22, 26, 30]
    float64 = [
        left for top, left, side in rmac_regions(2, 32, grid="float64") if side == 1 and top == 0
    ]
    assert float64[:8][-1] == 31
    with pytest.raises(ValueError, match="unknown R-MAC grid"):
        rmac_regions(5, 9, grid="float16")


def test_rmac_float32_grid_matches_the_written_rule_everywhere() -> None:
    differ = []
    for h in range(1, 65):
        for w in range(1, 65):
            assert rmac_regions(h, w, grid="float32") == ref_regions32(h, w), (h, w)
            assert rmac_regions(h, w) == rmac_regions(h, w, grid="float32")
            if rmac_regions(h, w, grid="float64") != ref_regions32(h, w):
                differ.append((h, w))
    assert (5, 9) in differ and (2, 32) in differ and (7, 7) not in differ
    assert rmac_regions(4, 4, 2, grid="float32") == ref_regions32(4, 4, 2)


def test_rmac_head_uses_its_grid() -> None:
    x = torch.from_numpy(_maps(5, (2, 8, 5, 9)))
    assert RMAC(grid="float32").grid == "float32" and "grid=float32" in repr(RMAC(grid="float32"))
    a = RMAC(grid="float32").double()(x)
    want = []
    for img in x.numpy():
        v = ref_mac(img)
        total = v / (np.linalg.norm(v) + 1e-6)
        for top, left, side in ref_regions32(5, 9):
            r = ref_mac(img[:, top : top + side, left : left + side])
            total = total + r / (np.linalg.norm(r) + 1e-6)
        want.append(total)
    np.testing.assert_allclose(a.numpy(), np.array(want), rtol=1e-9)
    assert RMAC().grid == "float32"
    np.testing.assert_array_equal(RMAC().double()(x).numpy(), a.numpy())
    assert not np.allclose(RMAC(grid="float64").double()(x).numpy(), a.numpy())
    with pytest.raises(ValueError, match="unknown R-MAC grid"):
        RMAC(grid="exact")


def test_method_setting_reaches_the_rmac_head() -> None:
    from oxbench.errors import InputError
    from oxbench.pipelines.descriptors.cnn import CnnDescriptor
    from oxbench.pipelines.families.global_descriptors import GlobalConfig
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method

    kind = CnnDescriptor(backbone="resnet18", pooling="rmac", weights="random", rmac_grid="float32")
    m = GlobalConfig("r", descriptor=kind)
    assert kind.cache_key()["rmac_grid"] == "float32"
    assert "rmac_grid" not in CnnDescriptor().cache_key()  # other heads' keys unchanged
    default = CnnDescriptor(pooling="rmac")
    assert default.rmac_grid == "float32" and default.cache_key()["rmac_grid"] == "float32"
    impl = m.build()
    assert impl.describer._model(RunContext(cache=Path("."))).net.pool.grid == "float32"  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="setting rmac_grid: expected one of float64, float32"):
        CnnDescriptor(pooling="rmac", rmac_grid="half")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="setting descriptor.rmac_grid: expected one of float64"):
        resolve_method("rmac-r50-imagenet", **{"descriptor.rmac_grid": "half"})
