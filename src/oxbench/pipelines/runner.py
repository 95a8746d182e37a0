"""Run any method on a dataset end to end and keep a complete, never-overwritten run record.

Layout (one config folder per resolved config; one run folder per execution)::

    runs/<dataset>-<method>-<config digest>/
        config.json            the resolved config (the same for every run below)
        <run id>/              UTC start time + random suffix, e.g. 20261130T121500Z-3f2a
            record.json        command line, start/end, oxbench version, git commit, host (CPU,
                               cores, GPU), library versions, compiled-kernel flag, cache hits
            config.json        copy of the resolved config
            dataset.json       ground-truth digest and sha256 of the dataset's small files
            ranks.npy          int64 rankings in the revisitop layout (n_kept, n_queries)
            scores.npy         float32 [n_queries, k] scores of the top k of each list
            metrics.json       the evaluation (EvaluationResult.to_dict) plus run facts
            per_query.csv/json per-query AP and P@K
            retrieved.json     per query: the top k image names with their labels and scores
            timings.json       seconds per stage
            summary.txt        the printed lines and table
            run.log            the run's log lines
            matches.json       spatially verified correspondences, when the method has them
            boxes.json         the box of the query's object predicted in each image that has
                               correspondences (:func:`predicted_boxes`)

A run folder is assembled under a temporary name and renamed into place when complete, so a
crashed run never leaves a folder that looks finished. A rerun of the same config adds a new run
folder beside the earlier ones; ``overwrite=True`` replaces them (and a config folder written under
another config) explicitly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import re
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.cache import CorruptCache
from oxbench.datasets import load
from oxbench.datasets.base import Benchmark
from oxbench.datasets.catalog import get_spec
from oxbench.datasets.synthetic.distractor_kinds import kind_tag
from oxbench.errors import InputError, require_installed
from oxbench.evaluation import evaluate
from oxbench.evaluation.kernels import accelerated
from oxbench.evaluation.result import EvaluationResult
from oxbench.execution import Executor, cpu_seconds
from oxbench.execution.determinism import single_threaded
from oxbench.fileio import (
    TEMP_PREFIX,
    atomic_write_json,
    file_lock,
    json_digest,
    os_reason,
    temporary_in_flight,
)
from oxbench.pipelines.method import (
    CPU_SUFFIX,
    MethodConfig,
    RetrievalMethod,
    RunContext,
    SearchResult,
)
from oxbench.pipelines.presets import DEFAULT_METHOD, preset_label, resolve_method
from oxbench.pipelines.seedgroup import SeedMember, check_seeds, plan_group
from oxbench.pipelines.session import RecordOptions, RunRequest, Session
from oxbench.pipelines.sources import check_sources
from oxbench.pipelines.steps import gt_digest
from oxbench.provenance import (
    InputRecord,
    image_set_record,
    input_record,
    input_records,
    inputs_digest,
)
from oxbench.records import (  # noqa: F401 - RUN_FILES, RunSummary, find_runs: re-exported
    MAX_LABEL_CHARS,
    RECORD_FORMAT,
    RUN_FILES,
    ExecutionFacts,
    FootprintFacts,
    RecordFile,
    RunSummary,
    SeedGroupFacts,
    check_label,
    distractor_tag,
    find_runs,
    jsonable,
    list_runs,
    new_run_id,
    read_record_json,
    retrieved_document,
    write_run_files,
)
from oxbench.registry import loaded_plugins
from oxbench.report.tables import result_table
from oxbench.schema import seed_settings

log = logging.getLogger(__name__)

#: Default training set of each test set: never the test set itself (the other city).
DEFAULT_TRAIN_DATASET: dict[str, str] = {
    "synthetic": "synthetic-train",
    "synthetic-train": "synthetic",
    "roxford5k": "rparis6k",
    "rparis6k": "roxford5k",
    "oxford5k": "paris6k",
    "paris6k": "oxford5k",
    "holidays": "synthetic-train",
    "ukbench": "synthetic-train",
}
_CHECKSUM_SUFFIXES = {".pkl", ".tsv", ".json", ".txt", ".csv", ".dat"}
_CHECKSUM_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's numbers (written as ``config.json``).

    Attributes:
        dataset: test dataset id.
        method: the resolved method config.
        train_dataset: what the method learned on (``None`` when it learns nothing).
        trained_on_test_set: whether that is the test set itself (results not comparable).
        dataset_gt_sha256: digest of the ground truth (names, boxes, labels).
        crop: query-crop convention.
        distractors: the distractors asked for (an id, a count, or ``None``).
        n_distractors: how many were added to the index.
        strict: official image counts enforced.
        ranks_top: the length of each kept ranked list (``None``: all).
        dataset_options: the dataset's options (Holidays' ``orientation``); only written when set,
            so configs without options keep their digest.
        inputs: the content (size, SHA-256) of each file the method's settings name
            (:meth:`~oxbench.pipelines.method.MethodConfig.input_files`): the same settings on other
            files make another config. Only written when there are some.
    """

    dataset: str
    method: MethodConfig
    train_dataset: str | None
    trained_on_test_set: bool
    dataset_gt_sha256: str
    crop: str
    distractors: str | int | None
    n_distractors: int
    strict: bool
    ranks_top: int | None
    dataset_options: Mapping[str, str] = field(default_factory=dict)
    inputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, the method nested."""
        out = {
            "dataset": self.dataset,
            "method": self.method.to_dict(),
            "train_dataset": self.train_dataset,
            "trained_on_test_set": self.trained_on_test_set,
            "dataset_gt_sha256": self.dataset_gt_sha256,
            "crop": self.crop,
            "distractors": self.distractors,
            "n_distractors": self.n_distractors,
            "strict": self.strict,
            "ranks_top": self.ranks_top,
        }
        if self.dataset_options:
            out["dataset_options"] = dict(sorted(self.dataset_options.items()))
        if self.inputs:
            out["inputs"] = {k: dict(v) for k, v in sorted(self.inputs.items())}
        return out

    def digest(self) -> str:
        """Short stable hash: the config folder's suffix."""
        return json_digest(self.to_dict(), 10)


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run` returns.

    Attributes:
        run_dir: this execution's run folder.
        config_dir: the config folder holding it (and earlier runs of the same config).
        result: the evaluation.
        config: the resolved run config.
        timings: seconds per stage.
        info: facts of the run (provenance of learned steps, verified images per query ...).
        record: what ``record.json`` holds.
        group: with ``seeds``, every member's outcome in seed order (this one is the last).
    """

    run_dir: Path
    config_dir: Path
    result: EvaluationResult
    config: RunConfig
    timings: Mapping[str, float]
    info: Mapping[str, Any]
    record: Mapping[str, Any] = field(default_factory=dict)
    group: tuple[RunOutcome, ...] = ()


# --- facts about the machine and the code ---------------------------------------------------------


def versions() -> dict[str, str | None]:
    """Versions of everything that changes the numbers (optional libraries only when installed)."""
    import importlib.metadata as md

    import scipy

    from oxbench.version import __version__

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "oxbench": __version__,
    }
    for dist, key in (
        ("opencv-python-headless", "opencv"),
        ("opencv-python", "opencv"),
        ("faiss-cpu", "faiss"),
        ("torch", "torch"),
        ("timm", "timm"),
        ("pillow", "pillow"),
    ):
        if out.get(key):
            continue
        try:
            out[key] = md.version(dist)
        except md.PackageNotFoundError:
            out.setdefault(key, None)
    return out


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _gpu_name() -> str | None:
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            if torch.cuda.is_available():
                return str(torch.cuda.get_device_name(0))
    smi = shutil.which("nvidia-smi")
    if smi:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            res = subprocess.run(
                [smi, "--query-gpu=name", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
            )
            if res.returncode == 0 and res.stdout.strip():
                return res.stdout.strip().splitlines()[0]
    return None


def host_facts() -> dict[str, Any]:
    """CPU, cores (available / total), GPU, platform and Python of this machine."""
    avail = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_name(),
        "cores": avail,
        "cores_total": os.cpu_count(),
        "gpu": _gpu_name(),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def git_commit() -> str | None:
    """The commit of the checkout oxbench runs from (``None`` when installed from a wheel)."""
    here = Path(__file__).resolve().parent
    for parent in here.parents:
        if (parent / ".git").exists():
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                res = subprocess.run(
                    ["git", "-C", str(parent), "rev-parse", "HEAD"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=False,
                )
                if res.returncode == 0:
                    return res.stdout.strip()
            return None
    return None


def dataset_files(bench: Benchmark) -> list[Path]:
    """The small files at the top of the dataset folder (ground truth, lists), by name."""
    if bench.root is None or not Path(bench.root).is_dir():
        return []
    return [
        p
        for p in sorted(Path(bench.root).iterdir())
        if p.is_file()
        and p.suffix in _CHECKSUM_SUFFIXES
        and p.stat().st_size <= _CHECKSUM_MAX_BYTES
    ]


def dataset_checksums(bench: Benchmark) -> dict[str, Any]:
    """Ground-truth digest plus SHA-256 of the small files at the top of the dataset folder."""
    return {
        "id": bench.id,
        "gt_sha256": gt_digest(bench.gt),
        "files_sha256": {p.name: input_record(p).sha256 for p in dataset_files(bench)},
        **bench.describe(),
    }


# --- what was retrieved ---------------------------------------------------------------------------


def retrieved_records(
    bench: Benchmark, ranks: np.ndarray, scores: np.ndarray | None, k: int
) -> dict[str, Any]:
    """``retrieved.json`` of a run on ``bench`` (:func:`oxbench.records.retrieved_document`)."""
    n_db = bench.gt.n_db

    def image_name(idx: int) -> str:
        if idx < n_db:
            return bench.gt.db_names[idx]
        assert bench.distractors is not None
        return bench.distractors.name(idx - n_db)

    def image_path(idx: int) -> str | None:
        if idx < n_db:
            p = bench.database.path(idx)
        else:
            assert bench.distractors is not None
            p = bench.distractors.path(idx - n_db)
        return None if p is None else str(p)

    def query_image(qi: int) -> str | None:
        p = bench.queries.path(qi)
        return None if p is None else str(p)

    return retrieved_document(
        bench.gt,
        ranks,
        scores,
        k,
        image_name=image_name,
        image_path=image_path,
        query_image=query_image,
    )


def _image_size(bench: Benchmark, idx: int) -> tuple[int, int] | None:
    from oxbench.imaging import open_image

    n_db = bench.gt.n_db
    if idx < n_db:
        path = bench.database.path(idx)
    else:
        path = None if bench.distractors is None else bench.distractors.path(idx - n_db)
    if path is None:
        return None
    with open_image(path) as im:
        return int(im.size[0]), int(im.size[1])


#: The predictor :func:`predicted_boxes` records in ``boxes.json``.
BOX_PREDICTOR = "sv-projected-query-box"


def predicted_boxes(bench: Benchmark, matches: Mapping[int, Mapping[int, Any]]) -> dict[str, Any]:
    """``boxes.json`` of a run: the query box projected into each verified image with stored
    correspondences (:func:`oxbench.refinement.localize.predict_box`; the inlier box where the fit fails).

    Images whose size cannot be read without decoding (generated distractors) are not clipped.
    """
    from oxbench.refinement.localize import predict_box

    sizes: dict[int, tuple[int, int] | None] = {}
    queries: dict[str, dict[str, Any]] = {}
    for qi, per in sorted(matches.items()):
        bbox = bench.gt.queries[qi].bbox
        row: dict[str, Any] = {}
        for idx, pairs in per.items():
            if idx not in sizes:
                sizes[idx] = _image_size(bench, idx)
            size = sizes[idx] or (1 << 30, 1 << 30)
            found = predict_box(pairs, bbox, size)
            if found is not None:
                row[str(idx)] = {"box": list(found[0]), "how": found[1]}
        if row:
            queries[str(qi)] = row
    return {"predictor": BOX_PREDICTOR, "queries": queries}


# --- run folders ----------------------------------------------------------------------------------


def prepare_config_folder(
    config_dir: Path,
    config: dict[str, Any],
    *,
    overwrite: bool = False,
    only: tuple[str, ...] | None = None,
) -> None:
    """Check that ``config_dir`` may hold runs of ``config`` (it is created when a run completes).

    ``only`` compares just those keys of the configs: the runner's check before any data is loaded,
    when the dataset and the method are known but not the ground truth's digest.

    Raises:
        InputError: the folder holds another config, or is not an oxbench config folder, or is
            not a folder (``overwrite`` replaces another config's runs instead).
    """
    if config_dir.exists() and not config_dir.is_dir():
        raise InputError("run folder path exists and is not a folder", config_dir)
    cfg_path = config_dir / "config.json"
    if config_dir.is_dir() and not overwrite:
        if cfg_path.is_file() or cfg_path.is_symlink():
            try:
                found = read_record_json(cfg_path)  # bounded, regular files only, depth-limited
            except InputError as exc:
                raise InputError(
                    f"unreadable run config ({exc.problem}); use --overwrite to replace it",
                    cfg_path,
                ) from None
            if not isinstance(found, dict):
                raise InputError(
                    "run config is not a JSON object; use --overwrite to replace it", cfg_path
                )
            if only is not None:
                found, config = {k: found.get(k) for k in only}, {k: config.get(k) for k in only}
            if found != config:
                diff = sorted(k for k in set(found) | set(config) if found.get(k) != config.get(k))
                raise InputError(
                    f"run folder was written by another config (differs in: {', '.join(diff)}); "
                    "use another --out or --overwrite",
                    config_dir,
                )
        elif any(not p.name.startswith(".") for p in config_dir.iterdir()):
            raise InputError(
                "folder exists and is not an oxbench run folder; use another --out", config_dir
            )


class _RunLog(logging.FileHandler):
    """The run's ``run.log``: a write the OS refuses (a full disk) stops the log and is kept, to
    fail the run in one line at the end of its block, instead of ``logging`` printing a traceback
    for every later line."""

    failed: OSError | None = None

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        exc = sys.exc_info()[1]
        if self.failed is None:
            self.failed = exc if isinstance(exc, OSError) else OSError(str(exc))

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            super().emit(record)


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    handler = _RunLog(path, encoding="utf-8")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("oxbench")
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        with contextlib.suppress(OSError):
            handler.close()
    if handler.failed is not None:
        raise InputError(f"cannot write the run log: {os_reason(handler.failed)}", path)


def _write_run_files(
    tmp: Path,
    *,
    config: dict[str, Any],
    record: dict[str, Any],
    bench: Benchmark,
    search: SearchResult,
    result: EvaluationResult,
    timings: Mapping[str, float],
    info: Mapping[str, Any],
    top_k: int,
    trained_on_test: str | None,
) -> None:
    from oxbench.evaluation.ranking import to_revisitop

    k = min(top_k, search.ranks.shape[1])
    metrics = result.to_dict()
    metrics["run"] = {key: jsonable(v) for key, v in info.items()}
    retrieved = retrieved_records(bench, search.ranks, search.scores, k)
    dataset = dataset_checksums(bench)
    # the viewer shows only images under the roots recorded here (distractors may live elsewhere)
    distractor_images = [
        t["image"]
        for q in retrieved["queries"]
        for t in q["top"]
        if t["index"] >= bench.gt.n_db and t["image"] is not None
    ]
    dataset["distractors_root"] = (
        os.path.commonpath([str(Path(p).parent) for p in distractor_images])
        if distractor_images
        else None
    )
    summary = "\n".join([*result.lines(), "", result_table(result)])
    if trained_on_test:
        summary += f"\n{trained_on_test}\n"
    write_run_files(
        tmp,
        record=record,
        config=config,
        dataset=dataset,
        ranks_revisitop=to_revisitop(search.ranks),
        metrics=metrics,
        per_query=result.per_query_rows(),
        retrieved=retrieved,
        timings=timings,
        summary=summary,
        scores=None if search.scores is None else search.scores[:, :k].astype(np.float32),
        matches=search.matches,
        boxes=predicted_boxes(bench, search.matches) if search.matches else None,
    )


# --- the one way to run a method -----------------------------------------------------------------


def training_set_of(m: MethodConfig, dataset: str, train_dataset: str | None = None) -> str | None:
    """The dataset ``m`` learns on when run on ``dataset``: ``train_dataset``, else the default (the
    other city), or ``None`` when it learns nothing. A method that has no training data of its own
    (local features from files without a training file: ``m.learns_on_test_set``) learns on
    ``dataset`` itself, and the run is recorded as ``trained_on_test_set``.

    Raises:
        InputError: it learns and ``dataset`` has no default training set.
    """
    if not m.needs_training:
        return None
    if train_dataset is None and m.learns_on_test_set:
        return dataset
    train_id = train_dataset or DEFAULT_TRAIN_DATASET.get(dataset)
    if train_id is None:
        raise InputError(f"no default training set for {dataset!r}; pass --train-dataset")
    return train_id


def run(
    dataset: str = "synthetic",
    method: str | MethodConfig = DEFAULT_METHOD,
    session: Session | None = None,
    record: RecordOptions | None = None,
    *,
    train_dataset: str | None = None,
    distractors: str | int | None = None,
    dataset_options: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    seeds: Sequence[int] | str | None = None,
) -> RunOutcome:
    """Run ``method`` on ``dataset``, evaluate it, and keep a new run record.

    Args:
        dataset: dataset id (default: the synthetic benchmark, built on first use).
        method: a preset name (``oxbench.list_methods()``) or a method config.
        session: where and how the run executes (:class:`~oxbench.pipelines.session.Session`:
            data root, cache, executor, progress, strictness; default ``Session()``).
        record: what the run writes and where (:class:`~oxbench.pipelines.session.RecordOptions`:
            the config folder, the label, ``top_k``, ``ranks_top``, ``overwrite``).
        train_dataset: what the method learns on (default: the other city, or
            ``synthetic-train``); ignored by methods that learn nothing.
        distractors: distractors to add to the index (an id such as ``revisitop1m``, or a number
            of generated distractors for the synthetic set).
        dataset_options: options of the test dataset (:func:`oxbench.datasets.load`), e.g.
            ``{"orientation": "rotated"}`` for Holidays' hand-rotated copy; recorded in the config.
        overrides: method settings to change (``{"vocabulary.size": 4096, "features.max_side":
            512}``).
        seeds: run once per seed (``[0, 1, 2]`` or ``"0,1,2"``), each seed setting of the method
            set to it, every run in one config folder as one seed group
            (:mod:`oxbench.pipelines.seedgroup`); ``overwrite`` replaces earlier runs before the
            first member only.

    Returns:
        A :class:`RunOutcome`; with ``seeds``, the last member's, ``group`` holding every member's.

    Raises:
        InputError: unknown dataset/method/setting, missing data, a folder of another config.
    """
    session = session if session is not None else Session()
    record = record if record is not None else RecordOptions()
    request = RunRequest(
        dataset, method, train_dataset, distractors, dataset_options or {}, overrides or {}
    )
    if seeds is None:
        return run_once(request, session, record)
    base = resolve_method(method, **request.overrides)
    members = plan_group(base, check_seeds(seeds), dict(request.overrides))
    outcomes: list[RunOutcome] = []
    for i, member in enumerate(members):
        first = dataclasses.replace(record, overwrite=record.overwrite and i == 0)
        member_request = dataclasses.replace(request, method=base, overrides={})
        outcomes.append(run_once(member_request, session, first, member))
    return dataclasses.replace(outcomes[-1], group=tuple(outcomes))


@dataclass(frozen=True)
class PreparedRun:
    """A run checked before any data is loaded: the resolved method and what it reads.

    Attributes:
        request: what runs.
        method: the resolved method (a seed group member's seeds applied).
        base: the method the label and the config folder name (the group's seeds left out).
        label: the run's label (a distractor tag joins it once the distractors are known).
        labelled: whether the user gave the label.
        inputs: the files the settings name, by content.
        train_id: the training set's id (``None``: the method learns nothing).
        member: the seed group member this run is, if any.
        started: when the run began, with what was installed then.
    """

    request: RunRequest
    method: MethodConfig
    base: MethodConfig
    label: str
    labelled: bool
    inputs: Mapping[str, InputRecord]
    train_id: str | None
    member: SeedMember | None
    started: RunClock


@dataclass(frozen=True)
class RunClock:
    """When a run began (wall and CPU) and what was installed then (a package upgraded meanwhile
    is not what ran)."""

    started: datetime
    t0: float
    cpu0: float
    libraries: Mapping[str, str | None]
    commit: str | None
    host: Mapping[str, Any]

    @classmethod
    def now(cls) -> RunClock:
        return cls(
            datetime.now(UTC),
            time.perf_counter(),
            cpu_seconds(),
            versions(),
            git_commit(),
            host_facts(),
        )


@dataclass(frozen=True)
class LoadedRun:
    """A run's data loaded and its config resolved.

    Attributes:
        bench, train: the test set and the training set (``None``: nothing is learned).
        label: the run's label, with the distractor tag.
        config: the resolved run config; ``folder_config``: what its config folder holds.
        config_dir: the config folder.
        test_in_training: why the method learned on the test set, or ``None``.
        load_seconds: ``(wall, cpu)`` seconds of loading.
    """

    bench: Benchmark
    train: Benchmark | None
    label: str
    config: RunConfig
    folder_config: Mapping[str, Any]
    config_dir: Path
    test_in_training: str | None
    load_seconds: tuple[float, float]


@dataclass(frozen=True)
class ExecutedRun:
    """What a run computed: the method, its answer, its evaluation, what its steps recorded."""

    method: RetrievalMethod
    search: SearchResult
    ctx: RunContext
    result: EvaluationResult
    timings: Mapping[str, float]
    info: Mapping[str, Any]


def run_once(
    request: RunRequest,
    session: Session,
    record: RecordOptions,
    member: SeedMember | None = None,
) -> RunOutcome:
    """One run: :func:`prepare` (checks before any data), then, on the session's executor,
    :func:`load_run` (data and config), :func:`execute` (fit, index, search, evaluate) and
    :func:`write_record` (the run folder, assembled aside and renamed into place)."""
    prepared = prepare(request, session, record, member)
    with session.executor() as executor:
        loaded = load_run(prepared, session, record, executor)
        return write_record(prepared, loaded, session, record, executor)


def prepare(
    request: RunRequest, session: Session, record: RecordOptions, member: SeedMember | None
) -> PreparedRun:
    """Resolve the method and check what can be checked before any data is loaded or generated:
    its extras, its input files, its sources, the config folder."""
    clock = RunClock.now()
    m = resolve_method(request.method, **dict(request.overrides))
    base = m  # what the label and the config folder name: the seeds of a group left out
    if member is not None:
        m = member.apply(m)
    require_installed(m.requires)  # a missing extra or input is one line before any data
    m.check_inputs(session.data_root)
    check_sources(m)  # a global_source that is no global preset: one line before any data
    inputs = input_records(m.input_files(session.data_root), cache=session.cache_dir)
    label = record.label if record.label is not None else _default_label(base, inputs)
    train_id = training_set_of(m, request.dataset, request.train_dataset)
    if record.out is not None:  # a folder of another method or dataset, refused before any data
        method_dict = m.to_dict() if member is None else member.folder_method(m.to_dict())
        prepare_config_folder(
            Path(record.out),
            {"dataset": request.dataset, "method": method_dict},
            overwrite=record.overwrite,
            only=("dataset", "method"),
        )
    return PreparedRun(
        request, m, base, label, record.label is not None, inputs, train_id, member, clock
    )


def load_run(
    prepared: PreparedRun, session: Session, record: RecordOptions, executor: Executor
) -> LoadedRun:
    """Load (or render, for the synthetic cities) the test and training sets, check the run fits
    the machine, and resolve its config and config folder."""
    request, m, root = prepared.request, prepared.method, session.data_root
    t0, c0 = time.perf_counter(), cpu_seconds()
    if any(get_spec(d).family.generated for d in (request.dataset, prepared.train_id) if d):
        from oxbench.datasets.synthetic import ensure_default

        ensure_default(root, progress=session.progress, executor=executor)
    options: dict[str, Any] = dict(request.dataset_options)
    bench = load(
        request.dataset,
        root,
        distractors=request.distractors,
        strict=session.strict,
        progress=session.progress,
        images=m.reads_images,
        **options,  # load() validates the keys and values
    )
    train = (
        None
        if prepared.train_id is None
        else load(
            prepared.train_id,
            root,
            strict=session.strict,
            progress=session.progress,
            images=m.reads_images,
        )
    )
    load_seconds = (time.perf_counter() - t0, cpu_seconds() - c0)
    label = prepared.label
    if not prepared.labelled and bench.n_distractors:  # the count belongs in the label: +1K
        tag = distractor_tag(bench.n_distractors, request.distractors) + kind_tag(
            request.distractors
        )
        room = MAX_LABEL_CHARS - len(tag) - 1
        label = f"{label if len(label) <= room else label[: room - 4] + '...]'} {tag}"
    preflight_ram(m, bench, session.cache_dir)  # one line now, not an out-of-memory error hours in
    test_in_training = _test_data_in_training(m, train, bench)
    if test_in_training is not None:
        hint = (
            " (its local features have no training file: set features.train)"
            if m.learns_on_test_set and request.train_dataset is None
            else ""
        )
        log.warning("%s: %s%s; results are not comparable", m.name, test_in_training, hint)
    config = RunConfig(
        dataset=request.dataset,
        method=m,
        train_dataset=prepared.train_id,
        trained_on_test_set=test_in_training is not None,
        dataset_gt_sha256=gt_digest(bench.gt),
        crop=bench.crop,
        distractors=request.distractors,
        n_distractors=bench.n_distractors,
        strict=session.strict,
        ranks_top=record.ranks_top,
        dataset_options=request.dataset_options,
        inputs={k: r.content() for k, r in prepared.inputs.items()},
    )
    config_dict = config.to_dict()
    # a seed group's members share the folder: its config has the seeds replaced
    member = prepared.member
    folder_config = config_dict if member is None else member.folder_config(config_dict)
    config_dir = (
        Path(record.out)
        if record.out is not None
        else Path(record.runs_dir) / f"{request.dataset}-{m.name}-{json_digest(folder_config, 10)}"
    )
    prepare_config_folder(config_dir, folder_config, overwrite=record.overwrite)
    return LoadedRun(
        bench, train, label, config, folder_config, config_dir, test_in_training, load_seconds
    )


def execute(
    prepared: PreparedRun,
    loaded: LoadedRun,
    session: Session,
    record: RecordOptions,
    executor: Executor,
) -> ExecutedRun:
    """Fit, index and search (:func:`fit_index_search`), keep the top of each list, evaluate."""
    m, bench = prepared.method, loaded.bench
    impl, search, ctx = fit_index_search(m, loaded.train, bench, session, executor)
    ctx.timings["load"], ctx.timings[f"load{CPU_SUFFIX}"] = loaded.load_seconds
    keep = record.ranks_top
    if keep is None:
        keep = None if search.ranks.shape[1] <= 100_000 else 10_000
    search = search.top(keep)
    with ctx.timed("evaluate"):
        result = evaluate(
            bench.gt,
            search.ranks,
            n_distractors=bench.n_distractors,
            source=str(loaded.config_dir),
            scores=search.scores,  # the protocols that score ties (ILIAS) read them
        )
    clock = prepared.started
    timings = {
        **ctx.timings,
        "total": time.perf_counter() - clock.t0,
        f"total{CPU_SUFFIX}": cpu_seconds() - clock.cpu0,
    }
    info = {
        **impl.provenance(),
        **search.info,
        "trained_on_test_set": loaded.test_in_training is not None,
    }
    if loaded.test_in_training is not None:
        info["trained_on_test_set_why"] = loaded.test_in_training
    for step, state in ctx.steps.items():
        n = f" ({ctx.computed[step]} items)" if step in ctx.computed else ""
        log.info("step %s: %s%s", step, "from cache" if state == "hit" else "computed", n)
    log.info("%s", " | ".join(result.lines()))
    return ExecutedRun(impl, search, ctx, result, timings, info)


def fit_index_search(
    m: MethodConfig,
    train: Benchmark | None,
    bench: Benchmark,
    session: Session,
    executor: Executor,
) -> tuple[RetrievalMethod, SearchResult, RunContext]:
    """Fit, index and search (single-threaded learned steps when the session is deterministic).
    A corrupt cache file met late is deleted and the steps rerun once, checking every cached file
    in full, so the result is the one a clean cache gives."""
    for full_check in (False, True):
        ctx = session.context(executor, full_check=full_check)
        impl = m.build()
        try:
            with single_threaded(session.deterministic):
                impl.fit(train, ctx).index(bench, ctx)
                return impl, impl.search(bench, ctx), ctx
        except CorruptCache as exc:
            if full_check:
                raise
            log.warning(
                "%s; deleting it and running the steps again, checking every cached file in full",
                exc,
            )
            exc.remove()
    raise AssertionError("unreachable")  # pragma: no cover


#: A run folder being assembled: ``<TEMP_PREFIX><config folder>-<run id>`` (:func:`new_run_id`).
_RUN_TEMP = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{4}")


def _remove_dead_run_folders(config_dir: Path, *, older_than_s: float = 86400.0) -> None:
    """Remove the run folders that killed runs of this config left half-assembled beside it: only
    folders named as :func:`write_record` names them, holding its ``run.log``, untouched for
    ``older_than_s`` (a live run writes its log as it goes), never through a link."""
    prefix = f"{TEMP_PREFIX}{config_dir.name}-"
    with contextlib.suppress(OSError):
        for entry in os.scandir(config_dir.parent):
            if not (
                entry.name.startswith(prefix)
                and _RUN_TEMP.fullmatch(entry.name[len(prefix) :])
                and entry.is_dir(follow_symlinks=False)
            ):
                continue
            log_file = Path(entry.path) / "run.log"
            with contextlib.suppress(OSError):
                st = log_file.lstat()
                if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime > older_than_s:
                    shutil.rmtree(entry.path, ignore_errors=True)


def write_record(
    prepared: PreparedRun,
    loaded: LoadedRun,
    session: Session,
    record: RecordOptions,
    executor: Executor,
) -> RunOutcome:
    """Execute the run with its log in a run folder assembled beside the config folder, write
    every file of the record there, and rename it into place (the config folder appears only
    when a run completes; a crashed run leaves nothing that looks finished)."""
    config_dir, m = loaded.config_dir, prepared.method
    run_id = new_run_id()
    tmp = config_dir.parent / f"{TEMP_PREFIX}{config_dir.name}-{run_id}"
    _remove_dead_run_folders(config_dir)
    try:
        tmp.mkdir(parents=True)
    except OSError as exc:
        raise InputError(f"cannot create the run folder: {os_reason(exc)}", tmp.parent) from None
    with temporary_in_flight(tmp):  # removed even by a forced exit (cli.stop_on_signals)
        try:
            with _log_to(tmp / "run.log"):
                log.info(
                    "run %s: %s on %s (train: %s) -> %s",
                    run_id,
                    m.name,
                    loaded.config.dataset,
                    prepared.train_id,
                    config_dir,
                )
                done = execute(prepared, loaded, session, record, executor)
            facts = run_facts(prepared, loaded, done, session, executor, run_id, record)
            _write_run_files(
                tmp,
                config=loaded.config.to_dict(),
                record=facts,
                bench=loaded.bench,
                search=done.search,
                result=done.result,
                timings=done.timings,
                info=done.info,
                top_k=record.top_k,
                trained_on_test=trained_on_test_note(loaded.config),
            )
            run_dir = _commit_run(tmp, config_dir, run_id, loaded.folder_config, record.overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return RunOutcome(
        run_dir, config_dir, done.result, loaded.config, done.timings, done.info, facts
    )


def run_facts(
    prepared: PreparedRun,
    loaded: LoadedRun,
    done: ExecutedRun,
    session: Session,
    executor: Executor,
    run_id: str,
    record: RecordOptions,
) -> dict[str, Any]:
    """``record.json`` (:class:`~oxbench.records.RecordFile`): who ran what, where, from what, and
    what it cost; the executor's facts and the footprint checked as any reader checks them."""
    clock, m, bench = prepared.started, prepared.method, loaded.bench
    footprint = _footprint(done.method)
    member = prepared.member
    facts = RecordFile(
        format=RECORD_FORMAT,
        run_id=run_id,
        status="complete",
        command=tuple(record.command if record.command is not None else sys.argv),
        started=clock.started.isoformat(),
        ended=datetime.now(UTC).isoformat(),
        oxbench_version=clock.libraries["oxbench"],
        git_commit=clock.commit,
        host=dict(clock.host),
        versions=dict(clock.libraries),
        plugins=loaded_plugins(),
        accel=_accel_used(),
        cache=dict(done.ctx.steps),
        cache_computed=dict(done.ctx.computed),
        method=m.name,
        label=loaded.label,
        family=m.family,
        dataset=loaded.config.dataset,
        cache_dir=str(done.ctx.cache),
        execution=ExecutionFacts.from_dict(executor.describe()),
        footprint=None if footprint is None else FootprintFacts.from_dict(footprint),
        inputs=run_inputs(bench, prepared.inputs, done.ctx.cache),
        seeds=run_seeds(m, bench, loaded.train),
        deterministic=session.deterministic,
        seed_group=None if member is None else SeedGroupFacts.from_dict(member.to_dict()),
        preprocessing=done.info.get("preprocessing"),
    )
    return facts.to_dict()


def _commit_run(
    tmp: Path, config_dir: Path, run_id: str, folder_config: Mapping[str, Any], overwrite: bool
) -> Path:
    """Rename the assembled run folder into its config folder (under the folder's lock; with
    ``overwrite``, earlier runs removed first); the run folder."""
    run_dir = config_dir / run_id
    try:
        config_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the run folder: {os_reason(exc)}", config_dir) from None
    with file_lock(config_dir / ".lock", wait=600.0, what=str(config_dir)):
        if overwrite:
            for old in list_runs(config_dir):
                shutil.rmtree(old, ignore_errors=True)
        atomic_write_json(config_dir / "config.json", dict(folder_config))
        os.replace(tmp, run_dir)
    return run_dir


def trained_on_test_note(config: RunConfig) -> str | None:
    """The NOTE a run trained on the test set ends with (``None`` for one that is not), naming
    what gives it training data of its own: ``--set features.train=PATH`` for local features read
    from files without a training file, else ``--train-dataset``."""
    if not config.trained_on_test_set:
        return None
    how = (
        "--set features.train=PATH (the training set's features, same layout)"
        if getattr(config.method, "learns_on_test_set", False)
        else "--train-dataset DATASET"
    )
    return (
        f"NOTE: the method was trained on the test set; not comparable. Train elsewhere with {how}."
    )


def _default_label(m: MethodConfig, inputs: Mapping[str, InputRecord]) -> str:
    """The preset name plus the changed settings; with input files, ``@`` and their content digest
    (:func:`oxbench.provenance.inputs_digest`), so runs on other files never share a label."""
    label = preset_label(m.name, m.to_dict())
    if not inputs:
        return label
    tag = f" @{inputs_digest(inputs)}"
    return label[: MAX_LABEL_CHARS - len(tag)] + tag


def _test_data_in_training(
    m: MethodConfig, train: Benchmark | None, bench: Benchmark
) -> str | None:
    """Why the method learns on the test set, from content: the training set is the test set or has
    its ground truth, or the method's own training files hold the test data; ``None`` if not."""
    if train is not None:
        if train.id == bench.id:
            return f"trained on the test set {bench.id}"
        if gt_digest(train.gt) == gt_digest(bench.gt):
            return f"the training set {train.id} has the ground truth of the test set {bench.id}"
    return m.test_data_in_training(bench)


def run_inputs(bench: Benchmark, inputs: Mapping[str, InputRecord], cache: Path) -> dict[str, Any]:
    """``record.json``'s ``inputs``: every input by absolute path, size and SHA-256
    (:func:`oxbench.provenance.input_record`) -- the files the settings name, the file (or folder
    of text files) the ground truth was read from, the small files at the top of the dataset folder,
    and the image sets (``None`` where the run reads no pixels)."""
    images: dict[str, Any] = {}
    for part, source in (
        ("database", bench.database),
        ("queries", bench.queries),
        ("distractors", bench.distractors),
    ):
        paths = [] if source is None else [source.path(i) for i in range(len(source))]
        files = [p for p in paths if p is not None]
        images[part] = image_set_record(files, cache=cache) if files else None
    gt_source = Path(bench.gt.source)
    return {
        "settings": {k: r.to_dict() for k, r in inputs.items()},
        "ground_truth": (
            input_record(gt_source, cache=cache).to_dict() if gt_source.exists() else None
        ),
        "dataset_files": {
            p.name: input_record(p, cache=cache).to_dict() for p in dataset_files(bench)
        },
        "images": images,
    }


def run_seeds(m: MethodConfig, bench: Benchmark, train: Benchmark | None) -> dict[str, int]:
    """``record.json``'s ``seeds``: every seed setting of the method (:func:`oxbench.schema.seed_settings`:
    ``vocabulary.seed``, ``he.seed``, ``search.seed``, a descriptor kind's ``descriptor.seed`` ...) and the
    generation seed of a synthetic test or training set (``dataset.seed``, ``train_dataset.seed``)."""
    out = seed_settings(m)
    for key, b in (("dataset", bench), ("train_dataset", train)):
        seed = None if b is None else b.options.get("seed")
        if seed is not None and str(seed).isdigit():
            out[f"{key}.seed"] = int(seed)
    return out


def preflight_ram(m: MethodConfig, bench: Benchmark, cache: Path) -> None:
    """Refuse (one line) a run whose index will not fit in the RAM available or whose new files
    will not fit on the cache's disk, and announce a long one, before any work
    (:func:`oxbench.pipelines.estimates.preflight`: the dataset's actual feature counts where known)."""
    from oxbench.pipelines.estimates import preflight

    preflight(m, bench, cache)


def _footprint(impl: RetrievalMethod) -> dict[str, Any] | None:
    """``record.json``'s ``footprint``: the index's measured RAM and disk (``None``: not measured)."""
    fp = impl.footprint()
    return None if fp is None else fp.to_dict()


def _accel_used() -> bool:
    return accelerated()
