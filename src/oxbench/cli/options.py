"""Options and argument parsing shared by the commands that run a method (``run``, ``extract``)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from oxbench.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


def method_options(f: F) -> F:
    """--root, --cache, --train-dataset, --set and --distractors, with one wording everywhere."""
    for decorator in reversed((
        click.option("--root", type=click.Path(file_okay=False), default=None,
                     help="Data root (default: $OXBENCH_DATA or ~/.local/share/oxbench)."),
        click.option("--cache", type=click.Path(file_okay=False), default=None,
                     help="Cache of features, vocabularies and descriptors (default: <root>/_cache)."),
        click.option("--train-dataset", default=None,
                     help="What the method learns on (default: the other city, or synthetic-train)."),
        click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
                     help="Change a method setting (repeatable), e.g. --set vocab_size=4096 "
                          "--set features.max_side=512 --set whitening=pca --set weights=MODEL.pt."),
        click.option("--distractors", default=None,
                     help="Distractor set id (revisitop1m), or a number of generated synthetic distractors."),
    )):  # fmt: skip
        f = decorator(f)
    return f


def parse_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` of ``--set``: the value as JSON when it parses (numbers, true, null), else text."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise InputError(f"--set takes KEY=VALUE, got {text!r}")
    try:
        value: object = json.loads(raw)
    except ValueError:
        value = raw  # a bare word: a string setting (e.g. whitening=pca)
    return key.strip(), value


def parse_workers(n: int) -> int:
    """``--workers``: 0 means one per available CPU; absurd values are refused."""
    if n < 0 or n > 1024:
        raise InputError(f"--workers must be between 0 and 1024, got {n}")
    if n == 0:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n


def parse_distractors(text: str | None) -> str | int | None:
    """``--distractors``: a set id, or a number of generated distractors (bounded)."""
    if text is None or not text.isdigit():
        return text
    n = int(text)
    if n > 100_000_000:
        raise InputError(f"--distractors {text}: more than 100 million generated distractors is not supported")
    return n
