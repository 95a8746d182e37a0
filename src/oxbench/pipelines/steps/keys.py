"""What identifies a benchmark's cached artifacts, and what every step returns.

- :func:`gt_digest` / :func:`dataset_key` -- a dataset version's digest and its cache folder name;
- :data:`PARTS`, :func:`parts_of`, :func:`part_names` -- the database, the query crops and the
  distractors of a benchmark, as the steps name them;
- :class:`StepResult` -- what a step made and whether it came from the cache, as measured by the
  step itself (never guessed by its caller from whether a folder exists).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

#: The parts of a benchmark a step describes.
PARTS = ("database", "queries", "distractors")


@dataclass(frozen=True)
class StepResult:
    """What one step made.

    Attributes:
        path: the artifact (a store folder, a vocabulary or words file).
        hit: ``True`` when nothing had to be computed (everything came from the cache).
        computed: how many items the step computed this time (images described, ...).
        info: facts of the step worth recording.
    """

    path: Path
    hit: bool
    computed: int = 0
    info: Mapping[str, Any] = field(default_factory=dict)


def gt_digest(gt: GroundTruth) -> str:
    """sha256 of the ground truth's content (names, boxes, labels): identifies a dataset version."""
    h = hashlib.sha256()
    h.update(json.dumps([gt.dataset, gt.protocol, list(gt.db_names)]).encode())
    for q in gt.queries:
        h.update(json.dumps([q.name, q.bbox]).encode())
        for name, arr in sorted(q.labels().items()):
            h.update(name.encode())
            h.update(np.ascontiguousarray(arr, dtype=np.int64).tobytes())
        if q.setups:  # the setups the query is scored in (GLDv2: public or private)
            h.update(json.dumps(list(q.setups)).encode())
    extra = gt.annotations()
    if extra:  # what else the protocol reads (ILIAS: scale, clutter, taxonomy)
        h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()


def dataset_key(bench: Benchmark) -> str:
    """Cache folder name of a benchmark: its id plus a digest of its ground truth and options.

    The options carry what else identifies the images (the synthetic sets record the sha256 of
    their images there), so regenerated images never meet features cached from older ones.
    """
    h = hashlib.sha256(gt_digest(bench.gt).encode())
    h.update(json.dumps(dict(bench.options), sort_keys=True, default=str).encode())
    return f"{bench.id}-{h.hexdigest()[:10]}"


def parts_of(bench: Benchmark, *, queries: bool = True) -> list[str]:
    """The parts ``bench`` has: database, queries (unless ``queries=False``), distractors if any."""
    out = ["database"] + (["queries"] if queries else [])
    return out + (["distractors"] if bench.distractors is not None else [])


def part_names(bench: Benchmark, part: str) -> list[str]:
    """Image names of one part, in part order (the order of every array a step writes)."""
    if part not in PARTS:
        raise InputError(f"unknown part {part!r}; use one of {PARTS}")
    src = {"database": bench.database, "queries": bench.queries, "distractors": bench.distractors}[
        part
    ]
    if src is None:
        raise InputError(f"{bench.id} has no {part}")
    return [src.name(i) for i in range(len(src))]


def last_if_empty(
    row_scores: NDArray[np.float32], empty: NDArray[np.bool_] | None
) -> NDArray[np.float32]:
    """Scores with images that have no features set below every real score (they rank last)."""
    if empty is None or not empty.any():
        return row_scores
    out = np.array(row_scores, dtype=np.float32, copy=True)
    out[empty] = -1.0
    return out
