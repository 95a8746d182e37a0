"""IVF-PQ built by shards and merged with FAISS is the index built in one piece: same codes, same
ids in the same lists, same answers (in RAM and with on-disk inverted lists)."""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError

pytest.importorskip("faiss")

from oxbench.index.faiss_setup import load_faiss  # noqa: E402
from oxbench.index.sharded import (  # noqa: E402
    SHARD_FILE,
    AddTask,
    ShardAdder,
    build_shards,
    list_contents,
    merge_shards,
    serialize,
    shard_ranges,
    train_ivfpq,
)

N, D, NLIST, M, NBITS = 100_000, 16, 64, 4, 8


@pytest.fixture(scope="module")
def data() -> tuple[np.ndarray, np.ndarray, object]:
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(200, D)).astype(np.float32)
    x = centres[rng.integers(0, 200, N)] + 0.3 * rng.normal(size=(N, D)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[rng.choice(N, 50, replace=False)] + 0.05 * rng.normal(size=(50, D)).astype(np.float32)
    trained = train_ivfpq(x[::5], D, NLIST, M, NBITS, seed=3)
    return x, q.astype(np.float32), trained


def _one_piece(trained: object, x: np.ndarray) -> object:
    index = load_faiss().clone_index(trained)
    index.add(x)  # what FaissIndex.fit does: ids are the positions
    return index


def _same_index(a: object, b: object, q: np.ndarray, n: int = N) -> None:
    ids_a, codes_a = list_contents(a)
    ids_b, codes_b = list_contents(b)
    assert sum(len(i) for i in ids_a) == n
    for la, lb, ca, cb in zip(ids_a, ids_b, codes_a, codes_b, strict=True):
        np.testing.assert_array_equal(la, lb)
        np.testing.assert_array_equal(ca, cb)
    a.nprobe = b.nprobe = 8  # type: ignore[attr-defined]
    da, ia = a.search(q, 20)  # type: ignore[attr-defined]
    db, ib = b.search(q, 20)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ia, ib)
    np.testing.assert_array_equal(da, db)


def test_shards_merged_in_ram_are_the_index_built_in_one_piece(data, tmp_path: Path) -> None:
    x, q, trained = data
    receipts = build_shards(
        trained, x, tmp_path / "shards", shard_size=7_000
    )  # uneven: the last is shorter
    assert [r.images for r in receipts] == [b - a for a, b in shard_ranges(N, 7_000)]
    assert (
        len(receipts) == 15
        and receipts[-1].images == N - 14 * 7_000
        and all(r.committed for r in receipts)
    )
    merged = merge_shards(trained, receipts, tmp_path / "shards")
    one = _one_piece(trained, x)
    _same_index(merged, one, q)
    assert trained.ntotal == 0  # type: ignore[attr-defined]  # merging worked on a copy


def test_shards_merged_into_on_disk_lists_answer_the_same(data, tmp_path: Path) -> None:
    x, q, trained = data
    receipts = build_shards(trained, x, tmp_path / "shards", shard_size=30_000)
    merged = merge_shards(trained, receipts, tmp_path / "shards", ondisk=tmp_path / "lists.ivfdata")
    assert (tmp_path / "lists.ivfdata").stat().st_size >= N * (M * NBITS // 8 + 8)
    _same_index(merged, _one_piece(trained, x), q)


def test_the_shard_job_is_picklable_commits_once_and_starts_from_the_empty_index(
    data, tmp_path: Path
) -> None:
    from oxbench.execution.shards import ShardTask

    x, _, trained = data
    job = pickle.loads(pickle.dumps(ShardAdder(serialize(trained), str(tmp_path), tag="t")))
    task = ShardTask(5, tuple(range(500, 600)), "shard-000005-000000000000")
    r = job(AddTask(task, x[500:600]))
    assert (r.number, r.images, r.committed) == (5, 100, True) and str(AddTask(task, x)) == str(
        task
    )
    ids, _ = list_contents(load_faiss().read_index(str(tmp_path / task.folder / SHARD_FILE)))
    assert sorted(np.concatenate(ids).tolist()) == list(range(500, 600))
    again = job(
        AddTask(task, x[500:600])
    )  # a second attempt (a retried task): the first commit stays
    assert (
        not again.committed
        and again.digest == r.digest
        and [p.name for p in tmp_path.iterdir()] == [task.folder]
    )
    full = _one_piece(trained, x[:10])
    with pytest.raises(InputError, match="trained, empty index"):
        ShardAdder(serialize(full), str(tmp_path))(AddTask(task, x[:100]))


def test_an_interrupted_build_reuses_its_committed_shards(data, tmp_path: Path) -> None:
    from oxbench.execution import SerialExecutor

    x, q, trained = data
    calls: list[int] = []

    class Counting(SerialExecutor):
        def map(self, job, items, **kw):  # noqa: ANN001, ANN003, ANN201
            calls.extend(i.task.number for i in items)
            return super().map(job, items, **kw)

    first = build_shards(trained, x[:5000], tmp_path / "s", shard_size=1000)
    for r in first[1:]:  # the build was killed after its first shard
        shutil.rmtree(tmp_path / "s" / r.folder)
    (tmp_path / "s" / first[0].folder / SHARD_FILE).write_bytes(
        b"junk"
    )  # ... and that shard damaged
    calls.clear()
    again = build_shards(trained, x[:5000], tmp_path / "s", shard_size=1000, executor=Counting())
    assert calls == [0, 1, 2, 3, 4] and [r.digest for r in again] == [r.digest for r in first]
    calls.clear()
    assert [
        r.digest
        for r in build_shards(
            trained, x[:5000], tmp_path / "s", shard_size=1000, executor=Counting()
        )
    ] == [r.digest for r in first]
    assert calls == []
    _same_index(
        merge_shards(trained, again, tmp_path / "s"), _one_piece(trained, x[:5000]), q, 5000
    )


def test_a_missing_changed_or_misplaced_shard_is_refused_in_one_line(data, tmp_path: Path) -> None:
    x, _, trained = data
    receipts = build_shards(trained, x[:3000], tmp_path / "s", shard_size=1000)
    with pytest.raises(InputError, match="do not follow each other"):
        merge_shards(trained, [receipts[0], receipts[2]], tmp_path / "s")
    path1 = tmp_path / "s" / receipts[1].folder / SHARD_FILE
    path1.write_bytes(path1.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(InputError, match="changed since it was written"):
        merge_shards(trained, receipts, tmp_path / "s")
    (tmp_path / "s" / receipts[0].folder / SHARD_FILE).unlink()
    with pytest.raises(InputError, match="missing") as exc:
        merge_shards(trained, receipts, tmp_path / "s")
    assert "\n" not in str(exc.value)
    with pytest.raises(InputError, match="shard size must be >= 1"):
        shard_ranges(10, 0)
    with pytest.raises(InputError, match="nlist 64 is larger"):
        train_ivfpq(x[:10], D, NLIST, M, NBITS)


def test_the_global_family_builds_ivfpq_by_shards_and_reports_recall_against_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the family's chain: the sharded index equals FaissIndex.fit's; recall is reported."""
    import oxbench.index.sharded as sharded
    from oxbench.index.search import FaissIndex, exact_search, recall_at
    from oxbench.pipelines import RunContext, resolve_method
    from oxbench.pipelines.globalchain import SearchChain

    monkeypatch.setattr(sharded, "DEFAULT_SHARD_VECTORS", 300)  # several shards of a small database
    rng = np.random.default_rng(1)
    db = rng.normal(size=(2000, D)).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q = db[:25] + 0.1 * rng.normal(size=(25, D)).astype(np.float32)
    m = resolve_method(
        "features-ivfpq",
        **{"search.nlist": 16},
        **{"search.m": 4},
        **{"search.nbits": 8},
        **{"search.nprobe": 4},
        **{"list_length": 100},
    )
    chain = SearchChain(
        m, db, RunContext(tmp_path / "cache", progress=False), tmp_path / "index"
    ).build_index()
    assert chain.faiss is not None and not list(
        (tmp_path / "index").glob("shards-*")
    )  # shard files removed
    ref = FaissIndex(chain.faiss.settings).fit(db)
    ids_a, codes_a = list_contents(chain.faiss.index_)
    ids_b, codes_b = list_contents(ref.index_)
    assert all(np.array_equal(a, b) for a, b in zip(ids_a + codes_a, ids_b + codes_b, strict=True))
    scores, ranks = chain.rank(q)
    np.testing.assert_array_equal(ranks, ref.search(q, 100)[1])
    truth = exact_search(q, db, 100)[1]
    recall = chain.info["recall_vs_exact"]
    assert set(recall) == {"recall@1", "recall@10", "recall@100"}
    assert recall["recall@10"] == recall_at(ranks, truth, 10) and 0.0 < recall["recall@100"] <= 1.0
