"""The session: where and how runs execute, built once and handed to every run.

A :class:`Session` holds what does not change from one run to the next -- the data root, the
cache, the execution backend and its workers, progress bars, strictness about partial data,
determinism -- as hloc's pipelines set up once and then call their steps. ``oxbench.run``,
``oxbench extract``, ``oxbench milestones`` and the CLI take one; none sets these up itself::

    from oxbench.pipelines import Session, run

    session = Session(root="data", workers=2, progress=False)
    outcome = run("synthetic", "rootsift-bow", session)

What a run writes is its own (:class:`RecordOptions`: the folder, the label, how much of each
ranked list is kept).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.execution import Executor, available_cores, check_workers, make_executor
from oxbench.features.store import DEFAULT_SHARD_SIZE
from oxbench.pipelines.method import RunContext
from oxbench.schema import setting, validate


@dataclass(frozen=True)
class Session:
    """Where and how runs execute.

    Attributes:
        root: the data root (default ``$OXBENCH_DATA`` or the per-user default), resolved.
        cache: features, vocabularies, descriptors (default ``<root>/_cache``), resolved.
        engine: the execution backend of the parallel stages (:data:`oxbench.execution.EXECUTORS`:
            ``processes``, ``serial``, ``dask``, or a plugin's).
        workers: workers of the parallel stages (``None``: one per available core).
        engine_options: the backend's own options (``{"address": "tcp://host:8786"}`` for an
            existing Dask cluster, ``{"wait_workers_s": 600}`` to wait for its workers).
        shard_size: images per write-once shard of the local-feature stores (default 64).
        decode_threads: threads that decode images for a CNN in this process (default: the
            available cores).
        progress: tqdm bars.
        strict: refuse datasets whose image counts differ from the official ones; ``False``
            (partial data) lets undecodable images through, named and recorded.
        deterministic: one BLAS / faiss thread in the learned steps, so that what they learn does
            not depend on the workers or the cores (:mod:`oxbench.execution.determinism`).
        verify_images: compare every image with the file its cached features were described from
            by its bytes (a full read and hash), not only by ``stat``.
    """

    root: str | Path | None = None
    cache: str | Path | None = None
    engine: str = setting("processes", S.Str(min_len=1, max_len=64), doc="execution backend")
    workers: int | None = 1
    engine_options: Mapping[str, object] = field(default_factory=dict)
    shard_size: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1_000_000)), doc="images per extraction shard"
    )
    decode_threads: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1024)), doc="image-decoding threads"
    )
    progress: bool = setting(True, S.Bool(), doc="progress bars")
    strict: bool = setting(True, S.Bool(), doc="refuse partial datasets")
    deterministic: bool = setting(False, S.Bool(), doc="one BLAS thread in learned steps")
    verify_images: bool = setting(False, S.Bool(), doc="hash images against cached features")

    def __post_init__(self) -> None:
        from oxbench.datasets.paths import data_root

        validate(self)
        root = data_root(self.root)
        object.__setattr__(self, "root", root)
        object.__setattr__(self, "cache", Path(self.cache) if self.cache else root / "_cache")
        if self.workers is not None:
            object.__setattr__(self, "workers", check_workers(self.workers))
        object.__setattr__(self, "engine_options", dict(self.engine_options or {}))

    @property
    def data_root(self) -> Path:
        """The data root (resolved)."""
        return Path(self.root or ".")

    @property
    def cache_dir(self) -> Path:
        """The cache folder (resolved)."""
        return Path(self.cache or ".")

    @contextlib.contextmanager
    def executor(self) -> Iterator[Executor]:
        """The executor of one run: made, asked whether its workers see the data root and the
        cache (before anything is loaded), and closed when the run ends, whatever happens (a
        cluster it started stops with it)."""
        executor = make_executor(self.engine, self.workers, options=self.engine_options)
        try:
            executor.check_paths({"data root": self.data_root, "cache": self.cache_dir})
            yield executor
        finally:
            executor.close()

    def context(self, executor: Executor, *, full_check: bool = False) -> RunContext:
        """The run context of a run's steps in this session, on ``executor``."""
        return RunContext(
            self.cache_dir,
            executor=executor,
            progress=self.progress,
            decode_threads=self.decode_threads or available_cores(),
            full_check=full_check,
            verify_images=self.verify_images,
            allow_partial=not self.strict,
            root=self.data_root,
            shard_size=self.shard_size or DEFAULT_SHARD_SIZE,
        )


@dataclass(frozen=True)
class RecordOptions:
    """What one run writes, and where.

    Attributes:
        out: the config folder (default ``<runs_dir>/<dataset>-<method>-<config digest>``).
        runs_dir: parent of default config folders.
        label: the run's name in ``runs``, ``compare``, ``report``, ``plot`` and ``view``
            (:func:`oxbench.records.check_label`); default: the preset name plus the settings that
            differ from the preset.
        top_k: how many retrieved images per query ``retrieved.json`` records.
        ranks_top: keep (save and evaluate) the top this many of each ranked list; default: all
            when the index holds at most 100,000 images, else 10,000 (as revisitop's R1M files).
        overwrite: replace earlier runs in the config folder (and a folder of another config).
        command: the command line to record (default ``sys.argv``).
    """

    out: str | Path | None = None
    runs_dir: str | Path = Path("runs")
    label: str | None = None
    top_k: int = setting(100, S.Int(lo=1, hi=1 << 24), doc="retrieved images recorded per query")
    ranks_top: int | None = setting(
        None, S.Optional(S.Int(lo=1, hi=1 << 40)), doc="ranked-list length kept"
    )
    overwrite: bool = False
    command: Sequence[str] | None = None

    def __post_init__(self) -> None:
        from oxbench.records import check_label

        validate(self)
        if self.label is not None:
            check_label(self.label)
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        object.__setattr__(self, "runs_dir", Path(self.runs_dir))
        if self.command is not None:
            object.__setattr__(self, "command", tuple(str(c) for c in self.command))


@dataclass(frozen=True)
class RunRequest:
    """What one run runs: a method on a dataset (and what it learns on).

    Attributes:
        dataset: the test dataset id.
        method: a preset name or a method config.
        train_dataset: what the method learns on (default: the other city, or ``synthetic-train``).
        distractors: distractors added to the index (an id, or a number of generated ones).
        dataset_options: options of the test dataset (Holidays' ``orientation``).
        overrides: method settings to change (``{"vocabulary.size": 4096}``).
    """

    dataset: str
    method: Any
    train_dataset: str | None = None
    distractors: str | int | None = None
    dataset_options: Mapping[str, str] = field(default_factory=dict)
    overrides: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.dataset, str) or not self.dataset:
            raise InputError(f"dataset must be a dataset id, got {self.dataset!r}")
        object.__setattr__(
            self, "dataset_options", {k: str(v) for k, v in (self.dataset_options or {}).items()}
        )
        object.__setattr__(self, "overrides", dict(self.overrides or {}))
