"""A restricted unpickler for ground-truth pickles (and, when asked, plain numpy arrays).

Pickles can run arbitrary code when loaded. The revisitop ground truth is only dicts, lists,
strings and numbers, so we load it with an unpickler that refuses every global lookup: any pickle
that names a class or function (numpy arrays included) is rejected before anything is built.

Some official files hold numpy arrays (ILIAS's similarity pickle: ``sims``, ``ranks``, the id
arrays). With ``arrays=True`` the unpickler admits exactly what rebuilds an array of numbers,
booleans or fixed-width text, under numpy 1 and 2 names, and nothing else: ``_reconstruct`` only of
an empty ``ndarray`` (the data then comes from the pickle's own bytes, whose length numpy checks
against the shape), ``_frombuffer`` of the pickle's bytes, numpy scalars and dtypes of those
kinds. No object arrays, no structured dtypes, no other class or function; no code of the file
runs. What loads is checked again, all the way down.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from oxbench.errors import InputError
from oxbench.fileio import DEFAULT_INPUT_LIMIT
from oxbench.formats.text import read_input_bytes

#: The dtype kinds an admitted array may have: booleans, integers, floats, complex, text, bytes.
ARRAY_KINDS = frozenset("biufcUS")
#: The deepest nesting of containers a plain-data pickle may have.
MAX_DEPTH = 64


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: only plain containers and numbers are allowed"
        )


class _NdarrayMarker:
    """Stands for ``numpy.ndarray`` inside a pickle: accepted only as ``_reconstruct``'s class."""


_NDARRAY = _NdarrayMarker()


def _plain_dtype(spec: Any, align: Any = False, copy: Any = False) -> np.dtype[Any]:
    if not isinstance(spec, str) or len(spec) > 16:
        raise pickle.UnpicklingError(f"refusing dtype {spec!r}: only plain number or text dtypes")
    dtype = np.dtype(spec)
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise pickle.UnpicklingError(f"refusing dtype {spec!r}: only plain number or text dtypes")
    return np.dtype(spec, bool(align), bool(copy))


def _reconstruct(cls: Any, shape: Any, typecode: Any) -> np.ndarray:
    if cls is not _NDARRAY or shape != (0,) or typecode != b"b":
        raise pickle.UnpicklingError("refusing an array built other than by numpy's own pickling")
    return np.ndarray((0,), dtype=np.int8)


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any) -> np.ndarray:
    if not isinstance(dtype, np.dtype) or dtype.kind not in ARRAY_KINDS:
        raise pickle.UnpicklingError("refusing an array of a dtype other than numbers or text")
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise pickle.UnpicklingError(f"refusing an array of shape {shape!r}")
    if order not in ("C", "F"):
        raise pickle.UnpicklingError(f"refusing an array of order {order!r}")
    data = memoryview(buf).cast("B")
    if int(np.prod(shape, dtype=object)) * dtype.itemsize != data.nbytes:
        raise pickle.UnpicklingError("an array's bytes do not fit its shape")
    return np.frombuffer(data, dtype=dtype).reshape(shape, order=order).copy()


def _scalar(dtype: Any, data: Any = b"") -> Any:
    if not isinstance(dtype, np.dtype) or dtype.kind not in ARRAY_KINDS:
        raise pickle.UnpicklingError("refusing a scalar of a dtype other than numbers or text")
    if not isinstance(data, bytes) or len(data) != dtype.itemsize:
        raise pickle.UnpicklingError("a scalar's bytes do not fit its dtype")
    return np.frombuffer(data, dtype=dtype)[0]


def _latin1_bytes(text: Any, encoding: Any = "latin1") -> bytes:
    """Protocol 2 writes bytes as ``_codecs.encode(text, "latin1")``."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("refusing _codecs.encode other than of text to latin1 bytes")
    return text.encode("latin1")


_ARRAY_GLOBALS: dict[tuple[str, str], Any] = {("_codecs", "encode"): _latin1_bytes}
for _core in ("numpy.core", "numpy._core"):
    _ARRAY_GLOBALS[(f"{_core}.multiarray", "_reconstruct")] = _reconstruct
    _ARRAY_GLOBALS[(f"{_core}.multiarray", "scalar")] = _scalar
    _ARRAY_GLOBALS[(f"{_core}.numeric", "_frombuffer")] = _frombuffer
_ARRAY_GLOBALS[("numpy", "ndarray")] = _NDARRAY
_ARRAY_GLOBALS[("numpy", "dtype")] = _plain_dtype


class _ArrayUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        found = _ARRAY_GLOBALS.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: only plain containers, numbers and numpy "
                "arrays of numbers or text are allowed"
            )
        return found


def _reason(exc: BaseException) -> str:
    """The exception's message on one line, at most 200 characters."""
    return " ".join(str(exc).split())[:200]


def _check_plain(value: Any, depth: int = 0) -> None:
    """Refuse anything but plain containers, numbers, text and arrays of :data:`ARRAY_KINDS`."""
    if depth > MAX_DEPTH:
        raise pickle.UnpicklingError(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in ARRAY_KINDS or value.dtype.fields is not None:
            raise pickle.UnpicklingError(f"refusing an array of dtype {value.dtype}")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_plain(k, depth + 1)
            _check_plain(v, depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            _check_plain(v, depth + 1)
    elif isinstance(value, _NdarrayMarker):
        raise pickle.UnpicklingError("refusing numpy.ndarray outside an array")
    elif not isinstance(value, str | bytes | bytearray | int | float | complex | np.generic | None):
        raise pickle.UnpicklingError(f"refusing a {type(value).__name__}")


def load_plain_pickle(
    path: str | Path, *, arrays: bool = False, limit: int = DEFAULT_INPUT_LIMIT
) -> Any:
    """Load a pickle that may contain only dicts, lists, tuples, sets, strings and numbers (and,
    with ``arrays=True``, numpy arrays of numbers, booleans or text).

    Raises:
        InputError: the file is missing, not a pickle, or references any other class or function.
    """
    return loads_plain_pickle(read_input_bytes(path, limit=limit), source=str(path), arrays=arrays)


def loads_plain_pickle(data: bytes, source: str = "<bytes>", *, arrays: bool = False) -> Any:
    """Like :func:`load_plain_pickle` for bytes already in memory."""
    unpickler = _ArrayUnpickler if arrays else _PlainUnpickler
    try:
        value = unpickler(io.BytesIO(data), encoding="latin1").load()
        if arrays:
            _check_plain(value)
        return value
    except pickle.UnpicklingError as exc:
        raise InputError(f"not a plain-data pickle: {_reason(exc)}", source) from None
    except (Exception, RecursionError) as exc:  # noqa: BLE001 - hostile bytes can raise anything
        # No global can be looked up, so no code of the file runs: whatever the unpickler raises
        # (EOFError, OverflowError, MemoryError for a huge declared length, UnicodeDecodeError,
        # unhashable set members...) means the bytes are not a readable plain-data pickle.
        raise InputError(
            f"not a readable pickle ({type(exc).__name__}: {_reason(exc)})", source
        ) from None
