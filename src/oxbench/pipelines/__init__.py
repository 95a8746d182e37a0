"""Retrieval methods and the runner.

- :mod:`oxbench.pipelines.method` -- the interface every method implements
  (:class:`MethodConfig` settings + :class:`RetrievalMethod` fit / index / search), the run context
  (:class:`RunContext`: cache, executor, timings), the preset registry :data:`METHODS`,
  :func:`list_methods`, :func:`resolve_method`;
- :mod:`oxbench.pipelines.steps` -- the family-neutral steps (local features, vocabulary, words,
  short-list verification), each resumable and saying whether it came from the cache;
- :mod:`oxbench.pipelines.families` -- one module per family (config, method, presets);
- :mod:`oxbench.pipelines.descriptors` -- the global family's descriptor kinds by name (VLAD, CNN,
  your files; plugins add theirs), each a settings class with its describer;
- :mod:`oxbench.pipelines.runner` -- :func:`run`: any method on any dataset, with a run record.
"""

from oxbench.pipelines.descriptors import DESCRIPTORS, DescriptorKind
from oxbench.pipelines.descriptors.cnn import CnnDescriptor
from oxbench.pipelines.descriptors.files import FeatureFilesDescriptor
from oxbench.pipelines.descriptors.vlad import VladDescriptor
from oxbench.pipelines.families.asmk import AsmkConfig
from oxbench.pipelines.families.bow import BowConfig
from oxbench.pipelines.families.global_descriptors import GlobalConfig
from oxbench.pipelines.method import (
    DEFAULT_METHOD,
    METHODS,
    MethodConfig,
    RetrievalMethod,
    RunContext,
    SearchResult,
    list_methods,
    register_method,
    resolve_method,
)
from oxbench.pipelines.runner import RunConfig, RunOutcome, find_runs, run

__all__ = [
    "DEFAULT_METHOD",
    "DESCRIPTORS",
    "METHODS",
    "AsmkConfig",
    "BowConfig",
    "CnnDescriptor",
    "DescriptorKind",
    "FeatureFilesDescriptor",
    "GlobalConfig",
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
    "VladDescriptor",
]
