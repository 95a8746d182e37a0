"""Caches cannot lie, one writer per cache entry, writes that fail, the umask.

Every cache artifact (feature shards and store metadata, vocabularies, visual words) is checked on
reuse: a corrupt one is logged as a warning naming the file and recomputed to the same numbers.
Two processes filling one cache wait for each other and end with what one process gives. A write
that fails is one line naming the path and the OS reason, exit 2, nothing looking complete.
"""

from __future__ import annotations

import errno
import io
import logging
import multiprocessing
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oxbench import fileio
from oxbench.cache import CorruptCache, save_npz
from oxbench.cli import main
from oxbench.execution import SerialExecutor
from oxbench.features.sift import SiftConfig
from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store
from oxbench.index.vocabulary import Vocabulary
from test_features import ArrayImages, textured_image

pytest.importorskip("cv2")


# ---------------------------------------------------------------------- helpers


def _flip(path: Path, offset: int) -> None:
    """Invert one byte in place: same size, wrong bytes."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _warnings(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


SRC = ArrayImages([textured_image(40 + i, 160, 120) for i in range(7)])
CFG = SiftConfig(n_features=100)


def _shard_file(folder: Path, number: int, name: str) -> Path:
    """A file of committed shard ``number`` (its folder is ``shard-<number>-<digest of its names>``)."""
    (found,) = folder.glob(f"shard-{number:06d}-*/{name}")
    return found


def _fill(folder: Path, **kwargs: Any) -> FeatureStore:
    store = FeatureStore.open(folder, CFG)
    extract_to_store(
        DescribeImages(SRC, CFG), len(SRC), store, shard_size=3, progress=False, **kwargs
    )
    return FeatureStore.open(folder, CFG)


def _assert_same(a: FeatureStore, b: FeatureStore) -> None:
    assert sorted(a.names) == sorted(b.names) == sorted(SRC.names)
    for name in SRC.names:
        x, y = a.get_raw(name), b.get_raw(name)
        assert x.image_size == y.image_size
        np.testing.assert_array_equal(x.keypoints, y.keypoints)
        np.testing.assert_array_equal(x.descriptors, y.descriptors)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> FeatureStore:
    return _fill(tmp_path_factory.mktemp("clean") / "store")


# ---------------------------------------------------------------------- feature store


def test_truncated_shard_is_described_again(
    tmp_path: Path, clean: FeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``mmap length is greater than file size`` (a traceback) on the first read."""
    _fill(tmp_path / "s")
    raw = _shard_file(tmp_path / "s", 1, "raw.npy")
    _truncate(raw)
    store = FeatureStore.open(tmp_path / "s", CFG)
    assert str(raw) in _warnings(caplog) and "truncated" in _warnings(caplog)
    assert len(store) == 4 and store.bad_shards == [1]  # the damaged shard is never read
    extract_to_store(DescribeImages(SRC, CFG), len(SRC), store, shard_size=3, progress=False)
    # the bad shard was replaced by a new commit of the same images
    assert raw.stat().st_size == _shard_file(clean.directory, 1, "raw.npy").stat().st_size
    assert FeatureStore.open(tmp_path / "s", CFG).bad_shards == []
    _assert_same(FeatureStore.open(tmp_path / "s", CFG), clean)


def test_flipped_bytes_of_the_right_size_are_never_used(
    tmp_path: Path, clean: FeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the wrong features were used silently (E 93.07 became 81.13)."""
    _fill(tmp_path / "s")
    raw = _shard_file(tmp_path / "s", 0, "raw.npy")
    size = raw.stat().st_size
    assert (
        4096 < size // 4 < size // 2 - 2048
    )  # the flip lies outside the sampled first/middle/last 4 KiB
    _flip(raw, size // 4)
    store = FeatureStore.open(tmp_path / "s", CFG)
    assert len(store) == 7  # the cheap open-time check cannot see it ...
    with pytest.raises(
        CorruptCache,
        match=r"shard-000000-[0-9a-f]{12}/raw\.npy: corrupt cache file: the features of image",
    ):
        for name in SRC.names[:3]:  # ... the per-image checksum on read does
            store.get_raw(name)
    # the full check (what the pipeline runs after such a find) drops the shard; it is redone
    store = _fill(tmp_path / "s", full_check=True)
    assert str(raw) in _warnings(caplog)
    _assert_same(store, clean)
    # a flip inside a sampled page is caught when the store is opened
    caplog.clear()
    kp = _shard_file(tmp_path / "s", 2, "kp.npy")
    _flip(kp, 200)
    assert FeatureStore.open(tmp_path / "s", CFG).bad_shards == [2]
    assert str(kp) in _warnings(caplog) and "sampled" in _warnings(caplog)
    _assert_same(_fill(tmp_path / "s"), clean)


def test_corrupt_index_and_metadata_are_rebuilt(
    tmp_path: Path, clean: FeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: ``BadZipFile`` / a JSON error as a traceback or "delete the folder"."""
    _fill(tmp_path / "s")
    index = _shard_file(tmp_path / "s", 1, "index.npz")
    index.write_bytes(b"PK\x03\x04" + b"\0" * 40)
    assert FeatureStore.open(tmp_path / "s", CFG).bad_shards == [1]
    assert f"{index}: corrupt cache file: unreadable feature-shard index" in _warnings(caplog)
    _assert_same(_fill(tmp_path / "s"), clean)
    # metadata: damaged, or from an oxbench that recorded no digest
    for text in ('{"format": 1', '{"format": 1, "config": {}}'):
        caplog.clear()
        (tmp_path / "s" / "meta.json").write_text(text)
        with pytest.raises(CorruptCache, match="meta.json"):
            FeatureStore.open(tmp_path / "s", CFG, create=False)
        store = FeatureStore.open(tmp_path / "s", CFG)
        assert len(store) == 0 and "meta.json" in _warnings(caplog)
        _assert_same(_fill(tmp_path / "s"), clean)


def test_stale_temps_and_orphan_shard_files_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    _fill(folder)
    old = folder / f"{fileio.TEMP_PREFIX}shard-000003.kp.npy.k1ll3d"
    fresh = folder / f"{fileio.TEMP_PREFIX}shard-000003.raw.npy.wr1t1ng"
    for p in (old, fresh):
        p.write_bytes(b"half")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    orphan = folder / "shard-000007.kp.npy"  # a killed writer got no further than this
    orphan.write_bytes(b"x")
    store = FeatureStore.open(folder, CFG)
    assert not old.exists() and fresh.exists()  # a write in progress elsewhere is left alone
    extract_to_store(DescribeImages(SRC, CFG), len(SRC), store, progress=False)
    assert not orphan.exists()


# ---------------------------------------------------------------------- npz artifacts


def test_vocabulary_digest_is_checked(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.random((2000, 8), dtype=np.float32)
    path = Vocabulary(20, structure="flat").fit(x).save(tmp_path / "v.npz")
    good = path.read_bytes()
    _flip(path, len(good) // 2)  # inside the centroids: the zip itself may not notice
    with pytest.raises(
        CorruptCache, match=rf"{path}: corrupt cache file: (vocabulary does not match|unreadable)"
    ):
        Vocabulary.load(path)
    _truncate(path)
    with pytest.raises(CorruptCache, match="unreadable vocabulary"):
        Vocabulary.load(path)
    with np.load(io.BytesIO(good)) as z:
        np.savez(
            path, **{k: z[k] for k in z.files if k != "content_sha256"}
        )  # an older oxbench's file
    with pytest.raises(CorruptCache, match="without a content digest"):
        Vocabulary.load(path)
    path.write_bytes(good)
    assert Vocabulary.load(path).n_words == 20
    with pytest.raises(ValueError, match="reserved"):
        save_npz(tmp_path / "x.npz", {"content_sha256": np.zeros(1)})


# ---------------------------------------------------------------------- the pipeline


def _run(method: Any, bench: Any, train: Any, cache: Path) -> Any:
    """The runner's fit / index / search (with its one retry after a corrupt cache file)."""
    from oxbench.pipelines.runner import fit_index_search
    from oxbench.pipelines.session import Session

    session = Session(root=cache.parent, cache=cache, engine="serial", progress=False)
    return fit_index_search(method, train, bench, session, SerialExecutor())[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("faiss")
    from oxbench.datasets import load
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import TINY, make_tiny_root

    root = make_tiny_root(tmp_path_factory.mktemp("data"))
    bench, train = (
        load("synthetic", root, progress=False),
        load("synthetic-train", root, progress=False),
    )
    method = resolve_method("rootsift-bow-sv", **{"vocabulary.size": 100}, **TINY)
    clean = _run(method, bench, train, tmp_path_factory.mktemp("cache"))
    return {"root": root, "bench": bench, "train": train, "method": method, "clean": clean}


@pytest.mark.slow
def test_corrupt_caches_are_recomputed_to_the_same_numbers(
    tiny: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from oxbench.evaluation import evaluate
    from oxbench.pipelines import steps

    bench, train, method = tiny["bench"], tiny["train"], tiny["method"]
    cache = tmp_path / "cache"
    _run(method, bench, train, cache)
    vocab = steps.vocabulary_path(cache, method.vocabulary_spec(), train)
    words = cache / steps.dataset_key(bench) / "words" / f"{vocab.stem}-k1"
    db_raw = _shard_file(
        steps.features_dir(cache, bench, method.features, "database"), 0, "raw.npy"
    )
    q_raw = _shard_file(steps.features_dir(cache, bench, method.features, "queries"), 0, "raw.npy")
    _truncate(db_raw)  # caught when the store is opened
    _flip(vocab, vocab.stat().st_size // 2)  # caught by the vocabulary's digest
    _truncate(words / "database.npz")  # caught by the words file's digest
    _flip(q_raw, q_raw.stat().st_size // 4)  # caught only when read: the steps run again
    (words / "queries.npz").unlink()  # so that the damaged query features are read
    caplog.set_level(logging.WARNING)
    again = _run(method, bench, train, cache)
    said = _warnings(caplog)
    for path in (db_raw, vocab, words / "database.npz", q_raw):
        assert str(path) in said, path
    assert "running the steps again" in said
    np.testing.assert_array_equal(again.ranks, tiny["clean"].ranks)
    a, b = evaluate(bench.gt, again.ranks), evaluate(bench.gt, tiny["clean"].ranks)
    assert [a.setups[s].map for s in ("easy", "medium", "hard")] == [
        b.setups[s].map for s in ("easy", "medium", "hard")
    ]


def test_a_second_writer_waits_then_reuses(
    tmp_path: Path, clean: FeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The lock is held by "another process" (another open file description); the step waits,
    says so, and afterwards finds the work done instead of doing it again."""
    caplog.set_level(logging.INFO)
    folder = tmp_path / "s"
    first = FeatureStore.open(folder, CFG)
    second = FeatureStore.open(folder, CFG)
    errors: list[BaseException] = []

    def fill_second() -> None:
        try:
            extract_to_store(
                DescribeImages(SRC, CFG), len(SRC), second, shard_size=3, progress=False
            )
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    with fileio.file_lock(first.lock_path):
        worker = threading.Thread(target=fill_second)
        worker.start()
        deadline = time.monotonic() + 30
        while (
            "waiting for another oxbench process" not in caplog.text and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert (
            "waiting for another oxbench process that is writing the feature store" in caplog.text
        )
        assert len(FeatureStore.open(folder, CFG)) == 0  # it wrote nothing meanwhile
        for start in range(0, len(SRC), 3):  # the "other process" does the work
            first.write_shard(
                [DescribeImages(SRC, CFG)(i) for i in range(start, min(start + 3, len(SRC)))]
            )
    worker.join(60)
    assert not errors and not worker.is_alive()
    assert "describing" not in caplog.text  # it reused the other's shards
    assert len(list(folder.glob("shard-*/index.npz"))) == 3
    _assert_same(FeatureStore.open(folder, CFG), clean)


def _fill_cache_in_a_process(root: str, cache: str, log_file: str, barrier: Any) -> None:
    """One of two processes training the same vocabulary (and extracting its features) at once."""
    logging.basicConfig(filename=log_file, level=logging.INFO, format="%(message)s")
    from oxbench.datasets import load
    from oxbench.pipelines import steps
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import TINY

    train = load("synthetic-train", root, progress=False)
    method = resolve_method("rootsift-bow-sv", **{"vocabulary.size": 100}, **TINY)
    barrier.wait()
    steps.step_vocabulary(method.vocabulary_spec(), train, RunContext(Path(cache), progress=False))


@pytest.mark.slow
def test_two_processes_filling_one_cache(tiny: dict[str, Any], tmp_path: Path) -> None:
    from oxbench.pipelines import RunContext, steps

    train, method = tiny["train"], tiny["method"]
    single = tmp_path / "single"
    steps.step_vocabulary(method.vocabulary_spec(), train, RunContext(single, progress=False))
    shared = tmp_path / "shared"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [
        ctx.Process(
            target=_fill_cache_in_a_process,
            args=(str(tiny["root"]), str(shared), str(log), barrier),
        )
        for log in logs
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    said = [log.read_text() for log in logs]
    # one process did each piece of work, the other waited and reused it: no mixed folder
    assert sum(s.count("describing") for s in said) == 1
    assert sum(s.count("training") for s in said) == 1
    rel = sorted(
        p.relative_to(single) for p in single.rglob("*") if p.is_file() and p.suffix != ".lock"
    )
    assert (
        sorted(
            p.relative_to(shared) for p in shared.rglob("*") if p.is_file() and p.suffix != ".lock"
        )
        == rel
    )
    a = Vocabulary.load(steps.vocabulary_path(single, method.vocabulary_spec(), train))
    b = Vocabulary.load(steps.vocabulary_path(shared, method.vocabulary_spec(), train))
    np.testing.assert_array_equal(a.centroids_, b.centroids_)
    sa = steps.open_store(single, train, method.features, "database")
    sb = steps.open_store(shared, train, method.features, "database")
    for name in sa.names:
        np.testing.assert_array_equal(sa.get_raw(name).descriptors, sb.get_raw(name).descriptors)


# ---------------------------------------------------------------------- writes that fail


class _FullDisk:
    """Stands in for ``os`` inside fileio: every write to a new file fails with ENOSPC."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        real = os.fdopen(fd, *args, **kwargs)

        class Full:
            def write(self, data: bytes) -> int:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def __enter__(self) -> Full:
                return self

            def __exit__(self, *exc: object) -> None:
                real.close()

        return Full()


class _ReadOnly:
    """Stands in for ``tempfile`` inside fileio: creating a file fails with EROFS."""

    def __getattr__(self, name: str) -> Any:
        import tempfile

        return getattr(tempfile, name)

    @staticmethod
    def mkstemp(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    _, err = capsys.readouterr()
    return int(exc.value.code or 0), err


def _one_line(err: str, *needles: str) -> None:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)


SYNTH = [
    "--landmarks",
    "2",
    "--queries-per-landmark",
    "1",
    "--db-size",
    "4",
    "--image-size",
    "96x72",
    "-j",
    "1",
    "--no-progress",
]


def _nothing_complete(folder: Path) -> None:
    assert not list(folder.rglob("manifest.json")) and not list(folder.rglob("*index.npz"))
    assert not [p for p in folder.rglob(f"{fileio.TEMP_PREFIX}*") if p.is_file()]


def test_synth_out_that_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: a traceback (FileExistsError / OSError) for each case."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = _cli(capsys, "data", "synth", "--out", str(blocker / "set"), *SYNTH)
    assert code == 2
    _one_line(err, str(blocker / "set"), "is a file")
    out = tmp_path / "set"
    with monkeypatch.context() as m:
        m.setattr(fileio, "os", _FullDisk())
        code, err = _cli(capsys, "data", "synth", "--out", str(out), *SYNTH)
    assert code == 2
    _one_line(err, str(out / ".partial" / "config.json"), "No space left on device")
    _nothing_complete(out)
    with monkeypatch.context() as m:
        m.setattr(fileio, "tempfile", _ReadOnly())
        code, err = _cli(capsys, "data", "synth", "--out", str(out), *SYNTH)
    assert code == 2
    _one_line(err, str(out), "Read-only file system")
    _nothing_complete(out)


@pytest.mark.slow
def test_run_cache_that_cannot_be_written(
    tiny: dict[str, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    args = [
        "run",
        "--dataset",
        "synthetic",
        "--method",
        "rootsift-bow",
        "--root",
        str(tiny["root"]),
        "--out",
        str(tmp_path / "run"),
        "--vocab-size",
        "50",
        "--max-side",
        "320",
        "--workers",
        "1",
        "--no-progress",
    ]
    code, err = _cli(capsys, *args, "--cache", str(blocker / "cache"))
    assert code == 2
    _one_line(err, str(blocker / "cache"), "is a file")
    cache = tmp_path / "cache"
    with monkeypatch.context() as m:
        m.setattr(fileio, "os", _FullDisk())
        code, err = _cli(capsys, *args, "--cache", str(cache))
    assert code == 2
    _one_line(err, str(cache), "No space left on device")
    _nothing_complete(cache)
    assert not (tmp_path / "run").exists()


def test_verify_report_that_cannot_be_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("PIL.Image")
    from test_datasets import make_paris_archives

    have = tmp_path / "have"
    have.mkdir()
    make_paris_archives(have)
    root = tmp_path / "root"
    code, err = _cli(capsys, "data", "import", "paris6k", "--from", str(have), "--root", str(root))
    assert code == 0, err
    verify = ["data", "verify", "paris6k", "--root", str(root), "--no-progress", "--no-decode"]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, err = _cli(capsys, *verify, "--report", str(blocker / "r.json"))
    assert code == 2
    _one_line(err, str(blocker / "r.json"), "a parent of this path is a file")
    with monkeypatch.context() as m:
        m.setattr(fileio, "os", _FullDisk())
        code, err = _cli(capsys, *verify, "--report", str(tmp_path / "r.json"))
    assert code == 2
    _one_line(err, str(tmp_path / "r.json"), "No space left on device")
    assert not list(tmp_path.glob("*r.json*"))
    # the default report in a read-only data root goes to the working directory instead
    monkeypatch.chdir(tmp_path)
    real = fileio.atomic_open

    def read_only_root(path: Any, **kw: Any) -> Any:
        if Path(path).parent == root / "paris6k":
            raise fileio.InputError("cannot write: Read-only file system", path)
        return real(path, **kw)

    monkeypatch.setattr(fileio, "atomic_open", read_only_root)
    code, err = _cli(capsys, *verify)
    assert (
        code == 1 and "paris6k.verify.json" in err and (tmp_path / "paris6k.verify.json").is_file()
    )


# ---------------------------------------------------------------------- umask


def test_data_and_cache_files_follow_the_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: 0600 for the images, ground truth and manifests written through ``mkstemp``."""
    from oxbench.datasets.synthetic.config import SynthConfig
    from oxbench.datasets.synthetic.generate import generate

    monkeypatch.setattr(fileio, "_UMASK", None)
    old = os.umask(0o027)
    try:
        generate(
            tmp_path / "set",
            SynthConfig(landmarks=2, queries_per_landmark=1, db_size=4, image_size=(96, 72)),
            workers=1,
            progress=False,
        )
        _fill(tmp_path / "store")
        Vocabulary(5, structure="flat").fit(
            np.random.default_rng(0).random((50, 4), dtype=np.float32)
        ).save(tmp_path / "v.npz")
    finally:
        os.umask(old)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert len(files) > 20
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
    assert set(modes.values()) == {0o640}, {n: oct(m) for n, m in modes.items() if m != 0o640}
