"""Local features from the user's files: hloc's ``features.h5`` and a folder of ``.npz``.

RootSIFT described by the built-in extractor on a tiny synthetic benchmark is written to both
layouts; bag of words + spatial verification and ASMK on the files must give the SAME ranks as
on the built-in RootSIFT, with no pixel read. Bad files are one line naming the file, exit 2, no
run recorded.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.datasets import load
from oxbench.datasets.base import Benchmark, UnreadImages
from oxbench.errors import InputError
from oxbench.features.extractors import local_extractor, local_extractor_from_dict
from oxbench.features.extractors.files import LocalFeatureFiles
from oxbench.features.local import RawFeatures
from oxbench.formats.local_features import MAX_KEYPOINTS, probe, read_image_features
from oxbench.pipelines import RecordOptions, RunContext, Session, resolve_method, run
from oxbench.pipelines.runner import list_runs
from oxbench.pipelines.steps import open_store, step_features
from oxbench.pipelines.steps.keys import part_names, parts_of
from test_pipeline import TINY, ground_truth_only, make_tiny_root

h5py = pytest.importorskip("h5py")
pytest.importorskip("cv2")
pytest.importorskip("faiss")

#: Small enough for a run in seconds: 200 words, a short list of 20 ...
SETTINGS = {"vocabulary.size": 200, "spatial.top_r": TINY["spatial.top_r"]}
#: ... and at most 300 RootSIFT features per image, described at 320 px.
FEATURES = resolve_method(
    "rootsift-bow-sv", **{k: v for k, v in TINY.items() if k.startswith("features.")}
).features


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def rootsift_of(root: Path, dataset: str, cache: Path) -> list[RawFeatures]:
    """Every image's built-in RootSIFT (database, query crops), finished, in full-image pixels."""
    bench = load(dataset, root, progress=False)
    step_features(bench, FEATURES, RunContext(cache, progress=False))
    out = []
    for part in parts_of(bench):
        store = open_store(cache, bench, FEATURES, part)
        for name in part_names(bench, part):
            raw = store.get_raw(name)
            out.append(
                RawFeatures(name, raw.keypoints, FEATURES.finish(raw.descriptors), raw.image_size)
            )
    return out


def write_h5(path: Path, images: list[RawFeatures]) -> Path:
    """hloc's layout: a group per image, keypoints [n, 2], descriptors [d, n], image_size,
    scales and oris (radians)."""
    with h5py.File(path, "w") as f:
        for im in images:
            g = f.create_group(im.name)
            g.create_dataset("keypoints", data=im.keypoints[:, :2])
            g.create_dataset("descriptors", data=im.descriptors.T)
            g.create_dataset("image_size", data=np.array(im.image_size))
            g.create_dataset("scales", data=im.keypoints[:, 2])
            g.create_dataset("oris", data=np.deg2rad(im.keypoints[:, 3].astype(np.float64)))
            g.create_dataset("scores", data=np.ones(len(im), np.float32))
    return path


def write_npz(folder: Path, images: list[RawFeatures]) -> Path:
    """One ``<name>.npz`` per image: keypoints [n, 4], descriptors [n, d], image_size."""
    folder.mkdir(parents=True, exist_ok=True)
    for im in images:
        np.savez(
            folder / f"{im.name}.npz",
            keypoints=im.keypoints,
            descriptors=im.descriptors,
            image_size=np.array(im.image_size),
        )
    return folder


@pytest.fixture(scope="module")
def files(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("local")
    test = rootsift_of(tiny_root, "synthetic", tmp / "cache")
    train = rootsift_of(tiny_root, "synthetic-train", tmp / "cache")
    return {
        "h5": write_h5(tmp / "features.h5", test),
        "train_h5": write_h5(tmp / "train.h5", train),
        "npz": write_npz(tmp / "npz", test),
        "train_npz": write_npz(tmp / "train_npz", train),
    }


def without_pixels(bench: Benchmark) -> Benchmark:
    """The benchmark with every image unreadable: a step that reads one fails."""
    return dataclasses.replace(
        bench,
        database=UnreadImages(bench.gt.db_names, bench.id),
        queries=UnreadImages(bench.gt.query_names, bench.id),
    )


def ranks_of(method, root: Path, cache: Path, *, pixels: bool = True) -> np.ndarray:  # noqa: ANN001
    bench, train = (load(d, root, progress=False) for d in ("synthetic", "synthetic-train"))
    if not pixels:
        bench, train = without_pixels(bench), without_pixels(train)
    ctx = RunContext(cache, progress=False)
    impl = method.build().fit(train, ctx).index(bench, ctx)
    return impl.search(bench, ctx).ranks


@pytest.mark.parametrize(
    ("preset", "layout"), [("rootsift-bow-sv", "h5"), ("rootsift-asmk-sv", "npz")]
)
def test_file_features_give_the_ranks_of_the_built_in_rootsift(
    preset: str, layout: str, tiny_root: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    built_in = resolve_method(preset, **SETTINGS, features=FEATURES)
    from_files = resolve_method(
        preset,
        **SETTINGS,
        features=f"{layout}:{files[layout]}",
        **{"features.train": str(files[f"train_{layout}"])},
    )
    assert isinstance(from_files.features, LocalFeatureFiles)
    assert built_in.reads_images and not from_files.reads_images
    assert not from_files.learns_on_test_set and from_files.features.dim == 128
    expected = ranks_of(built_in, tiny_root, tmp_path / "a")
    got = ranks_of(from_files, tiny_root, tmp_path / "b", pixels=False)  # no pixel is read
    np.testing.assert_array_equal(got, expected)
    # HE (bag of words with Hamming embedding and weak geometry) on the same files, same ranks
    if preset == "rootsift-bow-sv":
        he, he_files = (
            resolve_method("rootsift-he-wgc-sv", **SETTINGS, **extra)
            for extra in ({"features": FEATURES}, {"features": from_files.features})
        )
        np.testing.assert_array_equal(
            ranks_of(he_files, tiny_root, tmp_path / "d", pixels=False),
            ranks_of(he, tiny_root, tmp_path / "c"),
        )


@pytest.mark.parametrize(
    ("preset", "layout"), [("rootsift-asmk-sv", "h5"), ("rootsift-bow-sv", "npz")]
)
def test_own_local_features_run_on_a_synthetic_root_of_ground_truth_only(
    preset: str, layout: str, tiny_root: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 43 case 13: a synthetic root without jpg/ refused h5 local features ("image listed in
    the ground truth is missing"), though such a run reads no pixel; now the ranks of the built-in
    RootSIFT on the full root."""
    bare = ground_truth_only(tiny_root, tmp_path / "bare")
    overrides = {
        **SETTINGS,
        "features": f"{layout}:{files[layout]}",
        "features.train": str(files[f"train_{layout}"]),
    }
    out = run(
        "synthetic",
        preset,
        overrides=overrides,
        session=Session(root=bare, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(out=tmp_path / "run"),
    )
    built_in = resolve_method(preset, **SETTINGS, features=FEATURES)
    expected = ranks_of(built_in, tiny_root, tmp_path / "a")
    saved = np.load(out.run_dir / "ranks.npy").T  # the record keeps the revisitop layout
    np.testing.assert_array_equal(saved, expected[:, : saved.shape[1]])
    assert (
        not (bare / "synthetic" / "jpg").exists() and out.config.train_dataset == "synthetic-train"
    )


def test_hloc_layout_reads_back_what_was_written(files: dict[str, Path], tiny_root: Path) -> None:
    facts = probe("h5", files["h5"])
    assert facts.dim == 128 and facts.dtype == np.float32
    with np.load(files["npz"] / f"{facts.first}.npz") as z:
        kp, desc = z["keypoints"], z["descriptors"]
    got = read_image_features("h5", files["h5"], facts.first, facts)
    np.testing.assert_array_equal(got.descriptors, desc)  # [d, n] transposed back to [n, d]
    np.testing.assert_array_equal(got.keypoints, kp)  # radians back to the same float32 degrees
    # x, y only: unit size and angle 0 are assumed
    h5 = files["h5"].parent / "xy.h5"
    with h5py.File(h5, "w") as f:
        g = f.create_group("a")
        g["keypoints"] = kp[:, :2]
        g["descriptors"] = desc.T.astype(np.float16)
        g["image_size"] = np.array([320, 240])
    xy = read_image_features("h5", h5, "a")
    assert xy.descriptors.dtype == np.float16
    np.testing.assert_array_equal(xy.keypoints[:, 2:], np.tile([1.0, 0.0], (len(kp), 1)))


def test_the_setting_is_text_a_record_or_an_object_and_rebuilds_from_the_record(
    files: dict[str, Path],
) -> None:
    m = resolve_method("rootsift-asmk", features=f"npz:{files['npz']}")
    record = json.loads(json.dumps(m.to_dict()))  # as config.json keeps it
    assert record["features"]["kind"] == "local-feature-files"
    assert record["features"]["dim"] == 128 and record["features"]["dtype"] == "float32"
    again = resolve_method("rootsift-asmk", features=record["features"])
    assert again == m and again.digest() == m.digest()
    assert local_extractor_from_dict(record["features"]) == m.features
    # the learning-on-the-test-set flag: no training file
    assert m.learns_on_test_set
    # the built-in RootSIFT keeps its digest and round-trips too
    default = resolve_method("rootsift-bow-sv-qe")
    sift = json.loads(json.dumps(default.to_dict()))["features"]
    assert resolve_method("rootsift-bow-sv-qe", features=sift).digest() == default.digest()
    assert local_extractor("sift").to_dict()["descriptor"] == "sift"
    with pytest.raises(InputError, match="setting features: unknown local feature 'surf'"):
        resolve_method("rootsift-bow", features="surf")
    with pytest.raises(InputError, match="needs h5:PATH"):
        resolve_method("rootsift-bow", features="h5")
    with pytest.raises(InputError, match="local features of unknown kind 'delf'"):
        resolve_method("rootsift-bow", features={"kind": "delf"})


def test_without_training_features_the_run_learns_on_the_test_set_and_says_so(
    tiny_root: Path, files: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = run(
        "synthetic",
        "rootsift-bow",
        overrides={"vocabulary.size": 200, "features": f"h5:{files['h5']}"},
        session=Session(root=tiny_root, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(out=tmp_path / "run"),
    )
    assert out.config.train_dataset == "synthetic" and out.config.trained_on_test_set
    assert "no training file: set features.train" in caplog.text
    config = json.loads((out.config_dir / "config.json").read_text())
    assert config["trained_on_test_set"] is True
    assert config["method"]["features"]["path"] == str(files["h5"])
    # the run's summary NOTE names the setting that gives it training data of its own
    summary = (out.run_dir / "summary.txt").read_text()
    assert "trained on the test set" in summary and "--set features.train=PATH" in summary


def test_features_train_is_listed_by_methods_all(capsys: pytest.CaptureFixture[str]) -> None:
    """A preset that extracts its own features used to hide features.train, the one setting that
    makes an own-feature run comparable."""
    from oxbench.cli import main

    for argv in (
        ["methods", "rootsift-bow", "--all"],
        ["methods", "rootsift-bow", "--all", "--json"],
    ):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, _ = capsys.readouterr()
        assert exc.value.code in (0, None)
        assert "features.train" in out and "features=h5:PATH" in out, out
    with pytest.raises(SystemExit):
        main(["methods", "rootsift-bow"])  # without --all: only what applies as the preset is
    assert "features.train" not in capsys.readouterr()[0]


def _bad_h5(path: Path, case: str, good: Path) -> str:
    """A copy of the good file with one defect; returns what the error must say."""
    with h5py.File(good, "r") as src, h5py.File(path, "w") as f:
        for name in src:
            src.copy(src[name], f, name)
        names = sorted(f)
        victim = names[-1]
        g = f[victim]
        if case == "missing":
            del f[victim]
            return f"image {victim!r}: missing from the file"
        if case == "dim":
            d = g["descriptors"][()]
            del g["descriptors"]
            g["descriptors"] = d[:64]
            return f"image {victim!r}: descriptors are float32 of dimension 64, but the file's first image"
        if case == "nan":
            d = g["descriptors"][()]
            d[5, 3] = np.nan
            g["descriptors"][...] = d
            return f"image {victim!r}: descriptor 3 is not finite"
        if case == "outside":
            kp = g["keypoints"][()]
            kp[2, 0] = 400.0
            g["keypoints"][...] = kp
            return f"image {victim!r}: keypoint 2 at (400.0,"
        if case == "huge":
            del g["keypoints"], g["descriptors"]
            g.create_dataset("keypoints", shape=(MAX_KEYPOINTS + 1, 2), dtype="f4", chunks=True)
            g.create_dataset("descriptors", shape=(128, MAX_KEYPOINTS + 1), dtype="f4", chunks=True)
            return f"image {victim!r}: declares {MAX_KEYPOINTS + 1:,} keypoints"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["missing", "dim", "nan", "outside", "huge", "not-hdf5"])
def test_bad_feature_files_are_one_line_exit_2_and_no_run(
    case: str,
    tiny_root: Path,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = tmp_path / "bad.h5"
    if case == "not-hdf5":
        bad.write_bytes(b"PK\x03\x04 this is a zip, not HDF5")
        want = "not an HDF5 file"
    else:
        want = _bad_h5(bad, case, files["h5"])
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--method",
                "rootsift-bow-sv",
                "--root",
                str(tiny_root),
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "c"),
                "--no-progress",
                "--set",
                f"features=h5:{bad}",
                "--set",
                f"features.train={files['train_h5']}",
                *[a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")],
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and want in err and str(bad) in err, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert list_runs(out) == [] if out.exists() else True
    assert not [p for p in out.rglob("*") if p.name != "config.json" and p.is_file()]


def test_npz_refusals_name_the_image_file(tmp_path: Path) -> None:
    folder = tmp_path / "f"
    folder.mkdir()
    kp = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    np.savez(folder / "a.npz", keypoints=kp, descriptors=np.ones((2, 8), np.uint8))
    with pytest.raises(InputError, match=r"a\.npz: no image_size"):
        read_image_features("npz", folder, "a")
    np.savez(
        folder / "b.npz",
        keypoints=kp,
        descriptors=np.ones((3, 8), np.float32),
        image_size=np.array([10, 10]),
    )
    with pytest.raises(
        InputError, match=r"b\.npz: descriptors must be \[n, d\] for its 2 keypoints"
    ):
        read_image_features("npz", folder, "b")
    with pytest.raises(InputError, match=r"c\.npz: missing from the features folder"):
        read_image_features("npz", folder, "c")
    with pytest.raises(InputError, match="leaves the features folder"):
        read_image_features("npz", folder, "../x")
    # a header that declares more keypoints than allowed: refused before any data is read
    import io
    import zipfile

    def header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": descr, "fortran_order": False, "shape": shape}
        )
        return buf.getvalue()  # no data follows: reading it would fail

    with zipfile.ZipFile(folder / "e.npz", "w") as zf:
        zf.writestr("keypoints.npy", header((MAX_KEYPOINTS + 1, 2)))
        zf.writestr("descriptors.npy", header((MAX_KEYPOINTS + 1, 128)))
        zf.writestr("image_size.npy", header((2,), "<i8"))
    with pytest.raises(InputError, match=rf"e\.npz: declares {MAX_KEYPOINTS + 1:,} keypoints"):
        read_image_features("npz", folder, "e")
    (folder / "d.npz").write_bytes(b"not a zip")
    with pytest.raises(InputError, match=r"d\.npz: not a readable \.npz archive"):
        read_image_features("npz", folder, "d")


def test_without_h5py_the_error_names_the_extra(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "h5py", None)
    with pytest.raises(ImportError, match=r'pip install "oxbench\[mat\]"'):
        read_image_features("h5", files["h5"], "anything")


def test_vlad_takes_its_dimension_from_the_descriptors() -> None:
    """VLAD of 32-D features (not SIFT's 128): ``k * 32`` values, each block the summed residuals
    of its word (Jegou et al. 2010), here with no normalisation but the final L2 one."""
    from oxbench.pipelines.descriptors.vlad import vlad

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 32)).astype(np.float32)
    centroids = rng.standard_normal((4, 32)).astype(np.float32)
    words = np.argmin(((x[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    v = vlad(x, words, centroids, power=1.0, intra_norm=False)
    expected = np.stack([(x[words == c] - centroids[c]).sum(0) for c in range(4)]).ravel()
    assert v.shape == (4 * 32,)
    np.testing.assert_allclose(v, expected / np.linalg.norm(expected), rtol=1e-5, atol=1e-6)


def test_training_features_of_another_dimension_are_refused(tmp_path: Path) -> None:
    def folder(name: str, dim: int) -> Path:
        out = tmp_path / name
        out.mkdir()
        np.savez(
            out / "a.npz",
            keypoints=np.array([[1.0, 2.0]], np.float32),
            descriptors=np.ones((1, dim), np.float32),
            image_size=np.array([8, 8]),
        )
        return out

    test, train = folder("test", 8), folder("train", 16)
    features = LocalFeatureFiles(layout="npz", path=str(test), train=str(train))
    assert features.has_training_features() and features.dim == 8
    with pytest.raises(InputError, match="training features are float32 of dimension 16"):
        features.for_training()
    same = LocalFeatureFiles(layout="npz", path=str(test), train=str(folder("train8", 8)))
    assert same.for_training().path == str(tmp_path / "train8") and same.for_training().dim == 8


def test_npz_files_swapped_by_mv_are_read_again_not_taken_from_the_cache(
    tiny_root: Path, files: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 43 case 1: two ``.npz`` swapped by ``mv`` keep the folder's total size, count and
    newest mtime; the content digest keys new caches, so a cached rerun ranks as a fresh one."""
    import shutil

    folder = tmp_path / "npz"
    shutil.copytree(files["npz"], folder)
    settings = {**SETTINGS, "features.train": str(files["train_npz"])}
    cache = tmp_path / "cache"
    before = ranks_of(
        resolve_method("rootsift-bow-sv", **settings, features=f"npz:{folder}"), tiny_root, cache
    )
    bench = load("synthetic", tiny_root, progress=False)
    a, b = (folder / f"{n}.npz" for n in bench.gt.db_names[:2])
    os.rename(a, tmp_path / "t.npz")
    os.rename(b, a)
    os.rename(tmp_path / "t.npz", b)
    swapped = resolve_method("rootsift-bow-sv", **settings, features=f"npz:{folder}")
    cached = ranks_of(swapped, tiny_root, cache, pixels=False)
    fresh = ranks_of(swapped, tiny_root, tmp_path / "fresh", pixels=False)
    np.testing.assert_array_equal(cached, fresh)
    assert not np.array_equal(cached, before)  # the swap moves the ranks: the test can tell


def test_a_big_endian_h5_is_read_as_the_same_numbers(tmp_path: Path) -> None:
    """Descriptors stored big-endian ('>f4', as MATLAB or a PowerPC writer may) were refused as if
    they were another dtype; they are the same float32 numbers, converted to this machine's order."""
    from oxbench.formats.local_features import read_image_features

    rng = np.random.default_rng(0)
    n, d = 6, 8
    kp = np.column_stack([rng.uniform(0, 30, (n, 2)), np.ones(n), np.zeros(n)]).astype(np.float32)
    desc = rng.random((n, d)).astype(np.float32)
    path = tmp_path / "big.h5"
    with h5py.File(path, "w") as f:
        g = f.create_group("a")
        g.create_dataset("keypoints", data=kp[:, :2])
        g.create_dataset("descriptors", data=desc.T.astype(">f4"))
        g.create_dataset("image_size", data=np.array([32, 32]))
    assert h5py.File(path, "r")["a/descriptors"].dtype == np.dtype(">f4")
    feats = read_image_features("h5", path, "a")
    assert feats.descriptors.dtype == np.dtype(np.float32) and feats.descriptors.dtype.isnative
    np.testing.assert_array_equal(feats.descriptors, desc)
