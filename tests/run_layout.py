"""Test helper: write run folders in exactly the run-record layout (format 1) that ``oxbench run`` writes.

The metrics come from the real :func:`oxbench.evaluation.evaluate` on a small synthetic ground truth,
so every number in the folder is consistent with its ranks.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.evaluation import evaluate, to_revisitop
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.pipelines.steps import gt_digest

LABELS = {
    "revisited": ["easy", "hard", "junk", "negative"],
    "original": ["positive", "junk", "negative"],
    "holidays": ["positive", "negative"],
    "ukbench": ["positive", "negative"],
}


def tiny_gt(
    seed: int = 0, *, n_db: int = 30, n_queries: int = 8, dataset: str = "roxford5k", protocol: str = "revisited"
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


def _label_of(gt: GroundTruth, qi: int) -> dict[int, str]:
    q = gt.queries[qi]
    if gt.protocol == "revisited":
        parts = {"easy": q.easy, "hard": q.hard, "junk": q.junk}
    else:
        parts = {"positive": q.positives, "junk": q.junk}
    return {int(i): lab for lab, arr in parts.items() for i in arr}


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

    def dump(name: str, obj: Any) -> None:
        (run / name).write_text(json.dumps(obj, indent=1))

    record = {
        "format": 1, "run_id": run_id, "command": ["oxbench", "run"], "started": "2024-01-01T00:00:00Z",
        "ended": "2024-01-01T00:00:05Z", "oxbench_version": "0.1.0", "git_commit": None,
        "host": {"cpu": "test", "cores": 1, "gpu": None, "platform": "linux", "python": "3.11"},
        "versions": {"numpy": np.__version__}, "accel": False, "cache": {}, "method": method,
        "dataset": gt.dataset, "status": "complete",
    }
    record.update(record_overrides or {})
    dump("record.json", record)
    dump("config.json", config)
    dump("dataset.json", {
        "id": gt.dataset, "gt_sha256": gt_sha256 or gt_digest(gt), "files_sha256": {}, "n_db": gt.n_db,
        "n_queries": gt.n_queries, "n_distractors": n_distractors, "protocols": [gt.protocol],
        "crop": True, "root": None,
    })
    np.save(run / "ranks.npy", to_revisitop(ranks))
    if scores is not None:
        np.save(run / "scores.npy", np.asarray(scores, dtype=np.float32))
    metrics = result.to_dict()
    metrics["run"] = {}
    dump("metrics.json", metrics)
    rows = result.per_query_rows()
    dump("per_query.json", rows)
    with open(run / "per_query.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    names = list(db_names or gt.db_names) + [f"distractor{j:06d}" for j in range(n_distractors)]
    queries = []
    for qi, q in enumerate(gt.queries):
        lab = _label_of(gt, qi)
        counts: dict[str, int] = {}
        for v in lab.values():
            counts[v] = counts.get(v, 0) + 1
        top = []
        for r, idx in enumerate(ranks[qi, :k]):
            if idx < 0:
                break
            top.append({
                "rank": r + 1, "index": int(idx), "name": names[idx],
                "image": None if db_images is None else db_images.get(int(idx)),
                "score": None if scores is None else float(scores[qi, r]),
                "label": lab.get(int(idx), "negative"),
            })
        queries.append({
            "index": qi, "name": q.name, "image": None if query_images is None else query_images.get(qi),
            "bbox": None if q.bbox is None else list(q.bbox), "n_labelled": counts, "top": top,
        })
    dump("retrieved.json", {"k": k, "protocol": gt.protocol, "labels": LABELS[gt.protocol], "queries": queries})
    dump("timings.json", {"search": 1.0, "total": 1.0})
    (run / "summary.txt").write_text("\n".join(result.lines()) + "\n")
    (run / "run.log").write_text("INFO done\n")
    if matches is not None:
        dump("matches.json", {"queries": {str(q): {str(d): v for d, v in m.items()} for q, m in matches.items()}})
    return run


def random_ranks(gt: GroundTruth, seed: int, *, n_distractors: int = 0, depth: int | None = None) -> np.ndarray:
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
