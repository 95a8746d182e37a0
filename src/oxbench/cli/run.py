"""``oxbench run`` (run a method end to end, keep a run record) and ``oxbench runs`` (list them)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from oxbench.cli.options import (
    execution_options,
    method_options,
    parse_distractors,
    parse_engine_options,
    parse_partition,
    parse_settings,
    parse_workers,
)
from oxbench.errors import InputError

if TYPE_CHECKING:
    from pathlib import Path

    from oxbench.pipelines.runner import RunOutcome
    from oxbench.pipelines.session import RecordOptions, Session


@click.command("run")
@click.option(
    "--dataset",
    default="synthetic",
    show_default=True,
    help="Dataset id; 'synthetic' is built on first use.",
)
@click.option(
    "--method",
    default=None,
    help="Method preset (default rootsift-bow-sv-qe); `oxbench methods` lists them, "
    "`oxbench methods NAME` a preset's settings.",
)
@click.option(
    "--list-methods",
    is_flag=True,
    hidden=True,
    help="The presets as 'name<TAB>family' lines (for scripts; `oxbench methods` is the listing).",
)
@method_options
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Config folder (default: ./runs/<dataset>-<method>-<config digest>); each run adds "
    "a timestamped run folder inside it.",
)
@click.option(
    "--vocab-size",
    metavar="INTEGER",
    default=None,
    help="Shorthand of --set vocabulary.size=N (the visual words of a local-feature method, VLAD's "
    "codebook: descriptor.vocabulary.size).",
)
@click.option(
    "--max-side",
    metavar="INTEGER",
    default=None,
    help="Shorthand of --set features.max_side=N (descriptor.max_side=N for a CNN descriptor, "
    "descriptor.features.max_side=N for VLAD): resize "
    "images to this longer side (px) before description.",
)
@click.option(
    "--top-r",
    metavar="INTEGER",
    default=None,
    help="Shorthand of --set spatial.top_r=N: how many images are spatially verified.",
)
@execution_options
@click.option(
    "--wait-workers",
    metavar="SECONDS",
    default=None,
    help="With --cluster: how long to wait for --workers of its workers, saying how many have "
    "connected meanwhile (default 10; batch-queued workers: minutes).",
)
@click.option(
    "--top-k",
    type=click.IntRange(1, 1_000_000),
    default=100,
    show_default=True,
    help="Retrieved images per query recorded with names, labels and scores.",
)
@click.option(
    "--dataset-option",
    "dataset_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="A dataset option, e.g. orientation=rotated for Holidays' hand-rotated copy in jpg_rotated/ "
    "(`oxbench data info DATASET` lists them); recorded in the config.",
)
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Accept a partial image set (recorded; not comparable): fewer images than the official "
    "count, and images that cannot be read (undecodable, over the pixel budget) named in a "
    "warning and skipped (no features, a zero descriptor).",
)
@click.option(
    "--verify-images",
    is_flag=True,
    help="Compare every image with the file its cached local features were described from by its "
    "bytes (reads and hashes every image), not only by size, modification time and inode; a "
    "changed image is described again.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the earlier runs of this config folder (and a folder of another config).",
)
@click.option(
    "--label",
    default=None,
    help="The run's name in runs, compare, report, plot and view (default: the preset name plus "
    "the settings that differ from it, e.g. 'features-alpha-qe [whitening=pca]').",
)
@click.option(
    "--partition",
    default=None,
    metavar="I/N",
    help="Only compute partition I of N (0 <= I < N) of the run's extraction shards (local features "
    "or CNN descriptors of the training set and the dataset) into the cache, and stop: an array "
    "job's task ($SLURM_ARRAY_TASK_ID/N). The same command without --partition then combines.",
)
@click.option(
    "--deterministic",
    is_flag=True,
    help="Learned steps (k-means, word assignment) with one BLAS / faiss thread, so their result "
    "does not depend on --workers or the cores (recorded; see oxbench.execution.determinism).",
)
@click.option(
    "--seeds",
    default=None,
    metavar="0,1,2",
    help="Run once per seed, every seed setting of the method (each setting named seed: "
    "vocabulary.seed, he.seed, search.seed, descriptor.seed ...) set to it, as one seed group in one config folder; runs, compare, "
    "report and plot show its mean and spread. The dataset's own generation seed is not changed.",
)
@click.option(
    "--repeat",
    default=None,
    metavar="N",
    help="Shorthand of --seeds 0,1,...,N-1.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bars.")
def run(
    dataset: str,
    method: str | None,
    list_methods: bool,
    root: str | None,
    out: str | None,
    cache: str | None,
    train_dataset: str | None,
    settings: tuple[str, ...],
    vocab_size: str | None,
    max_side: str | None,
    top_r: str | None,
    workers: int | None,
    engine: str,
    engine_options: tuple[str, ...],
    cluster: str | None,
    wait_workers: str | None,
    shard_size: int | None,
    distractors: str | None,
    top_k: int,
    dataset_options: tuple[str, ...],
    allow_partial: bool,
    verify_images: bool,
    overwrite: bool,
    label: str | None,
    partition: str | None,
    deterministic: bool,
    seeds: str | None,
    repeat: str | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Run METHOD on DATASET (default: the synthetic benchmark) and evaluate it.

    Prints the familiar mAP / mP@K lines and a table, and keeps a run record: a new timestamped
    folder under the config folder with the command, host, versions, config, dataset checksums,
    ranks (revisitop layout), per-query metrics, the top-k retrieved names with labels and
    scores, timings and a log. Earlier runs are never replaced unless --overwrite is given.
    """
    from oxbench.pipelines.presets import DEFAULT_METHOD, METHODS
    from oxbench.pipelines.session import RecordOptions, Session

    if list_methods:
        for name in METHODS.names():
            click.echo(f"{name}\t{METHODS.get(name).family}")
        return
    method = method or DEFAULT_METHOD
    overrides = method_overrides(
        method, settings, {"vocab_size": vocab_size, "max_side": max_side, "top_r": top_r}
    )
    ds_options = parse_dataset_options(dataset_options)
    part = parse_partition(partition)
    group_seeds = parse_seed_options(seeds, repeat)
    check_partition_alone(part, group_seeds, ds_options)
    session = Session(
        root=root,
        cache=cache,
        workers=parse_workers(workers),
        engine=engine,
        engine_options=parse_engine_options(
            engine, engine_options, cluster, None if part is not None else wait_workers
        ),
        shard_size=shard_size,
        progress=not no_progress and not as_json,
        strict=not allow_partial,
        deterministic=deterministic,
        verify_images=verify_images,
    )
    if part is not None:
        _run_partition(
            dataset, method, overrides, part, session, train_dataset, distractors, as_json
        )
        return
    _run_and_report(
        RunArguments(
            dataset,
            method,
            train_dataset,
            parse_distractors(distractors),
            ds_options,
            overrides,
            group_seeds,
        ),
        session,
        RecordOptions(
            out=out,
            label=label,
            top_k=top_k,
            overwrite=overwrite,
            command=["oxbench", *sys.argv[1:]],
        ),
        as_json,
    )


def check_partition_alone(
    part: tuple[int, int] | None, seeds: tuple[int, ...] | None, ds_options: dict[str, str]
) -> None:
    """``--partition`` describes images for a run to come: seeds and dataset options are refused."""
    if part is not None and seeds is not None:
        raise InputError(
            "--seeds / --repeat do not apply to --partition: the extraction shards are the same "
            "for every seed (run --partition without them, then the seed group)"
        )
    if part is not None and ds_options:
        raise InputError(
            "--dataset-option does not apply to --partition yet; describe the partitions without it"
        )


def method_overrides(
    method: str, settings: tuple[str, ...], shorthands: dict[str, str | None]
) -> dict[str, object]:
    """The ``--set`` settings, and each shorthand given (``--vocab-size``) as the setting the
    preset's family says it is (refused in one line where it has none)."""
    from oxbench.pipelines.presets import METHODS

    overrides: dict[str, object] = parse_settings(settings)
    preset = METHODS.get(method)
    for option, raw in shorthands.items():
        if raw is not None:  # the setting's own spec parses and checks the value
            setting_name = preset.shorthand(option)
            if setting_name is None:
                flag = "--" + option.replace("_", "-")
                raise InputError(f"{flag} does not apply to {preset.name} ({preset.family})")
            overrides[setting_name] = raw
    return overrides


def parse_dataset_options(texts: tuple[str, ...]) -> dict[str, str]:
    """``--dataset-option KEY=VALUE`` (repeatable) as a mapping (the dataset checks the keys)."""
    out: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--dataset-option takes KEY=VALUE, got {text!r}")
        out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class RunArguments:
    """What ``oxbench run`` runs (the arguments of :func:`oxbench.pipelines.runner.run` besides the
    session and the record)."""

    dataset: str
    method: str
    train_dataset: str | None
    distractors: str | int | None
    dataset_options: dict[str, str]
    overrides: dict[str, object]
    seeds: tuple[int, ...] | None


def _run_partition(
    dataset: str,
    method: str,
    overrides: dict[str, object],
    part: tuple[int, int],
    session: Session,
    train_dataset: str | None,
    distractors: str | None,
    as_json: bool,
) -> None:
    """``--partition I/N``: describe one partition of the extraction shards."""
    from oxbench.pipelines.extract import extract_partition
    from oxbench.pipelines.presets import resolve_method
    from oxbench.pipelines.runner import training_set_of

    m = resolve_method(method, **overrides)
    done = extract_partition(
        dataset,
        m,
        part,
        session,
        distractors=parse_distractors(distractors),
        train_dataset=training_set_of(m, dataset, train_dataset),
    )
    if as_json:
        click.echo(json.dumps({"partition": list(part), "described": done}, indent=1))
        return
    counts = ", ".join(f"{n} {p}" for p, n in done.items())
    click.echo(
        f"partition {part[0]}/{part[1]}: described {counts} image(s); when every partition is done, "
        "the same command without --partition combines them"
    )


def _run_and_report(
    args: RunArguments, session: Session, record: RecordOptions, as_json: bool
) -> None:
    """Run, then print the familiar lines and the table (or JSON)."""
    from oxbench.pipelines.runner import run as run_method
    from oxbench.pipelines.runner import trained_on_test_note

    outcome = run_method(
        args.dataset,
        args.method,
        session,
        record,
        train_dataset=args.train_dataset,
        distractors=args.distractors,
        dataset_options=args.dataset_options,
        overrides=args.overrides,
        seeds=args.seeds,
    )
    if outcome.group:
        _report_group(outcome, as_json)
        return
    cfg = outcome.config
    if as_json:
        payload = outcome.result.to_dict()
        payload["run_dir"] = str(outcome.run_dir)
        payload["label"] = outcome.record.get("label")
        payload["trained_on"] = cfg.train_dataset
        payload["trained_on_test_set"] = cfg.trained_on_test_set
        payload["timings"] = dict(outcome.timings)
        payload["footprint"] = outcome.record.get("footprint")
        click.echo(json.dumps(payload, indent=1, sort_keys=True, default=str))
        return
    for line in outcome.result.lines():
        click.echo(line)
    click.echo("")
    from oxbench.report.tables import result_table

    click.echo(result_table(outcome.result))
    note = trained_on_test_note(cfg)
    if note:
        click.echo(note)
    voc = outcome.info.get("vocabulary")
    if isinstance(voc, dict):
        click.echo(f"vocabulary: {voc['n_words']} words trained on {cfg.train_dataset}")
    elif cfg.train_dataset:
        click.echo(f"trained on: {cfg.train_dataset}")
    fp = outcome.record.get("footprint")
    if isinstance(fp, dict):
        click.echo(
            f"index: {fp['n_index']:,} images ({cfg.n_distractors:,} distractors), per image "
            f"{fp['ram_bytes_per_image'] / 1024:.1f} KiB RAM, {fp['disk_bytes_per_image'] / 1024:.1f} KiB disk"
        )
    total = outcome.timings.get("total", 0.0)
    click.echo(f"label: {outcome.record.get('label')}")
    click.echo(f"run folder: {outcome.run_dir}  ({total:.1f} s)")


def parse_seed_options(seeds: str | None, repeat: str | None) -> tuple[int, ...] | None:
    """``--seeds`` or ``--repeat N`` (seeds ``0..N-1``) as the seeds of a group, ``None`` for one run.

    Raises:
        InputError: both given, or a value :class:`oxbench.schema.SeedList` refuses.
    """
    from oxbench.schema import MAX_SEEDS, Int, parse_seeds

    if seeds is not None and repeat is not None:
        raise InputError("give --seeds or --repeat, not both")
    if repeat is not None:
        n = Int(lo=1, hi=MAX_SEEDS).parse("--repeat", repeat, what="option")
        return tuple(range(n))
    return None if seeds is None else parse_seeds(seeds)


def _report_group(outcome: RunOutcome, as_json: bool) -> None:
    """What ``run --seeds`` prints: each seed's numbers, then the group's mean and spread."""
    from oxbench.pipelines.runner import trained_on_test_note
    from oxbench.records import RunRecord
    from oxbench.report.seeds import load_group

    members = outcome.group
    group = load_group(RunRecord.load(members[-1].run_dir))
    if as_json:
        payload = {
            "seed_group": group.group_id,
            "seeds": list(group.seeds),
            "settings": list(group.settings),
            "config_dir": str(group.path),
            "label": group.label,
            "runs": [
                {"seed": s, "run_dir": str(o.run_dir), **o.result.to_dict()}
                for s, o in zip(group.seeds, members, strict=True)
            ],
            "mean": {s: group.mean(s) for s in group.setups},
            "sd": {
                s: float(np.std(group.member_means(s), ddof=1)) if group.n > 1 else 0.0
                for s in group.setups
            },
        }
        click.echo(json.dumps(payload, indent=1, sort_keys=True, default=str))
        return
    for s, o in zip(group.seeds, members, strict=True):
        click.echo(f"seed {s}: " + " | ".join(o.result.lines()[:1]) + f"  ({o.run_dir.name})")
    click.echo(f"seed group {group.group_id}: {group.headline()}")
    click.echo(f"seeds set: {', '.join(group.settings)} (the dataset is the same for every seed)")
    note = trained_on_test_note(members[-1].config)
    if note:
        click.echo(note)
    click.echo(f"label: {group.label}")
    click.echo(f"config folder: {group.path}")


@click.command("runs")
@click.argument("runs_dir", type=click.Path(file_okay=False), default="runs")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def runs(runs_dir: str, as_json: bool) -> None:
    """List the run records under RUNS_DIR (default ./runs) with their headline numbers.

    A record that cannot be read is named on stderr, one line each (as report, compare and view
    name it), the others are listed, and the exit status is 2."""
    from oxbench.records import find_runs
    from oxbench.report.seeds import summarize_groups

    skipped: list[Path] = []
    found = find_runs(runs_dir, skipped=skipped)
    _list_runs(runs_dir, found, summarize_groups(found), as_json, n_skipped=len(skipped))
    if skipped:
        click.get_current_context().exit(2)


def _list_runs(
    runs_dir: str, found: list[Any], grouped: list[Any], as_json: bool, *, n_skipped: int
) -> None:
    """The table (or JSON) of ``oxbench runs``."""
    if as_json:  # a seed group is one row: mean and spread of its seeds
        click.echo(
            json.dumps(
                [
                    {
                        "run_dir": str(r.run_dir),
                        "run_id": r.run_id,
                        "dataset": r.dataset,
                        "method": r.method,
                        "label": r.label,
                        "n_distractors": r.n_distractors,
                        "started": r.started,
                        "headline": headline,
                        "seed_group": None if r.seed_group is None else r.seed_group["id"],
                        "n_seeds": n,
                        "preprocessing": r.preprocessing,
                    }
                    for r, headline, n in grouped
                ],
                indent=1,
            )
        )
        return
    if not found:
        if n_skipped:
            click.echo(f"no readable runs under {runs_dir} ({n_skipped} record(s) named above)")
        else:
            click.echo(f"no runs under {runs_dir}")
        return
    from oxbench.records import preprocessing_tag
    from oxbench.report.tables import text_table

    cards = any(r.preprocessing for r, _, _ in grouped)  # the column where a run has a card
    rows = [
        [
            r.started[:19].replace("T", " "),
            r.dataset,
            f"{r.n_distractors:,}",
            r.label,
            *([preprocessing_tag(r.preprocessing)] if cards else []),
            headline,
            str(r.run_dir if r.seed_group is None else r.run_dir.parent),
        ]
        for r, headline, _ in grouped
    ]
    header = ["started (UTC)", "dataset", "distractors", "label"]
    header += ["preprocessing"] * cards + ["headline", "run folder"]
    click.echo(text_table(header, rows))


def _setting_json(r: Any) -> dict[str, Any]:
    """One settings row as ``oxbench methods --json`` gives it."""
    return {
        "name": r.name,
        "type": r.kind,
        "default": r.default,
        "accepts": r.range,
        "meaning": r.doc,
    }


def _echo_settings_table(rows: list[Any]) -> None:
    """A preset's or a stage's settings: setting, type, default, then meaning and what it accepts."""
    table = [["setting", "type", "default", "meaning [accepts]"]]
    table += [
        [r.name, r.kind, _shown(r.default), r.doc + (f" [{r.range}]" if r.range else "")]
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(3)]
    for row in table:
        click.echo(
            "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[3]
        )


def _echo_presets(as_json: bool) -> None:
    """``oxbench methods`` without a name: the presets by family, the descriptor kinds, the stages."""
    from oxbench.pipelines.presets import METHODS, method_families, preset_about

    families = method_families()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "family": f.name,
                        "about": f.about,
                        "presets": list(f.presets),
                        "presets_about": {p: preset_about(p) for p in f.presets},
                        "origins": {p: str(METHODS.origin(p)) for p in f.presets},
                    }
                    for f in families
                ],
                indent=1,
            )
        )
        return
    n = sum(len(f.presets) for f in families)
    click.echo(
        f"{len(families)} families, {n} presets; `oxbench methods NAME` lists a preset's settings"
    )
    width = max(len(p) for f in families for p in f.presets)
    for f in families:
        click.echo(f"\n{f.name}: {f.about}")
        for preset in f.presets:
            origin = METHODS.origin(preset)  # a plugin's presets say where they come from
            where = "" if origin.builtin else f"  [from {origin}]"
            click.echo(f"  {preset.ljust(width)}  {preset_about(preset)}{where}")
    from oxbench.pipelines.descriptors import DESCRIPTORS

    kinds = []
    for kind in DESCRIPTORS.names():
        origin = DESCRIPTORS.origin(kind)
        kinds.append(kind if origin.builtin else f"{kind} [from {origin}]")
    click.echo(f"\nglobal descriptor kinds (--set descriptor=KIND): {', '.join(kinds)}")
    _echo_stages()


@click.command("methods")
@click.argument("name", required=False)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="With NAME: also the settings that do nothing with the preset's other settings as "
    "they are.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the listing as JSON.")
def methods(name: str | None, show_all: bool, as_json: bool) -> None:
    """The presets, one line each (what it is and its paper), by family, then the re-ranking
    stages; with NAME, the settings that apply to that preset, or a stage's settings.

    A preset's settings are what `oxbench run --method NAME --set KEY=VALUE` takes: one row per
    setting (nested ones as dotted names, e.g. features.max_side) with its type, the preset's
    value, the values it accepts and what it means, read from the schema the values are checked with.
    A global preset lists its descriptor kind's settings as descriptor.<name>; --set
    descriptor=KIND switches the kind (`oxbench methods` ends with the kinds).
    """
    from oxbench.pipelines.presets import METHODS, preset_about

    if name is None:
        _echo_presets(as_json)
        return
    from oxbench.pipelines.presets import other_kind_rows, settings_rows
    from oxbench.pipelines.rerankers import RERANKERS

    if name not in METHODS and name in RERANKERS:
        _echo_stage(name, as_json)
        return
    config = METHODS.get(name)
    every = settings_rows(config)
    # --all: also the settings another choice of local features has (features.train)
    rows = (
        every + other_kind_rows(config)
        if show_all
        else [r for r in every if config.applies(r.name)]
    )
    if as_json:
        click.echo(
            json.dumps(
                [_setting_json(r) for r in rows],
                indent=1,
                default=str,
            )
        )
        return
    click.echo(f"{config.name} ({config.family}): {preset_about(config.name)}")
    click.echo(f"{len(rows)} settings, changed with --set KEY=VALUE")
    _echo_settings_table(rows)
    hidden = len(every) - len(rows)
    if hidden > 0:
        click.echo(
            f"({hidden} settings that do nothing with the others as they are are left out; "
            "--all lists them)"
        )


def _echo_stages() -> None:
    """The re-ranking stages, one line each: name, what it does, its settings group, its origin."""
    from oxbench.pipelines.rerankers import RERANKERS, stage_about

    names = sorted(RERANKERS.names())
    click.echo(
        f"\nre-ranking stages ({len(names)}; --set rerank=NAME,NAME...; a stage's settings are "
        "NAME.KEY, `oxbench methods STAGE` lists them):"
    )
    width = max(len(n) for n in names)
    for stage in names:
        cls = RERANKERS.get(stage)
        group = f"[{stage}.*]" if cls.settings_type is not None else "[no settings]"
        origin = RERANKERS.origin(stage)
        where = "" if origin.builtin else f"  [from {origin}]"
        click.echo(f"  {stage.ljust(width)}  {stage_about(stage)}  {group}{where}")


def _echo_stage(name: str, as_json: bool) -> None:
    """``oxbench methods STAGE``: the stage's settings, as a preset's are listed."""
    from oxbench.pipelines.rerankers import CAPABILITY_WORDS, RERANKERS, stage_about
    from oxbench.schema import describe

    cls = RERANKERS.get(name)
    rows = [] if cls.settings_type is None else describe(cls.settings_type, prefix=f"{name}.")
    if as_json:
        entry = {
            "stage": name,
            "about": stage_about(name),
            "origin": str(RERANKERS.origin(name)),
            "phase": cls.phase,
            "needs": sorted(cls.needs),
            "after": cls.after or None,
            "settings": [_setting_json(r) for r in rows],
        }
        click.echo(json.dumps(entry, indent=1, default=str))
        return
    origin = RERANKERS.origin(name)
    where = "" if origin.builtin else f" [from {origin}]"
    click.echo(f"{name} (re-ranking stage{where}): {stage_about(name)}")
    needs = ", ".join(CAPABILITY_WORDS.get(c, c) for c in sorted(cls.needs)) or "nothing"
    after = f"; after a {cls.after!r} stage" if cls.after else ""
    when = "at index time" if cls.phase == "index" else "per query"
    click.echo(f"acts {when}; needs {needs}{after}")
    click.echo(
        f"{len(rows)} settings, changed with --set rerank={name} --set {name}.KEY=VALUE"
        if rows
        else "no settings"
    )
    if not rows:
        return
    _echo_settings_table(rows)


def _shown(value: object) -> str:
    """A setting's value as ``--set`` takes it (names comma-separated, ``none`` for no stage)."""
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
        return ",".join(value) or "none"
    return str(value)
