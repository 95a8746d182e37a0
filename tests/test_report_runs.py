"""RunRecord: reading run records (format 1), latest-run resolution, refusals of broken folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.report.runs import RunRecord, check_comparable
from run_layout import random_ranks, tiny_gt, write_run


@pytest.fixture
def gt():
    return tiny_gt(0)


def test_load_run_and_numbers_match_metrics(tmp_path, gt):
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    r = RunRecord.load(run)
    assert r.path == run and r.method == "bow" and r.dataset_id == "roxford5k"
    assert r.setups == ("easy", "medium", "hard") and r.n_queries == gt.n_queries
    assert r.query_names == gt.query_names
    metrics = json.loads((run / "metrics.json").read_text())
    for s in r.setups:
        assert r.mean(s) == metrics["setups"][s]["map"]  # same order of accumulation: bit-equal
        assert r.mean(s, "p@10") == metrics["setups"][s]["mp@10"]
    assert r.ranks().shape == (gt.n_db, gt.n_queries)
    assert r.matches() is None
    assert r.queries[0].top[0]["rank"] == 1 and r.k == 100


def test_config_folder_gives_latest_run(tmp_path, gt):
    write_run(tmp_path, gt, random_ranks(gt, 1), run_id="20240101T000000Z-aaaa")
    newest = write_run(
        tmp_path,
        gt,
        random_ranks(gt, 2),
        run_id="20240301T000000Z-0001",
        config_name="roxford5k-bow-0123456789",
    )
    write_run(
        tmp_path,
        gt,
        random_ranks(gt, 3),
        run_id="20240201T120000Z-ffff",
        config_name="roxford5k-bow-0123456789",
    )
    (tmp_path / "roxford5k-bow-0123456789" / "not-a-run").mkdir()
    assert RunRecord.load(tmp_path / "roxford5k-bow-0123456789").path == newest
    with pytest.raises(InputError, match="no run-id folder"):
        RunRecord.load(tmp_path)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "damage, expect",
    [
        (lambda run: (run / "retrieved.json").unlink(), "missing retrieved.json"),
        (lambda run: (run / "run.log").unlink(), "missing run.log"),
        (lambda run: _edit(run / "record.json", format=2), "format 2"),
        (lambda run: _edit(run / "record.json", status="running"), "did not complete"),
        (lambda run: (run / "metrics.json").write_text("{"), "not valid JSON"),
        (
            lambda run: _edit(run / "dataset.json", n_queries=3),
            "holds 8 queries but dataset.json says 3",
        ),
        (lambda run: _edit(run / "dataset.json", gt_sha256=""), "gt_sha256"),
        (
            lambda run: (run / "per_query.json").write_text(
                json.dumps(json.loads((run / "per_query.json").read_text())[:-1])
            ),
            "rows for 7 of the 8",
        ),
        (
            lambda run: np.save(run / "ranks.npy", np.zeros((3, 2), np.int64)),
            "one column per query",
        ),
    ],
)
def test_broken_folders_are_one_line_errors(tmp_path, gt, damage, expect):
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    damage(run)
    with pytest.raises(InputError) as exc:
        RunRecord.load(run).ranks()
    assert expect in _one_line(exc)


def _edit(path, **changes):
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))


def test_retrieved_label_outside_vocabulary(tmp_path, gt):
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    obj = json.loads((run / "retrieved.json").read_text())
    obj["queries"][2]["top"][4]["label"] = "maybe"
    (run / "retrieved.json").write_text(json.dumps(obj))
    with pytest.raises(InputError, match="query 2, rank 5: label 'maybe'"):
        RunRecord.load(run)


def test_missing_path_and_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        RunRecord.load(tmp_path / "nope")
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        RunRecord.load(tmp_path / "f")


def test_matches_parsed_and_checked(tmp_path, gt):
    run = write_run(tmp_path, gt, random_ranks(gt, 1), matches={0: {5: [[1, 2, 3, 4]]}})
    assert RunRecord.load(run).matches() == {0: {5: [[1.0, 2.0, 3.0, 4.0]]}}
    (run / "matches.json").write_text(json.dumps({"queries": {"0": {"5": [[1, 2, 3]]}}}))
    with pytest.raises(InputError, match=r"\[xq, yq, xd, yd\]"):
        RunRecord.load(run).matches()


def test_check_comparable_refusals(tmp_path, gt):
    a = RunRecord.load(write_run(tmp_path / "a", gt, random_ranks(gt, 1)))
    other_gt = tiny_gt(5)
    b = RunRecord.load(write_run(tmp_path / "b", other_gt, random_ranks(other_gt, 1)))
    with pytest.raises(InputError, match="ground truth differs"):
        check_comparable([a, b])
    c = RunRecord.load(
        write_run(tmp_path / "c", gt, random_ranks(gt, 1, n_distractors=4), n_distractors=4)
    )
    with pytest.raises(InputError, match="distractors"):
        check_comparable([a, c])
    d_gt = tiny_gt(0, dataset="rparis6k")
    d = RunRecord.load(write_run(tmp_path / "d", d_gt, random_ranks(d_gt, 1)))
    with pytest.raises(InputError, match="dataset 'rparis6k'"):
        check_comparable([a, d])
