"""bench/vocab_curve.py at a tiny size: both vocabulary sources, flat and two-level, the table,
the plot, other test and training sets (``--test`` / ``--other``), and a vocabulary larger than
the training descriptors, an unknown dataset or the same one for both refused in one line."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def curve():  # noqa: ANN201 - the bench module
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("vocab_curve", BENCH / "vocab_curve.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_pipeline import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


def _argv(root: Path, tmp: Path, sizes: str) -> list[str]:
    return [
        "--root", str(root), "--cache", str(tmp / "cache"), "--runs", str(tmp / "runs"),
        "--sizes", sizes, "--methods", "rootsift-bow", "--two-level-from", "64",
        "--set", "features.max_side=320", "--set", "features.n_features=300", "--workers", "1",
    ]  # fmt: skip


def test_the_curve_runs_both_sources_flat_and_two_level(
    curve, tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_png = tmp_path / "v.json", tmp_path / "v.png"
    argv = [*_argv(tiny_root, tmp_path, "32,64"), "--json", str(out_json), "--plot", str(out_png)]
    assert curve.main(argv) == 0
    points = json.loads(out_json.read_text())["points"]
    got = {(p["vocabulary"], p["vocabulary.size"]): p for p in points}
    assert set(got) == {("other", 32), ("other", 64), ("test", 32), ("test", 64)}
    assert [got[("other", k)]["structure"] for k in (32, 64)] == ["flat", "two-level"]
    # the test city's own vocabulary is flagged, the other city's is not
    assert all(got[("test", k)]["trained_on_test_set"] for k in (32, 64))
    assert not any(got[("other", k)]["trained_on_test_set"] for k in (32, 64))
    for p in points:
        assert all(0 <= v <= 100 for v in p["map"].values()) and p["query_s"] > 0
    # each source's training descriptors, counted once before the runs, recorded with its points
    counts = {v: {p["train_descriptors"] for p in points if p["vocabulary"] == v} for v, _ in got}
    assert all(len(c) == 1 and min(c) >= 64 for c in counts.values())
    text = capsys.readouterr().out
    assert "| rootsift-bow | synthetic-train (other city) | 64 | two-level |" in text
    assert out_png.stat().st_size > 10_000
    assert curve.main(["--redraw", str(out_json), "--plot", str(tmp_path / "r.png")]) == 0


def test_a_vocabulary_larger_than_the_training_descriptors_is_one_line_exit_2(
    curve, tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert curve.main(_argv(tiny_root, tmp_path, "16,1000000")) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "larger than the" in err
    assert "training descriptors of synthetic-train" in err
    assert not (tmp_path / "runs").exists()  # no run was made


def test_test_and_other_name_the_benchmark_and_the_vocabulary_s_training_set(
    curve, tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the two cities' roles swapped: the training city is the benchmark, the test city trains
    out_json = tmp_path / "v.json"
    argv = [*_argv(tiny_root, tmp_path, "32"), "--test", "synthetic-train", "--other", "synthetic"]
    assert curve.main([*argv, "--json", str(out_json)]) == 0
    points = {p["vocabulary"]: p for p in json.loads(out_json.read_text())["points"]}
    assert {p["dataset"] for p in points.values()} == {"synthetic-train"}
    assert points["other"]["train_dataset"] == "synthetic"
    assert not points["other"]["trained_on_test_set"]
    assert points["test"]["train_dataset"] == "synthetic-train"
    assert points["test"]["trained_on_test_set"]
    assert points["other"]["n_index"] == 30  # the training city's 30 database images
    assert "| rootsift-bow | synthetic (other city) | 32 | flat |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "names"),
    [
        (["--test", "no-such-set"], "--test"),
        (["--other", "no-such-set"], "--other"),
        (["--test", "synthetic", "--other", "synthetic"], "another dataset than --test"),
    ],
)
def test_an_unknown_or_repeated_dataset_is_one_line_exit_2(
    curve,
    tiny_root: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    names: str,
) -> None:
    assert curve.main([*_argv(tiny_root, tmp_path, "32"), *options]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and names in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()
