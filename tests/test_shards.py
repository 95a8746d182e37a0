"""The write-once shard protocol (oxbench.execution.shards) and the stages built on it other than local
features (tests/test_dask.py covers those): visual words, verified short lists, global descriptors."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from oxbench.cache import DIGEST_KEY
from oxbench.execution import ProcessExecutor, SerialExecutor
from oxbench.execution.shards import (
    NPZ_NAME,
    ShardTask,
    committed_folders,
    plan_shards,
    read_npz_shards,
    write_npz_shard,
)
from oxbench.features.local import RawFeatures
from oxbench.features.sift import SiftConfig
from oxbench.features.store import FeatureStore
from oxbench.fileio import TEMP_PREFIX
from oxbench.index.vocabulary import Vocabulary
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps.words import Words, step_assign

CFG = SiftConfig(n_features=50)


def _store(tmp_path: Path, n_images: int = 7, seed: int = 0) -> tuple[FeatureStore, list[str]]:
    """A feature store of random SIFT-like histograms (some images without features)."""
    rng = np.random.default_rng(seed)
    store = FeatureStore.open(tmp_path / "features", CFG)
    names = [f"img{i:02d}" for i in range(n_images)]
    items = []
    for i, name in enumerate(names):
        n = 0 if i == 3 else int(rng.integers(5, 40))
        kp = rng.random((n, 4), dtype=np.float32) * 100
        raw = rng.integers(0, 255, (n, 128)).astype(np.uint8)
        items.append(RawFeatures(name, kp, raw, (100, 80)))
    store.write_shard(items)
    return store, names


def _vocabulary(tmp_path: Path) -> Path:
    x = CFG.finish(np.random.default_rng(1).integers(0, 255, (600, 128)).astype(np.uint8))
    return Vocabulary(12, structure="flat", descriptor="rootsift").fit(x).save(tmp_path / "voc.npz")


def _reference_words(
    store: FeatureStore, names: list[str], voc_path: Path, k: int
) -> tuple[list, list]:
    """The definition: each feature's k nearest centroids by squared Euclidean distance."""
    voc = Vocabulary.load(voc_path)
    words, dists = [], []
    for name in names:
        x = store.get(name).descriptors.astype(np.float64)
        d = ((x[:, None, :] - voc.centroids_[None].astype(np.float64)) ** 2).sum(-1)
        nearest = np.argsort(d, axis=1, kind="stable")[:, :k]
        words.append(nearest)
        dists.append(np.take_along_axis(d, nearest, 1))
    return words, dists


@pytest.mark.parametrize("k", [1, 3])
def test_words_by_shards_are_the_nearest_centroids_whatever_the_shard_size(
    tmp_path: Path, k: int
) -> None:
    store, names = _store(tmp_path)
    voc = _vocabulary(tmp_path)
    ref_w, ref_d = _reference_words(store, names, voc, k)
    files = {}
    for size in (1, 3, 64):
        out = tmp_path / f"words-{size}.npz"
        res = step_assign(
            voc, store, names, out, RunContext(tmp_path, progress=False), k=k, shard_size=size
        )
        assert not res.hit and res.computed == len(names)
        assert not out.with_suffix(".shards").exists()  # assembled, then the shards are gone
        words = Words.load(out)
        for name, w, d in zip(names, ref_w, ref_d, strict=True):
            got_w, got_d = words.of(name)
            assert np.array_equal(got_w, w)
            np.testing.assert_allclose(got_d, d, rtol=1e-4, atol=1e-5)
        files[size] = np.load(out)
    for z in files.values():  # the same file whatever the plan
        assert str(z[DIGEST_KEY]) == str(files[1][DIGEST_KEY])


def test_words_resume_from_a_partition_and_recompute_a_tampered_shard(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, names = _store(tmp_path)
    voc = _vocabulary(tmp_path)
    ctx = RunContext(tmp_path, progress=False)
    clean = tmp_path / "clean.npz"
    step_assign(voc, store, names, clean, ctx, shard_size=2)
    out = tmp_path / "words.npz"
    part = step_assign(voc, store, names, out, ctx, shard_size=2, partition=(1, 2))
    shards = out.with_suffix(".shards")
    assert part.computed == 3 and not out.exists()  # shards 1 and 3 of 0..3: images 2, 3 and 6
    assert sorted(committed_folders(shards)) == [1, 3]
    # a committed shard tampered with: assigned again, with a warning naming it
    victim = committed_folders(shards)[1][0] / NPZ_NAME
    z = dict(np.load(victim))
    z["words"] = z["words"] + 1
    np.savez(victim, **z)
    with caplog.at_level(logging.WARNING):
        rest = step_assign(voc, store, names, out, ctx, shard_size=2)
    assert "does not match" in caplog.text and "computing that shard again" in caplog.text
    assert (
        rest.computed == 6
    )  # shards 0, 2 and the tampered 1 (two images each); shard 3 was reused
    assert np.load(out)[DIGEST_KEY] == np.load(clean)[DIGEST_KEY]
    assert step_assign(voc, store, names, out, ctx, shard_size=2).hit


def test_words_through_worker_processes_equal_this_processs(tmp_path: Path) -> None:
    store, names = _store(tmp_path, n_images=9)
    voc = _vocabulary(tmp_path)
    serial = tmp_path / "serial.npz"
    step_assign(
        voc,
        store,
        names,
        serial,
        RunContext(tmp_path, executor=SerialExecutor(), progress=False),
        shard_size=2,
    )
    with ProcessExecutor(2) as ex:
        pooled = tmp_path / "pool.npz"
        step_assign(
            voc,
            store,
            names,
            pooled,
            RunContext(tmp_path, executor=ex, progress=False),
            shard_size=2,
        )
    assert np.load(serial)[DIGEST_KEY] == np.load(pooled)[DIGEST_KEY]


def test_two_attempts_of_one_shard_commit_once(tmp_path: Path) -> None:
    names = ["a", "b", "c"]
    (task,) = plan_shards(names, 3)
    first = write_npz_shard(tmp_path, task, {"x": np.arange(3)}, tag="one")
    second = write_npz_shard(tmp_path, task, {"x": np.arange(3) * 2}, tag="two")
    assert first.committed and not second.committed
    assert [p.name for p in tmp_path.iterdir()] == [
        task.folder
    ]  # the loser's temporary folder is gone
    done, todo = read_npz_shards(tmp_path, names, 3, what="test shard")
    assert not todo and np.array_equal(done[0]["x"], np.arange(3))


def test_shards_of_another_plan_or_beyond_it_are_discarded(tmp_path: Path) -> None:
    names = ["a", "b", "c", "d"]
    write_npz_shard(tmp_path, ShardTask(0, (0, 1), "shard-000000-000000000000"), {"x": np.zeros(1)})
    for task in plan_shards(names + ["e", "f"], 2):
        write_npz_shard(tmp_path, task, {"x": np.zeros(1)})
    (
        tmp_path / f"{TEMP_PREFIX}shard-000001-x.dead.1"
    ).mkdir()  # a fresh temporary folder: left alone
    done, todo = read_npz_shards(tmp_path, names, 2, what="test shard")
    assert sorted(done) == [0, 1] and not todo
    assert sorted(committed_folders(tmp_path)) == [0, 1]
    assert len(committed_folders(tmp_path)[0]) == 1


class _CountingVerifier:
    """A stand-in for ShortListVerifier: 'verifies' the first two candidates, counting its calls."""

    def __init__(self, n_index: int) -> None:
        from oxbench.refinement.spatial import Verification

        self.stores: dict = {}
        self.words: dict = {}
        self.settings = Verification()
        self.index_parts = [("database", f"db{i}") for i in range(n_index)]
        self.query_part = "queries"
        self.calls: list[str] = []

    def __call__(self, item: tuple[int, str, np.ndarray]):  # noqa: ANN204
        from oxbench.pipelines.steps.verify import VerifiedList

        _, qname, order = item
        self.calls.append(qname)
        head = np.asarray(order, np.int64)
        return VerifiedList(
            head, head[:2], np.array([9, 5], np.int64), {int(head[0]): np.ones((3, 4), np.float32)}
        )


def test_verification_tasks_write_their_entries_and_a_rerun_verifies_only_the_rest(
    tmp_path: Path,
) -> None:
    from oxbench.pipelines.steps.verify import (
        QueryBlock,
        VerificationCache,
        VerifyBlock,
        verify_short_lists,
    )

    job = _CountingVerifier(30)
    rng = np.random.default_rng(0)
    items = [(q, f"q{q}", rng.permutation(30)[:6]) for q in range(20)]
    ctx = RunContext(tmp_path, progress=False)
    first = verify_short_lists(job, items[:7], ctx)  # an earlier, interrupted run got this far
    assert job.calls == [f"q{q}" for q in range(7)] and ctx.steps["spatial"] == "computed"
    job.calls.clear()
    every = verify_short_lists(job, items, ctx)
    assert job.calls == [f"q{q}" for q in range(7, 20)]  # only the lists not in the cache
    for got, (_, _, order) in zip(every, items, strict=True):
        assert np.array_equal(got.head, order) and np.array_equal(got.inliers, [9, 5])
        assert np.array_equal(got.matches[int(order[0])], np.ones((3, 4)))
    assert all(np.array_equal(a.head, b.head) for a, b in zip(first, every[:7], strict=True))
    job.calls.clear()
    verify_short_lists(job, items, ctx)
    assert not job.calls and ctx.steps["spatial"] == "hit"
    # a second attempt of a block (a retried task) finds its entries and writes nothing
    cache = VerificationCache.for_job(job, tmp_path)
    block = QueryBlock(
        tuple(
            (q, n, o, cache.path(n, [job.index_parts[int(j)] for j in o]).name)
            for q, n, o in items[:3]
        )
    )
    assert str(block) == "the short lists of 3 queries (q0 .. q2)"  # how a failing task is named
    before = {p: p.stat().st_mtime_ns for p in cache.folder.iterdir()}
    assert VerifyBlock(job, cache.folder)(block) == [(b[3], False) for b in block.lists]
    assert not job.calls and before == {p: p.stat().st_mtime_ns for p in cache.folder.iterdir()}
