"""The run-record schema (``oxbench.records``): one writer, one bounded typed reader, one definition of a
run folder -- and every reading command gives one line or a valid result for a hostile record."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxbench import records
from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.records import PROTOCOL_LABELS, RunRecord, find_runs, is_run_folder, list_runs
from run_layout import random_ranks, tiny_gt, write_run

JSON_FILES = (
    "record.json",
    "config.json",
    "dataset.json",
    "metrics.json",
    "per_query.json",
    "retrieved.json",
    "timings.json",
    "matches.json",
)


class Hang(BaseException):
    """A command ran past its time limit (raised by SIGALRM)."""


@contextlib.contextmanager
def time_limit(seconds: int):
    def handler(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(argv, capsys, *, limit: int = 30) -> tuple[int, str, str]:
    capsys.readouterr()
    with time_limit(limit), pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def commands(run: Path, other: Path, out: Path) -> dict[str, list]:
    """Every command that reads run records, on ``run`` (the damaged one)."""
    return {
        "runs": ["runs", run.parent.parent],
        "compare": ["compare", other, run],
        "report": ["report", run],
        "plot": ["plot", run, "--out", out / "plot"],
        "view": ["view", run, "--out", out / "view"],
        "export-oxford": ["export", run, "--format", "oxford", "--out", out / "oxford"],
        "export-revisitop": ["export", run, "--format", "revisitop", "--out", out / "ranks.npy"],
        "export-hloc": ["export", run, "--format", "hloc", "--out", out / "pairs.txt"],
    }


def assert_one_line_or_valid(name: str, code: int, out: str, err: str) -> None:
    assert "Traceback" not in err and "Traceback" not in out, (name, err)
    if name == "runs":  # lists what it can read, one line per skipped record, and exits 2
        assert code in (0, 2), (name, code, err)
        assert (code == 2) == ("skipped a run record" in err), (name, code, err)
        assert len([ln for ln in err.splitlines() if ln.strip()]) <= 1, (name, err)
        return
    if code == 0:
        return
    assert code == 2, (name, code, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("oxbench: error: "), (name, err)


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A good pair of runs (with matches.json), copied for every damage."""
    base = tmp_path_factory.mktemp("template")
    gt = tiny_gt(0)
    matches = {0: {int(random_ranks(gt, 1)[0, 0]): [[1.0, 2.0, 3.0, 4.0]]}}
    run = write_run(base / "runs", gt, random_ranks(gt, 1), matches=matches)
    other = write_run(base / "other", gt, random_ranks(gt, 2))
    return run, other


@contextlib.contextmanager
def damaged_copy(template):
    run, other = template
    with tempfile.TemporaryDirectory() as d:
        dest = Path(d) / "runs" / run.parent.name / run.name
        shutil.copytree(run, dest)
        yield dest, other, Path(d) / "out"


# -- hostile file types: a link to /dev/zero, a FIFO, a folder, a link to a file outside --------------


def _make_special(path: Path, kind: str, outside: Path) -> None:
    path.unlink()
    if kind == "dev-zero":
        os.symlink("/dev/zero", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link-outside":
        outside.write_text(json.dumps({"private": True}))
        os.symlink(outside, path)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder", "link-outside"])
@pytest.mark.parametrize("name", [*JSON_FILES, "ranks.npy"])
def test_special_files_are_one_line_in_every_reading_command(template, capsys, name, kind):
    with damaged_copy(template) as (run, other, out):
        _make_special(run / name, kind, run.parent.parent.parent / "private.json")
        for cmd, argv in commands(run, other, out).items():
            code, so, se = cli(argv, capsys)
            assert_one_line_or_valid(cmd, code, so, se)
            if cmd == "runs":
                assert str(run) not in so  # skipped, with its warning, exit 2
                assert "skipped a run record" in se and code == 2
            else:
                assert code == 2, (cmd, se)


def test_fifo_is_refused_without_opening_it_for_reading(template):
    with damaged_copy(template) as (run, _, _):
        _make_special(run / "metrics.json", "fifo", run)
        with time_limit(10), pytest.raises(InputError, match="symbolic link|not a regular file"):
            RunRecord.load(run)
        with time_limit(10), pytest.raises(InputError, match="not a regular file"):
            records.read_record_bytes(run / "metrics.json", 100)


# -- named regressions of issue 21 (item 5) --------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _edit(path: Path, **changes) -> None:
    obj = json.loads(path.read_text())
    obj.update(changes)
    path.write_text(json.dumps(obj))


REGRESSIONS = {
    "deep-nesting": (lambda run: _write(run / "metrics.json", "[" * 200_000), "nested deeper than"),
    "deep-but-valid-json": (
        lambda run: _write(run / "config.json", "[" * 40 + "]" * 40),
        "nested deeper than 32",
    ),
    "metrics-a-list": (
        lambda run: _write(run / "metrics.json", "[1, 2]"),
        "expected a JSON object",
    ),
    "started-a-number": (
        lambda run: _edit(run / "record.json", started=12345),
        "'started' must be a non-empty string",
    ),
    "edited-metrics": (
        lambda run: _edit(
            run / "metrics.json",
            setups={
                **json.loads((run / "metrics.json").read_text())["setups"],
                "medium": {
                    **json.loads((run / "metrics.json").read_text())["setups"]["medium"],
                    "map": 0.99,
                },
            },
        ),
        "run record is inconsistent: metrics.json medium map is 0.99",
    ),
    "matches-superscript-key": (
        lambda run: _write(run / "matches.json", json.dumps({"queries": {"²": {}}})),
        "query key '²' is not a query index",
    ),
    "huge-integer": (
        lambda run: _write(run / "timings.json", '{"x": 1' + "0" * 5000 + "}"),
        "not valid JSON",
    ),
    "not-utf8": (lambda run: (run / "dataset.json").write_bytes(b"\xff\xfe{}"), "not UTF-8"),
    "nul-in-name": (
        lambda run: _write(
            run / "retrieved.json",
            (run / "retrieved.json").read_text().replace('"name": "q00"', '"name": "q\\u0000"'),
        ),
        "'name' must be a non-empty string without NUL",
    ),
    "command-not-list": (
        lambda run: _edit(run / "record.json", command="oxbench run"),
        "'command' must be a list",
    ),
    "timings-not-numbers": (
        lambda run: _edit(run / "timings.json", total="1 s"),
        "seconds per stage",
    ),
    "execution-credentials": (
        lambda run: _edit(
            run / "record.json",
            execution={
                "backend": "dask",
                "workers": 2,
                "threads_per_worker": 1,
                "scheduler": "tcp://u:pw@host:8786",
            },
        ),
        "'execution.scheduler' must be an address without credentials",
    ),
    "execution-negative-retries": (
        lambda run: _edit(
            run / "record.json",
            execution={"backend": "dask", "workers": 2, "threads_per_worker": 1, "retried": -1},
        ),
        "'execution.retried' must be a non-negative integer",
    ),
    "execution-stage-without-seconds": (
        lambda run: _edit(
            run / "record.json",
            execution={
                "backend": "dask",
                "workers": 2,
                "threads_per_worker": 1,
                "stages": [{"stage": "x", "tasks": 1}],
            },
        ),
        "'execution.stages' entries need",
    ),
}


@pytest.mark.parametrize("case", list(REGRESSIONS))
def test_named_regressions_are_one_line_in_every_reading_command(template, capsys, case):
    damage, expect = REGRESSIONS[case]
    with damaged_copy(template) as (run, other, out):
        damage(run)
        with pytest.raises(InputError) as exc:
            rec = RunRecord.load(run)
            rec.matches()
        assert "\n" not in str(exc.value) and expect in str(exc.value), str(exc.value)
        for cmd, argv in commands(run, other, out).items():
            code, so, se = cli(argv, capsys)
            assert_one_line_or_valid(cmd, code, so, se)
            lazy = case == "matches-superscript-key"  # matches.json is read by the viewer only
            if cmd == "runs" and not lazy:
                assert "skipped a run record" in se and expect in se and run.name not in so
                assert code == 2 and "no runs under" not in so, so
            elif cmd != "runs" and (not lazy or cmd == "view"):
                assert code == 2 and expect in se, (cmd, se)


def test_runs_and_report_agree_on_an_edited_record(template, capsys):
    """Before, ``runs`` printed metrics.json's number and ``report`` per_query.json's: now both refuse."""
    damage, expect = REGRESSIONS["edited-metrics"]
    with damaged_copy(template) as (run, _, _):
        damage(run)
        code, out, err = cli(["runs", run.parent.parent, "--json"], capsys)
        assert code == 2 and json.loads(out) == [] and "inconsistent" in err
        code, out, err = cli(["report", run], capsys)
        assert code == 2 and str(run) in err and "inconsistent" in err


# -- the fuzz: each JSON file's shape, through every reading command ------------------------------

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)


def _mutations():
    whole = st.tuples(st.just("whole"), JSON_VALUES)
    key = st.tuples(
        st.just("key"),
        st.tuples(
            st.sampled_from(
                [
                    "format",
                    "run_id",
                    "method",
                    "dataset",
                    "started",
                    "status",
                    "n_queries",
                    "n_db",
                    "n_distractors",
                    "id",
                    "gt_sha256",
                    "setups",
                    "map",
                    "k",
                    "protocol",
                    "labels",
                    "queries",
                    "total",
                    "root",
                ]
            ),
            JSON_VALUES,
        ),
    )
    item = st.tuples(
        st.just("item"),
        st.tuples(
            st.integers(0, 30),
            st.sampled_from(
                [
                    "index",
                    "name",
                    "image",
                    "bbox",
                    "top",
                    "n_labelled",
                    "ap",
                    "setup",
                    "query_index",
                    "rank",
                    "label",
                    "score",
                    "p@10",
                ]
            ),
            JSON_VALUES,
        ),
    )
    raw = st.tuples(
        st.just("raw"),
        st.sampled_from(
            [
                "",
                "[" * 5000,
                "{" * 100000,
                "nul\x00",
                "1e999",
                "NaN",
                "-Infinity",
                '{"a": 1' + "0" * 6000 + "}",
                "\ufeff{}",
                "[" * 33 + "]" * 33,
            ]
        ),
    )
    return whole | key | item | raw


def _apply(path: Path, mutation) -> None:
    kind, arg = mutation
    if kind == "raw":
        path.write_text(arg)
        return
    obj = json.loads(path.read_text())
    if kind == "whole":
        obj = arg
    elif kind == "key":
        name, value = arg
        if isinstance(obj, dict):
            obj[name] = value
    else:  # one entry of the list inside (rows, queries, a query's top)
        i, name, value = arg
        seq = (
            obj if isinstance(obj, list) else obj.get("queries") if isinstance(obj, dict) else None
        )
        if isinstance(seq, list) and seq:
            entry = seq[i % len(seq)]
            if isinstance(entry, dict):
                if (
                    name in ("rank", "label", "score")
                    and isinstance(entry.get("top"), list)
                    and entry["top"]
                ):
                    entry["top"][i % len(entry["top"])][name] = value
                else:
                    entry[name] = value
    path.write_text(json.dumps(obj))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(
    name=st.sampled_from(JSON_FILES),
    mutation=_mutations(),
    cmd=st.sampled_from(
        [
            "runs",
            "compare",
            "report",
            "plot",
            "view",
            "export-oxford",
            "export-revisitop",
            "export-hloc",
        ]
    ),
)
def test_fuzz_run_record_reader_through_every_reading_command(
    template, capsys, name, mutation, cmd
):
    with damaged_copy(template) as (run, other, out):
        _apply(run / name, mutation)
        code, so, se = cli(commands(run, other, out)[cmd], capsys)
        assert_one_line_or_valid(cmd, code, so, se)


# -- one schema: writer, reader and the tests' writer agree ---------------------------------------


def test_one_definition_of_a_run_folder(tmp_path):
    gt = tiny_gt(0)
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    assert is_run_folder(run) and list_runs(run.parent) == [run]
    assert not is_run_folder(run.parent)
    (run.parent / "notes").mkdir()
    (run.parent / "notes" / "record.json").write_text("{}")
    (run.parent / ".oxbench-tmp-x-20240101T000000Z-0002").mkdir()
    assert list_runs(run.parent) == [run]
    assert RunRecord.load(run.parent).path == run  # a config folder: its latest run
    assert [r.run_dir for r in find_runs(tmp_path)] == [run]


def test_the_test_writer_is_the_real_writer_holidays_labels(tmp_path):
    gt = tiny_gt(0, dataset="holidays", protocol="holidays")
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    retrieved = json.loads((run / "retrieved.json").read_text())
    assert (
        tuple(retrieved["labels"])
        == PROTOCOL_LABELS["holidays"]
        == ("positive", "junk", "negative")
    )
    rec = RunRecord.load(run)
    assert rec.protocol == "holidays" and rec.headline().startswith("mAP ")


def test_runner_and_reports_import_the_one_schema():
    from oxbench.pipelines import runner
    from oxbench.report import runs

    assert runner.RUN_FILES is records.RUN_FILES and runs.RUN_FILES is records.RUN_FILES
    assert runner.list_runs is records.list_runs and runs.RunRecord is records.RunRecord
    assert runner.RECORD_FORMAT == runs.RUN_FORMAT == records.RECORD_FORMAT


def test_size_limit_is_checked_before_reading(tmp_path, monkeypatch):
    gt = tiny_gt(0)
    run = write_run(tmp_path, gt, random_ranks(gt, 1))
    monkeypatch.setitem(records.FILE_LIMITS, "retrieved.json", 100)
    with pytest.raises(InputError, match="the limit for this file of a run record is 100"):
        RunRecord.load(run)


def test_writer_writes_every_listed_file(tmp_path):
    gt = tiny_gt(0)
    run = write_run(
        tmp_path, gt, random_ranks(gt, 1), scores=np.ones((gt.n_queries, 100), np.float32)
    )
    names = {p.name for p in run.iterdir()}
    assert set(records.RUN_FILES) <= names and names <= set(records.RUN_FILES) | set(
        records.OPTIONAL_FILES
    )
    assert not [n for n in names if n.startswith(".oxbench-tmp-")]


# -- the run's label (issue 24) ------------------------------------------------------------------


def test_a_record_without_a_label_is_named_by_its_method(tmp_path):
    """Records written before labels still read: their label is their method's name (the records
    layer knows no presets; a new run records the label the runner derived)."""
    gt = tiny_gt(0, n_queries=4)
    run = write_run(tmp_path, gt, random_ranks(gt, 1), method="features-alpha-qe")
    rec = RunRecord.load(run)
    assert "label" not in rec.record and rec.label == "features-alpha-qe"
    assert rec.describe().startswith("features-alpha-qe on roxford5k")
    (summary,) = find_runs(tmp_path)
    assert summary.label == "features-alpha-qe"


def test_the_default_label_is_the_preset_and_the_settings_that_differ() -> None:
    from oxbench.pipelines import resolve_method
    from oxbench.pipelines.presets import preset_label

    changed = resolve_method(
        "features-alpha-qe",
        **{"alpha-qe.k": 2, "descriptor.db_features": "/data/x.npy", "descriptor.layout": "d-n"},
    )
    assert (
        preset_label("features-alpha-qe", changed.to_dict()) == "features-alpha-qe [alpha-qe.k=2]"
    )
    unchanged = resolve_method("features-alpha-qe").to_dict()
    assert preset_label("features-alpha-qe", unchanged) == "features-alpha-qe"
    assert preset_label("someone-elses", unchanged) == "someone-elses"
    # --set rerank= and --set rerank=none are both "no stage": the label says none, not []
    for text in ("", "none"):
        emptied = resolve_method("rootsift-bow-sv", rerank=text).to_dict()
        assert preset_label("rootsift-bow-sv", emptied) == "rootsift-bow-sv [rerank=none]"


@pytest.mark.parametrize(
    "bad", ["a\nb", "a\rb", "tab\t", "nul\x00", "\x1b[31mred", "", "  ", "x" * 121, 7]
)
def test_check_label_refuses_what_is_not_one_short_printable_line(bad):
    with pytest.raises(InputError, match="run label") as exc:
        records.check_label(bad)
    assert "\n" not in str(exc.value)


def test_check_label_accepts_a_short_printable_line():
    for good in ("mine", "features-alpha-qe [whitening=pca]", "α-QE, k=10", "x" * 120):
        assert records.check_label(good) == good


def test_default_label_is_bounded_and_one_line():
    preset = {"name": "p", "family": "f", "a": 1, "nested": {"b": "x"}}
    run = {"name": "p", "family": "f", "a": 2, "nested": {"b": "y\nz" * 100}}
    label = records.default_label("p", run, preset)
    assert label.startswith("p [a=2, nested.b=y?z") and label.endswith("...]")
    assert records.check_label(label) == label


@pytest.mark.parametrize(
    ("n", "source", "tag"),
    [
        (0, None, ""),
        (20, 20, "+20"),
        (999, None, "+999"),
        (1000, 1000, "+1K"),
        (1500, None, "+1.5K"),
        (9_960, None, "+10K"),
        (20_000, None, "+20K"),
        (99_782, "oxford100k", "+100K"),
        (1_001_001, "revisitop1m", "+R1M"),
        (10_000, "revisitop1m", "+R10K"),
        (2_500_000, None, "+2.5M"),
    ],
)
def test_distractor_tag_is_the_count_the_field_writes(n, source, tag):
    from oxbench.records import distractor_tag

    assert distractor_tag(n, source) == tag


def test_compare_help_explains_every_column_it_prints(capsys) -> None:
    """``compare --help`` used to leave p_seeds and holds unexplained."""
    import inspect

    from oxbench.report.compare import Comparison

    code, out, _ = cli(["compare", "--help"], capsys)
    assert code == 0
    # every column name text() can print (the metric and the CI level vary)
    source = inspect.getsource(Comparison.text)
    header_lines = [ln for ln in source.splitlines() if re.search(r"header( \+?=|\.append)", ln)]
    columns = [c for ln in header_lines for c in re.findall(r'"([A-Za-z_][A-Za-z_ -]*)"', ln)]
    assert {"p_seeds", "holds", "better", "p_holm"} <= set(columns), columns
    for column in columns:
        assert re.search(rf"^\s+{re.escape(column)}\s", out, re.M) or f"/ {column}" in out, column
    assert "METRIC A/B" in out and re.search(r"^\s+CI\s", out, re.M)
