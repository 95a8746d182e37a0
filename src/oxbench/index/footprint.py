"""What an index costs per database image, measured, and whether a run's index will fit in RAM.

A run at scale needs two numbers per family before anything else: the bytes of RAM the index holds
per database image (the structures search reads: posting lists, codes, vectors) and the bytes of
disk its stores keep per image (features that verification reads, descriptors, words, index
files). :class:`Footprint` holds both as *measured* sizes -- ``nbytes`` of the arrays the
structures are made of, the serialised size of a FAISS index, the sizes of the files on disk --
named part by part, with the costs that do not grow with the database (a vocabulary) kept apart,
so a projection to a larger collection is ``fixed + n * per_image``.

:func:`check_ram` is the pre-flight test: a run whose projected RAM exceeds what the machine has
available is refused with one line before any feature is extracted, instead of failing with an
out-of-memory error hours in.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.errors import InputError

#: ``OXBENCH_RAM_BYTES``: what :func:`available_ram` reports instead of the machine's figure (a
#: job scheduler's allocation, or a test).
RAM_ENV = "OXBENCH_RAM_BYTES"


def array_bytes(obj: Any) -> int:
    """Bytes held by the arrays inside ``obj``: a numpy array, a scipy sparse matrix (its data,
    indices and pointers), or lists, tuples and dict values of those (recursively); other objects
    count 0. Views count their base's bytes once per view (callers pass owning arrays).

    Example:
        >>> array_bytes([np.zeros(3, np.float32), {"a": np.zeros((2, 2), np.int64)}])
        44
    """
    import scipy.sparse as sp

    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if sp.issparse(obj):
        parts = [
            getattr(obj, a)
            for a in ("data", "indices", "indptr", "row", "col", "offsets")
            if hasattr(obj, a)
        ]
        return sum(int(p.nbytes) for p in parts if isinstance(p, np.ndarray))
    if isinstance(obj, list | tuple):
        return sum(array_bytes(o) for o in obj)
    if isinstance(obj, Mapping):
        return sum(array_bytes(o) for o in obj.values())
    return 0


def faiss_bytes(index: Any) -> int:
    """The size of a FAISS index as FAISS serialises it: codes, ids, quantiser and codebooks."""
    from oxbench.index.faiss_setup import load_faiss

    return int(load_faiss().serialize_index(index).size)


def disk_bytes(path: str | Path) -> int:
    """Bytes of the regular files at ``path`` (a file, or a folder walked without following
    links); 0 when it does not exist."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError:
        return 0
    if stat.S_ISREG(st.st_mode):
        return int(st.st_size)
    total = 0
    if stat.S_ISDIR(st.st_mode):
        for folder, _dirs, files in os.walk(p):
            for name in files:
                try:
                    fst = os.lstat(os.path.join(folder, name))
                except OSError:
                    continue
                if stat.S_ISREG(fst.st_mode):
                    total += int(fst.st_size)
    return total


@dataclass(frozen=True)
class Footprint:
    """Measured RAM and disk of an index over ``n_index`` images (database plus distractors).

    Attributes:
        n_index: images indexed.
        ram: ``{part: bytes}`` in RAM that grows with the database (posting lists, codes, vectors).
        disk: ``{part: bytes}`` on disk that grows with the database (feature stores, descriptors,
            words, index files).
        fixed_ram, fixed_disk: the same for parts whose size does not depend on the database
            (vocabulary, whitening, coarse quantiser).

    Example:
        >>> f = Footprint(4, ram={"postings": 400}, disk={"features": 1000}, fixed_ram={"vocabulary": 64})
        >>> f.ram_bytes_per_image, f.disk_bytes_per_image, f.projected_ram(10)
        (100.0, 250.0, 1064)
    """

    n_index: int
    ram: Mapping[str, int] = field(default_factory=dict)
    disk: Mapping[str, int] = field(default_factory=dict)
    fixed_ram: Mapping[str, int] = field(default_factory=dict)
    fixed_disk: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.n_index < 0:
            raise ValueError(f"n_index must be >= 0, got {self.n_index}")
        for what in (self.ram, self.disk, self.fixed_ram, self.fixed_disk):
            for k, v in what.items():
                if int(v) < 0:
                    raise ValueError(f"{k}: bytes must be >= 0, got {v}")

    @property
    def ram_bytes(self) -> int:
        """RAM of every part, fixed parts included."""
        return sum(self.ram.values()) + sum(self.fixed_ram.values())

    @property
    def disk_bytes(self) -> int:
        """Disk of every part, fixed parts included."""
        return sum(self.disk.values()) + sum(self.fixed_disk.values())

    @property
    def ram_bytes_per_image(self) -> float:
        """RAM that grows with the database, per indexed image (0 for an empty index)."""
        return sum(self.ram.values()) / self.n_index if self.n_index else 0.0

    @property
    def disk_bytes_per_image(self) -> float:
        """Disk that grows with the database, per indexed image."""
        return sum(self.disk.values()) / self.n_index if self.n_index else 0.0

    def projected_ram(self, n_index: int) -> int:
        """RAM of the same index over ``n_index`` images, assuming linear growth per image."""
        return int(round(sum(self.fixed_ram.values()) + self.ram_bytes_per_image * n_index))

    def projected_disk(self, n_index: int) -> int:
        """Disk of the same index over ``n_index`` images, assuming linear growth per image."""
        return int(round(sum(self.fixed_disk.values()) + self.disk_bytes_per_image * n_index))

    def to_dict(self) -> dict[str, Any]:
        """What a run record holds (``record.json`` ``"footprint"``)."""
        return {
            "n_index": self.n_index,
            "ram_bytes_per_image": self.ram_bytes_per_image,
            "disk_bytes_per_image": self.disk_bytes_per_image,
            "ram_bytes": self.ram_bytes,
            "disk_bytes": self.disk_bytes,
            "ram": {k: int(v) for k, v in self.ram.items()},
            "disk": {k: int(v) for k, v in self.disk.items()},
            "fixed_ram": {k: int(v) for k, v in self.fixed_ram.items()},
            "fixed_disk": {k: int(v) for k, v in self.fixed_disk.items()},
        }


def available_ram() -> int:
    """Bytes of RAM this process can still use: ``$OXBENCH_RAM_BYTES`` when set, else the
    smaller of the kernel's ``MemAvailable`` and a cgroup memory limit (what a container allows);
    ``sys.maxsize`` where neither can be read.

    Raises:
        InputError: ``OXBENCH_RAM_BYTES`` is not a positive integer.
    """
    env = os.environ.get(RAM_ENV)
    if env is not None:
        try:
            value = int(env)
        except ValueError:
            value = 0
        if value < 1:
            raise InputError(f"{RAM_ENV} must be a positive number of bytes, got {env!r}")
        return value
    figures = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                figures.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isascii() and text.isdigit() and len(text) <= 20 and int(text) < 1 << 60:
            figures.append(int(text))
    return min(figures) if figures else sys.maxsize  # unknown (not Linux): nothing is refused


def gib(n: float) -> str:
    """``n`` bytes as GiB text with two decimals (``"1.50 GiB"``)."""
    return f"{n / (1 << 30):.2f} GiB"


def check_ram(
    projected: int,
    n_index: int,
    *,
    basis: str,
    available: int | None = None,
    remedies: Sequence[str] = (),
) -> None:
    """Refuse a run whose index is projected to need more RAM than is available.

    Args:
        projected: projected bytes.
        n_index: images the index will hold.
        basis: how the projection was made (named in the message).
        available: bytes available (default :func:`available_ram`).
        remedies: what the method accepts that would fit (``--set inverted_file=mapped``),
            named after "fewer distractors" (:func:`oxbench.pipelines.estimates.ram_remedies`).

    Raises:
        InputError: one line with the projection, its basis, what is available and the remedies.
    """
    free = available_ram() if available is None else available
    if projected > free:
        fix = " or ".join(["fewer distractors", *remedies])
        raise InputError(
            f"the index of {n_index:,} images is projected to need {gib(projected)} of RAM ({basis}), "
            f"more than the {gib(free)} available; use {fix}, or set {RAM_ENV} if this machine "
            "has more"
        )
