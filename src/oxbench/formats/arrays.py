"""Descriptors, scores and ranks in the files people already have.

=================  =====================================================  ========================
suffix             what                                                   read as
=================  =====================================================  ========================
``.npy``           one numpy array (memory-mapped, never unpickled)       features, scores, ranks
``.npz``           numpy archive: its only array, or the one named `key`  features, scores, ranks
``.mat``           MATLAB v5 (scipy) or v7.3 (HDF5: ``pip install         features, scores, ranks
                   "oxbench[mat]"``); its only variable, or `key`
``.h5``            HDF5 (``pip install "oxbench[mat]"``): its only root     features
                   dataset, or the one named `key`
``.fvecs``         texmex: per vector an int32 dimension, then float32s   features
``.bvecs``         texmex: per vector an int32 dimension, then uint8s     features
``.ivecs``         texmex: per list an int32 length, then int32 indices   ranks (one query a row)
``.txt``           one query per line, whitespace-separated indices       ranks (one query a line)
=================  =====================================================  ========================

Orientation is never guessed. Features are ``[n, d]`` (``layout="n-d"``, one vector a row: numpy,
FAISS, texmex) or ``[d, n]`` (``layout="d-n"``, one vector a column: revisitop's ``.mat`` files,
``X`` and ``Q``). A MATLAB array has the shape MATLAB shows, whether the file is v5 or v7.3 (HDF5
stores it transposed; it is transposed back). Ranks in an array file are in the revisitop layout
(rows = ranked positions, columns = queries); in ``.ivecs`` and text files each record/line is one
query's list. :func:`read_ranks` returns the internal layout ``[n_queries, k]`` either way.

Image names for the rows of a feature file (:func:`read_names`) come from a text file (one name a
line) or from the array of strings inside an ``.npz``, ``.h5`` or MATLAB v5 ``.mat`` file (a char
matrix or a cell array of strings), as the features themselves may carry them.

Every problem is an :class:`~oxbench.errors.InputError` naming the file: an unknown suffix (with
what is accepted), a truncated or empty file, a texmex record whose dimension header differs from
the first, non-numeric text, a non-numeric or complex array, a missing or ambiguous key.
"""

from __future__ import annotations

import logging
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.fileio import read_input_bytes, require_regular_file
from oxbench.formats.oxford_gt import clean_name
from oxbench.formats.text import read_text_lines

log = logging.getLogger(__name__)

Layout = Literal["n-d", "d-n"]
LAYOUTS: tuple[str, ...] = ("n-d", "d-n")

FEATURE_SUFFIXES: tuple[str, ...] = (".npy", ".npz", ".mat", ".h5", ".fvecs", ".bvecs")
NAME_SUFFIXES: tuple[str, ...] = (".txt", ".npz", ".h5", ".mat")
RANK_SUFFIXES: tuple[str, ...] = (".npy", ".npz", ".mat", ".ivecs", ".txt")
MATRIX_SUFFIXES: tuple[str, ...] = (".npy", ".npz", ".mat")
_TEXMEX: dict[str, np.dtype[Any]] = {
    ".fvecs": np.dtype("<f4"),
    ".bvecs": np.dtype("u1"),
    ".ivecs": np.dtype("<i4"),
}
#: Text rank files are read whole: at most this many bytes (about 100M indices).
TEXT_RANKS_LIMIT = 1 << 30
_MAX_TEXMEX_DIM = 1 << 24
_MAT73_MAGIC = b"\x89HDF\r\n\x1a\n"


def _suffix(path: Path, accepted: tuple[str, ...], what: str) -> str:
    suffix = path.suffix.lower()
    if suffix not in accepted:
        shown = f"'{path.suffix}'" if path.suffix else "no suffix"
        raise InputError(
            f"unsupported file type ({shown}): {what} are read from {', '.join(accepted)}", path
        )
    return suffix


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def default_max_bytes() -> int:
    """The default budget of one array read from a file: a quarter of the machine's memory
    (4 GiB where the platform does not say)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        total = 16 << 30
    return max(int(total) // 4, 1 << 20)


def check_budget(
    shape: tuple[int, ...], itemsize: int, path: Path, what: str, max_bytes: int | None
) -> None:
    """Refuse, before anything is allocated, an array whose declared shape needs more than
    ``max_bytes`` (as stored, or as the ``float32`` copy it becomes).

    Raises:
        InputError: one line with the declared shape, its bytes and the budget.
    """
    limit = default_max_bytes() if max_bytes is None else max_bytes
    count = math.prod(int(n) for n in shape)
    need = count * max(int(itemsize), 4)
    if need > limit:
        raise InputError(
            f"{what} declares shape {tuple(int(n) for n in shape)}: {need:,} bytes to read, over the "
            f"budget of {limit:,} (max_bytes=)",
            path,
        )


def _pick(arrays: dict[str, Any], key: str | None, path: Path, kind: str) -> tuple[str, Any]:
    """The array named ``key``, or the only one; refuses a missing or ambiguous key."""
    names = sorted(arrays)
    if not names:
        raise InputError(f"the {kind} holds no array", path)
    if key is None:
        if len(names) > 1:
            raise InputError(
                f"the {kind} holds {', '.join(names)}: choose one with --key (key=)", path
            )
        return names[0], arrays[names[0]]
    if key not in arrays:
        raise InputError(f"no array {key!r} in the {kind}; it holds {', '.join(names)}", path)
    return key, arrays[key]


def map_npy(path: str | Path) -> np.ndarray:
    """A ``.npy`` file memory-mapped (read-only), its header checked against the file first: a
    header claiming more bytes than the file holds (``(1e11, 1e11)``) is one line, not an
    overflow or a map of exabytes.

    Raises:
        InputError: unreadable, no numpy header, a header that does not fit the file, objects.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(6)
            if magic == b"\x93NUMPY":
                fh.seek(0)
                version = np.lib.format.read_magic(fh)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(fh)
                offset, size = fh.tell(), os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    except ValueError as exc:
        if "Object arrays" in str(exc) or "pickle" in str(exc):
            raise InputError("holds Python objects (a pickled array), not numbers", path) from None
        raise InputError(f"not a readable .npy array ({_first_line(exc)})", path) from None
    if not magic:
        raise InputError("empty file: not a .npy array", path)
    if magic != b"\x93NUMPY":
        raise InputError("not a readable .npy array (no numpy header)", path)
    if dtype.hasobject:
        raise InputError("holds Python objects (a pickled array), not numbers", path)
    claimed = math.prod(int(n) for n in shape) * dtype.itemsize
    if claimed > size - offset:
        raise InputError(
            f"not a readable .npy array (truncated or damaged: its header claims shape "
            f"{tuple(shape)} of {dtype}, {claimed:,} bytes, and the file holds {size - offset:,})",
            path,
        )
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError, OverflowError, MemoryError) as exc:
        raise InputError(f"not a readable .npy array ({_first_line(exc)})", path) from None
    if not isinstance(arr, np.ndarray):
        raise InputError("expected a single .npy array", path)
    return arr


def _read_npz(path: Path, key: str | None, max_bytes: int | None = None) -> np.ndarray:
    try:
        with np.load(path, allow_pickle=False) as npz:
            name, _ = _pick({n: None for n in npz.files}, key, path, ".npz archive")
            member = name if name in npz.zip.namelist() else f"{name}.npy"
            with npz.zip.open(member) as fh:
                version = np.lib.format.read_magic(fh)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(fh)
            check_budget(shape, dtype.itemsize, path, f"array {name!r}", max_bytes)
            return np.asarray(npz[name])
    except InputError:
        raise
    except ValueError as exc:
        if "Object arrays" in str(exc):
            raise InputError("holds Python objects (a pickled array), not numbers", path) from None
        raise InputError(f"not a readable .npz archive ({_first_line(exc)})", path) from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise InputError(
            f"not a readable .npz archive (truncated or damaged: {_first_line(exc)})", path
        ) from None
    except Exception as exc:  # zlib.error and friends from a damaged member  # noqa: BLE001
        raise InputError(f"not a readable .npz archive ({_first_line(exc)})", path) from None


def _is_mat73(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(520)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    return head.startswith(b"MATLAB 7.3") or head[512:520] == _MAT73_MAGIC


def refuse_outside_links(f: Any, path: Path) -> None:
    """Refuse an HDF5 file that reads data from elsewhere: an external link, a virtual dataset (its
    data lives in other files), or a soft link whose target is not in the file. Checked on the links
    themselves (``get(..., getlink=True)``) before any dataset is read or any link followed.

    Raises:
        InputError: one line naming the file and the object.
    """
    h5py = require("h5py", "mat")
    seen: set[int] = set()
    stack: list[Any] = [f]
    soft: list[tuple[Any, str, str, str]] = []
    while stack:
        group = stack.pop()
        for name in group:
            link = group.get(name, getlink=True)
            where = f"{group.name.rstrip('/')}/{name}"
            if isinstance(link, h5py.ExternalLink):
                raise InputError(
                    f"object {where!r} is an external link to {link.filename}:{link.path}; "
                    "features must be stored in the file itself",
                    path,
                )
            if isinstance(link, h5py.SoftLink):
                soft.append((group, name, where, link.path))
                continue  # resolved once no external link is left to follow through
            obj = group[name]
            addr = h5py.h5o.get_info(obj.id).addr
            if addr in seen:
                continue
            seen.add(addr)
            if isinstance(obj, h5py.Dataset):
                if obj.is_virtual:
                    raise InputError(
                        f"dataset {where!r} is a virtual dataset (its data lives in other files); "
                        "features must be stored in the file itself",
                        path,
                    )
            elif isinstance(obj, h5py.Group):
                stack.append(obj)
    for group, name, where, target in soft:
        if group.get(name, default=None) is None:
            raise InputError(
                f"object {where!r} is a soft link to {target!r}, which is not in the file", path
            )


def _read_mat73(path: Path, key: str | None, max_bytes: int | None = None) -> np.ndarray:
    h5py = require("h5py", "mat")
    try:
        with h5py.File(path, "r") as f:
            refuse_outside_links(f, path)
            arrays = {
                n: f[n]
                for n in f.keys()
                if not n.startswith("#") and isinstance(f[n], h5py.Dataset)
            }
            name, ds = _pick(arrays, key, path, "MATLAB file")
            check_budget(ds.shape, ds.dtype.itemsize, path, f"variable {name!r}", max_bytes)
            arr = np.asarray(ds[()])
    except InputError:
        raise
    except Exception as exc:  # h5py raises OSError, KeyError, TypeError on damaged files  # noqa: BLE001
        raise InputError(
            f"not a readable MATLAB v7.3 (HDF5) file ({_first_line(exc)})", path
        ) from None
    if arr.dtype.kind not in "iuf":
        raise InputError(
            f"variable {name!r} is not a numeric array (MATLAB class stored as {arr.dtype})", path
        )
    return arr.T  # HDF5 stores MATLAB's column-major array transposed: back to MATLAB's shape


def _read_h5(
    path: Path, key: str | None, kinds: str = "iuf", max_bytes: int | None = None
) -> np.ndarray:
    """The root dataset named ``key`` of an HDF5 file, or its only one of a dtype kind in ``kinds``."""
    h5py = require("h5py", "mat")
    what = "numeric datasets" if kinds == "iuf" else "string datasets"
    try:
        with h5py.File(path, "r") as f:
            refuse_outside_links(f, path)
            arrays = {
                n: f[n]
                for n in f.keys()
                if isinstance(f[n], h5py.Dataset) and f[n].dtype.kind in kinds
            }
            name, ds = _pick(arrays, key, path, f"HDF5 file's {what}")
            check_budget(ds.shape, ds.dtype.itemsize, path, f"dataset {name!r}", max_bytes)
            return np.asarray(ds[()])
    except InputError:
        raise
    except Exception as exc:  # h5py raises OSError, KeyError, TypeError on damaged files  # noqa: BLE001
        raise InputError(f"not a readable HDF5 file ({_first_line(exc)})", path) from None


#: Bytes per element of MATLAB's numeric classes (``scipy.io.whosmat``); others count as 8.
_MAT_ITEMSIZE = {
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "single": 4,
}


def _read_mat(path: Path, key: str | None, max_bytes: int | None = None) -> np.ndarray:
    if _is_mat73(path):
        return _read_mat73(path, key, max_bytes)
    import scipy.io

    try:
        # every variable is loaded: their declared shapes (headers only) first
        for name, shape, cls in scipy.io.whosmat(path):
            check_budget(shape, _MAT_ITEMSIZE.get(cls, 8), path, f"variable {name!r}", max_bytes)
        raw = scipy.io.loadmat(path, squeeze_me=False, struct_as_record=True)
    except NotImplementedError:  # pragma: no cover - v7.3 is detected above
        return _read_mat73(path, key, max_bytes)
    except InputError:
        raise
    except Exception as exc:  # scipy raises ValueError, TypeError, OSError, MatReadError...  # noqa: BLE001
        raise InputError(
            f"not a readable MATLAB .mat file (truncated or damaged: {_first_line(exc)})", path
        ) from None
    arrays = {n: v for n, v in raw.items() if not n.startswith("__")}
    name, arr = _pick(arrays, key, path, "MATLAB file")
    if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "iuf":
        raise InputError(
            f"variable {name!r} is not a numeric matrix (a struct, cell or text)", path
        )
    return arr


def _read_texmex(path: Path, suffix: str) -> np.ndarray:
    """A texmex file as ``[n, d]`` (a read-only memory map; every record's header checked)."""
    st = require_regular_file(path)
    item = _TEXMEX[suffix]
    if st.st_size == 0:
        raise InputError("empty file: no vectors", path)
    if st.st_size < 4:
        raise InputError(f"truncated: {st.st_size} bytes, less than one dimension header", path)
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read: {_first_line(exc)}", path) from None
    d = int(raw[:4].view("<i4")[0])
    if d <= 0 or d > _MAX_TEXMEX_DIM:
        raise InputError(
            f"record 0 has dimension header {d}: not a {suffix} file (expected 1..{_MAX_TEXMEX_DIM})",
            path,
        )
    rec = 4 + d * item.itemsize
    if st.st_size % rec:
        raise InputError(
            f"size {st.st_size:,} bytes is not a multiple of the record size {rec} (4 + {d} x {item.itemsize}): "
            "truncated, or records of different dimensions",
            path,
        )
    rows = raw.reshape(-1, rec)
    heads = rows[:, :4].view("<i4")[:, 0]
    bad = np.flatnonzero(heads != d)
    if bad.size:
        i = int(bad[0])
        raise InputError(f"record {i} has dimension header {int(heads[i])}, record 0 has {d}", path)
    return rows[:, 4:].view(item)


def read_matrix(path: str | Path, *, key: str | None = None) -> np.ndarray:
    """One numeric array from ``.npy``, ``.npz`` or ``.mat`` (scores, or the raw form of features/ranks).

    Args:
        path: the file.
        key: the array's name in an ``.npz`` archive or ``.mat`` file holding several.

    Returns:
        The array as stored (a read-only memory map for ``.npy``), any numeric dtype.

    Raises:
        InputError: see the module docstring.
    """
    p = Path(path)
    suffix = _suffix(p, MATRIX_SUFFIXES, "arrays")
    return _read_any(p, suffix, key)


def _read_any(p: Path, suffix: str, key: str | None, max_bytes: int | None = None) -> np.ndarray:
    require_regular_file(p)
    if key is not None and suffix not in (".npz", ".mat", ".h5"):
        raise InputError(
            f"--key (key=) names an array inside .npz, .h5 or .mat files, not {suffix}", p
        )
    if suffix == ".npy":
        arr = map_npy(p)
    elif suffix == ".npz":
        arr = _read_npz(p, key, max_bytes)
    elif suffix == ".mat":
        arr = _read_mat(p, key, max_bytes)
    elif suffix == ".h5":
        arr = _read_h5(p, key, max_bytes=max_bytes)
    else:
        arr = _read_texmex(p, suffix)
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InputError(f"expected numbers, got an array of dtype {arr.dtype}", p)
    return arr


def read_features(
    path: str | Path,
    *,
    layout: Layout = "n-d",
    key: str | None = None,
    normalize: bool = False,
    max_bytes: int | None = None,
) -> NDArray[np.float32]:
    """Read descriptors as ``float32 [n, d]``: one vector per row.

    Reads ``.npy``, ``.npz``, MATLAB ``.mat`` (v5; v7.3 with ``pip install "oxbench[mat]"``),
    HDF5 ``.h5`` and texmex ``.fvecs`` / ``.bvecs`` (see the module docstring).

    Args:
        path: the file.
        layout: ``"n-d"`` when rows are vectors (numpy, FAISS, texmex), ``"d-n"`` when columns
            are (revisitop's ``.mat`` features ``X`` and ``Q``). Never guessed: a wrong one shows as
            a dimension that does not match the other file, or a count that does not match the
            ground truth, and the caller's message says to transpose.
        key: the array's name in an ``.npz`` or ``.mat`` file holding several (revisitop: ``X``
            for the database, ``Q`` for the queries).
        normalize: L2-normalise every vector (cosine similarity = dot product of normalised
            vectors). Off by default: vectors are used as given.
        max_bytes: the most bytes the array may need (as stored, and as ``float32``), checked
            on its declared shape before anything is allocated; ``None``:
            :func:`default_max_bytes` (a quarter of the machine's memory).

    Returns:
        ``float32 [n, d]``: a memory map or view where no conversion is needed, else a copy.

    Raises:
        InputError: an unsupported or malformed file, not a 2-D numeric array, an empty array,
            a ``layout`` texmex files cannot have, or (with ``normalize``) a vector of norm 0 or
            a non-finite value.

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "x.npy"
        >>> np.save(p, np.array([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0]]))
        >>> read_features(p, layout="d-n").shape
        (2, 3)
        >>> read_features(p, normalize=True)[0].tolist()
        [0.6000000238418579, 0.800000011920929]
    """
    p = Path(path)
    if layout not in LAYOUTS:
        raise InputError(
            f"layout must be 'n-d' (one vector a row) or 'd-n' (one a column), got {layout!r}", p
        )
    suffix = _suffix(p, FEATURE_SUFFIXES, "features")
    if suffix in _TEXMEX and layout != "n-d":
        raise InputError(f"{suffix} files store one vector per record: use layout n-d", p)
    arr = _read_any(p, suffix, key, max_bytes)
    if suffix == ".npy" or suffix in _TEXMEX:  # mapped, not read: its float32 copy is what costs
        check_budget(arr.shape, arr.dtype.itemsize, p, "the array", max_bytes)
    if arr.ndim != 2:
        raise InputError(f"features must be a 2-D array, got shape {arr.shape}", p)
    x = arr.T if layout == "d-n" else arr
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"no features: shape {x.shape} ({layout})", p)
    with np.errstate(over="ignore"):  # beyond float32's range: infinity, which the checks refuse
        x = np.asarray(x, dtype=np.float32)
    if normalize:
        x = _l2_normalized(x, p)
    return x


def _l2_normalized(x: NDArray[np.float32], path: Path, chunk: int = 1 << 16) -> NDArray[np.float32]:
    out = np.empty(x.shape, dtype=np.float32)
    for i0 in range(0, x.shape[0], chunk):
        blk = np.asarray(x[i0 : i0 + chunk], dtype=np.float64)
        if not np.isfinite(blk).all():
            bad = i0 + int(np.flatnonzero(~np.isfinite(blk).all(axis=1))[0])
            raise InputError(f"vector {bad} contains NaN or infinity", path)
        norms = np.linalg.norm(blk, axis=1)
        if not (norms > 0).all():
            raise InputError(
                f"vector {i0 + int(np.flatnonzero(norms <= 0)[0])} has norm 0: cannot be L2-normalised",
                path,
            )
        out[i0 : i0 + blk.shape[0]] = blk / norms[:, None]
    return out


def _strings(arr: Any) -> list[str] | None:
    """The strings of a 1-D string array, a MATLAB char matrix or a cell array of strings."""
    a = np.asarray(arr)
    if a.dtype.kind == "O":  # a MATLAB cell array: each cell one string (a 1-element array)
        out = []
        for cell in a.ravel(order="F"):
            sub = _strings(cell)
            if sub is None or len(sub) != 1:
                return None
            out.append(sub[0])
        return out
    if a.dtype.kind not in "US" or a.ndim > 2 or (a.ndim == 2 and 1 not in a.shape):
        return None
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in a.ravel().tolist()]


def read_names(path: str | Path) -> tuple[str, ...]:
    """Image names, one per row of a feature file, in row order.

    A ``.txt`` file has one name a line (surrounding whitespace, CR line ends and a ``.jpg`` suffix
    removed as in the ground-truth lists; blank lines only at the end). An ``.npz``, ``.h5`` or
    MATLAB v5 ``.mat`` file holds them as its one array of strings (numeric arrays beside it are
    ignored: the features may live in the same file).

    Raises:
        InputError: an unsupported or unreadable file, no or several arrays of strings, a blank
            or malformed name (names the file and the line or entry).

    Example:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "f.npz"
        >>> np.savez(p, x=np.eye(2), names=np.array(["b.jpg", "a"]))
        >>> read_names(p)
        ('b', 'a')
    """
    p = Path(path)
    suffix = _suffix(p, NAME_SUFFIXES, "image names")
    require_regular_file(p)
    if suffix == ".txt":
        raw = read_text_lines(p)
        while raw and not raw[-1].strip():
            raw.pop()
    else:
        if suffix == ".npz":
            with_names = {}
            try:
                with np.load(p, allow_pickle=False) as npz:
                    for n in npz.files:
                        a = npz[n]
                        if a.dtype.kind in "US":
                            with_names[n] = a
            except Exception as exc:  # noqa: BLE001 - zipfile, zlib, ValueError
                raise InputError(f"not a readable .npz archive ({_first_line(exc)})", p) from None
        elif suffix == ".h5":
            with_names = {"names": _read_h5(p, None, kinds="USO")}
        else:
            if _is_mat73(p):
                raise InputError(
                    "names in a MATLAB v7.3 file are not read: save them with -v7 (a cell array "
                    "of strings) or as a text file, one name a line",
                    p,
                )
            import scipy.io

            try:
                raw_mat = scipy.io.loadmat(p, squeeze_me=False)
            except Exception as exc:  # noqa: BLE001 - scipy's many reader errors
                raise InputError(
                    f"not a readable MATLAB .mat file ({_first_line(exc)})", p
                ) from None
            with_names = {
                n: v
                for n, v in raw_mat.items()
                if not n.startswith("__") and isinstance(v, np.ndarray) and v.dtype.kind in "USO"
            }
        found = {
            n: s for n, s in ((n, _strings(v)) for n, v in with_names.items()) if s is not None
        }
        if len(found) != 1:
            held = f"holds {', '.join(sorted(found))}" if found else "holds none"
            raise InputError(
                f"image names are read from the file's one array of strings; it {held}", p
            )
        raw = next(iter(found.values()))
    names = []
    for i, line in enumerate(raw, start=1):
        name = clean_name(line, p, i)
        if name is None:
            raise InputError(f"line {i}: blank: every line names one row of the features", p)
        names.append(name)
    if not names:
        raise InputError("no image names", p)
    return tuple(names)


_INDEX_TOKEN = re.compile(r"-?[0-9]{1,30}")


def _read_text_ranks(p: Path, padding: int | None) -> NDArray[np.int64]:
    data = read_input_bytes(p, limit=TEXT_RANKS_LIMIT)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError as exc:
        raise InputError(f"not a text rank file (byte {exc.start} is not ASCII)", p) from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError("empty file: no ranked lists (expected one query per line)", p)
    rows: list[list[int]] = []
    for lineno, line in enumerate(lines, start=1):
        row = []
        for tok in line.split():
            # plain decimal digits only: int() would also take "1_0" (10) and "+5"
            if not _INDEX_TOKEN.fullmatch(tok):
                raise InputError(f"line {lineno}: {tok[:40]!r} is not an integer index", p)
            v = int(tok)
            if v < 0 and not (v == -1 and padding == -1):
                raise InputError(
                    f"line {lineno}: {v} is not an index (indices are 0-based and non-negative"
                    + ("; -1 padding only with --padding -1 / padding=-1)" if v == -1 else ")"),
                    p,
                )
            if v > np.iinfo(np.int64).max:
                raise InputError(f"line {lineno}: {tok[:40]} is beyond any index", p)
            row.append(v)
        rows.append(row)
    k = max(len(r) for r in rows)
    out = np.full((len(rows), k), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def read_ranks(
    path: str | Path, *, key: str | None = None, padding: int | None = None
) -> NDArray[np.integer]:
    """Read ranked lists into the internal layout ``[n_queries, k]`` (row = one query, best first).

    Array files (``.npy``, ``.npz``, ``.mat``) hold the revisitop layout ``(k, n_queries)`` (rows =
    ranked positions, columns = queries, as ``np.argsort(-sim, axis=0)`` gives): a transposed view
    is returned, no copy. ``.ivecs`` records and text lines are one query's list each. Values are
    0-based database indices (MATLAB's own ``sort`` gives 1-based ones: subtract 1 first).
    The values are checked against the ground truth by :func:`oxbench.evaluation.evaluate`.

    Text files: one query per line, whitespace-separated integer indices; lines may differ in
    length (a truncated list): shorter ones are padded with -1 at the end, so evaluate them with
    ``padding=-1``.

    Args:
        path: the file.
        key: the array's name in an ``.npz`` or ``.mat`` file holding several.
        padding: ``-1`` admits ``-1`` entries in a text file (FAISS-style padding); otherwise a
            negative text token is refused. (For arrays, :func:`~oxbench.evaluation.evaluate`
            decides.)

    Returns:
        Integer array ``[n_queries, k]`` (the file's integer dtype where it has one).

    Raises:
        InputError: an unsupported or malformed file, a floating-point array ("these look like
            scores"), not 2-D.
    """
    p = Path(path)
    suffix = _suffix(p, RANK_SUFFIXES, "ranks")
    if suffix == ".txt":
        if key is not None:
            raise InputError("--key (key=) names an array inside .npz or .mat files, not .txt", p)
        return _read_text_ranks(p, padding)
    arr = _read_any(p, suffix, key)
    if arr.dtype.kind == "f" and arr.size:
        raise InputError(
            f"ranks hold floating-point numbers (dtype {arr.dtype}), not integer indices: these look like "
            "scores: use --scores (evaluate_scores)",
            p,
        )
    if arr.ndim != 2:
        raise InputError(f"ranks must be a 2-D array, got shape {arr.shape}", p)
    return arr if suffix == ".ivecs" else arr.T
