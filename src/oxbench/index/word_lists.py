"""Per-word posting lists on disk, written chunk by chunk and memory-mapped for searching.

The memory-mapped inverted files (ASMK's :mod:`oxbench.index.asmk_file`, the Hamming
embedding's :mod:`oxbench.index.he_file`) keep each column of their postings -- image ids,
packed binary codes, geometry -- as one ``.npy`` file, CSR by word: the postings of word ``w``
are rows ``offsets[w]:offsets[w + 1]``, in image order. :class:`WordRuns` builds such columns for
any number of images while holding one chunk and one block: each chunk's postings are sorted by
word (stably, so images stay in order) and written as a *run*; :meth:`WordRuns.merge` then, column
after column, reads every run's slice of a block of words, merges them (runs in image order) and
appends the block to the column's file (the first column's blocks offered to a callback: norms),
deleting the column's runs once it is written -- so the disk holds the runs and one column more
at the peak, not two copies of the postings.

:func:`write_folder` finishes a folder built in a temporary folder beside its final name
(:class:`oxbench.storage.StoreFolder`): ``meta.json`` says what the lists stand for (the content
digests of the inputs and the settings) and holds the digests of the arrays read on open;
:func:`bind` records, beside each mapped file, what it was written for (the folder's
``meta.json`` and the offsets), and :func:`read_folder` / :func:`open_columns` check all of it
(:func:`oxbench.cache.check_written` for the mapped columns, never hashed in full), so a folder
of other inputs, a file replaced or one left from another build is never scored.

:func:`scatter_hamming` is the scoring loop both files share: one query code against one word's
list, ``scores[ids[i]] += weights[hamming(codes[i], q)]``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, arrays_digest, check_written, record_written
from oxbench.errors import InputError
from oxbench.evaluation.kernels import _accel, accelerated
from oxbench.fileio import (
    atomic_open,
    atomic_write_npy,
    discard_folder,
    json_digest,
    make_temp_folder,
)
from oxbench.index.postings import _word_blocks
from oxbench.storage import StoreFolder

#: Postings merged at a time (~100 MB of columns): few, long reads of each run, as a million
#: images leave hundreds of runs.
MERGE_POSTINGS = 1 << 22

_asmk_scatter = getattr(_accel, "asmk_scatter", None)


@dataclass(frozen=True)
class Column:
    """One column of the postings: ``<name>.npy``, ``dtype [n]`` or ``dtype [n, width]``."""

    name: str
    dtype: type
    width: int = 0

    def shape(self, n: int) -> tuple[int, ...]:
        return (n, self.width) if self.width else (n,)

    @property
    def item_bytes(self) -> int:
        return np.dtype(self.dtype).itemsize * max(self.width, 1)


class WordRuns:
    """Chunks of postings written as word-sorted runs, then merged into per-word columns.

    Use as a context manager (the runs' folder is removed on exit): :meth:`add` each chunk, then
    :meth:`merge` once.

    Args:
        folder: the folder being built (:meth:`oxbench.storage.StoreFolder.building`: what a
            killed build left is removed there); the runs go to a temporary folder inside it.
        n_words: vocabulary size.
        columns: the posting columns.
    """

    def __init__(self, folder: Path, n_words: int, columns: Sequence[Column]) -> None:
        self.folder = Path(folder)
        self.n_words = int(n_words)
        self.columns = tuple(columns)
        self.counts = np.zeros(self.n_words, np.int64)
        self._dir = make_temp_folder(self.folder / "runs")
        self._runs: list[NDArray[np.int64]] = []

    def __enter__(self) -> WordRuns:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        discard_folder(self._dir)

    def add(self, words: NDArray[np.int64], values: Mapping[str, NDArray]) -> NDArray[np.int64]:
        """Write one chunk's postings (``words [m]`` and each column's ``[m]`` values) as a run.

        Returns the chunk's order by word (stable): ``words[order]`` is what the run holds.
        """
        order = np.argsort(words, kind="stable")
        w = words[order]
        indptr = np.searchsorted(w, np.arange(self.n_words + 1)).astype(np.int64)
        self.counts += np.diff(indptr)
        k = len(self._runs)
        for c in self.columns:
            np.ascontiguousarray(values[c.name][order], dtype=c.dtype).tofile(
                self._dir / f"{k}.{c.name}.bin"
            )
        self._runs.append(indptr)
        return order

    def merge(
        self,
        on_block: Callable[[NDArray[np.int64], NDArray], None] | None = None,
    ) -> NDArray[np.int64]:
        """Write ``<column>.npy`` for every column into the folder and return the offsets ``int64
        [n_words + 1]``; ``on_block(words, values)`` sees each merged block of the first column.

        The columns are merged one after the other and each column's runs are deleted once it
        is written, so the disk holds the runs and one written column more, not two copies of
        the postings. The files appear when all are written (none on an error).
        """
        nnz = int(self.counts.sum())
        offsets = np.zeros(self.n_words + 1, np.int64)
        offsets[1:] = np.cumsum(self.counts)
        blocks = list(_word_blocks(self.counts, MERGE_POSTINGS))
        with ExitStack() as stack:
            for j, c in enumerate(self.columns):
                out = stack.enter_context(atomic_open(self.folder / f"{c.name}.npy"))
                header = {
                    "descr": np.lib.format.dtype_to_descr(np.dtype(c.dtype)),
                    "fortran_order": False,
                    "shape": c.shape(nnz),
                }
                np.lib.format.write_array_header_1_0(out, header)
                for w0, w1 in blocks:
                    words, parts = self._read_block(c, w0, w1)
                    order = np.argsort(words, kind="stable")  # the runs are in image order
                    values = parts[order]
                    out.write(np.ascontiguousarray(values).tobytes())
                    if j == 0 and on_block is not None:
                        on_block(words[order], values)
                for k in range(len(self._runs)):
                    (self._dir / f"{k}.{c.name}.bin").unlink()
        return offsets

    def _read_block(self, c: Column, w0: int, w1: int) -> tuple[NDArray[np.int64], NDArray]:
        """Every run's postings of words ``w0 .. w1 - 1`` in column ``c`` (read, not mapped: no
        resident pages), run after run, with their words."""
        parts, words = [], []
        per = max(c.width, 1)
        for k, indptr in enumerate(self._runs):
            a, b = int(indptr[w0]), int(indptr[w1])
            values: NDArray = np.fromfile(
                self._dir / f"{k}.{c.name}.bin", c.dtype, (b - a) * per, offset=c.item_bytes * a
            )
            parts.append(values.reshape(c.shape(b - a)))
            words.append(np.repeat(np.arange(w0, w1), np.diff(indptr[w0 : w1 + 1])))
        return np.concatenate(words), np.concatenate(parts)


def stands_for(meta: Mapping[str, object], offsets: NDArray[np.int64]) -> dict[str, object]:
    """What a folder's mapped files stand for: its ``meta.json`` and its offsets."""
    return {"meta": json_digest(meta), "offsets": hashlib.sha256(offsets.tobytes()).hexdigest()}


def bind(
    folder: Path, columns: Sequence[Column], meta: Mapping[str, object], offsets: NDArray[np.int64]
) -> None:
    """Record, beside each column's file, what it stands for (:func:`stands_for`)."""
    for c in columns:
        record_written(Path(folder) / f"{c.name}.npy", stands_for(meta, offsets))


def open_columns(
    folder: Path,
    columns: Sequence[Column],
    meta: Mapping[str, object],
    offsets: NDArray[np.int64],
    *,
    what: str,
) -> dict[str, NDArray]:
    """Map each column's file after checking it is the one :func:`bind` recorded, of the shape
    and type ``meta`` and ``offsets`` say (views of the maps, without ``np.memmap``'s per-slice
    cost).

    Raises:
        InputError: a file that cannot be read or that disagrees with ``meta.json``.
        CorruptCache: a file that is not the one written for this ``meta.json``.
    """
    nnz = int(offsets[-1])
    out: dict[str, NDArray] = {}
    for c in columns:
        path = Path(folder) / f"{c.name}.npy"
        try:
            a = np.load(path, mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"unreadable {what} ({type(exc).__name__}: {exc})", path) from None
        if a.shape != c.shape(nnz) or a.dtype != np.dtype(c.dtype):
            raise InputError(
                f"{what}: {c.name}.npy is {a.dtype} {a.shape}, meta.json says "
                f"{np.dtype(c.dtype)} {c.shape(nnz)} (damaged?)",
                folder,
            )
        check_written(path, what=what, stands_for=stands_for(meta, offsets))
        out[c.name] = np.asarray(a)
    return out


def write_folder(
    folder: Path,
    columns: Sequence[Column],
    meta: Mapping[str, object],
    offsets: NDArray[np.int64],
    arrays: Mapping[str, NDArray],
    *,
    what: str,
    stands_for: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """Finish a folder whose columns :meth:`WordRuns.merge` wrote: the arrays read into RAM on
    open (``offsets.npy`` and ``<name>.npy`` of each of ``arrays``, their digests in
    ``meta.json``), the columns bound to the meta and the offsets (:func:`bind`), and
    ``meta.json`` last (:class:`~oxbench.storage.StoreFolder`: ``meta`` with its ``format``, what
    the folder stands for and a digest). Returns the meta's fields."""
    box = StoreFolder(Path(folder), what, int(meta["format"]))  # type: ignore[call-overload]
    ram = {"offsets": offsets, **arrays}
    for name, a in ram.items():
        atomic_write_npy(Path(folder) / f"{name}.npy", a)
    digests = {name: arrays_digest({name: np.asarray(a)}) for name, a in ram.items()}
    fields = box.fields({**meta, "arrays": digests}, stands_for=stands_for)
    bind(folder, columns, fields, offsets)
    return box.write_meta({**meta, "arrays": digests}, stands_for=stands_for)


def read_folder(
    folder: Path,
    *,
    fmt: int,
    columns_of: Callable[[Mapping[str, Any]], Sequence[Column]],
    arrays: Mapping[str, tuple[str, type]],
    what: str,
    valid_meta: Callable[[Mapping[str, Any]], bool] = lambda meta: True,
    stands_for: Mapping[str, object] | None = None,
) -> tuple[dict[str, Any], NDArray[np.int64], dict[str, NDArray], dict[str, NDArray]]:
    """Open a folder :func:`write_folder` finished: ``(meta, offsets, arrays, columns)``, the
    arrays read into RAM (each checked against its digest), the columns mapped
    (:func:`open_columns`).

    Args:
        fmt: the format number ``meta.json`` must hold.
        columns_of: the columns, from the meta.
        arrays: per array read into RAM, the ``meta.json`` key of its length and its dtype.
        what: the file's name in messages.
        valid_meta: the kind's own checks of ``meta.json`` (may raise ``KeyError`` /
            ``ValueError`` / ``TypeError`` for a missing or mistyped key).
        stands_for: what the folder must have been written for (its inputs' content digests
            and settings); ``None``: not checked.

    Raises:
        InputError: a missing or unreadable file, or files that disagree with ``meta.json``.
        CorruptCache: a damaged ``meta.json``, a folder written for another ``stands_for``, an
            array that fails its digest, or a mapped file that is not the one written for this
            ``meta.json``.
    """
    folder = Path(folder)
    meta = StoreFolder(folder, what, fmt).meta(stands_for=stands_for)
    try:
        offsets = np.load(folder / "offsets.npy", allow_pickle=False)
        loaded = {n: np.load(folder / f"{n}.npy", allow_pickle=False) for n in arrays}
        ok = (
            valid_meta(meta)
            and valid_offsets(offsets, int(meta["n_words"]), int(meta["nnz"]))
            and all(
                loaded[n].shape == (int(meta[key]),) and loaded[n].dtype == np.dtype(dtype)
                for n, (key, dtype) in arrays.items()
            )
        )
        columns = columns_of(meta) if ok else ()
        digests = meta["arrays"]
        intact = all(
            digests[n] == arrays_digest({n: a}) for n, a in {"offsets": offsets, **loaded}.items()
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"unreadable {what} ({type(exc).__name__}: {exc})", folder) from None
    if not ok:
        raise InputError(f"{what} does not agree with its meta.json (damaged?)", folder)
    if not intact:
        raise CorruptCache(f"{what}: an array read on open does not match its digest", folder)
    return meta, offsets, loaded, open_columns(folder, columns, meta, offsets, what=what)


def valid_offsets(offsets: NDArray, n_words: int, nnz: int) -> bool:
    """``int64 [n_words + 1]`` from 0 to ``nnz``, non-decreasing."""
    return bool(
        offsets.shape == (n_words + 1,)
        and offsets.dtype == np.int64
        and int(offsets[0]) == 0
        and int(offsets[-1]) == nnz
        and (np.diff(offsets) >= 0).all()
    )


def scatter_hamming(
    scores: NDArray[np.float64],
    ids: NDArray[np.uint32],
    block: NDArray[np.uint64],
    q: NDArray[np.uint64],
    weights: NDArray[np.float64],
) -> None:
    """``scores[ids[i]] += weights[hamming(block[i], q)]`` over one word's list (``block``:
    ``uint64 [m, d / 64]``, ``q``: ``uint64 [d / 64]``, ``weights``: ``[d + 1]``).

    The compiled kernel (``asmk_scatter`` in :mod:`oxbench.evaluation._accel`, when
    :func:`oxbench.evaluation.kernels.accelerated`) does it in one pass; otherwise, or when it
    reports an anomaly (leaving ``scores`` untouched), numpy does, with the same additions in the
    same order (an image twice in a list adds twice): the same scores, to the bit.
    """
    if (
        _asmk_scatter is not None
        and accelerated()
        and not _asmk_scatter(scores, ids, block, q, weights)
    ):
        return
    h = np.bitwise_count(block[:, 0] ^ q[0])
    if block.shape[1] * 64 > 255:  # bitwise_count gives uint8
        h = h.astype(np.uint16)
    for j in range(1, block.shape[1]):
        h += np.bitwise_count(block[:, j] ^ q[j])
    # every posting, weak ones adding 0: cheaper than selecting the strong ones first
    np.add.at(scores, ids, weights.take(h))


__all__ = [
    "MERGE_POSTINGS",
    "Column",
    "WordRuns",
    "bind",
    "open_columns",
    "read_folder",
    "scatter_hamming",
    "stands_for",
    "valid_offsets",
    "write_folder",
]
