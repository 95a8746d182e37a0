"""oxbench: instance-level image retrieval benchmarks, evaluated the way the papers do it.

The one obvious way for each task, at top level::

    import oxbench

    oxbench.list_datasets()                      # ids of every benchmark oxbench knows
    bench = oxbench.load("roxford5k", root)      # ground truth + images (a Benchmark)
    result = oxbench.evaluate(bench.gt, ranks)   # exact official scores, ranks [n_queries, k]
    oxbench.list_methods()                       # presets of every method family
    outcome = oxbench.run("synthetic", "rootsift-bow-sv-qe")   # end to end, with a run record
    session = oxbench.Session(root="data", workers=2)   # where runs execute, built once

The package is split by concern:

- :mod:`oxbench.evaluation` -- AP, mP@K and the four official protocols (pure functions over arrays);
- :mod:`oxbench.formats` -- readers/writers of the official ground-truth and result files;
- :mod:`oxbench.datasets` -- the dataset registry, verified fetching, loading and integrity checks;
- :mod:`oxbench.features`, :mod:`oxbench.index`, :mod:`oxbench.refinement` -- building blocks of methods;
- :mod:`oxbench.pipelines` -- the method interface, the presets and the runner;
- :mod:`oxbench.report` -- tables and exports of results;
- :mod:`oxbench.cli` -- the ``oxbench`` command, a thin layer over the library.

Importing :mod:`oxbench` does no I/O and needs only numpy/scipy; the top-level functions import
their subpackage on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from oxbench.errors import InputError, MissingExtraError, OxbenchError
from oxbench.groundtruth import GroundTruth, Query
from oxbench.version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets import load
    from oxbench.evaluation import evaluate
    from oxbench.pipelines.presets import list_methods
    from oxbench.pipelines.runner import run
    from oxbench.pipelines.session import RecordOptions, Session

_LAZY = {
    "load": ("oxbench.datasets", "load"),
    "evaluate": ("oxbench.evaluation", "evaluate"),
    "list_methods": ("oxbench.pipelines.presets", "list_methods"),
    "run": ("oxbench.pipelines.runner", "run"),
    "Session": ("oxbench.pipelines.session", "Session"),
    "RecordOptions": ("oxbench.pipelines.session", "RecordOptions"),
}


def list_datasets() -> list[str]:
    """Ids of every dataset oxbench knows (``oxbench data list`` shows their details).

    Example:
        >>> "roxford5k" in list_datasets()
        True
    """
    from oxbench.datasets.catalog import DATASETS

    return DATASETS.names()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'oxbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "GroundTruth",
    "RecordOptions",
    "Session",
    "InputError",
    "MissingExtraError",
    "OxbenchError",
    "Query",
    "__version__",
    "evaluate",
    "list_datasets",
    "list_methods",
    "load",
    "run",
]
