"""The BoW pipeline end to end on a tiny synthetic benchmark: steps, run folder, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.pipelines import bow
from oxbench.pipelines.presets import METHODS, BowMethod, resolve_method
from oxbench.pipelines.runner import RUN_FILES, load_benchmark, run_method

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

#: Small but real settings: 320x240 images, few features, a small vocabulary, R = 20.
TINY = {"features.max_side": 320, "features.n_features": 300, "spatial_top_r": 20}


def make_tiny_root(root: Path) -> Path:
    """A tiny synthetic test city and training city under ``root`` (about 2 s)."""
    from oxbench.datasets.synthetic.config import SynthConfig
    from oxbench.datasets.synthetic.generate import generate

    common = {"landmarks": 2, "image_size": (320, 240), "generic_buildings": 4}
    generate(root / "synthetic", SynthConfig(db_size=40, queries_per_landmark=2, **common), workers=1, progress=False)
    generate(
        root / "synthetic-train",
        SynthConfig(name="synthetic-train", city="southbridge", seed=1, db_size=30, queries_per_landmark=1, **common),
        workers=1,
        progress=False,
    )
    return root


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def test_presets_are_data() -> None:
    assert {"rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"} <= set(METHODS.names())
    m = METHODS.get("rootsift-bow-sv-qe")
    assert isinstance(m, BowMethod) and m.spatial and m.qe == "aqe"
    assert json.loads(json.dumps(m.to_dict()))["features"]["descriptor"] == "rootsift"
    r = resolve_method("rootsift-bow", vocab_size=1000, **{"features.max_side": 256})
    assert r.vocab_size == 1000 and r.features.max_side == 256 and r.digest() != m.digest()
    with pytest.raises(InputError, match="unknown method"):
        resolve_method("nope")
    with pytest.raises(InputError, match="unknown method setting"):
        resolve_method("rootsift-bow", colour="red")
    with pytest.raises(InputError, match="needs spatial"):
        BowMethod("x", qe="aqe")


@pytest.mark.slow
def test_run_end_to_end_and_run_folder(tiny_root: Path, tmp_path: Path) -> None:
    from oxbench.evaluation import evaluate
    from oxbench.evaluation.ranking import from_revisitop

    out = tmp_path / "run"
    cache = tmp_path / "cache"
    outcome = run_method(
        "synthetic", "rootsift-bow-sv-qe", root=tiny_root, out=out, cache=cache,
        vocab_size=200, overrides=TINY, progress=False,
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(RUN_FILES)
    bench = load_benchmark("synthetic", tiny_root)
    ranks = np.load(out / "ranks.npy")
    assert ranks.shape == (40, 4)  # revisitop layout (n_db, n_queries)
    assert np.all(np.sort(ranks, axis=0) == np.arange(40)[:, None])
    again = evaluate(bench.gt, from_revisitop(ranks))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run"]["trained_on"] == "synthetic-train"
    assert metrics["run"]["trained_on_test_set"] is False
    for setup in ("easy", "medium", "hard"):
        assert again.setups[setup].map == pytest.approx(outcome.result.setups[setup].map)
    # the pipeline works: far above chance on this easy tiny set
    assert outcome.result.setups["medium"].map > 0.5
    config = json.loads((out / "config.json").read_text())
    assert config["method"]["vocab_size"] == 200 and config["train_dataset"] == "synthetic-train"
    versions = json.loads((out / "versions.json").read_text())
    assert {"python", "numpy", "opencv", "faiss", "oxbench"} <= set(versions)
    dataset = json.loads((out / "dataset.json").read_text())
    assert dataset["gt_sha256"] == bow.gt_digest(bench.gt) and dataset["files_sha256"]
    timings = json.loads((out / "timings.json").read_text())
    assert {"features", "vocabulary", "assign", "search", "spatial", "query_expansion"} <= set(timings)
    rows = (out / "per_query.csv").read_text().splitlines()
    assert len(rows) >= 5

    # the same config again: allowed, reuses the caches (no new feature shards)
    shards = sorted(cache.rglob("*.index.npz"))
    run_method("synthetic", "rootsift-bow-sv-qe", root=tiny_root, out=out, cache=cache,
               vocab_size=200, overrides=TINY, progress=False)
    assert sorted(cache.rglob("*.index.npz")) == shards

    # another config into the same folder: refused, folder untouched; --force overwrites
    before = (out / "config.json").read_text()
    with pytest.raises(InputError, match="another config"):
        run_method("synthetic", "rootsift-bow", root=tiny_root, out=out, cache=cache,
                   vocab_size=200, overrides=TINY, progress=False)
    assert (out / "config.json").read_text() == before
    run_method("synthetic", "rootsift-bow", root=tiny_root, out=out, cache=cache,
               vocab_size=200, overrides=TINY, progress=False, force=True)
    assert json.loads((out / "config.json").read_text())["method"]["name"] == "rootsift-bow"
    assert not list(tmp_path.glob(".run.*"))


@pytest.mark.slow
def test_spatial_verification_and_qe_help(tiny_root: Path, tmp_path: Path) -> None:
    """On the tiny set, + SV does not hurt Medium mAP and QE keeps verified images on top."""
    bench = load_benchmark("synthetic", tiny_root)
    train = load_benchmark("synthetic-train", tiny_root)
    maps = {}
    from oxbench.evaluation import evaluate

    for name in ("rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"):
        m = resolve_method(name, vocab_size=200, **TINY)
        out = bow.run_bow(m, bench, train, tmp_path / "cache", progress=False)
        maps[name] = evaluate(bench.gt, out.ranks).setups["medium"].map
        if name == "rootsift-bow-sv-qe":
            assert sum(out.info["verified_per_query"]) > 0
            for qi in range(len(out.ranks)):
                assert len(set(out.ranks[qi].tolist())) == 40  # still a permutation
    assert maps["rootsift-bow-sv"] >= maps["rootsift-bow"] - 1e-9
    assert maps["rootsift-bow-sv-qe"] >= maps["rootsift-bow"] - 1e-9


def test_trained_on_test_set_is_marked(tiny_root: Path, tmp_path: Path) -> None:
    outcome = run_method(
        "synthetic", "rootsift-bow", root=tiny_root, out=tmp_path / "r", cache=tmp_path / "c",
        train_dataset="synthetic", vocab_size=100, overrides=TINY, progress=False,
    )
    assert outcome.config["trained_on_test_set"] is True
    assert "trained on the test set" in (tmp_path / "r" / "summary.txt").read_text()
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["run"]["trained_on_test_set"] is True


def test_missing_features_and_foreign_vocabulary(tiny_root: Path, tmp_path: Path) -> None:
    from oxbench.index.vocabulary import Vocabulary

    bench = load_benchmark("synthetic", tiny_root)
    train = load_benchmark("synthetic-train", tiny_root)
    m = resolve_method("rootsift-bow", vocab_size=50, **TINY)
    rng = np.random.default_rng(0)
    # a vocabulary file for SIFT sitting where the RootSIFT one is expected is refused
    path = bow.vocabulary_path(tmp_path, m, train)
    Vocabulary(50, structure="flat", descriptor="sift").fit(rng.random((500, 128), dtype=np.float32)).save(path)
    with pytest.raises(InputError, match="not 'rootsift'"):
        bow.step_vocabulary(m, train, tmp_path, progress=False)
    path.unlink()
    voc = bow.step_vocabulary(m, train, tmp_path, progress=False)
    # searching before the test set's features exist: a clear error, not an empty result
    with pytest.raises(InputError, match="no feature store"):
        bow.search(m, bench, tmp_path, voc, progress=False)


def test_half_written_run_folder_is_not_left(tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oxbench.pipelines import runner

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(runner, "dataset_checksums", broken)
    with pytest.raises(RuntimeError):
        run_method("synthetic", "rootsift-bow", root=tiny_root, out=tmp_path / "r", cache=tmp_path / "c",
                   vocab_size=100, overrides=TINY, progress=False)
    assert [p.name for p in tmp_path.iterdir() if p.name != "c"] == []


def test_run_folder_refuses_foreign_folder(tmp_path: Path) -> None:
    from oxbench.pipelines.runner import check_run_folder

    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not an oxbench run folder"):
        check_run_folder(tmp_path / "x", {"a": 1})
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "config.json").write_text(json.dumps({"a": 2}))
    with pytest.raises(InputError, match="differs in: a"):
        check_run_folder(tmp_path / "y", {"a": 1})
    check_run_folder(tmp_path / "y", {"a": 2})
    check_run_folder(tmp_path / "y", {"a": 1}, force=True)
