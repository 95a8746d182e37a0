"""Bring your own features: the user's descriptor files through whitening / QE / DBA / diffusion /
FAISS search, the same runner and run folder, and the refusals (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.datasets import load
from oxbench.errors import InputError
from oxbench.pipelines import GlobalConfig, RecordOptions, Session, resolve_method, run
from oxbench.pipelines.runner import list_runs
from oxbench.provenance import input_records, inputs_digest
from oxbench.train.pairs import matching_pairs
from test_pipeline import ground_truth_only, make_tiny_root

pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

D = 8


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def write_features(
    root: Path, dataset: str, folder: Path, *, noise: float, seed: int
) -> tuple[Path, Path]:
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
    np.save(
        folder / "pairs.npy", matching_pairs(load("synthetic-train", tiny_root, progress=False).gt)
    )
    return {"db": db, "q": q, "train": folder / "train.npy", "pairs": folder / "pairs.npy"}


def go(
    root: Path,
    tmp: Path,
    method: str,
    files: dict[str, Path],
    cache: Path | None = None,
    **overrides: object,
):
    sets = {
        "descriptor.db_features": str(files["db"]),
        "descriptor.query_features": str(files["q"]),
        **overrides,
    }
    return run(
        "synthetic",
        method,
        overrides=sets,
        session=Session(root=root, cache=cache or tmp / "cache", progress=False),
        record=RecordOptions(out=tmp / method),
    )


def test_presets_and_settings() -> None:
    m = resolve_method(
        "features-diffusion",
        **{
            "descriptor.db_features": "a.npy",
            "descriptor.query_features": "b.npy",
            "diffusion.k": 7,
        },
    )
    assert (
        isinstance(m, GlobalConfig) and m.descriptor.kind == "files" and m.rerank == ("diffusion",)
    )
    assert not m.needs_training and m.to_dict()["diffusion"]["k"] == 7
    with pytest.raises(
        InputError,
        match="setting search: expected one of exact, faiss-flat, faiss-ivfpq, mapped, got 'annoy'",
    ):
        resolve_method("features", search="annoy")
    with pytest.raises(InputError, match="nprobe 9 is larger than nlist 8"):
        resolve_method("features-ivfpq", **{"search.nlist": 8}, **{"search.nprobe": 9})


def test_own_features_through_the_runner(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path]
) -> None:
    out = go(tiny_root, tmp_path, "features", files)
    assert out.config.train_dataset is None and out.info["feature_files"]["db"] == str(files["db"])
    assert out.info["bytes_per_image"] == D * 4 and out.info["search"] == {"kind": "exact"}
    base = out.result.setups["medium"].map
    assert base > 0.5
    (run_dir,) = list_runs(out.config_dir)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["run"]["bytes_per_image"] == D * 4
    # the synthetic city's generation seed is recorded with the method's seeds
    seeds = json.loads((run_dir / "record.json").read_text())["seeds"]
    assert seeds == {"dataset.seed": 0}  # exact search and the files kind have no seed
    # every re-ranking runs through the same chain and records what it did
    for method, extra, key in (
        ("features-alpha-qe", {}, None),
        ("features-dba", {}, "dba"),
        ("features-diffusion", {"diffusion.k": 5, "diffusion.query_k": 3}, "diffusion"),
        ("features", {"search": "faiss-flat"}, "search"),
        (
            "features",
            {"whitening": "pca", "descriptor.train_features": str(files["train"])},
            "whitening",
        ),
        (
            "features",
            {
                "whitening": "learned",
                "descriptor.train_features": str(files["train"]),
                "descriptor.train_pairs": str(files["pairs"]),
            },
            "whitening",
        ),
    ):
        res = go(tiny_root, tmp_path / f"{method}-{len(extra)}-{key}", method, files, **extra)
        assert 0.0 < res.result.setups["medium"].map <= 1.0
        if key is not None:
            assert key in res.info, (method, key)
    flat = go(
        tiny_root, tmp_path / "flat", "features", files, cache=tmp_path / "c", search="faiss-flat"
    )
    np.testing.assert_allclose(flat.result.setups["medium"].map, base, atol=1e-9)
    assert (
        flat.info["search"]["kind"] == "faiss-flat"
        and flat.record["cache"]["search_index"] == "computed"
    )
    again = go(
        tiny_root, tmp_path / "flat2", "features", files, cache=tmp_path / "c", search="faiss-flat"
    )
    assert again.record["cache"]["search_index"] == "hit"


def test_own_global_features_run_on_a_synthetic_root_of_ground_truth_only(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path]
) -> None:
    """Issue 43 case 13: a synthetic root without jpg/ refused own-file runs ("image listed in the
    ground truth is missing"), though they read no pixel; now the same numbers as with images."""
    bare = ground_truth_only(tiny_root, tmp_path / "bare")
    extra = {"whitening": "pca", "descriptor.train_features": str(files["train"])}
    full = go(tiny_root, tmp_path / "full", "features", files, **extra)
    got = go(bare, tmp_path / "got", "features", files, **extra)
    np.testing.assert_array_equal(
        np.load(got.run_dir / "ranks.npy"), np.load(full.run_dir / "ranks.npy")
    )
    assert not (bare / "synthetic" / "jpg").exists()  # nothing generated either
    assert got.config_dir.name == full.config_dir.name  # same method, same files: same label


def test_offline_diffusion_records_its_memory_and_matches_online_without_truncation(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path]
) -> None:
    kw = {
        "diffusion.k": 5,
        "diffusion.query_k": 3,
        "diffusion.truncation": 40,
        "diffusion.iterations": 200,
    }
    online = go(tiny_root, tmp_path / "on", "features-diffusion", files, **kw)
    offline = go(
        tiny_root,
        tmp_path / "off",
        "features-diffusion",
        files,
        **{"diffusion.mode": "offline"},
        **kw,
    )
    info = offline.info["diffusion"]
    assert info["mode"] == "offline" and info["normalise"] == "full" and info["k"] == 5
    assert info["offline_nnz_per_image"] == 40 and info["offline_bytes_per_image"] >= 40 * 8
    assert "offline_bytes_per_image" not in online.info["diffusion"]
    assert offline.config.method.to_dict()["diffusion"]["mode"] == "offline"
    np.testing.assert_allclose(
        offline.result.setups["medium"].map, online.result.setups["medium"].map, atol=1e-9
    )


def test_learned_whitening_kind_and_provenance(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path]
) -> None:
    res = go(
        tiny_root,
        tmp_path,
        "features",
        files,
        whitening="learned",
        **{
            "descriptor.train_features": str(files["train"]),
            "descriptor.train_pairs": str(files["pairs"]),
        },
    )
    assert (
        res.info["whitening"]["kind"] == "learned"
        and str(files["train"]) in res.info["whitening"]["fitted_on"]
    )


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return int(exc.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize(
    "case",
    [
        "dim",
        "rows",
        "no-train",
        "ivf-nlist",
        "few-images",
        "diffusion-k",
        "diffusion-truncation",
        "diffusion-alpha",
        "diffusion-alpha-text",
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_run(
    case: str,
    tiny_root: Path,
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
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
        want = "needs training descriptors that are not the test set's: set descriptor.train_features=PATH"
    elif case == "ivf-nlist":
        extra = [
            "--set",
            "search=faiss-ivfpq",
            "--set",
            "search.nlist=64",
            "--set",
            "search.nprobe=4",
        ]
        want = "nlist 64 is larger than the database (40 vectors)"
    elif case == "diffusion-k":
        extra = ["--set", "rerank=diffusion", "--set", "diffusion.k=41"]
        want = "diffusion.k=41 is larger than the database (40 images)"
    elif case == "diffusion-truncation":
        extra = ["--set", "rerank=diffusion", "--set", "diffusion.truncation=0"]
        want = "setting diffusion.truncation: must be in [1, 16777216], got 0"
    elif case == "diffusion-alpha":
        extra = ["--set", "rerank=diffusion", "--set", "diffusion.alpha=NaN"]
        want = "setting diffusion.alpha: expected a finite number, got 'NaN'"
    elif case == "diffusion-alpha-text":
        extra = ["--set", "rerank=diffusion", "--set", "diffusion.alpha=nan"]
        want = "setting diffusion.alpha: expected a finite number, got 'nan'"
    else:
        few = tmp_path / "few.npy"
        np.save(few, np.load(files["train"])[:6])
        extra = [
            "--set",
            "whitening=learned",
            "--set",
            f"descriptor.train_features={few}",
            "--set",
            f"descriptor.train_pairs={files['pairs']}",
        ]
        want = "needs more than 8 images and at least 8 matching pairs; got 6 images"
    out = tmp_path / "run"
    code, err = cli(
        capsys,
        "run",
        "--method",
        "features",
        "--root",
        str(tiny_root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        "--no-progress",
        "--set",
        f"descriptor.db_features={db}",
        "--set",
        f"descriptor.query_features={q}",
        *extra,
    )
    assert code == 2 and want in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert list_runs(out) == []
    assert not [p for p in out.rglob("*") if p.name != "config.json" and p.is_file()]


def test_corrupt_cached_index_is_rebuilt_with_one_warning(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    go(tiny_root, tmp_path, "features", files, search="faiss-flat")
    (index,) = (tmp_path / "cache").rglob("index-faiss-flat-*.npz")
    data = bytearray(index.read_bytes())
    data[len(data) // 2] ^= 0x01
    index.write_bytes(bytes(data))
    out = tmp_path / "again"
    code, err = cli(
        capsys,
        "run",
        "--method",
        "features",
        "--root",
        str(tiny_root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "cache"),
        "--no-progress",
        "--set",
        f"descriptor.db_features={files['db']}",
        "--set",
        f"descriptor.query_features={files['q']}",
        "--set",
        "search=faiss-flat",
    )
    assert code == 0, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(index) in lines[0] and "building the index again" in lines[0], (
        err
    )
    (run_dir,) = list_runs(out)
    assert json.loads((run_dir / "record.json").read_text())["cache"]["search_index"] == "computed"


# ---------------------------------------------------------------------------------------------
# Features from the ground truth alone (issue 20): no image file is needed when no step reads pixels


def _gnd_only_root(root: Path, n_db: int = 30, n_q: int = 3) -> Path:
    """``<root>/roxford5k/gnd_roxford5k.pkl`` and nothing else (no jpg/)."""
    import pickle

    d = root / "roxford5k"
    d.mkdir(parents=True)
    gnd = [
        {"bbx": [0.0, 0.0, 10.0, 10.0], "easy": [3 * q], "hard": [3 * q + 1], "junk": [3 * q + 2]}
        for q in range(n_q)
    ]
    names = [f"img_{i:03d}" for i in range(n_db)]
    (d / "gnd_roxford5k.pkl").write_bytes(
        pickle.dumps({"imlist": names, "qimlist": [f"q{q}" for q in range(n_q)], "gnd": gnd})
    )
    return root


def test_features_run_from_ground_truth_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _gnd_only_root(tmp_path / "data")
    rng = np.random.default_rng(0)
    db = rng.normal(size=(30, D)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", db[[0, 3, 6]] + 0.01)
    args = [
        "run",
        "--dataset",
        "roxford5k",
        "--method",
        "features-diffusion",
        "--root",
        str(root),
        "--no-progress",
        "--cache",
        str(tmp_path / "c"),
        "--set",
        f"descriptor.db_features={tmp_path / 'db.npy'}",
        "--set",
        f"descriptor.query_features={tmp_path / 'q.npy'}",
        "--set",
        "diffusion.k=5",
    ]
    code, err = cli(capsys, *args, "--out", str(tmp_path / "strict"))
    assert (
        code == 2 and "expected 4993" in err and len(err.strip().splitlines()) == 1
    )  # counts still checked
    with pytest.raises(SystemExit) as exc:
        main([*args, "--out", str(tmp_path / "run"), "--allow-partial"])
    out, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    assert out.startswith("roxford5k: mAP E: ")
    (run_dir,) = list_runs(tmp_path / "run")
    texts = {p.name: p.read_text() for p in run_dir.iterdir() if p.suffix == ".json"}
    assert any(
        '"images": "not used"' in t or '"option.images": "not used"' in t for t in texts.values()
    ), list(texts)
    # a method that reads pixels still needs the images, and says so
    code, err = cli(
        capsys,
        "run",
        "--dataset",
        "roxford5k",
        "--method",
        "rootsift-bow",
        "--root",
        str(root),
        "--out",
        str(tmp_path / "bow"),
        "--allow-partial",
        "--no-progress",
        "--train-dataset",
        "roxford5k",
    )
    assert code == 2 and "image(s) of roxford5k are missing" in err, err


def _real_roxford_root(shared_data: Path, tmp_path: Path) -> Path:
    """A data root holding the real ROxford ground truth alone (a link to the shared file)."""
    (tmp_path / "data" / "roxford5k").mkdir(parents=True)
    (tmp_path / "data" / "roxford5k" / "gnd_roxford5k.pkl").symlink_to(
        shared_data / "roxford5k/gnd_roxford5k.pkl"
    )
    return tmp_path / "data"


def _headline(
    capsys: pytest.CaptureFixture[str], root: Path, method: str, out: Path, sets: list[str]
) -> str:
    """``oxbench run --dataset roxford5k --method METHOD --set ...``: its first output line."""
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--dataset",
                "roxford5k",
                "--method",
                method,
                "--root",
                str(root),
                "--out",
                str(out),
                "--cache",
                str(out.parent / "c"),
                "--no-progress",
                *(a for s in sets for a in ("--set", s)),
            ]
        )
    stdout, err = capsys.readouterr()
    assert exc.value.code in (0, None), err
    return stdout.splitlines()[0]


@pytest.mark.shared_data
def test_real_lopq_diffusion_beats_cosine(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`oxbench run --method features-diffusion` on the lopq ROxford descriptors (Iscen et al.'s 5K
    global settings: k 50, query k 10, alpha 0.99, gamma 3, R 1000), ground truth only, no images:
    above the cosine baseline E/M/H 28.89 / 21.13 / 4.60 on every setup."""
    from oxbench.formats.revisitop import read_gnd

    old = read_gnd(shared_data / "oxford5k/gnd_oxford5k.pkl")
    raw = np.fromfile(shared_data / "oxford5k/lopq_features/oxford_features.fvecs", dtype=np.int32)
    x = raw.reshape(-1, int(raw[0]) + 1)[:, 1:].view(np.float32)
    row = {n: i for i, n in enumerate(sorted(old.db_names))}
    rev = read_gnd(shared_data / "roxford5k/gnd_roxford5k.pkl")
    np.save(tmp_path / "db.npy", x[[row[n] for n in rev.db_names]])
    np.save(tmp_path / "q.npy", x[[row[n] for n in rev.query_names]])
    root = _real_roxford_root(shared_data, tmp_path)
    files = [
        f"descriptor.db_features={tmp_path / 'db.npy'}",
        f"descriptor.query_features={tmp_path / 'q.npy'}",
    ]
    maps = {
        method: _headline(capsys, root, method, tmp_path / method, files)
        for method in ("features", "features-diffusion")
    }
    assert maps["features"] == "roxford5k: mAP E: 28.89, M: 21.13, H: 4.60"
    e, m, h = (float(v) for v in maps["features-diffusion"].replace(",", "").split()[3::2])
    assert e > 28.89 and m > 21.13 and h > 4.60, maps


# ---------------------------------------------------------------------------------------------
# revisitop's single .mat (X and Q, one column per image) and labelled ablations (issue 24)


def _gnd_only_features(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    root = _gnd_only_root(tmp_path / "data")
    rng = np.random.default_rng(0)
    db = rng.normal(size=(30, D)).astype(np.float32)
    return root, db, db[[0, 3, 6]] + 0.01 * rng.normal(size=(3, D)).astype(np.float32)


def test_one_revisitop_mat_with_x_and_q_runs_as_evaluate_reads_it(tmp_path: Path) -> None:
    sio = pytest.importorskip("scipy.io")
    root, db, q = _gnd_only_features(tmp_path)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", q)
    sio.savemat(
        tmp_path / "feats.mat", {"X": db.T, "Q": q.T}
    )  # revisitop: [d, n] columns per image
    common = {"session": Session(root=root, cache=tmp_path / "c", strict=False, progress=False)}
    plain = run(
        "roxford5k",
        "features",
        **common,
        overrides={
            "descriptor.db_features": str(tmp_path / "db.npy"),
            "descriptor.query_features": str(tmp_path / "q.npy"),
        },
        record=RecordOptions(out=tmp_path / "npy"),
    )
    mat = run(
        "roxford5k",
        "features",
        **common,
        overrides={
            "descriptor.db_features": str(tmp_path / "feats.mat"),
            "descriptor.key": "X",
            "descriptor.query_features": str(tmp_path / "feats.mat"),
            "descriptor.query_key": "Q",
            "descriptor.layout": "d-n",
        },
        record=RecordOptions(out=tmp_path / "mat"),
    )
    assert np.array_equal(np.load(plain.run_dir / "ranks.npy"), np.load(mat.run_dir / "ranks.npy"))
    # the layout per file: the query array stored as rows while the database is columns
    sio.savemat(tmp_path / "q_rows.mat", {"Q": q})
    rows = run(
        "roxford5k",
        "features",
        **common,
        overrides={
            "descriptor.db_features": str(tmp_path / "feats.mat"),
            "descriptor.key": "X",
            "descriptor.layout": "d-n",
            "descriptor.query_features": str(tmp_path / "q_rows.mat"),
            "descriptor.query_key": "Q",
            "descriptor.query_layout": "n-d",
        },
        record=RecordOptions(out=tmp_path / "rows"),
    )
    assert np.array_equal(np.load(plain.run_dir / "ranks.npy"), np.load(rows.run_dir / "ranks.npy"))
    with pytest.raises(
        InputError, match="Q"
    ):  # without query_key the query file is read with key X
        run(
            "roxford5k",
            "features",
            **common,
            overrides={
                "descriptor.db_features": str(tmp_path / "feats.mat"),
                "descriptor.key": "X",
                "descriptor.query_features": str(tmp_path / "q_rows.mat"),
                "descriptor.layout": "d-n",
            },
            record=RecordOptions(out=tmp_path / "nokey"),
        )


def test_an_ablation_of_one_preset_is_labelled_in_runs_report_compare_and_plot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three runs of features-alpha-qe differing in alpha-qe.k: default labels name the changed setting,
    and report (md, LaTeX), compare, plot and runs show them; --label replaces the default; a label
    that is not one short line is one line, exit 2, before anything is written."""
    root, db, q = _gnd_only_features(tmp_path)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", q)
    args = [
        "run",
        "--dataset",
        "roxford5k",
        "--method",
        "features-alpha-qe",
        "--root",
        str(root),
        "--no-progress",
        "--cache",
        str(tmp_path / "c"),
        "--allow-partial",
        "--set",
        f"descriptor.db_features={tmp_path / 'db.npy'}",
        "--set",
        f"descriptor.query_features={tmp_path / 'q.npy'}",
    ]
    folders = []
    for i, extra in enumerate(([], ["--set", "alpha-qe.k=2"], ["--set", "alpha-qe.k=10"])):
        code, out = cli_out(capsys, *args, *extra, "--out", str(tmp_path / "runs" / f"r{i}"))
        assert code == 0, out
        folders.append(str(tmp_path / "runs" / f"r{i}"))
    # the files' content digest ends each default label: runs on other files are other rows
    tag = inputs_digest(
        input_records(
            {  # by the kind's setting names: labels as runs recorded them before kinds
                "db_features": tmp_path / "db.npy",
                "query_features": tmp_path / "q.npy",
            }
        )
    )
    labels = [
        f"features-alpha-qe @{tag}",
        f"features-alpha-qe [alpha-qe.k=2] @{tag}",
        f"features-alpha-qe [alpha-qe.k=10] @{tag}",
    ]
    for i, lab in enumerate(labels):
        assert json.loads(next(Path(folders[i]).glob("*/record.json")).read_text())["label"] == lab
    code, md = cli_out(capsys, "report", *folders)
    assert code == 0 and [line.split("|")[1].strip() for line in md.splitlines()[2:5]] == labels, md
    code, tex = cli_out(capsys, "report", *folders, "--format", "latex")
    assert code == 0 and all(lab.replace("_", r"\_") in tex for lab in labels), tex
    code, text = cli_out(capsys, "compare", *folders)
    assert code == 0 and all(f"= {lab} on roxford5k" in text for lab in labels)
    code, listing = cli_out(capsys, "runs", str(tmp_path / "runs"))
    assert code == 0 and all(lab in listing for lab in labels)
    code, listing = cli_out(capsys, "runs", str(tmp_path / "runs"), "--json")
    assert code == 0 and sorted(r["label"] for r in json.loads(listing)) == sorted(labels)
    pytest.importorskip("matplotlib")
    code, paths = cli_out(
        capsys, "plot", folders[0], folders[1], "--out", str(tmp_path / "fig"), "--format", "svg"
    )
    assert code == 0
    svg = "".join(Path(p).read_text() for p in paths.split())
    assert "alpha-qe.k=2" in svg
    # --label replaces the default; bad labels are refused before anything runs
    code, out = cli_out(capsys, *args, "--label", "mine", "--out", str(tmp_path / "mine"))
    assert code == 0 and "label: mine" in out
    for bad in ("two\nlines", "tab\there", "x" * 10_000, " "):
        code, err = cli(capsys, *args, "--label", bad, "--out", str(tmp_path / "bad"))
        assert code == 2 and "--label: a run label" in err and len(err.strip().splitlines()) == 1, (
            err
        )
        assert not (tmp_path / "bad").exists()


def cli_out(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out if exc.value.code in (0, None) else err


def test_library_versions_are_recorded_when_the_run_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ran is what was installed when the run began: versions are read before any data is loaded."""
    from oxbench.pipelines import runner

    events: list[str] = []
    real_versions, real_load = runner.versions, runner.load

    def versions() -> dict[str, str | None]:
        events.append("versions")
        return {**real_versions(), "numpy": f"seen at call {len(events)}"}

    def load(*args: object, **kwargs: object):  # noqa: ANN202
        events.append("load")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(runner, "versions", versions)
    monkeypatch.setattr(runner, "load", load)
    root, db, q = _gnd_only_features(tmp_path)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", q)
    outcome = run(
        "roxford5k",
        "features",
        overrides={
            "descriptor.db_features": str(tmp_path / "db.npy"),
            "descriptor.query_features": str(tmp_path / "q.npy"),
        },
        session=Session(root=root, cache=tmp_path / "c", progress=False, strict=False),
        record=RecordOptions(out=tmp_path / "r"),
    )
    assert events[0] == "versions" and events.count("versions") == 1 and "load" in events
    record = json.loads((outcome.run_dir / "record.json").read_text())
    assert record["versions"]["numpy"] == "seen at call 1"


# ---------------------------------------------------------------------------------------------
# Rows named by image (issue 34): a names list, names inside the feature file, sorted-name order


def _named_files(tmp_path: Path) -> tuple[Path, dict[str, str], np.ndarray, list[str]]:
    """A ground-truth-only ROxford root, the plain files in ground-truth order, and one array of
    every image (database and queries) in a shuffled order with its names."""
    root, db, q = _gnd_only_features(tmp_path)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", q)
    from oxbench.formats.revisitop import read_gnd

    gt = read_gnd(root / "roxford5k" / "gnd_roxford5k.pkl")
    names = list(gt.db_names) + list(gt.query_names)
    every = np.vstack([db, q])
    order = np.random.default_rng(1).permutation(len(names))
    plain = {
        "descriptor.db_features": str(tmp_path / "db.npy"),
        "descriptor.query_features": str(tmp_path / "q.npy"),
    }
    return root, plain, every[order], [names[i] for i in order]


def test_named_rows_give_the_ground_truth_order_from_every_kind_of_names(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    sio = pytest.importorskip("scipy.io")
    root, plain, every, names = _named_files(tmp_path)
    np.save(tmp_path / "all.npy", every)
    # a .txt list with CRLF ends and a .jpg suffix on some names (both normalised)
    (tmp_path / "names.txt").write_bytes(
        "".join(f"{n}.jpg\r\n" if i % 2 else f"{n}\n" for i, n in enumerate(names)).encode()
    )
    np.savez(tmp_path / "all.npz", x=every, names=np.array(names))
    with h5py.File(tmp_path / "all.h5", "w") as f:
        f["x"] = every
        f["names"] = np.array([n.encode() for n in names])
    sio.savemat(tmp_path / "all.mat", {"X": every.T, "names": np.array(names, dtype=object)})
    srt = np.argsort(names)
    np.save(tmp_path / "sorted.npy", every[srt])
    common = {"session": Session(root=root, cache=tmp_path / "c", strict=False, progress=False)}
    base = run(
        "roxford5k",
        "features",
        **common,
        overrides=plain,
        record=RecordOptions(out=tmp_path / "plain"),
    )
    want = np.load(base.run_dir / "ranks.npy")
    variants = {
        "txt": {"descriptor.db_features": "all.npy", "descriptor.db_names": "names.txt"},
        "npz": {
            "descriptor.db_features": "all.npz",
            "descriptor.key": "x",
            "descriptor.db_names": "all.npz",
        },
        "h5": {
            "descriptor.db_features": "all.h5",
            "descriptor.key": "x",
            "descriptor.db_names": "all.h5",
        },
        "mat": {
            "descriptor.db_features": "all.mat",
            "descriptor.key": "X",
            "descriptor.layout": "d-n",
            "descriptor.db_names": "all.mat",
        },
        "sorted": {"descriptor.db_features": "sorted.npy", "descriptor.row_order": "sorted"},
    }
    for tag, v in variants.items():
        sets = {
            k: str(tmp_path / p) if k.endswith(("features", "names")) else p for k, p in v.items()
        }
        sets["descriptor.query_features"] = sets["descriptor.db_features"]
        if "descriptor.db_names" in sets:
            sets["descriptor.query_names"] = sets["descriptor.db_names"]
        res = run(
            "roxford5k",
            "features",
            **common,
            overrides=sets,
            record=RecordOptions(out=tmp_path / tag),
        )
        assert np.array_equal(np.load(res.run_dir / "ranks.npy"), want), tag
        assert res.result.lines()[0] == base.result.lines()[0]
    # sorted order per part: a query file of the queries alone, sorted by name
    qs = sorted(range(len(names)), key=lambda i: names[i])
    q_only = [i for i in qs if names[i].startswith("q")]
    np.save(tmp_path / "q_sorted.npy", every[q_only])
    res = run(
        "roxford5k",
        "features",
        **common,
        overrides={
            "descriptor.db_features": str(tmp_path / "sorted.npy"),
            "descriptor.query_features": str(tmp_path / "q_sorted.npy"),
            "descriptor.row_order": "sorted",
        },
        record=RecordOptions(out=tmp_path / "qsorted"),
    )
    assert np.array_equal(np.load(res.run_dir / "ranks.npy"), want)


@pytest.mark.parametrize(
    "case", ["duplicate", "missing", "extra", "size", "transposed", "sorted-size", "unnamed"]
)
def test_bad_names_are_one_line_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, plain, every, names = _named_files(tmp_path)
    np.save(tmp_path / "all.npy", every)
    feats, sets = tmp_path / "all.npy", []
    if case == "duplicate":
        names[5] = names[2]
        want = f"descriptor.db_names: image '{names[2]}' names rows 3 and 6"
    elif case == "missing":  # a needed database image without a row: the list names 31 of 33
        keep = [i for i, n in enumerate(names) if n not in ("img_007", "img_011")]
        np.save(tmp_path / "all.npy", every[keep])
        names = [names[i] for i in keep]
        want = "descriptor.db_names: 2 of roxford5k's database images have no row, e.g. 'img_"
    elif case == "extra":
        names[4] = "all_souls_000013"
        want = "descriptor.db_names: row 5 names 'all_souls_000013', which is no image of roxford5k"
    elif case == "size":
        names = names[:-1]
        want = "descriptor.db_names: 32 names for the 33 rows of"
    elif case == "transposed":
        np.save(tmp_path / "all.npy", every.T)
        want = "descriptor.db_names: 33 names for the 8 rows of"  # and the hint below
        want = f"{want} {tmp_path / 'all.npy'}; the file has 33 columns: it looks transposed, set descriptor.layout=d-n"
    elif case == "sorted-size":
        np.save(tmp_path / "all.npy", every[:-1])
        sets = ["--set", "descriptor.row_order=sorted"]
        want = "descriptor.row_order=sorted: 32 rows, but roxford5k has 30 database images and 33 images in all"
    else:
        feats = tmp_path / "db_t.npy"
        np.save(feats, np.load(tmp_path / "db.npy").T)
        want = "it looks transposed, set descriptor.layout=d-n"
    (tmp_path / "names.txt").write_text("\n".join(names) + "\n")
    if case not in ("sorted-size", "unnamed"):
        sets = ["--set", f"descriptor.db_names={tmp_path / 'names.txt'}"]
    out = tmp_path / "run"
    code, err = cli(
        capsys,
        "run",
        "--dataset",
        "roxford5k",
        "--method",
        "features",
        "--root",
        str(root),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "c"),
        "--no-progress",
        "--allow-partial",
        "--set",
        f"descriptor.db_features={feats}",
        "--set",
        f"descriptor.query_features={plain['descriptor.query_features']}",
        *sets,
    )
    lines = [ln for ln in err.splitlines() if not ln.startswith("WARNING")]  # the toy root's counts
    assert code == 2 and want in err, err
    assert len(lines) == 1 and lines[0].startswith("oxbench: error: ") and "Traceback" not in err
    assert list_runs(out) == []


@pytest.mark.shared_data
def test_real_lopq_in_sorted_name_order_runs_with_a_names_list(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lopq file as it is (5,063 Oxford images in sorted-name order, database and queries in one
    file) serves ROxford by name, with a names list or with descriptor.row_order=sorted: the cosine baseline
    E/M/H 28.89 / 21.13 / 4.60 that the hand-written remap above gives."""
    from oxbench.formats.revisitop import read_gnd

    fvecs = shared_data / "oxford5k/lopq_features/oxford_features.fvecs"
    old = read_gnd(shared_data / "oxford5k/gnd_oxford5k.pkl")
    (tmp_path / "names.txt").write_text("\n".join(sorted(old.db_names)) + "\n")
    root = _real_roxford_root(shared_data, tmp_path)
    names = f"{tmp_path / 'names.txt'}"
    files = [f"descriptor.db_features={fvecs}", f"descriptor.query_features={fvecs}"]
    for tag, sets in {
        "names": [f"descriptor.db_names={names}", f"descriptor.query_names={names}"],
        "sorted": ["descriptor.row_order=sorted"],
    }.items():
        line = _headline(capsys, root, "features", tmp_path / tag, files + sets)
        assert line == "roxford5k: mAP E: 28.89, M: 21.13, H: 4.60", tag


# ---------------------------------------------------------------------------------------------
# Distractors visible (issue 34): the count in the default label, in `runs`, in report headers


def test_a_distractor_run_says_its_count_in_label_runs_and_report(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.records import distractor_tag

    db = np.load(files["db"])
    extra = np.random.default_rng(3).normal(size=(1000, D)).astype(np.float32)
    np.save(tmp_path / "db_1k.npy", np.vstack([db, extra]))
    common = {"session": Session(root=tiny_root, cache=tmp_path / "c", progress=False)}
    sets = {
        "descriptor.db_features": str(files["db"]),
        "descriptor.query_features": str(files["q"]),
    }
    plain = run(
        "synthetic",
        "features",
        **common,
        overrides=sets,
        record=RecordOptions(out=tmp_path / "runs" / "plain"),
    )
    with_1k = run(
        "synthetic",
        "features",
        distractors=1000,
        **common,
        overrides={**sets, "descriptor.db_features": str(tmp_path / "db_1k.npy")},
        record=RecordOptions(out=tmp_path / "runs" / "1k"),
    )
    # the files' content digest ends a default label (other files, another row)
    assert re.fullmatch(r"features @[0-9a-f]{8}", plain.record["label"])
    assert re.fullmatch(
        rf"features @[0-9a-f]{{8}} {re.escape(distractor_tag(1000))}", with_1k.record["label"]
    )
    assert distractor_tag(1000) == "+1K"
    with pytest.raises(SystemExit):
        main(["runs", str(tmp_path / "runs")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["started", "(UTC)", "dataset", "distractors", "label"]
    assert sorted(ln.split()[3:5] for ln in out[2:]) == [["0", "features"], ["1,000", "features"]]
    assert ["+1K" in ln for ln in out[2:]].count(True) == 1
    with pytest.raises(SystemExit):
        main(["report", str(plain.run_dir), str(with_1k.run_dir)])
    table = capsys.readouterr().out.splitlines()
    assert "synthetic+1K E mAP" in table[0] and "synthetic E mAP" in table[0]
    # the +1K run reads another database file: its inputs' digest makes it a row of its own
    rows = [ln for ln in table if ln.startswith("| features @")]
    assert len(rows) == 2 and len({r.split()[2] for r in rows}) == 2
    assert "+1K: with that many distractors." in table[-1]


def test_a_run_renders_the_synthetic_cities_through_its_own_engine(
    tiny_root: Path, tmp_path: Path, files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """First-use generation of the default cities gets the run's executor (its processes or its
    Dask cluster), not a pool of its own."""
    from oxbench.datasets import synthetic

    seen = []
    real = synthetic.ensure_default

    def spy(root, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.append(kw.get("executor"))
        return real(root, **kw)

    monkeypatch.setattr(synthetic, "ensure_default", spy)
    go(tiny_root, tmp_path, "features", files, cache=tmp_path / "c")
    assert seen[0] is not None and seen[0].backend == "processes"  # the run's, not its own pool


def test_a_full_disk_under_the_run_log_is_one_line_and_no_run(
    tiny_root: Path,
    tmp_path: Path,
    files: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hostile pass of issue 43 (a full disk, simulated): ``run.log`` refused its writes and
    ``logging`` printed a traceback for every log line, then the run went on as if nothing failed."""
    import errno
    import io
    import logging

    class Full(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    real_open = logging.FileHandler._open
    monkeypatch.setattr(
        logging.FileHandler,
        "_open",
        lambda self: Full() if self.baseFilename.endswith("run.log") else real_open(self),
    )
    code, err = cli(
        capsys, "run", "--root", str(tiny_root), "--method", "features", "--no-progress",
        "--set", f"descriptor.db_features={files['db']}",
        "--set", f"descriptor.query_features={files['q']}",
        "--cache", str(tmp_path / "c"), "--out", str(tmp_path / "runs"),
    )  # fmt: skip
    assert code == 2 and "Traceback" not in err and "Logging error" not in err, err
    assert err.strip().splitlines() == [
        next(ln for ln in err.splitlines() if ln.startswith("oxbench: error:"))
    ]
    assert "cannot write the run log: No space left on device" in err
    assert not list((tmp_path / "runs").rglob("record.json"))
    assert not list(tmp_path.rglob(".oxbench-tmp-*"))
