"""``oxbench train``: fine-tune a backbone + GeM on a training city (or SfM-120k tuples)."""

from __future__ import annotations

import click

from oxbench.schema import Float, Int, Optional, coerce, spec_of
from oxbench.train.loop import TrainConfig

_D = TrainConfig()  # the defaults live in one place: the library's configuration


def _metavar(name: str) -> str:
    """What ``--help`` shows for a number option: its type in TrainConfig's schema (the option is
    read as text and parsed there, so that a bad value is one line naming it)."""
    spec = spec_of(TrainConfig, name)
    inner = spec.inner if isinstance(spec, Optional) else spec
    return "INTEGER" if isinstance(inner, Int) else "FLOAT" if isinstance(inner, Float) else "TEXT"


@click.command("train")
@click.option(
    "--backbone",
    default="resnet18",
    show_default=True,
    help="resnet18/34/50/101/152, vgg11/13/16/19 or timm:<model name>.",
)
@click.option("--pooling", default="gem", show_default=True, help="Pooling head (gem).")
@click.option(
    "--dataset",
    default="synthetic-train",
    show_default=True,
    help="Training benchmark (labels give the pairs); never the test set.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Model file to write (default: <data root>/_models/gem-r18-synthetic.pt, the "
    "gem-r18-synthetic preset's weights).",
)
@click.option("--root", type=click.Path(file_okay=False), default=None, help="Data root.")
@click.option(
    "--epochs", type=str, metavar=_metavar("epochs"), default=_D.epochs, show_default=True
)
@click.option(
    "--tuples",
    type=str,
    metavar=_metavar("tuples"),
    default=_D.tuples,
    show_default=True,
    help="Anchor-positive pairs per epoch.",
)
@click.option(
    "--neg-num",
    type=str,
    metavar=_metavar("neg_num"),
    default=_D.neg_num,
    show_default=True,
    help="Negatives per tuple.",
)
@click.option(
    "--pool-size",
    type=str,
    metavar=_metavar("pool_size"),
    default=_D.pool_size,
    show_default=True,
    help="Images the hardest negatives are mined from (0: all).",
)
@click.option(
    "--batch-size",
    type=str,
    metavar=_metavar("batch_size"),
    default=_D.batch_size,
    show_default=True,
    help="Tuples per optimiser step (one batch-norm batch).",
)
@click.option(
    "--image-size",
    type=str,
    metavar=_metavar("image_size"),
    default=_D.image_size,
    show_default=True,
    help="Longer side of training images.",
)
@click.option(
    "--lr",
    type=str,
    metavar=_metavar("lr"),
    default=_D.lr,
    show_default=True,
    help="Adam learning rate (from a random initialisation; fine-tuning published weights uses ~1e-6).",
)
@click.option(
    "--lr-decay",
    type=str,
    metavar=_metavar("lr_decay"),
    default=_D.lr_decay,
    show_default=True,
    help="Epoch e trains at lr * exp(-LR_DECAY * e) (cirtorch: 0.01 over 100 epochs; 0: constant).",
)
@click.option(
    "--weight-decay",
    type=str,
    metavar=_metavar("weight_decay"),
    default=_D.weight_decay,
    show_default=True,
)
@click.option(
    "--margin",
    type=str,
    metavar=_metavar("margin"),
    default=_D.margin,
    show_default=True,
    help="Contrastive margin (0.85: the published value for ResNet; 0.75 for VGG).",
)
@click.option(
    "--positives",
    type=click.Choice(["easy", "all"]),
    default=_D.positives,
    show_default=True,
    help="Positive pairs: each query crop with its Easy positives, or with all of them.",
)
@click.option(
    "--random-negative-epochs",
    type=str,
    metavar=_metavar("random_negative_epochs"),
    default=None,
    help="Epochs with random negatives before the hardest ones are mined every epoch "
    "[default: all epochs with --init random (hardest negatives of a random network do "
    "not train it), none with pretrained weights, as published].",
)
@click.option(
    "--augment/--no-augment",
    default=_D.augment,
    show_default=True,
    help="Random crops, mirroring, brightness/contrast changes of training images.",
)
@click.option(
    "--init",
    default="random",
    show_default=True,
    help="random, imagenet (the library's weights, from its cache) or a model file.",
)
@click.option("--seed", type=str, metavar=_metavar("seed"), default=_D.seed, show_default=True)
@click.option(
    "--threads",
    type=str,
    metavar="INTEGER",
    default=None,
    help="Torch CPU threads (default: torch's).",
)
@click.option(
    "--sfm-pickle",
    type=click.Path(dir_okay=False),
    default=None,
    help="Train on SfM-120k tuples: the retrieval-SfM-120k.pkl file ...",
)
@click.option(
    "--sfm-images", type=click.Path(file_okay=False), default=None, help="... and its ims/ folder."
)
@click.option("--restart", is_flag=True, help="Discard a partial training and start again.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def train(
    out: str | None,
    root: str | None,
    restart: bool,
    no_progress: bool,
    threads: str | None,
    **settings: object,
) -> None:
    """Train BACKBONE + GeM with the contrastive loss and mined negatives (Radenovic et al. 2018).

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
    config = TrainConfig(
        **{
            name: coerce(
                TrainConfig, name, value, what="option", label="--" + name.replace("_", "-")
            )
            for name, value in settings.items()
            if value is not None
        }
    )
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
