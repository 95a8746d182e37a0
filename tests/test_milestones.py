"""``oxbench milestones`` (issue 32): the milestone presets as seed groups, the published figures
with their source, and whether each published trend holds against the spread."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.milestones import MILESTONES, TRENDS, choose, settings_for, trend_verdict
from oxbench.pipelines.presets import METHODS


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_every_row_and_trend_names_a_preset_and_cites_its_figure() -> None:
    presets = {m.preset for m in MILESTONES}
    assert presets <= set(METHODS.names())
    for t in TRENDS:
        assert {t.base, t.better} <= presets, t
    # the figures are cited from a file every user has (not "project facts \u00a75"), which quotes them
    published = (Path(__file__).parents[1] / "docs" / "protocols.md").read_text(encoding="utf-8")
    for m in MILESTONES:
        assert "facts" not in m.source and "\u00a7" not in m.source, m
        if m.published is not None:  # a figure is quoted from docs/protocols.md, by its number
            assert "docs/protocols.md" in m.source and f"{m.published:.1f}" in m.source, m
            assert f"{m.published:.1f}" in published, m
    assert [m.published for m in MILESTONES if m.published] == [61.8, 64.7, 71.8, 80.9]
    assert "rootsift-bow-dba-sv-dqe" not in {m.preset for m in choose(None)}  # off by default
    assert [m.preset for m in choose(["rootsift-asmk", "rootsift-bow"])] == [
        "rootsift-bow",
        "rootsift-asmk",
    ]
    with pytest.raises(InputError, match="'nope' is not a milestone preset"):
        choose(["nope"])
    with pytest.raises(InputError, match="'rootsift-bow' is given twice"):
        choose(["rootsift-bow", "rootsift-asmk", "rootsift-bow"])


def test_a_setting_goes_to_the_rows_that_have_it() -> None:
    assert settings_for("rootsift-bow", {"vocabulary.size": 64, "spatial.top_r": 5}) == {
        "vocabulary.size": 64
    }
    assert settings_for("rootsift-bow-sv", {"vocabulary.size": 64, "spatial.top_r": 5}) == {
        "vocabulary.size": 64,
        "spatial.top_r": 5,
    }


def _groups(offsets_a, offsets_b, shift, n_queries=60, noise=0.002):
    rng = np.random.default_rng(11)
    base = rng.uniform(0.2, 0.8, n_queries)
    a = base + np.array(offsets_a)[:, None] + rng.normal(0, noise, (len(offsets_a), n_queries))
    b = (
        base
        + shift
        + np.array(offsets_b)[:, None]
        + rng.normal(0, noise, (len(offsets_b), n_queries))
    )
    return a, b


def test_trend_verdicts_on_known_answers() -> None:
    small = [-0.003, 0.0, 0.003]
    a, b = _groups(small, small, 0.109)
    verdict, text, p_seeds, p_queries = trend_verdict(a, b, n_resamples=2000)
    assert verdict == "holds" and text.startswith("+10.9 (") and p_seeds < 0.01 and p_queries < 0.01
    verdict, text, *_ = trend_verdict(b, a, n_resamples=2000)
    assert verdict == "reversed" and text.startswith("-10.9")
    # one point better on every query, but the seeds move the mAP by +-5
    wide = [-0.05, 0.0, 0.05]
    a, b = _groups(wide, wide[::-1], 0.01)
    verdict, *_ = trend_verdict(a, b, n_resamples=2000)
    assert verdict.startswith("does not hold")
    # a big seed-level effect seen on too few queries to tell (4 queries: p >= 2/16)
    a, b = _groups(small, small, 0.1, n_queries=4)
    verdict, _, _, p_queries = trend_verdict(a, b, n_resamples=2000)
    assert p_queries >= 0.125 and verdict == "does not hold (not significant over 4 queries)"


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--seeds", "0"], "option --seeds: must be in [1, 100]"),
        (["--seeds", "two"], "option --seeds:"),
        (["--methods", "rootsift-bow,nope"], "'nope' is not a milestone preset"),
        (["--set", "vocab_sise=64"], "--set vocab_sise: no milestone preset"),
        (["--alpha", "nan"], "--alpha must be in (0, 1)"),
    ],
)
def test_bad_input_is_one_line(
    args: list[str], why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(
        capsys, "milestones", "--root", str(tmp_path / "none"), "--runs", str(tmp_path / "r"), *args
    )
    assert code == 2 and why in err, err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists() and not (tmp_path / "none").exists()


def test_milestones_on_the_tiny_synthetic_set_end_to_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("cv2")
    from oxbench.milestones import judge
    from oxbench.records import list_runs
    from oxbench.report.seeds import load_entries
    from oxbench.testing import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    t0 = time.perf_counter()
    code, out, err = cli(
        capsys,
        "milestones",
        "--dataset",
        "synthetic",
        "--seeds",
        "2",
        "--root",
        str(root),
        "--cache",
        str(tmp_path / "cache"),
        "--runs",
        str(tmp_path / "runs"),
        "--set",
        "vocabulary.size=64",
        "--workers",
        "1",
        "--resamples",
        "500",
        "--no-progress",
    )
    assert code == 0, err
    assert time.perf_counter() - t0 < 120
    rows = choose(None)
    lines = out.splitlines()
    assert lines[0].startswith("| milestone | preset | synthetic E / M / H (ours, 2 seeds) |")
    for m in rows:
        (line,) = [x for x in lines if x.startswith(f"| {m.label} | {m.preset} |")]
        if m.published is not None:
            assert f"{m.published:.1f} ({m.paper})" in line and "docs/protocols.md" in line
        assert " (" in line and "-" in line  # mean (min-max) of 2 seeds
    groups = {g.method: g for g in load_entries(sorted((tmp_path / "runs").iterdir()))}
    for t in TRENDS:
        if {t.base, t.better} <= {m.preset for m in rows}:
            (line,) = [x for x in lines if x.startswith(f"| {t.claim} |")]
            v = judge(t, groups, n_resamples=500)
            assert v is not None and f"| {v.verdict} ({v.diff_text}) |" in line
            if v.verdict == "holds":
                assert v.p_seeds < 0.05 and v.p_queries < 0.05
    assert "mean (min-max) over 2 seeds" in out
    # each preset is one seed group of two runs, in its own config folder
    folders = sorted((tmp_path / "runs").iterdir())
    assert len(folders) == len(rows)
    assert all(len(list_runs(f)) == 2 for f in folders)
    code, latex, err = cli(
        capsys,
        "milestones",
        "--root",
        str(root),
        "--cache",
        str(tmp_path / "cache"),
        "--runs",
        str(tmp_path / "runs2"),
        "--seeds",
        "2",
        "--methods",
        "rootsift-bow,rootsift-bow-sv",
        "--set",
        "vocabulary.size=64",
        "--format",
        "latex",
        "--workers",
        "1",
        "--no-progress",
    )
    assert code == 0, err
    assert r"\begin{tabular}" in latex and "SV improves BoW" in latex
