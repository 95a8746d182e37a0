"""A restricted unpickler for ground-truth pickles.

Pickles can run arbitrary code when loaded. The revisitop ground truth is only dicts, lists,
strings and numbers, so we load it with an unpickler that refuses every global lookup: any pickle
that names a class or function (numpy arrays included) is rejected before anything is built.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from oxbench.errors import InputError
from oxbench.formats.text import read_input_bytes


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D401
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: only plain containers and numbers are allowed"
        )


def _reason(exc: BaseException) -> str:
    """The exception's message on one line, at most 200 characters."""
    return " ".join(str(exc).split())[:200]


def load_plain_pickle(path: str | Path) -> Any:
    """Load a pickle that may contain only dicts, lists, tuples, sets, strings and numbers.

    Raises:
        InputError: the file is missing, not a pickle, or references any class or function.
    """
    return loads_plain_pickle(read_input_bytes(path), source=str(path))


def loads_plain_pickle(data: bytes, source: str = "<bytes>") -> Any:
    """Like :func:`load_plain_pickle` for bytes already in memory."""
    try:
        return _PlainUnpickler(io.BytesIO(data), encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise InputError(f"not a plain-data pickle: {_reason(exc)}", source) from None
    except (Exception, RecursionError) as exc:  # noqa: BLE001 - hostile bytes can raise anything
        # No global can be looked up, so no code of the file runs: whatever the unpickler raises
        # (EOFError, OverflowError, MemoryError for a huge declared length, UnicodeDecodeError,
        # unhashable set members...) means the bytes are not a readable plain-data pickle.
        raise InputError(
            f"not a readable pickle ({type(exc).__name__}: {_reason(exc)})", source
        ) from None
