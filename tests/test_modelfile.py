"""The model-file schema: a model file is checked after the restricted load, before a network is
built from it -- hostile content is one line naming the file, and causes no I/O beyond reading it."""

from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.features.deep import modelfile  # noqa: E402
from oxbench.features.deep.backbones import build_trunk, check_architecture, known_architecture  # noqa: E402
from oxbench.features.deep.model import build_net, load_model, save_model  # noqa: E402


@pytest.fixture(scope="module")
def payload(tmp_path_factory) -> dict:
    """The plain data of a valid ResNet-18 + GeM model file."""
    path = tmp_path_factory.mktemp("m") / "r18.pt"
    save_model(
        path, build_net("resnet18", "gem", weights="random", seed=0).net, source={"format": "test"}
    )
    return torch.load(path, weights_only=True)


def _save(path: Path, payload: dict, **changes) -> Path:
    data = dict(payload)
    data.update(changes)
    torch.save(data, path)
    return path


def _refused(path: Path, expect: str) -> str:
    with pytest.raises(InputError) as exc:
        load_model(path)
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and expect in msg, msg
    assert "weights_only" not in msg and "Traceback" not in msg
    return msg


def test_a_valid_model_file_loads(tmp_path, payload):
    model = load_model(_save(tmp_path / "ok.pt", payload))
    assert model.net.architecture == "resnet18" and model.net.multiscale_power == pytest.approx(3.0)


@pytest.mark.parametrize(
    "p, expect",
    [
        (float("nan"), "model file setting p: expected a finite number, got nan"),
        (-50.0, "model file setting p: must be in (0, 1000], got -50.0"),
        (float("inf"), "setting p: expected a finite number"),
        ("3", "setting p: expected a finite number, got '3'"),
    ],
)
def test_p_must_be_a_positive_finite_number(tmp_path, payload, p, expect):
    _refused(_save(tmp_path / "p.pt", payload, p=p), expect)


@pytest.mark.parametrize("value", [float("nan"), -50.0, 0.0])
def test_the_gem_exponent_in_the_weights_must_be_positive_and_finite(tmp_path, payload, value):
    sd = dict(payload["state_dict"])
    sd["pool.p"] = torch.tensor([value])
    expect = "holds NaN" if value != value else "pool.p is"
    _refused(_save(tmp_path / "pp.pt", payload, state_dict=sd), expect)


def test_nan_weights_are_refused_when_the_file_is_read(tmp_path, payload):
    sd = dict(payload["state_dict"])
    w = sd["features.0.weight"].clone()
    w[0, 0, 0, 0] = float("nan")
    sd["features.0.weight"] = w
    _refused(
        _save(tmp_path / "nan.pt", payload, state_dict=sd),
        "weight 'features.0.weight' holds NaN or infinite values",
    )


def test_a_huge_whiten_dim_allocates_nothing(tmp_path, payload, monkeypatch):
    built = []
    monkeypatch.setattr(
        torch.nn, "Linear", lambda *a, **k: built.append(a) or pytest.fail("a layer was built")
    )
    _refused(
        _save(tmp_path / "w.pt", payload, whiten_dim=10**12),
        "setting whiten_dim: must be in [1, 65536]",
    )
    # a plausible size that the weights do not have
    _refused(
        _save(tmp_path / "w2.pt", payload, whiten_dim=256), "whiten_dim and its whitening layer"
    )
    assert built == []


def test_a_whitening_layer_of_another_input_size_is_refused_before_it_is_built(tmp_path, payload):
    sd = dict(payload["state_dict"])
    sd["whiten.weight"] = torch.zeros(16, 7)
    sd["whiten.bias"] = torch.zeros(16)
    _refused(_save(tmp_path / "wl.pt", payload, whiten_dim=16, state_dict=sd), "expected [16, 512]")


def _deep_architecture_file(path: Path, payload: dict, depth: int) -> Path:
    """A model file whose ``architecture`` is a list nested ``depth`` deep (pickle written by hand:
    Python's pickler itself would recurse)."""
    marker = "XXARCHXX"
    buf = io.BytesIO()
    torch.save({**payload, "architecture": marker}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                old = pickle.BINUNICODE + len(marker).to_bytes(4, "little") + marker.encode()
                assert data.count(old) == 1
                deep = pickle.EMPTY_LIST * depth + pickle.APPEND * (depth - 1)
                data = data.replace(old, deep)
            dst.writestr(info, data)
    path.write_bytes(out.getvalue())
    return path


def test_a_300k_deep_architecture_is_one_line_not_a_recursion_error(tmp_path, payload):
    _refused(_deep_architecture_file(tmp_path / "deep.pt", payload, 300_000), "nested deeper than")


@pytest.mark.parametrize(
    "arch",
    [
        "timm:hf-hub:timm/resnet18.a1_in1k",
        "timm:local-dir:/tmp/model",
        "timm:../../etc/passwd",
        "timm:/abs/path",
        "timm:no_such_model_xyz",
        "resnet7",
        "x" * 100_000,
    ],
)
def test_architecture_names_come_from_the_known_list_and_cause_no_io(
    tmp_path, payload, monkeypatch, arch
):
    timm = pytest.importorskip("timm")

    def no_io(*args, **kwargs):
        raise AssertionError("timm was asked to build or fetch a model")

    monkeypatch.setattr(timm, "create_model", no_io)
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setattr(hub, "hf_hub_download", no_io)
    expect = (
        "timm does not know"
        if "no_such" in arch
        else "text value of"
        if len(arch) > 4096
        else "unknown backbone"
    )
    _refused(_save(tmp_path / "a.pt", payload, architecture=arch), expect)
    with pytest.raises(InputError):
        build_trunk(arch)  # the same rule for a method's backbone setting


def test_known_timm_names_pass_the_offline_check():
    pytest.importorskip("timm")
    check_architecture("timm:resnet18")
    check_architecture("timm:vit_small_patch14_dinov2.lvd142m")
    assert known_architecture("resnet50") and not known_architecture("timm:hf-hub:x/y")


def test_pickled_objects_are_refused_without_torchs_weights_only_advice(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"format": "oxbench-model", "obj": Path("/")}, path)
    msg = _refused(path, "holds a Python object (pathlib")
    assert "could run code" in msg


@pytest.mark.parametrize(
    "changes, expect",
    [
        ({"pooling": "vlad"}, "unknown pooling 'vlad'"),
        ({"mean": [0.5, float("nan"), 0.5]}, "setting mean: item 2: expected a finite number"),
        ({"std": [0.2, 0.0, 0.2]}, "setting std: item 2: must be in (0, 10]"),
        ({"std": [0.2, 0.2]}, "setting std: expected 3 to 3 numbers"),
        ({"whiten_dim": True}, "setting whiten_dim: expected a whole number"),
        ({"version": 1.0}, "model file version 1.0"),
        ({"extra": 1}, "unknown entries 'extra'"),
        ({"state_dict": [1, 2]}, "state_dict is not a mapping"),
        ({"state_dict": {"a": 1}}, "weight 'a' is a int, not a tensor"),
        ({"source": {"note": "x" * 5000}}, "text value of 5,000 characters"),
        (
            {
                "lw": {
                    "sfm": {"ss": {"m": torch.zeros(512), "P": torch.full((4, 512), float("nan"))}}
                }
            },
            "holds NaN",
        ),
        (
            {"lw": {"sfm": {"ss": {"m": torch.zeros(512), "P": torch.zeros(4, 3)}}}},
            "do not fit 512-D",
        ),
    ],
)
def test_other_schema_refusals(tmp_path, payload, changes, expect):
    _refused(_save(tmp_path / "x.pt", payload, **changes), expect)


def test_whitening_projection_is_bounded():
    with pytest.raises(InputError, match="expected \\[D' <= 65536, 512\\]"):
        modelfile.check_whitening_shape(10**6, 512, 512, "sfm/ss", "m.pt")


def test_cli_reading_a_hostile_model_file_is_one_line(tmp_path, payload, capsys):
    bad = _save(tmp_path / "bad.pt", payload, p=float("nan"))
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "train",
                "--root",
                str(tmp_path / "root"),
                "--init",
                str(bad),
                "--out",
                str(tmp_path / "m.pt"),
            ]
        )
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "setting p" in err, err
    assert not (tmp_path / "root").exists()  # refused before the training data was loaded
