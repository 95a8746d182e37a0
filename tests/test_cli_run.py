"""``oxbench run`` end to end on a tiny synthetic set: printed lines, JSON, run folder, refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.pipelines.runner import list_runs
from test_pipeline import make_tiny_root

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

TINY_ARGS = ["--vocab-size", "200", "--max-side", "320", "--top-r", "20", "--no-progress"]
#: For a preset that verifies nothing: --top-r (spatial.top_r) is refused where no stage reads it.
UNVERIFIED_ARGS = ["--vocab-size", "200", "--max-side", "320", "--no-progress"]


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
        capsys,
        "run",
        "--root",
        str(tiny_root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        *TINY_ARGS,
    )
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert lines[0].startswith("synthetic: mAP E: ") and ", M: " in lines[0] and ", H: " in lines[0]
    assert lines[1].startswith("synthetic: mP@k[1 5 10] E: [")
    assert "hard" in stdout and "trained on synthetic-train" in stdout
    (first,) = list_runs(out)
    assert (first / "metrics.json").is_file() and f"run folder: {first}" in stdout

    # the ranks are in the revisitop layout and `oxbench evaluate revisited` reproduces the lines
    gnd = next((tiny_root / "synthetic").glob("gnd_*.pkl"))
    code, ev_out, ev_err = run(
        capsys, "evaluate", "revisited", "--gnd", str(gnd), "--ranks", str(first / "ranks.npy")
    )
    assert code == 0, ev_err
    assert ev_out.splitlines()[0].split("mAP")[1] == lines[0].split("mAP")[1]

    # --json: machine-readable, same numbers, a second record beside the first
    code, js, _ = run(
        capsys,
        "run",
        "--root",
        str(tiny_root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        "--json",
        *TINY_ARGS,
    )
    assert code == 0
    payload = json.loads(js)
    assert Path(payload["run_dir"]).parent == out and payload["trained_on"] == "synthetic-train"
    assert payload["trained_on_test_set"] is False
    assert len(list_runs(out)) == 2

    # `oxbench runs` lists both records with their headline numbers
    code, listing, _ = run(capsys, "runs", str(tmp_path))
    assert (
        code == 0
        and listing.count("rootsift-bow-sv-qe") == 2
        and re.search(r"mAP E [\d.]+ M [\d.]+ H [\d.]+", listing)
    )
    code, listing, _ = run(capsys, "runs", str(tmp_path), "--json")
    assert {r["run_dir"] for r in json.loads(listing)} == {str(p) for p in list_runs(out)}

    # another method into the same folder: one line, exit 2, nothing changed
    before = (out / "config.json").read_text()
    code, _, err = run(
        capsys,
        "run",
        "--root",
        str(tiny_root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        "--method",
        "rootsift-bow",
        *UNVERIFIED_ARGS,
    )
    assert code == 2
    assert (
        err.startswith("oxbench: error: ")
        and "another config" in err
        and len(err.strip().splitlines()) == 1
    )
    assert (out / "config.json").read_text() == before and len(list_runs(out)) == 2


def test_run_bad_input_is_one_line(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "run", "--root", str(tiny_root), "--method", "nope", "--no-progress")
    assert code == 2 and "unknown method 'nope'" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(
        capsys,
        "run",
        "--root",
        str(tiny_root),
        "--train-dataset",
        "synthetic-train",
        "--dataset",
        "holidays",
        "--out",
        str(tmp_path / "r"),
        "--no-progress",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
    for args, words in (
        (["--set", "novalue"], "--set takes KEY=VALUE"),
        (["--set", "colour=red"], "unknown method setting 'colour'"),
        (["--workers", "-3"], "--workers must be a whole number from 1 to 1024"),
        (["--workers", "0"], "--workers must be a whole number from 1 to 1024"),
        (["--engine", "mpi"], "unknown execution backend 'mpi'"),
        (["--distractors", "99999999999999999999"], "more than 100 million"),
    ):
        code, _, err = run(capsys, "run", "--root", str(tiny_root), "--no-progress", *args)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_list_methods_shows_every_family(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "run", "--list-methods")
    assert code == 0 and "rootsift-bow-sv-qe\tbow" in out and "rootsift-vlad-w\tglobal" in out


def make_revisited_from_subset(subset: Path, root: Path) -> None:
    """``<root>/{roxford5k,rparis6k}/`` in the revisitop layout over the real subset images (symlinks).

    The database is the city's subset images, the queries its cropped query images (box = whole
    crop), labels from the manifest (TP = hard, junk = junk): a partial dataset, loaded non-strict.
    """
    import csv
    import os
    import pickle

    from PIL import Image

    with open(subset / "manifest.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    for ds in ("roxford5k", "rparis6k"):
        r = [x for x in rows if x["dataset"] == ds]
        files = sorted({x["image_file"] for x in r})
        names = [f.split("_", 1)[1][:-4] for f in files]
        index = {f: i for i, f in enumerate(files)}
        folders = sorted({x["query_folder"] for x in r}, key=lambda q: int(q[1:]))
        d = root / ds
        (d / "jpg").mkdir(parents=True)
        qnames, gnd = [], []
        for q in folders:
            qr = [x for x in r if x["query_folder"] == q]
            qn = qr[0]["query_name"]
            with Image.open(subset / "queries" / q / "query.jpg") as im:
                w, h = im.size
            tp = [index[x["image_file"]] for x in qr if x["gnd_class"] == "hard"]
            gnd.append(
                {
                    # all TPs are revisited hard positives; two become "easy" so that every setup
                    # has positives (an all-empty setup is refused by the evaluator)
                    "bbx": [0.0, 0.0, float(w), float(h)],
                    "easy": tp[:2],
                    "hard": tp[2:],
                    "junk": [index[x["image_file"]] for x in qr if x["gnd_class"] == "junk"],
                }
            )
            qnames.append(qn)
            os.symlink(subset / "queries" / q / "query.jpg", d / "jpg" / f"{qn}.jpg")
        for f, n in zip(files, names, strict=True):
            os.symlink(subset / "db_images" / f, d / "jpg" / f"{n}.jpg")
        (d / f"gnd_{ds}.pkl").write_bytes(
            pickle.dumps({"imlist": names, "qimlist": qnames, "gnd": gnd}, protocol=2)
        )


@pytest.mark.slow
@pytest.mark.shared_data
def test_run_on_real_revisited_layout(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`oxbench run --dataset roxford5k` on real images: vocabulary from rparis6k by default."""
    subset = shared_data / "revisited_pixel_retrieval_subset"
    if not subset.is_dir():
        pytest.skip("revisited_pixel_retrieval_subset is absent")
    make_revisited_from_subset(subset, tmp_path / "data")
    code, _, err = run(
        capsys,
        "run",
        "--dataset",
        "roxford5k",
        "--root",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "run"),
        "--no-progress",
        *TINY_ARGS[:-1],
    )
    assert code == 2 and "expected 4993" in err  # partial data is refused unless asked for
    code, out, err = run(
        capsys,
        "run",
        "--dataset",
        "roxford5k",
        "--root",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "run"),
        "--allow-partial",
        "--vocab-size",
        "256",
        "--max-side",
        "256",
        "--top-r",
        "20",
        "--no-progress",
    )
    assert code == 0, err
    assert out.startswith("roxford5k: mAP E: ")
    assert "trained on rparis6k" in out
    config = json.loads((list_runs(tmp_path / "run")[0] / "config.json").read_text())
    assert config["train_dataset"] == "rparis6k" and config["strict"] is False


def test_console_is_quiet_by_default_and_verbose_with_v(capsys: pytest.CaptureFixture[str]) -> None:
    import logging

    run(capsys, "run", "--list-methods")
    logging.getLogger("oxbench.test").info("stage line")
    assert "stage line" not in capsys.readouterr().err
    run(capsys, "-v", "run", "--list-methods")
    logging.getLogger("oxbench.test").info("stage line")
    err = capsys.readouterr().err
    assert err.count("stage line") == 1  # shown once: one console handler however often invoked


def test_a_config_folder_whose_config_is_a_fifo_or_a_deep_file_is_one_line(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import os

    for kind in ("fifo", "deep", "list"):
        out = tmp_path / kind
        out.mkdir()
        if kind == "fifo":
            os.mkfifo(out / "config.json")  # a plain read would hang
        else:
            (out / "config.json").write_text("[" * 100_000 if kind == "deep" else "[1, 2]")
        code, _, err = run(
            capsys,
            "run",
            "--root",
            str(tiny_root),
            "--method",
            "rootsift-bow",
            "--out",
            str(out),
            "--vocab-size",
            "50",
            "--no-progress",
        )
        words = (
            "not an oxbench run folder"
            if kind == "fifo"
            else ("unreadable run config" if kind == "deep" else "not a JSON object")
        )
        assert code == 2 and words in err, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "milestones"])
def test_a_setting_given_twice_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    # the last of two --set spatial.top_r=... used to win silently
    rc, out, err = run(
        capsys,
        command,
        "--root",
        str(tmp_path),
        "--set",
        "spatial.top_r=5",
        "--set",
        "spatial.top_r=6",
    )
    assert rc == 2, err
    assert "spatial.top_r is given twice" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
