"""The write-once shard protocol every distributed stage follows, whatever executes it.

A stage whose work is "compute something for each of many items" (describe images, assign their
visual words, describe them with a CNN) runs it as *shards*:

- the *plan* cuts the items, in benchmark order, into shards of a fixed size; shard ``k`` holds
  items ``k * size .. (k + 1) * size - 1``, so the plan does not depend on the number of workers or
  on the executor, and its digest (:func:`plan_digest`, of the names and the size) is recorded;
- shard ``k`` is a pure function of its items and the stage's config. Its task computes it into a
  uniquely named temporary folder and commits it by renaming the folder to
  ``shard-<k>-<digest of its item names>`` (:func:`shard_folder_name`). Two attempts of the same
  shard (a retried task whose first worker was only slow, two ``--partition`` processes) race for
  the same name: the first rename wins, the loser removes its temporary folder;
- a task returns a small :class:`ShardReceipt` (counts, digest), never data; the driver submits only
  the shards not committed yet (:func:`plan_shards`), then reads the committed shards and assembles
  the result in shard order.

So an interrupted stage leaves no shard that looks complete, a rerun computes only the missing
shards, and a killed worker's retried task cannot commit a second copy. The local-feature store
(:mod:`oxbench.features.store`) keeps its own file layout inside each shard folder (memory-mapped
arrays with per-image checksums); the other stages store one digest-checked ``shard.npz`` per folder
(:func:`write_npz_shard`, :func:`read_npz_shards`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import DIGEST_KEY, CorruptCache, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.execution.executors import Executor, SerialExecutor
from oxbench.fileio import (
    TEMP_PREFIX,
    commit_folder,
    discard_folder,
    json_digest,
    make_temp_folder,
    text_digest,
)

log = logging.getLogger(__name__)

#: The name of a committed shard folder: ``shard-<6-digit number>-<12 hex digest of its names>``.
SHARD_DIR_RE = re.compile(r"^shard-(\d{6})-([0-9a-f]{12})$")
#: The data file of a shard written by :func:`write_npz_shard`.
NPZ_NAME = "shard.npz"


@dataclass(frozen=True)
class ShardTask:
    """One planned shard to compute: its number and the indices of the items it still lacks.

    Attributes:
        number: the shard's place in the plan (``0 ..``); results are assembled in this order.
        items: item indices (benchmark order) that this shard computes.
        folder: the committed folder's name, ``shard-<number>-<digest of the item names>``.
    """

    number: int
    items: tuple[int, ...]
    folder: str

    def __str__(self) -> str:
        return (
            f"shard {self.number} ({self.folder}, {len(self.items)} images from #{self.items[0]})"
        )


@dataclass(frozen=True)
class ShardReceipt:
    """What a shard task returns instead of its data (small enough for any scheduler).

    Attributes:
        number: the shard.
        folder: its committed folder name.
        images: items computed (images described, assigned...).
        features: rows written in all (keypoints, features assigned, descriptors).
        digest: content digest of the shard's index / data file (identical for identical results).
        committed: this attempt's rename won (``False``: another attempt had committed first).
        seconds: wall time of the task.
    """

    number: int
    folder: str
    images: int
    features: int
    digest: str
    committed: bool
    seconds: float = 0.0


def shard_folder_name(number: int, names: Sequence[str]) -> str:
    """``shard-<number>-<12 hex of the digest of its item names>``: the same items, the same name."""
    return f"shard-{number:06d}-{text_digest(chr(10).join(names), 12)}"


def plan_digest(names: Sequence[str], shard_size: int) -> str:
    """Digest of a shard plan: the item names in order and the shard size."""
    return json_digest({"names": list(names), "shard_size": int(shard_size)})


def check_shard_size(shard_size: object) -> int:
    """A shard size (a whole number from 1 to 1,000,000), else one line."""
    if (
        isinstance(shard_size, bool)
        or not isinstance(shard_size, int)
        or not 1 <= shard_size <= 1_000_000
    ):
        raise InputError(f"shard_size must be a whole number from 1 to 1000000, got {shard_size!r}")
    return shard_size


def plan_shards(names: Sequence[str], shard_size: int, have: Iterable[str] = ()) -> list[ShardTask]:
    """The shard plan of ``names`` (benchmark order, ``shard_size`` items per shard), as the tasks
    of the shards that still lack items (those not in ``have``); a shard done in full is left out."""
    done = set(have)
    tasks = []
    for number, start in enumerate(range(0, len(names), shard_size)):
        items = tuple(
            i for i in range(start, min(start + shard_size, len(names))) if names[i] not in done
        )
        if items:
            tasks.append(
                ShardTask(number, items, shard_folder_name(number, [names[i] for i in items]))
            )
    return tasks


def check_partition(partition: object) -> tuple[int, int] | None:
    """``(i, n)``: this process computes the planned shards whose number is ``i`` modulo ``n``
    (``0 <= i < n``, as SLURM array and Kubernetes indexed-job indices count), else one line."""
    if partition is None:
        return None
    ok = (
        isinstance(partition, tuple)
        and len(partition) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in partition)
    )
    if not ok or not (1 <= partition[1] <= 1_000_000 and 0 <= partition[0] < partition[1]):  # type: ignore[index]
        raise InputError(f"partition must be I/N with 0 <= I < N <= 1000000, got {partition!r}")
    return partition  # type: ignore[return-value]


def in_partition(tasks: Sequence[ShardTask], partition: tuple[int, int] | None) -> list[ShardTask]:
    """The tasks of ``partition`` (``(i, n)``: shard numbers ``i`` modulo ``n``); all without one."""
    if partition is None:
        return list(tasks)
    return [t for t in tasks if t.number % partition[1] == partition[0]]


def remove_own_temps(directory: Path, tag: str) -> int:
    """Delete the temporary folders of one run's shard attempts that died before their commit."""
    dead = list(Path(directory).glob(f"{TEMP_PREFIX}shard-*.{tag}.*"))
    for path in dead:
        discard_folder(path)
    return len(dead)


def run_shard_tasks(
    job: Callable[[ShardTask], ShardReceipt],
    tasks: Sequence[ShardTask],
    directory: Path,
    tag: str,
    *,
    executor: Executor | None = None,
    desc: str = "shards",
    progress: bool = True,
) -> list[ShardReceipt]:
    """Run shard tasks through ``executor`` (default: this process); their receipts in task order.

    Afterwards the temporary folders of attempts that died before committing (a killed worker) are
    removed; ``tag`` is the token this run put in their names.
    """
    run = (executor or SerialExecutor()).map(
        job, list(tasks), desc=desc, unit="shard", progress=progress
    )
    with contextlib.closing(run):  # an error here stops the workers at once
        receipts = list(run)
    dead = remove_own_temps(directory, tag)
    if dead:
        log.info(
            "%d attempt(s) of a shard died before committing; their temporary folders are removed",
            dead,
        )
    return receipts


# ---------------------------------------------------------------------- shards of one .npz each
def write_npz_shard(
    directory: Path,
    task: ShardTask,
    arrays: Mapping[str, NDArray[Any]],
    *,
    plan: str = "",
    tag: str = "",
    rows: int = 0,
    seconds_from: float | None = None,
) -> ShardReceipt:
    """Write ``arrays`` (plus the plan digest) as the shard ``task.folder`` of ``directory``.

    Written into a unique temporary folder, committed by one rename (the first commit wins; a later
    attempt removes its temporary folder and reports ``committed=False``).

    Args:
        directory: the stage's shard folder.
        task: the shard.
        arrays: what the shard holds (digest-checked on read, :func:`read_npz_shards`).
        plan: the plan's digest, recorded in the shard.
        tag: put in the temporary folder's name (the owning run's token).
        rows: rows written (for the receipt).
        seconds_from: ``time.perf_counter()`` when the task started (for the receipt).
    """
    t0 = time.perf_counter() if seconds_from is None else seconds_from
    final = Path(directory) / task.folder
    tmp = make_temp_folder(final, tag=tag)
    try:
        save_npz(tmp / NPZ_NAME, {**arrays, "plan": np.array(plan)}, stands_for=shard_record(final))
        digest = str(load_npz(tmp / NPZ_NAME, what="shard")[DIGEST_KEY])
    except BaseException:
        discard_folder(tmp)
        raise
    committed = commit_folder(tmp, final)
    return ShardReceipt(
        task.number, task.folder, len(task.items), rows, digest, committed, time.perf_counter() - t0
    )


def shard_record(folder: Path) -> dict[str, str]:
    """What a committed ``shard.npz`` stands for: its folder, whose name is the shard's number and
    the digest of its items' names (so a valid shard copied into another shard's folder is refused,
    :func:`oxbench.cache.stands_for_record`)."""
    return {"shard": Path(folder).name}


def committed_folders(directory: Path) -> dict[int, list[Path]]:
    """``{shard number: committed folders of that number}`` in ``directory`` (none when missing)."""
    found: dict[int, list[Path]] = {}
    try:
        entries = sorted(os.listdir(directory))
    except FileNotFoundError:
        return found
    for entry in entries:
        if m := SHARD_DIR_RE.match(entry):
            found.setdefault(int(m.group(1)), []).append(Path(directory) / entry)
    return found


def read_npz_shards(
    directory: Path,
    names: Sequence[str],
    shard_size: int,
    *,
    what: str,
    check: Callable[[dict[str, NDArray[Any]], list[str]], str | None] | None = None,
    mapped: Sequence[str] = (),
) -> tuple[dict[int, dict[str, NDArray[Any]]], list[ShardTask]]:
    """The intact committed shards of a plan, and the tasks of the planned shards still to compute.

    A committed folder that is not the plan's (other items), or whose ``shard.npz`` fails its
    digest (tampered with after its commit), or that ``check(arrays, item names)`` refuses (a
    message), is deleted with a warning naming it, and its shard is computed again.

    Args:
        directory: the stage's shard folder.
        names: every item name, in plan order.
        shard_size: the plan's shard size.
        what: what the shards hold, for messages (``"visual-words shard"``).
        check: a further test of a shard's arrays against its items.
        mapped: members returned memory-mapped, not read (:func:`oxbench.cache.load_npz`).

    Returns:
        ``({shard number: arrays}, tasks)``: every planned shard is in exactly one of the two.
    """
    folders = committed_folders(directory)
    done: dict[int, dict[str, NDArray[Any]]] = {}
    todo: list[ShardTask] = []
    for task in plan_shards(names, shard_size):
        item_names = [names[i] for i in task.items]
        found = None
        for folder in folders.pop(task.number, []):
            if folder.name != task.folder:
                discard_folder(folder)  # a shard of another plan (other items): useless here
                continue
            try:
                arrays = load_npz(
                    folder / NPZ_NAME, what=what, mapped=mapped, stands_for=shard_record(folder)
                )
                problem = check(arrays, item_names) if check is not None else None
                if problem is not None:
                    raise CorruptCache(f"{what} {problem}", folder / NPZ_NAME)
            except (CorruptCache, InputError) as exc:
                log.warning("%s; computing that shard again", exc)
                discard_folder(folder)
                continue
            found = arrays
        if found is None:
            todo.append(task)
        else:
            done[task.number] = found
    for stale in folders.values():  # numbers beyond the plan
        for folder in stale:
            discard_folder(folder)
    return done, todo


def check_receipts(
    tasks: Sequence[ShardTask],
    receipts: Sequence[ShardReceipt],
    committed: Iterable[str],
    what: Path,
) -> None:
    """Every task's receipt names its own folder, and that folder is committed in ``what``.

    Raises:
        InputError: a task's shard is missing after its task returned (a broken executor or a
            shared folder that the workers do not share).
    """
    have = set(committed)
    for task, receipt in zip(tasks, receipts, strict=True):
        if receipt.folder != task.folder or receipt.folder not in have:
            raise InputError(
                f"{task}: not committed after its task returned (do the workers see this folder?)",
                what,
            )


def with_seconds(receipt: ShardReceipt, t0: float) -> ShardReceipt:
    """``receipt`` with the wall time since ``t0`` (``time.perf_counter()``)."""
    return dataclasses.replace(receipt, seconds=time.perf_counter() - t0)
