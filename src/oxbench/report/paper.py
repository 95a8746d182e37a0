"""``oxbench report``: the paper table of several runs, with significance marks.

Rows are runs by label (``record.json`` ``label``: the preset name plus the settings that differ
from it, or the run's ``--label``), so several runs of one preset that differ in a setting are the
rows of an ablation table; columns are grouped by dataset: the revisited sets
first in the field's layout -- Medium then Hard, each with ROxf, ROxf+1M, RPar, RPar+1M, and mAP and
mP@10 under each -- then every other dataset (its own setups) by dataset id. A run with distractors
goes to its own group headed by the count it searched among (``ROxf+1K``, ``ROxf+R1M``: ``R`` for
revisitop's 1M set), and its row is its label without that count (the default label of a distractor
run ends in it), so one method's runs with and without distractors share a row. Runs of one label
that differ in their preprocessing card (``record.json`` ``preprocessing``: a foundation model's
resize, query crop, pooling, weights) are two rows, each label followed by the card's short tag.

In each column, every row is compared with the first row that has a run there (the baseline,
the first run given) by the paired randomization test of :mod:`oxbench.report.stats` on
the per-query values (AP for mAP columns, P@10 for mP@10 columns); p-values are Holm-adjusted over
the methods compared in that column, and a dagger marks adjusted p < ``alpha``. A footnote states
all of it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from oxbench.errors import InputError
from oxbench.evaluation.bootstrap import spread_note
from oxbench.report.runs import RunRecord, check_comparable
from oxbench.report.seeds import SeedGroup, cell_text, seeds_of, value_matrix
from oxbench.report.stats import DEFAULT_RESAMPLES, DEFAULT_SEED, holm, paired_test

FORMATS = ("md", "latex", "csv", "html")
MARK = "\u2020"  # dagger
SHORT_NAMES = {"roxford5k": "ROxf", "rparis6k": "RPar"}
_REVISITED_ORDER = ("roxford5k", "rparis6k")
_PAPER_SETUPS = ("medium", "hard")
_SETUP_SHORT = {"easy": "E", "medium": "M", "hard": "H"}
_METRICS = (("ap", "mAP"), ("p@10", "mP@10"))
#: The first lines of the LaTeX table: what the preamble needs for it (docs/results.md says so too).
LATEX_PACKAGES_COMMENT = (
    r"% needs \usepackage{booktabs} (\toprule, \cmidrule, \midrule, \bottomrule) and",
    r"% \usepackage{threeparttable} (the note under the table) in the preamble",
)


@dataclass(frozen=True)
class Column:
    """One number column: a dataset group, a setup and a per-query metric."""

    dataset: str
    distractors: str  # "" or the group's count, "+1K", "+R1M" (records.distractor_tag)
    setup: str
    metric: str  # per-query column: "ap" or "p@10"

    @property
    def group(self) -> str:
        """``ROxf M``, ``RPar+R1M H``, ``ROxf+1K M``, ``oxford5k``..."""
        name = SHORT_NAMES.get(self.dataset, self.dataset) + self.distractors
        letter = _SETUP_SHORT.get(self.setup)
        return f"{name} {letter}" if letter else name

    @property
    def label(self) -> str:
        return dict(_METRICS)[self.metric]


@dataclass(frozen=True)
class Cell:
    """A value (a fraction, ``nan`` when the method has no run there) and its test against the baseline."""

    value: float
    p_holm: float = math.nan
    significant: bool = False
    spread: str = ""  # a seed group's cell: mean and spread (oxbench.evaluation.bootstrap)


@dataclass(frozen=True)
class PaperTable:
    """What :func:`paper_table` returns; render it with :meth:`render`."""

    methods: tuple[str, ...]  # the row labels (run labels), in order of first appearance
    columns: tuple[Column, ...]
    cells: tuple[tuple[Cell, ...], ...]  # [row][column]
    alpha: float
    n_resamples: int
    seed: int
    decimals: int
    seed_counts: tuple[int, ...] = ()  # per row: seeds of its seed group (1: a single run)

    def footnote(self) -> str:
        return (
            f"{MARK} differs from the column's first row ({self.methods[0]} where it has a number) at "
            f"p < {self.alpha:g}: two-sided paired randomization test over the queries (sign flips of the "
            f"per-query AP for mAP, P@10 for mP@10; exact when 2^n <= {self.n_resamples:,}, else "
            f"{self.n_resamples:,} random flips, seed {self.seed}), Holm-adjusted over the rows "
            f"compared in each column.{self._seed_note()}{self._distractor_note()} Numbers in percent."
        )

    def _seed_note(self) -> str:
        groups = sorted({n for n in self.seed_counts if n > 1})
        if not groups:
            return ""
        spreads = "; ".join(spread_note(n) for n in groups)
        return (
            f" Rows run with several seeds show {spreads} (sd for n >= 5, min-max below); "
            "such a row, or a row compared with one, is marked only where the difference also "
            "holds against the seed spread: a two-level bootstrap (seeds, then queries, "
            f"resampled; {self.n_resamples:,} resamples, seed {self.seed}), Holm-adjusted the "
            "same way."
        )

    def _distractor_note(self) -> str:
        tags = sorted({c.distractors for c in self.columns if c.distractors})
        if not tags:
            return ""
        r1m = " (R: revisitop's 1M set)" if any(t.startswith("+R") for t in tags) else ""
        return f" {', '.join(tags)}: with that many distractors{r1m}."

    def _fmt(self, cell: Cell) -> str:
        if math.isnan(cell.value):
            return "-"
        text = cell.spread or f"{cell.value * 100:.{self.decimals}f}"
        return text + (MARK if cell.significant else "")

    def flat_header(self) -> list[str]:
        return ["method"] + [f"{c.group} {c.label}" for c in self.columns]

    def render(self, fmt: str) -> str:
        """The table as ``md``, ``latex``, ``csv`` or ``html`` text (with its footnote)."""
        if fmt == "md":
            from oxbench.report.tables import markdown_table

            rows = [
                [_md(m)] + [self._fmt(c) for c in cells]
                for m, cells in zip(self.methods, self.cells, strict=True)
            ]
            return markdown_table(self.flat_header(), rows) + f"\n\n{self.footnote()}\n"
        if fmt == "latex":
            return self._latex()
        if fmt == "csv":
            return self._csv()
        if fmt == "html":
            return self._html()
        raise InputError(f"unknown report format {fmt!r} (one of {', '.join(FORMATS)})")

    def _groups(self) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        for c in self.columns:
            if out and out[-1][0] == c.group:
                out[-1] = (c.group, out[-1][1] + 1)
            else:
                out.append((c.group, 1))
        return out

    def _latex(self) -> str:
        from oxbench.report.tables import _tex

        spec = "l" + "r" * len(self.columns)
        groups = self._groups()
        top = (
            " & ".join([""] + [rf"\multicolumn{{{n}}}{{c}}{{{_tex(g)}}}" for g, n in groups])
            + r" \\"
        )
        rules, col = [], 2
        for _, n in groups:
            rules.append(rf"\cmidrule(lr){{{col}-{col + n - 1}}}")
            col += n
        sub = " & ".join(["Method"] + [_tex(c.label) for c in self.columns]) + r" \\"
        out = [
            *LATEX_PACKAGES_COMMENT,
            r"\begin{threeparttable}",
            rf"\begin{{tabular}}{{{spec}}}",
            r"\toprule",
            top,
            "".join(rules),
            sub,
            r"\midrule",
        ]
        for m, cells in zip(self.methods, self.cells, strict=True):
            vals = [self._fmt(c).replace(MARK, r"$^\dagger$") for c in cells]
            out.append(" & ".join([_tex(m)] + vals) + r" \\")
        note = _tex(self.footnote()).replace(MARK, r"$^\dagger$")
        for text, tex in (
            (r"2\textasciicircum{}n", "$2^n$"),
            (" <= ", r" $\le$ "),
            (" < ", " $<$ "),
        ):
            note = note.replace(text, tex)
        out += [
            r"\bottomrule",
            r"\end{tabular}",
            r"\begin{tablenotes}[flushleft]\footnotesize",
            rf"\item[] {note}",
            r"\end{tablenotes}",
            r"\end{threeparttable}",
        ]
        return "\n".join(out) + "\n"

    def _csv(self) -> str:
        from oxbench.report.tables import csv_text

        rows = []
        for m, cells in zip(self.methods, self.cells, strict=True):
            row: dict[str, object] = {"method": m}
            for c, cell in zip(self.columns, cells, strict=True):
                key = f"{c.group} {c.label}"
                row[key] = "" if math.isnan(cell.value) else repr(cell.value * 100)
                row[f"{key} p_holm"] = "" if math.isnan(cell.p_holm) else repr(cell.p_holm)
            rows.append(row)
        return csv_text(rows)

    def _html(self) -> str:
        e = html.escape
        head1 = "".join(f'<th colspan="{n}">{e(g)}</th>' for g, n in self._groups())
        head2 = "".join(f"<th>{e(c.label)}</th>" for c in self.columns)
        body = "".join(
            "<tr><th>"
            + e(m)
            + "</th>"
            + "".join(f"<td>{e(self._fmt(c))}</td>" for c in cells)
            + "</tr>\n"
            for m, cells in zip(self.methods, self.cells, strict=True)
        )
        style = (
            "table{border-collapse:collapse;font:14px sans-serif}td,th{padding:3px 8px;border-bottom:1px solid #ccc}"
            "td{text-align:right}th{text-align:center}tbody th{text-align:left}p{font:12px sans-serif;max-width:60em}"
        )
        return (
            '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>oxbench report</title>'
            f"<style>{style}</style></head><body>\n<table>\n<thead><tr><th></th>{head1}</tr>\n"
            f"<tr><th>Method</th>{head2}</tr></thead>\n<tbody>\n{body}</tbody>\n</table>\n"
            f"<p>{e(self.footnote())}</p>\n</body></html>\n"
        )


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def parse_setups(text: str) -> tuple[str, ...]:
    """``"easy,medium,hard"`` as the revisited setups a table shows, in the protocol's order.

    Raises:
        InputError: an empty list or a name that is not a revisited setup (``--setups``).
    """
    names = [t.strip().lower() for t in text.split(",")]
    unknown = [n for n in names if n not in _SETUP_SHORT]
    if unknown or not any(names):
        shown = repr(unknown[0]) if unknown else "nothing"
        raise InputError(
            f"--setups: {shown} is not a revisited setup; give some of {', '.join(_SETUP_SHORT)}, "
            "comma-separated"
        )
    return tuple(s for s in _SETUP_SHORT if s in names)


def _group_key(dataset: str, n_distractors: int) -> tuple[int, str, int]:
    known = (
        _REVISITED_ORDER.index(dataset) if dataset in _REVISITED_ORDER else len(_REVISITED_ORDER)
    )
    return (known, dataset, n_distractors)


def _row_labels(runs: Sequence[RunRecord | SeedGroup]) -> list[str]:
    """Each run's row: its label without the distractor count (the count is in the header), and
    where runs of one label and dataset differ in their preprocessing card, the card's short tag
    after it (:func:`~oxbench.records.preprocessing_tag`), so they are two rows, not one refusal."""
    from oxbench.records import preprocessing_tag

    def card(r: RunRecord | SeedGroup) -> Any:
        return (r.first if isinstance(r, SeedGroup) else r).preprocessing

    base = [
        r.label.removesuffix(f" {r.distractor_tag}") if r.distractor_tag else r.label for r in runs
    ]
    cards: dict[tuple[str, int, str], set[str]] = {}
    for r, label in zip(runs, base, strict=True):
        cards.setdefault((r.dataset_id, r.n_distractors, label), set()).add(
            preprocessing_tag(card(r))
        )
    out = []
    for r, label in zip(runs, base, strict=True):
        apart = len(cards[(r.dataset_id, r.n_distractors, label)]) > 1
        out.append(f"{label} [{preprocessing_tag(card(r)) or 'no card'}]" if apart else label)
    return out


def paper_table(
    runs: Sequence[RunRecord | SeedGroup],
    *,
    alpha: float = 0.05,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    decimals: int = 1,
    setups: Sequence[str] | None = None,
) -> PaperTable:
    """Build the paper table of ``runs`` (rows = run labels in order of first appearance).

    ``setups`` are the revisited setups shown (:func:`parse_setups` reads ``--setups``): by
    default the paper's Medium and Hard for ROxf / RPar and every setup for other datasets; when
    given, those setups for every revisited-protocol dataset. Other protocols show their own.

    A seed group (:class:`oxbench.report.seeds.SeedGroup`) is one row: its cells show the mean
    and spread of its seeds, and its tests include the seed spread (:func:`_column_test`).

    Raises:
        InputError: no runs; two runs with one label on one dataset group; runs of one dataset
            group with different ground truth (see :func:`oxbench.report.runs.check_comparable`).
    """
    if not runs:
        raise InputError("report needs at least one run")
    if not 0.0 < alpha < 1.0:
        raise InputError(f"alpha must be in (0, 1), got {alpha}")
    methods: list[str] = []
    n_seeds: dict[str, int] = {}
    by_group: dict[tuple[str, int], dict[str, RunRecord | SeedGroup]] = {}
    labels = _row_labels(runs)
    for r, label in zip(runs, labels, strict=True):
        tag = r.distractor_tag
        if label not in methods:
            methods.append(label)
        n_seeds[label] = max(n_seeds.get(label, 1), seeds_of(r))
        g = (r.dataset_id, r.n_distractors)
        if label in by_group.setdefault(g, {}):
            other = by_group[g][label]
            raise InputError(
                f"two runs labelled {label!r} on {g[0]}{tag} "
                f"(also {other.path}): give one run per label and dataset (oxbench run --label names a run)",
                r.path,
            )
        by_group[g][label] = r
    for group_runs in by_group.values():
        check_comparable(list(group_runs.values()))
    tags = {g: next(iter(rs.values())).distractor_tag for g, rs in by_group.items()}
    revisited = [g for g in by_group if g[0] in _REVISITED_ORDER]
    others = sorted(
        (g for g in by_group if g[0] not in _REVISITED_ORDER), key=lambda g: _group_key(*g)
    )
    chosen = _PAPER_SETUPS if setups is None else parse_setups(",".join(setups))
    columns: list[Column] = []
    for setup in chosen:
        for g in sorted(revisited, key=lambda g: _group_key(*g)):
            columns += [Column(g[0], tags[g], setup, m) for m, _ in _METRICS]
    for g in others:
        own = next(iter(by_group[g].values())).setups
        if setups is not None and set(own) == set(_SETUP_SHORT):
            own = chosen  # a revisited-protocol set (synthetic): the setups asked for
        for setup in own:
            columns += [Column(g[0], tags[g], setup, m) for m, _ in _METRICS]
    group_of = {(g[0], tags[g]): g for g in by_group}
    if len(group_of) < len(by_group):
        counts = sorted(f"{g[1]:,}" for g in by_group if (g[0], tags[g]) in group_of)
        raise InputError(
            "runs with different distractor counts read the same in a header "
            f"({', '.join(counts)}): report them separately"
        )
    grid: list[list[Cell]] = [[Cell(math.nan)] * len(columns) for _ in methods]
    for j, col in enumerate(columns):
        present = by_group[group_of[(col.dataset, col.distractors)]]
        order = [m for m in methods if m in present]
        base = present[order[0]]
        tests = [
            _column_test(base, present[m], col, n_resamples=n_resamples, seed=seed)
            for m in order[1:]
        ]
        adjusted_q = holm([t[0] for t in tests])
        adjusted_s = holm([t[1] for t in tests])
        for i, m in enumerate(methods):
            if m not in present:
                continue
            entry = present[m]
            value = entry.mean(col.setup, col.metric)
            spread = (
                cell_text(entry, col.setup, col.metric, decimals) if seeds_of(entry) > 1 else ""
            )
            if m == order[0]:
                grid[i][j] = Cell(value, spread=spread)
            else:
                k = order.index(m) - 1
                p = max(adjusted_q[k], adjusted_s[k])  # both must hold
                grid[i][j] = Cell(value, p, p < alpha, spread)
    return PaperTable(
        tuple(methods),
        tuple(columns),
        tuple(tuple(r) for r in grid),
        alpha,
        n_resamples,
        seed,
        decimals,
        tuple(n_seeds[m] for m in methods),
    )


def _column_test(
    a: RunRecord | SeedGroup, b: RunRecord | SeedGroup, col: Column, *, n_resamples: int, seed: int
) -> tuple[float, float]:
    """The p-values of ``b`` against ``a`` in one column: the paired randomization test over the
    queries (on the seed-averaged per-query values of a seed group), and, when either is a seed
    group, the two-level bootstrap over seeds and queries (else the same query p-value)."""
    from oxbench.evaluation.bootstrap import two_level_test

    p_queries = paired_test(
        a.per_query(col.setup, col.metric),
        b.per_query(col.setup, col.metric),
        n_resamples=n_resamples,
        seed=seed,
    ).p_value
    if seeds_of(a) == 1 and seeds_of(b) == 1:
        return p_queries, p_queries
    p_seeds = two_level_test(
        value_matrix(a, col.setup, col.metric),
        value_matrix(b, col.setup, col.metric),
        n_resamples=n_resamples,
        seed=seed,
    ).p_value
    return p_queries, p_seeds
