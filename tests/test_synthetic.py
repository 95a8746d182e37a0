"""The synthetic benchmark: determinism, labels true by construction, loader, distractor stream."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cv2")
pytest.importorskip("PIL")

from oxbench.datasets.synthetic import (  # noqa: E402
    SynthConfig,
    SyntheticDistractors,
    generate,
    load_synthetic,
    read_manifest,
)
from oxbench.errors import InputError  # noqa: E402
from oxbench.formats.revisitop import read_gnd  # noqa: E402

TINY = SynthConfig(
    name="synthetic", landmarks=3, queries_per_landmark=3, db_size=40, image_size=(160, 120)
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate(tmp_path_factory.mktemp("synth") / "synthetic", TINY, workers=1, progress=False)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_layout(tiny: Path) -> None:
    assert (tiny / "manifest.json").is_file()
    assert (tiny / "gnd_synthetic.pkl").is_file()
    assert not (tiny / ".partial").exists()
    assert len(list((tiny / "jpg").glob("*.jpg"))) == 40 + 9
    for lm in ("abbey", "bank", "cathedral"):
        for n in (1, 2, 3):
            for suffix in ("good", "ok", "junk", "query"):
                assert (tiny / "gt_files" / f"{lm}_{n}_{suffix}.txt").is_file()


def test_same_seed_same_bytes(tiny: Path, tmp_path: Path) -> None:
    again = generate(tmp_path / "synthetic", TINY, workers=2, progress=False)
    assert _files(again) == _files(tiny)


def test_other_seed_or_city_differs(tmp_path: Path) -> None:
    from oxbench.datasets.synthetic.plan import render_db_image

    small = SynthConfig(landmarks=2, db_size=8, image_size=(96, 72))
    a, _ = render_db_image(small, 3)
    b, _ = render_db_image(SynthConfig(landmarks=2, db_size=8, image_size=(96, 72), seed=1), 3)
    c, _ = render_db_image(
        SynthConfig(landmarks=2, db_size=8, image_size=(96, 72), city="elsewhere"), 3
    )
    assert a != b and a != c


def test_images_independent_of_order() -> None:
    from oxbench.datasets.synthetic.plan import render_db_image

    cfg = SynthConfig(landmarks=2, db_size=10, image_size=(96, 72))
    forward = [render_db_image(cfg, i)[0] for i in range(5)]
    backward = [render_db_image(cfg, i)[0] for i in reversed(range(5))][::-1]
    assert forward == backward


def test_labels_consistent(tiny: Path) -> None:
    gt = read_gnd(tiny / "gnd_synthetic.pkl")
    assert gt.protocol == "revisited"
    assert gt.n_db == 40 and gt.n_queries == 9
    assert not set(gt.query_names) & set(gt.db_names)  # queries are not in the database
    for q in gt.queries:
        assert q.easy.size + q.hard.size > 0, q.name
        assert not np.intersect1d(q.easy, q.hard).size
        assert not np.intersect1d(q.easy, q.junk).size
        assert not np.intersect1d(q.hard, q.junk).size
        for arr in (q.easy, q.hard, q.junk):
            assert arr.size == 0 or (arr.min() >= 0 and arr.max() < gt.n_db)
        assert q.bbox is not None
        x1, y1, x2, y2 = q.bbox
        assert 0 <= x1 < x2 <= 159 and 0 <= y1 < y2 <= 119


def test_labels_match_manifest_and_rules(tiny: Path) -> None:
    manifest = read_manifest(tiny)
    assert manifest is not None
    t = manifest["label_thresholds"]
    gt = read_gnd(tiny / "gnd_synthetic.pkl")
    by_name = {rec["name"]: rec for rec in manifest["images"]}
    for q in gt.queries:
        landmark = q.name.split("_q_")[1].rsplit("_", 1)[0]
        for field in ("easy", "hard", "junk"):
            for i in getattr(q, field).tolist():
                rec = by_name[gt.db_names[i]]
                assert rec["kind"] == "landmark" and rec["building"] == landmark
                entry = rec["labels"][q.name]
                assert entry["label"] == field
                if field == "easy":
                    assert entry["visible"] >= t["easy_min_visible"]
                    assert rec["view"]["angle"] <= t["easy_max_angle_deg"]
                    assert entry["scale_change"] <= t["easy_max_scale_change"]
                    assert not rec["view"]["mirror"] and not rec["view"]["night"]
                if field == "hard":
                    assert entry["visible"] >= t["junk_max_visible"] and entry["why"]
        # every image of another building is a negative
        labelled = set(np.concatenate([q.easy, q.hard, q.junk]).tolist())
        for i, name in enumerate(gt.db_names):
            if by_name[name]["building"] != landmark:
                assert i not in labelled


def test_gt_files_match_gnd(tiny: Path) -> None:
    gt = read_gnd(tiny / "gnd_synthetic.pkl")
    q = gt.queries[4]  # bank_2
    d = tiny / "gt_files"
    assert d.joinpath("bank_2_good.txt").read_text().split() == [gt.db_names[i] for i in q.easy]
    assert d.joinpath("bank_2_ok.txt").read_text().split() == [gt.db_names[i] for i in q.hard]
    assert d.joinpath("bank_2_junk.txt").read_text().split() == [gt.db_names[i] for i in q.junk]
    name, *box = d.joinpath("bank_2_query.txt").read_text().split()
    assert name == q.name
    assert np.allclose([float(v) for v in box], q.bbox)


def test_gnd_pickle_is_plain(tiny: Path) -> None:
    obj = pickle.loads((tiny / "gnd_synthetic.pkl").read_bytes())
    assert set(obj) == {"imlist", "qimlist", "gnd"}
    assert set(obj["gnd"][0]) == {"bbx", "easy", "hard", "junk"}


def test_loader_round_trip(tiny: Path) -> None:
    bench = load_synthetic(tiny)
    assert bench.id == "synthetic" and bench.protocols == ("revisited",)
    assert len(bench.database) == 40 and len(bench.queries) == 9
    assert bench.distractors is None
    assert bench.database.name(7) == bench.gt.db_names[7]
    img = bench.database.read(0)
    assert img.shape == (120, 160, 3) and img.dtype == np.uint8
    crop = bench.query_crop(0)
    x1, y1, x2, y2 = bench.gt.queries[0].bbox
    assert crop.shape[1] == round(x2) - round(x1) and crop.shape[0] == round(y2) - round(y1)
    with_distr = load_synthetic(tiny, distractors=5)
    assert with_distr.n_distractors == 5 and with_distr.n_index == 45


def test_loader_refuses_incomplete(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="manifest"):
        load_synthetic(tmp_path)


def test_distractor_stream_indexing() -> None:
    cfg = SynthConfig(landmarks=2, db_size=10, image_size=(96, 72))
    src = SyntheticDistractors(cfg, 1000)
    assert len(src) == 1000 and src.path(3) is None
    a, b = src.read(3), src.read(4)
    assert a.shape == (72, 96, 3) and a.dtype == np.uint8
    assert np.array_equal(a, SyntheticDistractors(cfg, 5).read(3))  # same index, same image
    assert not np.array_equal(a, b)
    assert src.name(3) != src.name(4)
    with pytest.raises(IndexError):
        src.read(1000)


def test_manifest_explains_labels(tiny: Path) -> None:
    manifest = json.loads((tiny / "manifest.json").read_text())
    assert manifest["config"]["db_size"] == 40
    assert manifest["counts"]["labels"]["easy"]["total"] > 0
    rec = next(r for r in manifest["images"] if r["kind"] == "landmark")
    for key in ("yaw", "angle", "zoom", "light", "occluded", "blur", "jpeg"):
        assert key in rec["view"]


def test_the_synth_command_defaults_to_the_default_sets_image_size() -> None:
    from oxbench.cli.synth import synth
    from oxbench.datasets.synthetic.config import DEFAULT_TEST, DEFAULT_TRAIN

    option = next(p for p in synth.params if p.name == "image_size")
    assert (
        option.default
        == "{}x{}".format(*DEFAULT_TEST.image_size)
        == "{}x{}".format(*DEFAULT_TRAIN.image_size)
    )
