"""Synthetic benchmark: resumable/atomic generation, config checks, CLI, registry, label rules, camera."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cv2")
pytest.importorskip("PIL")

from oxbench.datasets.synthetic import SynthConfig, generate, load_synthetic, read_manifest  # noqa: E402
from oxbench.datasets.synthetic.config import LabelThresholds  # noqa: E402
from oxbench.datasets.synthetic.labels import PairFacts, decide_label  # noqa: E402
from oxbench.datasets.synthetic.scene import View, homography, local_scale, project  # noqa: E402
from oxbench.errors import InputError  # noqa: E402

SMALL = SynthConfig(landmarks=2, queries_per_landmark=2, db_size=12, image_size=(96, 72))


class _Stop(Exception):
    pass


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_interrupted_run_never_looks_complete_and_resumes(tmp_path: Path) -> None:
    def stop_after(done: int, total: int) -> None:
        if done == 6:
            raise _Stop

    out = tmp_path / "s"
    with pytest.raises(_Stop):
        generate(out, SMALL, workers=1, progress=False, on_image=stop_after)
    assert read_manifest(out) is None
    with pytest.raises(InputError, match="manifest"):
        load_synthetic(out)
    seen: list[int] = []
    generate(out, SMALL, workers=1, progress=False, on_image=lambda d, t: seen.append(d))
    assert seen[0] == 7  # the six finished images were kept
    fresh = generate(tmp_path / "fresh", SMALL, workers=1, progress=False)
    assert _files(out) == _files(fresh)


def test_corrupt_image_of_interrupted_run_is_redone(tmp_path: Path) -> None:
    def stop_after(done: int, total: int) -> None:
        if done == 5:
            raise _Stop

    out = tmp_path / "s"
    with pytest.raises(_Stop):
        generate(out, SMALL, workers=1, progress=False, on_image=stop_after)
    victim = sorted((out / "jpg").glob("*.jpg"))[0]
    victim.write_bytes(b"garbage")
    generate(out, SMALL, workers=1, progress=False)
    fresh = generate(tmp_path / "fresh", SMALL, workers=1, progress=False)
    assert _files(out) == _files(fresh)


def test_complete_set_is_kept_other_config_refused(tmp_path: Path) -> None:
    out = generate(tmp_path / "s", SMALL, workers=1, progress=False)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    generate(out, SMALL, workers=1, progress=False)  # nothing to do
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    other = SynthConfig(
        landmarks=2, queries_per_landmark=2, db_size=12, image_size=(96, 72), seed=5
    )
    with pytest.raises(InputError, match="another config"):
        generate(out, other, workers=1, progress=False)
    generate(out, other, workers=1, progress=False, overwrite=True)
    manifest = read_manifest(out)
    assert manifest is not None and manifest["config"]["seed"] == 5


def test_interrupted_run_of_other_config_is_cleared(tmp_path: Path) -> None:
    def stop_after(done: int, total: int) -> None:
        if done == 4:
            raise _Stop

    out = tmp_path / "s"
    other = SynthConfig(
        landmarks=2, queries_per_landmark=2, db_size=12, image_size=(96, 72), seed=9
    )
    with pytest.raises(_Stop):
        generate(out, other, workers=1, progress=False, on_image=stop_after)
    generate(out, SMALL, workers=1, progress=False)
    fresh = generate(tmp_path / "fresh", SMALL, workers=1, progress=False)
    assert _files(out) == _files(fresh)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"landmarks": 0},
        {"landmarks": 99},
        {"db_size": 3},  # fewer than two guaranteed views per landmark
        {"image_size": (10, 10)},
        {"city": "Bad City"},
        {"jpeg_quality": (90, 50)},
        {"landmark_fraction": 0.9, "street_fraction": 0.2},
    ],
)
def test_bad_config_refused(kwargs: dict) -> None:
    with pytest.raises(InputError):
        SynthConfig(**kwargs)


def test_config_round_trip() -> None:
    cfg = SynthConfig(
        name="x",
        city="y",
        seed=3,
        image_size=(320, 200),
        labels=LabelThresholds(easy_max_angle_deg=30),
    )
    assert SynthConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(InputError):
        SynthConfig.from_dict({**cfg.to_dict(), "bogus": 1})


def test_other_city_shares_no_building() -> None:
    from oxbench.datasets.synthetic.config import stable_int
    from oxbench.datasets.synthetic.facade import render_facade

    a = render_facade(stable_int("northford"), "landmark", 0, 200).rgba
    b = render_facade(stable_int("southbridge"), "landmark", 0, 200).rgba
    assert a.shape != b.shape or not np.array_equal(a, b)


def test_cli_synth(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from oxbench.cli import cli

    out = tmp_path / "cli"
    args = [
        "data",
        "synth",
        "--out",
        str(out),
        "--landmarks",
        "2",
        "--queries-per-landmark",
        "1",
        "--db-size",
        "6",
        "--image-size",
        "96x72",
        "-j",
        "1",
        "--no-progress",
        "--distractors",
        "3",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "6 database images, 2 queries" in res.output
    bench = load_synthetic(out)
    assert bench.n_distractors == 3 and bench.gt.n_db == 6
    res = CliRunner().invoke(cli, ["data", "synth", "--out", str(out), "--image-size", "big"])
    assert res.exit_code != 0
    train = tmp_path / "train"
    args = [
        "data",
        "synth",
        "--out",
        str(train),
        "--name",
        "synthetic-train",
        "--landmarks",
        "2",
        "--queries-per-landmark",
        "1",
        "--db-size",
        "6",
        "--image-size",
        "96x72",
        "-j",
        "1",
        "--no-progress",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    manifest = read_manifest(train)
    assert manifest is not None and manifest["config"]["city"] == "southbridge"


def test_registry_load(tmp_path: Path) -> None:
    from oxbench.datasets import load

    loaders = pytest.importorskip("oxbench.datasets.loaders")
    assert loaders is not None
    for name, city in (("synthetic", "northford"), ("synthetic-train", "southbridge")):
        generate(
            tmp_path / name,
            SynthConfig(
                name=name,
                city=city,
                landmarks=2,
                queries_per_landmark=1,
                db_size=6,
                image_size=(96, 72),
            ),
            workers=1,
            progress=False,
        )
    bench = load("synthetic", tmp_path)
    assert bench.id == "synthetic" and bench.gt.n_db == 6
    train = load("synthetic-train", tmp_path, distractors=4)
    assert train.n_distractors == 4
    assert not set(train.gt.db_names) & set(bench.gt.db_names)


# ---- label rules ---------------------------------------------------------------------------

T = LabelThresholds()
_ORDER = {"negative": -1, "easy": 0, "hard": 1, "junk": 2}

facts_strategy = st.builds(
    PairFacts,
    same_landmark=st.just(True),
    mirror=st.booleans(),
    visible=st.floats(0, 1),
    angle=st.floats(0, 89),
    scale_change=st.floats(1, 20),
    light=st.floats(0.05, 3),
    night=st.booleans(),
    roll=st.floats(-60, 60),
    blur=st.floats(0, 5),
)


def test_label_rules_golden() -> None:
    assert decide_label(PairFacts(False), T) == "negative"
    assert decide_label(PairFacts(True), T) == "easy"
    assert decide_label(PairFacts(True, visible=T.easy_min_visible - 0.01), T) == "hard"
    assert decide_label(PairFacts(True, visible=T.junk_max_visible - 0.01), T) == "junk"
    assert decide_label(PairFacts(True, angle=T.easy_max_angle_deg + 1), T) == "hard"
    assert decide_label(PairFacts(True, angle=T.junk_min_angle_deg + 1), T) == "junk"
    assert decide_label(PairFacts(True, scale_change=3.0), T) == "hard"
    assert decide_label(PairFacts(True, night=True, light=0.4), T) == "hard"
    assert decide_label(PairFacts(True, light=2.0), T) == "hard"
    assert decide_label(PairFacts(True, mirror=True), T) == "junk"
    assert decide_label(PairFacts(True, roll=-40), T) == "hard"
    assert decide_label(PairFacts(True, blur=3), T) == "hard"


@settings(max_examples=300, deadline=None)
@given(facts_strategy, st.floats(0, 1))
def test_less_visible_is_never_easier(facts: PairFacts, less: float) -> None:
    worse = PairFacts(**{**facts.__dict__, "visible": facts.visible * less})
    assert _ORDER[decide_label(worse, T)] >= _ORDER[decide_label(facts, T)]


@settings(max_examples=300, deadline=None)
@given(facts_strategy, st.floats(0, 30), st.floats(1, 3))
def test_stronger_view_change_is_never_easier(
    facts: PairFacts, more_angle: float, more_scale: float
) -> None:
    worse = PairFacts(
        **{
            **facts.__dict__,
            "angle": min(89.0, facts.angle + more_angle),
            "scale_change": facts.scale_change * more_scale,
        }
    )
    assert _ORDER[decide_label(worse, T)] >= _ORDER[decide_label(facts, T)]


# ---- camera ----------------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(
    st.floats(-60, 60),
    st.floats(-10, 20),
    st.floats(-40, 40),
    st.floats(0.2, 2.5),
    st.floats(0.1, 0.9),
    st.floats(0.1, 0.9),
)
def test_camera_aims_at_target(
    yaw: float, pitch: float, roll: float, zoom: float, tu: float, tv: float
) -> None:
    view = View(yaw=yaw, pitch=pitch, roll=roll, zoom=zoom, target=(tu, tv))
    hom = homography(view, (800, 600), (640, 480))
    pt, front = project(hom, np.array([[tu * 800, tv * 600]]))
    assert front.all()
    assert np.allclose(pt[0], [320, 240], atol=1e-6)


def test_head_on_scale_is_zoom() -> None:
    view = View(zoom=0.5)
    hom = homography(view, (800, 600), (640, 480))
    # 800 facade pixels -> half of a 640-pixel image
    assert math.isclose(local_scale(hom, 400, 300), 0.5 * 640 / 800, rel_tol=1e-9)
    assert math.isclose(View(yaw=30, pitch=0).angle, 30, abs_tol=1e-9)


def test_training_city_without_queries(tmp_path: Path) -> None:
    cfg = SynthConfig(
        name="train",
        city="southbridge",
        landmarks=2,
        queries_per_landmark=0,
        db_size=5,
        image_size=(96, 72),
    )
    out = generate(tmp_path / "train", cfg, workers=1, progress=False)
    bench = load_synthetic(out)
    assert bench.gt.n_queries == 0 and bench.gt.n_db == 5 and len(bench.queries) == 0
    assert bench.database.read(4).shape == (72, 96, 3)


def test_from_dict_refuses_unknown_label_keys() -> None:
    d = SMALL.to_dict()
    d["labels"] = {**d["labels"], "bogus": 1}
    with pytest.raises(InputError):
        SynthConfig.from_dict(d)


def test_visible_fraction_geometry() -> None:
    from oxbench.datasets.synthetic.scene import Rendered, visible_fraction

    size = (640, 480)
    hom = homography(View(zoom=0.5), (800, 600), size)
    clear = Rendered(np.zeros((480, 640, 3), np.uint8), hom, np.zeros((480, 640), np.uint8), 0.0)
    assert visible_fraction(clear, (0, 0, 800, 600), size) == 1.0
    covered = Rendered(clear.image, hom, np.full((480, 640), 255, np.uint8), 1.0)
    assert visible_fraction(covered, (0, 0, 800, 600), size) == 0.0
    # cover the left half of the frame: about half of a centred full-width region is hidden
    half = np.zeros((480, 640), np.uint8)
    half[:, :320] = 255
    part = Rendered(clear.image, hom, half, 0.5)
    assert 0.4 <= visible_fraction(part, (0, 0, 800, 600), size) <= 0.6
    # a close-up shows only part of the facade
    close = Rendered(
        clear.image,
        homography(View(zoom=2.0), (800, 600), size),
        np.zeros((480, 640), np.uint8),
        0.0,
    )
    assert visible_fraction(close, (0, 0, 800, 600), size) < 0.3


def test_guaranteed_views_are_positive_for_every_query() -> None:
    from oxbench.datasets.synthetic.plan import _guaranteed, query_specs, render_db_image

    cfg = SynthConfig(landmarks=2, queries_per_landmark=3, db_size=30, image_size=(160, 120))
    slots = _guaranteed(cfg)
    assert sorted(lm for lm, _ in slots.values()) == [0, 0, 1, 1]
    for i, (lm, intent) in slots.items():
        _, rec = render_db_image(cfg, i)
        labels = {q: e["label"] for q, e in rec["labels"].items()}
        assert set(labels) == {q.name for q in query_specs(cfg) if q.landmark == lm}
        assert set(labels.values()) <= {"easy", "hard"}, (intent, rec["labels"])
        assert all(e["visible"] == 1.0 for e in rec["labels"].values())  # unoccluded, in frame
