"""``oxbench compare | report | export``: contracts, known answers, round trips, one-line refusals."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.formats.revisitop import write_gnd
from oxbench.groundtruth import GroundTruth
from oxbench.report.runs import RunRecord
from run_layout import better_ranks, random_ranks, resync_metrics, tiny_gt, write_run


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def refused(argv, capsys, expect: str) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and expect in err, err


@pytest.fixture
def pair(tmp_path):
    gt = tiny_gt(0, n_queries=12)
    a = write_run(tmp_path, gt, random_ranks(gt, 1), method="bow")
    b = write_run(
        tmp_path,
        gt,
        better_ranks(gt, 1, 2),
        method="bow-sv-qe",
        config_name="roxford5k-bow-sv-qe-1",
    )
    return gt, a, b


# -- compare ------------------------------------------------------------------------------------


def test_compare_json_contract_and_consistency(pair, capsys):
    _, a, b = pair
    code, out, err = run(["compare", a, b, "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert (
        d["baseline"]["method"] == "bow"
        and d["n_resamples"] == 10_000
        and d["multiple_comparisons"] is None
    )
    (c,) = d["comparisons"]
    ra, rb = RunRecord.load(a), RunRecord.load(b)
    for setup in ("easy", "medium", "hard"):
        s = c["setups"][setup]
        assert s["diff"] == pytest.approx(rb.mean(setup) - ra.mean(setup), abs=1e-12)
        assert s["ci_low"] <= s["diff"] <= s["ci_high"]
        assert s["n_better"] + s["n_worse"] + s["n_equal"] == s["n"] == 12
        assert s["exact"] is True and s["p_holm"] == s["p_value"]
        diffs = [x["diff"] for x in s["largest_changes"]]
        assert [abs(v) for v in diffs] == sorted((abs(v) for v in diffs), reverse=True)
    # moving two positives of every query to the top helps every query in medium: exact p = 2 / 2^12
    assert c["setups"]["medium"]["n_better"] == 12
    assert c["setups"]["medium"]["p_value"] == pytest.approx(2 / 4096)


def test_compare_identical_runs_known_answer(tmp_path, capsys):
    gt = tiny_gt(1, n_queries=20)
    ranks = random_ranks(gt, 7)
    a = write_run(tmp_path, gt, ranks, run_id="20240101T000000Z-0001")
    b = write_run(tmp_path, gt, ranks, run_id="20240102T000000Z-0002")
    code, out, _ = run(["compare", a, b, "--json"], capsys)
    assert code == 0
    for s in json.loads(out)["comparisons"][0]["setups"].values():
        assert (
            s["p_value"] == 1.0 and (s["ci_low"], s["ci_high"]) == (0.0, 0.0) and s["n_equal"] == 20
        )
        assert s["largest_changes"] == []


def test_compare_text_and_three_runs_holm(pair, tmp_path, capsys):
    gt, a, b = pair
    c = write_run(
        tmp_path, gt, better_ranks(gt, 2, 1), method="bow-sv", config_name="roxford5k-bow-sv-1"
    )
    code, out, err = run(["compare", a, b, c], capsys)
    assert code == 0, err
    assert "95% CI" in out and "p_holm" in out and "Holm-adjusted over these 2 comparisons" in out
    assert "medium: largest changes" in out and "10,000 resamples" in out
    code, out, _ = run(["compare", a, b, c, "--json", "--setup", "hard"], capsys)
    d = json.loads(out)
    assert d["multiple_comparisons"] == "holm per setup"
    ps = [x["setups"]["hard"]["p_value"] for x in d["comparisons"]]
    holms = [x["setups"]["hard"]["p_holm"] for x in d["comparisons"]]
    assert holms == pytest.approx(
        [min(1, 2 * min(ps)) if p == min(ps) else max(p, min(1, 2 * min(ps))) for p in ps]
    )
    assert list(d["comparisons"][0]["setups"]) == ["hard"]


def test_compare_refusals(pair, tmp_path, capsys):
    gt, a, b = pair
    refused(["compare", a], capsys, "at least two runs")
    other = tiny_gt(9, n_queries=12)
    c = write_run(tmp_path / "o", other, random_ranks(other, 1))
    refused(["compare", a, c], capsys, "ground truth differs")
    par = tiny_gt(0, n_queries=12, dataset="rparis6k")
    refused(
        ["compare", a, write_run(tmp_path / "p", par, random_ranks(par, 1))],
        capsys,
        "dataset 'rparis6k'",
    )
    # a query skipped in one run only
    rows = json.loads((b / "per_query.json").read_text())
    rows[-1]["ap"] = None
    (b / "per_query.json").write_text(json.dumps(rows))
    resync_metrics(b)
    refused(["compare", a, b], capsys, "skipped (no positives) in one run and not the other")
    rec = json.loads((b / "record.json").read_text())
    rec["format"] = 7
    (b / "record.json").write_text(json.dumps(rec))
    refused(["compare", a, b], capsys, "run-record format 7")
    (a / "timings.json").unlink()
    refused(["compare", a, b], capsys, "missing timings.json")
    refused(["compare", tmp_path / "none", b], capsys, "run folder not found")


# -- export -------------------------------------------------------------------------------------


def write_oxford_gt_dir(gt: GroundTruth, folder) -> None:
    """The original-protocol text files of ``gt`` (query images are not in its database)."""
    folder.mkdir()
    for i, q in enumerate(gt.queries):
        stem = folder / f"landmark_{i + 1}"
        x1, y1, x2, y2 = q.bbox
        (stem.parent / f"{stem.name}_query.txt").write_text(f"{q.name} {x1} {y1} {x2} {y2}\n")
        for kind in ("good", "ok", "junk"):
            names = [gt.db_names[j] for j in getattr(q, kind)]
            (stem.parent / f"{stem.name}_{kind}.txt").write_text("".join(n + "\n" for n in names))


def test_export_oxford_round_trip_same_map(tmp_path, capsys):
    gt = tiny_gt(3, protocol="original", dataset="oxford5k", n_queries=9)
    ranks = random_ranks(gt, 4, n_distractors=5)  # distractor names go into the lists too
    run_dir = write_run(tmp_path / "runs", gt, ranks, n_distractors=5)
    write_oxford_gt_dir(gt, tmp_path / "gt")
    code, out, err = run(
        ["export", run_dir, "--format", "oxford", "--out", tmp_path / "lists"], capsys
    )
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "lists").iterdir()) == [
        f"{n}.txt" for n in gt.query_names
    ]
    code, out, err = run(
        [
            "evaluate",
            "oxford",
            "--gt-dir",
            tmp_path / "gt",
            "--ranked-dir",
            tmp_path / "lists",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    got = json.loads(out)
    r = RunRecord.load(run_dir)
    assert got["map"] == pytest.approx(r.mean("original"), abs=1e-12)
    # keyed by query id (landmark_1 ...), in query order
    assert list(got["ap"].values()) == pytest.approx(list(r.per_query("original")), abs=1e-12)
    # a truncated export scores lower (positives fall off the lists)
    run(["export", run_dir, "--format", "oxford", "--out", tmp_path / "top3", "--top", "3"], capsys)
    assert len((tmp_path / "top3" / "q00.txt").read_text().splitlines()) == 3


def test_export_revisitop_round_trip(tmp_path, capsys):
    gt = tiny_gt(2)
    run_dir = write_run(tmp_path, gt, random_ranks(gt, 3))
    write_gnd(gt, tmp_path / "gnd_roxford5k.pkl")
    code, _, err = run(
        ["export", run_dir, "--format", "revisitop", "--out", tmp_path / "r.npy"], capsys
    )
    assert code == 0, err
    exported = np.load(tmp_path / "r.npy")
    assert exported.dtype == np.int64 and np.array_equal(exported, np.load(run_dir / "ranks.npy"))
    code, out, _ = run(
        [
            "evaluate",
            "revisited",
            "--gnd",
            tmp_path / "gnd_roxford5k.pkl",
            "--ranks",
            tmp_path / "r.npy",
            "--json",
        ],
        capsys,
    )
    r = RunRecord.load(run_dir)
    assert {s: v["map"] for s, v in json.loads(out)["setups"].items()} == {
        s: r.mean(s) for s in r.setups
    }
    run(
        ["export", run_dir, "--format", "revisitop", "--out", tmp_path / "r5.npy", "--top", "5"],
        capsys,
    )
    assert np.load(tmp_path / "r5.npy").shape == (5, gt.n_queries)


def test_export_hloc_pairs(tmp_path, capsys):
    gt = tiny_gt(2)
    ranks = random_ranks(gt, 3)
    run_dir = write_run(tmp_path, gt, ranks)
    code, _, err = run(
        ["export", run_dir, "--format", "hloc", "--out", tmp_path / "pairs.txt", "--top", "4"],
        capsys,
    )
    assert code == 0, err
    lines = (tmp_path / "pairs.txt").read_text().splitlines()
    assert len(lines) == 4 * gt.n_queries
    assert lines[5] == f"q01.jpg db{ranks[1, 1]:03d}.jpg"
    run(
        [
            "export",
            run_dir,
            "--format",
            "hloc",
            "--out",
            tmp_path / "p2.txt",
            "--top",
            "1",
            "--suffix",
            "",
        ],
        capsys,
    )
    assert (tmp_path / "p2.txt").read_text().splitlines()[0] == f"q00 db{ranks[0, 0]:03d}"


def test_export_limits_and_refusals(tmp_path, capsys, caplog):
    gt = tiny_gt(2)
    run_dir = write_run(tmp_path, gt, random_ranks(gt, 3), k=10)  # ranks keep 30, names for 10
    refused(
        ["export", run_dir, "--format", "oxford", "--out", tmp_path / "x", "--top", "11"],
        capsys,
        "stores image names for its top 10 only",
    )
    assert not (tmp_path / "x").exists()
    with caplog.at_level(logging.WARNING, logger="oxbench.report.export"):
        code, _, _ = run(["export", run_dir, "--format", "oxford", "--out", tmp_path / "y"], capsys)
    assert code == 0 and "kept 30 results per query" in caplog.text
    (tmp_path / "afile").write_text("")
    refused(
        ["export", run_dir, "--format", "oxford", "--out", tmp_path / "afile"],
        capsys,
        "this path is a file",
    )
    refused(
        ["export", run_dir, "--format", "revisitop", "--out", tmp_path / "y"],
        capsys,
        "this path is a folder",
    )
    refused(
        ["export", run_dir, "--format", "hloc", "--out", tmp_path / "z", "--top", "0"],
        capsys,
        "at least 1",
    )


# -- report -------------------------------------------------------------------------------------


@pytest.fixture
def table_runs(tmp_path):
    ox, par = tiny_gt(0, n_queries=12), tiny_gt(1, n_queries=12, dataset="rparis6k")
    syn = tiny_gt(2, n_queries=12, dataset="synthetic")
    out = {}
    for name, g in (("ox", ox), ("par", par), ("syn", syn)):
        out[f"{name}-base"] = write_run(
            tmp_path, g, random_ranks(g, 1), method="bow", config_name=f"{name}-bow"
        )
        out[f"{name}-good"] = write_run(
            tmp_path, g, better_ranks(g, 1, 3), method="bow-sv-qe", config_name=f"{name}-qe"
        )
    out["ox1m-base"] = write_run(
        tmp_path,
        ox,
        random_ranks(ox, 1, n_distractors=20),
        method="bow",
        config_name="ox1m-bow",
        n_distractors=20,
    )
    return out


def test_report_markdown_layout_and_marks(table_runs, capsys):
    runs = [
        table_runs[k]
        for k in ("syn-base", "ox-base", "ox-good", "par-base", "par-good", "ox1m-base", "syn-good")
    ]
    code, out, err = run(["report", *runs], capsys)
    assert code == 0, err
    lines = out.splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:9] == [
        "method",
        "ROxf M mAP",
        "ROxf M mP@10",
        "ROxf+20 M mAP",
        "ROxf+20 M mP@10",
        "RPar M mAP",
        "RPar M mP@10",
        "ROxf H mAP",
        "ROxf H mP@10",
    ]
    assert header[13:] == [
        "synthetic E mAP",
        "synthetic E mP@10",
        "synthetic M mAP",
        "synthetic M mP@10",
        "synthetic H mAP",
        "synthetic H mP@10",
    ]
    rows = {
        r.strip("|").split("|")[0].strip(): [c.strip() for c in r.strip("|").split("|")[1:]]
        for r in lines[2:4]
    }
    ox_base, ox_good = RunRecord.load(table_runs["ox-base"]), RunRecord.load(table_runs["ox-good"])
    assert (
        rows["bow"][0] == f"{ox_base.mean('medium') * 100:.1f}" and "\u2020" not in rows["bow"][0]
    )
    assert rows["bow-sv-qe"][0] == f"{ox_good.mean('medium') * 100:.1f}\u2020"
    assert rows["bow-sv-qe"][2] == "-"  # no +20 run of that method
    assert "Holm-adjusted" in out and "p < 0.05" in out


def test_report_other_formats_and_no_mark_for_equal_runs(table_runs, tmp_path, capsys):
    same = write_run(
        tmp_path,
        tiny_gt(0, n_queries=12),
        random_ranks(tiny_gt(0, n_queries=12), 1),
        method="<b>bow&copy</b>",
        config_name="same",
    )
    runs = [table_runs["ox-base"], same]
    code, out, _ = run(["report", *runs, "--format", "html"], capsys)
    assert (
        code == 0
        and "&lt;b&gt;bow&amp;copy&lt;/b&gt;" in out
        and "<b>bow" not in out
        and "\u2020" not in out.split("<p>")[0]
    )
    code, out, _ = run(["report", *runs, "--format", "latex"], capsys)
    assert (
        r"\multicolumn{2}{c}{ROxf M}" in out
        and r"\cmidrule(lr){2-3}" in out
        and r"\bottomrule" in out
    )
    code, out, _ = run(
        [
            "report",
            table_runs["ox-base"],
            table_runs["ox-good"],
            "--format",
            "csv",
            "--out",
            tmp_path / "t.csv",
        ],
        capsys,
    )
    assert code == 0
    text = (tmp_path / "t.csv").read_text().splitlines()
    assert text[0].startswith("method,ROxf M mAP,ROxf M mAP p_holm,")
    assert float(text[2].split(",")[2]) < 0.05


def test_report_refuses_duplicate_label(table_runs, tmp_path, capsys):
    gt = tiny_gt(0, n_queries=12)
    dup = write_run(tmp_path, gt, random_ranks(gt, 5), method="bow", config_name="dup")
    refused(["report", table_runs["ox-base"], dup], capsys, "two runs labelled 'bow' on roxford5k")


def test_report_ablation_rows_are_labels_of_one_preset(tmp_path, capsys):
    """Three runs of one preset differing in one setting are three rows, each named by its label,
    in md and LaTeX; compare names them too; only a true duplicate (same label, same dataset) is refused."""
    gt = tiny_gt(0, n_queries=12)
    labels = [
        "features-alpha-qe",
        "features-alpha-qe [whitening=pca]",
        "features-alpha-qe [whitening=lw]",
    ]
    runs = [
        write_run(
            tmp_path,
            gt,
            better_ranks(gt, i, i),
            method="features-alpha-qe",
            config_name=f"c{i}",
            record_overrides={"label": lab},
        )
        for i, lab in enumerate(labels)
    ]
    code, md, err = run(["report", *runs], capsys)
    assert code == 0, err
    rows = [line.split("|")[1].strip() for line in md.splitlines()[2:] if line.startswith("|")]
    assert rows == labels
    code, tex, err = run(["report", *runs, "--format", "latex"], capsys)
    assert code == 0, err
    assert (
        sum(
            line.startswith("features-alpha-qe") and line.endswith(r"\\")
            for line in tex.splitlines()
        )
        == 3
    )
    assert "features-alpha-qe [whitening=pca] &" in tex
    code, out, err = run(["compare", *runs], capsys)
    assert code == 0, err
    assert all(f"= {lab} on roxford5k" in out for lab in labels)
    code, out, err = run(["compare", *runs, "--json"], capsys)
    assert [c["run"]["label"] for c in json.loads(out)["comparisons"]] == labels[1:]
    dup = write_run(
        tmp_path,
        gt,
        random_ranks(gt, 5),
        method="features-alpha-qe",
        config_name="dup",
        record_overrides={"label": labels[1]},
    )
    refused(["report", *runs, dup], capsys, f"two runs labelled {labels[1]!r} on roxford5k")


@pytest.mark.parametrize("label", ["two\nlines", "bell\x07", "x" * 10_000, "   "])
def test_a_recorded_label_that_is_not_one_short_line_is_refused(label, tmp_path, capsys):
    gt = tiny_gt(0, n_queries=4)
    bad = write_run(tmp_path, gt, random_ranks(gt, 5), record_overrides={"label": label})
    refused(["report", bad], capsys, "record.json: 'label': a run label")


def test_a_label_is_text_in_latex_whatever_it_holds(tmp_path, capsys):
    gt = tiny_gt(0, n_queries=4)
    label = r"[ablation] 50% a_b {c} $x$ ~^ & # \ end"
    a = write_run(tmp_path, gt, random_ranks(gt, 1), config_name="a")
    b = write_run(
        tmp_path, gt, random_ranks(gt, 2), config_name="b", record_overrides={"label": label}
    )
    code, tex, err = run(["report", a, b, "--format", "latex"], capsys)
    assert code == 0, err
    row = next(line for line in tex.splitlines() if "ablation" in line)
    assert row.startswith(
        r"{[}ablation] 50\% a\_b \{c\} \$x\$ \textasciitilde{}\textasciicircum{} \& \# "
        r"\textbackslash{} end & "
    )


def test_report_setups_easy_medium_hard_and_a_latex_note_under_the_table(table_runs, capsys):
    runs = [table_runs[k] for k in ("ox-base", "ox-good", "syn-base")]
    code, out, err = run(["report", *runs, "--setups", "easy,medium,hard"], capsys)
    assert code == 0, err
    header = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert header[1:7] == [
        "ROxf E mAP",
        "ROxf E mP@10",
        "ROxf M mAP",
        "ROxf M mP@10",
        "ROxf H mAP",
        "ROxf H mP@10",
    ]
    code, out, _ = run(["report", *runs[:2], "--setups", "hard , Easy"], capsys)
    header = [c.strip() for c in out.splitlines()[0].strip("|").split("|")]
    assert header[1:] == ["ROxf E mAP", "ROxf E mP@10", "ROxf H mAP", "ROxf H mP@10"]
    ox_base = RunRecord.load(table_runs["ox-base"])
    assert out.splitlines()[2].split("|")[2].strip() == f"{ox_base.mean('easy') * 100:.1f}"
    code, tex, _ = run(["report", *runs[:2], "--format", "latex"], capsys)
    lines = tex.splitlines()
    assert lines[0].startswith("% needs \\usepackage{booktabs}") and "threeparttable" in lines[1]
    note = lines[lines.index(r"\begin{tablenotes}[flushleft]\footnotesize") + 1]
    assert note.startswith(r"\item[] $^\dagger$ differs from") and "Holm-adjusted" in note
    assert not [ln for ln in lines[2:] if ln.startswith("%")]  # the note is text, not a comment
    assert lines[-1] == r"\end{threeparttable}"


@pytest.mark.parametrize("bad", ["medium,extreme", "", " , ", "e"])
def test_report_unknown_setup_is_one_line_exit_2(table_runs, capsys, bad):
    refused(["report", table_runs["ox-base"], "--setups", bad], capsys, "--setups: ")
