"""A minimal stand-in for ``oxbench.formats.arrays.read_features`` (``.npy`` / ``.npz`` only).

TEMPORARY: the full reader (npy, npz, mat, fvecs) is being written in parallel as
``oxbench.formats.arrays.read_features(path, layout=, key=, normalize=)``. This module has the same
signature so that :mod:`oxbench.pipelines.featurefiles` (its only user) switches by changing one
import; delete this file then.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import read_input_bytes


def read_features(
    path: str | Path, *, layout: Literal["rows", "columns"] = "rows", key: str | None = None, normalize: bool = False
) -> NDArray[np.float32]:
    """Descriptors ``float32 [n, d]`` from an ``.npy`` file or one array of an ``.npz`` file.

    Args:
        path: the file.
        layout: ``"rows"`` (one descriptor per row) or ``"columns"`` (``[d, n]``, revisitop style).
        key: the array of an ``.npz`` file (default: its only array).
        normalize: L2-normalise every descriptor.

    Raises:
        InputError: unreadable file, not a finite numeric 2-D array, unknown key (names the file).
    """
    data = read_input_bytes(path, limit=1 << 40)
    try:
        loaded = np.load(io.BytesIO(data), allow_pickle=False)
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded as z:
                names = list(z.files)
                if key is None and len(names) != 1:
                    raise InputError(f"holds arrays {names}; say which one with key=", path)
                name = names[0] if key is None else key
                if name not in names:
                    raise InputError(f"has no array {name!r} (it holds {names})", path)
                x = np.asarray(z[name])
        else:
            x = np.asarray(loaded)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"not a readable .npy/.npz descriptor file ({exc})", path) from None
    if x.ndim != 2 or not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer)):
        raise InputError(f"descriptors must be a 2-D numeric array, got shape {x.shape} dtype {x.dtype}", path)
    if layout not in ("rows", "columns"):
        raise InputError(f"unknown layout {layout!r} (rows, columns)", path)
    x = np.ascontiguousarray(x.T if layout == "columns" else x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise InputError("descriptors hold NaN or infinite values", path)
    if normalize:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = np.divide(x, np.maximum(norms, 1e-12), dtype=np.float32)
    return x
