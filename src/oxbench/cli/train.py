"""``oxbench train``: fine-tune a backbone + GeM on a training city (or SfM-120k tuples)."""

from __future__ import annotations

import click

from oxbench.cli.options import collect_settings, schema_options
from oxbench.schema import Int
from oxbench.train.loop import TrainConfig


@click.command("train")
@schema_options(TrainConfig, what="training")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Model file to write (default: <data root>/_models/gem-r18-synthetic.pt, the "
    "gem-r18-synthetic preset's weights).",
)
@click.option("--root", type=click.Path(file_okay=False), default=None, help="Data root.")
@click.option(
    "--threads",
    type=str,
    metavar="INTEGER",
    default=None,
    help="Torch CPU threads (default: torch's).",
)
@click.option("--restart", is_flag=True, help="Discard a partial training and start again.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def train(
    out: str | None,
    root: str | None,
    restart: bool,
    no_progress: bool,
    threads: str | None,
    settings: tuple[str, ...],
    **shorthands: object,
) -> None:
    """Train BACKBONE + GeM with the contrastive loss and mined negatives (Radenovic et al. 2018).

    Every setting of the training (oxbench.train.loop.TrainConfig) is an option: --set NAME=VALUE,
    or its shorthand --name VALUE.

    The defaults train ResNet-18 + GeM from a random initialisation on the synthetic training city
    (40 epochs of about 70 CPU-s each on a 2-core VM: ~45 CPU-minutes; the bar shows the time
    left) and write the model file of the gem-r18-synthetic preset, which
    `oxbench run --method gem-r18-synthetic` then loads (see docs/deep.md, "Training").

    Resumable: each epoch is saved to OUT.partial, and a rerun continues from it. The model file
    holds the network, GeM's p, mean/std, a learned whitening fitted on the training pairs
    (gem-r18-synthetic+lw applies it) and the training record.
    """
    from pathlib import Path

    from oxbench.datasets.paths import data_root
    from oxbench.errors import require_installed

    # cheap checks first: the extra, every option, the backbone and the initial weights, before a
    # training set is loaded (or the synthetic city rendered into the data root)
    require_installed([("torch", "deep"), ("torchvision", "deep")])
    from oxbench.train.loop import DEFAULT_MODEL, benchmark_training_set
    from oxbench.train.loop import train as run_training

    # every option through the one schema of TrainConfig: text parsed, one line naming the option
    config = TrainConfig(**collect_settings(TrainConfig, shorthands, settings))
    n_threads = (
        None if threads is None else Int(lo=1, hi=1024).parse("--threads", threads, what="option")
    )
    # a bad --backbone or --init is refused before the data is loaded
    from oxbench.features.deep.backbones import check_architecture

    check_architecture(config.backbone)
    if config.init not in ("random", "imagenet"):
        from oxbench.features.deep.model import load_model

        load_model(Path(config.init).expanduser())
    progress = not no_progress
    out_path = Path(out) if out else data_root(root) / DEFAULT_MODEL
    if config.sfm_pickle is not None:
        from oxbench.train.sfm import sfm_training_set

        assert config.sfm_images is not None
        ts = sfm_training_set(config.sfm_pickle, config.sfm_images, config.image_size)
    else:
        from oxbench.datasets import load

        ts = benchmark_training_set(
            load(config.dataset, data_root(root), progress=progress),
            config.image_size,
            progress=progress,
        )
    record = run_training(
        config, ts, out_path, restart=restart, progress=progress, threads=n_threads
    )
    hist = record.get("history", [])
    last = f", last loss {hist[-1]['loss']:.4f}" if hist else ""
    click.echo(f"trained on {record.get('trained_on')}: {len(hist)} epochs{last} -> {out_path}")
