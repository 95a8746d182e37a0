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
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.cache import CorruptCache
from oxbench.datasets import load
from oxbench.datasets.base import Benchmark
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import get_spec
from oxbench.datasets.synthetic.distractor_kinds import kind_tag
from oxbench.errors import InputError, require_installed
from oxbench.evaluation import evaluate
from oxbench.evaluation.kernels import accelerated
from oxbench.evaluation.result import EvaluationResult
from oxbench.execution import Executor, cpu_seconds, make_executor
from oxbench.execution.determinism import single_threaded
from oxbench.features.store import DEFAULT_SHARD_SIZE
from oxbench.fileio import (
    TEMP_PREFIX,
    atomic_write_json,
    file_lock,
    json_digest,
    os_reason,
)
from oxbench.pipelines.method import (
    CPU_SUFFIX,
    MethodConfig,
    RetrievalMethod,
    RunContext,
    SearchResult,
)
from oxbench.pipelines.presets import DEFAULT_METHOD, resolve_method
from oxbench.pipelines.seedgroup import SeedMember, check_seeds, plan_group
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
    RunSummary,
    check_label,
    distractor_tag,
    find_runs,
    jsonable,
    list_runs,
    new_run_id,
    preset_label,
    read_record_json,
    retrieved_document,
    write_run_files,
)
from oxbench.registry import loaded_plugins
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

    import oxbench

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "oxbench": oxbench.__version__,
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
    import oxbench

    here = Path(oxbench.__file__).resolve().parent
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


@contextlib.contextmanager
def _log_to(path: Path) -> Iterator[None]:
    handler = logging.FileHandler(path, encoding="utf-8")
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
        handler.close()


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
    trained_on_test: bool,
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
    summary = "\n".join([*result.lines(), "", result.table()])
    if trained_on_test:
        summary += "\nNOTE: the method was trained on the test set; not comparable.\n"
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
    *,
    root: str | Path | None = None,
    out: str | Path | None = None,
    runs_dir: str | Path = "runs",
    cache: str | Path | None = None,
    train_dataset: str | None = None,
    overrides: Mapping[str, object] | None = None,
    workers: int | None = 1,
    engine: str = "processes",
    engine_options: Mapping[str, object] | None = None,
    wait_workers: float | None = None,
    shard_size: int | None = None,
    progress: bool = True,
    distractors: str | int | None = None,
    strict: bool = True,
    ranks_top: int | None = None,
    top_k: int = 100,
    overwrite: bool = False,
    command: Sequence[str] | None = None,
    label: str | None = None,
    dataset_options: Mapping[str, str] | None = None,
    deterministic: bool = False,
    verify_images: bool = False,
    seeds: Sequence[int] | str | None = None,
    seed_member: SeedMember | None = None,
) -> RunOutcome:
    """Run ``method`` on ``dataset``, evaluate it, and keep a new run record.

    Args:
        dataset: dataset id (default: the synthetic benchmark, built on first use).
        method: a preset name (``oxbench.list_methods()``) or a method config.
        root: data root (default ``$OXBENCH_DATA`` or the per-user default).
        out: the config folder (default ``<runs_dir>/<dataset>-<method>-<config digest>``).
        runs_dir: parent of default config folders.
        cache: cache of features, vocabularies, descriptors (default ``<root>/_cache``).
        train_dataset: what the method learns on (default: the other city, or
            ``synthetic-train``); ignored by methods that learn nothing.
        overrides: method settings to change (``{"vocab_size": 4096, "features.max_side": 512}``).
        workers: workers of the parallel stages (local-feature extraction, word assignment,
            spatial verification, VLAD aggregation), run by the ``engine`` executor (``None``:
            one per available core).
        engine: the execution backend (:data:`oxbench.execution.EXECUTORS`: ``processes``,
            ``serial``, ``dask``, or a plugin's).
        engine_options: the backend's own options (:func:`oxbench.execution.make_executor`),
            e.g. ``{"address": "tcp://host:8786"}`` for an existing Dask cluster (default
            ``$OXBENCH_CLUSTER``, else an embedded LocalCluster).
        wait_workers: with an existing cluster, seconds to wait for ``workers`` of its workers
            (default 10; a batch system's workers may wait in its queue: give it minutes); short
            for ``engine_options={"wait_workers_s": ...}``.
        shard_size: images per write-once shard of the local-feature stores (default 64).
        progress: tqdm bars.
        distractors: distractors to add to the index (an id such as ``revisitop1m``, or a number
            of generated distractors for the synthetic set).
        strict: refuse datasets whose image counts differ from the official ones; ``False``
            (partial data) is recorded in the config and the results are not comparable.
        ranks_top: keep (save and evaluate) the top this many of each ranked list; default: all
            when the index holds at most 100,000 images, else 10,000 (as revisitop's R1M files).
        top_k: how many retrieved images per query ``retrieved.json`` records (names, labels,
            scores).
        overwrite: replace earlier runs in the config folder (and a folder of another config).
        command: the command line to record (default ``sys.argv``).
        label: the run's name in ``runs``, ``compare``, ``report``, ``plot`` and ``view``
            (:func:`oxbench.records.check_label`); default: the preset name plus the settings that
            differ from the preset (``features-alpha-qe [whitening=pca]``).
        dataset_options: options of the test dataset (:func:`oxbench.datasets.load`), e.g.
            ``{"orientation": "rotated"}`` for Holidays' hand-rotated copy; recorded in the config.
        deterministic: run the steps with one BLAS / faiss thread, so that what they learn does not
            depend on ``workers`` or the cores (:mod:`oxbench.execution.determinism`; recorded).
        verify_images: compare every image with the file its cached local features were
            described from by its bytes (a full read and hash), not only by ``stat``.
        seeds: run once per seed (``[0, 1, 2]`` or ``"0,1,2"``), each seed setting of the method
            set to it, every run in one config folder as one seed group
            (:mod:`oxbench.pipelines.seedgroup`); ``overwrite`` replaces earlier runs before the
            first member only.
        seed_member: the one member of a seed group to run (what ``seeds`` runs once per seed).

    Returns:
        A :class:`RunOutcome`; with ``seeds``, the last member's, ``group`` holding every member's.

    Raises:
        InputError: unknown dataset/method/setting, missing data, a folder of another config.
    """

    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if seeds is not None:
        if seed_member is not None:
            raise InputError("give seeds or seed_member, not both")
        base = resolve_method(method, **dict(overrides or {}))
        members = plan_group(base, check_seeds(seeds), dict(overrides or {}))
        outcomes: list[RunOutcome] = []
        for i, member in enumerate(members):
            outcomes.append(
                run(
                    dataset,
                    base,
                    root=root,
                    out=out,
                    runs_dir=runs_dir,
                    cache=cache,
                    train_dataset=train_dataset,
                    workers=workers,
                    engine=engine,
                    engine_options=engine_options,
                    wait_workers=wait_workers,
                    shard_size=shard_size,
                    progress=progress,
                    distractors=distractors,
                    strict=strict,
                    ranks_top=ranks_top,
                    top_k=top_k,
                    overwrite=overwrite and i == 0,
                    command=command,
                    label=label,
                    dataset_options=dataset_options,
                    deterministic=deterministic,
                    verify_images=verify_images,
                    seed_member=member,
                )
            )
        return replace(outcomes[-1], group=tuple(outcomes))
    if label is not None:
        check_label(label)
    started = datetime.now(UTC)
    t_start, cpu_start = time.perf_counter(), cpu_seconds()
    # what ran is what was installed when the run began (a package upgraded meanwhile is not it)
    libraries, commit, host = versions(), git_commit(), host_facts()
    root_path = data_root(root)
    m = resolve_method(method, **dict(overrides or {}))
    base = m  # what the label and the config folder name: the seeds of a group left out
    if seed_member is not None:
        m = seed_member.apply(m)
    require_installed(
        m.requires
    )  # a missing extra or input is one line before any data is loaded or generated
    m.check_inputs(root_path)
    check_sources(m)  # a global_source that is no global preset: one line before any data
    cache_dir = Path(cache) if cache is not None else root_path / "_cache"
    inputs = input_records(m.input_files(root_path), cache=cache_dir)
    labelled = label is not None
    if label is None:
        label = _default_label(base, inputs)
    train_id = training_set_of(m, dataset, train_dataset)
    if (
        out is not None
    ):  # a folder of another method or dataset is refused before data is loaded or generated
        prepare_config_folder(
            Path(out),
            {
                "dataset": dataset,
                "method": m.to_dict()
                if seed_member is None
                else seed_member.folder_method(m.to_dict()),
            },
            overwrite=overwrite,
            only=("dataset", "method"),
        )
    if wait_workers is not None:
        engine_options = {**(engine_options or {}), "wait_workers_s": wait_workers}
    executor = make_executor(engine, workers, options=engine_options)
    try:  # a cluster the executor started stops with the run, whatever happens
        # a cluster's workers must see the data and the cache: asked before anything is loaded
        executor.check_paths(
            {
                "data root": root_path,
                "cache": Path(cache) if cache is not None else root_path / "_cache",
            }
        )
        t0, c0 = time.perf_counter(), cpu_seconds()
        if any(get_spec(d).family.generated for d in (dataset, train_id) if d):
            # the two default cities are rendered on first use through the run's engine
            from oxbench.datasets.synthetic import ensure_default

            ensure_default(root_path, progress=progress, executor=executor)
        ds_options = {k: str(v) for k, v in (dataset_options or {}).items()}
        extra: dict[str, Any] = dict(ds_options)  # load(**options) validates the keys and values
        bench = load(
            dataset,
            root_path,
            distractors=distractors,
            strict=strict,
            progress=progress,
            images=m.reads_images,
            **extra,
        )
        train = (
            None
            if train_id is None
            else load(train_id, root_path, strict=strict, progress=progress, images=m.reads_images)
        )
        t_load, cpu_load = time.perf_counter() - t0, cpu_seconds() - c0
        if not labelled and bench.n_distractors:  # the count belongs in the label: +1K, +R1M
            tag = distractor_tag(bench.n_distractors, distractors) + kind_tag(distractors)
            room = MAX_LABEL_CHARS - len(tag) - 1
            label = f"{label if len(label) <= room else label[: room - 4] + '...]'} {tag}"
        preflight_ram(m, bench, cache_dir)  # one line now, not an out-of-memory error hours in
        test_in_training = _test_data_in_training(m, train, bench)
        trained_on_test = test_in_training is not None
        if trained_on_test:
            hint = (
                " (its local features have no training file: set features.train)"
                if m.learns_on_test_set and train_dataset is None
                else ""
            )
            log.warning("%s: %s%s; results are not comparable", m.name, test_in_training, hint)
        config = RunConfig(
            dataset=dataset,
            method=m,
            train_dataset=train_id,
            trained_on_test_set=trained_on_test,
            dataset_gt_sha256=gt_digest(bench.gt),
            crop=bench.crop,
            distractors=distractors,
            n_distractors=bench.n_distractors,
            strict=strict,
            ranks_top=ranks_top,
            dataset_options=ds_options,
            inputs={k: r.content() for k, r in inputs.items()},
        )
        config_dict = config.to_dict()
        # a seed group's members share the folder: its config has the seeds replaced
        folder_config = (
            config_dict if seed_member is None else seed_member.folder_config(config_dict)
        )
        config_dir = (
            Path(out)
            if out is not None
            else Path(runs_dir) / f"{dataset}-{m.name}-{json_digest(folder_config, 10)}"
        )
        prepare_config_folder(config_dir, folder_config, overwrite=overwrite)
        run_id = new_run_id()
        # assembled beside the config folder, which appears only when a run completes
        tmp = config_dir.parent / f"{TEMP_PREFIX}{config_dir.name}-{run_id}"
        try:
            tmp.mkdir(parents=True)
        except OSError as exc:
            raise InputError(
                f"cannot create the run folder: {os_reason(exc)}", tmp.parent
            ) from None
        try:
            with _log_to(tmp / "run.log"):
                log.info(
                    "run %s: %s on %s (train: %s) -> %s",
                    run_id,
                    m.name,
                    dataset,
                    train_id,
                    config_dir,
                )
                with single_threaded(deterministic):
                    impl, search, ctx = _fit_index_search(
                        m,
                        train,
                        bench,
                        cache_dir,
                        executor=executor,
                        progress=progress,
                        allow_partial=not strict,
                        root=root_path,
                        shard_size=shard_size,
                        verify_images=verify_images,
                    )
                ctx.timings["load"], ctx.timings[f"load{CPU_SUFFIX}"] = t_load, cpu_load
                keep = (
                    ranks_top
                    if ranks_top is not None
                    else (None if search.ranks.shape[1] <= 100_000 else 10_000)
                )
                search = search.top(keep)
                with ctx.timed("evaluate"):
                    result = evaluate(
                        bench.gt,
                        search.ranks,
                        n_distractors=bench.n_distractors,
                        source=str(config_dir),
                    )
                timings = {
                    **ctx.timings,
                    "total": time.perf_counter() - t_start,
                    f"total{CPU_SUFFIX}": cpu_seconds() - cpu_start,
                }
                info = {**impl.provenance(), **search.info, "trained_on_test_set": trained_on_test}
                if test_in_training is not None:
                    info["trained_on_test_set_why"] = test_in_training
                for step, state in ctx.steps.items():
                    n = f" ({ctx.computed[step]} items)" if step in ctx.computed else ""
                    log.info(
                        "step %s: %s%s", step, "from cache" if state == "hit" else "computed", n
                    )
                log.info("%s", " | ".join(result.lines()))
            record = {
                "format": RECORD_FORMAT,
                "run_id": run_id,
                "status": "complete",
                "command": list(command if command is not None else sys.argv),
                "started": started.isoformat(),
                "ended": datetime.now(UTC).isoformat(),
                "oxbench_version": libraries["oxbench"],
                "git_commit": commit,
                "host": host,
                "versions": libraries,
                "plugins": loaded_plugins(),
                "accel": _accel_used(),
                "cache": dict(ctx.steps),
                "cache_computed": dict(ctx.computed),
                "method": m.name,
                "label": label,
                "family": m.family,
                "dataset": dataset,
                "cache_dir": str(ctx.cache),
                "execution": executor.describe(),
                "footprint": _footprint(impl),
                "inputs": run_inputs(bench, inputs, cache_dir),
                "seeds": run_seeds(m, bench, train),
                "deterministic": deterministic,
            }
            if seed_member is not None:
                record["seed_group"] = seed_member.to_dict()
            _write_run_files(
                tmp,
                config=config_dict,
                record=record,
                bench=bench,
                search=search,
                result=result,
                timings=timings,
                info=info,
                top_k=top_k,
                trained_on_test=trained_on_test,
            )
            run_dir = config_dir / run_id
            try:
                config_dir.mkdir(exist_ok=True)
            except OSError as exc:
                raise InputError(
                    f"cannot create the run folder: {os_reason(exc)}", config_dir
                ) from None
            with file_lock(config_dir / ".lock", wait=600.0, what=str(config_dir)):
                if overwrite:
                    for old in list_runs(config_dir):
                        shutil.rmtree(old, ignore_errors=True)
                atomic_write_json(config_dir / "config.json", folder_config)
                os.replace(tmp, run_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return RunOutcome(run_dir, config_dir, result, config, timings, info, record)
    finally:
        executor.close()


def _fit_index_search(
    m: MethodConfig,
    train: Benchmark | None,
    bench: Benchmark,
    cache: Path,
    *,
    executor: Executor,
    progress: bool,
    allow_partial: bool = False,
    root: Path | None = None,
    shard_size: int | None = None,
    verify_images: bool = False,
) -> tuple[RetrievalMethod, SearchResult, RunContext]:
    """fit / index / search; a corrupt cache file met late is deleted and the steps rerun once,
    checking every cached file in full, so the result is the one a clean cache gives."""
    for full_check in (False, True):
        ctx = RunContext(
            cache,
            executor=executor,
            progress=progress,
            full_check=full_check,
            verify_images=verify_images,
            allow_partial=allow_partial,
            root=root,
            shard_size=shard_size or DEFAULT_SHARD_SIZE,
        )
        impl = m.build()
        try:
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
    ``vocab_seed``, ``he_seed``, ``index_seed``, a descriptor kind's ``descriptor.seed`` ...) and the
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
    (:func:`oxbench.index.estimates.preflight`: the dataset's actual feature counts where known)."""
    from oxbench.index.estimates import preflight

    preflight(m, bench, cache)


def _footprint(impl: RetrievalMethod) -> dict[str, Any] | None:
    """``record.json``'s ``footprint``: the index's measured RAM and disk (``None``: not measured)."""
    fp = impl.footprint()
    return None if fp is None else fp.to_dict()


def _accel_used() -> bool:
    return accelerated()
