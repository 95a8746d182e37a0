"""Retrieval methods and the runner.

- :mod:`oxbench.pipelines.method` -- the interface every method implements
  (:class:`MethodConfig` settings + :class:`RetrievalMethod` fit / index / search), the preset
  registry :data:`METHODS`, :func:`list_methods`, :func:`resolve_method`;
- :mod:`oxbench.pipelines.presets` -- the named presets of every family, as data;
- :mod:`oxbench.pipelines.bow` -- RootSIFT bag of words, spatial re-ranking, query expansion;
- :mod:`oxbench.pipelines.globaldesc` -- global descriptors, whitening, exact search, QE;
- :mod:`oxbench.pipelines.runner` -- :func:`run`: any method on any dataset, with a run record.
"""

from oxbench.pipelines.method import (
    METHODS,
    MethodConfig,
    RetrievalMethod,
    RunContext,
    SearchResult,
    list_methods,
    register_method,
    resolve_method,
)
from oxbench.pipelines.presets import DEFAULT_METHOD, BowMethod, GlobalMethod
from oxbench.pipelines.runner import RunConfig, RunOutcome, find_runs, run

__all__ = [
    "DEFAULT_METHOD",
    "METHODS",
    "BowMethod",
    "GlobalMethod",
    "MethodConfig",
    "RetrievalMethod",
    "RunConfig",
    "RunContext",
    "RunOutcome",
    "SearchResult",
    "find_runs",
    "list_methods",
    "register_method",
    "resolve_method",
    "run",
]
