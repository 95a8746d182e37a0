"""``oxbench plot``: figures of one run (or two) drawn from the stored run record, never re-running search.

Figures (``<name>.png`` or ``.svg``), one panel per setup:

- ``ap_per_query``: per-query AP bars (two runs: side by side), mAP as a line, one row per setup,
  the bars named by query (up to :data:`MAX_NAMED_QUERIES` queries, else by index);
- ``ap_vs_positives``: per-query AP against the query's number of positives (log x);
- ``precision_recall``: the mean interpolated precision-recall curve (:func:`precision_recall`);
- ``ap_scatter``: two runs only, AP of B against AP of A per query, with the diagonal (A and B
  named under the panels).

A seed group (:mod:`oxbench.report.seeds`) is drawn as one entry: each query's AP averaged over
its seeds with the seeds' min-max as an error bar, its mAP the mean over the seeds, its
precision-recall curve the mean of its seeds' curves.

Precision-recall curves are computed from ``retrieved.json``: the labels of the stored top ``k``
of each list and the number of positives per label. Recall counts all of a query's positives, so a
curve stops at the recall reached at rank ``k`` (precision 0 beyond it); the interpolated
precision at recall ``r`` is the best precision at any recall >= ``r`` within the top ``k``.

matplotlib is the optional extra ``plots`` (``pip install "oxbench[plots]"``), imported only here;
figures are drawn on their own ``Figure`` objects (no pyplot global state).
"""

from __future__ import annotations

import io
import logging
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.fileio import atomic_write_bytes
from oxbench.report.runs import RunRecord, check_comparable
from oxbench.report.seeds import SeedGroup, seeds_of, value_matrix

log = logging.getLogger(__name__)

FORMATS = ("png", "svg")
RECALL_LEVELS = np.linspace(0.0, 1.0, 101)
#: ``ap_per_query`` names its bars by query up to this many queries (ROxford's 70 fit at 6 pt).
MAX_NAMED_QUERIES = 120


def precision_recall(
    run: RunRecord | SeedGroup, setup: str
) -> tuple[NDArray[np.float64], NDArray[np.float64], int]:
    """Mean interpolated precision at :data:`RECALL_LEVELS` over the queries with positives in ``setup``
    (a seed group: the mean of its seeds' curves).

    Ignored labels of the setup (e.g. junk) are deleted from each stored list first, as in AP.

    Returns:
        ``(recall levels [101], mean precision [101], number of queries averaged)``.

    Raises:
        InputError: an unknown setup; no query with positives.
    """
    if setup not in run.protocol.setup_labels:
        raise InputError(
            f"no setup {setup!r} in this run (setups: {', '.join(run.setups)})", run.path
        )
    if isinstance(run, SeedGroup):
        per_seed = [precision_recall(m, setup) for m in run.members]
        return RECALL_LEVELS.copy(), np.mean([c[1] for c in per_seed], axis=0), per_seed[0][2]
    positive, ignored = run.protocol.setup_labels[setup]
    curves = []
    for q in run.queries:
        n_pos = sum(n for lab, n in q.n_labelled.items() if lab in positive)
        if n_pos == 0:
            continue
        hits = np.array(
            [t["label"] in positive for t in q.top if t["label"] not in ignored], dtype=bool
        )
        tp = np.cumsum(hits)
        precision = tp / np.arange(1, hits.size + 1)
        recall = tp / n_pos
        # best precision at recall >= r: a running max from the end, looked up at each level
        best = np.maximum.accumulate(precision[::-1])[::-1] if hits.size else np.zeros(0)
        at = np.searchsorted(recall, RECALL_LEVELS - 1e-12, side="left")
        curve = np.zeros(RECALL_LEVELS.size)
        ok = at < hits.size
        curve[ok] = best[at[ok]]
        curves.append(curve)
    if not curves:
        raise InputError(f"setup {setup!r}: no query has positives", run.path)
    return RECALL_LEVELS.copy(), np.mean(curves, axis=0), len(curves)


def _figure(
    n_panels: int, width: float = 4.2, height: float = 3.2, *, rows: bool = False
) -> tuple[Any, list[Any]]:
    """A figure of ``n_panels`` side by side (``width`` x ``height`` inches each), or one above the
    other with ``rows``."""
    require("matplotlib", "plots")
    from matplotlib.figure import Figure

    if rows:
        fig = Figure(figsize=(width, height * n_panels), layout="constrained")
        return fig, list(fig.subplots(n_panels, 1, squeeze=False)[:, 0])
    fig = Figure(figsize=(width * n_panels, height), layout="constrained")
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    return fig, list(axes)


def _save(fig: Any, path: Path, fmt: str) -> Path:
    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    fig.savefig(buf, format=fmt, dpi=110, metadata=metadata)
    return atomic_write_bytes(path, buf.getvalue())


def _short(run: RunRecord | SeedGroup, inches: float | None = None) -> str:
    """The run's label and id, wrapped to ``inches`` of small text (a label can be long)."""
    extra = f", mean of {seeds_of(run)} seeds" if seeds_of(run) > 1 else ""
    text = f"{run.label} ({run.run_id}{extra})"
    return text if inches is None else _wrap(text, inches)


def _wrap(text: str, inches: float) -> str:
    return textwrap.fill(text, max(20, int(inches * 12)), subsequent_indent="   ")


def plot_runs(
    run: RunRecord | SeedGroup,
    out: str | Path,
    *,
    other: RunRecord | SeedGroup | None = None,
    fmt: str = "png",
) -> list[Path]:
    """Draw the figures of ``run`` (and ``other``) into the folder ``out``.

    Returns:
        The files written, in the order listed in the module docstring.

    Raises:
        InputError: unknown format; two runs that cannot be compared query by query.
        MissingExtraError: matplotlib is not installed.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown plot format {fmt!r} (one of {', '.join(FORMATS)})")
    runs = [run] if other is None else [run, other]
    if other is not None:
        check_comparable(runs)
    out = Path(out)
    setups = run.setups
    written = []
    colours = ("#1f77b4", "#d62728")

    # one row per setup, a bar per query named under it (indices when there are too many to read)
    named = run.n_queries <= MAX_NAMED_QUERIES
    bars_width = min(14.0, max(5.0, 0.16 * run.n_queries + 1.5))
    fig, axes = _figure(
        len(setups),
        width=bars_width,
        height=3.0 + (1.3 if named else 0.0),
        rows=True,
    )
    width = 0.8 / len(runs)
    x = np.arange(run.n_queries)
    for ax, setup in zip(axes, setups, strict=True):
        for i, r in enumerate(runs):
            ap = r.per_query(setup)
            spread = None
            if seeds_of(r) > 1:  # the seeds' min-max around their mean
                m = np.nan_to_num(value_matrix(r, setup))
                spread = np.stack(
                    [np.nan_to_num(ap) - m.min(axis=0), m.max(axis=0) - np.nan_to_num(ap)]
                )
            ax.bar(
                x + (i - (len(runs) - 1) / 2) * width,
                np.nan_to_num(ap),
                width,
                yerr=spread,
                error_kw={"lw": 0.6, "capsize": 0},
                color=colours[i],
                label=_short(r, bars_width / len(runs) - 0.6),
            )
            ax.axhline(r.mean(setup), color=colours[i], lw=1, ls="--")
        ax.set_title(f"{run.dataset_id} {setup}")
        ax.set_ylabel("AP")
        ax.set_ylim(0, 1)
        ax.set_xlim(-0.6, run.n_queries - 0.4)
        if named:
            ax.set_xticks(x, run.query_names, rotation=90, fontsize=6)
        else:
            ax.set_xlabel("query (index)")
    axes[0].legend(fontsize="small", loc="lower left", bbox_to_anchor=(0, 1.12), ncol=len(runs))
    written.append(_save(fig, out / f"ap_per_query.{fmt}", fmt))

    fig, axes = _figure(len(setups))
    for ax, setup in zip(axes, setups, strict=True):
        for i, r in enumerate(runs):
            ap, npos = r.per_query(setup), r.per_query(setup, "n_positives")
            keep = ~np.isnan(ap)
            ax.scatter(
                npos[keep], ap[keep], s=14, color=colours[i], alpha=0.75, label=_short(r, 3.4)
            )
        ax.set_xscale("log")
        ax.set_title(f"{run.dataset_id} {setup}")
        ax.set_xlabel("positives of the query")
        ax.set_ylabel("AP")
        ax.set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize="small")
    written.append(_save(fig, out / f"ap_vs_positives.{fmt}", fmt))

    fig, axes = _figure(len(setups))
    for ax, setup in zip(axes, setups, strict=True):
        for i, r in enumerate(runs):
            rec, prec, n = precision_recall(r, setup)
            ax.plot(rec, prec, color=colours[i], label=_wrap(f"{_short(r)}, {n} queries", 3.4))
        ax.set_title(f"{run.dataset_id} {setup} (top {min(r.k for r in runs)})")
        ax.set_xlabel("recall")
        ax.set_ylabel("interpolated precision")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
    axes[0].legend(fontsize="small")
    written.append(_save(fig, out / f"precision_recall.{fmt}", fmt))

    if other is not None:
        fig, axes = _figure(len(setups), width=3.6, height=3.6)
        for ax, setup in zip(axes, setups, strict=True):
            a, b = run.per_query(setup), other.per_query(setup)
            ax.plot([0, 1], [0, 1], color="#888", lw=1)
            ax.scatter(a, b, s=14, color=colours[0])
            ax.set_title(f"{run.dataset_id} {setup}")
            ax.set_xlabel("AP of A")
            ax.set_ylabel("AP of B")
            ax.set_xlim(-0.02, 1.02)
            ax.set_ylim(-0.02, 1.02)
            ax.set_aspect("equal")
        # the runs are named under the panels, wrapped to the figure's width (a label can be long)
        fig.supxlabel(
            "\n".join(
                _wrap(f"{k}: {_short(r)}", 3.6 * len(setups)) for k, r in (("A", run), ("B", other))
            ),
            fontsize="small",
        )
        written.append(_save(fig, out / f"ap_scatter.{fmt}", fmt))
    log.info("wrote %d figures to %s", len(written), out)
    return written
