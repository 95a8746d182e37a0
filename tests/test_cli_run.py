"""``oxbench run`` end to end on a tiny synthetic set: printed lines, JSON, run folder, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oxbench.cli import main
from test_pipeline import make_tiny_root

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

TINY_ARGS = ["--vocab-size", "200", "--max-side", "320", "--top-r", "20", "--no-progress"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the console entry point; return (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


@pytest.mark.slow
def test_run_prints_lines_and_writes_a_loadable_run_folder(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code, stdout, stderr = run(
        capsys, "run", "--root", str(tiny_root), "--out", str(out), "--cache", str(tmp_path / "c"), *TINY_ARGS
    )
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("synthetic: mAP E: ") and ", M: " in lines[0] and ", H: " in lines[0]
    assert lines[1].startswith("synthetic: mP@k[1 5 10] E: [")
    assert "hard" in stdout and "trained on synthetic-train" in stdout
    assert (out / "metrics.json").is_file()

    # the ranks are in the revisitop layout and `oxbench evaluate revisited` reproduces the lines
    gnd = next((tiny_root / "synthetic").glob("gnd_*.pkl"))
    code, ev_out, ev_err = run(capsys, "evaluate", "revisited", "--gnd", str(gnd), "--ranks", str(out / "ranks.npy"))
    assert code == 0, ev_err
    assert ev_out.splitlines()[0].split("mAP")[1] == lines[0].split("mAP")[1]

    # --json: machine-readable, same numbers
    code, js, _ = run(
        capsys, "run", "--root", str(tiny_root), "--out", str(out), "--cache", str(tmp_path / "c"),
        "--json", *TINY_ARGS,
    )
    assert code == 0
    payload = json.loads(js)
    assert payload["run_dir"] == str(out) and payload["trained_on"] == "synthetic-train"
    assert payload["trained_on_test_set"] is False

    # another method into the same folder: one line, exit 2, nothing changed
    before = (out / "config.json").read_text()
    code, _, err = run(
        capsys, "run", "--root", str(tiny_root), "--out", str(out), "--cache", str(tmp_path / "c"),
        "--method", "rootsift-bow", *TINY_ARGS,
    )
    assert code == 2
    assert err.startswith("oxbench: error: ") and "another config" in err and len(err.strip().splitlines()) == 1
    assert (out / "config.json").read_text() == before


def test_run_bad_input_is_one_line(tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "run", "--root", str(tiny_root), "--method", "nope", "--no-progress")
    assert code == 2 and "unknown method 'nope'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(
        capsys, "run", "--root", str(tiny_root), "--train-dataset", "synthetic-train", "--dataset", "holidays",
        "--out", str(tmp_path / "r"), "--no-progress",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
