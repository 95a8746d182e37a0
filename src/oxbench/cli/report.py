"""``oxbench compare | report | plot | view | export``: read run records, write what people read.

Each RUN is a run-id folder or a config folder (then its latest run), as ``oxbench run`` writes
them. Bad input (a folder that is not a complete run record, runs on different ground truth, an
unwritable output) exits with code 2 and one line.
"""

from __future__ import annotations

import json

import click

from oxbench.report.stats import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, DEFAULT_SEED

_RUN = click.Path(file_okay=False)


@click.command("compare")
@click.argument("runs", nargs=-1, required=True, type=_RUN)
@click.option(
    "--metric",
    default="ap",
    show_default=True,
    help="Per-query value compared: ap, p@1, p@5, p@10.",
)
@click.option(
    "--setup", "setups", multiple=True, help="Only these setups (repeatable; default: all)."
)
@click.option(
    "--resamples",
    default=DEFAULT_RESAMPLES,
    show_default=True,
    help="Bootstrap resamples / random sign flips.",
)
@click.option("--seed", default=DEFAULT_SEED, show_default=True, help="Seed of the resampling.")
@click.option(
    "--confidence",
    default=DEFAULT_CONFIDENCE,
    show_default=True,
    help="Level of the bootstrap interval.",
)
@click.option(
    "--top",
    "top_changes",
    default=10,
    show_default=True,
    help="Queries listed with the largest changes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (fractions at full precision).")
def compare(
    runs: tuple[str, ...],
    metric: str,
    setups: tuple[str, ...],
    resamples: int,
    seed: int,
    confidence: float,
    top_changes: int,
    as_json: bool,
) -> None:
    """Compare RUN_B [RUN_C ...] with RUN_A, query by query: mAP difference, bootstrap CI,
    randomization-test p-value (Holm-adjusted when several runs are compared).

    \b
    The columns, one row per setup:
      setup      the evaluation setup (easy, medium, hard; or the dataset's own)
      n          queries compared (those with positives in the setup)
      METRIC A/B the metric (--metric, in %) of run A and of run B
      B - A      their difference, in points
      CI         bootstrap interval of B - A at --confidence (queries resampled)
      p          two-sided paired randomization test (sign flips; exact when 2**n is at
                 most --resamples)
      p_holm     p Holm-adjusted over the runs compared with A (several runs only)
      p_seeds    seed groups only: two-level bootstrap p of the mAP difference (the seeds of
                 each group resampled, then the queries), Holm-adjusted as p_holm
      seeds CI   seed groups only: the two-level bootstrap interval of B - A
      holds      seed groups only: yes when both p_holm (p with one run) and p_seeds are
                 below 1 - --confidence (0.05 by default): the difference stands against
                 the query spread and the seed spread
      better / worse / equal  queries whose value B raises, lowers, leaves unchanged
    """
    from oxbench.report.compare import compare_runs
    from oxbench.report.seeds import load_entries

    result = compare_runs(
        load_entries(runs),  # a seed group is one entry
        metric=metric,
        setups=setups or None,
        n_resamples=resamples,
        seed=seed,
        confidence=confidence,
        top_changes=top_changes,
    )
    click.echo(json.dumps(result.to_dict(), indent=1) if as_json else result.text())


@click.command("report")
@click.argument("runs", nargs=-1, required=True, type=_RUN)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["md", "latex", "csv", "html"]),
    default="md",
    show_default=True,
)
@click.option(
    "--out", type=click.Path(dir_okay=False), help="Write to this file instead of printing."
)
@click.option(
    "--alpha", default=0.05, show_default=True, help="Significance level of the dagger marks."
)
@click.option(
    "--resamples",
    default=DEFAULT_RESAMPLES,
    show_default=True,
    help="Random sign flips (when not exact).",
)
@click.option("--seed", default=DEFAULT_SEED, show_default=True, help="Seed of the resampling.")
@click.option("--decimals", default=1, show_default=True, help="Decimals of the percentages.")
@click.option(
    "--setups",
    help="Revisited setups in the columns, comma-separated: easy, medium, hard "
    "[default: medium,hard for ROxf/RPar, all for other datasets].",
)
def report(
    runs: tuple[str, ...],
    fmt: str,
    out: str | None,
    alpha: float,
    resamples: int,
    seed: int,
    decimals: int,
    setups: str | None,
) -> None:
    """The paper table of RUN...: rows = methods, columns = ROxf / RPar (+1K, +R1M: the distractor count) x Medium / Hard x
    mAP / mP@10, then other datasets; daggers mark significant differences from the first run."""
    from oxbench.fileio import atomic_write_text
    from oxbench.report.paper import paper_table, parse_setups
    from oxbench.report.seeds import load_entries

    chosen = None if setups is None else parse_setups(setups)  # one line before runs are read
    table = paper_table(
        load_entries(runs),  # a seed group is one row
        alpha=alpha,
        n_resamples=resamples,
        seed=seed,
        decimals=decimals,
        setups=chosen,
    )
    text = table.render(fmt)
    if out is None:
        click.echo(text, nl=False)
    else:
        atomic_write_text(out, text)
        click.echo(f"wrote {out}")


@click.command("plot")
@click.argument("run", type=_RUN)
@click.argument("run_b", required=False, type=_RUN)
@click.option(
    "--out", required=True, type=click.Path(file_okay=False), help="Folder for the figures."
)
@click.option(
    "--format", "fmt", type=click.Choice(["png", "svg"]), default="png", show_default=True
)
def plot(run: str, run_b: str | None, out: str, fmt: str) -> None:
    """Figures of RUN (and RUN_B): per-query AP, AP vs positives, precision-recall, A-vs-B scatter."""
    from oxbench.report.plots import plot_runs
    from oxbench.report.seeds import load_entries

    entries = load_entries([run] if run_b is None else [run, run_b])  # a seed group is one entry
    other = entries[1] if len(entries) > 1 else None
    for path in plot_runs(entries[0], out, other=other, fmt=fmt):
        click.echo(str(path))


@click.command("view")
@click.argument("run", type=_RUN)
@click.argument("run_b", required=False, type=_RUN)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for index.html and thumbs/.",
)
@click.option("--top", default=20, show_default=True, help="Results shown per query.")
@click.option(
    "--thumb-size", default=160, show_default=True, help="Longest side of result thumbnails (px)."
)
@click.option(
    "--root",
    "roots",
    multiple=True,
    type=click.Path(file_okay=False),
    help="A folder images may be read from (repeatable; default: the data root, $OXBENCH_DATA "
    "or the per-user default). The folders a run records are never trusted for this.",
)
def view(
    run: str, run_b: str | None, out: str, top: int, thumb_size: int, roots: tuple[str, ...]
) -> None:
    """A static HTML viewer of RUN's ranked lists (RUN_B side by side); open OUT/index.html."""
    from oxbench.datasets.paths import data_root
    from oxbench.report.runs import RunRecord
    from oxbench.report.viewer import build_viewer

    other = RunRecord.load(run_b) if run_b else None
    index, cache = build_viewer(
        RunRecord.load(run),
        out,
        other=other,
        top=top,
        thumb_size=thumb_size,
        roots=roots or (data_root(),),
    )
    click.echo(
        f"{index}  (thumbnails: {cache.made} made, {cache.reused} reused, {cache.unreadable} images unreadable)"
    )


@click.command("export")
@click.argument("run", type=_RUN)
@click.option("--format", "fmt", type=click.Choice(["oxford", "revisitop", "hloc"]), required=True)
@click.option(
    "--out",
    required=True,
    type=click.Path(),
    help="Folder (oxford) or file (revisitop .npy, hloc .txt).",
)
@click.option(
    "--top", type=int, default=None, help="Keep the top K of each list (default: all stored)."
)
@click.option(
    "--suffix", default=".jpg", show_default=True, help="hloc: file suffix added to image names."
)
def export(run: str, fmt: str, out: str, top: int | None, suffix: str) -> None:
    """Export RUN's ranked lists: Oxford-style <query>.txt lists, the revisitop ranks array, or
    hloc retrieval pairs."""
    from oxbench.report.export import export_run
    from oxbench.report.runs import RunRecord

    written = export_run(RunRecord.load(run), fmt, out, top=top, suffix=suffix)
    click.echo(f"wrote {len(written)} file(s) to {out}")
