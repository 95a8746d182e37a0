"""Provenance of every input: one digest function (cached by file identity), input digests in the
config digest and the label, ``trained_on_test_set`` from content."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

from oxbench import provenance
from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.pipelines import RecordOptions, Session
from oxbench.provenance import input_record
from test_features_method import _gnd_only_root

pytest.importorskip("faiss")

D = 8


def _forget() -> None:
    """A new process: nothing remembered in memory."""
    provenance._KNOWN.clear()


def test_file_record_is_its_sha256_size_and_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(5000)
    (tmp_path / "x.bin").write_bytes(data)
    monkeypatch.chdir(tmp_path)
    r = input_record("x.bin")
    assert r.path == str((tmp_path / "x.bin").resolve()) and r.kind == "file"
    assert r.size == 5000 and r.files == 1 and r.sha256 == hashlib.sha256(data).hexdigest()


def test_folder_record_covers_names_sizes_and_contents(tmp_path: Path) -> None:
    d = tmp_path / "set"
    (d / "sub").mkdir(parents=True)
    (d / "a.jpg").write_bytes(b"aaa")
    (d / "sub" / "b.jpg").write_bytes(b"bb")
    r = input_record(d)
    expect = hashlib.sha256()
    for rel, content in (("a.jpg", b"aaa"), ("sub/b.jpg", b"bb")):
        sha = hashlib.sha256(content).hexdigest()
        expect.update(f"{rel}\0{len(content)}\0{sha}\n".encode())
    assert (r.kind, r.size, r.files, r.sha256) == ("folder", 5, 2, expect.hexdigest())
    # only the listed files; the same content under another name is another digest
    only = input_record(d, files=[d / "a.jpg"])
    assert only.files == 1 and only.sha256 != r.sha256
    (d / "sub" / "b.jpg").rename(d / "sub" / "c.jpg")
    assert input_record(d).sha256 != r.sha256
    with pytest.raises(InputError, match="not under the folder"):
        input_record(d, files=[tmp_path / "elsewhere.jpg"])
    with pytest.raises(InputError, match="file not found"):
        input_record(tmp_path / "missing.npy")


def test_a_large_file_is_hashed_once_per_identity_across_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "X.npy"
    big.write_bytes(os.urandom(provenance.CACHE_MIN_BYTES + 10))
    cache = tmp_path / "cache"
    hashed: list[Path] = []
    real = provenance.file_sha256

    def counting(path: str | Path) -> str:
        hashed.append(Path(path))
        return real(path)

    monkeypatch.setattr(provenance, "file_sha256", counting)
    _forget()
    first = input_record(big, cache=cache)
    _forget()
    again = input_record(big, cache=cache)
    assert again == first and hashed == [big]  # the rerun read the cached digest
    # a write changes the identity (size or mtime): hashed again, a new digest
    with open(big, "r+b") as fh:
        fh.write(b"\0" * 16)
    os.utime(big, ns=(1, 1))
    _forget()
    changed = input_record(big, cache=cache)
    assert len(hashed) == 2 and changed.sha256 != first.sha256
    # a damaged cache entry is not trusted
    for entry in (cache / provenance.DIGESTS_FOLDER).iterdir():
        entry.write_text('{"key": "x", "sha256": "0"}')
    _forget()
    assert input_record(big, cache=cache) == changed and len(hashed) == 3


# --- through the runner ------------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def _record(folder: Path) -> dict:
    (path,) = folder.glob("*/*/record.json")
    return json.loads(path.read_text())


def test_the_same_command_on_permuted_features_from_another_folder_is_another_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's case: ``--set descriptor.db_features=X.npy`` typed alike in two folders whose X.npy differ
    by a row permutation gave one config folder and one label. Now: two config folders, two
    labels, and each record names its file by absolute path, size and digest."""
    root = _gnd_only_root(tmp_path / "data")
    rng = np.random.default_rng(0)
    db = rng.normal(size=(30, D)).astype(np.float32)
    q = db[[0, 3, 6]] + 0.01 * rng.normal(size=(3, D)).astype(np.float32)
    for name, x in (("a", db), ("b", db[rng.permutation(30)])):
        (tmp_path / name).mkdir()
        np.save(tmp_path / name / "X.npy", x)
        np.save(tmp_path / name / "Q.npy", q)
    runs = tmp_path / "runs"
    from oxbench.pipelines import run

    for name in ("a", "b", "a"):
        monkeypatch.chdir(tmp_path / name)
        run(
            "roxford5k",
            "features",
            overrides={"descriptor.db_features": "X.npy", "descriptor.query_features": "Q.npy"},
            session=Session(root=root, cache=tmp_path / "c", progress=False, strict=False),
            record=RecordOptions(runs_dir=runs),
        )
    records = [json.loads(p.read_text()) for p in runs.glob("*/*/record.json")]
    assert len(records) == 3
    for rec in records:
        x = rec["inputs"]["settings"]["db_features"]
        folder = Path(x["path"]).parent
        assert x["path"] == str((folder / "X.npy").resolve()) and folder.name in "ab"
        assert x["sha256"] == hashlib.sha256((folder / "X.npy").read_bytes()).hexdigest()
        assert x["size"] == (folder / "X.npy").stat().st_size
        gnd = root / "roxford5k" / "gnd_roxford5k.pkl"
        assert rec["inputs"]["ground_truth"] == input_record(gnd).to_dict()
        assert (
            rec["inputs"]["ground_truth"]["sha256"] == hashlib.sha256(gnd.read_bytes()).hexdigest()
        )
        assert rec["inputs"]["dataset_files"]["gnd_roxford5k.pkl"] == input_record(gnd).to_dict()
        assert rec["inputs"]["images"]["database"] is None  # no pixels read
    labels = sorted({rec["label"] for rec in records})
    folders = sorted(p for p in runs.iterdir() if p.is_dir())
    assert len(folders) == 2, folders  # a and b apart; a's rerun beside a's first run
    assert sorted(len(list(f.glob("*/record.json"))) for f in folders) == [1, 2]
    assert len(set(labels)) == 2 and all(lab.startswith("features @") for lab in labels), labels
    cfg = [json.loads((f / "config.json").read_text()) for f in folders]
    db_inputs = [c["inputs"]["db_features"] for c in cfg]
    assert db_inputs[0]["sha256"] != db_inputs[1]["sha256"]
    assert cfg[0]["inputs"]["query_features"] == cfg[1]["inputs"]["query_features"]
    # report puts them side by side as two rows instead of refusing one label
    code, md = _cli(capsys, "report", *map(str, folders))
    assert code == 0 and all(lab in md for lab in labels), md
    # the command line with one --out: the second folder's files are refused there, one line
    args = ["run", "--dataset", "roxford5k", "--method", "features", "--root", str(root)]
    args += ["--cache", str(tmp_path / "c"), "--no-progress", "--allow-partial"]
    args += ["--set", "descriptor.db_features=X.npy", "--set", "descriptor.query_features=Q.npy"]
    args += ["--out", str(tmp_path / "one")]
    for name, want in (("a", 0), ("b", 2)):
        monkeypatch.chdir(tmp_path / name)
        code, out = _cli(capsys, *args)
        assert code == want, out
    errors = [line for line in out.splitlines() if not line.startswith("WARNING")]
    assert len(errors) == 1 and "written by another config (differs in: inputs)" in errors[0], out
    assert len(list((tmp_path / "one").glob("*/record.json"))) == 1


def _train_run(tmp_path: Path, train: np.ndarray, tag: str) -> dict:
    root = tmp_path / "data"
    if not root.exists():
        _gnd_only_root(root)
    rng = np.random.default_rng(1)
    db = rng.normal(size=(30, D)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", db[[0, 3, 6]] + 0.01)
    np.save(tmp_path / f"{tag}.npy", train(db) if callable(train) else train)
    from oxbench.pipelines import run

    out = run(
        "roxford5k",
        "features",
        overrides={
            "descriptor.db_features": str(tmp_path / "db.npy"),
            "descriptor.query_features": str(tmp_path / "q.npy"),
            "whitening": "pca",
            "descriptor.train_features": str(tmp_path / f"{tag}.npy"),
        },
        session=Session(root=root, cache=tmp_path / "c", progress=False, strict=False),
        record=RecordOptions(out=tmp_path / "runs" / tag),
    )
    return {"config": out.config.to_dict(), "info": dict(out.info), "summary": out.run_dir}


def test_training_on_the_test_database_is_flagged_from_content(tmp_path: Path) -> None:
    """``--set whitening=pca --set descriptor.train_features=X.npy`` where X.npy is the test database (or holds
    it among other rows, shuffled) is marked ``trained_on_test_set``; unrelated rows are not."""
    rng = np.random.default_rng(7)
    other = rng.normal(size=(40, D)).astype(np.float32)
    cases = {
        "same": lambda db: db,
        "inside": lambda db: np.vstack([other, db])[rng.permutation(70)],
        "queries": lambda db: np.vstack([other, db[[0, 3, 6]] + 0.01]),
        "other": other,
        "most": lambda db: np.vstack([other, db[:29]]),  # one database row missing, no query rows
    }
    flagged = {}
    for tag, train in cases.items():
        res = _train_run(tmp_path, train, tag)
        flagged[tag] = res["config"]["trained_on_test_set"]
        assert res["info"]["trained_on_test_set"] == flagged[tag]
        if flagged[tag]:
            assert "train_features" in res["info"]["trained_on_test_set_why"]
            assert "not comparable" in (res["summary"] / "summary.txt").read_text()
    assert flagged == {"same": True, "inside": True, "queries": True, "other": False, "most": False}


def test_image_sets_and_ground_truth_of_a_dataset_are_recorded(tmp_path: Path) -> None:
    pytest.importorskip("PIL.Image")
    from oxbench.datasets import load
    from oxbench.pipelines.runner import run_inputs
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    bench = load("synthetic", root, progress=False)
    got = run_inputs(bench, {}, tmp_path / "cache")
    db = got["images"]["database"]
    paths = [bench.database.path(i) for i in range(len(bench.database))]
    assert db["files"] == bench.gt.n_db and db["size"] == sum(p.stat().st_size for p in paths)
    # the digest is the folder digest of exactly those files, by their names under the folder
    folder = Path(db["path"])
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.resolve().relative_to(folder).as_posix()):
        rel = p.resolve().relative_to(folder).as_posix()
        h.update(
            f"{rel}\0{p.stat().st_size}\0{hashlib.sha256(p.read_bytes()).hexdigest()}\n".encode()
        )
    assert db["sha256"] == h.hexdigest()
    assert got["images"]["queries"]["files"] == len(bench.queries)
    assert got["images"]["distractors"] is None
    assert got["ground_truth"]["sha256"] == input_record(bench.gt.source).sha256
    # one changed image changes the set's digest (a rerun only stats the files)
    with open(paths[3], "ab") as fh:
        fh.write(b"\0")
    assert run_inputs(bench, {}, tmp_path / "cache")["images"]["database"]["sha256"] != db["sha256"]


def test_an_image_set_named_relative_to_the_working_folder_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Images found under a relative data root (``--root small``) are paths relative to the working
    folder, not to their common folder: the record hashes the files themselves."""
    from oxbench.provenance import image_set_record

    (tmp_path / "small" / "jpg").mkdir(parents=True)
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / "small" / "jpg" / name).write_bytes(name.encode())
    monkeypatch.chdir(tmp_path)
    rel = image_set_record([Path("small/jpg/a.jpg"), Path("small/jpg/b.jpg")])
    absolute = image_set_record([tmp_path / "small/jpg/a.jpg", tmp_path / "small/jpg/b.jpg"])
    assert rel == absolute and rel["path"] == str(tmp_path / "small" / "jpg")
