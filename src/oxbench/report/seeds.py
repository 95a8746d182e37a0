"""Seed groups in ``runs``, ``compare``, ``report`` and ``plot``: one entry, mean and spread.

A seed group (``oxbench run --seeds 0,1,2``, :mod:`oxbench.pipelines.seedgroup`) is one config
folder holding one run per seed, each ``record.json`` naming the group (``seed_group``). Reports
read it as one entry, a :class:`SeedGroup`: it answers what a :class:`~oxbench.records.RunRecord`
answers (label, dataset, queries, per-query values, means) with the seed-averaged values, and
adds the per-seed values (:meth:`SeedGroup.member_means`, :meth:`SeedGroup.per_query_matrix`) that
tables show as a spread (:func:`oxbench.evaluation.bootstrap.spread_text`) and that ``compare``
tests with the two-level bootstrap (:mod:`oxbench.evaluation.bootstrap`).

Any run folder of a group, or its config folder, names the whole group (the config folder: the
group of its latest run). A group with a member missing (a seed that failed or was deleted) is
refused with one line naming the seeds missing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.evaluation.bootstrap import spread_note, spread_text
from oxbench.protocol import Headline, Protocol
from oxbench.records import RunRecord, list_runs, read_record_json, sequential_mean
from oxbench.report.runs import check_comparable


@dataclass(frozen=True, eq=False)
class SeedGroup:
    """The runs of one seed group, in the group's seed order (build it with :func:`load_group`).

    Attributes:
        members: one complete run record per seed.
        group_id: the group's id.
        seeds: the group's seeds.
        settings: the seed settings each seed set.
    """

    members: tuple[RunRecord, ...]
    group_id: str
    seeds: tuple[int, ...]
    settings: tuple[str, ...]

    # -- what a RunRecord answers ----------------------------------------------------------------
    @property
    def first(self) -> RunRecord:
        return self.members[0]

    @property
    def path(self) -> Path:
        """The config folder holding the group."""
        return self.first.path.parent

    @property
    def run_id(self) -> str:
        return self.group_id

    @property
    def label(self) -> str:
        return self.first.label

    @property
    def method(self) -> str:
        return self.first.method

    @property
    def started(self) -> str:
        return self.first.started

    @property
    def dataset_id(self) -> str:
        return self.first.dataset_id

    @property
    def gt_sha256(self) -> str:
        return self.first.gt_sha256

    @property
    def n_distractors(self) -> int:
        return self.first.n_distractors

    @property
    def distractor_tag(self) -> str:
        return self.first.distractor_tag

    @property
    def protocol(self) -> Protocol:
        return self.first.protocol

    @property
    def query_names(self) -> tuple[str, ...]:
        return self.first.query_names

    @property
    def n_queries(self) -> int:
        return self.first.n_queries

    @property
    def setups(self) -> tuple[str, ...]:
        return self.first.setups

    def skipped(self, setup: str) -> tuple[int, ...]:
        return self.first.skipped(setup)

    def describe(self) -> str:
        return f"{self.label} on {self.dataset_id}, {self.n} seeds ({self.path})"

    @property
    def n(self) -> int:
        return len(self.members)

    @property
    def k(self) -> int:
        """The shortest stored top-k of the members (what a precision-recall curve reaches)."""
        return min(m.k for m in self.members)

    def per_query_matrix(self, setup: str, metric: str = "ap") -> NDArray[np.float64]:
        """``(seeds, queries)``: each member's per-query values (``nan`` where skipped)."""
        return np.stack([m.per_query(setup, metric) for m in self.members])

    def per_query(self, setup: str, metric: str = "ap") -> NDArray[np.float64]:
        """Each query's value averaged over the seeds (``nan`` where skipped)."""
        return self.per_query_matrix(setup, metric).mean(axis=0)

    def member_means(self, setup: str, metric: str = "ap") -> NDArray[np.float64]:
        """Each seed's mean (its mAP for ``ap``), in seed order."""
        return np.array([m.mean(setup, metric) for m in self.members])

    def mean(self, setup: str, metric: str = "ap") -> float:
        """The mean over the seeds of each seed's mean (over the same queries: the grand mean)."""
        return sequential_mean(self.member_means(setup, metric))

    def spread(self, setup: str, metric: str = "ap", decimals: int = 2) -> str:
        """:func:`~oxbench.evaluation.bootstrap.spread_text` of the seeds' means."""
        return spread_text(self.member_means(setup, metric), decimals)

    def headline(self) -> str:
        """``oxbench runs``' numbers: ``mAP E 84.81 (84.1-85.3) M ...  [3 seeds]`` (the protocol's
        headline with each number the spread of the seeds' means)."""

        def spread(setup: str, h: Headline) -> str:
            return spread_text(self.member_means(setup, h.metric), h.decimals, scale=h.scale)

        return f"{self.protocol.headline(spread)}  [{spread_note(self.n)}]"


Entry = RunRecord | SeedGroup


def _group_records(config_dir: Path, group_id: str) -> list[RunRecord]:
    out = []
    for run_dir in list_runs(config_dir):
        try:
            rec = read_record_json(run_dir / "record.json")
        except InputError:
            continue  # not a member that can be read: counted as missing below
        group = rec.get("seed_group") if isinstance(rec, dict) else None
        if isinstance(group, dict) and group.get("id") == group_id:
            out.append(RunRecord.load(run_dir))
    return out


def load_group(run: RunRecord) -> SeedGroup:
    """The whole seed group ``run`` belongs to (its siblings in the config folder).

    Raises:
        InputError: a seed of the group has no complete run there, or one seed has two runs.
    """
    group = run.seed_group
    if group is None:
        raise InputError("not a run of a seed group", run.path)
    seeds = tuple(int(s) for s in group["seeds"])
    by_seed: dict[int, RunRecord] = {}
    for rec in _group_records(run.path.parent, str(group["id"])):
        g = rec.seed_group
        assert g is not None
        if tuple(g["seeds"]) != seeds:
            raise InputError(
                f"seed group {group['id']}: members disagree on the group's seeds", rec.path
            )
        if int(g["seed"]) in by_seed:
            raise InputError(
                f"seed group {group['id']}: seed {g['seed']} has two runs "
                f"(also {by_seed[int(g['seed'])].path})",
                rec.path,
            )
        by_seed[int(g["seed"])] = rec
    missing = [s for s in seeds if s not in by_seed]
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
        raise InputError(
            f"seed group {group['id']} is missing seed(s) {shown} of {len(seeds)} "
            "(a member failed or was removed): run the group again",
            run.path.parent,
        )
    members = tuple(by_seed[s] for s in seeds)
    check_comparable(list(members))
    return SeedGroup(members, str(group["id"]), seeds, tuple(group["settings"]))


def load_entries(paths: Sequence[str | Path]) -> list[Entry]:
    """Each path as a report entry: a run, or the whole seed group a run (or the latest run of a
    config folder) belongs to. A group named twice is one entry.

    Raises:
        InputError: a path that is not a complete run record, a group with a missing member.
    """
    out: list[Entry] = []
    seen: set[tuple[Path, str]] = set()
    for p in paths:
        rec = RunRecord.load(p)
        if rec.seed_group is None:
            out.append(rec)
            continue
        key = (rec.path.parent.resolve(), str(rec.seed_group["id"]))
        if key in seen:
            continue
        seen.add(key)
        out.append(load_group(rec))
    return out


def any_group(entries: Sequence[Entry]) -> bool:
    return any(isinstance(e, SeedGroup) for e in entries)


def seeds_of(entry: Entry) -> int:
    """How many seeds an entry averages (1 for a plain run)."""
    return entry.n if isinstance(entry, SeedGroup) else 1


def value_matrix(entry: Entry, setup: str, metric: str = "ap") -> NDArray[np.float64]:
    """``(seeds, queries)`` per-query values: a group's members, a single run's one row."""
    if isinstance(entry, SeedGroup):
        return entry.per_query_matrix(setup, metric)
    return entry.per_query(setup, metric)[None, :]


def cell_text(entry: Entry, setup: str, metric: str, decimals: int) -> str:
    """A table cell: a group's spread, a run's value (percent)."""
    if isinstance(entry, SeedGroup):
        return spread_text(entry.member_means(setup, metric), decimals)
    v = entry.mean(setup, metric)
    return "-" if math.isnan(v) else f"{100 * v:.{decimals}f}"


def group_dict(entry: Entry) -> dict[str, Any]:
    """``--json``'s description of an entry."""
    base: dict[str, Any] = {"path": str(entry.path), "method": entry.method, "label": entry.label}
    if isinstance(entry, SeedGroup):
        base.update(
            seed_group=entry.group_id,
            seeds=list(entry.seeds),
            runs=[str(m.path) for m in entry.members],
        )
    else:
        base["run_id"] = entry.run_id
    return base


def summarize_groups(summaries: Sequence[Any]) -> list[tuple[Any, str, int]]:
    """``oxbench runs``' rows: each run summary alone, the members of a seed group as one row
    (the first member's summary, the group's headline, the seed count); an incomplete group's
    headline says what is missing."""
    rows: list[tuple[Any, str, int]] = []
    done: set[tuple[Path, str]] = set()
    for s in summaries:
        group: Mapping[str, Any] | None = getattr(s, "seed_group", None)
        if group is None:
            rows.append((s, s.headline, 1))
            continue
        key = (Path(s.run_dir).parent, str(group["id"]))
        if key in done:
            continue
        done.add(key)
        try:
            g = load_group(RunRecord.load(s.run_dir))
            rows.append((s, g.headline(), g.n))
        except InputError as exc:
            rows.append((s, f"incomplete seed group: {exc.problem}", len(group["seeds"])))
    return rows
