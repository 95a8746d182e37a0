"""``oxbench simulate``: the protocol-sensitivity study of docs/protocols.md (no data needed)."""

from __future__ import annotations

import json

import click

from oxbench.errors import InputError


@click.command("simulate")
@click.option(
    "--seeds", default=10, show_default=True, type=int, help="Number of seeds (one run each)."
)
@click.option("--first-seed", default=0, show_default=True, type=int, help="Seed of the first run.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the results as JSON (fractions, full precision)."
)
def simulate(seeds: int, first_seed: int, as_json: bool) -> None:
    """Run the synthetic protocol-sensitivity study and print its table.

    Two systems, A (strong on easy views) and B (strong on hard views), are scored on one synthetic
    Oxford-like benchmark with the original labels (junk ignored / junk as negative) and the
    revisited Easy, Medium and Hard setups: mean and [min, max] over the seeds, x100, with the
    reference numbers, then the 9-item worked example. Both are described in docs/protocols.md
    ("Reference numbers" and "The worked example").
    """
    from oxbench.evaluation.simulate import SPEC_SEEDS, run_study

    if seeds < 1:
        raise InputError(f"--seeds must be at least 1, got {seeds}")
    result = run_study(seeds, first_seed=first_seed)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(result.table())
    outside = [f"{r['system']} {r['column']}" for r in result.spec_comparison() if not r["inside"]]
    comparable = seeds == SPEC_SEEDS and first_seed == 0
    if outside and not comparable:  # a few other seeds: another sample, not a failed reproduction
        click.echo(
            f"\nnote: the reference numbers are the mean of seeds 0..{SPEC_SEEDS - 1}; over these {seeds} "
            f"seed(s) from {first_seed}, {len(outside)} mean(s) fall outside its per-seed range "
            f"({', '.join(outside)}); run the default 10 seeds to compare"
        )
    elif outside:
        click.echo(f"\nmeans outside the reference per-seed range: {', '.join(outside)}")
    else:
        click.echo("\nevery mean lies inside the reference per-seed [min, max] range")
    click.echo("")
    for line in result.worked_example_lines():
        click.echo(line)
