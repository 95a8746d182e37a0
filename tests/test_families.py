"""Dataset families: each catalog entry's family on a tiny layout (ground truth, needed images,
load), no string dispatch, crop and progress on the synthetic path, evaluation that never generates."""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from oxbench.datasets import DATASETS, DatasetSpec, get_spec, load, load_ground_truth, verify
from oxbench.errors import InputError
from test_datasets import make_oxford, make_revisited, write_jpeg
from test_pipeline import make_tiny_root

pytest.importorskip("PIL.Image")

SRC = Path(__file__).resolve().parents[1] / "src" / "oxbench" / "datasets"


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny generated test and training city (read-only for the tests: copy before changing)."""
    return make_tiny_root(tmp_path_factory.mktemp("synth"))


# --- tiny layouts of every kind -----------------------------------------------------------------


def _holidays(root: Path) -> None:
    ddir = root / "holidays"
    names = ["100000", "100001", "100002", "100100", "100101"]
    ddir.mkdir(parents=True)
    (ddir / "holidays_images.dat").write_text("\n".join(f"{n}.jpg" for n in names))
    for i, n in enumerate(names):
        write_jpeg(ddir / "jpg" / f"{n}.jpg", seed=400 + i)


def _ukbench(root: Path) -> None:
    for i in range(8):
        write_jpeg(root / "ukbench" / "jpg" / f"ukbench{i:05d}.jpg", seed=i)


def _paris(root: Path) -> None:
    ddir = root / "paris6k"
    gt = ddir / "paris_120310"
    gt.mkdir(parents=True)
    (gt / "louvre_1_query.txt").write_text("paris_louvre_000000 1 1 20 12\n")
    (gt / "louvre_1_good.txt").write_text("")
    (gt / "louvre_1_ok.txt").write_text("paris_louvre_000001\n")
    (gt / "louvre_1_junk.txt").write_text("")
    for i in range(3):
        write_jpeg(ddir / "jpg" / f"paris_louvre_{i:06d}.jpg", seed=i)


def _r1m(root: Path) -> None:
    make_revisited(root / "roxford5k")
    entries = ["b/x/0002.jpg", "a/y/0001"]  # listed order, not sorted
    (root / "revisitop1m").mkdir()
    (root / "revisitop1m" / "revisitop1m.txt").write_text("\n".join(entries) + "\n")
    for i, e in enumerate(entries):
        write_jpeg(root / "revisitop1m" / "jpg" / (e if e.endswith(".jpg") else e + ".jpg"), seed=i)


def _oxford100k(root: Path) -> None:
    make_oxford(root / "oxford5k")
    for i, rel in enumerate(["z/9.jpg", "a/1.jpg", "m.jpg"]):  # sorted: a/1, m, z/9
        write_jpeg(root / "oxford100k" / "jpg" / rel, seed=i)


BUILDERS: dict[str, Callable[[Path], object]] = {
    "oxford5k": lambda r: make_oxford(r / "oxford5k"),
    "paris6k": _paris,
    "roxford5k": lambda r: make_revisited(r / "roxford5k"),
    "rparis6k": lambda r: make_revisited(r / "rparis6k", dataset="rparis6k"),
    "revisitop1m": _r1m,
    "oxford100k": _oxford100k,
    "holidays": _holidays,
    "ukbench": _ukbench,
}

#: (n_db, n_queries, n_distractors, first database name, first distractor name) once loaded
EXPECTED = {
    "oxford5k": (8, 1, 0, "all_souls_000000", None),
    "paris6k": (3, 1, 0, "paris_louvre_000000", None),
    "roxford5k": (8, 2, 0, "all_souls_000000", None),
    "rparis6k": (8, 2, 0, "paris_louvre_000000", None),
    "revisitop1m": (8, 2, 2, "all_souls_000000", "b/x/0002"),
    "oxford100k": (8, 1, 3, "all_souls_000000", "a/1"),
    "holidays": (5, 2, 0, "100000", None),
    "ukbench": (8, 8, 0, "ukbench00000", None),
}


def test_every_entry_names_a_family_object_and_no_string_dispatch_is_left() -> None:
    from oxbench.datasets.families.distractors import Distractors
    from oxbench.datasets.spec import DatasetFamily

    fields = {f.name for f in dataclasses.fields(DatasetSpec)}
    assert (
        "family" in fields and "loader" not in fields and not hasattr(DatasetSpec, "resolve_loader")
    )
    # the successors' copies are their families' example copies (check_dataset, test_gldv2/ilias)
    successors = {"gldv2-retrieval", "ilias"}
    assert set(BUILDERS) | {"synthetic", "synthetic-train"} | successors == set(DATASETS.names())
    for i in DATASETS:
        assert isinstance(get_spec(i).family, DatasetFamily)
    # R1M's listed order vs Oxford 100K's sorted names is a declared property of the entry
    r1m, ox100k = get_spec("revisitop1m").family, get_spec("oxford100k").family
    assert (
        isinstance(r1m, Distractors)
        and r1m.order == "listed"
        and r1m.list_file == "revisitop1m.txt"
    )
    assert isinstance(ox100k, Distractors) and ox100k.order == "sorted"
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        assert not re.search(r"spec\.id\s*==|\.id\s*==\s*\"", text), path
        assert "resolve_loader" not in text and 'loader="' not in text, path


@pytest.mark.parametrize("dataset", sorted(BUILDERS))
def test_each_family_loads_its_tiny_layout(dataset: str, tmp_path: Path) -> None:
    BUILDERS[dataset](tmp_path)
    n_db, n_q, n_distr, first, first_distr = EXPECTED[dataset]
    spec = get_spec(dataset)
    if n_distr:  # a distractor set: no ground truth, loaded behind the set it is for
        with pytest.raises(InputError, match="is a distractor set"):
            load_ground_truth(dataset, tmp_path)
        with pytest.raises(InputError, match="is a distractor set; load it with"):
            load(dataset, tmp_path)
        b = load(spec.distractors_for[0], tmp_path, strict=False, distractors=dataset)
        assert b.distractors is not None and b.distractors.name(0) == first_distr
    else:
        b = load(dataset, tmp_path, strict=False, progress=False)
        gt = load_ground_truth(dataset, tmp_path, strict=False)
        assert gt.db_names == b.gt.db_names and gt.n_queries == b.gt.n_queries
        assert b.protocols == spec.protocols and b.root == tmp_path / dataset
    assert (b.gt.n_db, b.gt.n_queries, b.n_distractors) == (n_db, n_q, n_distr)
    assert b.database.name(0) == first and b.database.read(0).ndim == 3
    # the images verify checks: every image on disk, and (but for UKBench, whose names are fixed
    # without a list: 10,200 of them) nothing that is not there
    ddir = tmp_path / dataset
    plan = spec.family.verify_plan(spec, ddir)
    on_disk = {p.relative_to(ddir).as_posix() for p in (ddir / "jpg").rglob("*.jpg")}
    assert on_disk <= set(plan.files)
    missing = verify(dataset, tmp_path, progress=False).missing
    assert len(missing) == (10_200 - 8 if dataset == "ukbench" else 0)


@pytest.mark.parametrize("dataset", ["roxford5k", "holidays"])
def test_ground_truth_needs_no_image(dataset: str, tmp_path: Path) -> None:
    BUILDERS[dataset](tmp_path)
    shutil.rmtree(tmp_path / dataset / "jpg")
    gt = load_ground_truth(dataset, tmp_path, strict=False)
    assert gt.n_db > 0
    with pytest.raises(InputError, match="missing"):
        load(dataset, tmp_path, strict=False)


def test_ukbench_ground_truth_from_the_count_alone(tmp_path: Path) -> None:
    (tmp_path / "ukbench").mkdir()
    assert load_ground_truth("ukbench", tmp_path).n_db == 10_200  # strict: the official set
    with pytest.raises(InputError, match="not on disk"):
        load_ground_truth("ukbench", tmp_path / "elsewhere")


# --- synthetic: crop, progress, and evaluation that never generates -----------------------------


def test_synthetic_load_keeps_crop_and_progress_off(
    synth_root: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    py = load("synthetic", synth_root, progress=False)
    ml = load("synthetic", synth_root, crop="matlab", progress=False)
    assert py.crop == "python" and ml.crop == "matlab" and ml.describe()["crop"] == "matlab"
    assert py.query_crop(0).shape != ml.query_crop(0).shape  # MATLAB's box is one pixel larger
    train = load("synthetic-train", synth_root, crop="matlab", progress=False, distractors=3)
    assert train.crop == "matlab" and train.n_distractors == 3
    assert capfd.readouterr().err == ""
    with pytest.raises(InputError, match="number of generated distractors"):
        load("synthetic", synth_root, distractors="revisitop1m", progress=False)


def _tiny_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default cities made tiny, so building them on first use takes a second."""
    from oxbench.datasets.synthetic import loader
    from oxbench.datasets.synthetic.config import SynthConfig

    common = {
        "landmarks": 2,
        "image_size": (160, 120),
        "generic_buildings": 4,
        "queries_per_landmark": 1,
    }
    monkeypatch.setattr(loader, "DEFAULT_TEST", SynthConfig(db_size=24, **common))
    monkeypatch.setattr(
        loader,
        "DEFAULT_TRAIN",
        SynthConfig(name="synthetic-train", city="southbridge", seed=1, db_size=12, **common),
    )


@pytest.mark.parametrize("progress", [False, True])
def test_load_builds_the_default_on_first_use_with_progress_as_asked(
    progress: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    _tiny_defaults(monkeypatch)
    b = load("synthetic", tmp_path, progress=progress, crop="matlab")
    assert b.gt.n_db == 24 and b.crop == "matlab"
    assert (tmp_path / "synthetic-train" / "manifest.json").is_file()  # both cities, as run needs
    err = capfd.readouterr().err
    assert ("synth synthetic" in err) == progress


def test_ground_truth_of_an_absent_synthetic_set_says_how_to_make_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tiny_defaults(monkeypatch)
    with pytest.raises(
        InputError, match=r"not generated here; make it with `oxbench data synth .*oxbench run"
    ):
        load_ground_truth("synthetic", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_evaluate_on_an_empty_root_generates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.cli import main

    _tiny_defaults(monkeypatch)
    empty = tmp_path / "empty"
    empty.mkdir()
    ranks = tmp_path / "r.npy"
    np.save(ranks, np.zeros((5, 3), dtype=np.int64))
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "evaluate",
                "revisited",
                "--dataset",
                "synthetic",
                "--root",
                str(empty),
                "--ranks",
                str(ranks),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1 and "oxbench data synth" in err
    assert list(empty.iterdir()) == []


def test_synthetic_ground_truth_reads_the_generated_set(synth_root: Path) -> None:
    from oxbench.datasets.families.synthetic import Synthetic

    gt = load_ground_truth("synthetic", synth_root)
    assert gt.db_names == load("synthetic", synth_root, progress=False).gt.db_names
    assert isinstance(get_spec("synthetic").family, Synthetic) and get_spec("synthetic").synthetic


# --- verify a generated set against its manifest ------------------------------------------------


def test_verify_synthetic_against_its_manifest(synth_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(synth_root / "synthetic", root / "synthetic")
    rep = verify("synthetic", root, progress=False)
    assert rep.ok, rep.summary()
    assert rep.counts["database images"] == {"expected": 40, "found": 40, "listed": 40}
    assert rep.counts["query images"] == {"expected": 4, "found": 4, "listed": 4}
    assert rep.checksums_ok == ["gnd_synthetic.pkl"] and rep.n_images_checked == 44
    jpg = root / "synthetic" / "jpg"
    names = sorted(p.stem for p in jpg.glob("*.jpg"))
    # a valid JPEG with other pixels, a deleted image, a changed ground-truth file
    tampered, deleted = names[3], names[7]
    (jpg / f"{tampered}.jpg").write_bytes((jpg / f"{names[4]}.jpg").read_bytes())
    (jpg / f"{deleted}.jpg").unlink()
    gnd = root / "synthetic" / "gnd_synthetic.pkl"
    gnd.write_bytes(gnd.read_bytes() + b"\n")
    for decode in (True, False):
        rep = verify("synthetic", root, progress=False, decode=decode)
        assert not rep.ok and rep.changed == [tampered] and rep.missing == [deleted]
        assert len(rep.checksums) == 1 and "gnd_synthetic.pkl" in rep.checksums[0]
        found = rep.counts["database images"]["found"] + rep.counts["query images"]["found"]
        assert found == 43
        assert any(
            line.startswith("  changed since generation: 1 image(s)") for line in rep.summary()
        )


def test_verify_an_absent_synthetic_set_says_how_to_make_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="oxbench data synth --name synthetic-train"):
        verify("synthetic-train", tmp_path, progress=False)
    (tmp_path / "synthetic").mkdir()  # an interrupted generation: no manifest yet
    with pytest.raises(InputError, match="not generated here"):
        verify("synthetic", tmp_path, progress=False)
