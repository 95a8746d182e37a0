"""Options and argument parsing shared by the commands that run a method (``run``, ``extract``)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import click

from oxbench.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


def method_options(f: F) -> F:
    """--root, --cache, --train-dataset, --set and --distractors, with one wording everywhere."""
    for decorator in reversed(
        (
            click.option(
                "--root",
                type=click.Path(file_okay=False),
                default=None,
                help="Data root (default: $OXBENCH_DATA or ~/.local/share/oxbench).",
            ),
            click.option(
                "--cache",
                type=click.Path(file_okay=False),
                default=None,
                help="Cache of features, vocabularies and descriptors (default: <root>/_cache).",
            ),
            click.option(
                "--train-dataset",
                default=None,
                help="What the method learns on (default: the other city, or synthetic-train).",
            ),
            click.option(
                "--set",
                "settings",
                multiple=True,
                metavar="KEY=VALUE",
                help="Change a method setting (repeatable), e.g. --set vocabulary.size=4096 "
                "--set features.max_side=512 --set whitening=pca --set descriptor.weights=MODEL.pt.",
            ),
            click.option(
                "--distractors",
                default=None,
                help="Distractor set id (revisitop1m), a number of generated synthetic distractors "
                "of the test city, or synthetic-KIND:N with KIND city, scene, nearmiss or mixed "
                "(synthetic-mined-KIND:N: a selection made by `oxbench data mine-distractors`).",
            ),
        )
    ):
        f = decorator(f)
    return f


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: the value stays text, parsed by the setting's own spec
    (:func:`oxbench.pipelines.presets.resolve_method`)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--set takes KEY=VALUE, got {text!r}")
    return key.strip(), raw


def parse_settings(texts: Sequence[str]) -> dict[str, object]:
    """Every ``--set KEY=VALUE`` of a command (:func:`parse_setting`), each key once.

    Raises:
        InputError: a text without ``=``, or one key given twice (which would silently keep the
            last).
    """
    out: dict[str, object] = {}
    for text in texts:
        key, raw = parse_setting(text)
        if key in out:
            raise InputError(f"--set {key} is given twice ({key}={out[key]} and {key}={raw})")
        out[key] = raw
    return out


def schema_options(cls: type, *, what: str) -> Callable[[F], F]:
    """Options generated from a settings dataclass's schema: ``--set KEY=VALUE`` for any setting
    of ``cls``, and one typed shorthand per setting (``--epochs N`` for ``epochs``; a bool as
    ``--name/--no-name``), each read as text and parsed by the setting's own spec
    (:func:`collect_settings`), its help the setting's doc. Nothing is typed twice: a new setting
    of ``cls`` is an option of the command."""
    from oxbench.schema import DOC_KEY, SPEC_KEY, Bool, Float, Int, Optional

    def decorate(f: F) -> F:
        fields = [fl for fl in dataclasses.fields(cls) if SPEC_KEY in fl.metadata]  # type: ignore[arg-type]
        for fl in reversed(fields):
            spec = fl.metadata[SPEC_KEY]
            flag = "--" + fl.name.replace("_", "-")
            default = fl.default if fl.default is not dataclasses.MISSING else None
            accepts = spec.describe()
            doc = fl.metadata.get(DOC_KEY, "")
            help_text = f"{doc[:1].upper()}{doc[1:]}" + (f" [{accepts}]" if accepts else "")
            help_text += f" (default: {'none' if default is None else default})"
            if isinstance(spec, Bool):
                f = click.option(f"{flag}/--no-{flag[2:]}", fl.name, default=None, help=help_text)(
                    f
                )
            else:
                inner = spec.inner if isinstance(spec, Optional) else spec
                metavar = (
                    "INTEGER"
                    if isinstance(inner, Int)
                    else "FLOAT"
                    if isinstance(inner, Float)
                    else "TEXT"
                )
                f = click.option(
                    flag, fl.name, type=str, default=None, metavar=metavar, help=help_text
                )(f)
        return click.option(
            "--set",
            "settings",
            multiple=True,
            metavar="KEY=VALUE",
            help=f"Change a {what} setting by name (repeatable); each option below is a shorthand "
            "of it.",
        )(f)

    return decorate


def collect_settings(
    cls: type, shorthands: Mapping[str, object], set_texts: Sequence[str]
) -> dict[str, Any]:
    """The settings of ``cls`` the command line gave, each parsed by its spec (one line naming the
    option or ``--set KEY``): the generated shorthands (:func:`schema_options`) and ``--set``.

    Raises:
        InputError: an unknown setting, a value its spec refuses, or one setting given twice.
    """
    from oxbench.errors import close_matches
    from oxbench.schema import coerce

    names = {fl.name for fl in dataclasses.fields(cls)}  # type: ignore[arg-type]
    given: dict[str, tuple[str, object]] = {}
    for name, value in shorthands.items():
        if value is not None:
            given[name] = ("--" + name.replace("_", "-"), value)
    for text in set_texts:
        key, raw = parse_setting(text)
        if key not in names:
            near = close_matches(key, names)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise InputError(f"--set {key}: unknown setting{hint} ({', '.join(sorted(names))})")
        if key in given:
            raise InputError(f"{key} is given twice ({given[key][0]} and --set {key})")
        given[key] = (f"--set {key}", raw)
    return {
        name: coerce(cls, name, value, what="option", label=label)
        for name, (label, value) in given.items()
    }


#: The help of ``--workers``#: The help of ``--workers``, the same on every command that runs parallel stages.
WORKERS_HELP = (
    "Workers of the parallel stages (local-feature extraction, word assignment, spatial "
    "verification, aggregation, image rendering): processes with --engine processes, "
    "LocalCluster workers with --engine dask, the workers to wait for with --cluster, "
    "a plugin backend's workers with its --engine NAME. "
    "Default: one per available core."
)


def execution_options(f: Any) -> Any:
    """``--workers``, ``--engine``, ``--engine-option``, ``--cluster`` and ``--shard-size``: where
    and in which units the parallel stages run (:mod:`oxbench.execution`); a command reads the
    backend's options with :func:`parse_engine_options`."""
    f = click.option(
        "--cluster",
        default=None,
        metavar="tcp://HOST:PORT",
        help="Short for --engine-option address=tcp://HOST:PORT with --engine dask: the "
        "scheduler of an existing Dask cluster, whose workers see the data root and cache at "
        "the same paths (default: $OXBENCH_CLUSTER, else an embedded LocalCluster on 127.0.0.1).",
    )(f)
    f = click.option(
        "--engine-option",
        "engine_options",
        multiple=True,
        metavar="KEY=VALUE",
        help="An option of the execution backend (repeatable), e.g. --engine dask "
        "--engine-option retries=5; a plugin backend documents its own.",
    )(f)
    f = click.option(
        "--shard-size",
        type=click.IntRange(1, 1_000_000),
        default=None,
        help="Images per write-once shard of the local-feature stores (default 64): the "
        "unit of work of a worker and of --partition.",
    )(f)
    f = click.option(
        "--engine",
        default="processes",
        show_default=True,
        help="Execution backend of the parallel stages: processes, serial, dask "
        '(pip install "oxbench[dask]"), or one an installed plugin adds.',
    )(f)
    return click.option("--workers", type=int, default=None, help=WORKERS_HELP)(f)


def parse_engine_options(
    engine: str, texts: tuple[str, ...], cluster: str | None, wait_workers: str | None = None
) -> dict[str, object]:
    """``--engine-option KEY=VALUE`` (repeatable) and the ``--cluster`` / ``--wait-workers``
    shorthands as one mapping for :func:`oxbench.execution.make_executor`; the values stay text,
    parsed there by the backend's declared options."""
    options: dict[str, object] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--engine-option takes KEY=VALUE, got {text!r}")
        if key.strip() in options:
            raise InputError(f"--engine-option {key.strip()} is given twice")
        options[key.strip()] = value.strip()
    if cluster is not None:
        if engine != "dask":
            raise InputError(
                f"--cluster is the address of a Dask scheduler and needs --engine dask, not {engine!r}"
            )
        if "address" in options:
            raise InputError("--cluster and --engine-option address=... name the same; give one")
        options["address"] = cluster
    if wait_workers is not None:
        if engine != "dask":
            raise InputError(
                f"--wait-workers waits for Dask workers: it needs --engine dask, not {engine!r}"
            )
        if "wait_workers_s" in options:
            raise InputError(
                "--wait-workers and --engine-option wait_workers_s=... name the same; give one"
            )
        from oxbench.execution.dask import WAIT_WORKERS

        options["wait_workers_s"] = WAIT_WORKERS.parse(
            "--wait-workers", wait_workers, what="option"
        )
    return options


def _shown(text: str, limit: int = 40) -> str:
    """``text`` for a message: its repr, cut to ``limit`` characters."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


def is_count(text: str, max_digits: int = 20) -> bool:
    """Whether ``text`` is a whole number written in 1 to ``max_digits`` ASCII digits (``str.isdigit``
    also accepts ``²`` and other Unicode digits, which ``int`` refuses)."""
    return re.fullmatch(f"[0-9]{{1,{max_digits}}}", text) is not None


def parse_partition(text: str | None) -> tuple[int, int] | None:
    """``--partition I/N`` (``0 <= I < N``) as ``(I, N)``, else one line."""
    if text is None:
        return None
    i, sep, n = text.partition("/")
    if not sep or not is_count(i) or not is_count(n):
        raise InputError(
            "--partition takes I/N in ASCII digits (0 <= I < N, e.g. 0/4 for "
            f"$SLURM_ARRAY_TASK_ID/4), got {_shown(text)}"
        )
    from oxbench.execution.shards import check_partition

    try:
        return check_partition((int(i), int(n)))
    except InputError:
        raise InputError(
            f"--partition: I/N needs 0 <= I < N <= 1000000, got {_shown(text)}"
        ) from None


def parse_workers(n: int | None) -> int | None:
    """``--workers``: ``None`` (one per available core) or a count in 1 .. 1024 (else one line)."""
    if n is None:
        return None
    from oxbench.execution import check_workers

    try:
        return check_workers(n)
    except InputError:
        raise InputError(f"--workers must be a whole number from 1 to 1024, got {n}") from None


def parse_distractors(text: str | None) -> str | int | None:
    """``--distractors``: a set id, or a number of generated distractors (bounded)."""
    if text is None:
        return None
    if not is_count(text):
        if text.isdigit():  # Unicode digits, or too many
            raise InputError(
                f"--distractors takes a set id or a number in at most 20 ASCII digits, got {_shown(text)}"
            )
        return text
    n = int(text)
    if n > 100_000_000:
        raise InputError(
            f"--distractors {text}: more than 100 million generated distractors is not supported"
        )
    return n
