"""``oxbench data synth``: generate a synthetic landmark benchmark (thin layer over
:func:`oxbench.datasets.synthetic.generate`)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import click

from oxbench.cli.options import parse_workers
from oxbench.errors import InputError


def _parse_size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise InputError(f"--image-size must look like 640x480, got {text!r}")
    return int(m.group(1)), int(m.group(2))


@click.command("synth")
@click.option(
    "--out", type=click.Path(path_type=Path), help="Output folder (default: <root>/<name>)."
)
@click.option(
    "--root",
    type=click.Path(path_type=Path),
    help="Data root used when --out is not given (default: $OXBENCH_DATA, else ~/.local/share/oxbench).",
)
@click.option(
    "--name",
    default="synthetic",
    show_default=True,
    help="Dataset id (gnd_<name>.pkl, printed result lines).",
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="Photograph seed: views, light, occluders (default 0; 1 for synthetic-train).",
)
@click.option(
    "--city",
    default=None,
    help="City: style and buildings; another city shares no building (default northford; southbridge for synthetic-train).",
)
@click.option("--landmarks", type=int, default=11, show_default=True, help="Number of landmarks.")
@click.option(
    "--queries-per-landmark",
    type=int,
    default=5,
    show_default=True,
    help="Query images per landmark (not in the database).",
)
@click.option(
    "--db-size",
    type=int,
    default=None,
    help="Number of database images (default 1000; 500 for synthetic-train).",
)
@click.option(
    "--image-size",
    default="512x384",
    show_default=True,
    help="Image size WIDTHxHEIGHT (the default sets' size).",
)
@click.option(
    "--distractors",
    type=int,
    default=0,
    show_default=True,
    help="Default number of on-demand distractors recorded for loading (never stored).",
)
@click.option(
    "--workers",
    "-j",
    type=int,
    default=None,
    help="Processes rendering images (default: one per available core).",
)
@click.option("--overwrite", is_flag=True, help="Replace a complete set made with another config.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def synth(
    out: Path | None,
    root: Path | None,
    name: str,
    seed: int | None,
    city: str | None,
    landmarks: int,
    queries_per_landmark: int,
    db_size: int | None,
    image_size: str,
    distractors: int,
    workers: int | None,
    overwrite: bool,
    no_progress: bool,
) -> None:
    """Generate a synthetic landmark benchmark with Easy/Hard/Unclear labels by construction.

    Writes jpg/, gnd_<name>.pkl, gt_files/ and manifest.json (last) into the output folder;
    an interrupted run resumes where it stopped. Same city and seed give the same bytes.
    """
    from oxbench.datasets.paths import data_root
    from oxbench.datasets.synthetic import (
        DEFAULT_TEST,
        DEFAULT_TRAIN,
        SynthConfig,
        generate,
        read_manifest,
    )

    workers = parse_workers(workers)
    # `--name synthetic-train` defaults to the training city, anything else to the test city
    base = DEFAULT_TRAIN if name == DEFAULT_TRAIN.name else DEFAULT_TEST
    config = SynthConfig(
        name=name,
        city=base.city if city is None else city,
        seed=base.seed if seed is None else seed,
        db_size=base.db_size if db_size is None else db_size,
        landmarks=landmarks,
        queries_per_landmark=queries_per_landmark,
        image_size=_parse_size(image_size),
        distractors=distractors,
    )
    target = out if out is not None else data_root(root) / name
    t0 = time.perf_counter()
    generate(target, config, workers=workers, progress=not no_progress, overwrite=overwrite)
    manifest = read_manifest(target)
    assert manifest is not None
    labels = manifest["counts"]["labels"]
    click.echo(
        f"{name}: {config.db_size} database images, {manifest['counts']['queries']} queries in {target} "
        f"({time.perf_counter() - t0:.1f} s); labels over queries: easy {labels['easy']['total']}, "
        f"hard {labels['hard']['total']}, junk {labels['junk']['total']}"
    )
