"""``search=mapped`` with no stage that needs the whole database in RAM: the database is whitened
chunk by chunk into the shards (:class:`oxbench.pipelines.globalchain.DatabaseChunks`).

(a) a whitened run gives bit for bit the shards (same folder digest, same rows) and the ranks of
the path that whitens the whole database in RAM first, for several shard and chunk sizes (a last
chunk of one row included); (b) the streamed build never holds the whole database: no chunk of
``n`` rows reaches :func:`~oxbench.index.mapped.write_shards` and the traced peak stays far below
the array's size; (c) a stage that needs the database in RAM keeps the in-RAM path.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from oxbench.pipelines import globalchain
from oxbench.pipelines.globalchain import (
    DatabaseChunks,
    SearchChain,
    array_digest,
    streamed_digest,
)


def test_chunks_are_the_rows_of_the_whole_and_digest_alike() -> None:
    """Chunks across parts (database, then distractors) are the rows of ``finish`` of the
    concatenation, bit for bit, and their streamed digest is the whole array's."""
    from oxbench.index.whitening import PCAWhitening

    rng = np.random.default_rng(3)
    parts = [
        rng.normal(size=(23, 16)).astype(np.float32),
        rng.normal(size=(18, 16)).astype(np.float32),
    ]
    w = PCAWhitening(12).fit(rng.normal(size=(200, 16)).astype(np.float32), fitted_on="test")
    whole = w.transform(np.concatenate(parts))
    for rows in (1, 2, 5, 7, 40, 41, 1000):
        chunks = DatabaseChunks(parts, w.transform, 12, rows=rows)
        got = list(chunks)
        assert all(len(c) > 1 for c in got[1:])  # a last chunk of one row joins the one before
        assert sum(len(c) for c in got) == 41 and chunks.shape == (41, 12)
        np.testing.assert_array_equal(np.concatenate(got), whole)
        assert streamed_digest(chunks) == array_digest(whole)


@pytest.mark.parametrize(("shard_vectors", "rows"), [(16, 7), (5, 64), (3, 2)])
def test_a_whitened_run_streamed_is_the_in_ram_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard_vectors: int, rows: int
) -> None:
    """The features preset with PCA whitening and ``search=mapped``: the streamed build writes
    the same shard folder (same digest), the same rows, and gives the same ranks as whitening the
    whole database in RAM (the path a stage such as DBA takes)."""
    from oxbench.cache import load_npz
    from oxbench.pipelines import RecordOptions, Session, run
    from test_features_method import write_features
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    db, q = write_features(root, "synthetic", tmp_path / "f", noise=0.5, seed=0)
    tdb, tq = write_features(root, "synthetic-train", tmp_path / "t", noise=0.5, seed=1)
    train = tmp_path / "train.npy"
    np.save(train, np.vstack([np.load(tdb), np.load(tq)]))
    monkeypatch.setattr(globalchain, "STREAM_BYTES", rows * (2 * 8 * 8 + 4 * 6))  # `rows` a chunk

    def go(name: str):  # noqa: ANN202
        sets = {
            "descriptor.db_features": str(db),
            "descriptor.query_features": str(q),
            "descriptor.train_features": str(train),
            "whitening": "pca",
            "whitening_dim": "6",
            "search": "mapped",
            "search.shard_vectors": str(shard_vectors),
            "search.block": "4",
        }
        out = run(
            "synthetic",
            "features",
            overrides=sets,
            session=Session(root=root, cache=tmp_path / name / "cache", progress=False),
            record=RecordOptions(out=tmp_path / name / "out"),
        )
        folder = next((tmp_path / name / "cache").rglob(f"mapped-float32-{shard_vectors}-*"))
        rows_ = [
            np.asarray(load_npz(p, what="shard", mapped=["vectors"])["vectors"])
            for p in sorted(folder.glob("shard-*.npz"))
        ]
        return out, folder.name, np.concatenate(rows_), np.load(out.run_dir / "ranks.npy")

    streamed, s_folder, s_rows, s_ranks = go("streamed")
    assert streamed.info["streamed_build"] is True
    with monkeypatch.context() as mp:
        mp.setattr(SearchChain, "streams", classmethod(lambda cls, m: False))
        in_ram, r_folder, r_rows, r_ranks = go("in-ram")
    assert in_ram.info["streamed_build"] is False
    assert s_folder == r_folder  # the digest, streamed, is the whole array's
    assert s_rows.shape[1] == 6
    np.testing.assert_array_equal(s_rows, r_rows)
    np.testing.assert_array_equal(s_ranks, r_ranks)
    assert streamed.result.setups["medium"].map == in_ram.result.setups["medium"].map


def test_the_streamed_build_never_holds_the_whole_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20,000 x 64 float32 (5 MiB finished): no chunk of more than 1,000 rows reaches
    ``write_shards``, and the traced peak of the build stays below a third of the finished array;
    the ranks are the canonical ones over the finished array (:func:`test_streamed.reference`)."""
    from oxbench.index import mapped
    from oxbench.index.whitening import l2_normalize
    from oxbench.pipelines.families.global_descriptors import GlobalConfig
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method
    from test_streamed import reference

    n, d = 20_000, 64
    rng = np.random.default_rng(0)
    raw = [(rng.integers(-8, 9, (n, d)) / 16).astype(np.float32)]
    m = resolve_method("features", search="mapped", **{"search.shard_vectors": 3000})
    assert isinstance(m, GlobalConfig) and SearchChain.streams(m)
    monkeypatch.setattr(globalchain, "STREAM_BYTES", 1000 * (2 * 8 * d + 4 * d))
    seen: list[int] = []
    real = mapped.write_shards

    def spy(chunks, folder, **kw):  # noqa: ANN001, ANN003, ANN202
        def watched():  # noqa: ANN202
            for c in chunks:
                seen.append(len(c))
                yield c

        return real(watched(), folder, **kw)

    monkeypatch.setattr(mapped, "write_shards", spy)
    ctx = RunContext(tmp_path / "cache", progress=False)
    chain = SearchChain(m, DatabaseChunks(raw, l2_normalize, d), ctx, tmp_path / "cache" / "i")
    tracemalloc.start()
    try:
        chain.build_index()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    full = n * d * 4
    assert sum(seen) == n and max(seen) <= 1000
    assert peak < full / 3, (peak, full)  # one shard pending (3,000 rows) and a chunk or two
    assert chain.db is None and chain.footprint()[0]["vectors"] == 0
    whole = l2_normalize(raw[0])
    assert chain.mapped is not None and chain.mapped.digest
    q = whole[:5] + 0.25
    np.testing.assert_array_equal(chain.rank(q)[1], reference(q, whole, chain.list_length())[1])


def test_a_stage_that_needs_the_database_keeps_it_in_ram() -> None:
    """Query expansion, DBA and diffusion read the whole database: no streamed build for them,
    and a chain refuses streamed vectors it cannot serve."""
    from oxbench.errors import InputError
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method

    for rerank in ("alpha-qe", "dba", "diffusion"):
        assert not SearchChain.streams(resolve_method("features", search="mapped", rerank=rerank))
    assert not SearchChain.streams(resolve_method("features"))  # exact search: in RAM
    m = resolve_method("features", search="mapped", rerank="alpha-qe")
    chunks = DatabaseChunks([np.ones((4, 3), np.float32)], lambda x: x, 3)
    with pytest.raises(InputError, match="streamed only with search=mapped"):
        SearchChain(m, chunks, RunContext(Path("unused"), progress=False), None)


def test_the_pre_flight_counts_no_searched_copy_when_streamed() -> None:
    """The RAM projection per image: the raw float32 VLAD (64 x 128) and, unless the build
    streams, its searched copy (4 bytes a dimension each)."""
    from oxbench.pipelines.presets import resolve_method

    streamed = resolve_method("rootsift-vlad", search="mapped")
    in_ram = resolve_method("rootsift-vlad", search="mapped", rerank="alpha-qe")
    assert streamed.ram_bytes_per_image() == 4 * 8192
    assert in_ram.ram_bytes_per_image() == resolve_method("rootsift-vlad").ram_bytes_per_image()
    assert in_ram.ram_bytes_per_image() == 2 * 4 * 8192


def test_a_build_over_the_ram_bound_is_refused_before_any_work(tmp_path: Path) -> None:
    """One pending shard (50,000 x 64 float32: 12.2 MiB) and one chunk (16 MiB) over
    ``search.ram_gb=0.025`` (25.6 MiB): one line naming the settings, no shard written; a shard of
    10,000 rows (2.4 MiB) fits."""
    from oxbench.errors import InputError
    from oxbench.index.whitening import l2_normalize
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method

    raw = [np.ones((50_000, 64), np.float32)]
    m = resolve_method("features", search="mapped", **{"search.ram_gb": 0.025})
    ctx = RunContext(tmp_path / "cache", progress=False)
    chain = SearchChain(m, DatabaseChunks(raw, l2_normalize, 64), ctx, tmp_path / "cache" / "i")
    with pytest.raises(InputError) as exc:
        chain.build_index()
    text = str(exc.value)
    assert "\n" not in text and "search.shard_vectors" in text and "search.ram_gb=0.025" in text
    assert not (tmp_path / "cache" / "i").exists()
    m = resolve_method(
        "features", search="mapped", **{"search.ram_gb": 0.025, "search.shard_vectors": 10_000}
    )
    chain = SearchChain(m, DatabaseChunks(raw, l2_normalize, 64), ctx, tmp_path / "cache" / "i")
    assert chain.build_index().mapped is not None and len(chain.mapped.shards) == 5
