"""``oxbench milestones``: the field's milestone presets as seed groups beside the published figures."""

from __future__ import annotations

import click

from oxbench.cli.options import execution_options, parse_settings, parse_workers
from oxbench.errors import InputError


@click.command("milestones")
@click.option(
    "--dataset",
    default="synthetic",
    show_default=True,
    help="Test dataset: 'synthetic' (built on first use), or roxford5k / rparis6k under --root "
    "(the real subset's layout with --allow-partial).",
)
@click.option("--root", default=None, help="Data root (default $OXBENCH_DATA).")
@click.option("--cache", default=None, help="Cache (default <root>/_cache), shared by every row.")
@click.option("--train-dataset", default=None, help="What the vocabularies are trained on.")
@click.option(
    "--runs",
    "runs_dir",
    default="runs/milestones",
    show_default=True,
    help="Where the seed groups are kept (one config folder per preset).",
)
@click.option(
    "--seeds",
    "n_seeds",
    default="3",
    show_default=True,
    metavar="N",
    help="Seeds per preset (0..N-1): every seed setting of the preset is set to each.",
)
@click.option(
    "--methods",
    default=None,
    metavar="A,B",
    help="Only these milestone presets, comma-separated (default: all but DBA, which verifies "
    "the whole database).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="A setting given to every row that has it (e.g. --set vocabulary.size=4096 for a quick look; "
    "recorded, and in the labels).",
)
@execution_options
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Accept a dataset with fewer images than the official count (the real subset).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["md", "latex"]), default="md", show_default=True
)
@click.option("--alpha", default=0.05, show_default=True, help="Level of the trend tests.")
@click.option(
    "--resamples", default=10_000, show_default=True, help="Resamples of the trend tests."
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def milestones(
    dataset: str,
    root: str | None,
    cache: str | None,
    train_dataset: str | None,
    runs_dir: str,
    n_seeds: str,
    methods: str | None,
    settings: tuple[str, ...],
    workers: int | None,
    engine: str,
    engine_options: tuple[str, ...],
    cluster: str | None,
    shard_size: int | None,
    allow_partial: bool,
    fmt: str,
    alpha: float,
    resamples: int,
    no_progress: bool,
) -> None:
    """Run the field's milestone presets (BoW, + SV, + QE, soft assignment, HE, WGC, DQE, ASMK)
    with N seeds each and print ours (mean and spread) beside the published Oxford 5K figure and
    its source, then whether each published trend holds against the seed and query spread."""
    from oxbench.cli.options import parse_engine_options
    from oxbench.milestones import Milestone, choose, milestone_table, run_milestones
    from oxbench.pipelines.session import RecordOptions, Session
    from oxbench.report.seeds import SeedGroup
    from oxbench.schema import MAX_SEEDS, Int

    n = Int(lo=1, hi=MAX_SEEDS).parse("--seeds", n_seeds, what="option")
    if not 0.0 < alpha < 1.0:  # NaN fails too
        raise InputError(f"--alpha must be in (0, 1), got {alpha}")
    if resamples < 1:
        raise InputError(f"--resamples must be >= 1, got {resamples}")
    rows = choose(None if methods is None else [m.strip() for m in methods.split(",")])
    overrides = parse_settings(settings)
    progress = not no_progress

    def done(m: Milestone, group: SeedGroup) -> None:
        click.echo(f"{m.preset}: {group.headline()}", err=True)

    session = Session(
        root=root,
        cache=cache,
        workers=parse_workers(workers),
        engine=engine,
        engine_options=parse_engine_options(engine, engine_options, cluster),
        shard_size=shard_size,
        strict=not allow_partial,
        progress=progress,
    )
    groups = run_milestones(
        rows,
        list(range(n)),
        session,
        RecordOptions(runs_dir=runs_dir),
        dataset=dataset,
        train_dataset=train_dataset,
        settings=overrides,
        on_group=done,
    )
    click.echo(milestone_table(rows, groups, fmt=fmt, alpha=alpha, n_resamples=resamples), nl=False)
