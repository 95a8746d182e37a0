"""Caches that cannot lie about what they stand for (issue 31).

A digest proves an entry intact, not that it is the right one: every entry also names what it
stands for, and an entry swapped with another, copied over another, or left from other inputs is
recomputed with a warning, so a rerun gives the clean numbers exactly.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oxbench.cache import CorruptCache, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.execution import SerialExecutor


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------- the one binding


def test_an_entry_is_bound_to_the_record_it_was_written_for(tmp_path: Path) -> None:
    a = {"x": np.arange(3)}
    save_npz(tmp_path / "a.npz", a, stands_for={"query": "q1", "inputs": {"w": "d1"}})
    got = load_npz(
        tmp_path / "a.npz", what="entry", stands_for={"inputs": {"w": "d1"}, "query": "q1"}
    )
    assert np.array_equal(got["x"], a["x"]) and "stands_for" not in got
    with pytest.raises(CorruptCache, match="stands for another query than the one asked for"):
        load_npz(
            tmp_path / "a.npz", what="entry", stands_for={"query": "q2", "inputs": {"w": "d1"}}
        )
    with pytest.raises(CorruptCache, match="another inputs"):
        load_npz(
            tmp_path / "a.npz", what="entry", stands_for={"query": "q1", "inputs": {"w": "d2"}}
        )
    save_npz(tmp_path / "old.npz", a)  # an entry that names nothing is not trusted for a record
    with pytest.raises(CorruptCache, match="does not say what it stands for"):
        load_npz(tmp_path / "old.npz", what="entry", stands_for={"query": "q1"})
    with pytest.raises(ValueError, match="reserved"):
        save_npz(tmp_path / "b.npz", {"stands_for": np.array("x")})


def _verified(order: np.ndarray, n_verified: int) -> Any:
    from oxbench.pipelines.steps.verify import VerifiedList

    return VerifiedList(
        head=order.copy(),
        verified=order[:n_verified].copy(),
        inliers=np.arange(n_verified + 4, 4, -1, dtype=np.int64)[:n_verified],
        matches={},
    )


def test_swapped_or_copied_verification_entries_are_verified_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from oxbench.pipelines.steps.verify import VerificationCache

    cache = VerificationCache(tmp_path / "k", {"stores": {"database": "s"}, "settings": {}})
    order = np.array([4, 1, 3, 0, 2], np.int64)
    lists = {
        q: [("database", f"im{i}") for i in np.roll(order, j).tolist()] for j, q in enumerate("ab")
    }
    paths = {q: cache.path(q, c) for q, c in lists.items()}
    for j, q in enumerate("ab"):
        cache.save(
            paths[q],
            np.roll(order, j),
            _verified(np.roll(order, j), 2 + j),
            cache.record(q, lists[q]),
        )
    for q in "ab":  # the clean entries read back
        assert (
            cache.load(paths[q], np.roll(order, "ab".index(q)), cache.record(q, lists[q]))
            is not None
        )
    a, b = paths["a"].read_bytes(), paths["b"].read_bytes()
    paths["a"].write_bytes(b)
    paths["b"].write_bytes(a)
    caplog.set_level(logging.WARNING)
    for q in "ab":
        assert (
            cache.load(paths[q], np.roll(order, "ab".index(q)), cache.record(q, lists[q])) is None
        )
        assert not paths[q].exists()
    said = _warnings(caplog)
    assert len(said) == 1 and "stands for another query, short_list" in said[0], said
    # entries of other features or words: same query and list, other inputs
    cache.save(paths["a"], order, _verified(order, 2), cache.record("a", lists["a"]))
    other = VerificationCache(cache.folder, {"stores": {"database": "s2"}, "settings": {}})
    assert other.load(paths["a"], order, other.record("a", lists["a"])) is None


# ---------------------------------------------------------------------- the pipeline


def _run(method: Any, bench: Any, train: Any, cache: Path) -> Any:
    from oxbench.pipelines.runner import fit_index_search
    from oxbench.pipelines.session import Session

    session = Session(root=cache.parent, cache=cache, engine="serial", progress=False)
    return fit_index_search(method, train, bench, session, SerialExecutor())[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.datasets import load
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import TINY, make_tiny_root

    root = make_tiny_root(tmp_path_factory.mktemp("data"))
    bench = load("synthetic", root, progress=False)
    train = load("synthetic-train", root, progress=False)
    method = resolve_method("rootsift-bow-sv", **{"vocabulary.size": 100}, **TINY)
    cache = tmp_path_factory.mktemp("cache")
    clean = _run(method, bench, train, cache)
    return {
        "root": root,
        "bench": bench,
        "train": train,
        "method": method,
        "cache": cache,
        "clean": clean,
    }


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "verification").glob("*/*.npz"))


def test_swapped_verification_entries_give_the_clean_ranks(
    tiny: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(tiny["cache"], cache)
    entries = _entries(cache)
    assert len(entries) >= 3
    a, b = entries[0].read_bytes(), entries[1].read_bytes()
    entries[0].write_bytes(b)
    entries[1].write_bytes(a)
    for e in entries[3:]:  # and one copied over the rest
        shutil.copyfile(entries[2], e)
    caplog.set_level(logging.WARNING)
    again = _run(tiny["method"], tiny["bench"], tiny["train"], cache)
    np.testing.assert_array_equal(again.ranks, tiny["clean"].ranks)
    said = _warnings(caplog)
    assert len(said) == 1 and "verifying that short list again" in said[0], said


# ---------------------------------------------------------------------- descriptor and word shards


def test_a_descriptor_shard_replaced_by_another_valid_shard_is_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Main 18c1381 read shard 1's content in shard 0's folder, then failed every rerun with
    "do the workers see this folder?"; now the shard is refused and described again."""
    from oxbench.execution.shards import NPZ_NAME, committed_folders
    from oxbench.features.descstore import DescriptorStore, fill_store

    names = [f"im{i}" for i in range(6)]
    truth = np.arange(48, dtype=np.float32).reshape(6, 8)
    calls: list[list[int]] = []

    def compute(positions: list[int]) -> tuple[list[int], np.ndarray]:
        calls.append(list(positions))
        return positions, truth[positions]

    store = DescriptorStore.open(tmp_path / "s", {"kind": "test"})
    fill_store(store, names, compute, shard_size=3, progress=False)
    folders = committed_folders(tmp_path / "s")
    shutil.copyfile(folders[1][0] / NPZ_NAME, folders[0][0] / NPZ_NAME)
    calls.clear()
    with caplog.at_level(logging.WARNING):
        again = DescriptorStore.open(tmp_path / "s", {"kind": "test"})
        fill_store(again, names, compute, shard_size=3, progress=False)
    said = _warnings(caplog)
    assert len(said) == 1 and "stands for another shard" in said[0], said
    assert calls == [[0, 1, 2]]
    np.testing.assert_array_equal(again.get(names), truth)


# ---------------------------------------------------------------------- images changed under a cache


def _replace_one_database_image(bench: Any) -> str:
    """Overwrite a database image (that no query shows) with another database image's bytes."""
    queries = {bench.queries.path(i) for i in range(len(bench.queries))}
    free = [i for i in range(len(bench.database)) if bench.database.path(i) not in queries]
    target, other = bench.database.path(free[0]), bench.database.path(free[-1])
    target.write_bytes(other.read_bytes())
    return bench.database.name(free[0])


def test_an_image_replaced_under_a_warm_cache_is_described_again(
    tiny: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Main 18c1381 ran on the old image's features (exit 0, another mAP); now exactly that image
    is described again, the record says so, and the ranks are a clean cache's."""
    from oxbench.datasets import load
    from oxbench.pipelines.runner import fit_index_search
    from oxbench.pipelines.session import Session

    root, cache = tmp_path / "data", tmp_path / "cache"
    shutil.copytree(tiny["root"], root)
    bench = load("synthetic", root, progress=False)
    clean = _run(tiny["method"], bench, tiny["train"], cache)  # a warm cache of these files
    _replace_one_database_image(bench)
    caplog.set_level(logging.WARNING)
    session = Session(root=root, cache=cache, engine="serial", progress=False)
    _, warm, ctx = fit_index_search(tiny["method"], tiny["train"], bench, session, SerialExecutor())
    said = _warnings(caplog)  # the image, then what was computed from its old features
    assert "1 of 40 images" in said[0] and "describing them again" in said[0], said
    assert all("stands for another" in w for w in said[1:]), said
    assert ctx.steps["features"] == "computed" and ctx.computed["features"] == 1
    assert ctx.steps["words.database"] == "computed"
    fresh = _run(tiny["method"], bench, tiny["train"], tmp_path / "fresh")
    np.testing.assert_array_equal(warm.ranks, fresh.ranks)
    assert not np.array_equal(warm.ranks, clean.ranks)  # the change mattered
    caplog.clear()
    # and the next run is all hits, no warning
    _, _, ctx = fit_index_search(tiny["method"], tiny["train"], bench, session, SerialExecutor())
    assert ctx.steps["features"] == "hit" and ctx.computed["features"] == 0
    assert _warnings(caplog) == []


def test_verify_images_finds_a_change_that_stat_cannot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes changed in place with the old size, modification time and inode restored: the stat
    check cannot see it, --verify-images (a full hash) does, and describes exactly that image."""
    import os

    pytest.importorskip("cv2")
    pytest.importorskip("PIL.Image")
    from PIL import Image

    from oxbench.datasets.base import FileImages
    from oxbench.features.sift import SiftConfig
    from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store
    from test_features import textured_image

    paths = []
    for i in range(4):
        paths.append(tmp_path / f"im{i}.bmp")
        Image.fromarray(textured_image(40 + i, 96, 80)).save(paths[-1])
    source = FileImages(tuple(p.stem for p in paths), tuple(paths))
    cfg = SiftConfig(n_features=50)
    store = FeatureStore.open(tmp_path / "s", cfg)
    assert (
        extract_to_store(DescribeImages(source, cfg), 4, store, shard_size=2, progress=False) == 4
    )
    before = store.get_raw("im1")
    st = paths[1].stat()
    data = bytearray(paths[1].read_bytes())  # raw pixels: other pixels, the same byte length
    middle = len(data) // 2
    data[middle : middle + 3000] = bytes(255 - b for b in data[middle : middle + 3000])
    with open(paths[1], "r+b") as fh:  # in place: the inode stays
        fh.write(bytes(data))
    os.utime(paths[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    assert paths[1].stat().st_ino == st.st_ino and paths[1].stat().st_size == st.st_size
    job = DescribeImages(source, cfg)
    assert (
        extract_to_store(
            job, 4, FeatureStore.open(tmp_path / "s", cfg), shard_size=2, progress=False
        )
        == 0
    )
    caplog.set_level(logging.WARNING)
    again = FeatureStore.open(tmp_path / "s", cfg)
    assert extract_to_store(job, 4, again, shard_size=2, progress=False, verify_images=True) == 1
    said = _warnings(caplog)
    assert len(said) == 1 and "1 of 4 images" in said[0] and "'im1'" in said[0], said
    assert sorted(again.names) == ["im0", "im1", "im2", "im3"]
    assert again.get_raw("im0").descriptors.tobytes() == store.get_raw("im0").descriptors.tobytes()
    assert again.get_raw("im1").descriptors.tobytes() != before.descriptors.tobytes()
    paths[3].write_bytes(b"")  # a 0-byte image under a warm cache: described again, so refused
    with pytest.raises(InputError, match="cannot decode image"):
        extract_to_store(
            job, 4, FeatureStore.open(tmp_path / "s", cfg), shard_size=2, progress=False
        )


# ---------------------------------------------------------------------- memory-mapped files


def test_a_file_opened_through_open_written_must_be_the_one_written(tmp_path: Path) -> None:
    import os

    from oxbench.cache import open_written, record_written

    path = tmp_path / "v.npy"
    np.save(path, np.arange(12, dtype=np.float32).reshape(3, 4))
    record_written(path, {"vectors": "d1"})

    def mapped(p: Path) -> Any:
        return np.load(p, mmap_mode="r")

    got = open_written(path, what="vectors", stands_for={"vectors": "d1"}, open_file=mapped)
    assert np.array_equal(got, np.arange(12).reshape(3, 4))
    with pytest.raises(CorruptCache, match="stands for another vectors"):
        open_written(path, what="vectors", stands_for={"vectors": "d2"}, open_file=mapped)
    st = path.stat()
    with open(path, "r+b") as fh:  # same size, same inode, other rows; the old mtime restored
        fh.seek(st.st_size - 16)
        fh.write(np.float32([9, 9, 9, 9]).tobytes())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptCache, match="is not the file written"):
        open_written(path, what="vectors", stands_for={"vectors": "d1"}, open_file=mapped)
    path.with_name("v.npy.written.json").unlink()
    with pytest.raises(CorruptCache, match="no readable record"):
        open_written(path, what="vectors", stands_for={"vectors": "d1"}, open_file=mapped)


def test_ivfpq_vectors_replaced_by_a_same_shape_file_are_written_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Main 18c1381 checked the mapped float vectors (read by query expansion) for shape and dtype
    only: the rows reversed gave 29.85 / 36.31 / 23.96 instead of 95.08 / 96.62 / 95.38."""
    pytest.importorskip("faiss")
    from oxbench.pipelines import RunContext, resolve_method
    from oxbench.pipelines.globalchain import SearchChain

    rng = np.random.default_rng(3)
    db = rng.normal(size=(400, 16)).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    m = resolve_method(
        "features-ivfpq",
        **{"search.nlist": 4},
        **{"search.m": 4},
        **{"search.nbits": 4},
        **{"search.nprobe": 4},
        **{"list_length": 50},
    )
    ctx = RunContext(tmp_path / "cache", progress=False)
    first = SearchChain(m, db, ctx, tmp_path / "index").build_index()
    (vectors,) = (tmp_path / "index").glob("vectors-*.npy")
    assert np.array_equal(first.db, db)
    np.save(vectors, db[::-1].copy())  # same shape and dtype, the rows reversed
    caplog.set_level(logging.WARNING)
    second = SearchChain(
        m, db, RunContext(tmp_path / "cache", progress=False), tmp_path / "index"
    ).build_index()
    said = _warnings(caplog)
    assert len(said) == 1 and "is not the file written" in said[0] and str(vectors) in said[0]
    assert np.array_equal(second.db, db)
    caplog.clear()
    third = SearchChain(
        m, db, RunContext(tmp_path / "cache", progress=False), tmp_path / "index"
    ).build_index()
    assert _warnings(caplog) == [] and np.array_equal(third.db, db)


def test_a_cached_faiss_index_of_other_vectors_is_built_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An intact index file of the same settings built from other vectors, copied over the cached
    one, passed its checksum on main 18c1381 and answered for the wrong database."""
    pytest.importorskip("faiss")
    import dataclasses

    from oxbench.pipelines.globalchain import SearchChain
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import METHODS

    m = dataclasses.replace(METHODS.get("rootsift-vlad"), search="faiss-flat")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((40, 16)).astype(np.float32) for _ in range(2))
    a /= np.linalg.norm(a, axis=1, keepdims=True)
    b /= np.linalg.norm(b, axis=1, keepdims=True)
    clean = SearchChain(m, a, RunContext(tmp_path / "c"), tmp_path / "ia").build_index()
    SearchChain(m, b, RunContext(tmp_path / "c"), tmp_path / "ib").build_index()
    (path_a,) = (tmp_path / "ia").glob("index-faiss-flat-*.npz")
    (path_b,) = (tmp_path / "ib").glob("index-faiss-flat-*.npz")
    shutil.copyfile(path_b, path_a)
    ctx = RunContext(tmp_path / "c")
    with caplog.at_level(logging.WARNING):
        again = SearchChain(m, a, ctx, tmp_path / "ia").build_index()
    said = _warnings(caplog)
    assert len(said) == 1 and "stands for another vectors" in said[0], said
    assert ctx.steps["search_index"] == "computed"
    np.testing.assert_array_equal(again.rank(a[:5])[1], clean.rank(a[:5])[1])


def test_mapped_postings_replaced_by_a_same_size_file_are_refused(tmp_path: Path) -> None:
    import scipy.sparse as sp

    from oxbench.index.postings import CompressedPostings

    m = sp.random(6, 20, density=0.4, format="csr", dtype=np.float32, random_state=0)
    CompressedPostings.write(m, tmp_path / "ivf")
    weights = tmp_path / "ivf" / "weights.npy"
    data = np.load(weights)
    np.save(weights, data[::-1].copy())  # same size, the weights in another order
    with pytest.raises(CorruptCache, match="is not the file written"):
        CompressedPostings.open(tmp_path / "ivf")


def test_a_vocabulary_of_other_settings_copied_over_is_trained_again(
    tiny: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An intact vocabulary of 50 words copied over the cached 100-word one (its old mtime
    restored) passed the digest, descriptor and dimension checks on main 18c1381."""
    import os

    from oxbench.pipelines import steps
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import TINY

    cache = tmp_path / "cache"
    shutil.copytree(tiny["cache"], cache)
    other = resolve_method("rootsift-bow-sv", **{"vocabulary.size": 50}, **TINY)
    _run(other, tiny["bench"], tiny["train"], tmp_path / "other")
    theirs = steps.vocabulary_path(tmp_path / "other", other.vocabulary_spec(), tiny["train"])
    ours = steps.vocabulary_path(cache, tiny["method"].vocabulary_spec(), tiny["train"])
    st = ours.stat()
    shutil.copyfile(theirs, ours)
    os.utime(ours, ns=(st.st_atime_ns, st.st_mtime_ns))
    caplog.set_level(logging.WARNING)
    again = _run(tiny["method"], tiny["bench"], tiny["train"], cache)
    said = _warnings(caplog)
    assert "vocabulary stands for another" in said[0] and "training it again" in said[0], said
    np.testing.assert_array_equal(again.ranks, tiny["clean"].ranks)


def test_a_whitening_of_other_settings_copied_over_is_learned_again(
    tiny: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An intact whitening learned at another dimension, copied over the cached one (its old mtime
    restored), is refused by its record and learned again: the clean ranks exactly."""
    import os

    from oxbench.pipelines.presets import resolve_method

    small = {
        "descriptor.features.max_side": 320,
        "descriptor.features.n_features": 300,
        "descriptor.vocabulary.size": 8,
    }
    ours = resolve_method("rootsift-vlad-w", whitening_dim=16, **small)
    theirs = resolve_method("rootsift-vlad-w", whitening_dim=8, **small)
    cache = tmp_path / "cache"
    clean = _run(ours, tiny["bench"], tiny["train"], cache)
    _run(theirs, tiny["bench"], tiny["train"], tmp_path / "other")
    (mine,) = (cache / "whitening").glob("*.npz")
    (other,) = (tmp_path / "other" / "whitening").glob("*.npz")
    st = mine.stat()
    shutil.copyfile(other, mine)
    os.utime(mine, ns=(st.st_atime_ns, st.st_mtime_ns))
    caplog.set_level(logging.WARNING)
    again = _run(ours, tiny["bench"], tiny["train"], cache)
    said = _warnings(caplog)
    assert any("whitening stands for another whitening" in s for s in said), said
    assert any("learning the whitening again" in s for s in said), said
    np.testing.assert_array_equal(again.ranks, clean.ranks)
    # and the entry written again is used as it is on the next run
    caplog.clear()
    _run(ours, tiny["bench"], tiny["train"], cache)
    assert not any("whitening" in s for s in _warnings(caplog))
