"""Catalog, import, load and verify on small datasets built here in the official layouts."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest

from oxbench.datasets import DATASETS, get_spec, import_dataset, load, verify
from oxbench.datasets.families._oxford_paris import PARIS_CORRUPT
from oxbench.datasets.lock import LockFile
from oxbench.errors import InputError

PIL = pytest.importorskip("PIL.Image")


# --- builders of tiny datasets in the official layouts -------------------------------------------


def write_jpeg(
    path: Path, seed: int, size: tuple[int, int] = (24, 16), exif_orientation: int | None = None
) -> Path:
    """A tiny random JPEG (optionally with an EXIF orientation tag)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = PIL.fromarray(arr)
    if exif_orientation is not None:
        exif = PIL.Exif()
        exif[0x0112] = exif_orientation
        im.save(path, "JPEG", exif=exif.tobytes())
    else:
        im.save(path, "JPEG")
    return path


def make_revisited(folder: Path, dataset: str = "roxford5k", n_db: int = 8, n_q: int = 2) -> dict:
    """``gnd_<dataset>.pkl`` + ``jpg/`` as revisitop lays them out (official pickle format)."""
    prefix = "all_souls" if dataset == "roxford5k" else "paris_louvre"
    imlist = [f"{prefix}_{i:06d}" for i in range(n_db)]
    qimlist = [f"{prefix}_q{i:05d}" for i in range(n_q)]
    gnd = [
        {"bbx": [1.0, 2.0, 15.0, 12.0], "easy": [0, 1], "hard": [2], "junk": [3]},
        {"bbx": [0.0, 0.0, 20.0, 10.0], "easy": [], "hard": [4, 5], "junk": []},
    ][:n_q]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"gnd_{dataset}.pkl").write_bytes(
        pickle.dumps({"imlist": imlist, "qimlist": qimlist, "gnd": gnd}, protocol=2)
    )
    for i, name in enumerate(imlist + qimlist):
        write_jpeg(folder / "jpg" / f"{name}.jpg", seed=i)
    return {"imlist": imlist, "qimlist": qimlist, "gnd": gnd}


def make_oxford(folder: Path) -> list[str]:
    """``gt_files_170407``-style text files + images (Oxford's ``oxc1_`` query prefix)."""
    names = [f"all_souls_{i:06d}" for i in range(6)] + ["oxford_000001", "oxford_000002"]
    gt = folder / "gt_files_170407"
    gt.mkdir(parents=True)
    (gt / "all_souls_1_query.txt").write_text("oxc1_all_souls_000000 1.5 2.5 20.2 14.0\n")
    (gt / "all_souls_1_good.txt").write_text(
        "all_souls_000000\nall_souls_000001\nall_souls_000001\n"
    )
    (gt / "all_souls_1_ok.txt").write_text("all_souls_000002\n")
    (gt / "all_souls_1_junk.txt").write_text("all_souls_000003\n")
    for i, n in enumerate(names):
        write_jpeg(folder / "jpg" / f"{n}.jpg", seed=100 + i)
    return names


def make_paris_archives(folder: Path) -> list[str]:
    """Paris as published: ``paris_1.tgz`` with ``paris/<landmark>/*.jpg`` (incl. 2 corrupt files)
    and ``paris_120310.tgz`` with the text files (empty *_good.txt)."""
    src = folder / "src"
    names = [f"paris_louvre_{i:06d}" for i in range(5)]
    for i, n in enumerate(names):
        write_jpeg(src / "paris" / "louvre" / f"{n}.jpg", seed=200 + i)
    for bad in PARIS_CORRUPT[:2]:
        (src / "paris" / "louvre" / f"{bad}.jpg").write_bytes(b"\xff\xd8\xff\xe0 broken")
    gt = src / "gt"
    gt.mkdir()
    (gt / "louvre_1_query.txt").write_text(
        "paris_louvre_000000 1.000000 1.000000 20.000000 12.000000\n"
    )
    (gt / "louvre_1_good.txt").write_text("")
    (gt / "louvre_1_ok.txt").write_text("paris_louvre_000000\nparis_louvre_000001\n")
    (gt / "louvre_1_junk.txt").write_text("paris_louvre_000002\n")
    with tarfile.open(folder / "paris_1-v1.tgz", "w:gz") as tf:
        tf.add(src / "paris", arcname="paris")
    with tarfile.open(folder / "paris_120310.tgz", "w:gz") as tf:
        for p in sorted(gt.iterdir()):
            tf.add(p, arcname=p.name)
    return names


# --- catalog -------------------------------------------------------------------------------------


def test_catalog_has_every_benchmark_with_spec_counts() -> None:
    from oxbench.datasets.spec import DatasetFamily

    ids = set(DATASETS.names())
    assert {
        "oxford5k",
        "paris6k",
        "roxford5k",
        "rparis6k",
        "revisitop1m",
        "oxford100k",
        "holidays",
        "ukbench",
        "synthetic",
        "synthetic-train",
    } <= ids
    counts = {
        i: (get_spec(i).n_images, get_spec(i).n_queries) for i in ids if not get_spec(i).synthetic
    }
    assert counts == {
        "oxford5k": (5063, 55),
        "paris6k": (6392, 55),
        "roxford5k": (4993, 70),
        "rparis6k": (6322, 70),
        "revisitop1m": (1_001_001, 0),
        "oxford100k": (99_782, 0),
        "holidays": (1491, 500),
        "ukbench": (10_200, 10_200),
        "gldv2-retrieval": (761_757, 1_129),  # 379 Public + 750 Private with index matches
        "ilias": (4_715, 1_232),  # positives (distractors apart) and image queries
    }
    r1m = get_spec("revisitop1m")
    archives = [f.name for f in r1m.files if f.archive]
    assert archives == [f"revisitop1m.{i}.tar.gz" for i in range(1, 101)]
    assert "revisitop1m" in get_spec("roxford5k").belongs_with
    assert get_spec("roxford5k").protocols == ("revisited",) and get_spec("oxford5k").protocols == (
        "original",
    )
    assert len(PARIS_CORRUPT) == len(set(PARIS_CORRUPT)) == 20
    for i in ids:
        s = get_spec(i)
        assert s.terms and "lock" in s.checksum_policy or s.synthetic or not s.files
        assert isinstance(s.family, DatasetFamily) and not hasattr(s, "loader")
        for f in s.files:
            assert all(u.startswith(("http://", "https://", "ftp://")) for u in f.urls)
    with pytest.raises(InputError, match="unknown dataset 'oxford6k'; known: .*roxford5k"):
        get_spec("oxford6k")


@pytest.mark.shared_data
def test_paris_corrupt_list_matches_shared_data(shared_data: Path) -> None:
    names = (shared_data / "paris6k" / "corrupt_reconstructed.txt").read_text().split()
    assert sorted(n.removesuffix(".jpg") for n in names) == sorted(PARIS_CORRUPT)


def test_space_needed_counts_archives_in_flight(tmp_path: Path) -> None:
    from oxbench.datasets.prepare import space_needed

    files = list(get_spec("revisitop1m").files)
    gb = 1_000_000_000
    content = 100 * 3 * gb + 40_000_000
    assert space_needed(files, tmp_path, jobs=4, keep_archives=False) == content + 4 * 3 * gb
    assert space_needed(files, tmp_path, jobs=4, keep_archives=True) == content + 100 * 3 * gb
    (tmp_path / "downloads").mkdir()
    (tmp_path / "downloads" / "revisitop1m.7.tar.gz.part").write_bytes(b"x" * 1000)
    assert (
        space_needed(files[:1] + files[7:8], tmp_path, jobs=1, keep_archives=False)
        == 40_000_000 + 2 * 3 * gb - 1000
    )


# --- load ----------------------------------------------------------------------------------------


def test_load_revisited_small(tmp_path: Path) -> None:
    make_revisited(tmp_path / "roxford5k")
    with pytest.raises(InputError, match="has 8 database images, expected 4993"):
        load("roxford5k", tmp_path)
    b = load("roxford5k", tmp_path, strict=False)
    assert b.protocols == ("revisited",) and b.gt.n_db == 8 and b.gt.n_queries == 2
    assert b.queries.name(0) == "all_souls_q00000" and b.gt.queries[0].bbox == (
        1.0,
        2.0,
        15.0,
        12.0,
    )
    assert b.gt.queries[0].easy.tolist() == [0, 1] and b.gt.queries[0].junk.tolist() == [3]
    assert b.database.path(3) == tmp_path / "roxford5k" / "jpg" / "all_souls_000003.jpg"
    crop = b.query_crop(0)
    assert crop.shape == (10, 14, 3)  # python convention: [2, 12) x [1, 15)
    assert b.describe()["option.strict"] == "false"
    from oxbench.datasets import load_ground_truth

    (tmp_path / "roxford5k" / "jpg" / "all_souls_000000.jpg").unlink()  # scoring needs no image
    gt = load_ground_truth("roxford5k", tmp_path, strict=False)
    assert gt.db_names == b.gt.db_names and gt.protocol == "revisited"


def test_load_missing_files_name_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not on disk; get it with `oxbench data fetch roxford5k"):
        load("roxford5k", tmp_path)
    make_revisited(tmp_path / "roxford5k")
    (tmp_path / "roxford5k" / "jpg" / "all_souls_000005.jpg").unlink()
    with pytest.raises(
        InputError, match=r"1 of 8 image\(s\) .*all_souls_000005.jpg.*oxbench data import"
    ):
        load("roxford5k", tmp_path, strict=False)
    with pytest.raises(InputError, match="has no option 'orientation'"):
        load("roxford5k", tmp_path, orientation="rotated")
    with pytest.raises(InputError, match="is a distractor set"):
        load("revisitop1m", tmp_path)


def test_crop_conventions_differ_by_one_pixel(tmp_path: Path) -> None:
    make_revisited(tmp_path / "roxford5k", n_q=1)
    # Replace the query image by a lossless image whose pixels encode their coordinates.
    h, w = 10, 20
    yy, xx = np.mgrid[0:h, 0:w]
    arr = np.stack([xx * 10, yy * 20, np.zeros_like(xx)], axis=-1).astype(np.uint8)
    qpath = tmp_path / "roxford5k" / "jpg" / "all_souls_q00000.jpg"
    PIL.fromarray(arr).save(qpath, "PNG")  # Pillow reads by content, not by name
    gnd = pickle.loads((tmp_path / "roxford5k" / "gnd_roxford5k.pkl").read_bytes())
    gnd["gnd"][0]["bbx"] = [2.2, 1.2, 10.2, 6.2]
    (tmp_path / "roxford5k" / "gnd_roxford5k.pkl").write_bytes(pickle.dumps(gnd, protocol=2))
    py = load("roxford5k", tmp_path, strict=False).query_crop(0)
    ml = load("roxford5k", tmp_path, strict=False, crop="matlab").query_crop(0)
    np.testing.assert_array_equal(py, arr[1:6, 2:10])  # exclusive right/bottom edge, rounded
    np.testing.assert_array_equal(ml, arr[1:7, 2:11])  # MATLAB: inclusive edge, one pixel more
    assert load("roxford5k", tmp_path, strict=False, crop="matlab").describe()["crop"] == "matlab"


def test_load_original_oxford(tmp_path: Path) -> None:
    names = make_oxford(tmp_path / "oxford5k")
    b = load("oxford5k", tmp_path, strict=False)
    assert b.gt.protocol == "original" and b.gt.db_names == tuple(sorted(names))
    q = b.gt.queries[0]
    assert q.name == "all_souls_000000" and q.bbox == (1.5, 2.5, 20.2, 14.0)
    assert [b.gt.db_names[i] for i in q.good] == [
        "all_souls_000000",
        "all_souls_000001",
    ]  # duplicate folded
    assert b.queries.path(0) == tmp_path / "oxford5k" / "jpg" / "all_souls_000000.jpg"


def test_import_paris_archives_lays_out_and_skips_corrupt(tmp_path: Path) -> None:
    src = tmp_path / "have"
    src.mkdir()
    names = make_paris_archives(src)
    root = tmp_path / "root"
    rep = import_dataset("paris6k", src, root)
    ddir = root / "paris6k"
    assert sorted(p.stem for p in (ddir / "jpg").iterdir()) == sorted([*names, *PARIS_CORRUPT[:2]])
    assert (ddir / "paris_120310" / "louvre_1_ok.txt").exists()
    assert rep.placed == 7 + 4
    b = load("paris6k", root, strict=False)
    assert b.gt.n_db == 5 and not set(PARIS_CORRUPT) & set(b.gt.db_names)
    lock = LockFile(root).read()
    assert "paris_1-v1.tgz" in lock["files"] and "paris_1-v1.tgz" in lock["installed"]["paris6k"]
    # verify: the two corrupt files are expected, not errors; counts differ from the official ones
    rep2 = verify("paris6k", root, progress=False)
    assert sorted(rep2.expected_corrupt) == sorted(PARIS_CORRUPT[:2]) and not rep2.corrupt
    assert rep2.count_problems == [
        "usable images: found 5, expected 6392",
        "queries: found 1, expected 55",
    ]
    assert rep2.checksums_ok == [] and not rep2.ok
    # re-import is idempotent; a tampered archive no longer matches the recorded checksum
    import_dataset("paris6k", src, root)
    with tarfile.open(src / "paris_1-v1.tgz", "w:gz") as tf:
        tf.add(src / "src" / "paris", arcname="paris")
        tf.add(src / "src" / "gt" / "louvre_1_ok.txt", arcname="extra.txt")
    with pytest.raises(
        InputError, match="differs from the recorded/published checksum of paris_1-v1.tgz"
    ):
        import_dataset("paris6k", src, root)


def test_import_revisited_folder_with_hard_links_and_verify(tmp_path: Path) -> None:
    src = tmp_path / "mine"
    make_revisited(src)
    write_jpeg(src / "jpg" / "all_souls_000001.jpg", seed=1, exif_orientation=6)
    root = tmp_path / "root"
    import_dataset("roxford5k", src, root)
    dst = root / "roxford5k" / "jpg" / "all_souls_000000.jpg"
    assert dst.stat().st_ino == (src / "jpg" / "all_souls_000000.jpg").stat().st_ino  # hard link
    # a different gnd file than the one recorded is refused before it is laid out
    other = tmp_path / "other"
    make_revisited(other, n_db=9)
    gnd_dst = root / "roxford5k" / "gnd_roxford5k.pkl"
    before = gnd_dst.read_bytes()
    with pytest.raises(
        InputError, match="differs from the recorded/published checksum of gnd_roxford5k.pkl"
    ):
        import_dataset("roxford5k", other, root)
    assert gnd_dst.read_bytes() == before
    rep = verify("roxford5k", root, progress=False)
    assert (
        rep.n_images_checked == 10 and not rep.missing and not rep.corrupt and not rep.ground_truth
    )
    assert rep.exif_rotated == [{"name": "all_souls_000001", "orientation": 6}]
    assert rep.checksums_ok == ["gnd_roxford5k.pkl"]
    # damage: a truncated image, a missing one, a query in the database, a changed gnd file
    img = root / "roxford5k" / "jpg" / "all_souls_000002.jpg"
    data = img.read_bytes()
    img.unlink()  # break the hard link before writing
    img.write_bytes(data[: len(data) // 2])
    (root / "roxford5k" / "jpg" / "all_souls_000004.jpg").unlink()
    gnd_path = root / "roxford5k" / "gnd_roxford5k.pkl"
    gnd = pickle.loads(gnd_path.read_bytes())
    gnd["imlist"][7] = gnd["qimlist"][1]
    gnd_path.unlink()
    gnd_path.write_bytes(pickle.dumps(gnd, protocol=2))
    rep = verify("roxford5k", root, progress=False)
    assert not rep.ok
    assert rep.missing == ["all_souls_000004"]
    assert [c["name"] for c in rep.corrupt] == ["all_souls_000002"]
    assert rep.ground_truth == ["1 query image(s) are in the database, e.g. all_souls_q00001"]
    assert len(rep.checksums) == 1 and "gnd_roxford5k.pkl" in rep.checksums[0]
    out = rep.write_json(tmp_path / "r.json")
    d = json.loads(out.read_text())
    assert d["ok"] is False and d["missing"] == ["all_souls_000004"]


def test_distractors_attach_with_offsets(tmp_path: Path) -> None:
    make_revisited(tmp_path / "roxford5k")
    r1m = tmp_path / "revisitop1m"
    entries = ["a/aa/0001.jpg", "a/ab/0002", "b/ba/0003.jpg"]
    (r1m).mkdir()
    (r1m / "revisitop1m.txt").write_text("\n".join(entries) + "\n")
    for i, e in enumerate(entries):
        write_jpeg(r1m / "jpg" / (e if e.endswith(".jpg") else e + ".jpg"), seed=300 + i)
    b = load("roxford5k", tmp_path, distractors="revisitop1m", strict=False)
    assert b.n_distractors == 3 and b.n_index == b.gt.n_db + 3
    assert b.distractors is not None and b.distractors.name(1) == "a/ab/0002"
    assert b.options["distractors"] == "revisitop1m"
    from oxbench.datasets import distractor_count

    assert distractor_count("revisitop1m", tmp_path) == 3
    b2 = load("roxford5k", tmp_path, distractors=2, strict=False)
    assert b2.n_distractors == 2 and b2.options["distractors"] == "revisitop1m[:2]"
    from oxbench.datasets import ImageSource

    assert isinstance(b.distractors, ImageSource) and b.distractors.read(2).shape == (16, 24, 3)
    (r1m / "jpg" / "a" / "ab" / "0002.jpg").unlink()
    rep = verify("revisitop1m", tmp_path, progress=False)
    assert rep.missing == ["a/ab/0002"] and rep.n_images_checked == 2
    # found = on disk, listed = in revisitop1m.txt (before: "found 3", the length of the list)
    assert rep.counts["images"] == {"expected": 1_001_001, "found": 2, "listed": 3}
    assert rep.count_problems == ["images: found 2, expected 1001001, 3 listed"]
    with pytest.raises(InputError, match="missing .*a/ab/0002.jpg"):
        load("roxford5k", tmp_path, distractors="revisitop1m", strict=False)
    with pytest.raises(InputError, match="has 3 images, expected 1001001"):
        spec = get_spec("revisitop1m")
        spec.family.images(spec, r1m)


def test_holidays_orientation_option(tmp_path: Path) -> None:
    ddir = tmp_path / "holidays"
    names = ["100000", "100001", "100002", "100100", "100101"]
    ddir.mkdir()
    (ddir / "holidays_images.dat").write_text("\n".join(f"{n}.jpg" for n in names))
    for i, n in enumerate(names):
        write_jpeg(ddir / "jpg" / f"{n}.jpg", seed=400 + i)
    b = load("holidays", tmp_path, strict=False)
    assert (
        b.options["orientation"] == "original"
        and b.gt.n_queries == 2
        and b.gt.protocol == "holidays"
    )
    assert b.describe()["option.orientation"] == "original"
    with pytest.raises(InputError, match="jpg_rotated"):
        load("holidays", tmp_path, strict=False, orientation="rotated")
    for i, n in enumerate(names):
        write_jpeg(ddir / "jpg_rotated" / f"{n}.jpg", seed=400 + i, size=(16, 24))
    (ddir / "jpg_rotated" / "100101.jpg").unlink()
    rep = verify("holidays", tmp_path, progress=False)
    assert rep.missing == ["jpg_rotated/100101"] and rep.n_images_checked == 9
    with pytest.raises(InputError, match="100101.jpg"):
        load("holidays", tmp_path, strict=False, orientation="rotated")
    write_jpeg(ddir / "jpg_rotated" / "100101.jpg", seed=1, size=(16, 24))
    r = load("holidays", tmp_path, strict=False, orientation="rotated")
    assert r.options["orientation"] == "rotated" and r.database.read(0).shape == (24, 16, 3)
    with pytest.raises(InputError, match="must be one of original, rotated"):
        load("holidays", tmp_path, orientation="sideways")


def test_ukbench_import_from_zip_layout(tmp_path: Path) -> None:
    import zipfile

    zpath = tmp_path / "ukbench.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for i in range(8):
            for folder, size in (("full", (32, 24)), ("thumbnails", (8, 6))):
                p = write_jpeg(tmp_path / "tmp" / folder / f"ukbench{i:05d}.jpg", seed=i, size=size)
                zf.write(p, f"{folder}/ukbench{i:05d}.jpg")
        zf.writestr("index.html", "<html/>")
        zf.writestr("__MACOSX/full/._ukbench00000.jpg", b"\x00\x05\x16\x07 resource fork")
        zf.writestr("full/._ukbench00001.jpg", b"\x00\x05\x16\x07 resource fork")
    root = tmp_path / "root"
    import_dataset("ukbench", zpath, root)
    assert sorted(p.name for p in (root / "ukbench" / "jpg").iterdir()) == [
        f"ukbench{i:05d}.jpg" for i in range(8)
    ]
    b = load("ukbench", root, strict=False)
    assert b.gt.n_db == 8 and b.database.read(5).shape == (
        24,
        32,
        3,
    )  # full size, not the thumbnail
    assert b.gt.queries[5].good.tolist() == [4, 5, 6, 7]
    rep = verify("ukbench", root, progress=False)
    assert len(rep.missing) == 10_200 - 8 and rep.count_problems == [
        "images: found 8, expected 10200"
    ]


def test_import_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="import source not found"):
        import_dataset("roxford5k", tmp_path / "nope", tmp_path / "root")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="found no file of roxford5k"):
        import_dataset("roxford5k", empty, tmp_path / "root")
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(InputError):
        import_dataset("roxford5k", bad, tmp_path / "root")
    with pytest.raises(InputError, match="unknown dataset"):
        import_dataset("nope", empty, tmp_path / "root")


@pytest.mark.slow
@pytest.mark.shared_data
def test_import_real_roxford_gnd_with_fake_images(shared_data: Path, tmp_path: Path) -> None:
    """The real revisited pickle, with tiny stand-in images for a subset of its names."""
    from oxbench.formats.revisitop import read_gnd

    src = tmp_path / "mine"
    (src).mkdir()
    gnd = shared_data / "roxford5k" / "gnd_roxford5k.pkl"
    (src / gnd.name).write_bytes(gnd.read_bytes())
    gt = read_gnd(gnd)
    subset = list(gt.query_names) + list(gt.db_names[:50])
    for i, n in enumerate(subset):
        write_jpeg(src / "jpg" / f"{n}.jpg", seed=i, size=(8, 8))
    root = tmp_path / "root"
    import_dataset("roxford5k", src, root)
    rep = verify("roxford5k", root, progress=False, decode=False)
    # found counts the images on disk (before: 4993, what the pickle lists)
    assert rep.counts["database images"] == {"expected": 4993, "found": 50, "listed": 4993}
    assert rep.counts["query images"] == {"expected": 70, "found": 70, "listed": 70}
    assert rep.count_problems == ["database images: found 50, expected 4993, 4993 listed"]
    assert not rep.ground_truth and len(rep.missing) == 4993 - 50
    with pytest.raises(InputError, match="4943 of 4993 image"):
        load("roxford5k", root)


def test_synthetic_ids_delegate_to_the_synthetic_loader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from unittest import mock

    import oxbench.datasets.synthetic as synth
    from oxbench.datasets.base import Benchmark

    bench = mock.Mock(spec=Benchmark)  # load checks that the family gave a Benchmark
    calls: list[tuple] = []
    monkeypatch.setattr(
        synth,
        "ensure_default",
        lambda root, progress: calls.append(("ensure", Path(root), progress)),
    )
    monkeypatch.setattr(
        synth,
        "load_synthetic",
        lambda d, distractors=None, crop="python": (
            calls.append(("load", d, distractors, crop)) or bench
        ),
    )
    assert load("synthetic-train", tmp_path, distractors=50, crop="matlab", progress=False) is bench
    assert calls == [
        ("ensure", tmp_path, False),
        ("load", tmp_path / "synthetic-train", 50, "matlab"),
    ]
    with pytest.raises(InputError, match="number of generated distractors"):
        load("synthetic", tmp_path, distractors="revisitop1m")


def _link_tree(folder: Path, names: list[str], template: Path) -> None:
    """``folder/<name>.jpg`` for every name, all hard links to one tiny JPEG (fast)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        os.link(template, folder / f"{n}.jpg")


@pytest.mark.slow
@pytest.mark.shared_data
def test_real_oxford_and_paris_ground_truth_with_stand_in_images(
    shared_data: Path, tmp_path: Path
) -> None:
    """Official text ground truth + the real image lists, images replaced by one tiny JPEG."""
    from oxbench.formats.revisitop import read_gnd

    template = write_jpeg(tmp_path / "t.jpg", seed=0, size=(8, 8))
    # Oxford: 5,063 images, 55 queries, strict counts
    ox = tmp_path / "ox"
    shutil.copytree(shared_data / "oxford5k" / "gt_files_170407", ox / "gt_files_170407")
    ox_names = list(read_gnd(shared_data / "oxford5k" / "gnd_oxford5k.pkl").db_names)
    _link_tree(ox / "images", ox_names, template)
    root = tmp_path / "root"
    import_dataset("oxford5k", ox, root, progress=False)
    b = load("oxford5k", root)
    assert b.gt.n_db == 5063 and b.gt.n_queries == 55 and b.protocols == ("original",)
    q = b.gt.queries[0]
    assert q.name == "all_souls_000013" and len(q.good) == 24  # all_souls_000091 listed twice
    assert verify("oxford5k", root, decode=False, progress=False).ok
    # Paris: 6,392 usable + the 20 corrupt files (broken bytes): expected, not errors
    pa = tmp_path / "pa"
    shutil.copytree(shared_data / "paris6k" / "paris_120310", pa / "paris_120310")
    pa_names = list(read_gnd(shared_data / "paris6k" / "gnd_paris6k.pkl").db_names)
    _link_tree(pa / "jpg", pa_names, template)
    for bad in PARIS_CORRUPT:
        (pa / "jpg" / f"{bad}.jpg").write_bytes(b"\xff\xd8 truncated")
    import_dataset("paris6k", pa, root, progress=False)
    p = load("paris6k", root)
    assert p.gt.n_db == 6392 and p.gt.n_queries == 55
    assert all(p.gt.queries[i].good.size == 0 for i in range(55))  # Paris' good files are empty
    rep = verify("paris6k", root, jobs=2, progress=False)
    assert (
        rep.ok
        and sorted(rep.expected_corrupt) == sorted(PARIS_CORRUPT)
        and rep.n_images_checked == 6392
    )
    # RParis from the same images (hard links) + the real revisited pickle
    gnd = shared_data / "rparis6k" / "gnd_rparis6k.pkl"
    import_dataset("rparis6k", root / "paris6k" / "jpg", root, progress=False)
    import_dataset("rparis6k", gnd, root, progress=False)
    r = load("rparis6k", root)
    assert r.gt.n_db == 6322 and r.gt.n_queries == 70 and r.protocols == ("revisited",)
    assert not set(r.gt.query_names) & set(r.gt.db_names)
    rep = verify("rparis6k", root, decode=False, progress=False)
    assert rep.ok and rep.checksums_ok == ["gnd_rparis6k.pkl"]
