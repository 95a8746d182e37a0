"""``oxbench import-checkpoint`` (cirtorch checkpoint -> model file) and ``oxbench extract``
(a dataset described by any method: its global descriptors -> ``.npy`` files, or its local
features into the cache)."""

from __future__ import annotations

import click

from oxbench.cli.options import (
    execution_options,
    method_options,
    parse_distractors,
    parse_engine_options,
    parse_partition,
    parse_settings,
    parse_workers,
)


@click.command("import-checkpoint")
@click.argument("checkpoint", type=click.Path(dir_okay=False))
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="The model file to write (.pt), for --set descriptor.weights=MODEL.pt.",
)
def import_checkpoint(checkpoint: str, out: str) -> None:
    """Convert a local cirtorch CHECKPOINT (e.g. retrievalSfM120k-resnet101-gem-*.pth) into a model file.

    Keeps the network (architecture, pooling and its p, mean/std, a whitening layer) and the learned
    whitenings stored with it (Lw). A checkpoint whose weights do not fit the architecture its meta
    names is refused with the missing and unexpected keys. Nothing is downloaded.
    """
    from oxbench.features.deep.model import import_cirtorch, load_model

    path = import_cirtorch(checkpoint, out)
    model = load_model(path)
    facts = model.net.describe()
    p = f", p={facts['p']:.4f}" if "p" in facts else ""
    lw = f"; learned whitening: {', '.join(sorted(model.lw))}" if model.lw else ""
    click.echo(f"{path}: {facts['architecture']} {facts['pooling']}{p}, {facts['dim']}-D{lw}")


@click.command("extract")
@click.option("--dataset", default="synthetic", show_default=True, help="Dataset id.")
@click.option(
    "--method",
    required=True,
    help="A preset of any family: a global-descriptor one (gem-r50-imagenet, gem-r101 --set "
    "descriptor.weights=MODEL.pt, rootsift-vlad ...) writes its vectors; one of local features (rootsift-bow, "
    "asmk ...) fills their stores in the cache.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Output folder: db.npy, db_names.txt, queries.npy, query_names.txt, extract.json "
    "(required unless --partition).",
)
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="Describe only partition I of N (0 <= I < N) of the extraction shards (local features, or "
    "a CNN's descriptors), into the cache, and stop (an array job's task: "
    "$SLURM_ARRAY_TASK_ID/N). Then run without --partition to combine.",
)
@method_options
@execution_options
@click.option(
    "--decode-threads",
    type=click.IntRange(1, 1024),
    default=None,
    help="Threads decoding images for a CNN (default: one per available core).",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Accept partial image sets: undecodable images are named, skipped and get zero descriptors.",
)
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def extract(
    dataset: str,
    method: str,
    out: str | None,
    partition: str | None,
    root: str | None,
    cache: str | None,
    train_dataset: str | None,
    settings: tuple[str, ...],
    distractors: str | None,
    workers: int | None,
    engine: str,
    engine_options: tuple[str, ...],
    cluster: str | None,
    shard_size: int | None,
    decode_threads: int | None,
    allow_partial: bool,
    no_progress: bool,
) -> None:
    """Describe DATASET (database, distractors, query crops) with METHOD.

    A method with one vector per image writes them to .npy files, what `oxbench evaluate revisited
    --db-features/--query-features` reads; a method of local features describes them into the cache
    its runs read (and writes extract.json only). Everything is cached like `oxbench run`'s, so an
    interrupted extraction resumes.
    """
    from oxbench.errors import InputError
    from oxbench.pipelines.extract import extract_descriptors, extract_partition
    from oxbench.pipelines.session import Session

    session = Session(
        root=root,
        cache=cache,
        workers=parse_workers(workers),
        engine=engine,
        engine_options=parse_engine_options(engine, engine_options, cluster),
        shard_size=shard_size,
        decode_threads=decode_threads,
        progress=not no_progress,
        strict=not allow_partial,
    )
    part = parse_partition(partition)
    if part is not None:
        done = extract_partition(
            dataset,
            method,
            part,
            session,
            overrides=parse_settings(settings),
            distractors=parse_distractors(distractors),
        )
        counts = ", ".join(f"{n} {p}" for p, n in done.items())
        click.echo(
            f"partition {part[0]}/{part[1]} of {dataset}: described {counts} image(s); "
            "the other partitions and a run without --partition complete it"
        )
        return
    if out is None:
        raise InputError("oxbench extract needs --out (or --partition I/N)")
    outcome = extract_descriptors(
        dataset,
        method,
        out,
        session,
        train_dataset=train_dataset,
        overrides=parse_settings(settings),
        distractors=parse_distractors(distractors),
    )
    if not outcome.dim:
        counts = ", ".join(f"{n} {p}" for p, n in outcome.info["described"].items())
        click.echo(
            f"{outcome.out}: described {counts or 'no'} image(s) into the cache (local features: "
            "no vectors to write)"
        )
        return
    click.echo(
        f"{outcome.out}: {outcome.n_db} database + {outcome.n_distractors} distractor and "
        f"{outcome.n_queries} query descriptors, {outcome.dim}-D"
    )
    hint = outcome.info.get("evaluate")
    if hint:
        click.echo(f"evaluate with: {hint}")
