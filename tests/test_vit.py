"""Foundation-model descriptors (``descriptor=vit``): token pooling against hand computations on
``forward_features``, the input rounding, weights files (read without running code, digest
recorded), the presets, and runs end to end with a random-init DINOv2-shaped ViT-S/14."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("timm")

from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.pipelines import RecordOptions, Session  # noqa: E402
from oxbench.pipelines.descriptors.vit import (  # noqa: E402
    TokenNet,
    VitSpec,
    patch_multiple,
)
from oxbench.pipelines.presets import resolve_method  # noqa: E402
from test_pipeline import make_tiny_root  # noqa: E402

#: A random-init ViT-S/14 at 56 px: fast on a CPU.
TINY_VIT = {
    "descriptor": "vit",
    "descriptor.weights": "random",
    "descriptor.max_side": 56,
    "descriptor.device": "cpu",
}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reg4() -> VitSpec:
    return VitSpec("vit_small_patch14_reg4_dinov2", "random", "gem", 3.0, 0)


def _run(root: Path, tmp: Path, **overrides: object):  # noqa: ANN202 - RunOutcome
    import oxbench

    return oxbench.run(
        "synthetic",
        "rootsift-vlad",
        overrides={**TINY_VIT, **overrides},
        session=Session(root=root, cache=tmp / "cache", progress=False),
        record=RecordOptions(runs_dir=tmp / "runs"),
    )


def _gem(x: np.ndarray, p: float) -> np.ndarray:
    """GeM over rows, written out: (mean max(x, eps)^p)^(1/p)."""
    return np.mean(np.maximum(x, 1e-6) ** p, axis=0) ** (1.0 / p)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# --- pooling, by hand ----------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "gem", "cls+gem"])
def test_pooling_is_the_hand_computation_and_register_tokens_are_never_pooled(
    reg4: VitSpec, pooling: str
) -> None:
    loaded = VitSpec(reg4.model, "random", pooling, 3.0, 0).build()
    model = loaded.net.model
    assert model.num_prefix_tokens == 5  # the class token and 4 registers
    with torch.no_grad():  # registers far from the patch tokens, so pooling them would show
        model.reg_token.copy_(
            30 * torch.randn(model.reg_token.shape, generator=torch.Generator().manual_seed(3))
        )
    x = torch.randn(2, 3, 42, 70, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = loaded.net(x).numpy()
        tokens = model.forward_features(x).double().numpy()
    assert tokens.shape == (2, 5 + 3 * 5, 384)
    for b in range(2):
        cls = _unit(tokens[b, 0])
        gem = _unit(_gem(tokens[b, 5:], 3.0))  # the 15 patch tokens, registers 1..4 left out
        want = {"cls": cls, "gem": gem, "cls+gem": _unit(np.concatenate([cls, gem]))}[pooling]
        np.testing.assert_allclose(got[b], want, rtol=1e-4, atol=1e-5)
        if pooling == "gem":  # pooling the registers too would give another vector
            wrong = _unit(_gem(tokens[b, 1:], 3.0))
            assert np.abs(got[b] - wrong).max() > 1e-3
    assert loaded.net.dim == (768 if pooling == "cls+gem" else 384)
    assert loaded.net.multiscale_power == (3.0 if pooling == "gem" else 1.0)


def test_the_input_side_is_rounded_to_the_patch_size_and_positions_interpolated(
    reg4: VitSpec,
) -> None:
    assert [patch_multiple(s, 14) for s in (1, 7, 20, 21, 27, 28, 100, 518)] == [
        14, 14, 14, 28, 28, 28, 98, 518
    ]  # fmt: skip
    net = reg4.build().net
    assert net.input_side(61, 100) == (56, 98)
    x = torch.randn(1, 3, 61, 100, generator=torch.Generator().manual_seed(2))
    resized = torch.nn.functional.interpolate(
        x, size=(56, 98), mode="bilinear", align_corners=False, antialias=True
    )
    with torch.inference_mode():
        a, b = net(x), net(resized)
    torch.testing.assert_close(a, b)  # what the transformer reads is the rounded image


def test_a_model_without_a_class_token_refuses_cls_pooling_in_one_line() -> None:
    from timm.models.vision_transformer import VisionTransformer

    vit = VisionTransformer(
        img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=0,
        class_token=False, global_pool="avg", dynamic_img_size=True,
    )  # fmt: skip
    with pytest.raises(InputError, match="no class token.*use token_pooling=head or gem"):
        TokenNet(vit, "cls", 3.0, (0.5,) * 3, (0.5,) * 3)
    head = TokenNet(vit.eval(), "head", 3.0, (0.5,) * 3, (0.5,) * 3)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        pooled = vit.fc_norm(vit.forward_features(x).mean(1))  # the model's own: average, norm
        torch.testing.assert_close(head(x), torch.nn.functional.normalize(pooled, dim=-1))


# --- runs end to end -----------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "gem", "cls+gem"])
def test_a_random_vit_runs_end_to_end_with_each_pooling(
    tiny_root: Path, tmp_path: Path, pooling: str
) -> None:
    out = _run(tiny_root, tmp_path, **{"descriptor.token_pooling": pooling})
    assert 0.0 <= out.result.setups["medium"].map <= 1.0
    card = json.loads((out.run_dir / "record.json").read_text())["preprocessing"]
    assert card["token_pooling"] == pooling and card["patch"] == [14, 14]
    assert card["weights"] == "random:seed=0" and card["weights_sha256"] is None
    assert card["mean"] == [0.485, 0.456, 0.406] and card["query_crop"] == "revisited"


# --- weights files -------------------------------------------------------------------------------


def _random_state(model: str = "vit_small_patch14_dinov2", seed: int = 7) -> dict:
    return {
        k: v.contiguous()
        for k, v in VitSpec(model, "random", "cls", 3.0, seed)
        .build()
        .net.model.state_dict()
        .items()
    }


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_a_weights_file_is_loaded_and_its_digest_recorded(
    tiny_root: Path, tmp_path: Path, suffix: str
) -> None:
    state = _random_state()
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"state_dict": state}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    loaded = VitSpec("vit_small_patch14_dinov2", str(path), "cls", 3.0, 0).build()
    for k, v in loaded.net.model.state_dict().items():
        assert torch.equal(v, state[k]), k
    assert loaded.sha256 == digest and loaded.weights == f"file:sha256={digest}"
    if suffix == ".pth":
        return  # one run end to end is enough to show where the digest is recorded
    out = _run(tiny_root, tmp_path, **{"descriptor.weights": str(path)})
    record = json.loads((out.run_dir / "record.json").read_text())
    assert record["preprocessing"]["weights_sha256"] == digest
    assert record["inputs"]["settings"]["weights"]["sha256"] == digest  # the config's inputs


def test_a_pth_that_would_run_code_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):  # noqa: ANN204
            return (Path.touch, (marker,))

    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": Payload()}}, path)
    with pytest.raises(InputError) as exc:
        VitSpec("vit_small_patch14_dinov2", str(path), "cls", 3.0, 0).build()
    msg = str(exc.value)
    assert "\n" not in msg and "could run code" in msg and str(path) in msg
    assert not marker.exists()


def test_weights_of_another_model_name_the_keys_in_one_line(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    path = tmp_path / "reg.safetensors"
    save_file(_random_state("vit_small_patch14_reg4_dinov2"), str(path))
    with pytest.raises(InputError) as exc:
        VitSpec("vit_small_patch14_dinov2", str(path), "cls", 3.0, 0).build()
    msg = str(exc.value)
    assert "\n" not in msg and "1 unexpected keys (reg_token)" in msg
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(InputError, match="not a readable safetensors file"):
        VitSpec(
            "vit_small_patch14_dinov2", str(tmp_path / "junk.safetensors"), "cls", 3.0, 0
        ).build()


def test_a_weights_setting_that_is_no_file_kind_is_refused() -> None:
    with pytest.raises(InputError, match="descriptor.weights='model.onnx': expected pretrained"):
        resolve_method("dinov2-vits14", **{"descriptor.weights": "model.onnx"})


# --- presets -------------------------------------------------------------------------------------


def test_a_preset_whose_weights_are_absent_says_where_to_put_them(
    tiny_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    argv = ["run", "--dataset", "synthetic", "--method", "dinov2-vits14", "--root",
            str(tiny_root), "--out", str(tmp_path / "runs"), "--cache", str(tmp_path / "c")]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "\n" not in err and "Traceback" not in err
    assert "vit_small_patch14_dinov2" in err and str(tmp_path / "hf") in err
    assert "models--timm--vit_small_patch14_dinov2.lvd142m" in err
    assert not list((tmp_path / "runs").rglob("record.json"))


def test_the_presets_name_their_timm_models_and_figures() -> None:
    from oxbench.pipelines.presets import preset_about

    want = {
        "dinov2-vitl14": ("vit_large_patch14_dinov2", "54.0"),
        "dinov2-vitg14-reg": ("vit_giant_patch14_reg4_dinov2", ""),
        "dinov3-vitb16": ("vit_base_patch16_dinov3", "58.5"),
        "clip-vitb16-openai": ("vit_base_patch16_clip_224.openai", ""),
        "siglip-vitb16": ("vit_base_patch16_siglip_224", ""),
    }
    import timm

    for name, (model, figure) in want.items():
        m = resolve_method(name)
        assert m.descriptor.model == model  # type: ignore[attr-defined]
        assert timm.is_model(model)
        assert figure in preset_about(name)
    assert resolve_method("siglip-vitb16").descriptor.token_pooling == "head"  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", ["NaN", "inf", "abc", "1e30", ""])
def test_hostile_vit_settings_are_one_line_exit_2(
    bad: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for key in ("descriptor.gem_p", "descriptor.max_side", "descriptor.scales", "descriptor.token_pooling",
                "descriptor.query_crop"):  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            main(["run", "--method", "dinov2-vits14", "--root", str(tmp_path), "--set",
                  f"{key}={bad}", "--no-progress"])  # fmt: skip
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and "\n" not in err and key in err, (key, err)
        assert "Traceback" not in err and not (tmp_path / "runs").exists()
    assert math.isfinite(resolve_method("dinov2-vits14").descriptor.gem_p)  # type: ignore[attr-defined]


# --- the preprocessing card in runs and report ---------------------------------------------------


def test_runs_and_report_tell_apart_runs_that_differ_only_in_their_preprocessing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.records import preprocessing_tag
    from run_layout import random_ranks, tiny_gt, write_run

    gt = tiny_gt(0, n_queries=8)
    card = {"token_pooling": "cls", "max_side": 518, "query_crop": "revisited", "scales": [1.0],
            "mean": [0.485, 0.456, 0.406], "weights_sha256": "a" * 64}  # fmt: skip
    other = {**card, "query_crop": "full"}
    for i, c in enumerate((card, other)):
        write_run(
            tmp_path, gt, random_ranks(gt, i), method="dinov2-vitb14",
            run_id=f"20240101T000000Z-000{i}", config_name=f"c{i}",
            record_overrides={"label": "dinov2-vitb14", "preprocessing": c},
        )  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        main(["runs", str(tmp_path)])
    out = capsys.readouterr().out
    assert exc.value.code in (0, None) and "preprocessing" in out.splitlines()[0]
    tags = [preprocessing_tag(card), preprocessing_tag(other)]
    assert tags[0] != tags[1] and all(t in out for t in tags)
    assert "cls 518px revisited x1 w:aaaaaaaa #" in tags[0]
    with pytest.raises(SystemExit) as exc:
        main(["report", str(tmp_path / "c0"), str(tmp_path / "c1"), "--format", "csv"])
    out = capsys.readouterr().out
    assert exc.value.code in (0, None), out
    rows = [line.split(",")[0] for line in out.splitlines()[1:] if line]
    assert rows[:2] == [f"dinov2-vitb14 [{t}]" for t in tags], out
    with pytest.raises(SystemExit) as exc:
        main(["runs", str(tmp_path), "--json"])
    listed = json.loads(capsys.readouterr().out)
    assert [r["preprocessing"]["query_crop"] for r in listed] == ["revisited", "full"]


def test_each_query_crop_rule_reads_what_it_says(tiny_root: Path) -> None:
    from oxbench.features.deep.extract import resize_query_crop
    from oxbench.pipelines.descriptors.vit import QueryImages
    from test_pipeline import load_tiny

    bench = load_tiny(tiny_root)
    i = next(q for q, query in enumerate(bench.gt.queries) if query.bbox is not None)
    full = bench.queries.read(i)
    crop, full_hw = bench.query_crop_and_size(i)
    assert crop.shape[:2] != full.shape[:2]  # the box cuts something off
    np.testing.assert_array_equal(QueryImages(bench, "full", 64, (70, 56))(i), full)
    np.testing.assert_array_equal(
        QueryImages(bench, "revisited", 64, (70, 56))(i), resize_query_crop(crop, full_hw, 64)
    )
    resized = QueryImages(bench, "crop-resize", 64, (70, 56))(i)
    assert resized.shape == (70, 56, 3) and resized.dtype == np.uint8
