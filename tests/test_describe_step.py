"""One describe step for every family: ``run --partition`` and ``oxbench extract`` through
:meth:`RetrievalMethod.describe_parts`, with no family branch in the extraction or the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import oxbench
from oxbench.cli import main
from test_pipeline import make_tiny_root, tiny

TINY_CNN = {
    "descriptor.weights": "random",
    "descriptor.backbone": "resnet18",
    "descriptor.max_side": 64,
    "descriptor.scales": "[1]",
    "whitening_dim": "8",
}
CASES = {
    "rootsift-bow": {**tiny("rootsift-bow"), "vocabulary.size": 50},
    "gem-r50-imagenet+w": TINY_CNN,  # a CNN whose whitening reads the training set's descriptors
    # a hybrid: VLAD's local features, then the global short list verified with a local source
    "rootsift-vlad-w+sv": {
        "descriptor.features.max_side": 320,
        "descriptor.features.n_features": 300,
        "descriptor.vocabulary.size": 8,
        "local_source": "sift",
        "spatial.top_r": 10,
    },
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    assert exc.value.code == 0, err
    return out


def _run(method: str, root: Path, cache: Path, out: Path, extra: list[str]) -> list[str]:
    sets = [a for k, v in CASES[method].items() for a in ("--set", f"{k}={v}")]
    return [
        "run",
        "--method",
        method,
        "--root",
        str(root),
        "--cache",
        str(cache),
        "--out",
        str(out),
        "--engine",
        "serial",
        "--shard-size",
        "8",
        "--no-progress",
        *sets,
        *extra,
    ]


@pytest.mark.parametrize("method", list(CASES))
def test_partitions_then_the_run_give_the_plain_runs_ranks_and_hit_every_shard(
    method: str, root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if method.startswith("gem"):
        pytest.importorskip("torch")
    cache = tmp_path / "cache"
    described: dict[str, int] = {}
    for i in range(2):
        text = _cli(
            _run(method, root, cache, tmp_path / "p", ["--partition", f"{i}/2", "--json"]), capsys
        )
        for key, n in json.loads(text)["described"].items():
            described[key] = described.get(key, 0) + n
    bench, train = oxbench.load("synthetic", root), oxbench.load("synthetic-train", root)
    assert described["synthetic/database"] == bench.gt.n_db
    assert described["synthetic/queries"] == bench.gt.n_queries
    assert described["synthetic-train/database"] == train.gt.n_db  # what fit reads
    if "local_source" in CASES[method]:
        assert described["synthetic/local_source.database"] == bench.gt.n_db
        assert "synthetic-train/local_source.database" not in described  # the test set's only
    # the partitions together committed every extraction shard: all of them at once find none left
    args = _run(method, root, cache, tmp_path / "p", ["--partition", "0/1", "--json"])
    again = json.loads(_cli(args, capsys))["described"]
    assert set(again) == set(described) and not any(again.values()), again
    assert "mAP" in _cli(_run(method, root, cache, tmp_path / "after", []), capsys)
    assert "mAP" in _cli(
        _run(method, root, tmp_path / "plain-cache", tmp_path / "plain", []), capsys
    )
    (after,) = (tmp_path / "after").glob("*/record.json")
    (plain,) = (tmp_path / "plain").glob("*/record.json")
    steps = json.loads(after.read_text())["cache"]
    # (VLAD's descriptor shards aggregate its local features with the codebook fit learns: they
    # are computed by the run, from the local features the partitions described)
    shards = r"features|local_source_.*" + ("" if "vlad" in method else r"|descriptors\..*")
    extraction = {k: v for k, v in steps.items() if re.fullmatch(shards, k)}
    assert extraction and set(extraction.values()) == {"hit"}, steps  # nothing described again
    np.testing.assert_array_equal(
        np.load(after.parent / "ranks.npy"), np.load(plain.parent / "ranks.npy")
    )


def test_extract_of_a_local_feature_method_fills_the_stores_its_run_reads(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    sets = [a for k, v in CASES["rootsift-bow"].items() for a in ("--set", f"{k}={v}")]
    out = _cli(
        ["extract", "--method", "rootsift-bow", "--root", str(root), "--cache", str(cache),
         "--out", str(tmp_path / "x"), "--engine", "serial", "--no-progress", *sets],
        capsys,
    )  # fmt: skip
    bench = oxbench.load("synthetic", root)
    info = json.loads((tmp_path / "x" / "extract.json").read_text())
    assert info["vectors"] is False and not (tmp_path / "x" / "db.npy").exists()
    assert info["described"] == {"database": bench.gt.n_db, "queries": bench.gt.n_queries}
    assert f"described {bench.gt.n_db} database" in out
    _cli(_run("rootsift-bow", root, cache, tmp_path / "r", []), capsys)
    (record,) = (tmp_path / "r").glob("*/record.json")
    assert json.loads(record.read_text())["cache"]["features"] == "hit"


def test_extraction_code_names_no_family() -> None:
    """The describe step is the methods' own: no family, config class or descriptor kind is
    named where extraction, partitions and runs are driven."""
    src = Path(oxbench.__file__).parent
    for rel in ("pipelines/extract.py", "pipelines/runner.py", "cli/run.py", "cli/deep.py"):
        text = (src / rel).read_text()
        for word in (
            "GlobalConfig",
            "GlobalDescriptors",
            "descriptor ==",
            'descriptor != "',
            "isinstance(m, ",
        ):
            assert word not in text, (rel, word)
