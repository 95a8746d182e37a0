"""Shared test fixtures: the real data folder (skipped when absent) and seeded randomness."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``../shared/data`` beside the checkout, or ``$OXBENCH_SHARED_DATA``."""
    env = os.environ.get("OXBENCH_SHARED_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real ground truth and images; tests using it skip when the folder is absent."""
    path = shared_data_dir()
    if not path.is_dir():
        pytest.skip(f"real data folder {path} is absent")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
