"""Deep global descriptors: extraction, descriptor store, model files, cirtorch import, CLI, runs."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.execution.shards import NPZ_NAME, committed_folders  # noqa: E402
from oxbench.features.deep.backbones import Trunk, build_trunk  # noqa: E402
from oxbench.features.deep.extract import ExtractOptions, Extractor, resize_max_side  # noqa: E402
from oxbench.features.deep.model import (  # noqa: E402
    RetrievalNet,
    build_net,
    load_model,
    save_model,
)
from oxbench.features.descstore import DescriptorStore, fill_store  # noqa: E402
from oxbench.pipelines import RecordOptions, Session  # noqa: E402
from test_pipeline import load_tiny, make_tiny_root  # noqa: E402


def _images(seed: int, shapes: list[tuple[int, int]]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]


@pytest.fixture(scope="module")
def r18() -> RetrievalNet:
    return build_net("resnet18", "gem", weights="random", seed=0).net


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


# --- extraction ---------------------------------------------------------------------------------------


def test_batched_extraction_equals_one_image_per_forward(r18: RetrievalNet) -> None:
    images = _images(0, [(64, 96)] * 5 + [(96, 64), (50, 70)])
    batched = Extractor(r18, ExtractOptions(max_side=96, batch_size=4, device="cpu"))
    loop = Extractor(r18, ExtractOptions(max_side=96, batch_size=1, device="cpu"))
    a, b = batched.describe(images), loop.describe(images)
    assert a.shape == (7, 512) and a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(a, b, atol=2e-5)
    # different images give different descriptors (not a constant output)
    assert float(a[0] @ a[1]) < 0.99999


def test_bf16_autocast_agrees_with_fp32(r18: RetrievalNet) -> None:
    images = _images(1, [(80, 112)] * 3)
    fp32 = Extractor(r18, ExtractOptions(max_side=112, batch_size=3, device="cpu")).describe(images)
    bf16 = Extractor(
        r18, ExtractOptions(max_side=112, batch_size=3, device="cpu", precision="bf16")
    ).describe(images)
    cos = (fp32 * bf16).sum(axis=1)
    assert (cos > 0.99).all(), cos
    assert not np.array_equal(fp32, bf16)  # autocast did run in bf16


def test_resize_never_enlarges_and_keeps_aspect() -> None:
    im = _images(2, [(300, 200)])[0]
    small = resize_max_side(im, 100)
    assert small.shape == (100, 67, 3)
    assert resize_max_side(im, 1024) is im


def test_out_of_memory_halves_the_batch(
    r18: RetrievalNet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    images = _images(3, [(64, 64)] * 4)
    ext = Extractor(r18, ExtractOptions(max_side=64, batch_size=4, device="cpu", scales=(1.0,)))
    want = Extractor(
        r18, ExtractOptions(max_side=64, batch_size=1, device="cpu", scales=(1.0,))
    ).describe(images)
    real = ext.net.forward

    def forward(x):  # noqa: ANN001, ANN202
        if x.shape[0] > 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(x)

    monkeypatch.setattr(ext.net, "forward", forward)
    with caplog.at_level(logging.WARNING):
        got = ext.describe(images)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert ext.batch_size == 1 and "out of GPU memory" in caplog.text

    monkeypatch.setattr(
        ext.net, "forward", lambda x: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("oom"))
    )
    with pytest.raises(InputError, match="out of GPU memory describing image b.jpg"):
        ext.describe(images[:1], ["b.jpg"])


def test_undecodable_image_stops_unless_allowed(
    r18: RetrievalNet, caplog: pytest.LogCaptureFixture
) -> None:
    images = _images(4, [(40, 40)] * 3)

    def read(i: int) -> np.ndarray:
        if i == 1:
            raise InputError("cannot decode image (truncated)", f"/data/img{i}.jpg")
        return images[i]

    ext = Extractor(r18, ExtractOptions(max_side=64, device="cpu", scales=(1.0,)))
    names = ["a", "b", "c"]
    with pytest.raises(InputError, match=r"image b: /data/img1.jpg: cannot decode"):
        ext.describe_sources(read, [0, 1, 2], names)
    with caplog.at_level(logging.WARNING):
        done, x = ext.describe_sources(read, [0, 1, 2], names, allow_undecodable=True)
    assert done == [0, 2] and x.shape == (2, 512) and "image b cannot be decoded" in caplog.text


def test_vit_patch_tokens_become_a_map() -> None:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(
        img_size=32,
        patch_size=8,
        embed_dim=16,
        depth=1,
        num_heads=2,
        num_classes=0,
        dynamic_img_size=True,
        dynamic_img_pad=True,
        reg_tokens=2,
    )
    net = RetrievalNet(
        Trunk("timm:tiny-vit", vit, 16, (0.5,) * 3, (0.5,) * 3, "timm-tokens"), "mac"
    ).eval()
    x = torch.randn(2, 3, 40, 24)
    fmap = net.feature_map(x)
    assert tuple(fmap.shape) == (2, 16, 5, 3)
    tokens = vit.forward_features(x)
    assert tokens.shape[1] == vit.num_prefix_tokens + 15  # class + 2 register tokens dropped
    # token (row 1, col 2) of the patch grid is channel vector fmap[:, :, 1, 2]
    torch.testing.assert_close(fmap[:, :, 1, 2], tokens[:, vit.num_prefix_tokens + 1 * 3 + 2, :])
    out = Extractor(net, ExtractOptions(max_side=64, device="cpu", scales=(1.0, 0.5))).describe(
        _images(5, [(37, 50)])
    )
    assert out.shape == (1, 16) and np.isfinite(out).all()


def test_unknown_backbone_and_unavailable_imagenet_weights(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(InputError, match="unknown backbone 'resnet7'"):
        build_net("resnet7", "gem", weights="random")
    with pytest.raises(InputError, match="unknown pooling"):
        build_net("resnet18", "vlad", weights="random")
    import torch.hub

    def offline(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)
    with pytest.raises(InputError) as exc:
        build_net("resnet18", "gem", weights="imagenet")
    msg = str(exc.value)
    assert (
        "\n" not in msg
        and "ImageNet weights of resnet18" in msg
        and "--set descriptor.weights=PATH" in msg
    )


# --- model files and the cirtorch import -------------------------------------------------------------


def _cirtorch_checkpoint(
    path: Path, *, architecture: str = "resnet18", p: float = 2.75, state_from: str = "resnet18"
) -> tuple[torch.nn.Module, dict]:
    """A tiny random checkpoint in cirtorch's layout: {'meta', 'state_dict', ...}, keys features.N.*
    (the torchvision model's children up to layer4), pool.p, Lw as numpy arrays."""
    import torchvision

    torch.manual_seed(7)
    full = torchvision.models.get_model(state_from, weights=None)
    features = torch.nn.Sequential(*list(full.children())[:-2])
    sd = {f"features.{k}": v for k, v in features.state_dict().items()}
    sd["pool.p"] = torch.tensor([p])
    rng = np.random.default_rng(7)
    lw = {
        "retrieval-SfM-120k": {
            "ss": {"m": rng.standard_normal((512, 1)), "P": rng.standard_normal((512, 512))},
            "ms": {"m": rng.standard_normal((512, 1)), "P": rng.standard_normal((512, 512))},
        }
    }
    meta = {
        "architecture": architecture,
        "local_whitening": False,
        "pooling": "gem",
        "regional": False,
        "whitening": False,
        "mean": [0.485, 0.456, 0.406],
        "std": [0.229, 0.224, 0.225],
        "outputdim": 512,
        "Lw": lw,
    }
    torch.save({"epoch": 3, "meta": meta, "state_dict": sd, "min_loss": 0.5}, path)
    return features.eval(), lw


def _cirtorch_forward(features: torch.nn.Module, image: np.ndarray, p: float) -> np.ndarray:
    """cirtorch's single-scale descriptor, written out: normalise, features, GeM, L2."""
    mean = np.array([0.485, 0.456, 0.406]).reshape(3, 1, 1)
    std = np.array([0.229, 0.224, 0.225]).reshape(3, 1, 1)
    x = torch.from_numpy(((image.transpose(2, 0, 1) / 255.0 - mean) / std)[None].astype(np.float32))
    with torch.no_grad():
        fmap = features(x)
    v = fmap.clamp(min=1e-6).pow(p).mean(dim=(-2, -1)).pow(1 / p)[0].numpy()
    return v / np.linalg.norm(v)


def test_cirtorch_checkpoint_round_trips_through_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "retrievalSfM120k-resnet18-gem.pth"
    features, lw = _cirtorch_checkpoint(ckpt)
    code, out, err = _cli(["import-checkpoint", str(ckpt), "--out", str(tmp_path / "m.pt")], capsys)
    assert code == 0, err
    assert "resnet18 gem, p=2.7500, 512-D; learned whitening: retrieval-SfM-120k" in out
    model = load_model(tmp_path / "m.pt")
    assert model.weights.startswith("file:sha256=") and model.source["format"] == "cirtorch"
    m, proj = model.whitening(multiscale=True)
    np.testing.assert_allclose(m, lw["retrieval-SfM-120k"]["ms"]["m"].ravel())
    np.testing.assert_allclose(proj, lw["retrieval-SfM-120k"]["ms"]["P"])
    images = _images(8, [(70, 90), (90, 70)])
    got = Extractor(model.net, ExtractOptions(max_side=128, scales=(1.0,), device="cpu")).describe(
        images
    )
    for i, im in enumerate(images):
        np.testing.assert_allclose(got[i], _cirtorch_forward(features, im, 2.75), atol=2e-5)
    # the model file's p drives the multi-scale power mean
    assert model.net.multiscale_power == pytest.approx(2.75)


def test_checkpoint_of_another_architecture_names_the_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = tmp_path / "wrong.pth"
    _cirtorch_checkpoint(ckpt, architecture="resnet34")  # resnet18 weights, resnet34 meta
    code, out, err = _cli(["import-checkpoint", str(ckpt), "--out", str(tmp_path / "m.pt")], capsys)
    assert code == 2 and out == ""
    line = err.strip()
    assert "\n" not in line and "wrong.pth" in line and "does not fit resnet34" in line
    assert "missing keys (features.4.2." in line and "0 unexpected keys" in line
    assert not (tmp_path / "m.pt").exists() and list(tmp_path.iterdir()) == [ckpt]
    # a file that is not a checkpoint, and a model file given where a checkpoint was expected
    (tmp_path / "junk.pth").write_bytes(b"not a zip")
    code, _, err = _cli(
        ["import-checkpoint", str(tmp_path / "junk.pth"), "--out", str(tmp_path / "m.pt")], capsys
    )
    assert code == 2 and "not a readable torch checkpoint" in err


def test_model_file_round_trip_and_refusals(tmp_path: Path, r18: RetrievalNet) -> None:
    save_model(tmp_path / "r18.pt", r18, source={"format": "test"})
    loaded = build_net("resnet18", "gem", weights=tmp_path / "r18.pt")
    for k, v in r18.state_dict().items():
        torch.testing.assert_close(loaded.net.state_dict()[k], v)
    assert loaded.source == {"format": "test"} and loaded.whitening(multiscale=False) is None
    with pytest.raises(
        InputError, match="model file is resnet18 with gem pooling; the method asks for resnet50"
    ):
        build_net("resnet50", "gem", weights=tmp_path / "r18.pt")
    ckpt = tmp_path / "c.pth"
    _cirtorch_checkpoint(ckpt)
    with pytest.raises(InputError, match="a cirtorch checkpoint.*oxbench import-checkpoint"):
        load_model(ckpt)
    with pytest.raises(InputError, match="file not found"):
        load_model(tmp_path / "absent.pt")


def test_building_a_net_does_no_io(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.hub

    monkeypatch.setattr(
        torch.hub, "load_state_dict_from_url", lambda *a, **k: pytest.fail("download attempted")
    )
    trunk = build_trunk("vgg11")
    assert trunk.dim == 512 and trunk.kind == "map"
    assert not isinstance(list(trunk.module.children())[-1], torch.nn.MaxPool2d)  # ends with a ReLU


# --- the descriptor store ------------------------------------------------------------------------------


def test_descriptor_store_resumes_and_checks_digests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    names = [f"img{i}" for i in range(7)]
    vectors = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)
    calls: list[list[int]] = []

    def compute(pos: list[int]) -> tuple[list[int], np.ndarray]:
        calls.append(pos)
        return pos, vectors[pos]

    store = DescriptorStore.open(tmp_path / "s", {"k": 1})
    fill_store(store, names[:5], compute, shard_size=2, progress=False)
    assert calls == [[0, 1], [2, 3], [4]]
    store = DescriptorStore.open(tmp_path / "s", {"k": 1})  # a new process resumes
    calls.clear()
    assert fill_store(store, names, compute, shard_size=2, progress=False) == []
    assert calls == [[5], [6]]  # the plan of 7 in shards of 2: shard 2 lacks img5, shard 3 is img6
    np.testing.assert_array_equal(store.get(names), vectors)
    # a corrupted shard is detected, deleted, and its images described again
    (folder,) = committed_folders(tmp_path / "s")[1]
    with np.load(folder / NPZ_NAME) as z:
        data = dict(z)
    data["descriptors"] = data["descriptors"] + 1.0
    np.savez(folder / NPZ_NAME, **data)
    with caplog.at_level(logging.WARNING):
        store = DescriptorStore.open(tmp_path / "s", {"k": 1})
    assert "does not match its recorded digest" in caplog.text and not folder.exists()
    assert store.missing(names) == ["img2", "img3"]
    with pytest.raises(InputError, match="no descriptor for image 'img2'"):
        store.get(names)
    assert not store.get(names, missing_as_zero=True)[2].any()
    with pytest.raises(InputError, match="other settings"):
        DescriptorStore.open(tmp_path / "s", {"k": 2})
    with pytest.raises(ValueError, match="8-D descriptors for a store of 4-D"):
        store.write_shard(["x"], np.zeros((1, 8), np.float32))
    with pytest.raises(ValueError, match="not finite"):
        store.write_shard(["x"], np.full((1, 4), np.nan, np.float32))


# --- through the method interface, the CLI and the runner ---------------------------------------------

TINY_CNN = {
    "descriptor.weights": "random",
    "descriptor.backbone": "resnet18",
    "descriptor.max_side": 96,
    "descriptor.scales": [1.0, 0.5],
    "descriptor.batch_size": 8,
}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def test_gem_preset_runs_end_to_end_with_random_weights(tiny_root: Path, tmp_path: Path) -> None:
    import oxbench

    out = oxbench.run(
        "synthetic",
        "gem-r50-imagenet+w+alpha-qe",
        overrides={**TINY_CNN, "whitening_dim": 16},
        session=Session(root=tiny_root, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert (
        out.info["model"]["architecture"] == "resnet18"
        and out.info["model"]["weights"] == "random:seed=0"
    )
    assert out.info["dim"] == 16 and out.config.train_dataset == "synthetic-train"
    assert 0.0 <= out.result.setups["medium"].map <= 1.0
    assert out.timings["features"] > 0
    # a rerun reads every descriptor from the store
    again = oxbench.run(
        "synthetic",
        "gem-r50-imagenet+w+alpha-qe",
        overrides={**TINY_CNN, "whitening_dim": 16},
        session=Session(root=tiny_root, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    record = json.loads((again.run_dir / "record.json").read_text())
    assert (
        record["cache"]["descriptors.database"] == "hit"
        and record["cache"]["descriptors.queries"] == "hit"
    )
    assert again.result.setups["medium"].map == out.result.setups["medium"].map


def test_gem_without_whitening_needs_no_training_set_and_weights_are_required(
    tiny_root: Path, tmp_path: Path
) -> None:
    import oxbench
    from oxbench.pipelines.presets import resolve_method

    assert not resolve_method("gem-r50-imagenet").needs_training
    assert resolve_method("gem-r50-imagenet+w").needs_training
    with pytest.raises(
        InputError, match=r"gem-r101 needs a model file: pass --set descriptor.weights=MODEL.pt"
    ):
        oxbench.run(
            "synthetic",
            "gem-r101",
            session=Session(root=tiny_root, cache=tmp_path / "c", progress=False),
            record=RecordOptions(runs_dir=tmp_path / "runs"),
        )
    with pytest.raises(InputError, match=r"setting descriptor.scales: item 2: must be in \(0, 4\]"):
        resolve_method("gem-r50-imagenet", **{"descriptor.scales": [1, -1]})
    with pytest.raises(InputError, match="model_whitening needs a model file"):
        resolve_method("gem-r50-imagenet", **{"descriptor.model_whitening": True})


def test_extract_writes_what_evaluate_reads(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "desc"
    sets = [
        a
        for k, v in TINY_CNN.items()
        for a in ("--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}")
    ]
    code, stdout, err = _cli(
        [
            "extract",
            "--dataset",
            "synthetic",
            "--method",
            "gem-r50-imagenet",
            "--root",
            str(tiny_root),
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(out),
            "--no-progress",
            *sets,
        ],
        capsys,
    )
    assert code == 0, err
    db, q = np.load(out / "db.npy"), np.load(out / "queries.npy")
    info = json.loads((out / "extract.json").read_text())
    assert (
        db.dtype == np.float32
        and db.shape == (info["n_db"], 512)
        and q.shape == (info["n_queries"], 512)
    )
    assert len((out / "db_names.txt").read_text().splitlines()) == db.shape[0]
    np.testing.assert_allclose(np.linalg.norm(db, axis=1), 1.0, rtol=1e-5)
    code, stdout, err = _cli(
        [
            "evaluate",
            "revisited",
            "--dataset",
            "synthetic",
            "--root",
            str(tiny_root),
            "--db-features",
            str(out / "db.npy"),
            "--query-features",
            str(out / "queries.npy"),
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert 0.0 <= json.loads(stdout)["setups"]["medium"]["map"] <= 1.0


def test_extract_names_an_undecodable_image_and_allow_partial_skips_it(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    shutil.copytree(tiny_root, root)
    images = sorted((root / "synthetic").rglob("*.jpg"))
    from oxbench.datasets import load

    bench = load("synthetic", root, progress=False)
    victim = Path(bench.database.path(3))
    assert victim in images
    victim.write_bytes(b"\xff\xd8 truncated")
    out = tmp_path / "desc"
    sets = [
        a
        for k, v in TINY_CNN.items()
        for a in ("--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}")
    ]
    base = [
        "extract",
        "--dataset",
        "synthetic",
        "--method",
        "gem-r50-imagenet",
        "--root",
        str(root),
        "--cache",
        str(tmp_path / "cache"),
        "--out",
        str(out),
        "--no-progress",
        *sets,
    ]
    code, stdout, err = _cli(base, capsys)
    assert code == 2 and stdout == "" and "\n" not in err.strip()
    assert victim.name in err and "cannot decode" in err and not out.exists()
    code, stdout, err = _cli([*base, "--allow-partial"], capsys)
    assert code == 0, err
    info = json.loads((out / "extract.json").read_text())
    assert info["provenance"]["undecodable_images"] == {
        "synthetic/database": [bench.database.name(3)]
    }
    assert not np.load(out / "db.npy")[3].any()


def test_gpu_check_script_runs_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import gpu_check

    result = gpu_check.main(["--tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_check.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert set(saved["images_per_second"]) == {"loop", "batched-fp32", "batched-bf16"}
    assert all(v > 0 for v in saved["images_per_second"].values())
    assert saved["agree"] == {"loop": True, "batched-fp32": True, "batched-bf16": True}


def test_model_whitening_applies_the_files_lw(
    tiny_root: Path, tmp_path: Path, r18: RetrievalNet
) -> None:
    from oxbench.pipelines.extract import extract_descriptors

    rng = np.random.default_rng(3)
    m, proj = rng.standard_normal(512) * 0.01, rng.standard_normal((64, 512))
    save_model(tmp_path / "r18.pt", r18, lw={"sfm": {"ss": (m, proj), "ms": (m + 1.0, proj)}})
    session = Session(root=tiny_root, cache=tmp_path / "cache", progress=False)
    common = {
        "session": session,
        "overrides": {
            "descriptor.backbone": "resnet18",
            "descriptor.weights": str(tmp_path / "r18.pt"),
            "descriptor.max_side": 96,
            "descriptor.scales": [1.0, 0.5],
        },
    }
    plain = extract_descriptors("synthetic", "gem-r101", tmp_path / "plain", **common)
    white = extract_descriptors("synthetic", "gem-r101+w", tmp_path / "white", **common)
    assert (
        white.info["steps"]["descriptors.database"] == "hit"
    )  # the store holds the unwhitened ones
    x = np.load(tmp_path / "plain" / "db.npy").astype(np.float64)
    want = (x - (m + 1.0)) @ proj.T  # multi-scale: the "ms" whitening
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    assert plain.dim == 512 and white.dim == 64
    np.testing.assert_allclose(np.load(tmp_path / "white" / "db.npy"), want, atol=1e-5)


def test_cli_help_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\nfrom oxbench.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "try:\n    main(['extract', '--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    env = {
        **__import__("os").environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"),
    }
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert res.returncode == 0, res.stderr
    assert "extract" in res.stdout and "import-checkpoint" in res.stdout


def test_run_cli_max_side_sets_the_cnn_setting(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _cli(
        [
            "run",
            "--dataset",
            "synthetic",
            "--method",
            "gem-r50-imagenet",
            "--root",
            str(tiny_root),
            "--cache",
            str(tmp_path / "c"),
            "--out",
            str(tmp_path / "r"),
            "--max-side",
            "64",
            "--set",
            "descriptor.weights=random",
            "--set",
            "descriptor.backbone=resnet18",
            "--set",
            "descriptor.scales=[1]",
            "--no-progress",
            "--workers",
            "1",
        ],
        capsys,
    )
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["method"]["descriptor"]["max_side"] == 64
    assert "mAP" in out


def test_trained_preset_without_its_model_file_says_how_to_get_it(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import oxbench
    from oxbench.features.deep import models_dir

    monkeypatch.delenv("OXBENCH_MODELS", raising=False)
    assert models_dir(tiny_root) == tiny_root / "_models"
    # without fit_network (the preset's fit trains the file, tests/test_architecture.py), the
    # missing file is one line saying how to get it
    with pytest.raises(InputError) as exc:
        oxbench.run(
            "synthetic",
            "gem-r18-synthetic",
            overrides={"descriptor.fit_network": False},
            session=Session(root=tiny_root, cache=tmp_path / "c", progress=False),
            record=RecordOptions(runs_dir=tmp_path / "runs"),
        )
    assert str(exc.value) == (
        f"{tiny_root / '_models' / 'gem-r18-synthetic.pt'}: no model file here: "
        "train it with oxbench train, or pass --set descriptor.weights=PATH"
    )
    monkeypatch.setenv("OXBENCH_MODELS", str(tmp_path / "m"))
    assert models_dir(tiny_root) == tmp_path / "m"


def test_a_trained_network_is_one_model_file_per_seed(tmp_path: Path) -> None:
    """``--seeds 0,1,2`` of a preset whose fit trains its network trains three networks: seed 0
    keeps the preset's own file name (its ranks unchanged), seed ``s`` writes ``<stem>.seed<s>``."""
    import dataclasses

    from oxbench.pipelines.presets import resolve_method

    kind = resolve_method("gem-r18-synthetic").descriptor
    files = [dataclasses.replace(kind, seed=s).weights_file(tmp_path) for s in (0, 1, 2)]
    assert [f.name for f in files] == [
        "gem-r18-synthetic.pt",
        "gem-r18-synthetic.seed1.pt",
        "gem-r18-synthetic.seed2.pt",
    ]
    assert {f.parent for f in files} == {tmp_path / "_models"}
    # a model file given by the user is that file whatever the seed (the seed only draws random
    # weights there): the seed suffix is only for a file fit trains
    given = dataclasses.replace(kind, fit_network=False, seed=2, weights="models:mine.pt")
    assert given.weights_file(tmp_path).name == "mine.pt"


def test_model_files_are_found_in_the_runs_data_root_not_beside_the_dataset(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A benchmark folder outside the data root (a user's own copy) must not move the model
    folder: ``models:<file>`` is looked up in the context's data root, else ``$OXBENCH_DATA``."""
    from oxbench.datasets import load
    from oxbench.pipelines import RunContext
    from oxbench.pipelines.presets import resolve_method

    monkeypatch.delenv("OXBENCH_MODELS", raising=False)
    bench = load("synthetic", tiny_root, progress=False)
    impl = resolve_method("gem-r18-synthetic").build()
    elsewhere = tmp_path / "data root"
    with pytest.raises(InputError) as exc:
        impl.describe(bench, "database", RunContext(tmp_path / "c", progress=False, root=elsewhere))
    assert str(exc.value).startswith(
        f"{elsewhere / '_models' / 'gem-r18-synthetic.pt'}: no model file here"
    )
    monkeypatch.setenv("OXBENCH_DATA", str(tmp_path / "env root"))
    with pytest.raises(InputError) as exc:
        resolve_method("gem-r18-synthetic").build().describe(
            bench, "database", RunContext(tmp_path / "c", progress=False)
        )
    assert str(exc.value).startswith(
        f"{tmp_path / 'env root' / '_models' / 'gem-r18-synthetic.pt'}: no model"
    )


# ---------------------------------------------------------------------------------------------
# Query crops sized as cirtorch evaluates them (issue 20)


class _OneImage:
    def __init__(self, image: np.ndarray) -> None:
        self.image = image

    def __len__(self) -> int:
        return 1

    def name(self, i: int) -> str:
        return "q"

    def path(self, i: int) -> Path | None:
        return None

    def read(self, i: int) -> np.ndarray:
        return self.image


def _query_bench(full_hw: tuple[int, int], bbox: tuple[float, float, float, float]):  # noqa: ANN202
    from oxbench.datasets.base import Benchmark
    from oxbench.groundtruth import GroundTruth
    from test_features import make_query

    image = np.random.default_rng(0).integers(0, 256, (*full_hw, 3), dtype=np.uint8)
    src = _OneImage(image)
    gt = GroundTruth("tiny", "revisited", ("q",), (make_query("q", bbox, easy=[0]),))
    return Benchmark("tiny", gt, src, src, ("revisited",))


@pytest.mark.parametrize(("full_hw", "bbox", "max_side"), [
    ((1500, 2000), (100.0, 200.0, 800.0, 500.0), 1024),   # crop 700 x 300 of a 2000 x 1500 photo
    ((1800, 2400), (0.0, 100.0, 1600.0, 700.0), 1024),    # crop wider than max side
    ((3000, 2000), (50.0, 0.0, 550.0, 2999.0), 512),      # portrait, crop taller than max side
])  # fmt: skip
def test_query_crop_keeps_the_scale_of_its_full_image(
    full_hw: tuple[int, int], bbox: tuple[float, float, float, float], max_side: int
) -> None:
    import math

    from oxbench.pipelines.descriptors.cnn import CnnDescriptor, QueryCrops

    bench = _query_bench(full_hw, bbox)
    crop = bench.query_crop(0)
    ch, cw = crop.shape[:2]
    m = CnnDescriptor(max_side=max_side)
    assert m.query_resize == "full-image"
    got = QueryCrops(bench, m.query_resize, m.max_side)(0)
    side = math.floor(max_side * max(ch, cw) / max(full_hw))  # imsize * max(crop) / max(full)
    assert max(got.shape[:2]) == side
    short = min(ch, cw) * side / max(ch, cw)  # the aspect kept (Pillow rounds to the closer aspect)
    assert abs(min(got.shape[:2]) - short) <= 1 and (got.shape[0] >= got.shape[1]) == (ch >= cw)
    # the other convention: the crop as cut, which the extractor then shrinks to max side itself
    as_cut = QueryCrops(bench, "crop", max_side)(0)
    assert as_cut.shape == crop.shape
    assert max(resize_max_side(as_cut, max_side).shape[:2]) == min(max_side, max(ch, cw))


def test_query_crop_of_an_image_within_max_side_is_the_same_either_way() -> None:
    from oxbench.pipelines.descriptors.cnn import CnnDescriptor, QueryCrops

    bench = _query_bench((480, 640), (10.0, 20.0, 300.0, 400.0))
    full = QueryCrops(bench, CnnDescriptor(max_side=1024).query_resize, 1024)(0)
    crop = QueryCrops(bench, "crop", 1024)(0)
    np.testing.assert_array_equal(full, crop)
    np.testing.assert_array_equal(resize_max_side(crop, 1024), full)
    with pytest.raises(InputError, match="setting query_resize: expected one of full-image, crop"):
        CnnDescriptor(query_resize="box")  # type: ignore[arg-type]


def test_cnn_descriptors_described_in_worker_processes_equal_this_processs(
    tiny_root: Path, tmp_path: Path
) -> None:
    """The shard tasks rebuild the network where they run (once per worker) and commit their
    shards; the driver reads the store. A CUDA device makes the task ask for a GPU resource."""
    from oxbench.execution import ProcessExecutor
    from oxbench.features.descstore import DescribeGlobalShard
    from oxbench.pipelines.descriptors.cnn import CnnShard
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method

    bench = load_tiny(tiny_root)
    m = resolve_method("gem-r50-imagenet", **TINY_CNN)
    here = m.build().describe(bench, "database", RunContext(tmp_path / "serial", progress=False))
    with ProcessExecutor(2) as ex:
        ctx = RunContext(tmp_path / "pool", executor=ex, progress=False)
        impl = m.build()
        compute = impl.describer.compute(  # type: ignore[attr-defined]
            bench, "database", [bench.database.name(i) for i in range(3)], ctx
        )
        assert (
            isinstance(compute, CnnShard) and compute._model is None
        )  # built again in each worker
        pooled = impl.describe(bench, "database", ctx)
    np.testing.assert_allclose(pooled, here, rtol=1e-4, atol=1e-5)
    assert compute.resources is None
    gpu = CnnShard(
        compute.spec,
        dataclasses.replace(compute.options, device="cuda"),
        compute.read,
        compute.names,
        allow_partial=False,
    )
    assert DescribeGlobalShard(gpu, gpu.names, tmp_path, plan="", tag="t").resources == {"GPU": 1}
