"""``oxbench run``: run a reference pipeline end to end, print its scores, write a run folder."""

from __future__ import annotations

import json

import click

from oxbench.pipelines.presets import DEFAULT_METHOD, METHODS


@click.command("run")
@click.option("--dataset", default="synthetic", show_default=True,
              help="Dataset id; 'synthetic' is built on first use.")
@click.option("--method", default=DEFAULT_METHOD, show_default=True,
              help=f"Method preset: {', '.join(METHODS.names())}.")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Data root (default: $OXBENCH_DATA or ~/.local/share/oxbench).")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run folder (default: ./runs/<dataset>-<method>-<config digest>).")
@click.option("--cache", type=click.Path(file_okay=False), default=None,
              help="Feature/vocabulary cache (default: <root>/_cache).")
@click.option("--train-dataset", default=None,
              help="Vocabulary training set (default: the other city, or synthetic-train).")
@click.option("--vocab-size", type=int, default=None, help="Override the number of visual words.")
@click.option("--max-side", type=int, default=None, help="Override the SIFT image max side (px).")
@click.option("--top-r", type=int, default=None, help="Override how many images are spatially verified.")
@click.option("--workers", type=int, default=0, show_default=True,
              help="Feature-extraction processes (0 = one per available CPU).")
@click.option("--distractors", default=None,
              help="Distractor set id (revisitop1m), or a number of generated synthetic distractors.")
@click.option("--allow-partial", is_flag=True,
              help="Accept a dataset with fewer images than the official count (recorded; not comparable).")
@click.option("--force", is_flag=True, help="Overwrite a run folder written under another config.")
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def run(
    dataset: str,
    method: str,
    root: str | None,
    out: str | None,
    cache: str | None,
    train_dataset: str | None,
    vocab_size: int | None,
    max_side: int | None,
    top_r: int | None,
    workers: int,
    distractors: str | None,
    allow_partial: bool,
    force: bool,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Run METHOD on DATASET (default: the synthetic benchmark) and evaluate it.

    Prints the familiar mAP / mP@K lines and a table, and writes a run folder with the resolved
    config, versions, dataset checksums, ranks (revisitop layout), per-query metrics and timings.
    """
    from oxbench.pipelines.runner import run_method

    if workers <= 0:
        import os

        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    overrides: dict[str, object] = {}
    if max_side is not None:
        overrides["features.max_side"] = max_side
    if top_r is not None:
        overrides["spatial_top_r"] = top_r
    outcome = run_method(
        dataset, method, root=root, out=out, cache=cache, train_dataset=train_dataset,
        vocab_size=vocab_size, overrides=overrides, workers=workers, force=force,
        progress=not no_progress and not as_json,
        distractors=int(distractors) if distractors is not None and distractors.isdigit() else distractors,
        strict=not allow_partial,
    )
    if as_json:
        payload = outcome.result.to_dict()
        payload["run_dir"] = str(outcome.run_dir)
        payload["trained_on"] = outcome.config["train_dataset"]
        payload["trained_on_test_set"] = outcome.config["trained_on_test_set"]
        payload["timings"] = outcome.timings
        click.echo(json.dumps(payload, indent=1, sort_keys=True, default=str))
        return
    for line in outcome.result.lines():
        click.echo(line)
    click.echo("")
    click.echo(outcome.result.table())
    if outcome.config["trained_on_test_set"]:
        click.echo("NOTE: the vocabulary was trained on the test set; not comparable.")
    click.echo(f"vocabulary: {outcome.info['vocabulary']['n_words']} words trained on "
               f"{outcome.config['train_dataset']}")
    total = outcome.timings.get("total", 0.0)
    click.echo(f"run folder: {outcome.run_dir}  ({total:.1f} s)")
