"""Seed groups (issue 32): ``oxbench run --seeds``, one config folder, and reports that read a
group as one entry with its spread."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.pipelines import RecordOptions, Session, resolve_method
from oxbench.pipelines.seedgroup import PER_SEED, SeedMember, check_seeds, plan_group
from oxbench.records import RunRecord, flat_settings, list_runs
from oxbench.schema import seed_settings

TINY = {"vocabulary.size": 64}
METHOD = "rootsift-bow"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


# --- what a seed sets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "settings"),
    [
        ("rootsift-bow", ("vocabulary.seed",)),
        ("rootsift-he", ("vocabulary.seed", "he.seed")),
        ("rootsift-asmk", ("vocabulary.seed",)),
        ("features-ivfpq", ("search.seed",)),  # not the CNN's nor VLAD's: files are described
        # a descriptor kind's seed, nested: VLAD's codebook k-means, the CNN's random weights (exact
        # search has no seed: search.seed belongs to the ivfpq kind)
        ("rootsift-vlad", ("descriptor.vocabulary.seed",)),
        ("gem-r18-synthetic", ("descriptor.seed",)),
    ],
)
def test_a_member_sets_every_seed_setting_of_its_method(
    preset: str, settings: tuple[str, ...]
) -> None:
    m = resolve_method(preset)
    members = plan_group(m, (4, 9), {})
    assert [mb.seed for mb in members] == [4, 9]
    assert {mb.group for mb in members} == {members[0].group}  # one group id
    for mb in members:
        assert set(mb.settings) == set(settings) == {n for n in seed_settings(m) if m.applies(n)}
        seeded = mb.apply(m)
        assert {k: v for k, v in seed_settings(seeded).items() if k in settings} == dict.fromkeys(
            mb.settings, mb.seed
        )
        # nothing else changes (nested settings by their dotted names)
        rest = {k: v for k, v in flat_settings(seeded.to_dict()).items() if k not in settings}
        assert rest == {k: v for k, v in flat_settings(m.to_dict()).items() if k not in settings}
        # the folder config is the same for every member: the seeds are replaced
        folder = mb.folder_config({"dataset": "x", "method": seeded.to_dict()})
        assert folder["repeat"] == {"axis": "seed", "settings": list(mb.settings)}
        assert all(flat_settings(folder["method"])[k] == PER_SEED for k in settings)
    folders = [mb.folder_config({"method": mb.apply(m).to_dict()}) for mb in members]
    assert folders[0] == folders[1]


def test_a_seed_setting_set_by_hand_is_refused_with_seeds() -> None:
    m = resolve_method("rootsift-he")
    with pytest.raises(InputError, match="--set he.seed does not apply with --seeds"):
        plan_group(m, (0, 1), {"he.seed": 3})


def test_seed_lists_are_checked_as_values_and_as_text() -> None:
    assert check_seeds([2, 0]) == (2, 0) and check_seeds("0,1") == (0, 1)
    for bad in ([], [-1], [1, 1], [0.5], list(range(101)), [True]):
        with pytest.raises(InputError, match="seeds"):
            check_seeds(bad)


# --- a group run end to end ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("faiss")
    pytest.importorskip("cv2")
    from oxbench.pipelines import run
    from oxbench.testing import make_tiny_root

    tmp = tmp_path_factory.mktemp("group")
    root = make_tiny_root(tmp / "data")
    out = run(
        "synthetic",
        METHOD,
        overrides=TINY,
        seeds=[0, 1, 2],
        session=Session(root=root, cache=tmp / "cache", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp / "runs"),
    )
    other = run(
        "synthetic",
        METHOD,
        overrides={"vocabulary.size": 32},
        seeds="0,1,2",
        session=Session(root=root, cache=tmp / "cache", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp / "runs-b"),
    )
    return {"root": root, "tmp": tmp, "outcome": out, "other": other}


def test_a_group_is_one_config_folder_with_one_run_per_seed(group: dict) -> None:
    out = group["outcome"]
    assert len(out.group) == 3 and out is not out.group[0] and out.run_dir == out.group[-1].run_dir
    (config_dir,) = (group["tmp"] / "runs").iterdir()
    assert {o.config_dir for o in out.group} == {config_dir}
    assert sorted(list_runs(config_dir)) == sorted(o.run_dir for o in out.group)
    folder_config = json.loads((config_dir / "config.json").read_text())
    assert folder_config["method"]["vocabulary"]["seed"] == PER_SEED
    assert folder_config["repeat"] == {"axis": "seed", "settings": ["vocabulary.seed"]}
    ids = set()
    for seed, o in zip((0, 1, 2), out.group, strict=True):
        record = json.loads((o.run_dir / "record.json").read_text())
        run_config = json.loads((o.run_dir / "config.json").read_text())
        assert run_config["method"]["vocabulary"]["seed"] == seed  # each run keeps its own seed
        assert record["seeds"]["vocabulary.seed"] == seed
        # the synthetic set's generation seed is the same for every member
        assert record["seeds"]["dataset.seed"] == out.group[0].record["seeds"]["dataset.seed"]
        assert record["seed_group"]["seed"] == seed
        assert record["seed_group"]["seeds"] == [0, 1, 2]
        assert record["label"] == "rootsift-bow [vocabulary.size=64]"  # one label for the group
        ids.add(record["seed_group"]["id"])
        # the vocabulary depends on the seed; the local features do not and are shared
        assert record["cache"]["vocabulary"] == "computed"
        assert record["cache"]["features"] == ("computed" if seed == 0 else "hit")
    assert len(ids) == 1
    # the seeds gave different vocabularies and so (here) different rankings
    ranks = [np.load(o.run_dir / "ranks.npy") for o in out.group]
    assert not np.array_equal(ranks[0], ranks[1])


def test_reports_read_a_group_as_one_entry(group: dict) -> None:
    from oxbench.report.seeds import SeedGroup, load_entries

    out = group["outcome"]
    config_dir = out.config_dir
    # the config folder, or any member, names the whole group
    for path in (config_dir, out.group[0].run_dir, out.group[2].run_dir):
        (entry,) = load_entries([path])
        assert isinstance(entry, SeedGroup) and entry.seeds == (0, 1, 2)
    (g,) = load_entries([out.group[0].run_dir, out.group[1].run_dir])  # one group, one entry
    maps = [o.result.setups["medium"].map for o in out.group]
    np.testing.assert_allclose(g.member_means("medium"), maps)
    assert g.mean("medium") == pytest.approx(np.mean(maps))
    lo, hi = min(maps) * 100, max(maps) * 100
    assert g.spread("medium") == f"{np.mean(maps) * 100:.2f} ({lo:.2f}-{hi:.2f})"
    # the seed-mean per query averages the members' per-query APs
    per_query = np.stack([RunRecord.load(o.run_dir).per_query("hard") for o in out.group])
    np.testing.assert_allclose(g.per_query("hard"), per_query.mean(axis=0))


def test_runs_lists_a_group_as_one_row(group: dict, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = cli(capsys, "runs", str(group["tmp"] / "runs"), "--json")
    assert code == 0, stderr
    (row,) = json.loads(stdout)
    assert (
        row["n_seeds"] == 3
        and row["seed_group"] == group["outcome"].group[0].record["seed_group"]["id"]
    )
    assert "[mean (min-max) over 3 seeds]" in row["headline"]


def test_a_group_with_a_missing_member_is_one_line(
    group: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.report.seeds import load_entries

    copy = tmp_path / "runs" / "grp"
    shutil.copytree(group["outcome"].config_dir, copy)
    shutil.rmtree(copy / group["outcome"].group[1].run_dir.name)
    with pytest.raises(InputError, match=r"missing seed\(s\) 1 of 3"):
        load_entries([copy])
    code, stdout, stderr = cli(capsys, "report", str(copy))
    assert code == 2 and "missing seed(s) 1 of 3" in stderr and len(stderr.splitlines()) == 1
    code, stdout, stderr = cli(capsys, "runs", str(tmp_path / "runs"))
    assert code == 0 and "incomplete seed group" in stdout


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--seeds", ""], "option --seeds: expected at least one seed"),
        (["--seeds", "0,-1"], "option --seeds: seed 2: must be in"),
        (["--seeds", "0,1,0"], "seed 0 is given twice"),
        (["--seeds", ",".join(map(str, range(10**6)))], "option --seeds:"),
        (["--repeat", "0"], "option --repeat: must be in [1, 100]"),
        (["--repeat", "2", "--seeds", "0,1"], "give --seeds or --repeat, not both"),
        (["--seeds", "0,1", "--partition", "0/2"], "do not apply to --partition"),
        (["--seeds", "0,1", "--set", "vocabulary.seed=3"], "--set vocabulary.seed does not apply"),
    ],
)
def test_bad_seed_options_are_one_line_and_exit_2(
    args: list[str], why: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stdout, stderr = cli(
        capsys,
        "run",
        "--root",
        str(tmp_path / "nodata"),
        "--out",
        str(tmp_path / "r"),
        "--method",
        "rootsift-bow",
        *args,
    )
    assert code == 2 and why in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr
    assert not (tmp_path / "r").exists() and not (tmp_path / "nodata").exists()


def test_a_method_without_seeds_is_refused_with_seeds() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class NoSeed:
        name: str = "fixed"

    with pytest.raises(InputError, match="fixed has no seed setting"):
        plan_group(NoSeed(), (0, 1), {})


def test_the_member_record_is_checked(group: dict, tmp_path: Path) -> None:
    src = group["outcome"].group[0].run_dir
    bad = tmp_path / "r" / src.name
    shutil.copytree(src, bad)
    record = json.loads((bad / "record.json").read_text())
    record["seed_group"]["seed"] = 7
    (bad / "record.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match="seed 7 is not one of its seeds"):
        RunRecord.load(bad)
    record["seed_group"]["seeds"] = [0, 0]
    (bad / "record.json").write_text(json.dumps(record))
    with pytest.raises(InputError, match="given twice"):
        RunRecord.load(bad)
    assert SeedMember("g", 0, (0,), ("vocabulary.seed",)).to_dict()["settings"] == [
        "vocabulary.seed"
    ]


def test_compare_of_two_groups_tests_seeds_and_queries(
    group: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.evaluation.bootstrap import two_level_test
    from oxbench.report.seeds import load_entries

    a, b = group["outcome"].config_dir, group["other"].config_dir
    code, stdout, stderr = cli(capsys, "compare", str(a), str(b), "--json", "--resamples", "2000")
    assert code == 0, stderr
    got = json.loads(stdout)
    assert got["baseline"]["seeds"] == [0, 1, 2] and len(got["baseline"]["runs"]) == 3
    (comparison,) = got["comparisons"]
    ga, gb = load_entries([a, b])
    for setup, row in comparison["setups"].items():
        want = two_level_test(
            ga.per_query_matrix(setup), gb.per_query_matrix(setup), n_resamples=2000, seed=0
        )
        assert row["two_level"]["p_value"] == pytest.approx(want.p_value)
        assert row["two_level"]["diff"] == pytest.approx(gb.mean(setup) - ga.mean(setup))
        # the query-level test runs on the seed-averaged per-query values
        assert row["mean_a"] == pytest.approx(np.nanmean(ga.per_query(setup)))
        assert row["holds"] == (max(row["p_holm"], row["p_seeds_holm"]) < 0.05)
    code, stdout, _ = cli(capsys, "compare", str(a), str(b), "--resamples", "500")
    assert code == 0 and "p_seeds" in stdout and "holds" in stdout
    assert "mean (min-max) over 3 seeds" in stdout


def test_report_shows_the_spread_of_each_group(
    group: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.report.seeds import load_entries

    a, b = group["outcome"].config_dir, group["other"].config_dir
    code, stdout, stderr = cli(capsys, "report", str(a), str(b), "--resamples", "500")
    assert code == 0, stderr
    ga, gb = load_entries([a, b])
    maps = 100 * ga.member_means("medium")
    cell = f"{maps.mean():.1f} ({maps.min():.1f}-{maps.max():.1f})"
    assert cell in stdout
    assert "mean (min-max) over 3 seeds" in stdout and "two-level bootstrap" in stdout
    code, latex, _ = cli(capsys, "report", str(a), str(b), "--format", "latex", "--resamples", "50")
    assert code == 0 and cell in latex


def test_groups_of_different_datasets_are_refused(
    group: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other"
    shutil.copytree(group["other"].config_dir, other)
    for run_dir in list_runs(other):
        ds = json.loads((run_dir / "dataset.json").read_text())
        ds["id"] = "elsewhere"
        (run_dir / "dataset.json").write_text(json.dumps(ds))
    code, _, stderr = cli(capsys, "compare", str(group["outcome"].config_dir), str(other))
    assert code == 2 and "dataset 'elsewhere' differs" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_plot_draws_a_group_as_one_entry(group: dict, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from oxbench.report.plots import plot_runs, precision_recall
    from oxbench.report.seeds import load_entries

    ga, gb = load_entries([group["outcome"].config_dir, group["other"].config_dir])
    written = plot_runs(ga, tmp_path / "fig", other=gb)
    assert {p.stem for p in written} >= {"ap_per_query", "precision_recall", "ap_scatter"}
    curves = [precision_recall(m, "medium")[1] for m in ga.members]
    np.testing.assert_allclose(precision_recall(ga, "medium")[1], np.mean(curves, axis=0))


def test_overwrite_replaces_the_earlier_runs_once_not_each_member(
    group: dict, tmp_path: Path
) -> None:
    from oxbench.pipelines import run

    out = tmp_path / "grp"
    shutil.copytree(group["outcome"].config_dir, out)
    assert len(list_runs(out)) == 3
    again = run(
        "synthetic",
        METHOD,
        overrides=TINY,
        seeds=[5, 6],
        session=Session(
            root=group["root"], cache=group["tmp"] / "cache", workers=1, progress=False
        ),
        record=RecordOptions(out=out, overwrite=True),
    )
    assert sorted(list_runs(out)) == sorted(o.run_dir for o in again.group)
    assert [o.record["seeds"]["vocabulary.seed"] for o in again.group] == [5, 6]
