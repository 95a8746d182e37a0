"""A sharded, resumable on-disk store of global descriptors (one vector per image), keyed by name.

Layout of one store folder (one per dataset part and descriptor config)::

    <dir>/meta.json            the settings that determine the descriptors (refused when they differ)
    <dir>/shard-000000.npz     names [n] str, descriptors float32 [n, D], digest (sha256 of both)

A shard is written in one piece through :func:`oxbench.fileio.atomic_write_npz` (temporary name,
then rename), so an interrupted extraction leaves no shard that looks complete; on the next run the
store is reopened and only the names in no intact shard are described (:func:`fill_store`). Every
shard carries the sha256 of its names and vectors; a shard that fails the check (a flipped byte, a
truncated copy) is reported, deleted and its images described again, never silently used.

The store knows nothing about how descriptors are made: the VLAD and the CNN descriptors of
:mod:`oxbench.pipelines.families.global_descriptors` and ``oxbench extract`` all use it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import (
    atomic_write_json,
    atomic_write_npz,
    progress_bar,
    read_input_bytes,
    require_regular_file,
)

log = logging.getLogger(__name__)

STORE_FORMAT = 1
_SHARD_RE = re.compile(r"^shard-(\d{6})\.npz$")
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


class DescriptorStore:
    """Global descriptors of many images, on disk, keyed by image name.

    Open with :meth:`open`; add with :meth:`write_shard` (or :func:`fill_store`); read with
    :meth:`get`.

    Attributes:
        directory: the store folder.
        settings: what determines the descriptors (recorded in ``meta.json``).
        dim: descriptor dimension (``None`` until the first shard is written).
    """

    def __init__(self, directory: Path, settings: dict[str, Any]) -> None:
        self.directory = directory
        self.settings = settings
        self.dim: int | None = None
        self._vectors: dict[str, NDArray[np.float32]] = {}
        self._next_number = 0

    @classmethod
    def open(cls, directory: str | Path, settings: dict[str, Any], *, create: bool = True) -> DescriptorStore:
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
        expected = json.loads(json.dumps({"format": STORE_FORMAT, "settings": settings}))
        meta_path = directory / "meta.json"
        if meta_path.exists():
            try:
                found = json.loads(read_input_bytes(meta_path, limit=1 << 24))
            except (ValueError, InputError) as exc:
                raise InputError(f"unreadable descriptor-store metadata ({exc}); delete the folder", meta_path) from None
            if found != expected:
                raise InputError(
                    "descriptor store was built with other settings; use another cache folder or delete it",
                    directory,
                )
        elif not create:
            raise InputError("no descriptor store here (describe the images first)", directory)
        else:
            atomic_write_json(meta_path, expected)
        store = cls(directory, settings)
        store.refresh()
        return store

    def refresh(self) -> None:
        """Re-read the shards on disk (another process may have added some)."""
        self._vectors = {}
        self.dim = None
        numbers = []
        for path in sorted(self.directory.iterdir()):
            m = _SHARD_RE.match(path.name)
            if not m:
                continue
            numbers.append(int(m.group(1)))
            loaded = self._read_shard(path)
            if loaded is None:
                continue
            names, x = loaded
            if self.dim is not None and x.shape[1] != self.dim:
                raise InputError(f"shard has {x.shape[1]}-D descriptors, others {self.dim}-D; delete the folder", path)
            self.dim = int(x.shape[1])
            for i, name in enumerate(names):
                self._vectors[name] = x[i]
        self._next_number = max(numbers, default=-1) + 1

    @staticmethod
    def _read_shard(path: Path) -> tuple[list[str], NDArray[np.float32]] | None:
        try:
            with np.load(io.BytesIO(read_bounded(path, _SHARD_LIMIT)), allow_pickle=False) as z:
                names = [str(n) for n in z["names"].tolist()]
                x = np.asarray(z["descriptors"], np.float32)
                digest = str(z["digest"])
        except Exception as exc:  # noqa: BLE001 - a damaged zip raises BadZipFile, zlib.error, EOFError...
            reason = f"unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
        else:
            if x.ndim == 2 and x.shape[0] == len(names) and shard_digest(names, x) == digest:
                return names, x
            reason = "fails its digest check"
        log.warning("%s: descriptor shard %s; deleting it, its images will be described again", path, reason)
        path.unlink(missing_ok=True)
        return None

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
        """Add one shard (atomically); returns its path.

        Raises:
            ValueError: ``descriptors`` is not ``[len(names), D]`` finite, or ``D`` differs from
                the stored descriptors' dimension.
        """
        x = np.ascontiguousarray(descriptors, np.float32)
        if x.ndim != 2 or x.shape[0] != len(names):
            raise ValueError(f"{len(names)} names but descriptors of shape {x.shape}")
        if self.dim is not None and x.shape[1] != self.dim:
            raise ValueError(f"{x.shape[1]}-D descriptors for a store of {self.dim}-D descriptors")
        if not np.isfinite(x).all():
            raise ValueError("descriptors are not finite (NaN or infinity)")
        path = self.directory / f"shard-{self._next_number:06d}.npz"
        atomic_write_npz(path, {"names": np.array(list(names), dtype=str), "descriptors": x,
                                "digest": np.array(shard_digest(list(names), x))})
        self._next_number += 1
        self.dim = int(x.shape[1])
        for i, name in enumerate(names):
            self._vectors[name] = x[i]
        return path

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
                raise InputError(f"no descriptor for image {name!r} (extraction incomplete?)", self.directory)
        return out


def fill_store(
    store: DescriptorStore,
    names: Sequence[str],
    compute: Compute,
    *,
    shard_size: int = 512,
    progress: bool = True,
    desc: str | None = None,
) -> list[str]:
    """Describe the images of ``names`` that the store lacks, one shard per ``shard_size`` images.

    Resumable: names already stored are skipped, and each completed chunk is a shard on disk before
    the next begins.

    Args:
        store: the store to fill.
        names: every image name of the part, in part order (``compute`` gets positions into it).
        compute: describes the images at the given positions (see :data:`Compute`).
        shard_size: images per shard.
        progress: tqdm bar.
        desc: the bar's label.

    Returns:
        The names ``compute`` could not describe (left out of the store; empty normally).
    """
    if shard_size < 1:
        raise ValueError("shard_size must be >= 1")
    todo = [i for i, n in enumerate(names) if n not in store]
    failed: list[str] = []
    bar = progress_bar(total=len(names), initial=len(names) - len(todo), enabled=progress, desc=desc, unit="img")
    try:
        for s in range(0, len(todo), shard_size):
            chunk = todo[s : s + shard_size]
            done, x = compute(chunk)
            if len(done) != len(x):
                raise ValueError(f"compute returned {len(done)} positions and {len(x)} descriptors")
            if done:
                store.write_shard([names[i] for i in done], x)
            described = set(done)
            failed.extend(names[i] for i in chunk if i not in described)
            bar.update(len(chunk))
    finally:
        bar.close()
    return failed
