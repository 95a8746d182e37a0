"""Hostile feature files (issue 43): bound by content, HDF5 that cannot reach outside, no FIFO.

Case 1: local-feature files are identified by the digest of their bytes, so two ``.npz`` swapped
by ``mv`` and an ``.h5`` edited in place with its ``mtime`` restored key new caches. Case 4: HDF5
external links, virtual datasets and dangling soft links are refused before any data is read
(local ``features.h5``, global ``.h5`` and MATLAB v7.3). Case 6: a FIFO given as a features file
is refused without being opened (``open()`` on a FIFO blocks).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.features.extractors.files import LocalFeatureFiles
from oxbench.formats.arrays import read_features
from oxbench.formats.local_features import close_files, probe, read_image_features

h5py = pytest.importorskip("h5py")


def _image(f: object, name: str, seed: int, n: int = 5, d: int = 8) -> None:
    rng = np.random.default_rng(seed)
    g = f.create_group(name)  # type: ignore[attr-defined]
    g["keypoints"] = rng.uniform(1, 50, (n, 2)).astype(np.float32)
    g["descriptors"] = rng.random((d, n)).astype(np.float32)
    g["image_size"] = np.array([64, 64])


def _local_h5(path: Path, seeds: dict[str, int]) -> Path:
    with h5py.File(path, "w") as f:
        for name, seed in seeds.items():
            _image(f, name, seed)
    return path


def _npz(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    np.savez(
        path,
        keypoints=rng.uniform(1, 50, (5, 4)).astype(np.float32),
        descriptors=rng.random((5, 8)).astype(np.float32),
        image_size=np.array([64, 64]),
    )


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    yield
    close_files()


# --- case 1: bound by content -------------------------------------------------------------------


def test_npz_files_swapped_by_rename_get_another_digest(tmp_path: Path) -> None:
    folder = tmp_path / "npz"
    folder.mkdir()
    _npz(folder / "a.npz", 1)
    _npz(folder / "b.npz", 2)
    before = LocalFeatureFiles("npz", str(folder)).digest()
    # same sizes, same count, same newest mtime: only the content tells them apart
    os.rename(folder / "a.npz", folder / "t.npz")
    os.rename(folder / "b.npz", folder / "a.npz")
    os.rename(folder / "t.npz", folder / "b.npz")
    after = LocalFeatureFiles("npz", str(folder)).digest()
    assert before != after
    # swapped back: the first digest again (the content, not the inode, is the identity)
    os.rename(folder / "a.npz", folder / "t.npz")
    os.rename(folder / "b.npz", folder / "a.npz")
    os.rename(folder / "t.npz", folder / "b.npz")
    assert LocalFeatureFiles("npz", str(folder)).digest() == before


def test_h5_edited_in_place_with_its_mtime_restored_gets_another_digest(tmp_path: Path) -> None:
    path = _local_h5(tmp_path / "f.h5", {"a": 1, "b": 2})
    before = LocalFeatureFiles("h5", str(path))
    old = before.digest()
    st = os.stat(path)
    with h5py.File(path, "r+") as f:
        f["a/descriptors"][0, 0] = 0.123  # same size, same layout: only a value moves
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns
    again = LocalFeatureFiles("h5", str(path))
    assert again.digest() != old
    assert again.fingerprint()["sha256"] != before.fingerprint()["sha256"]


def test_the_fingerprint_is_the_sha256_of_the_bytes(tmp_path: Path) -> None:
    import hashlib

    path = _local_h5(tmp_path / "f.h5", {"a": 1})
    assert (
        LocalFeatureFiles("h5", str(path)).fingerprint()["sha256"]
        == hashlib.sha256(path.read_bytes()).hexdigest()
    )


# --- case 4: nothing read from outside the file -------------------------------------------------


def _outside(tmp_path: Path, how: str) -> Path:
    """A local features.h5 whose image ``b`` comes from another file (or nowhere)."""
    other = _local_h5(tmp_path / "other.h5", {"b": 9})
    path = tmp_path / f"{how}.h5"
    with h5py.File(path, "w") as f:
        _image(f, "a", 1)
        if how == "external":
            f["b"] = h5py.ExternalLink(str(other), "/b")
        elif how == "external-dataset":
            g = f.create_group("b")
            g["keypoints"] = h5py.ExternalLink(str(other), "/b/keypoints")
            g["descriptors"] = np.ones((8, 5), np.float32)
            g["image_size"] = np.array([64, 64])
        elif how == "virtual":
            _image(f, "b", 2)
            del f["b/descriptors"]
            layout = h5py.VirtualLayout(shape=(8, 5), dtype="f4")
            layout[:] = h5py.VirtualSource(str(other), "/b/descriptors", shape=(8, 5))
            f["b"].create_virtual_dataset("descriptors", layout)
        elif how == "dangling-soft":
            f["b"] = h5py.SoftLink("/nowhere")
        else:
            raise AssertionError(how)
    return path


@pytest.mark.parametrize(
    ("how", "want"),
    [
        ("external", "'/b' is an external link"),
        ("external-dataset", "'/b/keypoints' is an external link"),
        ("virtual", "'/b/descriptors' is a virtual dataset"),
        ("dangling-soft", "'/b' is a soft link to '/nowhere'"),
    ],
)
def test_local_h5_reaching_outside_is_refused(tmp_path: Path, how: str, want: str) -> None:
    path = _outside(tmp_path, how)
    with pytest.raises(InputError) as exc:
        probe("h5", path)
    assert want in str(exc.value) and str(path) in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_soft_link_inside_the_file_is_read(tmp_path: Path) -> None:
    path = _local_h5(tmp_path / "f.h5", {"a": 1})
    with h5py.File(path, "r+") as f:
        f["b"] = h5py.SoftLink("/a")
    assert probe("h5", path).dim == 8


def _global(tmp_path: Path, how: str, mat73: bool) -> Path:
    x = np.random.default_rng(0).random((4, 3)).astype(np.float32)
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = x
    path = tmp_path / ("g.mat" if mat73 else "g.h5")
    userblock = 512 if mat73 else 0
    with h5py.File(path, "w", userblock_size=userblock) as f:
        if how == "external":
            f["x"] = h5py.ExternalLink(str(other), "/x")
        elif how == "virtual":
            layout = h5py.VirtualLayout(shape=x.shape, dtype="f4")
            layout[:] = h5py.VirtualSource(str(other), "/x", shape=x.shape)
            f.create_virtual_dataset("x", layout)
        else:
            raise AssertionError(how)
    if mat73:
        with open(path, "r+b") as fh:
            fh.write(b"MATLAB 7.3 MAT-file, hostile test".ljust(128, b" "))
    return path


@pytest.mark.parametrize("mat73", [False, True])
@pytest.mark.parametrize(("how", "want"), [("external", "external link"), ("virtual", "virtual")])
def test_global_h5_and_mat73_reaching_outside_are_refused(
    tmp_path: Path, how: str, want: str, mat73: bool
) -> None:
    path = _global(tmp_path, how, mat73)
    with pytest.raises(InputError) as exc:
        read_features(path)
    assert want in str(exc.value) and "'/x'" in str(exc.value) and str(path) in str(exc.value)


# --- case 6: never open a FIFO ------------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this platform")
    path = tmp_path / "features.h5"
    os.mkfifo(path)

    def hung(signum: int, frame: object) -> None:
        raise AssertionError("blocked opening a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        yield path
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_fifo_as_local_features_is_refused_without_opening(fifo: Path) -> None:
    with pytest.raises(InputError, match="not a regular file"):
        probe("h5", fifo)


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs")
@pytest.mark.parametrize("which", ["features", "features.train"])
def test_a_fifo_through_the_cli_is_one_line_exit_2(
    which: str, fifo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.cli import main
    from test_pipeline import make_tiny_root

    good = _local_h5(tmp_path / "good.h5", {"a": 1})
    root = make_tiny_root(tmp_path / "data")
    test, train = (fifo, good) if which == "features" else (good, fifo)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--method",
                "rootsift-bow-sv",
                "--root",
                str(root),
                "--out",
                str(tmp_path / "run"),
                "--cache",
                str(tmp_path / "c"),
                "--no-progress",
                "--set",
                f"features=h5:{test}",
                "--set",
                f"features.train={train}",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "not a regular file" in err and str(fifo) in err, err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("WARNING")]
    assert len(lines) == 1 and "Traceback" not in err, err


# --- case 7: declared shapes bounded before any allocation --------------------------------------


def _declaring(tmp_path: Path, suffix: str) -> Path:
    """A small file declaring 8M x 64 float32 (2 GiB once read)."""
    shape = (8_000_000, 64)
    path = tmp_path / f"big{suffix}"
    if suffix == ".h5":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", shape=shape, dtype="f4", chunks=(1024, 64), compression="gzip")
    elif suffix == ".npz":
        import zipfile

        header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 64), np.float32))
        header["shape"] = shape
        import io

        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, header)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            with zf.open("x.npy", "w", force_zip64=True) as fh:
                fh.write(buf.getvalue())
                fh.write(bytes(1 << 16))  # the header is what is checked: the data may stop
    elif suffix == ".mat":
        import scipy.io

        scipy.io.savemat(path, {"x": np.zeros((8000, 64), np.float32)}, do_compression=True)
    else:
        raise AssertionError(suffix)
    return path


@pytest.mark.parametrize("suffix", [".h5", ".npz", ".mat"])
def test_a_declared_shape_over_the_budget_is_refused_before_reading(
    tmp_path: Path, suffix: str
) -> None:
    import resource

    path = _declaring(tmp_path, suffix)
    limit = 1 << 20 if suffix == ".mat" else 64 << 20  # the .mat holds 2 MB: a 1 MiB budget
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(InputError) as exc:
        read_features(path, max_bytes=limit)
    message = str(exc.value)
    assert (
        "declares shape" in message and f"budget of {limit:,}" in message and str(path) in message
    )
    # nothing near the declared size was allocated (ru_maxrss is in KiB on Linux)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 256 * 1024


def test_under_the_budget_the_array_is_read(tmp_path: Path) -> None:
    x = np.random.default_rng(0).random((10, 4)).astype(np.float32)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["x"] = x
    assert np.array_equal(read_features(tmp_path / "x.h5", max_bytes=1 << 20), x)
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(InputError, match="declares shape"):
        read_features(tmp_path / "x.npy", max_bytes=100)


# --- case 2: a global h5 whose root dataset is an external link, through the CLI -----------------


def test_a_global_h5_linked_elsewhere_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.cli import main
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    target = tmp_path / "target.h5"
    with h5py.File(target, "w") as f:
        f["x"] = np.ones((40, 8), np.float32)
    link = tmp_path / "db.h5"
    with h5py.File(link, "w") as f:
        f["x"] = h5py.ExternalLink(str(target), "/x")
    np.save(tmp_path / "q.npy", np.ones((5, 8), np.float32))
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--method",
                "features",
                "--root",
                str(root),
                "--out",
                str(out),
                "--cache",
                str(tmp_path / "c"),
                "--no-progress",
                "--set",
                f"descriptor.db_features={link}",
                "--set",
                f"descriptor.query_features={tmp_path / 'q.npy'}",
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "'/x' is an external link" in err and str(link) in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


# --- case 3: an ambiguous orientation is refused unless one is given ----------------------------


def test_a_square_descriptor_block_is_refused_unless_an_orientation_is_given(
    tmp_path: Path,
) -> None:
    n = d = 8
    rng = np.random.default_rng(0)
    kp = rng.uniform(1, 50, (n, 2)).astype(np.float32)
    desc = rng.random((n, d)).astype(np.float32)  # stored [n, d], not hloc's [d, n]
    path = tmp_path / "f.h5"
    with h5py.File(path, "w") as f:
        _image(f, "a", 1, n=5, d=d)  # the first image tells the dimension, unambiguously
        g = f.create_group("b")
        g["keypoints"], g["descriptors"], g["image_size"] = kp, desc, np.array([64, 64])
    auto = LocalFeatureFiles("h5", str(path))
    with pytest.raises(
        InputError, match=r"\[8, 8\] for 8 keypoints: \[n, d\] and \[d, n\] both fit"
    ):
        auto.read("b")
    close_files()
    # said: read as told, rows as descriptors
    told = LocalFeatureFiles("h5", str(path), orientation="n-d")
    with pytest.raises(InputError, match="must be \\[n, d\\]"):
        told.read("a")  # image a is [d, n]: not what was said
    close_files()
    assert np.array_equal(read_image_features("h5", path, "b", orientation="n-d").descriptors, desc)
    close_files()
    hloc = LocalFeatureFiles("h5", str(path), orientation="d-n")
    assert np.array_equal(hloc.read("b").descriptors, desc.T)
    assert auto.digest() != hloc.digest()  # the orientation keys the caches


# --- case 14: local-feature files put their content digest in the run label ---------------------


def test_two_local_feature_files_get_two_labels(tmp_path: Path) -> None:
    from oxbench.pipelines import resolve_method
    from oxbench.pipelines.runner import _default_label
    from oxbench.provenance import input_records

    labels = []
    for seed in (1, 2):
        (tmp_path / f"{seed}").mkdir()
        path = _local_h5(tmp_path / f"{seed}" / "features.h5", {"a": seed})
        m = resolve_method("rootsift-bow-sv", features=f"h5:{path}")
        files = m.input_files()
        assert files == {"features.path": path}
        labels.append(_default_label(m, input_records(files)))
    assert labels[0] != labels[1] and all(" @" in label for label in labels), labels
    # the built-in extractors read no file: the presets' labels carry no digest
    assert resolve_method("rootsift-bow-sv").input_files() == {}


def test_a_changed_input_file_is_named_in_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from oxbench.provenance import input_records

    path = _local_h5(tmp_path / "f.h5", {"a": 1})
    cache = tmp_path / "cache"
    with caplog.at_level("WARNING"):
        input_records({"features.path": path}, cache=cache)
        input_records({"features.path": path}, cache=cache)  # unchanged: quiet
        assert not caplog.records
        st = os.stat(path)
        with h5py.File(path, "r+") as f:
            f["a/descriptors"][0, 0] = 0.5
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        input_records({"features.path": path}, cache=cache)
    changed = [r.getMessage() for r in caplog.records]
    assert len(changed) == 1 and "features.path" in changed[0] and str(path) in changed[0]
    assert "changed since the last run" in changed[0]
