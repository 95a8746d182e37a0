"""``oxbench compare``: paired comparison of runs on the same queries, setup by setup.

Every run after the first is compared with the first (the baseline): per setup the mAP difference,
its bootstrap confidence interval, the randomization-test p-value, queries better / worse / equal,
and the queries that changed most. With more than one comparison the p-values are Holm-adjusted
over the runs compared with the baseline, separately for each setup (:func:`oxbench.report.stats.holm`).

A seed group (:mod:`oxbench.report.seeds`) is one entry: its per-query values are averaged over its
seeds for the query-level tests, its numbers are shown with their seed spread, and each setup is
also tested by the two-level bootstrap over seeds and queries
(:func:`oxbench.evaluation.bootstrap.two_level_test`); a difference *holds* only where both the
query-level and the two-level p-values (Holm-adjusted) are below ``1 - confidence``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oxbench.errors import InputError
from oxbench.evaluation.bootstrap import TwoLevelTest, spread_note, two_level_test
from oxbench.report.runs import RunRecord, check_comparable
from oxbench.report.seeds import SeedGroup, cell_text, group_dict, seeds_of, value_matrix
from oxbench.report.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_RESAMPLES,
    DEFAULT_SEED,
    PairedTest,
    holm,
    paired_test,
)


@dataclass(frozen=True)
class QueryChange:
    """One query's values in the baseline (``a``) and the other run (``b``)."""

    index: int
    name: str
    a: float
    b: float

    @property
    def diff(self) -> float:
        return self.b - self.a


@dataclass(frozen=True)
class SetupComparison:
    """One setup of one run against the baseline.

    Attributes:
        setup: the setup (``medium``...).
        test: the paired test.
        p_holm: Holm-adjusted p-value (equal to ``test.p_value`` when only one run is compared).
        largest: the queries with the largest absolute changes, largest first.
    """

    setup: str
    test: PairedTest
    p_holm: float
    largest: tuple[QueryChange, ...]
    seeds: TwoLevelTest | None = None  # with a seed group: the two-level bootstrap
    p_seeds_holm: float = math.nan

    def holds(self, alpha: float) -> bool:
        """The difference holds against the query spread and (with seed groups) the seed spread."""
        p = self.p_holm if self.seeds is None else max(self.p_holm, self.p_seeds_holm)
        return p < alpha


@dataclass(frozen=True)
class RunComparison:
    """All setups of one run against the baseline."""

    run: RunRecord | SeedGroup
    setups: tuple[SetupComparison, ...]


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare_runs` returns."""

    baseline: RunRecord | SeedGroup
    others: tuple[RunComparison, ...]
    metric: str
    n_resamples: int
    seed: int
    confidence: float

    @property
    def n_compared(self) -> int:
        return len(self.others)

    @property
    def grouped(self) -> bool:
        """Some entry is a seed group (the two-level test applies)."""
        return any(seeds_of(e) > 1 for e in (self.baseline, *(rc.run for rc in self.others)))

    @property
    def alpha(self) -> float:
        return round(1.0 - self.confidence, 12)

    def method_note(self) -> str:
        """The one-paragraph statement of what was computed."""
        conf = f"{self.confidence * 100:g}%"
        note = (
            f"Paired over queries, B - A on per-query {self.metric}. CI: {conf} percentile bootstrap "
            f"({self.n_resamples:,} resamples of the queries, seed {self.seed}). p: two-sided paired "
            f"randomization test (sign flips of the per-query differences; exact enumeration when 2^n <= "
            f"{self.n_resamples:,}, else {self.n_resamples:,} random flips, seed {self.seed})."
        )
        if self.n_compared > 1:
            note += (
                f" {self.n_compared} runs are compared with the first: p_holm is Holm-adjusted over these "
                f"{self.n_compared} comparisons, separately per setup."
            )
        if self.grouped:
            counts = sorted({seeds_of(e) for e in (self.baseline, *(rc.run for rc in self.others))})
            spreads = "; ".join(spread_note(n) for n in counts if n > 1)
            note += (
                f" Seed groups ({spreads}): the query tests use each query's value averaged over "
                "the seeds; p_seeds is a two-level bootstrap of the mAP difference (seeds of each "
                f"group resampled, then the queries; {self.n_resamples:,} resamples, seed "
                f"{self.seed}, null-shifted two-sided p{', Holm-adjusted' if self.n_compared > 1 else ''}). "
                f"holds: both p < {self.alpha:g}, the difference stands against the query and the "
                "seed spread."
            )
        return note

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` object: fractions at full precision, one entry per compared run."""

        def run_info(r: RunRecord | SeedGroup) -> dict[str, Any]:
            return group_dict(r)

        return {
            "baseline": run_info(self.baseline),
            "dataset": self.baseline.dataset_id,
            "n_distractors": self.baseline.n_distractors,
            "metric": self.metric,
            "n_resamples": self.n_resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "multiple_comparisons": "holm per setup" if self.n_compared > 1 else None,
            "note": self.method_note(),
            "comparisons": [
                {
                    "run": run_info(rc.run),
                    "setups": {
                        sc.setup: {
                            **asdict(sc.test),
                            "p_holm": sc.p_holm,
                            "two_level": None if sc.seeds is None else asdict(sc.seeds),
                            "p_seeds_holm": None if sc.seeds is None else sc.p_seeds_holm,
                            "holds": sc.holds(self.alpha),
                            "largest_changes": [
                                {
                                    "query_index": c.index,
                                    "query": c.name,
                                    "a": c.a,
                                    "b": c.b,
                                    "diff": c.diff,
                                }
                                for c in sc.largest
                            ],
                        }
                        for sc in rc.setups
                    },
                }
                for rc in self.others
            ],
        }

    def text(self) -> str:
        """The terminal report: one table of setups per compared run, then the largest changes."""
        from oxbench.report.tables import text_table

        conf = f"{self.confidence * 100:g}% CI"
        out = [f"A = {self.baseline.describe()}"]
        for rc in self.others:
            out.append(f"B = {rc.run.describe()}")
            m = metric_label(self.metric)
            header = ["setup", "n", f"{m} A", f"{m} B", "B - A", conf, "p"]
            if self.n_compared > 1:
                header.append("p_holm")
            if self.grouped:
                header += ["p_seeds", "seeds CI", "holds"]
            header += ["better", "worse", "equal"]
            rows = []
            for sc in rc.setups:
                t = sc.test
                row = [
                    sc.setup,
                    str(t.n),
                    _cell(self.baseline, sc.setup, self.metric, t.mean_a),
                    _cell(rc.run, sc.setup, self.metric, t.mean_b),
                    _signed(t.diff),
                    f"[{_signed(t.ci_low)}, {_signed(t.ci_high)}]",
                    _p(t.p_value),
                ]
                if self.n_compared > 1:
                    row.append(_p(sc.p_holm))
                if self.grouped and sc.seeds is not None:
                    row += [
                        _p(sc.p_seeds_holm),
                        f"[{_signed(sc.seeds.ci_low)}, {_signed(sc.seeds.ci_high)}]",
                        "yes" if sc.holds(self.alpha) else "no",
                    ]
                row += [str(t.n_better), str(t.n_worse), str(t.n_equal)]
                rows.append(row)
            out += ["", text_table(header, rows), ""]
            for sc in rc.setups:
                if not sc.largest:
                    continue
                crow = [[c.name, _pct(c.a), _pct(c.b), _signed(c.diff)] for c in sc.largest]
                out.append(
                    text_table(
                        ["query", "A", "B", "B - A"], crow, title=f"{sc.setup}: largest changes"
                    )
                )
                out.append("")
        out.append("Numbers in percent. " + self.method_note())
        return "\n".join(out)


def metric_label(metric: str) -> str:
    """The column name of a per-query metric's mean: ``ap`` -> ``mAP``, ``p@10`` -> ``mP@10``."""
    return "mAP" if metric == "ap" else "m" + metric.upper()


def _cell(entry: RunRecord | SeedGroup, setup: str, metric: str, value: float) -> str:
    return cell_text(entry, setup, metric, 2) if seeds_of(entry) > 1 else _pct(value)


def _pct(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x * 100:.2f}"


def _signed(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x * 100:+.2f}"


def _p(p: float) -> str:
    return "nan" if math.isnan(p) else (f"{p:.4f}" if p >= 1e-4 else f"{p:.1e}")


def compare_runs(
    runs: Sequence[RunRecord | SeedGroup],
    *,
    metric: str = "ap",
    setups: Sequence[str] | None = None,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
    top_changes: int = 10,
) -> Comparison:
    """Compare every run after the first with the first, setup by setup.

    Args:
        runs: two or more runs on the same dataset and ground truth.
        metric: the per-query column compared (``ap``, ``p@10``...).
        setups: which setups (default: all of the protocol's).
        n_resamples: bootstrap resamples / random sign flips.
        seed: seed of the resampling.
        confidence: level of the bootstrap interval.
        top_changes: how many queries with the largest changes to list per setup.

    Raises:
        InputError: fewer than two runs; runs of different datasets, ground truth or distractors;
            queries skipped in one run and not another; an unknown setup or metric.
    """
    if len(runs) < 2:
        raise InputError("compare needs at least two runs")
    check_comparable(runs)
    base = runs[0]
    chosen = tuple(setups) if setups else base.setups
    for s in chosen:
        base.per_query(s, metric)  # raises for an unknown setup / metric
    tests: list[list[PairedTest]] = []
    for r in runs[1:]:
        tests.append(
            [
                paired_test(
                    base.per_query(s, metric),
                    r.per_query(s, metric),
                    n_resamples=n_resamples,
                    seed=seed,
                    confidence=confidence,
                )
                for s in chosen
            ]
        )
    adjusted = [holm([tests[i][j].p_value for i in range(len(tests))]) for j in range(len(chosen))]
    grouped = any(seeds_of(r) > 1 for r in runs)
    two_level: list[list[TwoLevelTest]] = []
    if grouped:
        two_level = [
            [
                two_level_test(
                    value_matrix(base, s, metric),
                    value_matrix(r, s, metric),
                    n_resamples=n_resamples,
                    seed=seed,
                    confidence=confidence,
                )
                for s in chosen
            ]
            for r in runs[1:]
        ]
    adjusted_seeds = [
        holm([two_level[i][j].p_value for i in range(len(two_level))]) if grouped else []
        for j in range(len(chosen))
    ]
    others = []
    for i, r in enumerate(runs[1:]):
        per_setup = []
        for j, s in enumerate(chosen):
            a, b = base.per_query(s, metric), r.per_query(s, metric)
            d = np.where(np.isnan(a), 0.0, b - a)
            order = np.argsort(-np.abs(d), kind="stable")[: max(top_changes, 0)]
            largest = tuple(
                QueryChange(int(q), base.query_names[q], float(a[q]), float(b[q]))
                for q in order
                if not math.isnan(a[q]) and abs(d[q]) > 0
            )
            per_setup.append(
                SetupComparison(
                    s,
                    tests[i][j],
                    adjusted[j][i],
                    largest,
                    two_level[i][j] if grouped else None,
                    adjusted_seeds[j][i] if grouped else math.nan,
                )
            )
        others.append(RunComparison(r, tuple(per_setup)))
    return Comparison(base, tuple(others), metric, n_resamples, seed, confidence)
