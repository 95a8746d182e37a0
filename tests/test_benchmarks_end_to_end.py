"""Every benchmark family end to end: ``oxbench run --dataset holidays|ukbench|oxford5k|paris6k``
with a classic and a global preset on tiny folders in each benchmark's real layout, the printed
line the community reports, Holidays' rotated copy, and ``oxbench evaluate localization``.

The layouts are filled with the tiny synthetic city's photographs (rendered buildings, so local
features match as on real photos): Holidays groups and UKBench objects are a query's photograph
plus database photographs of its landmark; the Oxford / Paris text ground truth lists the
synthetic labels (good = Easy, ok = Hard, junk = Unclear) with the query photographs as database
images, as in Oxford 5K. The real images of the shared data folder are a smoke test.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from oxbench.cli import main
from oxbench.datasets import load
from oxbench.groundtruth import GroundTruth
from test_pipeline import make_tiny_root

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

CLASSIC = [
    "--method",
    "rootsift-bow-sv",
    "--vocab-size",
    "200",
    "--max-side",
    "320",
    "--top-r",
    "20",
]
GLOBAL = ["--method", "rootsift-vlad", "--set", "descriptor.vocabulary.size=8", "--max-side", "320"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def one_error(err: str) -> bool:
    """Whether stderr holds exactly one error line (besides the partial-set count warnings)."""
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING ")]
    return len(lines) == 1 and lines[0].startswith("oxbench: error: ")


def _positives(gt: GroundTruth, qi: int, n: int) -> list[str]:
    q = gt.queries[qi]
    return [gt.db_names[i] for i in q.easy.tolist()[:n]]


def build_layouts(root: Path) -> Path:
    """holidays/, ukbench/, oxford5k/, paris6k/ (and the synthetic cities) under ``root``."""
    make_tiny_root(root)
    jpg = root / "synthetic" / "jpg"
    gt = load("synthetic", root, progress=False).gt

    # Holidays: one group per landmark: a query's photograph (the group's query) and three positives
    hol = root / "holidays"
    names = []
    for qi in (0, 2):  # the first query of each landmark
        group = [gt.query_names[qi], *_positives(gt, qi, 3)]
        for j, src in enumerate(group):
            name = f"{1000 + qi}{j:02d}"
            names.append(name)
            for folder in ("jpg", "jpg_rotated"):
                (hol / folder).mkdir(parents=True, exist_ok=True)
                shutil.copy(jpg / f"{src}.jpg", hol / folder / f"{name}.jpg")
    (hol / "holidays_images.dat").write_text("\n".join(f"{n}.jpg" for n in names) + "\n")

    # UKBench: two objects (the landmarks), four photographs each
    uk = root / "ukbench" / "jpg"
    uk.mkdir(parents=True)
    i = 0
    for qi in (0, 2):  # the first query of each landmark
        for src in [gt.query_names[qi], *_positives(gt, qi, 3)]:
            shutil.copy(jpg / f"{src}.jpg", uk / f"ukbench{i:05d}.jpg")
            i += 1

    # Oxford 5K / Paris 6K: text ground truth; the query photographs are database images
    for ds, gt_dir, prefix, city in (
        ("oxford5k", "gt_files_170407", "", "synthetic"),
        ("paris6k", "paris_120310", "paris_", "synthetic-train"),
    ):
        bench = load(city, root, progress=False)
        cg, src_dir = bench.gt, root / city / "jpg"
        ddir = root / ds
        (ddir / gt_dir).mkdir(parents=True)
        (ddir / "jpg").mkdir()
        rename = {n: f"{prefix}{n.replace('_q_', '_')}" for n in (*cg.db_names, *cg.query_names)}
        for n, new in rename.items():
            shutil.copy(src_dir / f"{n}.jpg", ddir / "jpg" / f"{new}.jpg")
        for q in cg.queries:
            qid = q.name.split("_q_", 1)[1]  # <landmark>_<n>
            assert q.bbox is not None
            x1, y1, x2, y2 = q.bbox
            written = rename[q.name] if ds == "paris6k" else f"oxc1_{rename[q.name]}"
            (ddir / gt_dir / f"{qid}_query.txt").write_text(f"{written} {x1} {y1} {x2} {y2}\n")
            others = [
                rename[o.name]
                for o in cg.queries
                if o.name != q.name and o.name.rsplit("_", 1)[0] == q.name.rsplit("_", 1)[0]
            ]
            # as in Oxford 5K, a query's own photograph is one of its good images
            good = [rename[q.name], *(rename[cg.db_names[i]] for i in q.easy.tolist()), *others]
            lists = {
                "good": good,
                "ok": [rename[cg.db_names[i]] for i in q.hard.tolist()],
                "junk": [rename[cg.db_names[i]] for i in q.junk.tolist()],
            }
            if ds == "paris6k":  # as published: every positive in ok, empty good files
                lists = {"good": [], "ok": lists["good"] + lists["ok"], "junk": lists["junk"]}
            for kind, items in lists.items():
                (ddir / gt_dir / f"{qid}_{kind}.txt").write_text("".join(f"{n}\n" for n in items))

    # Oxford 100K: photographs of the training city, in a nested folder as the archive has them
    for i, src in enumerate(sorted((root / "synthetic-train" / "jpg").glob("*.jpg"))[:12]):
        dest = root / "oxford100k" / "jpg" / f"oxc2_{i % 3}" / src.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_layouts(tmp_path_factory.mktemp("benchmarks"))


LINES = {
    "holidays": re.compile(r"holidays: mAP \d+\.\d\d\Z"),
    "ukbench": re.compile(r"ukbench: score [0-4]\.\d{4} \(of 4\), mAP \d+\.\d\d"),
    "oxford5k": re.compile(r"oxford5k: mAP \d+\.\d\d"),
    "paris6k": re.compile(r"paris6k: mAP \d+\.\d\d"),
}


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["holidays", "ukbench", "oxford5k", "paris6k"])
@pytest.mark.parametrize("preset", ["classic", "global"])
def test_each_benchmark_runs_end_to_end_and_prints_its_line(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], dataset: str, preset: str
) -> None:
    args = CLASSIC if preset == "classic" else GLOBAL
    code, out, err = cli(
        capsys,
        "run",
        "--dataset",
        dataset,
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--out",
        str(tmp_path / "run"),
        "--cache",
        str(root / "_cache"),
        *args,
    )
    assert code == 0, err
    first = out.splitlines()[0]
    assert LINES[dataset].match(first), first
    metrics = json.loads(next((tmp_path / "run").glob("2*/metrics.json")).read_text())
    # the photographs of one building find each other: well above chance on every benchmark
    if dataset == "ukbench":
        assert metrics["score"] > 2.0 and f"score {metrics['score']:.4f} (of 4)" in first, first
    else:
        value = float(re.search(r"mAP (\d+\.\d\d)", first).group(1))  # type: ignore[union-attr]
        assert value == pytest.approx(100 * metrics["map"], abs=0.006) and metrics["map"] > 0.5, (
            first
        )
    boxes = list((tmp_path / "run").glob("2*/boxes.json"))
    assert bool(boxes) == (preset == "classic")  # spatial verification predicts boxes


@pytest.mark.slow
def test_oxford5k_with_the_oxford100k_distractors(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(
        capsys,
        "run",
        "--dataset",
        "oxford5k",
        "--distractors",
        "oxford100k",
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--out",
        str(tmp_path / "d"),
        "--cache",
        str(root / "_cache"),
        *CLASSIC,
    )
    assert code == 0, err
    assert LINES["oxford5k"].match(out.splitlines()[0]), out
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["distractors"] == "oxford100k" and config["n_distractors"] == 12
    retrieved = json.loads(next((tmp_path / "d").glob("2*/retrieved.json")).read_text())
    n_db = len(list((root / "oxford5k" / "jpg").glob("*.jpg")))
    assert any(
        t["index"] >= n_db for q in retrieved["queries"] for t in q["top"]
    )  # distractors are ranked


@pytest.mark.slow
def test_holidays_rotated_copy_is_an_option_and_recorded(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        "run",
        "--dataset",
        "holidays",
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--cache",
        str(root / "_cache"),
        *CLASSIC,
    ]
    code, out, err = cli(
        capsys, *common, "--dataset-option", "orientation=rotated", "--out", str(tmp_path / "rot")
    )
    assert code == 0, err
    assert out.startswith("holidays: mAP ")
    config = json.loads((tmp_path / "rot" / "config.json").read_text())
    assert config["dataset_options"] == {"orientation": "rotated"}
    dataset = json.loads(next((tmp_path / "rot").glob("2*/dataset.json")).read_text())
    assert dataset["option.orientation"] == "rotated"
    # a rotated copy that misses a file: one line, exit 2
    broken = tmp_path / "broken"
    shutil.copytree(root / "holidays", broken / "holidays")
    next((broken / "holidays" / "jpg_rotated").glob("*.jpg")).unlink()
    (broken / "synthetic-train").symlink_to(root / "synthetic-train")
    code, _, err = cli(
        capsys,
        "run",
        "--dataset",
        "holidays",
        "--root",
        str(broken),
        "--allow-partial",
        "--no-progress",
        "--dataset-option",
        "orientation=rotated",
        "--out",
        str(tmp_path / "b"),
        *CLASSIC,
    )
    assert code == 2 and "1 of 8 image(s) of holidays are missing" in err and one_error(err)
    for bad, words in (
        ("orientation=sideways", "must be one of original, rotated"),
        ("colour=red", "has no option"),
        ("novalue", "--dataset-option takes KEY=VALUE"),
    ):
        code, _, err = cli(capsys, *common, "--dataset-option", bad, "--out", str(tmp_path / "x"))
        assert code == 2 and words in err and one_error(err), err


@pytest.mark.slow
def test_localization_of_the_classic_default_on_oxford_layout_and_refusals(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(
        capsys,
        "run",
        "--dataset",
        "oxford5k",
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--out",
        str(tmp_path / "ox"),
        "--cache",
        str(root / "_cache"),
        *CLASSIC,
    )
    assert code == 0, err
    run_dir = str(next((tmp_path / "ox").glob("2*")))
    code, out, err = cli(capsys, "evaluate", "localization", run_dir, "--root", str(root))
    assert code == 0, err
    # 2 queries per landmark: each query has one pair, the other query's photograph
    assert re.match(
        r"oxford5k: localization mIoU: \d+\.\d\d, IoU>=0\.5: \d+\.\d\d \(4 pairs over 4 queries",
        out,
    ), out
    payload = json.loads(
        cli(capsys, "evaluate", "localization", run_dir, "--root", str(root), "--json")[1]
    )
    assert payload["truth"] == "other queries" and payload["miou"] > 0.5, payload

    # Holidays has no query boxes: one line, exit 2
    code, _, err = cli(
        capsys,
        "run",
        "--dataset",
        "holidays",
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--out",
        str(tmp_path / "hol"),
        "--cache",
        str(root / "_cache"),
        *CLASSIC,
    )
    assert code == 0, err
    code, _, err = cli(
        capsys,
        "evaluate",
        "localization",
        str(next((tmp_path / "hol").glob("2*"))),
        "--root",
        str(root),
    )
    assert code == 2 and "has no box" in err and one_error(err), err

    # a predicted box outside its image, a malformed boxes.json: one line, exit 2
    boxes_path = Path(run_dir) / "boxes.json"
    doc = json.loads(boxes_path.read_text())
    for per in doc["queries"].values():
        for entry in per.values():
            entry["box"] = [0, 0, 5000, 10]
    q, per = next(iter(doc["queries"].items()))
    d = next(iter(per))
    boxes_path.write_text(json.dumps(doc))
    code, _, err = cli(capsys, "evaluate", "localization", run_dir, "--root", str(root))
    assert code == 2 and "lies outside the 320x240 image" in err and one_error(err), err
    boxes_path.write_text(
        json.dumps({"predictor": "x", "queries": {q: {d: {"box": [0, 0, "a", 1]}}}})
    )
    code, _, err = cli(capsys, "evaluate", "localization", run_dir, "--root", str(root))
    assert code == 2 and 'expected {"box": [x1, y1, x2, y2]}' in err and one_error(err), err


@pytest.mark.slow
def test_localization_of_the_classic_default_on_the_synthetic_set(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = cli(
        capsys,
        "run",
        "--root",
        str(root),
        "--no-progress",
        "--out",
        str(tmp_path / "syn"),
        "--cache",
        str(root / "_cache"),
        "--vocab-size",
        "200",
        "--max-side",
        "320",
        "--top-r",
        "20",
    )
    assert code == 0, err
    run_dir = str(next((tmp_path / "syn").glob("2*")))
    payload = json.loads(
        cli(capsys, "evaluate", "localization", run_dir, "--root", str(root), "--json")[1]
    )
    gt = load("synthetic", root, progress=False).gt
    assert payload["truth"] == "generated" and payload["n_pairs"] == sum(
        q.positives.size for q in gt.queries
    )
    assert payload["miou"] > 0.6 and payload["n_predicted"] > payload["n_pairs"] // 2, payload


def test_synthetic_region_boxes_use_the_rendered_homography(tmp_path: Path) -> None:
    """The boxes come from the plan alone; the homography is the one the renderer used."""
    import numpy as np

    from oxbench.datasets.synthetic.config import SynthConfig
    from oxbench.datasets.synthetic.plan import _facade_size, plan_db_image, query_region_boxes
    from oxbench.datasets.synthetic.rand import rng_for
    from oxbench.datasets.synthetic.scene import homography, project, render_view

    config = SynthConfig(
        db_size=12, landmarks=2, queries_per_landmark=2, image_size=(320, 240), generic_buildings=4
    )
    shown = [i for i in range(12) if plan_db_image(config, i).kind == "landmark"]
    assert shown
    for i in shown[:2]:
        plan = plan_db_image(config, i)
        rendered = render_view(
            config.city_seed,
            "landmark",
            plan.building,
            plan.view,
            config.image_size,
            rng_for(config.city_seed, config.seed, "db-scene", i),
        )
        fw, fh = _facade_size(config, "landmark", plan.building)
        np.testing.assert_array_equal(
            rendered.hom, homography(plan.view, (fw, fh), config.image_size)
        )
        for name, box in query_region_boxes(config, i).items():
            assert 0 <= box[0] < box[2] <= 320 and 0 <= box[1] < box[3] <= 240, (name, box)
            if not plan.view.mirror:  # a box inside the frame holds the region's projected corners
                from oxbench.datasets.synthetic.plan import query_specs

                rect = next(q.rect for q in query_specs(config) if q.name == name)
                pts, front = project(
                    rendered.hom, np.array([[rect[0], rect[1]], [rect[2], rect[3]]])
                )
                for (x, y), f in zip(pts, front, strict=True):
                    if f and 0 <= x <= 320 and 0 <= y <= 240:
                        assert (
                            box[0] - 0.01 <= x <= box[2] + 0.01
                            and box[1] - 0.01 <= y <= box[3] + 0.01
                        )


@pytest.mark.shared_data
@pytest.mark.slow
def test_smoke_on_the_real_holidays_and_ukbench_images(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The three real Holidays images (one group) and eight real UKBench images (two objects)."""
    root = tmp_path / "data"
    make_tiny_root(root)  # the training city of the vocabulary
    hol = root / "holidays"
    (hol / "jpg").mkdir(parents=True)
    names = sorted(p.name for p in (shared_data / "holidays" / "images").glob("*.jpg"))
    for n in names:
        shutil.copy(shared_data / "holidays" / "images" / n, hol / "jpg" / n)
    (hol / "holidays_images.dat").write_text("\n".join(names) + "\n")
    uk = root / "ukbench" / "jpg"
    uk.mkdir(parents=True)
    for i in range(8):
        shutil.copy(
            shared_data / "ukbench" / "images" / f"ukbench{i:05d}.jpg", uk / f"ukbench{i:05d}.jpg"
        )
    for dataset, line in (("holidays", LINES["holidays"]), ("ukbench", LINES["ukbench"])):
        code, out, err = cli(
            capsys,
            "run",
            "--dataset",
            dataset,
            "--root",
            str(root),
            "--allow-partial",
            "--no-progress",
            "--out",
            str(tmp_path / dataset),
            "--cache",
            str(root / "_cache"),
            *CLASSIC,
        )
        assert code == 0, err
        assert line.match(out.splitlines()[0]), out


def real_oxford_query_subset(shared_data: Path, root: Path) -> int:
    """``<root>/oxford5k/``: the ten real full-size Oxford query images (pitt_rivers_1..5 and
    radcliffe_camera_1..5) as the database, and their real text ground truth restricted to them."""
    src = shared_data / "oxford5k"
    names = sorted(p.stem for p in (src / "images_demo").glob("*.jpg"))
    ddir = root / "oxford5k"
    (ddir / "jpg").mkdir(parents=True)
    (ddir / "gt_files_170407").mkdir()
    for n in names:
        shutil.copy(src / "images_demo" / f"{n}.jpg", ddir / "jpg" / f"{n}.jpg")
    kept = set(names)
    n_queries = 0
    for qfile in sorted((src / "gt_files_170407").glob("*_query.txt")):
        if qfile.read_text().split()[0].removeprefix("oxc1_") not in kept:
            continue
        n_queries += 1
        qid = qfile.name.removesuffix("_query.txt")
        shutil.copy(qfile, ddir / "gt_files_170407" / qfile.name)
        for kind in ("good", "ok", "junk"):
            lines = (src / "gt_files_170407" / f"{qid}_{kind}.txt").read_text().split()
            (ddir / "gt_files_170407" / f"{qid}_{kind}.txt").write_text(
                "".join(f"{n}\n" for n in lines if n in kept)
            )
    return n_queries


@pytest.mark.shared_data
@pytest.mark.slow
def test_localization_on_the_real_oxford_query_images(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tolias et al.'s protocol on real photographs: each query's crop located in the other four
    query images of its landmark, scored against their real boxes."""
    root = tmp_path / "data"
    make_tiny_root(root)  # the vocabulary's training city
    assert real_oxford_query_subset(shared_data, root) == 10
    code, out, err = cli(
        capsys,
        "run",
        "--dataset",
        "oxford5k",
        "--root",
        str(root),
        "--allow-partial",
        "--no-progress",
        "--train-dataset",
        "synthetic-train",
        "--out",
        str(tmp_path / "run"),
        "--method",
        "rootsift-bow-sv",
        "--vocab-size",
        "1000",
    )
    assert code == 0, err
    assert LINES["oxford5k"].match(out.splitlines()[0]), out
    run_dir = str(next((tmp_path / "run").glob("2*")))
    code, out, err = cli(capsys, "evaluate", "localization", run_dir, "--root", str(root), "--json")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["n_pairs"] == 40 and payload["truth"] == "other queries"
    assert payload["miou"] > 0.4, payload  # real photographs: most boxes found, not all
    print(cli(capsys, "evaluate", "localization", run_dir, "--root", str(root))[1])
