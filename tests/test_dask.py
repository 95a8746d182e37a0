"""The Dask backend and the write-once shard protocol, on real clusters listening on 127.0.0.1 only.

(a) ``--engine dask`` gives the features, ranks and metrics of the local pool and the serial path;
(b) a worker killed with SIGKILL mid-extraction: the run completes, every image is in exactly one
committed shard, no temporary folder is left, the features are identical, the retry is recorded;
(c) the driver killed and rerun: only the missing shards are described;
(d) two attempts of one shard at once: one commit;
(e) after a run no process of the cluster is left;
plus an existing cluster (``dask scheduler`` + 2 ``dask worker`` processes, address mode), the
partition mode, the bad inputs (one line each) and the SLURM recipe's job script without SLURM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip(
    "distributed", reason='the Dask tests need the extra: pip install "oxbench[dask]"'
)
pytest.importorskip("cv2")
psutil = pytest.importorskip("psutil")

import oxbench  # noqa: E402
from dask_jobs import CFG, DieOnRead, NeedsGpu, NoiseImages  # noqa: E402
from oxbench.cli import main  # noqa: E402
from oxbench.errors import InputError  # noqa: E402
from oxbench.execution import SerialExecutor, make_executor  # noqa: E402
from oxbench.execution.dask import DaskExecutor, check_cluster_address  # noqa: E402
from oxbench.execution.shards import plan_digest, plan_shards  # noqa: E402
from oxbench.features.local import RawFeatures  # noqa: E402
from oxbench.features.store import (  # noqa: E402
    DescribeImages,
    DescribeShard,
    FeatureStore,
    extract_to_store,
)
from oxbench.fileio import TEMP_PREFIX  # noqa: E402
from oxbench.pipelines import RecordOptions, Session  # noqa: E402

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent


def _env() -> dict[str, str]:
    """This interpreter's oxbench and the test helpers, for processes started here."""
    path = os.pathsep.join([str(REPO / "src"), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _assert_gone(pids: list[int], timeout: float = 20.0) -> None:
    """Every pid has exited (a zombie awaiting its parent's wait counts as exited)."""
    deadline = time.monotonic() + timeout
    alive = pids
    while time.monotonic() < deadline:
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"cluster processes still running: {alive}")


def _features(store: FeatureStore, names: list[str]) -> list[RawFeatures]:
    return [store.get_raw(n) for n in names]


def _assert_same_features(a: FeatureStore, b: FeatureStore, names: list[str]) -> None:
    assert len(a) == len(b) == len(names)
    for x, y in zip(_features(a, names), _features(b, names), strict=True):
        assert x.name == y.name and x.image_size == y.image_size
        np.testing.assert_array_equal(x.keypoints, y.keypoints)
        np.testing.assert_array_equal(x.descriptors, y.descriptors)


def _assert_clean_store(folder: Path, n_images: int, n_shards: int) -> None:
    """Every image in exactly one committed shard, and nothing temporary left."""
    assert not [p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]
    shards = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("shard-"))
    assert len(shards) == n_shards
    names = [n for s in shards for n in np.load(s / "index.npz")["names"].tolist()]
    assert len(names) == len(set(names)) == n_images


@pytest.fixture(scope="module")
def serial_store(tmp_path_factory: pytest.TempPathFactory) -> FeatureStore:
    """12 noise images described in this process: what every backend must reproduce."""
    store = FeatureStore.open(tmp_path_factory.mktemp("serial") / "s", CFG)
    extract_to_store(DescribeImages(NoiseImages(12), CFG), 12, store, shard_size=2, progress=False)
    return store


@pytest.fixture(scope="module")
def cluster() -> Iterator[DaskExecutor]:
    """One LocalCluster of 2 worker processes shared by the tests that do not kill anything."""
    with DaskExecutor(2, cores=2) as executor:
        pids = list(executor.worker_pids.values())
        yield executor
    _assert_gone(pids)  # (e)


# ---------------------------------------------------------------------- (a) equivalence


def test_dask_equals_the_process_pool_and_the_serial_path(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    from oxbench.pipelines import steps
    from test_pipeline import TINY, make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    outcomes = {}
    for engine in ("serial", "processes", "dask"):
        outcomes[engine] = oxbench.run(
            "synthetic",
            "rootsift-bow-sv",
            overrides={"vocabulary.size": 100, **TINY},
            session=Session(
                root=root,
                cache=tmp_path / f"cache-{engine}",
                engine=engine,
                workers=2,
                shard_size=8,
                progress=False,
            ),
            record=RecordOptions(runs_dir=tmp_path / f"runs-{engine}"),
        )
    serial = outcomes["serial"]
    ranks = np.load(serial.run_dir / "ranks.npy")
    bench = oxbench.load("synthetic", root)
    method = oxbench.pipelines.resolve_method("rootsift-bow-sv", **{"vocabulary.size": 100}, **TINY)
    for engine in ("processes", "dask"):
        other = outcomes[engine]
        assert np.array_equal(np.load(other.run_dir / "ranks.npy"), ranks)
        assert other.result.to_dict() == serial.result.to_dict()
        for part in ("database", "queries"):
            names = steps.part_names(bench, part)
            _assert_same_features(
                steps.open_store(tmp_path / "cache-serial", bench, method.features, part),
                steps.open_store(tmp_path / f"cache-{engine}", bench, method.features, part),
                names,
            )
    record = oxbench.records.RunRecord.load(outcomes["dask"].run_dir).record
    execution = record["execution"]
    assert (
        execution["backend"] == "dask"
        and execution["cluster"] == "local"
        and execution["workers"] == 2
    )
    assert execution["scheduler"].startswith("tcp://127.0.0.1:") and execution["retried"] == 0
    # every distributed stage ran on the cluster: features, words, verification
    assert {s["stage"] for s in execution["stages"]} >= {
        "synthetic database",
        "synthetic queries",
        "assign",
        "spatial",
    }
    timings = json.loads((outcomes["dask"].run_dir / "timings.json").read_text())
    assert timings["features"] > 0 and timings["total"] >= timings["features"]


# ---------------------------------------------------------------------- (b) a worker killed


def test_a_worker_killed_mid_extraction_is_retried(
    tmp_path: Path, serial_store: FeatureStore
) -> None:
    import threading

    n, size = 12, 2
    store = FeatureStore.open(tmp_path / "s", CFG)
    job = DescribeImages(NoiseImages(n, delay=0.25), CFG)
    killed: list[int] = []
    with DaskExecutor(2, cores=2, retries=2) as executor:
        pids = executor.worker_pids
        first_pids = list(pids.values())

        def kill_one_after_the_first_commit() -> None:
            deadline = time.monotonic() + 60
            while not list(store.directory.glob("shard-*")) and time.monotonic() < deadline:
                time.sleep(0.02)
            pid = first_pids[0]
            worker = psutil.Process(pid)
            assert worker.ppid() == os.getpid()  # a worker of this test's cluster, nothing else
            assert "spawn_main" in " ".join(worker.cmdline())
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

        killer = threading.Thread(target=kill_one_after_the_first_commit)
        killer.start()
        described = extract_to_store(
            job, n, store, executor=executor, shard_size=size, progress=False
        )
        killer.join(30)
        facts = executor.describe()
        all_pids = first_pids + list(executor.worker_pids.values())
    assert killed == first_pids[:1] and pids  # the kill happened, while shards were still to do
    assert described == n
    assert (
        facts["retried"] >= 1 and facts["stages"][-1]["retried"] >= 1
    )  # what the run record shows
    _assert_clean_store(store.directory, n, n // size)
    _assert_same_features(
        FeatureStore.open(tmp_path / "s", CFG),
        serial_store,
        [NoiseImages(n).name(i) for i in range(n)],
    )
    _assert_gone(all_pids)  # (e) the restarted worker too


def test_a_task_whose_worker_dies_every_time_stops_the_run_naming_its_shard(tmp_path: Path) -> None:
    store = FeatureStore.open(tmp_path / "s", CFG)
    job = DescribeImages(DieOnRead(6, fatal=3), CFG)
    with DaskExecutor(2, cores=2, retries=1) as executor:
        pids = list(executor.worker_pids.values())
        t0 = time.monotonic()
        with pytest.raises(
            InputError,
            match=r"shard 1 \(shard-000001-[0-9a-f]{12}, 3 images from #3\) failed on "
            r"every attempt: a worker died under each of its 2 attempts",
        ) as err:
            extract_to_store(job, 6, store, executor=executor, shard_size=3, progress=False)
        assert "\n" not in str(err.value) and time.monotonic() - t0 < 90
    _assert_gone(pids)
    reopened = FeatureStore.open(tmp_path / "s", CFG)
    assert len(reopened) == 3  # shard 0 committed once; shard 1 never
    assert len(list(store.directory.glob("shard-*"))) == 1


# ---------------------------------------------------------------------- (c) the driver killed


def test_a_killed_driver_reruns_only_the_missing_shards(
    tmp_path: Path, serial_store: FeatureStore
) -> None:
    n, size = 12, 2
    folder = tmp_path / "s"
    driver = subprocess.Popen(
        [sys.executable, str(TESTS / "dask_jobs.py"), str(folder), str(n), str(size), "0.4"],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert driver.stdout is not None
        worker_pids = [int(p) for p in driver.stdout.readline().split()]
        assert int(driver.stdout.readline()) == driver.pid and len(worker_pids) == 2
        assert all(psutil.Process(p).ppid() == driver.pid for p in worker_pids)
        deadline = time.monotonic() + 60
        while len(list(folder.glob("shard-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        driver.kill()  # SIGKILL: no clean-up runs in the driver
        driver.wait(10)
    finally:
        if driver.poll() is None:
            driver.kill()
    _assert_gone(worker_pids)  # (e) the workers die with their driver
    committed = {p.name: p.stat().st_ino for p in folder.glob("shard-*")}
    assert 2 <= len(committed) < n // size
    store = FeatureStore.open(folder, CFG)
    done = len(store)
    described = extract_to_store(
        DescribeImages(NoiseImages(n), CFG),
        n,
        store,
        executor=SerialExecutor(),
        shard_size=size,
        progress=False,
    )
    assert described == n - done  # only the missing shards
    assert {
        p.name: p.stat().st_ino for p in folder.glob("shard-*") if p.name in committed
    } == committed
    _assert_clean_store(folder, n, n // size)
    _assert_same_features(
        FeatureStore.open(folder, CFG), serial_store, [NoiseImages(n).name(i) for i in range(n)]
    )


# ---------------------------------------------------------------------- (d) two attempts at once


def test_two_attempts_of_one_shard_at_once_commit_once(
    tmp_path: Path, cluster: DaskExecutor, serial_store: FeatureStore
) -> None:
    n = 4
    store = FeatureStore.open(tmp_path / "s", CFG)
    names = [NoiseImages(n).name(i) for i in range(n)]
    (task,) = plan_shards(names, n)
    job = DescribeShard(
        DescribeImages(NoiseImages(n, delay=0.1), CFG),
        store.directory,
        CFG,
        plan=plan_digest(names, n),
        tag="race",
    )
    receipts = list(cluster.map(job, [task, task]))  # one on each worker, at the same time
    assert sorted(r.committed for r in receipts) == [False, True]
    assert (
        receipts[0].digest == receipts[1].digest
        and receipts[0].folder == receipts[1].folder == task.folder
    )
    _assert_clean_store(store.directory, n, 1)
    store.refresh()
    for name in names:
        np.testing.assert_array_equal(
            store.get_raw(name).descriptors, serial_store.get_raw(name).descriptors
        )
    # each worker ran with its share of the cores: 2 workers x 1 thread on 2 cores
    from oxbench.execution import thread_cap

    assert cluster.threads_per_worker == 1 and set(cluster.client.run(thread_cap).values()) == {1}


def test_a_shard_tampered_with_after_its_commit_is_described_again(
    tmp_path: Path,
    cluster: DaskExecutor,
    serial_store: FeatureStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    n, size = 6, 2
    names = [NoiseImages(n).name(i) for i in range(n)]
    job = DescribeImages(NoiseImages(n), CFG)
    folder = tmp_path / "s"
    extract_to_store(
        job, n, FeatureStore.open(folder, CFG), shard_size=size, executor=cluster, progress=False
    )
    (raw,) = folder.glob("shard-000001-*/raw.npy")
    data = bytearray(raw.read_bytes())
    data[200] ^= 0xFF  # inside the sampled first page: seen when the store is opened
    raw.write_bytes(bytes(data))
    caplog.set_level(logging.WARNING)
    store = FeatureStore.open(folder, CFG)
    assert store.bad_shards == [1]
    assert (
        extract_to_store(job, n, store, shard_size=size, executor=cluster, progress=False) == size
    )
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and str(raw) in r.getMessage()
    ]
    assert len(warned) == 1 and "does not match its recorded digest" in warned[0]  # one warning
    _assert_clean_store(folder, n, n // size)
    for name in names:
        np.testing.assert_array_equal(
            FeatureStore.open(folder, CFG).get_raw(name).descriptors,
            serial_store.get_raw(name).descriptors,
        )


# ---------------------------------------------------------------------- partitions


def test_partitions_describe_their_shards_and_a_plain_run_combines(
    tmp_path: Path, cluster: DaskExecutor, serial_store: FeatureStore
) -> None:
    n, size = 12, 2
    names = [NoiseImages(n).name(i) for i in range(n)]
    job = DescribeImages(NoiseImages(n), CFG)
    folder = tmp_path / "s"
    one = extract_to_store(
        job,
        n,
        FeatureStore.open(folder, CFG),
        shard_size=size,
        partition=(1, 3),
        executor=cluster,
        progress=False,
    )
    assert one == 4 and sorted(int(p.name[6:12]) for p in folder.glob("shard-*")) == [1, 4]
    zero = extract_to_store(
        job, n, FeatureStore.open(folder, CFG), shard_size=size, partition=(0, 3), progress=False
    )
    assert zero == 4
    # the combining run describes only the last partition's shards
    assert (
        extract_to_store(job, n, FeatureStore.open(folder, CFG), shard_size=size, progress=False)
        == 4
    )
    assert (
        extract_to_store(job, n, FeatureStore.open(folder, CFG), shard_size=size, progress=False)
        == 0
    )
    _assert_clean_store(folder, n, n // size)
    _assert_same_features(FeatureStore.open(folder, CFG), serial_store, names)
    assert json.loads((folder / "plan.json").read_text())["digest"] == plan_digest(names, size)


def test_extract_partition_of_a_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from oxbench.pipelines.extract import extract_partition
    from test_pipeline import make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    session = Session(
        root=root, cache=tmp_path / "cache", engine="serial", progress=False, shard_size=8
    )
    kwargs = {"overrides": tiny("rootsift-bow")}
    first = extract_partition("synthetic", "rootsift-bow", (0, 2), session, **kwargs)  # type: ignore[arg-type]
    second = extract_partition("synthetic", "rootsift-bow", (1, 2), session, **kwargs)  # type: ignore[arg-type]
    bench = oxbench.load("synthetic", root)
    db, q = "synthetic/database", "synthetic/queries"
    assert first[db] + second[db] == bench.gt.n_db and first[db] == 24
    assert first[q] + second[q] == bench.gt.n_queries
    assert extract_partition("synthetic", "rootsift-bow", (1, 2), session, **kwargs) == {  # type: ignore[arg-type]
        db: 0,
        q: 0,
    }
    with pytest.raises(SystemExit) as exc:
        main(["extract", "--method", "rootsift-bow", "--partition", "2/2", "--root", str(root)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "oxbench: error: --partition: I/N needs 0 <= I < N <= 1000000, got '2/2'"
    with pytest.raises(InputError, match="describes none"):
        extract_partition("synthetic", "features", (0, 2), session)


def test_run_partitions_describe_the_training_set_too_and_the_plain_run_describes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_pipeline import make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    cache = tmp_path / "cache"
    sets = [a for k, v in tiny("rootsift-bow").items() for a in ("--set", f"{k}={v}")]
    common = [
        "run",
        "--method",
        "rootsift-bow",
        "--root",
        str(root),
        "--cache",
        str(cache),
        "--vocab-size",
        "50",
        "--engine",
        "serial",
        "--shard-size",
        "8",
        "--no-progress",
        *sets,
    ]
    described: dict[str, int] = {}

    def cli(args: list[str]) -> None:
        with pytest.raises(SystemExit) as exc:
            main(args)
        assert exc.value.code == 0

    for i in range(3):
        cli([*common, "--partition", f"{i}/3", "--json"])
        for key, n in json.loads(capsys.readouterr().out)["described"].items():
            described[key] = described.get(key, 0) + n
    bench, train = oxbench.load("synthetic", root), oxbench.load("synthetic-train", root)
    assert (
        described["synthetic/database"] == bench.gt.n_db
        and described["synthetic/queries"] == bench.gt.n_queries
    )
    assert (
        described["synthetic-train/database"] == train.gt.n_db
    )  # the vocabulary's training images
    cli([*common, "--out", str(tmp_path / "out")])
    assert "mAP" in capsys.readouterr().out
    (record,) = (tmp_path / "out").glob("*/record.json")
    assert (
        json.loads(record.read_text())["cache"]["features"] == "hit"
    )  # every image came from the partitions


def test_cnn_descriptors_by_partition(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from oxbench.pipelines.extract import extract_partition
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.presets import resolve_method
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    tiny = {
        "descriptor.weights": "random",
        "descriptor.backbone": "resnet18",
        "descriptor.max_side": 64,
        "descriptor.scales": [1.0],
    }
    session = Session(root=root, cache=tmp_path / "cache", engine="serial", progress=False)
    first = extract_partition("synthetic", "gem-r50-imagenet", (0, 2), session, overrides=tiny)
    second = extract_partition("synthetic", "gem-r50-imagenet", (1, 2), session, overrides=tiny)
    bench = oxbench.load("synthetic", root)
    assert (
        first["synthetic/database"] == bench.gt.n_db and second["synthetic/database"] == 0
    )  # one shard: 0 of 2
    ctx = RunContext(tmp_path / "cache", progress=False, root=root)
    resolve_method("gem-r50-imagenet", **tiny).build().describe(bench, "database", ctx)
    assert ctx.steps["descriptors.database"] == "hit"


# ---------------------------------------------------------------------- an existing cluster


@pytest.fixture()
def address_cluster(tmp_path: Path) -> Iterator[str]:
    """``dask scheduler`` and 2 ``dask worker`` processes on 127.0.0.1, started as a user would."""
    dask_cli = shutil.which("dask", path=str(Path(sys.executable).parent)) or shutil.which("dask")
    if dask_cli is None:
        pytest.skip("the dask command is not installed")
    info = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [
                dask_cli,
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--no-dashboard",
                "--scheduler-file",
                str(info),
            ],
            env=_env(),
            stderr=subprocess.DEVNULL,
        )
    ]
    try:
        deadline = time.monotonic() + 60
        while not info.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        address = json.loads(info.read_text())["address"]
        for extra in (["--resources", "GPU=1"], []):  # one worker offers a (pretend) GPU
            procs.append(
                subprocess.Popen(
                    [
                        dask_cli,
                        "worker",
                        address,
                        "--nthreads",
                        "1",
                        "--host",
                        "127.0.0.1",
                        "--no-dashboard",
                        "--no-nanny",
                        *extra,
                    ],
                    env=_env(),
                    stderr=subprocess.DEVNULL,
                )
            )
        yield address
    finally:
        # workers first, while their scheduler still answers (a worker without one retries for a while)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def test_an_existing_cluster_by_address(
    tmp_path: Path,
    address_cluster: str,
    serial_store: FeatureStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import oxbench.execution.dask as dask_backend

    n = 12
    names = [NoiseImages(n).name(i) for i in range(n)]
    with make_executor("dask", 2, options={"address": address_cluster}) as executor:
        assert isinstance(executor, DaskExecutor)
        executor.check_paths({"data root": tmp_path, "cache": tmp_path / "cache"})
        with monkeypatch.context() as patch:  # a folder this process has and the workers do not
            patch.setattr(dask_backend, "make_folder", Path)
            with pytest.raises(
                InputError,
                match=r"dask worker tcp://127\.0\.0\.1:\d+ \(host .*\) cannot see the data "
                r"root .*nowhere; the workers need the data root and the cache",
            ):
                executor.check_paths(
                    {"data root": tmp_path / "nowhere", "cache": tmp_path / "cache"}
                )
        store = FeatureStore.open(tmp_path / "s", CFG)
        assert (
            extract_to_store(
                DescribeImages(NoiseImages(n), CFG),
                n,
                store,
                executor=executor,
                shard_size=2,
                progress=False,
            )
            == n
        )
        facts = executor.describe()
        # a job that asks for a GPU runs on the worker that offers one, and only there
        gpu_pids = set(executor.map(NeedsGpu(), list(range(6))))
        gpu_worker = [
            pid
            for addr, pid in executor.worker_pids.items()
            if executor.client.scheduler_info()["workers"][addr]["resources"].get("GPU")
        ]
        assert gpu_pids == set(gpu_worker) and len(gpu_worker) == 1
    assert (
        facts["cluster"] == "address"
        and facts["scheduler"] == address_cluster
        and facts["workers"] == 2
    )
    with pytest.raises(
        InputError,
        match=r"the Dask scheduler at tcp://127\.0\.0\.1:\d+ has 2 worker\(s\) after 2 s, "
        r"fewer than --workers 5",
    ):
        DaskExecutor(5, address=address_cluster, connect_timeout_s=2).client  # noqa: B018
    _assert_same_features(FeatureStore.open(tmp_path / "s", CFG), serial_store, names)


# ---------------------------------------------------------------------- bad input


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_scheduler_fails_within_seconds_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"tcp://127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--engine",
                "dask",
                "--cluster",
                address,
                "--root",
                str(tmp_path / "data"),
                "--no-progress",
                "--out",
                str(tmp_path / "runs"),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and time.monotonic() - t0 < 20, err
    assert err.startswith(
        f"oxbench: error: cannot reach the Dask scheduler at {address} within 15 s"
    )
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
    t0 = time.monotonic()
    with pytest.raises(
        InputError, match=f"cannot reach the Dask scheduler at {address} within 2 s"
    ) as err2:
        with DaskExecutor(1, address=address, connect_timeout_s=2) as executor:
            executor.check_paths({"cache": tmp_path})
    assert "\n" not in str(err2.value) and time.monotonic() - t0 < 10


@pytest.mark.parametrize("address, problem", [
    ("127.0.0.1:8786", "expected a scheduler address tcp://HOST:PORT"),
    ("http://host:8786", "expected a scheduler address"),
    ("tcp://host", "expected a scheduler address"),
    ("tcp://host:99999", "port must be 1 .. 65535"),
    ("tcp://user:secret@host:8786", "carries no credentials"),
    ("tcp://host:8786; rm -rf /", "expected a scheduler address"),
    ("", "expected a scheduler address"),
])  # fmt: skip
def test_a_bad_cluster_address_is_one_line(
    address: str, problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InputError, match=problem) as err:
        check_cluster_address(address)
    assert "\n" not in str(err.value) and "secret" not in str(err.value)
    monkeypatch.setenv("OXBENCH_CLUSTER", address or "nonsense")
    with pytest.raises(InputError, match="OXBENCH_CLUSTER: "):
        DaskExecutor(1)
    with pytest.raises(InputError, match="backend 'processes' has no option 'address'"):
        make_executor("processes", 2, options={"address": "tcp://127.0.0.1:8786"})


@pytest.mark.parametrize("retries", [-1, 101, 1.5, True, "3"])
def test_a_bad_retry_bound_is_one_line(retries: object) -> None:
    with pytest.raises(InputError, match="retries must be a whole number from 0 to 100"):
        DaskExecutor(1, retries=retries)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0.0, float("nan"), float("inf"), -1.0])
def test_a_bad_connect_timeout_is_one_line(timeout: float) -> None:
    with pytest.raises(InputError, match="connect_timeout_s must be 0.1 .. 3600 seconds"):
        DaskExecutor(1, connect_timeout_s=timeout)


def test_a_missing_extra_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    from oxbench.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r'pip install "oxbench\[dask\]"'):
        DaskExecutor(1).client  # noqa: B018


def test_dask_is_not_imported_by_oxbench_or_its_help() -> None:
    code = (
        "import sys, oxbench, oxbench.cli, oxbench.execution, oxbench.execution.dask\n"
        "from click.testing import CliRunner\n"
        "assert CliRunner().invoke(oxbench.cli.cli, ['run', '--help']).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'dask_jobqueue')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------------- the SLURM recipe


def _recipe(jobs: int, processes: int) -> dict:
    """docs/scale.md's recipe block, run for ``jobs`` x ``processes``."""
    text = (REPO / "docs" / "scale.md").read_text()
    start = text.index("jobs, processes = ")
    block = text[start : text.index("```", start)]
    first, rest = block.split("\n", 1)
    assert first == "jobs, processes = 8, 16"
    namespace: dict = {}
    exec(f"jobs, processes = {jobs}, {processes}\n{rest}", namespace)  # noqa: S102 - the docs' own block
    return namespace


def test_the_slurm_recipe_makes_a_job_script_without_slurm(tmp_path: Path) -> None:
    """docs/scale.md's dask-jobqueue configuration for 2 jobs x 4 processes, rendered as the sbatch
    script it submits: it parses, names the account and queue placeholders, activates the
    environment before the workers start, starts 4 worker processes a job, and asks for 8."""
    pytest.importorskip("dask_jobqueue")
    from dask_jobqueue.slurm import SLURMJob

    ns = _recipe(2, 4)
    script = SLURMJob(scheduler="tcp://10.0.0.1:8786", name="oxbench", **ns["recipe"]).job_script()
    (tmp_path / "job.sh").write_text(script)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)  # the script parses
    lines = script.splitlines()
    assert (
        lines[0].startswith("#!") and "#SBATCH -A ACCOUNT" in lines and "#SBATCH -p QUEUE" in lines
    )
    assert "#SBATCH --cpus-per-task=4" in lines and "#SBATCH -t 04:00:00" in lines
    (worker,) = [ln for ln in lines if "distributed.cli.dask_worker" in ln or "dask worker" in ln]
    assert "--nworkers 4" in worker and "--nthreads 1" in worker and "tcp://10.0.0.1:8786" in worker
    activate = lines.index("source /shared/oxbench-env/bin/activate")
    assert activate < lines.index(worker) and "export OXBENCH_DATA=/shared/oxbench" in lines
    assert ns["workers"] == 8 and ns["wait_workers"] == 1800  # jobs x processes, the wait
    submit = (REPO / "docs" / "scale.md").read_text().split("cluster.scale(jobs=jobs)")[1][:400]
    assert "workers=workers" in submit and '"wait_workers_s": wait_workers' in submit


def test_the_wait_for_batch_workers_is_the_configured_time_with_progress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An existing cluster whose 8 workers (the recipe's 2 x 4) start 3 s late: a wait of 1 s fails
    in one line naming the count, the configured wait connects them, saying meanwhile how many
    have connected."""
    import logging
    import threading

    from distributed import LocalCluster

    ns = _recipe(2, 4)
    with LocalCluster(
        n_workers=0,
        processes=False,
        threads_per_worker=1,
        host="127.0.0.1",
        protocol="tcp://",
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address
        t0 = time.monotonic()
        with pytest.raises(InputError, match="has 0 worker.s. after 1 s, fewer than --workers 8"):
            with DaskExecutor(ns["workers"], address=address, wait_workers_s=1.0) as ex:
                ex.client  # noqa: B018 - connects
        assert 0.9 < time.monotonic() - t0 < 8
        late = threading.Timer(3.0, cluster.scale, args=(ns["workers"],))
        late.start()
        caplog.set_level(logging.WARNING, logger="oxbench.execution.dask")
        caplog.clear()
        t0 = time.monotonic()
        try:
            with DaskExecutor(
                ns["workers"], address=address, wait_workers_s=float(ns["wait_workers"])
            ) as ex:
                assert len(ex.client.scheduler_info()["workers"]) == 8
        finally:
            late.join()
        assert 2.5 < time.monotonic() - t0 < 120
        said = [r.getMessage() for r in caplog.records if r.name == "oxbench.execution.dask"]
        assert said[0].startswith("dask: 0 of 8 worker(s) connected to tcp://127.0.0.1:"), said
        assert "waiting up to 1800 s more" in said[0] and said[-1].startswith("dask: 8 worker(s)")


@pytest.mark.parametrize("bad", ["nan", "-1", "1e30", "0"])
def test_wait_workers_out_of_range_is_one_line(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--root", str(tmp_path), "--engine", "dask", "--wait-workers", bad])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("oxbench: error: option --wait-workers: ")
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(InputError, match="wait_workers_s"):
        DaskExecutor(1, address="tcp://127.0.0.1:1", wait_workers_s=float(bad))


def test_the_embedded_cluster_listens_on_loopback_ports_the_system_picks(
    cluster: DaskExecutor,
) -> None:
    """No dashboard on the well-known port 8787 (nor anything on another interface)."""
    cluster.client  # noqa: B018 - started
    pids = [os.getpid(), *cluster.worker_pids.values()]
    listening = [
        c.laddr
        for p in pids
        for c in psutil.Process(p).net_connections(kind="inet")
        if c.status == "LISTEN"
    ]
    assert listening and all(a.ip == "127.0.0.1" for a in listening)
    assert 8787 not in {a.port for a in listening}


def test_synthetic_rendering_goes_through_the_runs_engine(
    cluster: DaskExecutor, tmp_path: Path
) -> None:
    """The generator renders on the executor it is given (the run's Dask cluster), with the bytes
    of the local path."""
    from oxbench.datasets.synthetic.config import SynthConfig
    from oxbench.datasets.synthetic.generate import generate, read_manifest

    cfg = SynthConfig(
        db_size=10, landmarks=2, queries_per_landmark=1, image_size=(160, 120), generic_buildings=3
    )
    before = len(cluster.stages)
    on_dask = generate(tmp_path / "dask", cfg, progress=False, executor=cluster)
    local = generate(tmp_path / "local", cfg, workers=1, progress=False)
    assert [s["tasks"] for s in cluster.stages[before:]] == [12]  # 10 images + 2 queries
    for part in ("images", "queries"):
        assert [r["sha256"] for r in read_manifest(on_dask)[part]] == [
            r["sha256"] for r in read_manifest(local)[part]
        ]
