"""``search=mapped``: exact search streamed from shards on disk (:mod:`oxbench.index.mapped`).

(a) on data whose dot products float32 holds exactly, the ranks and scores of the in-RAM exact
search (several block sizes, ties forced by duplicated rows), float16 and float32 shards;
(b) on real-valued data, the canonical ranks (float64 dot products rounded once, ties to the lower
index) whatever the block, the query batch (memory bound) or the backend (numpy, torch on the
CPU, 2 Dask workers), checked against a slow reference kept here;
(c) the memory bound refused in one line before any work; a damaged, swapped or foreign shard
refused; the user's own ``.npy`` files; the k-NN graph resumed; the settings fuzzed.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.cache import CorruptCache
from oxbench.errors import InputError
from oxbench.index.mapped import (
    MappedSearch,
    knn_graph,
    open_npy_files,
    open_shards,
    search_shards,
    write_shards,
)
from oxbench.index.search import SEARCH_SPEC, exact_search

REC = {"what": "test vectors"}


def grid(rng: np.random.Generator, n: int, d: int = 128) -> np.ndarray:
    """Rows of multiples of 1/16 in [-0.5, 0.5]: every dot product is exact in float16 storage
    and in any float32 summation order; duplicated rows force ties."""
    x = (rng.integers(-8, 9, (n, d)) / 16).astype(np.float32)
    x[n // 2 : n // 2 + 500] = x[:500]  # duplicates far apart (other shards, other blocks)
    x[-7:] = x[3]
    return x


def reference(q: np.ndarray, db: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The canonical top k, the slow way: float64 products rounded once, sorted (score, id)."""
    s = (q.astype(np.float64) @ db.astype(np.float64).T).astype(np.float32)
    ids = np.broadcast_to(np.arange(db.shape[0]), s.shape)
    order = np.lexsort((ids, -s), axis=1)[:, :k]
    return np.take_along_axis(s, order, axis=1), order.astype(np.int64)


def shards_of(x: np.ndarray, folder: Path, dtype: str = "float32", per: int = 30000):
    chunks = (x[a : a + 7000] for a in range(0, len(x), 7000))
    return write_shards(chunks, folder, stands_for=REC, dtype=dtype, shard_vectors=per)


@pytest.fixture(scope="module")
def grid_db(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(0)
    x = grid(rng, 100_000)
    q = np.vstack([x[:20], x[-1:], (rng.integers(-8, 9, (9, 128)) / 16).astype(np.float32)])
    folder = tmp_path_factory.mktemp("grid")
    return x, q, {dt: shards_of(x, folder / dt, dt) for dt in ("float32", "float16")}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("block", [1000, 4096, 65536])
def test_identical_to_in_ram_exact_search_with_ties(grid_db, dtype: str, block: int) -> None:
    x, q, dbs = grid_db
    want_s, want_i = exact_search(q, x, 100)
    got_s, got_i = search_shards(q, dbs[dtype], 100, MappedSearch(block=block))
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_s, want_s)
    # the ties were there: a query's duplicates come in index order
    row = list(got_i[0])
    assert row.index(0) < row.index(50_000)
    assert sorted(got_i[20][:8]) == got_i[20][:8].tolist() and 3 in got_i[20][:8]


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20_000, 128)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[10_000:10_050] = x[:50]
    q = np.vstack([x[:10], rng.standard_normal((15, 128)).astype(np.float32)])
    folder = tmp_path_factory.mktemp("real")
    return x, q, shards_of(x, folder / "f32", per=6000), shards_of(x, folder / "f16", "float16")


def test_canonical_ranks_whatever_the_block_and_the_query_batch(real_db) -> None:
    x, q, db32, db16 = real_db
    want_s, want_i = reference(q, x, 50)
    for block, ram in ((777, 4.0), (6000, 4.0), (65536, 4.0), (1024, 0.0025)):
        s, i = search_shards(q, db32, 50, MappedSearch(block=block, ram_gb=ram))
        np.testing.assert_array_equal(i, want_i, err_msg=f"block {block} ram {ram}")
        np.testing.assert_array_equal(s, want_s)
    # float16 shards: the canonical ranks of the rounded rows
    h_s, h_i = reference(q, x.astype(np.float16).astype(np.float32), 50)
    s, i = search_shards(q, db16, 50, MappedSearch(block=3000))
    np.testing.assert_array_equal(i, h_i)
    np.testing.assert_array_equal(s, h_s)
    # the in-RAM float32 search agrees except where two scores are within float32 rounding
    e_s, e_i = exact_search(q, x, 50)
    assert np.abs(e_s - want_s).max() < 1e-5
    differ = e_i != want_i
    assert differ.mean() < 0.05


def test_torch_on_the_cpu_gives_the_same_ranks(real_db) -> None:
    pytest.importorskip("torch")
    x, q, db32, db16 = real_db
    for db in (db32, db16):
        a = search_shards(q, db, 60, MappedSearch(block=2500), engine="numpy")
        b = search_shards(q, db, 60, MappedSearch(block=4096, ram_gb=0.01), engine="cpu")
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_array_equal(a[0], b[0])


def test_two_dask_workers_give_the_same_ranks(real_db) -> None:
    pytest.importorskip("distributed")
    from oxbench.execution.dask import DaskExecutor

    x, q, db32, _ = real_db
    assert len(db32.shards) == 4
    want = search_shards(q, db32, 40, MappedSearch(block=5000))
    with DaskExecutor(2, cores=2) as executor:
        got = search_shards(q, db32, 40, MappedSearch(block=5000), executor=executor)
        s, i, reused = knn_graph(db32, 5, db32.shards[0].path + ".knn", executor=executor)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    assert reused == 0
    np.testing.assert_array_equal(i[:200], search_shards(x[:200], db32, 5)[1])


def test_memory_bound_is_refused_in_one_line_before_the_work(real_db, tmp_path: Path) -> None:
    x, q, db32, _ = real_db
    with pytest.raises(InputError) as exc:
        search_shards(q, db32, 10, MappedSearch(ram_gb=0.001, block=65536))
    message = str(exc.value)
    assert "\n" not in message and "search.ram_gb=0.001" in message and "search.block" in message
    # before the work: a shard gone is never reached
    folder = tmp_path / "gone"
    db = shards_of(x[:5000], folder)
    os.remove(db.shards[0].path)
    with pytest.raises(InputError, match="search.ram_gb"):
        search_shards(q, db, 10, MappedSearch(ram_gb=0.001))
    with pytest.raises(InputError, match="mapped shard unreadable"):
        search_shards(q, db, 10)


def test_shards_name_what_they_stand_for(real_db, tmp_path: Path) -> None:
    x, q, _, _ = real_db
    a = shards_of(x[:9000], tmp_path / "a", per=3000)
    b = shards_of(x[9000:18000], tmp_path / "b", per=3000)
    assert a.n == 9000 and len(a.shards) == 3 and a.disk_bytes > 9000 * 128 * 4
    with pytest.raises(CorruptCache, match="stands for another"):
        open_shards(tmp_path / "a", stands_for={"what": "other vectors"})
    with pytest.raises(CorruptCache):
        open_shards(tmp_path / "a", stands_for=REC, dtype="float16")
    # a shard swapped for another shard (of the same database or another) is refused
    (tmp_path / "a" / "shard-00001.npz").write_bytes(
        (tmp_path / "a" / "shard-00002.npz").read_bytes()
    )
    with pytest.raises(CorruptCache, match="stands for another"):
        open_shards(tmp_path / "a", stands_for=REC)
    # a damaged byte
    raw = bytearray((tmp_path / "b" / "shard-00000.npz").read_bytes())
    raw[len(raw) // 2] ^= 1
    (tmp_path / "b" / "shard-00000.npz").write_bytes(bytes(raw))
    with pytest.raises(CorruptCache, match="digest"):
        open_shards(tmp_path / "b", stands_for=REC)
    # a file changed after it was opened is refused before it is read
    (tmp_path / "b" / "shard-00000.npz").write_bytes(b"x")
    with pytest.raises(InputError, match="changed since"):
        search_shards(q, b, 5)
    # a rewrite keeps the intact shards (same inode) and writes the damaged ones again; what a
    # build killed while writing left (an hour-old temporary) is removed, a fresh one is not
    before = os.stat(tmp_path / "a" / "shard-00000.npz").st_ino
    stale, fresh = (tmp_path / "a" / f".oxbench-tmp-shard-00001.npz.{t}" for t in ("old", "new"))
    stale.write_bytes(b"half")
    fresh.write_bytes(b"half")
    os.utime(stale, (1e9, 1e9))
    again = shards_of(x[:9000], tmp_path / "a", per=3000)
    assert os.stat(tmp_path / "a" / "shard-00000.npz").st_ino == before
    assert not stale.exists() and fresh.exists()
    np.testing.assert_array_equal(again.rows(np.array([3500, 7, 8999])), x[[3500, 7, 8999]])


def test_the_users_npy_files_in_place(real_db, tmp_path: Path) -> None:
    x, q, _, _ = real_db
    np.save(tmp_path / "a.npy", x[:7000].astype(np.float16))
    np.save(tmp_path / "b.npy", x[7000:].astype(np.float16))
    db = open_npy_files([tmp_path / "a.npy", tmp_path / "b.npy"])
    want = reference(q, x.astype(np.float16).astype(np.float32), 30)
    got = search_shards(q, db, 30, MappedSearch(block=4000))
    np.testing.assert_array_equal(got[1], want[1])
    np.save(tmp_path / "c.npy", np.zeros((3, 64), np.float32))
    with pytest.raises(InputError, match="dimension 64"):
        open_npy_files([tmp_path / "a.npy", tmp_path / "c.npy"])
    np.save(tmp_path / "d.npy", np.full((3, 128), np.nan, np.float32))
    with pytest.raises(InputError, match="NaN"):
        open_npy_files([tmp_path / "d.npy"])
    np.save(tmp_path / "e.npy", np.zeros((3, 128), np.int32))
    with pytest.raises(InputError, match="float16/float32"):
        open_npy_files([tmp_path / "e.npy"])


def test_links_and_special_files_in_a_shard_folder_are_refused_not_followed(
    real_db, tmp_path: Path
) -> None:
    """Hostile pass of issue 43: a shard folder, a shard or a graph piece replaced by a symbolic
    link was read (and the manifest written) through it, outside the cache; a FIFO given as the
    user's .npy blocked forever."""
    x, _, _, _ = real_db
    db = shards_of(x[:600], tmp_path / "a", per=200)
    outside = tmp_path / "outside"
    outside.mkdir()
    shard = tmp_path / "a" / "shard-00001.npz"
    os.replace(shard, outside / shard.name)
    shard.symlink_to(outside / shard.name)
    for again in (
        lambda: open_shards(tmp_path / "a", stands_for=REC),
        lambda: shards_of(x[:600], tmp_path / "a", per=200),
    ):
        with pytest.raises(InputError, match="symbolic link"):
            again()
    os.replace(tmp_path / "a", outside / "a")
    (tmp_path / "a").symlink_to(outside / "a", target_is_directory=True)
    manifest = outside / "a" / "manifest.npz"
    before = manifest.stat().st_mtime_ns
    with pytest.raises(InputError, match="symbolic link"):
        shards_of(x[:600], tmp_path / "a", per=200)
    assert manifest.stat().st_mtime_ns == before  # nothing written through the link
    (tmp_path / "knn").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InputError, match="symbolic link"):
        knn_graph(db, 4, tmp_path / "knn", piece_rows=300)
    assert not list(outside.glob("graph-*"))
    os.mkfifo(tmp_path / "fifo.npy")
    with pytest.raises(InputError, match="not a regular file"):
        open_npy_files([tmp_path / "fifo.npy"])


def test_knn_graph_is_resumed_from_its_pieces(real_db, tmp_path: Path) -> None:
    x, _, db32, _ = real_db
    folder = tmp_path / "knn"
    s, i, reused = knn_graph(db32, 8, folder, piece_rows=7000)
    assert reused == 0 and i.shape == (20_000, 8)
    np.testing.assert_array_equal(i[:300], reference(x[:300], x, 8)[1])
    assert (i[:, 0] == np.arange(20_000)).mean() > 0.99  # each row its own nearest, bar duplicates
    os.remove(folder / "graph-00001.npz")  # an interrupted build (killed while writing it)
    stale = folder / ".oxbench-tmp-graph-00001.npz.abc123"
    stale.write_bytes(b"half")
    os.utime(stale, (1e9, 1e9))
    s2, i2, reused = knn_graph(db32, 8, folder, piece_rows=7000)
    assert reused == 2 and not stale.exists()
    np.testing.assert_array_equal(i2, i)
    np.testing.assert_array_equal(s2, s)
    # pieces of another k are not taken for these
    _, i3, reused = knn_graph(db32, 4, folder, piece_rows=7000)
    assert reused == 0
    np.testing.assert_array_equal(i3, i[:, :4])


def test_diffusion_graph_from_the_streamed_search_equals_the_faiss_one(
    real_db, tmp_path: Path
) -> None:
    pytest.importorskip("faiss")
    from oxbench.refinement.diffusion import Diffusion, DiffusionSettings

    x = real_db[0]
    a = Diffusion(DiffusionSettings(k=10)).fit(x[:6000])
    s, i, _ = knn_graph(shards_of(x[:6000], tmp_path / "db", per=2500), 10, tmp_path / "knn")
    b = Diffusion(DiffusionSettings(k=10)).fit(x[:6000], neighbours=(s, i))
    assert abs(a.affinity_ - b.affinity_).max() < 1e-5
    assert a.affinity_.nnz == b.affinity_.nnz


HOSTILE = ("NaN", "inf", "-1", "0", "1e30", "abc", "", "1.5", "true", "\x00", "gpu", "float64")


@pytest.mark.parametrize("name", ["ram_gb", "block", "shard_vectors", "dtype", "device", "threads"])
def test_every_setting_takes_hostile_text_in_one_line(name: str) -> None:
    for raw in HOSTILE:
        try:
            value = SEARCH_SPEC.check("search", {"kind": "mapped", name: raw})
        except InputError as exc:
            assert "\n" not in str(exc) and name in str(exc), (name, raw, str(exc))
            continue
        got = getattr(value, name)
        assert isinstance(got, str) or math.isfinite(got), (name, raw)
        assert SEARCH_SPEC.check("search", value.to_dict()) == value


@settings(max_examples=60, deadline=None)
@given(
    ram=st.floats(allow_nan=True, allow_infinity=True),
    block=st.integers(min_value=-5, max_value=1 << 27),
)
def test_settings_fuzz(ram: float, block: int) -> None:
    try:
        s = SEARCH_SPEC.check("search", {"kind": "mapped", "ram_gb": ram, "block": block})
    except InputError as exc:
        assert "\n" not in str(exc)
        assert not (0 < ram <= 1 << 20) or not (1 <= block <= 1 << 26)
        return
    assert isinstance(s, MappedSearch) and 0 < s.ram_gb <= 1 << 20 and s.block >= 1


def test_the_search_kind_in_a_method() -> None:
    from oxbench.pipelines.presets import resolve_method

    m = resolve_method(
        "gem-r101", search="mapped", **{"search.ram_gb": "2", "search.dtype": "float16"}
    )
    assert isinstance(m.search, MappedSearch) and m.search.ram_gb == 2.0
    with pytest.raises(InputError, match="nlist"):
        resolve_method("gem-r101", search="mapped", **{"search.nlist": "4"})


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"rerank": "dba,alpha-qe", "dba.k": 3, "alpha-qe.k": 3},
        {"rerank": "diffusion", "diffusion.k": 5, "diffusion.mode": "offline"},
    ],
    ids=["plain", "dba+alpha-qe", "diffusion"],
)
def test_a_method_searched_from_disk_ranks_as_the_in_ram_one(tmp_path: Path, extra: dict) -> None:
    """The features preset (the user's descriptor files) with ``search=mapped``: the ranks and
    mAP of ``search=exact``; on a rerun the shards and the graph's pieces are reused."""
    pytest.importorskip("faiss")
    from oxbench.pipelines import RecordOptions, Session, run
    from test_features_method import write_features
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    db, q = write_features(root, "synthetic", tmp_path / "f", noise=0.5, seed=0)
    # integer-valued descriptors: every dot product exact, so exact search is canonical too
    for p in (db, q):
        np.save(p, np.round(np.load(p) * 4).astype(np.float32))

    def go(name: str, **over: object):
        sets = {"descriptor.db_features": str(db), "descriptor.query_features": str(q)}
        sets.update({k: str(v) for k, v in extra.items()}, **{k: str(v) for k, v in over.items()})
        return run(
            "synthetic",
            "features",
            overrides=sets,
            session=Session(root=root, cache=tmp_path / "cache", progress=False),
            record=RecordOptions(out=tmp_path / name),
        )

    def ranks(out) -> np.ndarray:  # noqa: ANN001
        return np.load(out.run_dir / "ranks.npy")

    exact = go("exact")
    mapped = go("mapped", search="mapped", **{"search.shard_vectors": 16, "search.block": 7})
    np.testing.assert_array_equal(ranks(mapped), ranks(exact))
    assert mapped.result.setups["medium"].map == exact.result.setups["medium"].map
    assert mapped.info["search"]["kind"] == "mapped" and mapped.info["mapped_disk_bytes"] > 0
    folder = next((tmp_path / "cache").rglob("mapped-float32-16-*"))
    inode = os.stat(folder / "shard-00000.npz").st_ino
    again = go("again", search="mapped", **{"search.shard_vectors": 16, "search.block": 7})
    np.testing.assert_array_equal(ranks(again), ranks(exact))
    assert os.stat(folder / "shard-00000.npz").st_ino == inode
    if "diffusion" in extra:
        assert again.info["knn_pieces_reused"] == 1


def test_scale_plan_is_the_arithmetic_of_its_parts() -> None:
    from oxbench.index.mapped import CPU_NS_PER_VECTOR_DIM, DISK_READ_BYTES_S, scale_plan

    p = scale_plan(100_000_000, 1024, 1232, k=100, dtype="float16", ram_gb=8)
    assert p.disk_bytes == 100_000_000 * 1024 * 2 == 204_800_000_000
    assert p.results_bytes == 1232 * 100 * 12 and p.ram_bytes == 8 << 30
    assert p.cpu_s == pytest.approx(1e8 * 1024 * 1232 * CPU_NS_PER_VECTOR_DIM * 1e-9)
    assert p.read_s == pytest.approx(204.8e9 / DISK_READ_BYTES_S)
    assert p.wall_s(cores=10**9) == pytest.approx(p.read_s)  # a huge cluster waits on one disk
    assert p.wall_s(cores=64, readers=8) == max(p.cpu_s / 64, p.read_s / 8)
    with pytest.raises(InputError, match="positive sizes"):
        scale_plan(0, 1024, 10)


def test_the_pre_flight_of_a_streamed_search(tmp_path: Path, caplog) -> None:  # noqa: ANN001
    """``oxbench run synthetic rootsift-vlad --set search=mapped --distractors N``: the shards'
    disk counted with the run's new files and refused in one line when the disk is short; a long
    search announced with its CPU time."""
    from oxbench.datasets import load
    from oxbench.pipelines.estimates import preflight
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    m = resolve_method("rootsift-vlad", search="mapped", **{"search.dtype": "float16"})
    bench = load("synthetic", root, distractors=30_000_000, progress=False, images=False)
    n, nq = bench.n_index, bench.gt.n_queries
    with caplog.at_level(logging.WARNING, logger="oxbench.pipelines.estimates"):
        est = preflight(m, bench, tmp_path / "cache", available=1 << 62, free_disk=1 << 62)
    assert est.search is not None
    assert est.search["disk_bytes"] == n * 8192 * 2 and est.search["n_queries"] == nq
    assert est.new_disk_bytes >= est.search["disk_bytes"]
    assert "streamed search (search=mapped)" in caplog.text and f"{n:,} x 8192" in caplog.text
    with pytest.raises(InputError) as exc:
        preflight(m, bench, tmp_path / "cache", available=1 << 62, free_disk=10 * 10**9)
    text = str(exc.value)
    assert "\n" not in text and "streamed search's shards" in text and "fewer distractors" in text
    assert not (tmp_path / "cache").exists()
    # another search kind has no streamed plan
    plain = preflight(
        resolve_method("rootsift-vlad"), bench, tmp_path / "c", available=1 << 62, free_disk=1 << 62
    )
    assert plain.search is None


def _bench_script(name: str):  # noqa: ANN202
    import importlib.util
    import sys

    bench_dir = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench_dir))
    try:
        spec = importlib.util.spec_from_file_location(name, bench_dir / f"{name}.py")
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(bench_dir))
    return script


def test_bench_streamed_in_tiny_mode(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    pytest.importorskip("distributed")
    import json

    script = _bench_script("bench_streamed")
    out = tmp_path / "b.json"
    argv = ["--n", "3000", "--random-dim", "16", "--queries", "5", "--k", "10"]
    argv += ["--shard-vectors", "1000", "--dask-workers", "2", "--work", str(tmp_path / "w")]
    assert script.main([*argv, "--json", str(out)]) == 0
    rows = {r["stage"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"build", "streamed", "dask-2", "ivfpq"}
    assert rows["build"]["shards"] == 3 and rows["build"]["disk_bytes"] > 3000 * 16 * 2
    assert rows["streamed"]["cpu_s_per_query"] > 0 and rows["streamed"]["growth_bytes"] >= 0
    assert rows["dask-2"]["same_ranks"] is True
    assert 0 <= rows["ivfpq"]["recall@10"] <= 1 and rows["ivfpq"]["n"] == 3000
    assert not (tmp_path / "w" / "shards").exists()


def test_gpu_scale_in_tiny_cpu_mode(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import json

    script = _bench_script("gpu_scale")
    out = tmp_path / "g.json"
    argv = ["--n", "3000", "--dim", "16", "--queries", "6", "--k", "20", "--graph-rows", "700"]
    argv += ["--graph-k", "5", "--piece-rows", "256", "--shard-vectors", "1000", "--block", "512"]
    argv += ["--device", "cpu", "--work", str(tmp_path / "w"), "--out", str(out)]
    assert script.main(argv) == 0
    rec = json.loads(out.read_text())
    assert rec["search"]["same_ranks_search"] and rec["graph"]["same_ranks_graph"]
    assert rec["graph"]["pieces_reused_first"] == 0 and rec["graph"]["pieces_reused_rerun"] == 3
    assert rec["build"]["shards"] == 3 and not (tmp_path / "w").exists()


def test_device_cuda_without_a_gpu_is_one_line(real_db) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    x, q, db32, _ = real_db
    with pytest.raises(InputError, match="search.device=cuda, but torch sees no CUDA device"):
        search_shards(q, db32, 5, MappedSearch(device="cuda"))
    # auto on a machine without one: the numpy backend, the same ranks
    np.testing.assert_array_equal(
        search_shards(q, db32, 5, MappedSearch(device="auto"))[1], reference(q, x, 5)[1]
    )
