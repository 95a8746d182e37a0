"""A sharded, resumable on-disk store of global descriptors (one vector per image), keyed by name.

Layout of one store folder (one per dataset part and descriptor config)::

    <dir>/meta.json                          the settings that determine the descriptors (refused
                                             when they differ)
    <dir>/shard-000000-<names digest>/shard.npz
                                             names [n] str, descriptors float32 [n, D], the names
                                             that could not be decoded, with their digest
    <dir>/shard-000000.npz                   a shard written by earlier oxbench versions (still read)

Shards follow the write-once protocol of :mod:`oxbench.execution.shards` (:func:`fill_store`): the images, in
part order, are planned in shards of a fixed size; each shard's task (in this process, a worker
process, a Dask worker with a GPU, or a ``--partition`` process) describes its images and commits
the shard folder by one rename, returning only a receipt. An interrupted extraction leaves no shard
that looks complete; on the next run only the images in no intact shard are described. Every shard
carries the digest of its content; a shard that fails the check (a flipped byte, a truncated copy)
is reported, deleted and its images described again, never silently used.

The store knows nothing about how descriptors are made: the VLAD and the CNN descriptors of
:mod:`oxbench.pipelines.families.global_descriptors` and ``oxbench extract`` all use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, load_npz
from oxbench.errors import InputError
from oxbench.execution import Executor
from oxbench.execution.shards import (
    NPZ_NAME,
    SHARD_DIR_RE,
    ShardReceipt,
    ShardTask,
    check_shard_size,
    in_partition,
    plan_digest,
    plan_shards,
    run_shard_tasks,
    shard_record,
    write_npz_shard,
)
from oxbench.fileio import (
    discard_folder,
    read_input_bytes,
    require_regular_file,
)
from oxbench.storage import StoreFolder

log = logging.getLogger(__name__)

STORE_FORMAT = 1
_SHARD_RE = re.compile(r"^shard-(\d{6})\.npz$")  # earlier versions' flat shard files
_SHARD_LIMIT = 1 << 36

#: ``compute(positions) -> (described positions, float32 [len(described), D])``: the images it
#: could describe (a subset of ``positions``, in any order) and their vectors.
Compute = Callable[[list[int]], tuple[list[int], NDArray[np.float32]]]


def read_bounded(path: str | Path, limit: int) -> bytes:
    """:func:`~oxbench.fileio.read_input_bytes` of a file that may be large.

    ``read_input_bytes`` reads ``limit + 1`` bytes in one call, which allocates that much up front;
    asking for the file's own size keeps a generous ``limit`` from exhausting memory.
    """
    size = require_regular_file(path).st_size
    if size > limit:
        raise InputError(f"file is {size:,} bytes; the limit for this input is {limit:,}", path)
    return read_input_bytes(path, limit=size)


def shard_digest(names: Sequence[str], descriptors: NDArray[np.float32]) -> str:
    """sha256 of a shard's names and descriptor bytes (what a shard is checked against)."""
    h = hashlib.sha256(json.dumps(list(names)).encode())
    h.update(str(descriptors.shape).encode())
    h.update(np.ascontiguousarray(descriptors, np.float32).tobytes())
    return h.hexdigest()


def store_folder(directory: str | Path) -> StoreFolder:
    """A descriptor store's folder, as :mod:`oxbench.storage` checks it (its ``meta.json``: the
    settings that determine the descriptors, with their digest)."""
    names = ("shard-*", "*.lock", ".lock")
    return StoreFolder(Path(directory), "descriptor store", STORE_FORMAT, frozenset(names))


class DescriptorStore:
    """Global descriptors of many images, on disk, keyed by image name.

    Open with :meth:`open`; add with :meth:`write_shard` (or :func:`fill_store`); read with
    :meth:`get`.

    Attributes:
        directory: the store folder.
        settings: what determines the descriptors (recorded in ``meta.json``).
        dim: descriptor dimension (``None`` until the first shard is written).
        failed: names that a shard's task could not decode (a run that allows partial sets);
            they are not described again while their shard is kept.
    """

    def __init__(self, directory: Path, settings: dict[str, Any]) -> None:
        self.directory = directory
        self.settings = settings
        self.dim: int | None = None
        self.failed: set[str] = set()
        self._vectors: dict[str, NDArray[np.float32]] = {}
        self._next_number = 0

    @classmethod
    def open(
        cls, directory: str | Path, settings: dict[str, Any], *, create: bool = True
    ) -> DescriptorStore:
        """Open (or create) a store and read its intact shards.

        Args:
            directory: the store folder.
            settings: JSON-able settings that determine the descriptors; a folder built with other
                settings is refused.
            create: create the folder when missing (else :class:`InputError`).

        Raises:
            InputError: the folder holds descriptors of other settings, is missing with
                ``create=False``, or its ``meta.json`` is unreadable.
        """
        directory = Path(directory)
        box = store_folder(directory)
        expected = box.fields({"settings": settings})
        meta_path = directory / "meta.json"
        state = box.refuse_foreign()  # never written into, nor cleaned
        try:
            found = box.read_meta()
            if found is None and meta_path.is_file():  # an earlier oxbench's, without a digest
                found = json.loads(read_input_bytes(meta_path, limit=1 << 24))
        except (ValueError, InputError) as exc:
            problem = exc.problem if isinstance(exc, InputError) else str(exc)
            raise InputError(
                f"unreadable descriptor-store metadata ({problem}); delete the folder", meta_path
            ) from None
        if found is not None:
            if found != expected:
                raise InputError(
                    "descriptor store was built with other settings; use another cache folder or delete it",
                    directory,
                )
        elif not create:
            raise InputError("no descriptor store here (describe the images first)", directory)
        elif state in ("absent", "empty"):  # appears with its meta.json, by one rename
            box.create({"settings": settings})
            return cls.open(directory, settings, create=False)  # another process's, if first
        else:
            box.write_meta({"settings": settings})
        store = cls(directory, settings)
        store.refresh()
        return store

    def refresh(self) -> None:
        """Re-read the shards on disk (another process may have added some)."""
        self._vectors = {}
        self.failed = set()
        self.dim = None
        numbers = []
        store_folder(self.directory).remove_temps()
        for path in sorted(self.directory.iterdir()):
            if m := _SHARD_RE.match(path.name):
                loaded = self._read_shard(path)
            elif m := SHARD_DIR_RE.match(path.name):
                loaded = self._read_shard_folder(path)
            else:
                continue
            numbers.append(int(m.group(1)))
            if loaded is None:
                continue
            names, x, failed = loaded
            self.failed.update(failed)
            if not names:
                continue
            if self.dim is not None and x.shape[1] != self.dim:
                raise InputError(
                    f"shard has {x.shape[1]}-D descriptors, others {self.dim}-D; delete the folder",
                    path,
                )
            self.dim = int(x.shape[1])
            for i, name in enumerate(names):
                self._vectors[name] = x[i]
        self._next_number = max(numbers, default=-1) + 1

    @staticmethod
    def _read_shard(path: Path) -> tuple[list[str], NDArray[np.float32], list[str]] | None:
        """A shard file of earlier oxbench versions (``shard-NNNNNN.npz``)."""
        try:
            with np.load(io.BytesIO(read_bounded(path, _SHARD_LIMIT)), allow_pickle=False) as z:
                names = [str(n) for n in z["names"].tolist()]
                x = np.asarray(z["descriptors"], np.float32)
                digest = str(z["digest"])
        except Exception as exc:  # noqa: BLE001 - a damaged zip raises BadZipFile, zlib.error, EOFError...
            reason = f"unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
        else:
            if x.ndim == 2 and x.shape[0] == len(names) and shard_digest(names, x) == digest:
                return names, x, []
            reason = "fails its digest check"
        log.warning(
            "%s: descriptor shard %s; deleting it, its images will be described again", path, reason
        )
        path.unlink(missing_ok=True)
        return None

    @staticmethod
    def _read_shard_folder(folder: Path) -> tuple[list[str], NDArray[np.float32], list[str]] | None:
        """A committed shard folder of the write-once protocol."""
        try:
            z = load_npz(
                folder / NPZ_NAME, what="descriptor shard", stands_for=shard_record(folder)
            )
            names = [str(n) for n in z["names"].tolist()]
            x, failed = z["descriptors"], [str(n) for n in z["failed"].tolist()]
            if (
                x.dtype != np.float32
                or x.ndim != 2
                or x.shape[0] != len(names)
                or not np.isfinite(x).all()
            ):
                raise CorruptCache(
                    f"descriptor shard holds {x.dtype} {x.shape} for {len(names)} names", folder
                )
        except (CorruptCache, InputError, KeyError) as exc:
            log.warning(
                "%s: descriptor shard %s; deleting it, its images will be described again",
                folder,
                exc if not isinstance(exc, KeyError) else f"without {exc}",
            )
            discard_folder(folder)
            return None
        return names, x, failed

    def __contains__(self, name: object) -> bool:
        return name in self._vectors

    def __len__(self) -> int:
        return len(self._vectors)

    def names(self) -> list[str]:
        """Every stored name (shard order)."""
        return list(self._vectors)

    def missing(self, names: Iterable[str]) -> list[str]:
        """The given names that have no stored descriptor, in the given order."""
        return [n for n in names if n not in self._vectors]

    def write_shard(self, names: Sequence[str], descriptors: NDArray[np.floating]) -> Path:
        """Add one shard, numbered after every shard in the folder; returns its folder.

        :func:`fill_store` writes planned shards instead.

        Raises:
            ValueError: ``descriptors`` is not ``[len(names), D]`` finite, or ``D`` differs from
                the stored descriptors' dimension.
        """
        x = check_descriptors(names, descriptors, self.dim)
        task = plan_shards(list(names), max(1, len(names)))[0]
        task = ShardTask(
            self._next_number, task.items, f"shard-{self._next_number:06d}{task.folder[12:]}"
        )
        write_npz_shard(self.directory, task, shard_arrays(names, x, []))
        self._next_number += 1
        self.dim = int(x.shape[1])
        for i, name in enumerate(names):
            self._vectors[name] = x[i]
        return self.directory / task.folder

    def get(self, names: Sequence[str], *, missing_as_zero: bool = False) -> NDArray[np.float32]:
        """Descriptors ``float32 [len(names), D]`` in the given order.

        Args:
            names: image names.
            missing_as_zero: give names without a descriptor the zero vector (an image that could
                not be decoded, in a run that allows partial sets) instead of refusing.

        Raises:
            InputError: a name has no descriptor (and ``missing_as_zero`` is false), or the store is
                empty.
        """
        if self.dim is None:
            raise InputError("descriptor store is empty (extraction incomplete?)", self.directory)
        out = np.zeros((len(names), self.dim), np.float32)
        for i, name in enumerate(names):
            v = self._vectors.get(name)
            if v is not None:
                out[i] = v
            elif not missing_as_zero:
                raise InputError(
                    f"no descriptor for image {name!r} (extraction incomplete?)", self.directory
                )
        return out


def check_descriptors(
    names: Sequence[str], descriptors: NDArray[np.floating], dim: int | None
) -> NDArray[np.float32]:
    """``descriptors`` as ``float32 [len(names), D]``, refused (``ValueError``) when not finite or
    of another dimension than ``dim`` (``None``: any)."""
    x = np.ascontiguousarray(descriptors, np.float32)
    if x.ndim != 2 or x.shape[0] != len(names):
        raise ValueError(f"{len(names)} names but descriptors of shape {x.shape}")
    if dim is not None and len(x) and x.shape[1] != dim:
        raise ValueError(f"{x.shape[1]}-D descriptors for a store of {dim}-D descriptors")
    if not np.isfinite(x).all():
        raise ValueError("descriptors are not finite (NaN or infinity)")
    return x


def shard_arrays(
    names: Sequence[str], x: NDArray[np.float32], failed: Sequence[str]
) -> dict[str, NDArray[Any]]:
    """What one descriptor shard holds."""
    return {
        "names": np.array(list(names), dtype=str).reshape(-1),
        "descriptors": x,
        "failed": np.array(list(failed), dtype=str).reshape(-1),
    }


class DescribeGlobalShard:
    """Picklable job of the shard protocol: describe one planned shard's images with ``compute``
    (a picklable :data:`Compute`), commit the shard, return its receipt.

    A ``compute`` with a ``resources`` attribute (``{"GPU": 1}``) passes it on, so that a Dask
    cluster runs the task only on a worker that offers it.
    """

    def __init__(
        self, compute: Compute, names: Sequence[str], directory: Path, *, plan: str, tag: str
    ) -> None:
        self.compute = compute
        self.names = list(names)
        self.directory = Path(directory)
        self.plan = plan
        self.tag = tag
        self.resources = getattr(compute, "resources", None)

    def __call__(self, task: ShardTask) -> ShardReceipt:
        t0 = time.perf_counter()
        done, x = self.compute(list(task.items))
        if len(done) != len(x):
            raise ValueError(f"compute returned {len(done)} positions and {len(x)} descriptors")
        described = set(done)
        failed = [self.names[i] for i in task.items if i not in described]
        names = [self.names[i] for i in done]
        arrays = shard_arrays(names, check_descriptors(names, x, None), failed)
        return write_npz_shard(
            self.directory,
            task,
            arrays,
            plan=self.plan,
            tag=self.tag,
            rows=len(names),
            seconds_from=t0,
        )


def fill_store(
    store: DescriptorStore,
    names: Sequence[str],
    compute: Compute,
    *,
    executor: Executor | None = None,
    shard_size: int = 512,
    progress: bool = True,
    desc: str | None = None,
    partition: tuple[int, int] | None = None,
) -> list[str]:
    """Describe the images of ``names`` that the store lacks, by the shard protocol.

    Resumable: the images are planned in shards of ``shard_size`` (part order); shards already
    committed are skipped, and each task commits its shard before returning.

    Args:
        store: the store to fill.
        names: every image name of the part, in part order (``compute`` gets positions into it).
        compute: describes the images at the given positions (see :data:`Compute`); picklable
            when ``executor`` runs it elsewhere.
        executor: where the shards are described (:mod:`oxbench.execution`; default: this process).
        shard_size: images per shard.
        progress: tqdm bar (one step per shard).
        desc: the bar's label.
        partition: ``(i, n)``: describe only the planned shards numbered ``i`` modulo ``n``.

    Returns:
        The names ``compute`` could not describe (left out of the store; empty normally).
    """
    try:
        check_shard_size(shard_size)
    except InputError as exc:
        raise ValueError(exc.problem) from None
    tasks = in_partition(
        plan_shards(names, shard_size, have=set(store.names()) | store.failed), partition
    )
    if tasks:
        tag = uuid.uuid4().hex[:12]
        job = DescribeGlobalShard(
            compute, names, store.directory, plan=plan_digest(names, shard_size), tag=tag
        )
        run_shard_tasks(
            job,
            tasks,
            store.directory,
            tag,
            executor=executor,
            desc=desc or "descriptors",
            progress=progress,
        )
        store.refresh()
    planned = {i for t in tasks for i in t.items}
    missing = [
        names[i] for i in sorted(planned) if names[i] not in store and names[i] not in store.failed
    ]
    if missing:
        raise InputError(
            f"{len(missing)} image(s) have no descriptor after their shard's task returned, e.g. "
            f"{missing[0]!r} (do the workers see this folder?)",
            store.directory,
        )
    return [n for n in names if n in store.failed]
