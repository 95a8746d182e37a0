"""``oxbench plot``: precision-recall curves by hand, the figures written, the missing-extra message."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.report.plots import RECALL_LEVELS, precision_recall
from oxbench.report.runs import RunRecord
from run_layout import better_ranks, random_ranks, tiny_gt, write_run


def test_precision_recall_by_hand(tmp_path):
    # top 4: easy, negative, negative, easy; 3 easy images in all (one never retrieved)
    q = make_query("q", [0, 0, 1, 1], easy=[0, 3, 7], hard=[5], junk=[2])
    gt = GroundTruth("roxford5k", "revisited", tuple(f"d{i}" for i in range(10)), (q,))
    r = RunRecord.load(write_run(tmp_path, gt, np.array([[0, 1, 4, 3, 2, 5, 6, 7, 8, 9]]), k=4))
    rec, prec, n = precision_recall(r, "easy")
    assert n == 1 and np.array_equal(rec, RECALL_LEVELS)
    expected = np.where(
        RECALL_LEVELS <= 1 / 3 + 1e-12, 1.0, np.where(RECALL_LEVELS <= 2 / 3 + 1e-12, 0.5, 0.0)
    )
    assert np.allclose(prec, expected)
    # medium: 4 positives; list easy, neg, neg, easy -> same precisions, recall in quarters
    _, prec_m, _ = precision_recall(r, "medium")
    assert prec_m[25] == 1.0 and prec_m[26] == 0.5 and prec_m[50] == 0.5 and prec_m[51] == 0.0
    # hard: easy and junk are ignored and the one hard image is below rank 4 -> precision 0
    _, prec_h, _ = precision_recall(r, "hard")
    assert not prec_h.any()


def test_perfect_ranking_precision_one(tmp_path):
    gt = tiny_gt(0)
    r = RunRecord.load(write_run(tmp_path, gt, better_ranks(gt, 0, 99)))
    _, prec, n = precision_recall(r, "medium")
    assert n == gt.n_queries and np.allclose(prec, 1.0)


@pytest.mark.parametrize("fmt, magic", [("png", b"\x89PNG"), ("svg", b"<?xml")])
def test_plot_cli_writes_figures(tmp_path, capsys, fmt, magic):
    gt = tiny_gt(0)
    a = write_run(tmp_path, gt, random_ranks(gt, 1))
    b = write_run(tmp_path, gt, better_ranks(gt, 1, 2), method="qe", config_name="qe")
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(a), "--out", str(tmp_path / "one"), "--format", fmt])
    assert exc.value.code == 0
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(
        f"{n}.{fmt}" for n in ("ap_per_query", "ap_vs_positives", "precision_recall")
    )
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(a), str(b), "--out", str(tmp_path / "two"), "--format", fmt])
    assert exc.value.code == 0
    files = sorted((tmp_path / "two").iterdir())
    assert [p.name for p in files] == sorted(names + [f"ap_scatter.{fmt}"])
    assert all(p.read_bytes().startswith(magic) for p in files)
    capsys.readouterr()


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    gt = tiny_gt(0)
    a = write_run(tmp_path, gt, random_ranks(gt, 1))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(a), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert (
        exc.value.code == 2
        and 'pip install "oxbench[plots]"' in err
        and len(err.strip().splitlines()) == 1
    )
    assert not (tmp_path / "o").exists()


def test_plot_refuses_incomparable_runs(tmp_path, capsys):
    g1, g2 = tiny_gt(0), tiny_gt(4)
    a = write_run(tmp_path / "a", g1, random_ranks(g1, 1))
    b = write_run(tmp_path / "b", g2, random_ranks(g2, 1))
    with pytest.raises(SystemExit) as exc:
        main(["plot", str(a), str(b), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2 and "ground truth differs" in capsys.readouterr().err


def _inside(fig) -> bool:
    """Whether everything drawn (labels, legends, titles) lies inside the figure: nothing cut off."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    drawn = fig.get_tightbbox(canvas.get_renderer())  # inches
    w, h = fig.get_size_inches()
    return drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= w + 0.01 and drawn.y1 <= h + 0.01


def test_figures_fit_their_labels_and_name_the_queries(tmp_path, monkeypatch):
    """Long run labels stay inside ap_scatter, ap_per_query names the queries and stays a
    readable size for ROxford's 70 queries (not 3267 x 352 px)."""
    pytest.importorskip("matplotlib")
    from oxbench.report import plots

    gt = tiny_gt(0, n_queries=70)
    long = "features-alpha-qe [whitening=pca, alpha-qe.k=10, alpha-qe.alpha=3.5, dba.k=5, search=faiss-flat]"
    a = RunRecord.load(write_run(tmp_path, gt, random_ranks(gt, 1), method=long))
    b = RunRecord.load(
        write_run(tmp_path, gt, better_ranks(gt, 1, 2), method=long + " x", config_name="b")
    )
    figs = {}

    def keep(fig, path, fmt):
        figs[path.stem] = fig
        return path

    monkeypatch.setattr(plots, "_save", keep)
    plots.plot_runs(a, tmp_path / "f", other=b)
    for name, fig in figs.items():
        assert _inside(fig), name
    bars = figs["ap_per_query"]
    w, h = bars.get_size_inches() * 110
    assert w <= 14 * 110 and h <= 3 * 4.3 * 110 and w / h < 2
    ticks = [t.get_text() for t in bars.axes[0].get_xticklabels()]
    assert ticks == list(a.query_names)
    scatter = figs["ap_scatter"]
    assert scatter.axes[0].get_xlabel() == "AP of A" and long in scatter.get_supxlabel().replace(
        "\n   ", " "
    )
