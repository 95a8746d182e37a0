"""Test helpers for tests/test_dask.py: picklable image sources and jobs that Dask workers import.

Run as a script it is the *driver* that test (c) kills: it extracts a slow image source into a
feature store on a LocalCluster and prints its workers' pids, then its own pid, one per line.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from oxbench.features.sift import SiftConfig

#: The extraction config of these tests (small, fast, deterministic).
CFG = SiftConfig(n_features=60, max_side=160)


class NoiseImages:
    """``n`` deterministic noise images made on read (nothing large travels to the workers), each
    read taking ``delay`` seconds (so a test can kill a worker while a shard is in flight)."""

    def __init__(self, n: int, *, delay: float = 0.0, seed: int = 0) -> None:
        self.n = n
        self.delay = delay
        self.seed = seed

    def __len__(self) -> int:
        return self.n

    def name(self, i: int) -> str:
        return f"noise{i:04d}"

    def path(self, i: int) -> Path | None:
        return None

    def read(self, i: int) -> np.ndarray:
        if self.delay:
            time.sleep(self.delay)
        rng = np.random.default_rng(self.seed * 100_003 + i)
        small = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)
        return np.repeat(
            np.repeat(small, 4, axis=0), 4, axis=1
        )  # 160 x 120 blocks: corners for SIFT


class DieOnRead(NoiseImages):
    """An image source whose worker dies (SIGKILL, as the OOM killer does) reading image ``fatal``."""

    def __init__(self, n: int, fatal: int) -> None:
        super().__init__(n)
        self.fatal = fatal

    def read(self, i: int) -> np.ndarray:
        if i == self.fatal:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().read(i)


class NeedsGpu:
    """A job that asks for a GPU (as a CNN's would) and says which process ran it."""

    resources = {"GPU": 1}

    def __call__(self, i: int) -> int:
        return os.getpid()


def _drive(store_dir: str, n: int, shard_size: int, delay: float) -> None:
    from oxbench.execution.dask import DaskExecutor
    from oxbench.features.store import DescribeImages, FeatureStore, extract_to_store

    store = FeatureStore.open(store_dir, CFG)
    with DaskExecutor(2, cores=2) as executor:
        print(" ".join(str(p) for p in executor.worker_pids.values()), flush=True)
        print(os.getpid(), flush=True)
        extract_to_store(
            DescribeImages(NoiseImages(n, delay=delay), CFG),
            n,
            store,
            executor=executor,
            shard_size=shard_size,
            progress=False,
        )
    print("done", flush=True)


if __name__ == "__main__":
    _drive(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
