"""Bring your own features: the user's descriptor files through whitening / QE / DBA / diffusion /
FAISS search, the same runner and run folder, and the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.datasets import load
from oxbench.errors import InputError
from oxbench.pipelines import GlobalMethod, resolve_method, run
from oxbench.pipelines.runner import list_runs
from oxbench.train.pairs import matching_pairs
from test_pipeline import make_tiny_root

pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

D = 8


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def write_features(root: Path, dataset: str, folder: Path, *, noise: float, seed: int) -> tuple[Path, Path]:
    """Descriptors that know the labels: each landmark a direction, its images near it, others random."""
    gt = load(dataset, root, progress=False).gt
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(gt.queries), D))
    db = rng.normal(size=(gt.n_db, D))
    for qi, q in enumerate(gt.queries):
        db[q.positives] = centres[qi] + noise * rng.normal(size=(len(q.positives), D))
    queries = centres + noise * rng.normal(size=centres.shape)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "db.npy", db.astype(np.float32))
    np.save(folder / "q.npy", queries.astype(np.float32))
    return folder / "db.npy", folder / "q.npy"


@pytest.fixture(scope="module")
def files(tiny_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("features")
    db, q = write_features(tiny_root, "synthetic", folder / "test", noise=0.5, seed=0)
    tdb, tq = write_features(tiny_root, "synthetic-train", folder / "train", noise=0.5, seed=1)
    train = np.vstack([np.load(tdb), np.load(tq)])
    np.save(folder / "train.npy", train)
    np.save(folder / "pairs.npy", matching_pairs(load("synthetic-train", tiny_root, progress=False).gt))
    return {"db": db, "q": q, "train": folder / "train.npy", "pairs": folder / "pairs.npy"}


def go(root: Path, tmp: Path, method: str, files: dict[str, Path], cache: Path | None = None, **overrides: object):
    sets = {"db_features": str(files["db"]), "query_features": str(files["q"]), **overrides}
    return run("synthetic", method, root=root, out=tmp / method, cache=cache or tmp / "cache", overrides=sets,
               progress=False)  # fmt: skip


def test_presets_and_settings() -> None:
    m = resolve_method("features-diffusion", db_features="a.npy", query_features="b.npy", diffusion_k=7)
    assert isinstance(m, GlobalMethod) and m.descriptor == "features" and m.rerank == "diffusion"
    assert not m.needs_training and m.to_dict()["diffusion_k"] == 7
    with pytest.raises(InputError, match="unknown search 'annoy'"):
        resolve_method("features", search="annoy")
    with pytest.raises(InputError, match="nprobe 9 is larger than nlist 8"):
        resolve_method("features-ivfpq", nlist=8, nprobe=9)


def test_own_features_through_the_runner(tiny_root: Path, tmp_path: Path, files: dict[str, Path]) -> None:
    out = go(tiny_root, tmp_path, "features", files)
    assert out.config.train_dataset is None and out.info["feature_files"]["db"] == str(files["db"])
    assert out.info["bytes_per_image"] == D * 4 and out.info["search"] == {"kind": "exact"}
    base = out.result.setups["medium"].map
    assert base > 0.5
    (run_dir,) = list_runs(out.config_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["run"]["bytes_per_image"] == D * 4
    # every re-ranking runs through the same chain and records what it did
    for method, extra, key in (
        ("features-alpha-qe", {}, None),
        ("features-dba", {}, "dba"),
        ("features-diffusion", {"diffusion_k": 5, "diffusion_query_k": 3}, "diffusion"),
        ("features", {"search": "faiss-flat"}, "search"),
        ("features", {"whitening": "pca", "train_features": str(files["train"])}, "whitening"),
        ("features", {"whitening": "learned", "train_features": str(files["train"]),
                      "train_pairs": str(files["pairs"])}, "whitening"),
    ):  # fmt: skip
        res = go(tiny_root, tmp_path / f"{method}-{len(extra)}-{key}", method, files, **extra)
        assert 0.0 < res.result.setups["medium"].map <= 1.0
        if key is not None:
            assert key in res.info, (method, key)
    flat = go(tiny_root, tmp_path / "flat", "features", files, cache=tmp_path / "c", search="faiss-flat")
    np.testing.assert_allclose(flat.result.setups["medium"].map, base, atol=1e-9)
    assert flat.info["search"]["kind"] == "flat" and flat.record["cache"]["search_index"] == "computed"
    again = go(tiny_root, tmp_path / "flat2", "features", files, cache=tmp_path / "c", search="faiss-flat")
    assert again.record["cache"]["search_index"] == "hit"


def test_learned_whitening_kind_and_provenance(tiny_root: Path, tmp_path: Path, files: dict[str, Path]) -> None:
    res = go(tiny_root, tmp_path, "features", files, whitening="learned", train_features=str(files["train"]),
             train_pairs=str(files["pairs"]))  # fmt: skip
    assert res.info["whitening"]["kind"] == "learned" and str(files["train"]) in res.info["whitening"]["fitted_on"]


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("case", ["dim", "rows", "no-train", "ivf-nlist", "few-images"])
def test_bad_input_is_one_line_exit_2_and_no_run(
    case: str, tiny_root: Path, tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    db, q = files["db"], files["q"]
    extra: list[str] = []
    if case == "dim":
        q = tmp_path / "q8.npy"
        np.save(q, np.load(files["q"])[:, :5])
        want = "query descriptors have dimension 5, the database descriptors"
    elif case == "rows":
        db = tmp_path / "short.npy"
        np.save(db, np.load(files["db"])[:-1])
        want = "descriptors for synthetic's 40 database images"
    elif case == "no-train":
        extra = ["--set", "whitening=pca"]
        want = "needs training descriptors that are not the test set's: set train_features=PATH"
    elif case == "ivf-nlist":
        extra = ["--set", "search=faiss-ivfpq", "--set", "nlist=64", "--set", "nprobe=4"]
        want = "nlist 64 is larger than the database (40 vectors)"
    else:
        few = tmp_path / "few.npy"
        np.save(few, np.load(files["train"])[:6])
        extra = ["--set", "whitening=learned", "--set", f"train_features={few}", "--set", f"train_pairs={files['pairs']}"]
        want = "needs more than 8 images and at least 8 matching pairs; got 6 images"
    out = tmp_path / "run"
    code, err = cli(capsys, "run", "--method", "features", "--root", str(tiny_root), "--out", str(out),
                    "--cache", str(tmp_path / "c"), "--no-progress", "--set", f"db_features={db}",
                    "--set", f"query_features={q}", *extra)  # fmt: skip
    assert code == 2 and want in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list_runs(out) == []
    assert not [p for p in out.rglob("*") if p.name != "config.json" and p.is_file()]


def test_corrupt_cached_index_is_rebuilt_with_one_warning(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    go(tiny_root, tmp_path, "features", files, search="faiss-flat")
    (index,) = (tmp_path / "cache").rglob("index-flat-*.npz")
    data = bytearray(index.read_bytes())
    data[len(data) // 2] ^= 0x01
    index.write_bytes(bytes(data))
    out = tmp_path / "again"
    code, err = cli(capsys, "run", "--method", "features", "--root", str(tiny_root), "--out", str(out),
                    "--cache", str(tmp_path / "cache"), "--no-progress", "--set", f"db_features={files['db']}",
                    "--set", f"query_features={files['q']}", "--set", "search=faiss-flat")  # fmt: skip
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(index) in lines[0] and "building the index again" in lines[0], err
    (run_dir,) = list_runs(out)
    assert json.loads((run_dir / "record.json").read_text())["cache"]["search_index"] == "computed"
