"""Test helper: write run folders with the writer ``oxbench run`` uses (:func:`oxbench.records.write_run_files`).

The metrics come from the real :func:`oxbench.evaluation.evaluate` on a small synthetic ground truth,
so every number in the folder is consistent with its ranks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.evaluation import evaluate, to_revisitop
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.pipelines.steps import gt_digest
from oxbench.records import RECORD_FORMAT, retrieved_document, sequential_mean, write_run_files


def tiny_gt(
    seed: int = 0,
    *,
    n_db: int = 30,
    n_queries: int = 8,
    dataset: str = "roxford5k",
    protocol: str = "revisited",
) -> GroundTruth:
    """A small random ground truth; every query has easy and hard images (good/ok for original)."""
    rng = np.random.default_rng(seed)
    queries = []
    for q in range(n_queries):
        perm = rng.permutation(n_db)
        n_e, n_h, n_j = (int(v) for v in rng.integers(1, 5, size=3))
        a, b, c = perm[:n_e], perm[n_e : n_e + n_h], perm[n_e + n_h : n_e + n_h + n_j]
        box = [1.0 + q, 2.0, 20.0 + q, 25.0]
        if protocol == "revisited":
            queries.append(make_query(f"q{q:02d}", box, easy=a, hard=b, junk=c))
        else:
            queries.append(make_query(f"q{q:02d}", box, good=a, ok=b, junk=c))
    db = tuple(f"db{i:03d}" for i in range(n_db))
    return GroundTruth(dataset, protocol, db, tuple(queries)).validate()  # type: ignore[arg-type]


def write_run(
    runs_dir: Path,
    gt: GroundTruth,
    ranks: np.ndarray,
    *,
    method: str = "bow",
    run_id: str = "20240101T000000Z-0001",
    config_name: str | None = None,
    n_distractors: int = 0,
    scores: np.ndarray | None = None,
    k: int = 100,
    db_images: Mapping[int, str | None] | None = None,
    query_images: Mapping[int, str | None] | None = None,
    db_names: Sequence[str] | None = None,
    matches: Mapping[int, Mapping[int, list[list[float]]]] | None = None,
    gt_sha256: str | None = None,
    record_overrides: Mapping[str, Any] | None = None,
    root: str | Path | None = None,
) -> Path:
    """Write ``<runs_dir>/<config folder>/<run_id>/`` for internal-layout ``ranks [n_queries, k_kept]``.

    Returns the run-id folder.
    """
    ranks = np.asarray(ranks, dtype=np.int64)
    result = evaluate(gt, ranks, n_distractors=n_distractors)
    config = {"dataset": gt.dataset, "method": {"name": method}, "n_distractors": n_distractors}
    cfg_dir = runs_dir / (config_name or f"{gt.dataset}-{method}-0123456789")
    run = cfg_dir / run_id
    run.mkdir(parents=True)
    (cfg_dir / "config.json").write_text(json.dumps(config))
    record = {
        "format": RECORD_FORMAT,
        "run_id": run_id,
        "command": ["oxbench", "run"],
        "started": "2024-01-01T00:00:00Z",
        "ended": "2024-01-01T00:00:05Z",
        "oxbench_version": "0.1.0",
        "git_commit": None,
        "host": {"cpu": "test", "cores": 1, "gpu": None, "platform": "linux", "python": "3.11"},
        "versions": {"numpy": np.__version__},
        "accel": False,
        "cache": {},
        "method": method,
        "dataset": gt.dataset,
        "status": "complete",
    }
    record.update(record_overrides or {})
    dataset = {
        "id": gt.dataset,
        "gt_sha256": gt_sha256 or gt_digest(gt),
        "files_sha256": {},
        "n_db": gt.n_db,
        "n_queries": gt.n_queries,
        "n_distractors": n_distractors,
        "protocols": [gt.protocol],
        "crop": True,
        "root": None if root is None else str(root),
        "distractors_root": None,
    }
    names = list(db_names or gt.db_names) + [f"distractor{j:06d}" for j in range(n_distractors)]
    retrieved = retrieved_document(
        gt,
        ranks,
        None if scores is None else np.asarray(scores, dtype=np.float32),
        k,
        image_name=lambda i: names[i],
        image_path=lambda i: None if db_images is None else db_images.get(i),
        query_image=lambda q: None if query_images is None else query_images.get(q),
    )
    metrics = result.to_dict()
    metrics["run"] = {}
    write_run_files(
        run,
        record=record,
        config=config,
        dataset=dataset,
        ranks_revisitop=to_revisitop(ranks),
        metrics=metrics,
        per_query=result.per_query_rows(),
        retrieved=retrieved,
        timings={"search": 1.0, "total": 1.0},
        summary="\n".join(result.lines()),
        scores=None if scores is None else np.asarray(scores, dtype=np.float32),
        matches=matches,
        log_text="INFO done\n",
    )
    return run


def random_ranks(
    gt: GroundTruth, seed: int, *, n_distractors: int = 0, depth: int | None = None
) -> np.ndarray:
    """A random full ranking per query (internal layout ``[n_queries, n_db + n_distractors]``)."""
    rng = np.random.default_rng(seed)
    n = gt.n_db + n_distractors
    out = np.stack([rng.permutation(n) for _ in range(gt.n_queries)])
    return out if depth is None else out[:, :depth]


def better_ranks(gt: GroundTruth, seed: int, lift: int) -> np.ndarray:
    """Random rankings in which each query's first ``lift`` positives are moved to the top."""
    r = random_ranks(gt, seed)
    out = []
    for qi, q in enumerate(gt.queries):
        pos = [int(i) for i in q.positives[:lift]]
        rest = [int(i) for i in r[qi] if int(i) not in pos]
        out.append(pos + rest)
    return np.asarray(out, dtype=np.int64)


def resync_metrics(run: Path) -> None:
    """Rewrite ``metrics.json``'s means from ``per_query.json`` after a test edited the per-query rows,
    so the record stays consistent (the reader cross-checks the two)."""
    rows = json.loads((run / "per_query.json").read_text())
    metrics = json.loads((run / "metrics.json").read_text())

    def mean(setup: str, column: str) -> float | None:
        values = np.array(
            [np.nan if r[column] is None else r[column] for r in rows if r["setup"] == setup]
        )
        v = sequential_mean(values)
        return None if np.isnan(v) else v

    if "setups" in metrics:
        for setup, s in metrics["setups"].items():
            for key in s:
                if key == "map":
                    s[key] = mean(setup, "ap")
                elif key.startswith("mp@"):
                    s[key] = mean(setup, key[1:])
            s["ap"] = [r["ap"] for r in rows if r["setup"] == setup]
    elif "score" in metrics:
        metrics["score"] = mean(rows[0]["setup"], "score")
    else:
        metrics["map"] = mean(rows[0]["setup"], "ap")
    (run / "metrics.json").write_text(json.dumps(metrics))
