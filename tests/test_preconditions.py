"""Cheap checks come first (issue 24): a missing extra, a bad setting or an unreadable input is one
line, exit 2, before any data is generated or any long step starts, and nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.errors import MissingExtraError, require_installed


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _written(root: Path) -> list[Path]:
    return sorted(root.rglob("*")) if root.exists() else []


@pytest.fixture
def no_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Torch (and torchvision) as if not installed: ``import torch`` fails, ``find_spec`` finds none."""
    for name in ("torch", "torchvision"):
        monkeypatch.setitem(sys.modules, name, None)


def test_require_installed_names_the_extra_without_importing(no_torch: None) -> None:
    require_installed([("json", "core")])
    with pytest.raises(MissingExtraError, match=r'pip install "oxbench\[deep\]"'):
        require_installed([("json", "core"), ("torch", "deep")])
    with pytest.raises(MissingExtraError, match="no_such_module_xyz"):
        require_installed([("no_such_module_xyz.sub", "classic")])


def test_train_without_torch_fails_before_rendering_or_writing_anything(
    no_torch: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    code, out, err = _cli(capsys, "train", "--root", str(root), "--no-progress")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "'torch'" in err and "oxbench[deep]" in err
    assert _written(root) == []  # the synthetic training city was not rendered
    assert _written(tmp_path) == []


def test_a_bad_option_of_train_is_refused_before_the_extra_is_needed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(capsys, "train", "--root", str(tmp_path / "data"), "--epochs", "0")
    assert code == 2 and "--epochs" in err and _written(tmp_path) == []


@pytest.mark.parametrize("method", ["gem-r18-synthetic", "gem-r50-imagenet"])
def test_run_of_a_cnn_preset_without_torch_fails_before_loading_data(
    method: str, no_torch: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    code, _, err = _cli(
        capsys,
        "run",
        "--method",
        method,
        "--root",
        str(root),
        "--out",
        str(tmp_path / "r"),
        "--no-progress",
    )
    assert code == 2 and "oxbench[deep]" in err and len(err.strip().splitlines()) == 1, err
    assert _written(tmp_path) == []


def test_run_checks_settings_and_label_before_loading_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "data"
    for extra, words in (
        (["--set", "alpha-qe.k=0"], "alpha-qe.k"),
        (["--label", "a\nb"], "--label"),
    ):
        code, _, err = _cli(
            capsys,
            "run",
            "--method",
            "features-alpha-qe",
            "--root",
            str(root),
            "--no-progress",
            "--out",
            str(tmp_path / "r"),
            *extra,
        )
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert _written(tmp_path) == []


def test_extract_of_a_cnn_preset_without_torch_fails_before_loading_data(
    no_torch: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _cli(
        capsys,
        "extract",
        "--method",
        "gem-r18-synthetic",
        "--root",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2 and "oxbench[deep]" in err and len(err.strip().splitlines()) == 1, err
    assert _written(tmp_path) == []


def test_synthetic_generation_without_opencv_fails_before_writing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "cv2", None)
    code, _, err = _cli(capsys, "data", "synth", "--root", str(tmp_path / "data"))
    assert code == 2 and "oxbench[classic]" in err and len(err.strip().splitlines()) == 1, err
    assert _written(tmp_path) == []


def test_synthetic_generation_checks_free_space_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from oxbench.datasets import fetch
    from oxbench.datasets.synthetic.config import DEFAULT_TRAIN
    from oxbench.datasets.synthetic.generate import generate
    from oxbench.errors import InputError

    monkeypatch.setattr(fetch, "disk_free", lambda path: 1_000_000)
    with pytest.raises(InputError, match="not enough free disk space"):
        generate(tmp_path / "synthetic-train", DEFAULT_TRAIN, workers=1, progress=False)
    assert _written(tmp_path) == []


def test_run_into_a_folder_of_another_method_is_refused_before_the_data_is_generated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from oxbench.pipelines import resolve_method

    root = tmp_path / "data"  # no synthetic city: loading it would render one
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(
        json.dumps({"dataset": "synthetic", "method": resolve_method("rootsift-bow").to_dict()})
    )
    code, _, err = _cli(capsys, "run", "--root", str(root), "--out", str(other), "--no-progress")
    assert (
        code == 2
        and "another config (differs in: method)" in err
        and len(err.strip().splitlines()) == 1
    ), err
    assert _written(root) == []


@pytest.mark.parametrize(("method", "settings", "words"), [
    ("gem-r50-imagenet", ["descriptor.weights=absent.pt"], "absent.pt: no model file here"),
    ("gem-r18-synthetic", ["descriptor.fit_network=false"], "gem-r18-synthetic.pt: no model file here"),
    ("features", ["descriptor.db_features=absent.npy", "descriptor.query_features=absent.npy"], "absent.npy: descriptor.db_features: file not found"),
    ("features", ["descriptor.db_features=.", "descriptor.query_features=q.npy"], "descriptor.db_features: is a folder"),
])  # fmt: skip
def test_run_refuses_a_missing_input_file_before_the_synthetic_city_is_rendered(
    method: str,
    settings: list[str],
    words: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if method.startswith("gem"):
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    root = tmp_path / "data"
    sets = [a for s in settings for a in ("--set", s)]
    code, _, err = _cli(
        capsys, "run", "--method", method, "--root", str(root), *sets, "--no-progress"
    )
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert _written(tmp_path) == []
