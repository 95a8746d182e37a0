"""Features and ranks in the files people have: .npy .npz .mat (v5, v7.3) .fvecs .bvecs .ivecs text."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError, MissingExtraError
from oxbench.formats.arrays import read_features, read_matrix, read_ranks


def write_vecs(path, rows, dtype):
    """texmex: per record an int32 dimension, then the values."""
    with open(path, "wb") as fh:
        for r in rows:
            fh.write(np.int32(len(r)).tobytes())
            fh.write(np.asarray(r, dtype=dtype).tobytes())


@pytest.fixture
def x(rng):
    return rng.standard_normal((7, 5)).astype(np.float32)


def test_every_feature_format_reads_the_same_vectors(tmp_path, x):
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "one.npz", feats=x)
    np.savez(tmp_path / "two.npz", X=x.T, Q=x[:2].T)
    scipy.io.savemat(
        tmp_path / "rev.mat", {"X": x.T.astype(np.float64), "Q": x[:2].T}
    )  # revisitop: d x n
    write_vecs(tmp_path / "x.fvecs", x, "<f4")
    for path, kw in [
        ("x.npy", {}),
        ("one.npz", {}),
        ("two.npz", {"key": "X", "layout": "d-n"}),
        ("rev.mat", {"key": "X", "layout": "d-n"}),
        ("x.fvecs", {}),
    ]:
        got = read_features(tmp_path / path, **kw)
        assert got.dtype == np.float32 and got.shape == (7, 5), path
        np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(read_features(tmp_path / "rev.mat", key="Q", layout="d-n"), x[:2])
    b = np.arange(12, dtype=np.uint8).reshape(3, 4)
    write_vecs(tmp_path / "b.bvecs", b, "u1")
    np.testing.assert_array_equal(read_features(tmp_path / "b.bvecs"), b.astype(np.float32))


def test_layout_is_explicit_and_normalize_gives_unit_rows(tmp_path, x):
    np.save(tmp_path / "x.npy", x)
    assert read_features(tmp_path / "x.npy", layout="d-n").shape == (5, 7)
    n = read_features(tmp_path / "x.npy", normalize=True)
    np.testing.assert_allclose(np.linalg.norm(n, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(n, x / np.linalg.norm(x, axis=1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(read_features(tmp_path / "x.npy"), x)  # off by default
    x0 = x.copy()
    x0[3] = 0
    np.save(tmp_path / "z.npy", x0)
    with pytest.raises(InputError, match="vector 3 has norm 0"):
        read_features(tmp_path / "z.npy", normalize=True)
    write_vecs(tmp_path / "x.fvecs", x, "<f4")
    with pytest.raises(InputError, match="one vector per record: use layout n-d"):
        read_features(tmp_path / "x.fvecs", layout="d-n")


def test_ranks_formats_give_the_internal_layout(tmp_path):
    internal = np.array([[3, 1, 0, 2], [0, 2, 1, 3]])
    np.save(tmp_path / "r.npy", internal.T)  # revisitop layout
    np.savez(tmp_path / "r.npz", ranks=internal.T)
    scipy.io.savemat(tmp_path / "r.mat", {"ranks": internal.T.astype(np.int32)})
    write_vecs(tmp_path / "r.ivecs", internal, "<i4")
    (tmp_path / "r.txt").write_text("3 1 0 2\n0\t2 1 3\n")
    for name in ("r.npy", "r.npz", "r.mat", "r.ivecs", "r.txt"):
        got = read_ranks(tmp_path / name)
        assert np.issubdtype(got.dtype, np.integer), name
        np.testing.assert_array_equal(got, internal)
    (tmp_path / "short.txt").write_text("3 1 0 2\n0 2\n")
    np.testing.assert_array_equal(
        read_ranks(tmp_path / "short.txt"), [[3, 1, 0, 2], [0, 2, -1, -1]]
    )


def test_keys_choose_and_ambiguity_is_refused(tmp_path, x):
    np.savez(tmp_path / "two.npz", X=x, Q=x[:2])
    with pytest.raises(InputError, match="holds Q, X: choose one with --key"):
        read_features(tmp_path / "two.npz")
    with pytest.raises(InputError, match="no array 'Z' in the .npz archive; it holds Q, X"):
        read_features(tmp_path / "two.npz", key="Z")
    np.save(tmp_path / "x.npy", x)
    with pytest.raises(InputError, match="--key .* names an array inside .npz, .h5 or .mat"):
        read_features(tmp_path / "x.npy", key="X")
    scipy.io.savemat(tmp_path / "s.mat", {"X": x, "name": "text"})
    with pytest.raises(InputError, match="variable 'name' is not a numeric matrix"):
        read_features(tmp_path / "s.mat", key="name")


def test_float_ranks_look_like_scores(tmp_path):
    np.save(tmp_path / "f.npy", np.array([[0.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(InputError, match="these look like scores: use --scores"):
        read_ranks(tmp_path / "f.npy")


def _malformed(tmp_path, x):
    """(path, reader, expected message part) for every input path and each way it breaks."""
    t = tmp_path
    cases = []
    np.save(t / "ok.npy", x)
    full = (t / "ok.npy").read_bytes()
    (t / "trunc.npy").write_bytes(full[: len(full) - 9])
    (t / "empty.npy").write_bytes(b"")
    (t / "text.npy").write_text("1 2 3\n")
    np.save(t / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases += [
        ("trunc.npy", "not a readable .npy"),
        ("empty.npy", "empty file"),
        ("text.npy", "no numpy header"),
        ("obj.npy", "Python objects"),
    ]
    np.savez(t / "ok.npz", a=x)
    z = (t / "ok.npz").read_bytes()
    (t / "trunc.npz").write_bytes(z[: len(z) // 2])
    (t / "empty.npz").write_bytes(b"")
    (t / "text.npz").write_text("not a zip\n")
    cases += [
        ("trunc.npz", "not a readable .npz"),
        ("empty.npz", "not a readable .npz"),
        ("text.npz", "not a readable .npz"),
    ]
    scipy.io.savemat(t / "ok.mat", {"X": x})
    m = (t / "ok.mat").read_bytes()
    (t / "trunc.mat").write_bytes(m[: len(m) - 40])
    (t / "empty.mat").write_bytes(b"")
    (t / "text.mat").write_text("MATLAB? no\n" * 20)
    cases += [
        ("trunc.mat", "not a readable MATLAB"),
        ("empty.mat", "not a readable MATLAB"),
        ("text.mat", "not a readable MATLAB"),
    ]
    write_vecs(t / "ok.fvecs", x, "<f4")
    f = (t / "ok.fvecs").read_bytes()
    (t / "trunc.fvecs").write_bytes(f[:-3])
    (t / "empty.fvecs").write_bytes(b"")
    (t / "tiny.fvecs").write_bytes(b"\x05\x00")
    bad_dim = bytearray(f)
    bad_dim[4 + 5 * 4 : 4 + 5 * 4 + 4] = np.int32(6).tobytes()  # record 1 claims dimension 6
    (t / "dim.fvecs").write_bytes(bytes(bad_dim[: len(f) - 4]) + np.float32(0).tobytes())
    (t / "neg.fvecs").write_bytes(np.int32(-4).tobytes() + b"\x00" * 16)
    (t / "text.fvecs").write_text("1.0 2.0 3.0\n")
    cases += [
        ("trunc.fvecs", "not a multiple of the record size"),
        ("empty.fvecs", "empty file"),
        ("tiny.fvecs", "truncated"),
        ("dim.fvecs", "record 1 has dimension header 6"),
        ("neg.fvecs", "dimension header -4"),
        ("text.fvecs", "dimension header"),
    ]
    write_vecs(t / "ok.bvecs", np.arange(12).reshape(3, 4), "u1")
    (t / "trunc.bvecs").write_bytes((t / "ok.bvecs").read_bytes()[:-1])
    cases += [("trunc.bvecs", "not a multiple of the record size")]
    features = [(n, read_features, msg) for n, msg in cases]
    write_vecs(t / "ok.ivecs", np.arange(12).reshape(3, 4), "<i4")
    iv = (t / "ok.ivecs").read_bytes()
    (t / "trunc.ivecs").write_bytes(iv[:-2])
    (t / "empty.ivecs").write_bytes(b"")
    (t / "dim.ivecs").write_bytes(iv[:20] + np.int32(9).tobytes() + iv[24:])
    (t / "empty.txt").write_text("")
    (t / "blank.txt").write_text("\n\n  \n")
    (t / "word.txt").write_text("1 2 3\n4 five 6\n")
    (t / "float.txt").write_text("1 2.5 3\n")
    (t / "neg.txt").write_text("1 -1 3\n")
    (t / "bin.txt").write_bytes(b"1 2 \xff\n")
    ranks = [
        ("trunc.ivecs", "not a multiple of the record size"),
        ("empty.ivecs", "empty file"),
        ("dim.ivecs", "record 1 has dimension header 9"),
        ("empty.txt", "empty file"),
        ("blank.txt", "empty file"),
        ("word.txt", "line 2: 'five' is not an integer index"),
        ("float.txt", "line 1: '2.5' is not an integer index"),
        ("neg.txt", "line 1: -1 is not an index"),
        ("bin.txt", "not ASCII"),
        ("trunc.npy", "not a readable .npy"),
        ("trunc.npz", "not a readable .npz"),
        ("trunc.mat", "not a readable MATLAB"),
    ]
    return features + [(n, read_ranks, msg) for n, msg in ranks]


def test_malformed_files_are_one_line_errors_naming_the_file(tmp_path, x):
    for name, reader, msg in _malformed(tmp_path, x):
        with pytest.raises(InputError) as exc:
            reader(tmp_path / name)
        text = str(exc.value)
        assert text.startswith(str(tmp_path / name) + ": "), (name, text)
        assert msg in text, (name, msg, text)
        assert "\n" not in text, (name, text)


def test_other_file_types_name_what_is_accepted(tmp_path):
    for name, reader, accepted in [
        ("x.csv", read_features, ".npy, .npz, .mat, .h5, .fvecs, .bvecs"),
        ("x.pkl", read_ranks, ".npy, .npz, .mat, .ivecs, .txt"),
        ("noext", read_matrix, ".npy, .npz, .mat"),
    ]:
        (tmp_path / name).write_text("1\n")
        with pytest.raises(
            InputError, match=f"unsupported file type .*: .* are read from {accepted}"
        ):
            reader(tmp_path / name)
    with pytest.raises(InputError, match="file not found"):
        read_features(tmp_path / "missing.npy")


def _mat73(path, arrays):
    """A MATLAB v7.3 file as MATLAB writes it: HDF5 after a 512-byte header, arrays transposed."""
    import h5py

    with h5py.File(path, "w", userblock_size=512) as f:
        for k, v in arrays.items():
            f[k] = np.asarray(v).T
    with open(path, "r+b") as fh:
        fh.write(
            b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 HDF5 schema 1.00 ."
        )


def test_mat_v73_through_h5py(tmp_path, x):
    pytest.importorskip("h5py")
    _mat73(tmp_path / "rev73.mat", {"X": x.T, "Q": x[:2].T})  # revisitop's d x n, as MATLAB sees it
    np.testing.assert_array_equal(read_features(tmp_path / "rev73.mat", key="X", layout="d-n"), x)
    np.testing.assert_array_equal(
        read_features(tmp_path / "rev73.mat", key="Q", layout="d-n"), x[:2]
    )
    raw = (tmp_path / "rev73.mat").read_bytes()
    (tmp_path / "trunc73.mat").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="not a readable MATLAB v7.3"):
        read_features(tmp_path / "trunc73.mat", key="X")


def test_mat_v73_without_h5py_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "v73.mat").write_bytes(
        b"MATLAB 7.3 MAT-file".ljust(512, b" ") + b"\x89HDF\r\n\x1a\n" + b"\0" * 64
    )
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py now fails
    with pytest.raises(MissingExtraError, match=r'pip install "oxbench\[mat\]"'):
        read_features(tmp_path / "v73.mat")


@settings(max_examples=150, deadline=None)
@given(
    st.binary(max_size=200),
    st.sampled_from([".npy", ".npz", ".mat", ".fvecs", ".bvecs", ".ivecs", ".txt"]),
)
def test_fuzz_any_bytes_give_an_array_or_one_line(tmp_path_factory, data, suffix):
    """Whatever the bytes: a valid array or one InputError line, never another exception."""
    path = tmp_path_factory.mktemp("fuzz") / f"f{suffix}"
    path.write_bytes(data)
    reader = read_ranks if suffix in (".ivecs", ".txt") else read_features
    try:
        out = reader(path)
    except (InputError, MissingExtraError) as exc:  # (a v7.3 header without h5py installed)
        assert "\n" not in str(exc)
    else:
        assert out.ndim == 2


# ---------------------------------------------------------------------------------------------
# Names for the rows of a feature file (issue 34)


def test_names_from_text_npz_h5_and_mat_agree(tmp_path: Path) -> None:
    from oxbench.formats.arrays import read_names

    h5py = pytest.importorskip("h5py")
    sio = pytest.importorskip("scipy.io")
    names = ["all_souls_000013", "b", "radcliffe_camera_000519"]
    (tmp_path / "n.txt").write_bytes(
        b"\xef\xbb\xbfall_souls_000013.jpg\r\n b \r\nradcliffe_camera_000519\n\n"
    )
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.savez(tmp_path / "f.npz", x=x, names=np.array(names))
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["x"] = x
        f["names"] = np.array([n.encode() for n in names])
    sio.savemat(tmp_path / "cell.mat", {"X": x.T, "names": np.array(names, dtype=object)})
    sio.savemat(tmp_path / "char.mat", {"X": x.T, "names": np.array(names)})  # space-padded rows
    for f in ("n.txt", "f.npz", "f.h5", "cell.mat", "char.mat"):
        assert read_names(tmp_path / f) == tuple(names), f
    assert np.array_equal(read_features(tmp_path / "f.h5", key="x"), x)  # the same file's features


@pytest.mark.parametrize("case", ["blank", "space", "two", "none", "suffix"])
def test_bad_names_files_name_the_problem(tmp_path: Path, case: str) -> None:
    from oxbench.formats.arrays import read_names

    if case == "blank":
        p = tmp_path / "n.txt"
        p.write_text("a\n\nb\n")
        want = "line 2: blank: every line names one row"
    elif case == "space":
        p = tmp_path / "n.txt"
        p.write_text("a\nb c\n")
        want = "line 2: image name 'b c' contains whitespace"
    elif case == "two":
        p = tmp_path / "n.npz"
        np.savez(p, a=np.array(["x"]), b=np.array(["y"]))
        want = "one array of strings; it holds a, b"
    elif case == "none":
        p = tmp_path / "n.npz"
        np.savez(p, x=np.eye(2))
        want = "one array of strings; it holds none"
    else:
        p = tmp_path / "n.csv"
        p.write_text("a\n")
        want = "image names are read from .txt, .npz, .h5, .mat"
    with pytest.raises(InputError, match=re.escape(want)) as exc:
        read_names(p)
    assert str(p) in str(exc.value)
