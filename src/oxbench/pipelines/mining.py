"""Mined distractors: R1M's rule of keeping the generated distractors the methods find hardest.

:func:`mine_distractors` runs methods over a pool of generated distractors of the synthetic city
and keeps the most distracting (the scoring and the selection file are
:mod:`oxbench.datasets.mining`'s, which the dataset loader reads back).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from oxbench.datasets import load
from oxbench.datasets.mining import (
    DEFAULT_METHODS,
    SELECTION_FORMAT,
    distractor_scores,
    select_most_distracting,
    selection_path,
)
from oxbench.datasets.synthetic.distractor_kinds import KINDS, MAX_COUNT, kind_name
from oxbench.errors import InputError
from oxbench.fileio import atomic_write_json
from oxbench.pipelines.presets import resolve_method
from oxbench.pipelines.runner import run
from oxbench.pipelines.session import RecordOptions, Session

log = logging.getLogger(__name__)


def mine_distractors(
    dataset: str,
    *,
    kind: str,
    pool: int,
    keep: int,
    methods: Sequence[str] = DEFAULT_METHODS,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    session: Session | None = None,
    record: RecordOptions | None = None,
) -> Path:
    """Score ``pool`` generated distractors of ``kind`` with each of ``methods`` on the synthetic
    benchmark ``dataset`` (:func:`distractor_scores`, summed over the methods) and write the
    ``keep`` most distracting to :func:`~oxbench.datasets.mining.selection_path`; the runs in
    ``session``, recorded as ``record`` says.

    Returns:
        The selection file: the pool, the methods and their runs, every candidate's score (total
        and per method) and the kept indices.

    Raises:
        InputError: one line: ``pool < keep``, an unknown kind, fewer than one method, a bad
            setting (before any run).
    """
    session = session if session is not None else Session()
    if kind not in KINDS:
        raise InputError(f"unknown distractor kind {kind!r}; use one of {', '.join(KINDS)}")
    if not 1 <= keep <= MAX_COUNT or not 1 <= pool <= MAX_COUNT:
        raise InputError(f"--keep and --pool must be 1 to {MAX_COUNT:,}")
    if pool < keep:
        raise InputError(f"a pool of {pool:,} candidates cannot give {keep:,} mined distractors")
    if not methods:
        raise InputError("name at least one method to score the pool with")
    overrides = dict(overrides or {})
    for m in methods:  # every setting checked before the first run
        resolve_method(m, **dict(overrides.get(m, {})))
    spec = f"synthetic-{kind}:{pool}"
    per_method: dict[str, list[float]] = {}
    runs: dict[str, str] = {}
    bench = None
    for m in methods:
        outcome = run(
            dataset, m, session, record, distractors=spec, overrides=dict(overrides.get(m, {}))
        )
        if bench is None:
            bench = load(dataset, session.data_root, distractors=spec, progress=False, images=False)
        ranks = np.load(outcome.run_dir / "ranks.npy")
        per_method[m] = distractor_scores(bench.gt, ranks, pool).tolist()
        runs[m] = str(outcome.run_dir)
        log.info("scored %s candidates with %s", f"{pool:,}", m)
    assert bench is not None and bench.root is not None and bench.distractors is not None
    total = np.sum([per_method[m] for m in methods], axis=0)
    kept = select_most_distracting(total, keep)
    config = getattr(bench.distractors, "config", None)
    out = selection_path(Path(bench.root), kind, keep)
    atomic_write_json(
        out,
        {
            "format": SELECTION_FORMAT,
            "rule": "sum over queries and methods of the fraction of Easy and Hard images "
            "ranked below the candidate (Radenovic et al. 2018, R1M)",
            "dataset": dataset,
            "kind": kind,
            "pool": spec,
            "pool_size": pool,
            "keep": keep,
            "methods": list(methods),
            "runs": runs,
            "scores": total.tolist(),
            "scores_by_method": per_method,
            "kept": kept.tolist(),
            "kept_names": [kind_name(config, kind, int(i)) for i in kept] if config else [],
        },
    )
    return out
