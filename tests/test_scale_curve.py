"""bench/scale_curve.py's arithmetic: the query time taken from a run's timings and the linear
projection to 1M, against hand-made numbers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def curve():  # noqa: ANN201 - the bench module
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("scale_curve", BENCH / "scale_curve.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def test_query_time_is_ranking_plus_the_query_stages_per_query(curve) -> None:
    timings = {
        "load": 9.0,
        "features": 50.0,
        "features_cpu": 90.0,
        "assign": 3.0,
        "index": 2.0,
        "search": 0.5,
        "search_cpu": 0.4,
        "spatial": 10.0,
        "spatial_cpu": 18.0,
        "aqe-verified": 2.0,
        "total": 99.0,
        "vocabulary": 7.0,
        "train_features": 20.0,
        "evaluate": 0.1,
    }
    q = curve.query_seconds(timings, 10)
    assert q["rank_s"] == 0.05 and q["rank_cpu_s"] == pytest.approx(0.04)
    assert q["rerank_s"] == pytest.approx(1.2) and q["rerank_cpu_s"] == pytest.approx(1.8)
    assert q["query_s"] == pytest.approx(1.25)


def _point(n: int, ram: float, disk: float, rank: float) -> dict:
    return {
        "n_index": n,
        "ram_bytes": 1000 + ram * n,
        "fixed_ram_bytes": 1000,
        "disk_bytes": 50 + disk * n,
        "fixed_disk_bytes": 50,
        "rank_s": rank,
        "rerank_s": 0.2,
    }


def test_projection_is_fixed_plus_the_fitted_bytes_per_image_and_time_from_the_largest_size(
    curve,
) -> None:
    points = [
        _point(1000, 300.0, 40_000.0, 0.001),
        _point(2000, 300.0, 40_000.0, 0.0015),
        _point(6000, 300.0, 40_000.0, 0.006),
    ]
    pr = curve.project(points, 1_001_000)
    assert pr["ram_bytes_per_image"] == pytest.approx(300.0)
    assert pr["ram_bytes"] == pytest.approx(1000 + 300.0 * 1_001_000, rel=1e-9)
    assert pr["disk_bytes"] == pytest.approx(50 + 40_000.0 * 1_001_000, rel=1e-9)
    assert pr["rank_s"] == pytest.approx(0.006 * 1_001_000 / 6000) and pr[
        "rerank_s"
    ] == pytest.approx(0.2)
    one = curve.project([_point(500, 10.0, 20.0, 0.01)], 5000)
    assert one["ram_bytes"] == pytest.approx(1000 + 10.0 * 5000) and one["rank_s"] == pytest.approx(
        0.1
    )
    text = curve.table(
        [
            {
                **points[0],
                "method": "m",
                "distractors": 0,
                "map": {"easy": 1, "medium": 2, "hard": 3},
                "query_s": 0.2,
                "ram_bytes_per_image": 300.0,
                "disk_bytes_per_image": 4e4,
                "run_cpu_s": 5.0,
            }
        ],
        {"m": pr},
    )
    assert "| m | 0 | 1,000 | 1.00 | 2.00 | 3.00 |" in text and "| m | 1,001,000 | 0.28 |" in text


def test_the_figure_is_redrawn_from_the_measured_table_in_the_readme(curve, tmp_path) -> None:
    """``--redraw bench/README.md`` reads every row of the measured table (nothing re-run) and draws
    the three panels (mAP, query time, RAM) with the legend outside them."""
    pytest.importorskip("matplotlib")
    points = curve.readme_points(BENCH / "README.md")
    assert len(points) == 16 and {p["method"] for p in points} == set(
        curve.DEFAULT_METHODS.split(",")
    )
    sv20 = next(
        p for p in points if p["method"] == "rootsift-bow-sv" and p["distractors"] == 20_000
    )
    assert sv20["n_index"] == 21_000 and sv20["map"]["medium"] == 58.61
    assert sv20["query_s"] == pytest.approx(0.7163) and sv20["rerank_s"] == pytest.approx(0.7095)
    assert sv20["ram_bytes_per_image"] == pytest.approx(21.0 * 1024)
    curve.plot(points, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
