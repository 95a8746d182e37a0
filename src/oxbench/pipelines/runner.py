"""Run a named method on a dataset end to end and write a self-describing run folder.

A run folder holds everything needed to trust and reproduce a number::

    config.json        resolved configuration (dataset, method settings, vocabulary training set)
    versions.json      python, numpy, scipy, opencv, faiss, oxbench
    dataset.json       ground-truth digest and sha256 of the dataset's small files (gnd, manifest)
    ranks.npy          int64 rankings in the revisitop layout (n_index, n_queries)
    metrics.json       the evaluation (EvaluationResult.to_dict) plus run facts
    per_query.csv/json per-query AP and P@K
    timings.json       seconds per stage
    summary.txt        the printed lines and table

The folder is assembled under a temporary name and renamed into place when complete, so a crashed
run never leaves a folder that looks finished. An existing folder written under another config is
refused unless ``force=True``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.pipelines import bow
from oxbench.pipelines.presets import DEFAULT_METHOD, BowMethod, resolve_method

log = logging.getLogger(__name__)

RUN_FILES = (
    "config.json", "versions.json", "dataset.json", "ranks.npy", "metrics.json",
    "per_query.csv", "per_query.json", "timings.json", "summary.txt",
)
SYNTHETIC_IDS = ("synthetic", "synthetic-train")
_CHECKSUM_SUFFIXES = {".pkl", ".tsv", ".json", ".txt", ".csv", ".dat"}
_CHECKSUM_MAX_BYTES = 64 << 20


@dataclass(frozen=True)
class RunOutcome:
    """What :func:`run_method` returns.

    Attributes:
        run_dir: the run folder.
        result: the :class:`~oxbench.evaluation.result.EvaluationResult`.
        config: the resolved configuration (as written to ``config.json``).
        timings: seconds per stage.
        info: facts of the run (vocabulary provenance, verified images per query, ...).
    """

    run_dir: Path
    result: Any
    config: dict[str, Any]
    timings: dict[str, float]
    info: dict[str, Any]


def versions() -> dict[str, str | None]:
    """Versions of everything that changes the numbers."""
    import scipy

    import oxbench

    out: dict[str, str | None] = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "oxbench": oxbench.__version__,
        "platform": platform.platform(),
    }
    try:
        import cv2

        out["opencv"] = cv2.__version__
    except ImportError:  # pragma: no cover
        out["opencv"] = None
    try:
        from oxbench.index.faiss_setup import load_faiss

        out["faiss"] = load_faiss().__version__
    except ImportError:  # pragma: no cover
        out["faiss"] = None
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dataset_checksums(bench: Benchmark) -> dict[str, Any]:
    """Ground-truth digest plus sha256 of the small files at the top of the dataset folder."""
    files: dict[str, str] = {}
    if bench.root is not None and Path(bench.root).is_dir():
        for p in sorted(Path(bench.root).iterdir()):
            if p.is_file() and p.suffix in _CHECKSUM_SUFFIXES and p.stat().st_size <= _CHECKSUM_MAX_BYTES:
                files[p.name] = _sha256(p)
    return {"id": bench.id, "gt_sha256": bow.gt_digest(bench.gt), "files_sha256": files, **bench.describe()}


def load_benchmark(
    dataset: str,
    root: Path,
    *,
    distractors: str | int | None = None,
    strict: bool = True,
    progress: bool = True,
) -> Benchmark:
    """Load a dataset by id, building the synthetic default first when it is asked for.

    Args:
        dataset: dataset id.
        root: data root.
        distractors: distractor set id (``revisitop1m``) or, for the synthetic set, a number of
            generated distractors.
        strict: refuse a dataset whose image counts differ from the official ones.
        progress: progress bars while the synthetic default is generated.
    """
    if dataset in SYNTHETIC_IDS:
        from oxbench.datasets.synthetic import ensure_default, load_synthetic

        ensure_default(root, progress=progress)
        if distractors is not None and not isinstance(distractors, int):
            raise InputError("the synthetic benchmark takes a number of generated distractors")
        return load_synthetic(Path(root) / dataset, distractors=distractors)
    from oxbench import datasets

    return datasets.load(dataset, root, distractors=distractors, strict=strict)


def _config_digest(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:10]


def check_run_folder(run_dir: Path, config: dict[str, Any], *, force: bool = False) -> None:
    """Refuse a run folder that holds results of another config (unless ``force``).

    Raises:
        InputError: the folder exists and is not an oxbench run of this config.
    """
    if not run_dir.exists():
        return
    cfg_path = run_dir / "config.json"
    if force:
        return
    if not run_dir.is_dir():
        raise InputError("run folder path exists and is not a folder", run_dir)
    if not cfg_path.is_file():
        if any(run_dir.iterdir()):
            raise InputError("folder exists and is not an oxbench run folder; use another --out or --force", run_dir)
        return
    try:
        found = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise InputError(f"unreadable run config ({exc}); use --force to overwrite", cfg_path) from None
    if found != config:
        diff = sorted(k for k in set(found) | set(config) if found.get(k) != config.get(k))
        raise InputError(
            f"run folder was written by another config (differs in: {', '.join(diff)}); "
            "use another --out or --force",
            run_dir,
        )


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")


def write_run_folder(
    run_dir: Path,
    *,
    config: dict[str, Any],
    bench: Benchmark,
    ranks: np.ndarray,
    result: Any,
    timings: dict[str, float],
    info: dict[str, Any],
    force: bool = False,
) -> Path:
    """Assemble the run folder under a temporary name, then rename it into place."""
    import csv

    from oxbench.evaluation.ranking import to_revisitop

    check_run_folder(run_dir, config, force=force)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = run_dir.with_name(f".{run_dir.name}.partial-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "versions.json", versions())
        _write_json(tmp / "dataset.json", dataset_checksums(bench))
        np.save(tmp / "ranks.npy", to_revisitop(ranks))
        metrics = result.to_dict()
        metrics["run"] = {
            "trained_on": info.get("trained_on"),
            "trained_on_test_set": info.get("trained_on_test_set"),
            "vocabulary": info.get("vocabulary"),
            "verified_per_query": info.get("verified_per_query"),
            "features_per_image": info.get("features_per_image"),
        }
        _write_json(tmp / "metrics.json", metrics)
        rows = result.per_query_rows()
        _write_json(tmp / "per_query.json", rows)
        with open(tmp / "per_query.csv", "w", newline="") as fh:
            if rows:
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
        _write_json(tmp / "timings.json", timings)
        summary = "\n".join([*result.lines(), "", result.table()])
        if info.get("trained_on_test_set"):
            summary += "\nNOTE: the vocabulary was trained on the test set; not comparable.\n"
        (tmp / "summary.txt").write_text(summary + "\n")
        if run_dir.exists():
            old = run_dir.with_name(f".{run_dir.name}.old-{os.getpid()}")
            os.replace(run_dir, old)
            os.replace(tmp, run_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, run_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return run_dir


def run_method(
    dataset: str = "synthetic",
    method: str | BowMethod = DEFAULT_METHOD,
    *,
    root: str | Path | None = None,
    out: str | Path | None = None,
    runs_dir: str | Path = "runs",
    cache: str | Path | None = None,
    train_dataset: str | None = None,
    vocab_size: int | None = None,
    overrides: dict[str, object] | None = None,
    workers: int = 1,
    force: bool = False,
    progress: bool = True,
    distractors: str | int | None = None,
    strict: bool = True,
    ranks_top: int | None = None,
) -> RunOutcome:
    """Run ``method`` on ``dataset``, evaluate it, and write the run folder.

    Args:
        dataset: dataset id (default: the synthetic benchmark, built on first use).
        method: preset name or a :class:`BowMethod`.
        root: data root (see :func:`oxbench.datasets.paths.data_root`).
        out: run folder (default ``<runs_dir>/<dataset>-<method>-<config digest>``).
        runs_dir: parent of default run folders.
        cache: features / vocabularies / words cache (default ``<root>/_cache``).
        train_dataset: vocabulary training set (default: the other city, or ``synthetic-train``).
        vocab_size: override the preset's vocabulary size.
        overrides: other preset overrides (``{"features.max_side": 1024, "spatial_top_r": 100}``).
        workers: feature-extraction processes.
        force: overwrite a run folder written under another config.
        progress: tqdm bars.
        distractors: distractors to add to the index (an id such as ``revisitop1m``, or a number
            of generated distractors for the synthetic set).
        strict: refuse datasets whose image counts differ from the official ones; ``False``
            (partial data) is recorded in the config and the results are not comparable.
        ranks_top: keep (save and evaluate) the top this many of each ranked list; default: all
            when the index holds at most 100,000 images, else 10,000 (as revisitop's R1M files).

    Returns:
        A :class:`RunOutcome`.
    """
    from oxbench.datasets.paths import data_root
    from oxbench.evaluation import evaluate

    root_path = data_root(root)
    if isinstance(method, BowMethod):
        m = method
    else:
        m = resolve_method(method, vocab_size=vocab_size, **(overrides or {}))
    train_id = train_dataset or bow.DEFAULT_TRAIN_DATASET.get(dataset)
    if train_id is None:
        raise InputError(f"no default vocabulary training set for {dataset!r}; pass --train-dataset")
    t0 = time.perf_counter()
    bench = load_benchmark(dataset, root_path, distractors=distractors, strict=strict, progress=progress)
    train = load_benchmark(train_id, root_path, strict=strict, progress=progress)
    t_load = time.perf_counter() - t0
    trained_on_test = train_id == dataset
    if trained_on_test:
        log.warning("the vocabulary is trained on the test set %s: results are not comparable", dataset)
    config: dict[str, Any] = {
        "dataset": dataset,
        "dataset_gt_sha256": bow.gt_digest(bench.gt),
        "crop": bench.crop,
        "n_distractors": bench.n_distractors,
        "distractors": distractors,
        "strict": strict,
        "ranks_top": ranks_top,
        "method": m.to_dict(),
        "train_dataset": train_id,
        "trained_on_test_set": trained_on_test,
    }
    run_dir = Path(out) if out is not None else Path(runs_dir) / f"{dataset}-{m.name}-{_config_digest(config)}"
    check_run_folder(run_dir, config, force=force)
    cache_dir = Path(cache) if cache is not None else root_path / "_cache"
    output = bow.run_bow(m, bench, train, cache_dir, workers=workers, progress=progress)
    keep = ranks_top if ranks_top is not None else (None if output.ranks.shape[1] <= 100_000 else 10_000)
    ranks = output.ranks if keep is None else output.ranks[:, :keep]
    timings = {"load": t_load, **output.timings}
    t0 = time.perf_counter()
    result = evaluate(bench.gt, ranks, n_distractors=bench.n_distractors, source=str(run_dir))
    timings["evaluate"] = time.perf_counter() - t0
    timings["total"] = float(sum(v for k, v in timings.items()))
    write_run_folder(
        run_dir, config=config, bench=bench, ranks=ranks, result=result,
        timings=timings, info=output.info, force=force,
    )
    return RunOutcome(run_dir, result, config, timings, output.info)
