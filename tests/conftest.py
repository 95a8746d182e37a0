"""Shared test fixtures: the real data folder (``shared_data`` marker) and seeded randomness.

Tests that read the real ground truth and images carry ``@pytest.mark.shared_data`` and take the
folder from the ``shared_data`` fixture. The folder is ``$OXBENCH_SHARED_DATA`` and nothing else
(no guessed default). The marker does the skipping, so a test cannot forget it: without the
variable every marked test is skipped with :data:`SHARED_DATA_HINT`; a test that asks for the
fixture without the marker is refused at collection.
"""

from __future__ import annotations

import doctest
import os
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA_ENV = "OXBENCH_SHARED_DATA"
SHARED_DATA_HINT = (
    f"set {SHARED_DATA_ENV} to the real data folder "
    "(see docs/development.md or the README's development section)"
)


def shared_data_dir() -> Path | None:
    """The real data folder named by ``$OXBENCH_SHARED_DATA``, or None when it is unset or absent."""
    env = os.environ.get(SHARED_DATA_ENV)
    if not env:
        return None
    path = Path(env)
    return path if path.is_dir() else None


class _DoctestsNeedingExtras:
    """A doctest that stops on a missing optional dependency is reported as skipped, naming it.

    Registered as a plain plugin (not a conftest hook, which would only see ``tests/``), so that it
    also applies to the doctests of ``src/oxbench``: collecting them imports every module, which
    needs no extra; running an example that uses OpenCV or faiss needs one.
    """

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
        outcome = yield
        report = outcome.get_result()
        if call.when != "call" or call.excinfo is None:
            return
        exc = call.excinfo.value
        inner = exc.exc_info[1] if isinstance(exc, doctest.UnexpectedException) else None
        if isinstance(inner, ImportError):
            path, lineno, _ = item.reportinfo()
            report.outcome = "skipped"
            report.longrepr = (str(path), (lineno or 0) + 1, f"Skipped: {inner}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_DoctestsNeedingExtras(), "oxbench-doctests-needing-extras")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse a test that uses the ``shared_data`` fixture without the ``shared_data`` marker."""
    unmarked = [
        item.nodeid
        for item in items
        if "shared_data" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("shared_data") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "these tests use the shared_data fixture without @pytest.mark.shared_data: "
            + ", ".join(unmarked)
        )


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip every ``shared_data``-marked test, with the hint, when the real data is not at hand."""
    if item.get_closest_marker("shared_data") is None:
        return
    if shared_data_dir() is None:
        env = os.environ.get(SHARED_DATA_ENV)
        why = f"{SHARED_DATA_ENV}={env} is not a folder: " if env else ""
        pytest.skip(why + SHARED_DATA_HINT)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real ground truth and images (``$OXBENCH_SHARED_DATA``); for marked tests only."""
    path = shared_data_dir()
    if path is None:  # only reachable from a test without the marker (e.g. getfixturevalue)
        pytest.fail(f"shared_data used outside a @pytest.mark.shared_data test; {SHARED_DATA_HINT}")
    return path


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(12345)
