"""The BoW pipeline end to end on a tiny synthetic benchmark: steps, run folder, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.datasets import Benchmark, load
from oxbench.errors import InputError
from oxbench.execution import ProcessExecutor
from oxbench.pipelines import (
    METHODS,
    BowConfig,
    GlobalConfig,
    RecordOptions,
    RetrievalMethod,
    RunContext,
    Session,
    list_methods,
    resolve_method,
    run,
    steps,
)
from oxbench.pipelines.runner import RUN_FILES, find_runs, list_runs, prepare_config_folder

pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")

#: Small but real settings: 320x240 images, few features, a small vocabulary, R = 20.
TINY = {"features.max_side": 320, "features.n_features": 300, "spatial.top_r": 20}


def tiny(method: str) -> dict[str, object]:
    """:data:`TINY` for ``method``: the short list only where a stage of its pipeline verifies
    (a setting no stage reads is refused)."""
    config = resolve_method(method)
    keep = "spatial" in config.stage_instances  # type: ignore[attr-defined]
    out = {k: v for k, v in TINY.items() if keep or not k.startswith("spatial.")}
    if getattr(getattr(config, "descriptor", None), "local_features", None) is not None:
        out = {f"descriptor.{k}" if k.startswith("features.") else k: v for k, v in out.items()}
    return out  # VLAD's local features are its descriptor kind's: descriptor.features.*


def make_tiny_root(root: Path) -> Path:
    """A tiny synthetic test city and training city under ``root`` (about 2 s)."""
    from oxbench.testing import make_tiny_root as make

    return make(root)


def ground_truth_only(root: Path, dest: Path) -> Path:
    """A copy of the tiny cities under ``root`` with their ground truth and manifest only (no
    ``jpg/``): what a run that reads no pixel needs (issue 43 case 13)."""
    import shutil

    for name in ("synthetic", "synthetic-train"):
        shutil.copytree(root / name, dest / name, ignore=shutil.ignore_patterns("jpg"))
    return dest


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def load_tiny(root: Path, dataset: str = "synthetic") -> Benchmark:
    return load(dataset, root, progress=False)


def test_presets_are_data() -> None:
    assert {"rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"} <= set(list_methods("bow"))
    assert {"rootsift-vlad", "rootsift-vlad-w"} <= set(list_methods("global"))
    assert set(list_methods()) == set(METHODS.names())
    m = METHODS.get("rootsift-bow-sv-qe")
    assert isinstance(m, BowConfig) and m.rerank == ("spatial", "aqe-verified")
    d = json.loads(json.dumps(m.to_dict()))
    assert d["features"]["descriptor"] == "rootsift" and d["family"] == "bow"
    r = resolve_method("rootsift-bow", **{"vocabulary.size": 1000}, **{"features.max_side": 256})
    assert isinstance(r, BowConfig) and r.vocabulary.size == 1000 and r.features.max_side == 256
    assert r.digest() != m.digest()
    g = resolve_method("rootsift-vlad", whitening="pca", **{"descriptor.features.n_features": 500})
    assert isinstance(g, GlobalConfig) and g.whitening == "pca"
    assert g.descriptor.features.n_features == 500  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="unknown method"):
        resolve_method("nope")
    with pytest.raises(InputError, match="unknown method setting"):
        resolve_method("rootsift-bow", colour="red")
    with pytest.raises(
        InputError, match="unknown method setting .features.colour. for rootsift-bow"
    ):
        resolve_method("rootsift-bow", **{"features.colour": "red"})
    with pytest.raises(InputError, match="setting features: expected local features"):
        resolve_method("rootsift-bow", features=3)
    with pytest.raises(InputError, match="setting descriptor.features: expected local features"):
        resolve_method("rootsift-vlad", **{"descriptor.features": 3})
    with pytest.raises(InputError, match="'aqe-verified' needs a 'spatial' stage before it"):
        BowConfig("x", rerank=("aqe-verified",))
    with pytest.raises(InputError, match="setting whitening: expected one of none, pca, learned"):
        resolve_method("rootsift-vlad", whitening="zca")


def test_every_family_implements_the_interface() -> None:
    for name in list_methods():
        impl = METHODS.get(name).build()
        assert isinstance(impl, RetrievalMethod) and impl.config.name == name


@pytest.mark.slow
def test_run_end_to_end_and_run_record(tiny_root: Path, tmp_path: Path) -> None:
    from oxbench.evaluation import evaluate
    from oxbench.evaluation.ranking import from_revisitop

    out = tmp_path / "run"
    cache = tmp_path / "cache"
    outcome = run(
        "synthetic",
        "rootsift-bow-sv-qe",
        overrides={"vocabulary.size": 200, **tiny("rootsift-bow-sv-qe")},
        session=Session(root=tiny_root, cache=cache, progress=False),
        record=RecordOptions(out=out, top_k=10, command=["oxbench", "run"]),
    )
    rd = outcome.run_dir
    assert rd.parent == out and outcome.config_dir == out
    assert set(RUN_FILES) <= {p.name for p in rd.iterdir()}
    assert json.loads((out / "config.json").read_text()) == json.loads(
        (rd / "config.json").read_text()
    )
    bench = load_tiny(tiny_root)
    ranks = np.load(rd / "ranks.npy")
    assert ranks.shape == (40, 4)  # revisitop layout (n_db, n_queries)
    assert np.all(np.sort(ranks, axis=0) == np.arange(40)[:, None])
    again = evaluate(bench.gt, from_revisitop(ranks))
    metrics = json.loads((rd / "metrics.json").read_text())
    assert metrics["run"]["trained_on"] == "synthetic-train"
    assert metrics["run"]["trained_on_test_set"] is False
    for setup in ("easy", "medium", "hard"):
        assert again.setups[setup].map == outcome.result.setups[setup].map
    assert outcome.result.setups["medium"].map > 0.5  # far above chance on this easy tiny set
    config = json.loads((rd / "config.json").read_text())
    assert (
        config["method"]["vocabulary"]["size"] == 200
        and config["train_dataset"] == "synthetic-train"
    )
    record = json.loads((rd / "record.json").read_text())
    assert record["command"] == ["oxbench", "run"] and record["run_id"] == rd.name
    assert record["started"] <= record["ended"] and record["status"] == "complete"
    assert {"cpu", "cores", "gpu", "platform", "python"} <= set(record["host"])
    assert {"python", "numpy", "opencv", "faiss", "oxbench"} <= set(record["versions"])
    assert isinstance(record["accel"], bool) and record["git_commit"] in (
        None,
        record["git_commit"],
    )
    assert record["cache"]["vocabulary"] == "computed" and record["cache"]["features"] == "computed"
    dataset = json.loads((rd / "dataset.json").read_text())
    assert dataset["gt_sha256"] == steps.gt_digest(bench.gt) and dataset["files_sha256"]
    timings = json.loads((rd / "timings.json").read_text())
    assert {
        "features",
        "vocabulary",
        "assign",
        "search",
        "spatial",
        "query_expansion",
        "total",
    } <= set(timings)
    assert timings["total_cpu"] > 0 and timings["features_cpu"] > 0  # CPU seconds beside wall time
    assert record["cache"]["spatial"] == record["cache"]["spatial_after_qe"] == "computed"
    assert len((rd / "per_query.csv").read_text().splitlines()) >= 5
    assert "step vocabulary: computed" in (rd / "run.log").read_text()

    # retrieved.json: the top k of every query, names, labels from the ground truth, scores descending
    retrieved = json.loads((rd / "retrieved.json").read_text())
    assert retrieved["k"] == 10 and retrieved["labels"] == ["easy", "hard", "junk", "negative"]
    assert len(retrieved["queries"]) == bench.gt.n_queries
    for qi, q in enumerate(retrieved["queries"]):
        gq = bench.gt.queries[qi]
        assert q["name"] == gq.name and len(q["top"]) == 10
        assert [t["index"] for t in q["top"]] == ranks[:10, qi].tolist()
        for t in q["top"]:
            want = (
                "easy"
                if t["index"] in gq.easy
                else "hard"
                if t["index"] in gq.hard
                else "junk"
                if t["index"] in gq.junk
                else "negative"
            )
            assert t["label"] == want and t["name"] == bench.gt.db_names[t["index"]]
            assert Path(t["image"]).is_file()
        scores = [t["score"] for t in q["top"]]
        assert scores == sorted(scores, reverse=True)

    # the same config again: a second record beside the first, caches reused (no new shards)
    shards = sorted(cache.rglob("shard-*/index.npz"))
    second = run(
        "synthetic",
        "rootsift-bow-sv-qe",
        overrides={"vocabulary.size": 200, **tiny("rootsift-bow-sv-qe")},
        session=Session(root=tiny_root, cache=cache, progress=False),
        record=RecordOptions(out=out),
    )
    assert sorted(cache.rglob("shard-*/index.npz")) == shards
    assert second.run_dir != rd and rd.is_dir() and len(list_runs(out)) == 2
    second_record = json.loads((second.run_dir / "record.json").read_text())
    assert second_record["cache"]["vocabulary"] == "hit"
    # verification is reused too: same short lists, same features and settings
    assert second_record["cache"]["spatial"] == second_record["cache"]["spatial_after_qe"] == "hit"
    assert np.array_equal(np.load(second.run_dir / "ranks.npy"), ranks)
    assert (second.run_dir / "matches.json").read_text() == (rd / "matches.json").read_text()
    assert json.loads((rd / "timings.json").read_text()) == timings  # the cold run's record is kept
    for setup in ("easy", "medium", "hard"):
        assert second.result.setups[setup].map == outcome.result.setups[setup].map

    # another config into the same folder: refused, folder untouched; --overwrite replaces
    before = (out / "config.json").read_text()
    with pytest.raises(InputError, match="another config"):
        run(
            "synthetic",
            "rootsift-bow",
            overrides={"vocabulary.size": 200, **tiny("rootsift-bow")},
            session=Session(root=tiny_root, cache=cache, progress=False),
            record=RecordOptions(out=out),
        )
    assert (out / "config.json").read_text() == before and len(list_runs(out)) == 2
    third = run(
        "synthetic",
        "rootsift-bow",
        overrides={"vocabulary.size": 200, **tiny("rootsift-bow")},
        session=Session(root=tiny_root, cache=cache, progress=False),
        record=RecordOptions(out=out, overwrite=True),
    )
    assert json.loads((out / "config.json").read_text())["method"]["name"] == "rootsift-bow"
    assert list_runs(out) == [third.run_dir]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".oxbench-tmp")]
    assert [r.run_dir for r in find_runs(tmp_path)] == [third.run_dir]


@pytest.mark.slow
def test_spatial_verification_and_qe_help(tiny_root: Path, tmp_path: Path) -> None:
    """On the tiny set, + SV does not hurt Medium mAP and QE keeps verified images on top."""
    from oxbench.evaluation import evaluate

    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    maps = {}
    for name in ("rootsift-bow", "rootsift-bow-sv", "rootsift-bow-sv-qe"):
        ctx = RunContext(tmp_path / "cache", progress=False)
        m = resolve_method(name, **{"vocabulary.size": 200}, **tiny(name))
        res = m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
        maps[name] = evaluate(bench.gt, res.ranks).setups["medium"].map
        assert res.scores is not None and np.all(np.diff(res.scores, axis=1) <= 0)
        if name == "rootsift-bow":
            assert not res.matches
        else:
            n_v = res.info["verified_per_query"]
            assert sum(n_v) > 0
            assert res.matches is not None
            for qi, k in enumerate(n_v):  # verified images carry their inlier counts
                assert np.all(res.scores[qi, :k] >= m.stage("spatial").min_inliers)
                assert np.all(res.scores[qi, k:] <= 1.0 + 1e-6)
                # the viewer's correspondences: the verified images among the top 20, inlier count rows
                shown = res.matches.get(qi, {})
                assert sorted(shown) == sorted(res.ranks[qi, : min(k, 20)].tolist())
                for j, idx in enumerate(res.ranks[qi, : min(k, 20)].tolist()):
                    xy = shown[idx]
                    assert (
                        xy.dtype == np.float32 and xy.shape[1] == 4 and len(xy) >= res.scores[qi, j]
                    )
                    qw, qh = (
                        bench.gt.queries[qi].bbox[2:] if bench.gt.queries[qi].bbox else (1e9, 1e9)
                    )
                    assert (
                        np.all(xy >= -1)
                        and np.all(xy[:, 0] <= qw + 1)
                        and np.all(xy[:, 1] <= qh + 1)
                    )
        for qi in range(len(res.ranks)):
            assert len(set(res.ranks[qi].tolist())) == 40  # still a permutation
    assert maps["rootsift-bow-sv"] >= maps["rootsift-bow"] - 1e-9
    assert maps["rootsift-bow-sv-qe"] >= maps["rootsift-bow"] - 1e-9


@pytest.mark.slow
def test_global_descriptor_family_runs_through_the_same_runner(
    tiny_root: Path, tmp_path: Path
) -> None:
    vlad_tiny = {
        "descriptor.features.max_side": 320,
        "descriptor.features.n_features": 300,
        "descriptor.vocabulary.size": 8,
        "whitening_dim": 16,
        "descriptor.vocabulary.sample": 64,
    }
    out = run(
        "synthetic",
        "rootsift-vlad-w-alpha-qe",
        overrides=vlad_tiny,
        session=Session(root=tiny_root, cache=tmp_path / "cache", progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert set(RUN_FILES) <= {p.name for p in out.run_dir.iterdir()}
    # random ranking on this set gives Medium ~0.25 (about 10 positives in 40)
    assert out.result.setups["medium"].map > 0.4
    assert out.info["whitening"]["fitted_on"].startswith("synthetic-train")
    assert out.info["dim"] == 16 and out.info["bytes_per_image"] == 64
    record = json.loads((out.run_dir / "record.json").read_text())
    assert record["family"] == "global" and record["cache"]["whitening"] == "computed"


def test_trained_on_test_set_is_marked(tiny_root: Path, tmp_path: Path) -> None:
    outcome = run(
        "synthetic",
        "rootsift-bow",
        train_dataset="synthetic",
        overrides={"vocabulary.size": 100, **tiny("rootsift-bow")},
        session=Session(root=tiny_root, cache=tmp_path / "c", progress=False),
        record=RecordOptions(out=tmp_path / "r"),
    )
    assert outcome.config.trained_on_test_set is True
    assert "trained on the test set" in (outcome.run_dir / "summary.txt").read_text()
    assert (
        json.loads((outcome.run_dir / "metrics.json").read_text())["run"]["trained_on_test_set"]
        is True
    )


def test_missing_features_and_foreign_vocabulary(tiny_root: Path, tmp_path: Path) -> None:
    from oxbench.index.vocabulary import Vocabulary

    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    m = resolve_method("rootsift-bow", **{"vocabulary.size": 50}, **tiny("rootsift-bow"))
    assert isinstance(m, BowConfig)
    rng = np.random.default_rng(0)
    # a vocabulary file for SIFT sitting where the RootSIFT one is expected is refused
    path = steps.vocabulary_path(tmp_path, m.vocabulary_spec(), train)
    Vocabulary(50, structure="flat", descriptor="sift").fit(
        rng.random((500, 128), dtype=np.float32)
    ).save(path)
    with pytest.raises(InputError, match="not 'rootsift'"):
        steps.step_vocabulary(m.vocabulary_spec(), train, RunContext(tmp_path, progress=False))
    path.unlink()
    voc = steps.step_vocabulary(
        m.vocabulary_spec(), train, RunContext(tmp_path, progress=False)
    ).path
    # searching before indexing: a clear error, not an empty result
    method = m.build().use_vocabulary(voc)
    with pytest.raises(InputError, match="index synthetic before searching"):
        method.search(bench, RunContext(tmp_path, progress=False))


def test_half_written_run_folder_is_not_left(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oxbench.pipelines import runner

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full (simulated)")

    monkeypatch.setattr(runner, "dataset_checksums", broken)
    with pytest.raises(RuntimeError):
        run(
            "synthetic",
            "rootsift-bow",
            overrides={"vocabulary.size": 100, **tiny("rootsift-bow")},
            session=Session(root=tiny_root, cache=tmp_path / "c", progress=False),
            record=RecordOptions(out=tmp_path / "r"),
        )
    assert not (tmp_path / "r").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".oxbench-tmp")]


def test_run_folder_refuses_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not an oxbench run folder"):
        prepare_config_folder(tmp_path / "x", {"a": 1})
    (tmp_path / "y").mkdir()
    (tmp_path / "y" / "config.json").write_text(json.dumps({"a": 2}))
    with pytest.raises(InputError, match="differs in: a"):
        prepare_config_folder(tmp_path / "y", {"a": 1})
    prepare_config_folder(tmp_path / "y", {"a": 2})
    prepare_config_folder(tmp_path / "y", {"a": 1}, overwrite=True)
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError, match="not a folder"):
        prepare_config_folder(tmp_path / "f", {"a": 1})


def _run_into(root: str, out: str, cache: str) -> str:
    outcome = run(
        "synthetic",
        "rootsift-bow",
        overrides={"vocabulary.size": 100, **tiny("rootsift-bow")},
        session=Session(root=root, cache=cache, progress=False),
        record=RecordOptions(out=out),
    )
    return str(outcome.run_dir)


@pytest.mark.slow
def test_two_processes_into_one_run_folder(tiny_root: Path, tmp_path: Path) -> None:
    """Two runs of one config at once: two complete records, same numbers, nothing mixed."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    args = (str(tiny_root), str(tmp_path / "r"), str(tmp_path / "c"))
    with ctx.Pool(2) as pool:
        dirs = pool.starmap(_run_into, [args, args])
    assert len(set(dirs)) == 2 and sorted(map(Path, dirs)) == list_runs(tmp_path / "r")
    m = [json.loads((Path(d) / "metrics.json").read_text()) for d in dirs]
    assert m[0]["setups"] == m[1]["setups"]


def test_matches_of_a_search_are_recorded(
    tiny_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method that returns correspondences gets them written as matches.json (for viewers)."""
    import dataclasses

    from oxbench.pipelines.families.bow import BagOfWords

    real = BagOfWords.search

    def with_matches(self: BagOfWords, bench: Benchmark, ctx: RunContext):  # noqa: ANN202
        res = real(self, bench, ctx)
        m = {0: {int(res.ranks[0, 0]): np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)}}
        return dataclasses.replace(res, matches=m)

    monkeypatch.setattr(BagOfWords, "search", with_matches)
    out = run(
        "synthetic",
        "rootsift-bow",
        overrides={"vocabulary.size": 100, **tiny("rootsift-bow")},
        session=Session(root=tiny_root, cache=tmp_path / "c", progress=False),
        record=RecordOptions(out=tmp_path / "r"),
    )
    matches = json.loads((out.run_dir / "matches.json").read_text())
    first = str(int(np.load(out.run_dir / "ranks.npy")[0, 0]))
    assert matches == {"queries": {"0": {first: [[1.0, 2.0, 3.0, 4.0]]}}}


def test_descriptor_matches_are_mutual_and_pass_the_ratio_test() -> None:
    from oxbench.refinement.spatial import descriptor_matches

    rng = np.random.default_rng(0)
    d = rng.normal(size=(50, 16)).astype(np.float32)
    q = d[[3, 7, 9]] + 0.01 * rng.normal(size=(3, 16)).astype(np.float32)
    assert descriptor_matches(q, d).tolist() == [[0, 3], [1, 7], [2, 9]]
    # two equally near database features: the ratio test refuses the match
    assert descriptor_matches(q[:1], np.concatenate([d[3:4], d[3:4]])).shape == (0, 2)
    with pytest.raises(InputError, match="ratio"):
        descriptor_matches(q, d, ratio=1.5)
    with pytest.raises(InputError, match="dimension"):
        descriptor_matches(q, d[:, :8])


def _slow_descriptor_matches(q: np.ndarray, d: np.ndarray, ratio: float) -> list[list[int]]:
    """Every distance, exact (integer descriptors): the definition, slowly. A tie on either side
    matches nothing (the ratio test refuses equal neighbours; a database feature with two equally
    near query features has no mutual neighbour)."""
    dist = ((q[:, None, :].astype(np.int64) - d[None, :, :].astype(np.int64)) ** 2).sum(axis=2)
    out = []
    for i in range(len(q)):
        order = np.argsort(dist[i], kind="stable")
        j = int(order[0])
        unique = np.count_nonzero(dist[:, j] == dist[i, j]) == 1 and dist[i, j] == dist[:, j].min()
        if dist[i, j] < ratio * ratio * dist[i, order[1]] and unique:
            out.append([i, j])
    return out


def _matches_in_blocks_of(rows: int, q: np.ndarray, d: np.ndarray, ratio: float) -> list[list[int]]:
    """descriptor_matches with blocks of ``rows`` query rows."""
    from oxbench.refinement import spatial

    old = spatial._MATCH_ROWS
    spatial._MATCH_ROWS = rows
    try:
        return spatial.descriptor_matches(q, d, ratio=ratio).tolist()
    finally:
        spatial._MATCH_ROWS = old


@settings(max_examples=150, deadline=None)
@given(
    n_q=st.integers(1, 40), n_d=st.integers(2, 40), dim=st.integers(1, 6), high=st.integers(1, 6),
    ratio=st.sampled_from([0.6, 0.8, 1.0]), rows=st.sampled_from([1, 3, 256]), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_descriptor_matches_equal_the_definition(
    n_q: int, n_d: int, dim: int, high: int, ratio: float, rows: int, seed: int
) -> None:
    """Small integer descriptors make every distance exact and ties frequent: the blocked in-place
    reduction must give the brute-force answer, ties included, for any block size."""
    rng = np.random.default_rng(seed)
    q = rng.integers(0, high, size=(n_q, dim)).astype(np.float32)
    d = rng.integers(0, high, size=(n_d, dim)).astype(np.float32)
    assert _matches_in_blocks_of(rows, q, d, ratio) == _slow_descriptor_matches(q, d, ratio)


@settings(max_examples=150, deadline=None)
@given(
    n_q=st.integers(1, 40), n_d=st.integers(2, 40), ratio=st.sampled_from([0.6, 0.8, 1.0]),
    rows=st.sampled_from([1, 3, 256]), scale=st.sampled_from([1, 3]), seed=st.integers(0, 2**32 - 1),
)  # fmt: skip
def test_descriptor_matches_of_equal_length_descriptors_equal_the_definition(
    n_q: int, n_d: int, ratio: float, rows: int, scale: int, seed: int
) -> None:
    """Descriptors of one length per side (RootSIFT's case) take the dot-product path: permutations
    of one small integer vector have exactly equal lengths, exact products and frequent ties."""
    from oxbench.refinement import spatial

    rng = np.random.default_rng(seed)
    base = np.array([0, 1, 1, 2, 3, 0], np.float32)
    q = np.stack([rng.permutation(base) for _ in range(n_q)]) * scale
    d = np.stack([rng.permutation(base) for _ in range(n_d)])
    assert spatial._constant(0.5 * (q * q).sum(axis=1)) and spatial._constant(
        0.5 * (d * d).sum(axis=1)
    )
    assert _matches_in_blocks_of(rows, q, d, ratio) == _slow_descriptor_matches(q, d, ratio)


@pytest.mark.slow
def test_verification_and_assignment_in_two_processes_give_the_same_result(
    tiny_root: Path, tmp_path: Path
) -> None:
    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    m = resolve_method(
        "rootsift-bow-sv-qe", **{"vocabulary.size": 200}, **tiny("rootsift-bow-sv-qe")
    )
    out = {}
    for workers in (1, 2):
        ctx = RunContext(
            tmp_path / f"cache{workers}", executor=ProcessExecutor(workers), progress=False
        )
        out[workers] = m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
    assert np.array_equal(out[1].ranks, out[2].ranks)
    assert out[1].matches is not None and out[2].matches is not None
    assert out[1].matches.keys() == out[2].matches.keys()
    for qi, per_db in out[1].matches.items():
        for idx, xy in per_db.items():
            assert np.array_equal(xy, out[2].matches[qi][idx])


@pytest.mark.slow
def test_asmk_presets_run_and_verification_keeps_a_permutation(
    tiny_root: Path, tmp_path: Path
) -> None:
    pytest.importorskip("asmk")
    from oxbench.evaluation import evaluate

    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    maps = {}
    for name in ("rootsift-bow", "rootsift-asmk", "rootsift-asmk-sv"):
        ctx = RunContext(tmp_path / "cache", progress=False)
        res = (
            resolve_method(name, **{"vocabulary.size": 200}, **tiny(name))
            .build()
            .fit(train, ctx)
            .index(bench, ctx)
            .search(bench, ctx)
        )
        maps[name] = evaluate(bench.gt, res.ranks).setups["medium"].map
        for qi in range(len(res.ranks)):
            assert sorted(res.ranks[qi].tolist()) == list(range(40))
    # the selective kernel is no worse than tf-idf on the tiny set, and verification adds to it
    assert maps["rootsift-asmk"] >= maps["rootsift-bow"] - 0.05
    assert maps["rootsift-asmk-sv"] >= maps["rootsift-asmk"] - 1e-9


def test_aggregated_residuals_follow_the_definition() -> None:
    from oxbench.pipelines.families.asmk import aggregate_residuals

    rng = np.random.default_rng(1)
    c = rng.normal(size=(6, 4)).astype(np.float32)
    x = rng.normal(size=(9, 4)).astype(np.float32)
    w = rng.integers(0, 6, size=(9, 2))
    res, words = aggregate_residuals(x, w, c)
    for r, word in zip(res, words, strict=True):
        rows = np.flatnonzero((w == word).any(axis=1))
        want = sum(x[i] - c[word] for i in rows for _ in range(int((w[i] == word).sum())))
        assert np.allclose(r, want, atol=1e-5)
    assert words.tolist() == sorted(set(w.ravel().tolist()))


def test_method_settings_refused_with_their_names() -> None:
    with pytest.raises(InputError, match="spatial.top_r"):
        resolve_method("rootsift-bow-sv", **{"spatial.top_r": 0})
    with pytest.raises(InputError, match="spatial.matching"):
        resolve_method("rootsift-bow-sv", **{"spatial.matching": "pixels"})
    with pytest.raises(InputError, match="aqe-verified.verify_top names no stage of its pipeline"):
        resolve_method("rootsift-asmk-sv", **{"aqe-verified.verify_top": 3})
    with pytest.raises(InputError, match="needs database vectors, which the asmk family"):
        resolve_method("rootsift-asmk-sv", rerank="spatial,aqe-verified")
    with pytest.raises(InputError, match="aqe-verified.verify_top"):
        resolve_method("rootsift-bow-sv-qe", **{"aqe-verified.verify_top": -1})


@pytest.mark.slow
def test_an_image_without_features_ranks_last_with_a_warning(
    tiny_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import dataclasses
    import logging
    import shutil

    from PIL import Image

    from oxbench.datasets.base import FileImages

    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    paths = []
    for i in range(len(bench.database)):
        src = bench.database.path(i)
        assert src is not None
        paths.append(Path(shutil.copy(src, tmp_path / src.name)))
    Image.new("RGB", (64, 48), (128, 128, 128)).save(paths[5])  # blank: SIFT finds nothing
    Image.new("RGB", (1, 1)).save(paths[9])  # tiny
    db = FileImages(tuple(bench.database.name(i) for i in range(len(paths))), tuple(paths))
    blank = dataclasses.replace(bench, database=db, options={**bench.options, "test": "blank"})
    m = resolve_method(
        "rootsift-bow-sv", **{"vocabulary.size": 200}, **{**TINY, "spatial.top_r": 1000}
    )
    ctx = RunContext(tmp_path / "cache", progress=False)
    with caplog.at_level(logging.INFO):
        res = m.build().fit(train, ctx).index(blank, ctx).search(blank, ctx)
    text = caplog.text
    # Issue 43 case 12: said at INFO with why (a featureless image is not a fault), never a WARNING
    (said,) = [r for r in caplog.records if "have no features" in r.getMessage()]
    assert said.levelno == logging.INFO and "not an error" in said.getMessage()
    assert "2 database image(s) have no features" in text and db.name(5) in text
    assert "short list of 1000 is longer than the index (40 images)" in text
    for row in res.ranks:
        assert set(row[-2:].tolist()) == {5, 9}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rootsift-bow-sv", "rootsift-asmk"])
def test_a_vocabulary_of_another_descriptor_or_dimension_is_refused(
    name: str, tiny_root: Path, tmp_path: Path
) -> None:
    from oxbench.index.vocabulary import Vocabulary

    bench = load_tiny(tiny_root)
    x = np.random.default_rng(0).random((400, 64), dtype=np.float32)
    for descriptor, message in (
        ("sift", "trained on 'sift' descriptors"),
        ("rootsift", "dimension 64, expected 128"),
    ):
        path = Vocabulary(8, descriptor=descriptor).fit(x).save(tmp_path / f"{descriptor}.npz")
        method = (
            resolve_method(name, **{"vocabulary.size": 8}, **tiny(name))
            .build()
            .use_vocabulary(path)
        )
        with pytest.raises(InputError, match=message):
            method.index(bench, RunContext(tmp_path / "cache", progress=False))


@pytest.mark.slow
def test_only_strongly_verified_images_expand_the_query(tiny_root: Path, tmp_path: Path) -> None:
    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    ctx = RunContext(tmp_path / "cache", progress=False)
    sv = (
        resolve_method("rootsift-bow-sv", **{"vocabulary.size": 200}, **tiny("rootsift-bow-sv"))
        .build()
        .fit(train, ctx)
        .index(bench, ctx)
    )
    plain = sv.search(bench, ctx)
    runs = {}
    for qe_min in (1, 10**6):
        m = resolve_method(
            "rootsift-bow-sv-qe",
            **{"vocabulary.size": 200},
            **{"aqe-verified.min_inliers": qe_min},
            **TINY,
        )
        runs[qe_min] = m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
    # nothing strong enough to expand with: the verified ranking of plain SV, unchanged
    assert np.array_equal(runs[10**6].ranks, plain.ranks)
    assert not np.array_equal(runs[1].ranks, plain.ranks)


@pytest.mark.slow
def test_the_expanded_querys_new_results_are_verified_too(tiny_root: Path, tmp_path: Path) -> None:
    """Chum et al. 2007: images the expanded query brings up are verified against the query and
    join the verified head; with aqe-verified.verify_top=0 the expanded order stays below it, unverified."""
    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    ctx = RunContext(tmp_path / "cache", progress=False)
    short = {**TINY, "spatial.top_r": 3, "aqe-verified.min_inliers": 4}
    out = {}
    for top in (0, 30):
        m = resolve_method(
            "rootsift-bow-sv-qe",
            **{"vocabulary.size": 200},
            **{"aqe-verified.verify_top": top},
            **short,
        )
        out[top] = m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
    before, after = out[0].info["verified_per_query"], out[30].info["verified_per_query"]
    assert all(b <= a <= b + 30 for b, a in zip(before, after, strict=True))  # type: ignore[call-overload]
    assert sum(after) > sum(before)  # type: ignore[call-overload]
    pairs = out[30].info["pairs_verified_after_qe"]
    assert 0 < len(pairs) <= out[30].info["queries_expanded"] and all(0 < p <= 30 for p in pairs)  # type: ignore
    for qi, n in enumerate(after):  # type: ignore[arg-type]
        scores = out[30].scores
        assert scores is not None
        head = scores[qi, :n]
        assert np.all(head >= 4) and np.all(np.diff(head) <= 0)  # verified: by inliers, best first
        assert set(out[0].ranks[qi, : before[qi]]) <= set(out[30].ranks[qi, :n])  # type: ignore[index]
        assert sorted(out[30].ranks[qi]) == list(range(out[30].ranks.shape[1]))


@pytest.mark.slow
def test_verified_short_lists_are_cached_and_a_corrupt_entry_is_verified_again(
    tiny_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Warm is warm: a rerun reads each query's verified short list back (keyed by the short list,
    the stores, the words and the settings); a damaged entry is verified again, with one warning."""
    bench, train = load_tiny(tiny_root), load_tiny(tiny_root, "synthetic-train")
    m = resolve_method("rootsift-bow-sv", **{"vocabulary.size": 200}, **tiny("rootsift-bow-sv"))

    def search(cache: Path) -> tuple[RunContext, object]:
        ctx = RunContext(cache, progress=False)
        return ctx, m.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)

    ctx, cold = search(tmp_path / "cache")
    entries = sorted((tmp_path / "cache" / "verification").rglob("*.npz"))
    assert ctx.steps["spatial"] == "computed" and len(entries) == bench.gt.n_queries
    ctx, warm = search(tmp_path / "cache")
    assert ctx.steps["spatial"] == "hit"
    assert np.array_equal(warm.ranks, cold.ranks) and np.array_equal(warm.scores, cold.scores)  # type: ignore[attr-defined]
    assert warm.matches.keys() == cold.matches.keys()  # type: ignore[attr-defined]
    for qi, per_db in cold.matches.items():  # type: ignore[attr-defined]
        assert per_db.keys() == warm.matches[qi].keys()  # type: ignore[attr-defined]
        for idx, xy in per_db.items():
            assert np.array_equal(xy, warm.matches[qi][idx])  # type: ignore[attr-defined]

    data = bytearray(entries[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    entries[0].write_bytes(bytes(data))
    caplog.clear()
    with caplog.at_level("WARNING"):
        ctx, again = search(tmp_path / "cache")
    warned = [r for r in caplog.records if "verifying that short list again" in r.getMessage()]
    assert len(warned) == 1 and str(entries[0]) in warned[0].getMessage()
    assert ctx.steps["spatial"] == "computed" and np.array_equal(again.ranks, cold.ranks)  # type: ignore[attr-defined]
    assert entries[0].is_file()  # written again

    # another verification setting is another entry, never a stale one
    ctx = RunContext(tmp_path / "cache", progress=False)
    other = resolve_method(
        "rootsift-bow-sv",
        **{"vocabulary.size": 200},
        **{"spatial.min_inliers": 50},
        **tiny("rootsift-bow-sv"),
    )
    other.build().fit(train, ctx).index(bench, ctx).search(bench, ctx)
    assert ctx.steps["spatial"] == "computed"
