"""``oxbench run --distractors`` for every family: N generated distractors in the index, the count
and the footprint recorded, the ranks scored by ``oxbench evaluate --distractors``; bad distractor
input refused in one line, exit 2, nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from test_cli_run import run
from test_datasets import make_revisited, write_jpeg
from test_pipeline import make_tiny_root

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

TINY = ["--max-side", "320", "--no-progress", "--set", "features.n_features=300"]
FAMILIES = {
    "rootsift-bow": ["--vocab-size", "256"],
    "rootsift-bow-sv": ["--vocab-size", "256", "--top-r", "20"],
    "rootsift-asmk": ["--vocab-size", "256"],
    # VLAD's local features are its descriptor kind's (--max-side reaches them too)
    "rootsift-vlad-w": ["--set", "whitening_dim=16", "--set", "descriptor.features.n_features=300"],
}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("method", sorted(FAMILIES))
def test_every_family_runs_with_generated_distractors(
    method: str, tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if "asmk" in method:
        pytest.importorskip("asmk")
    out = tmp_path / "run"
    code, stdout, err = run(
        capsys,
        "run",
        "--root",
        str(tiny_root),
        "--method",
        method,
        "--distractors",
        "25",
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        "--json",
        *(TINY if "vlad" not in method else TINY[:-2]),
        *FAMILIES[method],
    )
    assert code == 0, err
    payload = json.loads(stdout)
    run_dir = Path(payload["run_dir"])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["distractors"] == 25 and config["n_distractors"] == 25
    dataset = json.loads((run_dir / "dataset.json").read_text())
    assert dataset["n_distractors"] == 25 and dataset["n_db"] == 40
    assert payload["footprint"]["n_index"] == 65 and payload["footprint"]["ram_bytes_per_image"] > 0
    ranks = np.load(run_dir / "ranks.npy")  # revisitop layout: every index position ranked once
    assert ranks.shape[0] == 65 and sorted(ranks[:, 0].tolist()) == list(range(65))
    retrieved = json.loads((run_dir / "retrieved.json").read_text())
    names = {t["name"] for q in retrieved["queries"] for t in q["top"] if t["index"] >= 40}
    assert names and all(
        n.startswith("northford_x") for n in names
    )  # the generated distractors' names
    gnd = next((tiny_root / "synthetic").glob("gnd_*.pkl"))
    code, ev_out, ev_err = run(
        capsys,
        "evaluate",
        "revisited",
        "--gnd",
        str(gnd),
        "--ranks",
        str(run_dir / "ranks.npy"),
        "--distractors",
        "25",
    )
    assert code == 0, ev_err
    lines = (run_dir / "summary.txt").read_text().splitlines()
    assert ev_out.splitlines()[0].split("mAP")[1] == lines[0].split("mAP")[1]


def _fake_r1m(root: Path, entries: list[str]) -> None:
    r1m = root / "revisitop1m"
    r1m.mkdir(parents=True)
    (r1m / "revisitop1m.txt").write_text("\n".join(entries) + "\n")
    for i, e in enumerate(entries):
        write_jpeg(r1m / "jpg" / e, seed=400 + i)


def test_bad_distractor_input_is_one_line_exit_2_and_nothing_recorded(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    make_revisited(root / "roxford5k")
    make_revisited(root / "rparis6k", "rparis6k")
    _fake_r1m(root, ["a/0001.jpg", "a/0002.jpg", "b/0003.jpg"])
    (root / "oxford100k" / "jpg").mkdir(parents=True)
    write_jpeg(root / "oxford100k" / "jpg" / "x.jpg", seed=1)
    cases = [
        (
            root,
            ["--dataset", "roxford5k", "--distractors", "oxford100k"],
            "oxford100k holds the distractors of oxford5k, paris6k, not of roxford5k; roxford5k's is revisitop1m",
        ),
        (
            root,
            ["--dataset", "roxford5k", "--distractors", "4"],
            "asked for 4 distractors but revisitop1m has 3",
        ),
        (
            root,
            ["--dataset", "roxford5k", "--distractors", "roxford5k"],
            "roxford5k is not a distractor set",
        ),
        (
            tiny_root,
            ["--distractors", "revisitop1m"],
            "the synthetic benchmark takes a number of generated distractors",
        ),
        (tiny_root, ["--distractors", "-3"], "distractors"),
    ]
    for data, args, words in cases:
        out = tmp_path / "out"
        code, _, err = run(
            capsys,
            "run",
            "--root",
            str(data),
            "--method",
            "rootsift-bow",
            "--allow-partial",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "c"),
            *args,
            *TINY,
        )
        errors = [
            ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")
        ]  # partial-set warnings
        assert code == 2 and len(errors) == 1 and words in errors[0], (args, err)
        assert not out.exists(), args
