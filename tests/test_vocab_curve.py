"""bench/vocab_curve.py at a tiny size: both vocabulary sources, flat and two-level, the table,
the plot, and a vocabulary larger than the training descriptors refused in one line."""

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
    got = {(p["vocabulary"], p["vocab_size"]): p for p in points}
    assert set(got) == {("other", 32), ("other", 64), ("test", 32), ("test", 64)}
    assert [got[("other", k)]["structure"] for k in (32, 64)] == ["flat", "two-level"]
    # the test city's own vocabulary is flagged, the other city's is not
    assert all(got[("test", k)]["trained_on_test_set"] for k in (32, 64))
    assert not any(got[("other", k)]["trained_on_test_set"] for k in (32, 64))
    for p in points:
        assert all(0 <= v <= 100 for v in p["map"].values()) and p["query_s"] > 0
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
