"""Cache failure paths recompute with one warning naming the file; exports are all or nothing; the
smaller boundary cases of issue 21 item 8 (text ranks, a NUL in a name)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from pathlib import Path

import numpy as np
import pytest

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.execution.shards import NPZ_NAME, committed_folders
from oxbench.features.descstore import DescriptorStore, fill_store
from oxbench.formats.arrays import read_ranks
from oxbench.report.export import export_run
from oxbench.report.runs import RunRecord
from run_layout import random_ranks, tiny_gt, write_run


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["central-directory", "header", "middle"])
def test_a_flipped_byte_in_a_descriptor_shard_is_recomputed_with_one_warning(
    tmp_path, caplog, where
):
    names = [f"im{i}" for i in range(6)]
    calls = []

    def compute(positions):
        calls.append(list(positions))
        return positions, np.eye(6, 8, dtype=np.float32)[positions]

    store = DescriptorStore.open(tmp_path / "s", {"kind": "test"})
    fill_store(store, names, compute, shard_size=3, progress=False)
    (folder,) = committed_folders(tmp_path / "s")[0]
    shard = folder / NPZ_NAME
    size = shard.stat().st_size
    _flip(shard, {"central-directory": size - 30, "header": 2, "middle": size // 2}[where])
    with caplog.at_level(logging.WARNING):
        again = DescriptorStore.open(tmp_path / "s", {"kind": "test"})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(folder) in warnings[0] and "described again" in warnings[0], (
        warnings
    )
    assert not folder.exists() and again.missing(names) == names[:3]
    calls.clear()
    fill_store(again, names, compute, progress=False)
    assert calls == [[0, 1, 2]]
    np.testing.assert_array_equal(again.get(names), np.eye(6, 8, dtype=np.float32))


def test_nan_in_a_cached_whitening_names_the_file(tmp_path):
    from oxbench.index.whitening import PCAWhitening, load_whitening

    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    path = PCAWhitening(4).fit(x).save(tmp_path / "w.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["components"][0, 0] = np.nan
    np.savez(path, **arrays)
    with pytest.raises(InputError) as exc:
        load_whitening(path)
    assert str(path) in str(exc.value) and "NaN" in str(exc.value)


def _faiss_file(path: Path, vectors: np.ndarray) -> Path:
    """An index file in FaissIndex.save's layout, with a valid checksum, holding ``vectors``."""
    faiss = pytest.importorskip("faiss")
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    blob = np.asarray(faiss.serialize_index(index), np.uint8)
    np.savez(
        path,
        faiss=blob,
        sha256=np.array(hashlib.sha256(blob.tobytes()).hexdigest()),
        dim=np.array(vectors.shape[1]),
        ntotal=np.array(len(vectors)),
        setting_kind=np.array("faiss-flat"),
    )
    return path


def test_nan_in_a_cached_faiss_index_names_the_file(tmp_path):
    from oxbench.index.search import FaissIndex

    x = np.random.default_rng(0).standard_normal((20, 8)).astype(np.float32)
    assert FaissIndex.load(_faiss_file(tmp_path / "ok.npz", x)).ntotal_ == 20
    x[3, 2] = np.nan
    path = _faiss_file(tmp_path / "nan.npz", x)
    with pytest.raises(InputError) as exc:
        FaissIndex.load(path)
    assert str(path) in str(exc.value) and "NaN" in str(exc.value)


def test_a_damaged_cached_faiss_index_is_rebuilt_with_one_warning(tmp_path, caplog):
    pytest.importorskip("faiss")
    from oxbench.pipelines.globalchain import SearchChain
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import METHODS

    m = dataclasses.replace(METHODS.get("rootsift-vlad"), search="faiss-flat")
    db = np.random.default_rng(0).standard_normal((40, 16)).astype(np.float32)
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    ctx = RunContext(tmp_path / "c")
    first = SearchChain(m, db, ctx, tmp_path / "idx").build_index()
    (path,) = (tmp_path / "idx").glob("index-faiss-flat-*.npz")
    _flip(path, path.stat().st_size // 2)
    ctx2 = RunContext(tmp_path / "c")
    with caplog.at_level(logging.WARNING):
        second = SearchChain(m, db, ctx2, tmp_path / "idx").build_index()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        len(warnings) == 1
        and str(path) in warnings[0]
        and "building the index again" in warnings[0]
    )
    assert ctx2.steps["search_index"] == "computed"
    q = db[:3]
    np.testing.assert_array_equal(first.rank(q)[1], second.rank(q)[1])
    ctx3 = RunContext(tmp_path / "c")
    SearchChain(m, db, ctx3, tmp_path / "idx").build_index()  # the rebuilt file is intact
    assert ctx3.steps["search_index"] == "hit"


# -- exports are all or nothing -----------------------------------------------------------------


def test_oxford_export_is_all_or_nothing(tmp_path, monkeypatch):
    gt = tiny_gt(0, n_queries=6)
    rec = RunRecord.load(write_run(tmp_path / "runs", gt, random_ranks(gt, 1)))
    # a target that cannot be written (a folder where the 6th list goes): refused before any file
    out = tmp_path / "lists"
    (out / "q05.txt").mkdir(parents=True)
    with pytest.raises(InputError, match="q05.txt: refusing to write: this path is a folder"):
        export_run(rec, "oxford", out)
    assert [p.name for p in out.iterdir()] == ["q05.txt"]
    # a failure while writing the 6th file (a full disk): nothing of the export appears
    from oxbench.report import export as export_mod

    real = export_mod.atomic_write_text
    written = []

    def full_disk_at_the_sixth(path, text):
        written.append(path)
        if len(written) == 6:
            raise InputError("cannot write: No space left on device", path)
        return real(path, text)

    monkeypatch.setattr(export_mod, "atomic_write_text", full_disk_at_the_sixth)
    fresh = tmp_path / "fresh"
    with pytest.raises(InputError, match="No space left"):
        export_run(rec, "oxford", fresh)
    assert not fresh.exists() and not [
        p for p in tmp_path.iterdir() if p.name.startswith(".oxbench-tmp-")
    ]
    monkeypatch.setattr(export_mod, "atomic_write_text", real)
    files = export_run(rec, "oxford", fresh)
    assert (
        sorted(p.name for p in fresh.iterdir())
        == sorted(f"q{i:02d}.txt" for i in range(6))
        == sorted(p.name for p in files)
    )
    # into an existing folder: every file replaced, other files left alone
    (fresh / "notes.md").write_text("mine")
    export_run(rec, "oxford", fresh, top=3)
    assert (fresh / "notes.md").read_text() == "mine" and len(
        (fresh / "q00.txt").read_text().splitlines()
    ) == 3


# -- smaller boundary cases --------------------------------------------------------------------


@pytest.mark.parametrize("token", ["1_0", "+5", "0x10", "1e3", "٣"])
def test_text_ranks_take_plain_decimal_indices_only(tmp_path, token):
    path = tmp_path / "ranks.txt"
    path.write_text(f"0 1 {token}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"is not (an integer index|ASCII)"):
        read_ranks(path)
    path.write_text("0 1 10\n")
    assert read_ranks(path).tolist() == [[0, 1, 10]]


def test_a_nul_in_a_query_name_is_one_line(tmp_path, capsys):
    from oxbench.formats.revisitop import write_gnd
    from oxbench.groundtruth import GroundTruth

    gt = tiny_gt(0)
    queries = list(gt.queries)
    queries[2] = dataclasses.replace(queries[2], name="q\x00evil")
    write_gnd(
        GroundTruth(gt.dataset, gt.protocol, gt.db_names, tuple(queries)),
        tmp_path / "gnd_roxford5k.pkl",
    )
    np.save(tmp_path / "ranks.npy", np.tile(np.arange(gt.n_db), (gt.n_queries, 1)).T)
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "evaluate",
                "revisited",
                "--gnd",
                str(tmp_path / "gnd_roxford5k.pkl"),
                "--ranks",
                str(tmp_path / "ranks.npy"),
            ]
        )
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "query 2 has a name with a NUL character" in err


def test_a_verified_short_list_round_trips_and_a_well_formed_lie_is_refused(tmp_path, caplog):
    """The verification cache stores positions relative to the short list, and checks each entry
    against the list it is read for (digest-valid entries that do not fit are verified again)."""
    from oxbench.cache import load_npz, save_npz
    from oxbench.pipelines.steps.verify import VerificationCache, VerifiedList

    order = np.array([7, 3, 9, 1], np.int64)
    found = VerifiedList(
        head=np.array([9, 7, 3, 1], np.int64),
        verified=np.array([9, 7], np.int64),
        inliers=np.array([12, 5], np.int64),
        matches={9: np.arange(48, dtype=np.float32).reshape(12, 4)},
    )
    cache = VerificationCache(tmp_path / "verification" / "k")
    path = cache.path("q0", [("database", f"im{i}") for i in order.tolist()])
    assert path != cache.path(
        "q0", [("database", f"im{i}") for i in order[::-1].tolist()]
    )  # order matters
    cache.save(path, order, found)
    back = cache.load(path, order)
    assert back is not None
    for field in ("head", "verified", "inliers"):
        assert np.array_equal(getattr(back, field), getattr(found, field))
    assert back.matches.keys() == {9} and np.array_equal(back.matches[9], found.matches[9])
    # the same positions read for another short list name that list's images
    other = cache.load(path, np.array([70, 30, 90, 10], np.int64))
    assert other is not None and other.verified.tolist() == [90, 70]

    arrays = {k: v for k, v in load_npz(path, what="x").items() if k != "content_sha256"}
    lies = {
        "head-not-a-permutation": {"head": np.array([2, 2, 0, 1], np.int64)},
        "verified-not-the-head": {"verified": np.array([1, 0], np.int64)},
        "position-out-of-range": {"head": np.array([2, 0, 1, 4], np.int64)},
        "zero-inliers": {"inliers": np.array([12, 0], np.int64)},
        "matches-of-an-unverified-image": {"match_of": np.array([3], np.int64)},
        "nan-coordinates": {"match_xy": np.full((12, 4), np.nan, np.float32)},
        "counts-disagree": {"match_counts": np.array([11], np.int64)},
        "wrong-dtype": {"inliers": np.array([12.0, 5.0])},
    }
    for name, change in lies.items():
        save_npz(path, {**arrays, **change})
        cache = VerificationCache(cache.folder)  # one warning per cache (per run), not per entry
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert cache.load(path, order) is None, name
        assert (
            len(caplog.records) == 1
            and "verifying that short list again" in caplog.records[0].getMessage()
        )
        assert not path.exists()
