"""The fc6 head (Babenko et al.'s neural codes) and the seed's VGG / AlexNet presets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tv = pytest.importorskip("torchvision")

from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.features.deep.model import build_net  # noqa: E402
from oxbench.pipelines import RecordOptions, Session  # noqa: E402
from oxbench.pipelines.presets import resolve_method  # noqa: E402
from test_pipeline import make_tiny_root  # noqa: E402


@pytest.mark.parametrize("architecture", ["alexnet", "vgg11"])
def test_fc6_is_the_classifiers_first_layer_after_its_relu(architecture: str) -> None:
    """Differential: with torchvision's own classifier weights copied in, the head gives
    ``relu(classifier's first Linear(flatten(avgpool(features(x)))))`` of the full network."""
    torch.manual_seed(1)
    full = tv.models.get_model(architecture, weights=None).eval()
    model = build_net(architecture, "fc6", weights="random", seed=0)
    net = model.net
    net.features.load_state_dict(
        {k: v for k, v in full.features.state_dict().items()}, strict=False
    )
    linear = next(m for m in full.classifier if isinstance(m, torch.nn.Linear))
    net.pool.fc.load_state_dict(linear.state_dict())
    x = torch.rand(2, 3, 224, 224) if architecture == "alexnet" else torch.rand(2, 3, 96, 80)
    with torch.no_grad():
        want = torch.relu(linear(torch.flatten(full.avgpool(full.features(x)), 1)))
        got = net.pool(net.feature_map(x))
        unit = net(x)
    assert got.shape == (2, 4096) and net.dim == 4096
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        unit, torch.nn.functional.normalize(want, dim=-1), rtol=1e-5, atol=1e-6
    )
    assert float(got.min()) >= 0.0  # after the ReLU


def test_fc6_of_a_map_smaller_than_the_pooling_window_is_the_padded_maximum() -> None:
    net = build_net("alexnet", "fc6", weights="random", seed=0).net
    fmap = torch.rand(1, 256, 2, 1)
    with torch.no_grad():
        got = net.pool(fmap)
        grid = fmap.amax(dim=(-2, -1), keepdim=True).expand(1, 256, 6, 6)  # one window: the max
        want = torch.relu(net.pool.fc(torch.flatten(grid, 1)))
    torch.testing.assert_close(got, want)


def test_fc6_is_refused_in_one_line_for_a_backbone_without_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(InputError, match=r"pooling=fc6 needs a backbone with .*resnet50 has none"):
        resolve_method("neural-codes-vgg16", **{"descriptor.backbone": "resnet50"})
    with pytest.raises(InputError, match="resnet18 has none"):
        build_net("resnet18", "fc6", weights="random")
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--method",
                "gem-r50-imagenet",
                "--set",
                "descriptor.pooling=fc6",
                "--no-progress",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "resnet50 has none" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_seed_presets_describe_what_the_papers_did() -> None:
    for name, backbone in (("neural-codes-alexnet", "alexnet"), ("neural-codes-vgg16", "vgg16")):
        m = resolve_method(name)
        d = m.descriptor
        assert (d.backbone, d.pooling, d.weights) == (backbone, "fc6", "imagenet")
        assert (d.max_side, d.scales, m.whitening) == (224, (1.0,), "none")
        pca = resolve_method(name + "+pca")
        assert (pca.whitening, pca.whitening_dim, pca.whitening_power) == ("pca", 256, 0.0)
    rmac = resolve_method("rmac-vgg16-imagenet+w")
    d = rmac.descriptor
    assert (d.backbone, d.pooling, rmac.whitening, d.scales) == (
        "vgg16",
        "rmac",
        "pca",
        (1.0,),
    )


@pytest.mark.parametrize("preset", ["neural-codes-alexnet+pca", "rmac-vgg16-imagenet+w"])
def test_seed_presets_run_with_random_weights_at_a_tiny_size(tmp_path: Path, preset: str) -> None:
    import oxbench

    root = make_tiny_root(tmp_path / "data")
    more = {} if preset.startswith("neural") else {"descriptor.backbone": "vgg11"}
    out = oxbench.run(
        "synthetic",
        preset,
        overrides={
            "descriptor.weights": "random",
            "descriptor.max_side": 64,
            "whitening_dim": 8,
            **more,
        },
        session=Session(root=root, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert out.config.train_dataset == "synthetic-train"
    assert out.info["dim"] == 8
    assert 0.0 <= out.result.setups["medium"].map <= 1.0
    assert np.isfinite(out.result.setups["medium"].map)
