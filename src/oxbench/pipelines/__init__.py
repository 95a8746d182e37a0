"""Retrieval methods and the runner.

- :mod:`oxbench.pipelines.method` -- the interface every method implements
  (:class:`MethodConfig` settings + :class:`RetrievalMethod` fit / index / search, the one stage
  loop), the run context (:class:`RunContext`: cache, executor, timings);
- :mod:`oxbench.pipelines.steps` -- the family-neutral steps (local features, vocabulary, words,
  short-list verification), each resumable and saying whether it came from the cache;
- :mod:`oxbench.pipelines.rerankers` -- the re-ranking stages, one module each;
- :mod:`oxbench.pipelines.presets` -- the preset registry :data:`METHODS`, :func:`list_methods`,
  :func:`resolve_method`;
- :mod:`oxbench.pipelines.families` -- one module per family (config, method, presets);
- :mod:`oxbench.pipelines.descriptors` -- the global family's descriptor kinds by name (VLAD, CNN,
  your files; plugins add theirs), each a settings class with its describer;
- :mod:`oxbench.pipelines.session` -- :class:`Session` (where and how runs execute, built once)
  and :class:`RecordOptions` (what one run writes);
- :mod:`oxbench.pipelines.runner` -- :func:`run`: any method on any dataset, with a run record.

The names below are imported on first use, so that importing a submodule (as a plugin does at its
top) never runs the others: ``from oxbench.pipelines import resolve_method`` works from anywhere.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.pipelines.descriptors import DESCRIPTORS, DescriptorKind
    from oxbench.pipelines.descriptors.cnn import CnnDescriptor
    from oxbench.pipelines.descriptors.files import FeatureFilesDescriptor
    from oxbench.pipelines.descriptors.vlad import VladDescriptor
    from oxbench.pipelines.families.asmk import AsmkConfig
    from oxbench.pipelines.families.bow import BowConfig
    from oxbench.pipelines.families.global_descriptors import GlobalConfig
    from oxbench.pipelines.method import (
        MethodConfig,
        Ranking,
        RetrievalMethod,
        RunContext,
        SearchResult,
    )
    from oxbench.pipelines.presets import (
        DEFAULT_METHOD,
        METHODS,
        list_methods,
        register_method,
        resolve_method,
    )
    from oxbench.pipelines.runner import RunConfig, RunOutcome, find_runs, run
    from oxbench.pipelines.session import RecordOptions, Session

#: Every public name, by the module that defines it.
_WHERE = {
    "oxbench.pipelines.descriptors": ("DESCRIPTORS", "DescriptorKind"),
    "oxbench.pipelines.descriptors.cnn": ("CnnDescriptor",),
    "oxbench.pipelines.descriptors.files": ("FeatureFilesDescriptor",),
    "oxbench.pipelines.descriptors.vlad": ("VladDescriptor",),
    "oxbench.pipelines.families.asmk": ("AsmkConfig",),
    "oxbench.pipelines.families.bow": ("BowConfig",),
    "oxbench.pipelines.families.global_descriptors": ("GlobalConfig",),
    "oxbench.pipelines.method": (
        "MethodConfig",
        "Ranking",
        "RetrievalMethod",
        "RunContext",
        "SearchResult",
    ),
    "oxbench.pipelines.presets": (
        "DEFAULT_METHOD",
        "METHODS",
        "list_methods",
        "register_method",
        "resolve_method",
    ),
    "oxbench.pipelines.runner": ("RunConfig", "RunOutcome", "find_runs", "run"),
    "oxbench.pipelines.session": ("RecordOptions", "Session"),
}
_LAZY = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'oxbench.pipelines' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "AsmkConfig",
    "BowConfig",
    "CnnDescriptor",
    "DEFAULT_METHOD",
    "DESCRIPTORS",
    "DescriptorKind",
    "FeatureFilesDescriptor",
    "GlobalConfig",
    "METHODS",
    "MethodConfig",
    "Ranking",
    "RecordOptions",
    "RetrievalMethod",
    "RunConfig",
    "RunContext",
    "RunOutcome",
    "SearchResult",
    "Session",
    "VladDescriptor",
    "find_runs",
    "list_methods",
    "register_method",
    "resolve_method",
    "run",
]
