"""Reading run records for ``compare``, ``report``, ``plot``, ``view`` and ``export``.

The record's layout, its writer and its checked reader (:class:`RunRecord`) live in
:mod:`oxbench.records`, the one schema of a run record; this module re-exports the reader and adds
what only reports need (:func:`check_comparable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from oxbench import protocol as _protocol
from oxbench.errors import InputError
from oxbench.records import (
    RECORD_FORMAT,
    RUN_FILES,
    RUN_ID_PATTERN,
    SETUP_LABELS,
    QueryRetrieved,
    RunRecord,
    latest_run,
    load_runs,
    sequential_mean,
)


class Comparable(Protocol):
    """What :func:`check_comparable` reads: a :class:`RunRecord`, or a seed group standing for its
    members (:class:`oxbench.report.seeds.SeedGroup`)."""

    @property
    def path(self) -> Path: ...

    @property
    def dataset_id(self) -> str: ...

    @property
    def gt_sha256(self) -> str: ...

    @property
    def n_distractors(self) -> int: ...

    @property
    def protocol(self) -> _protocol.Protocol: ...

    @property
    def query_names(self) -> tuple[str, ...]: ...

    @property
    def setups(self) -> tuple[str, ...]: ...

    def skipped(self, setup: str) -> tuple[int, ...]: ...


#: The run-record format this reader understands (``record.json`` ``"format"``).
RUN_FORMAT = RECORD_FORMAT

__all__ = [
    "RUN_FILES",
    "RUN_FORMAT",
    "RUN_ID_PATTERN",
    "SETUP_LABELS",
    "QueryRetrieved",
    "RunRecord",
    "check_comparable",
    "latest_run",
    "load_runs",
    "sequential_mean",
]


def check_comparable(runs: Sequence[Comparable]) -> None:
    """Refuse runs that cannot be compared query by query.

    They must share the dataset id, the ground-truth digest, the number of distractors, the
    protocol and the queries skipped in every setup.

    Raises:
        InputError: naming the second run's folder and what differs.
    """
    if not runs:
        raise InputError("no run given")
    a = runs[0]
    for b in runs[1:]:
        where = b.path
        if b.dataset_id != a.dataset_id:
            raise InputError(
                f"dataset {b.dataset_id!r} differs from {a.dataset_id!r} of {a.path}", where
            )
        if b.gt_sha256 != a.gt_sha256:
            raise InputError(
                f"ground truth differs from {a.path}'s (dataset.json gt_sha256 {b.gt_sha256[:12]} vs {a.gt_sha256[:12]})",
                where,
            )
        if b.n_distractors != a.n_distractors:
            raise InputError(
                f"{b.n_distractors} distractors, {a.path} has {a.n_distractors}: not the same benchmark",
                where,
            )
        if b.protocol != a.protocol or b.query_names != a.query_names:
            raise InputError(f"protocol or queries differ from {a.path}'s", where)
        for setup in a.setups:
            sa, sb = set(a.skipped(setup)), set(b.skipped(setup))
            if sa != sb:
                only = sorted(sa ^ sb)[:5]
                names = ", ".join(a.query_names[i] for i in only)
                raise InputError(
                    f"setup {setup!r}: queries skipped (no positives) in one run and not the other: {names}",
                    where,
                )
