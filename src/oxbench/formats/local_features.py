"""Local features (keypoints + descriptors per image) in the files other tools write.

Two layouts, one image per entry, keyed by the image's name in its benchmark (``all_souls_000013``;
a name with ``/`` is a nested group or a subfolder):

``h5`` -- hloc's ``features.h5`` (``hloc/extract_features.py``): one HDF5 group per image holding

    ============  ==============  ============================================================
    dataset       shape           meaning
    ============  ==============  ============================================================
    keypoints     ``[n, 2]``      x, y in pixels of the original image (pixel centres at
                                  integers); ``[n, 3]`` adds the size, ``[n, 4]`` size and
                                  angle in degrees (oxbench's own columns)
    descriptors   ``[d, n]``      one descriptor a COLUMN, as hloc stores them
    image_size    ``[2]``         width, height of the original image
    scales        ``[n]``         optional: the keypoint size, when keypoints are ``[n, 2]``
    oris          ``[n]``         optional: the orientation in RADIANS (hloc's unit), when
                                  keypoints are ``[n, 2]``
    scores        ``[n]``         optional, not used
    ============  ==============  ============================================================

``npz`` -- a folder of ``<image name>.npz``, each with ``keypoints`` ``[n, 2|3|4]`` (the columns as
above), ``descriptors`` ``[n, d]`` (one descriptor a ROW) and ``image_size`` ``[2]``.

Descriptors may be ``uint8``, ``float16``, ``float32`` or ``float64`` (kept as ``float32``), of any
dimension up to :data:`MAX_DIM`; every image of a file must have the same dimension and type.
What spatial verification needs beyond x, y: a missing size is taken as 1 pixel and a missing angle
as 0 (upright), so similarity / affine / homography verification from point correspondences works
as with any feature, while ``spatial.method=fsm`` (one correspondence gives a full hypothesis from
the two features' scales and angles) sees upright unit-size features.

Every check of this kind of file lives here (:func:`probe` and :func:`read_image_features`), each
refusal one :class:`~oxbench.errors.InputError` naming the file (and the image): not HDF5 / not an
archive, an image missing, descriptors of another dimension or type than the file's first image, a
NaN or infinite value, a keypoint outside its image, a declared size beyond the limits (checked
from the shapes before any array is read), a negative or zero image size.
"""

from __future__ import annotations

import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.features.local import KEYPOINT_COLUMNS, RawFeatures
from oxbench.formats.arrays import _first_line, refuse_outside_links

FileLayout = Literal["h5", "npz"]
FILE_LAYOUTS: tuple[str, ...] = ("h5", "npz")
#: How descriptors lie in an image's block: ``auto`` (the layout's own; a square block refused).
Orientation = Literal["auto", "d-n", "n-d"]
ORIENTATIONS: tuple[str, ...] = ("auto", "d-n", "n-d")

#: Most keypoints one image may declare (a larger shape is refused before it is read).
MAX_KEYPOINTS = 1 << 22
#: Largest descriptor dimension.
MAX_DIM = 1 << 14
#: Most descriptor bytes one image may declare (256 MiB).
MAX_IMAGE_BYTES = 1 << 28
#: Largest image side in pixels.
MAX_IMAGE_SIDE = 1 << 17
#: Descriptor types kept as they are; ``float64`` is read as ``float32``.
STORED_DTYPES: tuple[str, ...] = ("uint8", "float16", "float32")
#: How far (pixels) a keypoint may lie beyond the outer pixel centres: the pixel's own half width.
_EDGE = 0.5 + 1e-3
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


@dataclass(frozen=True)
class FileFacts:
    """What the first image of a features file says about all of them.

    Attributes:
        dim: descriptor dimension.
        dtype: descriptor type as stored (``uint8``, ``float16``, ``float32``).
        first: the name of the image they were read from.
    """

    dim: int
    dtype: np.dtype[Any]
    first: str


def _source(layout: FileLayout, path: Path, name: str | None = None) -> Path:
    if layout == "npz" and name is not None:
        return path / f"{name}.npz"
    return path


def _fail(message: str, layout: FileLayout, path: Path, name: str | None = None) -> InputError:
    where = f"image {name!r}: " if name is not None and layout == "h5" else ""
    return InputError(f"{where}{message}", _source(layout, path, name))


# --- the checks, from shapes and dtypes first, then from the values ----------------------------


def _check_declared(
    kp_shape: tuple[int, ...],
    desc_shape: tuple[int, ...],
    desc_dtype: np.dtype[Any],
    size_shape: tuple[int, ...] | None,
    *,
    transposed: bool,
    orientation: Orientation = "auto",
) -> str | None:
    """What is wrong with the declared shapes (nothing read yet), or ``None``."""
    if len(kp_shape) != 2 or kp_shape[1] not in (2, 3, 4):
        return f"keypoints must be [n, 2], [n, 3] or [n, 4], got shape {kp_shape}"
    n = kp_shape[0]
    if n > MAX_KEYPOINTS:
        return f"declares {n:,} keypoints; at most {MAX_KEYPOINTS:,} per image"
    if len(desc_shape) != 2:
        return f"descriptors must be 2-D, got shape {desc_shape}"
    if orientation == "auto" and desc_shape[0] == desc_shape[1] == n and n > 1:
        return (
            f"descriptors are [{n}, {n}] for {n} keypoints: [n, d] and [d, n] both fit; say which "
            "with features.orientation=d-n (hloc's) or n-d"
        )
    d, m = desc_shape if transposed else desc_shape[::-1]
    want = "[d, n] (hloc's layout: one descriptor a column)" if transposed else "[n, d]"
    if m != n:
        return f"descriptors must be {want} for its {n} keypoints, got shape {desc_shape}"
    if not 1 <= d <= MAX_DIM:
        return f"descriptor dimension {d} is outside 1..{MAX_DIM}"
    if desc_dtype.name not in (*STORED_DTYPES, "float64"):
        return f"descriptors are {desc_dtype}; expected uint8, float16, float32 or float64"
    if n * d * desc_dtype.itemsize > MAX_IMAGE_BYTES:
        return f"declares {n * d * desc_dtype.itemsize:,} bytes of descriptors; at most {MAX_IMAGE_BYTES:,} per image"
    if size_shape is None:
        return "no image_size (width, height of the original image)"
    if tuple(size_shape) != (2,):
        return f"image_size must be [2] (width, height), got shape {size_shape}"
    return None


def _finish(
    name: str,
    kp: NDArray[Any],
    desc: NDArray[Any],
    size: NDArray[Any],
    scales: NDArray[Any] | None,
    oris: NDArray[Any] | None,
    *,
    transposed: bool,
) -> tuple[RawFeatures | None, str]:
    """The validated features, or ``(None, what is wrong)``."""
    if size.dtype.kind not in "iuf" or not np.all(np.isfinite(size)):
        return None, f"image_size must be two finite numbers, got {size.tolist()}"
    if not np.all(size == np.round(size)) or np.any(size < 1) or np.any(size > MAX_IMAGE_SIDE):
        return None, f"image_size must be whole numbers in 1..{MAX_IMAGE_SIDE}, got {size.tolist()}"
    w, h = int(size[0]), int(size[1])
    if kp.dtype.kind not in "iuf":
        return None, f"keypoints must be numbers, got {kp.dtype}"
    n = kp.shape[0]
    out = np.zeros((n, len(KEYPOINT_COLUMNS)), np.float32)
    out[:, 2] = 1.0  # a unit size when none is given (module docstring)
    out[:, : kp.shape[1]] = kp
    for what, extra, col in (("scales", scales, 2), ("oris", oris, 3)):
        if extra is None or kp.shape[1] > 2:
            continue
        if extra.shape != (n,) or extra.dtype.kind not in "iuf":
            return None, f"{what} must be [n={n}] numbers, got {extra.dtype} {extra.shape}"
        out[:, col] = np.degrees(extra.astype(np.float64)) if what == "oris" else extra
    if not np.all(np.isfinite(out)):
        bad = int(np.flatnonzero(~np.all(np.isfinite(out), axis=1))[0])
        return None, f"keypoint {bad} is not finite (NaN or infinite)"
    outside = (
        (out[:, 0] < -_EDGE)
        | (out[:, 0] > w - 1 + _EDGE)
        | (out[:, 1] < -_EDGE)
        | (out[:, 1] > h - 1 + _EDGE)
    )
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        return None, (
            f"keypoint {i} at ({out[i, 0]:.1f}, {out[i, 1]:.1f}) is outside the {w}x{h} image "
            "(keypoints are pixels of the original image, pixel centres at 0 .. size - 1)"
        )
    if np.any(out[:, 2] < 0):
        return None, f"keypoint {int(np.flatnonzero(out[:, 2] < 0)[0])} has a negative size"
    d = np.ascontiguousarray(desc.T if transposed else desc)
    if (
        not d.dtype.isnative
    ):  # big-endian ('>f4') as stored: the same numbers, in this machine's order
        d = d.astype(d.dtype.newbyteorder("="))
    if d.dtype == np.float64:
        d = d.astype(np.float32)
    if d.dtype.kind == "f" and not np.all(np.isfinite(d)):
        bad = int(np.flatnonzero(~np.all(np.isfinite(d), axis=1))[0])
        return None, f"descriptor {bad} is not finite (NaN or infinite)"
    return RawFeatures(name, out, d, (w, h)), ""


# --- h5 -----------------------------------------------------------------------------------------

#: Open HDF5 files of this process, by path (a worker reads many images from one file; a handle
#: is never shared across a fork: the process id is part of the key).
_OPEN: dict[tuple[int, str], Any] = {}


def _h5(path: Path) -> Any:
    key = (os.getpid(), str(path))
    f = _OPEN.get(key)
    if f is not None:
        return f
    h5py = require("h5py", "mat")
    _check_hdf5(path)
    try:
        f = h5py.File(path, "r")
    except Exception as exc:  # h5py raises OSError on damaged files  # noqa: BLE001
        raise InputError(f"not a readable HDF5 file ({_first_line(exc)})", path) from None
    try:
        refuse_outside_links(f, path)
    except InputError:
        f.close()
        raise
    except Exception as exc:  # a damaged link table  # noqa: BLE001
        f.close()
        raise InputError(f"not a readable HDF5 file ({_first_line(exc)})", path) from None
    _OPEN[key] = f
    return f


def close_files() -> None:
    """Close the HDF5 files this process opened (before a fork, or at the end of a step)."""
    for key in [k for k in _OPEN if k[0] == os.getpid()]:
        _OPEN.pop(key).close()


def _check_hdf5(path: Path) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("no such local-features file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder; h5 features are one HDF5 file (npz: a folder)", path)
    if not stat.S_ISREG(st.st_mode):  # never opened: open() on a FIFO blocks, /dev/stdin reads ours
        raise InputError("not a regular file (FIFO, device or socket); give a file", path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise InputError("no such local-features file", path) from None
    except IsADirectoryError:
        raise InputError(
            "is a folder; h5 features are one HDF5 file (npz: a folder)", path
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
    if head != _HDF5_MAGIC:
        raise InputError(
            "not an HDF5 file (no HDF5 signature); h5 features are hloc's features.h5", path
        )


def _read_h5(path: Path, name: str, orientation: Orientation = "auto") -> RawFeatures:
    h5py = require("h5py", "mat")
    transposed = orientation != "n-d"  # hloc's [d, n] unless told otherwise
    f = _h5(path)
    try:
        group = f.get(name)
        if not isinstance(group, h5py.Group):
            raise _fail("missing from the file (no group of that name)", "h5", path, name)
        sets = {k: group[k] for k in group if isinstance(group[k], h5py.Dataset)}
        for key in ("keypoints", "descriptors"):
            if key not in sets:
                raise _fail(f"the group has no {key!r} dataset", "h5", path, name)
        kp, desc = sets["keypoints"], sets["descriptors"]
        size = sets.get("image_size")
        problem = _check_declared(
            kp.shape,
            desc.shape,
            desc.dtype,
            None if size is None else size.shape,
            transposed=transposed,
            orientation=orientation,
        )
        if problem is None:
            for extra in ("scales", "oris"):
                if extra in sets and sets[extra].shape != (kp.shape[0],):
                    problem = f"{extra} must be [n={kp.shape[0]}], got shape {sets[extra].shape}"
        if problem is not None:
            raise _fail(problem, "h5", path, name)
        assert size is not None
        feats, problem = _finish(
            name,
            np.asarray(kp[()]),
            np.asarray(desc[()]),
            np.asarray(size[()]).reshape(-1),
            None if "scales" not in sets else np.asarray(sets["scales"][()]),
            None if "oris" not in sets else np.asarray(sets["oris"][()]),
            transposed=transposed,
        )
    except InputError:
        raise
    except Exception as exc:  # damaged datasets: OSError, KeyError, TypeError  # noqa: BLE001
        raise _fail(f"unreadable ({_first_line(exc)})", "h5", path, name) from None
    if feats is None:
        raise _fail(problem, "h5", path, name)
    return feats


def _first_h5(path: Path) -> str:
    h5py = require("h5py", "mat")
    f = _h5(path)
    found: list[str] = []

    def visit(name: str, obj: Any) -> Any:
        if isinstance(obj, h5py.Group) and "descriptors" in obj:
            found.append(name)
            return True  # stop at the first image
        return None

    try:
        f.visititems(visit)
    except Exception as exc:  # noqa: BLE001
        raise InputError(f"not a readable HDF5 file ({_first_line(exc)})", path) from None
    if not found:
        raise InputError("holds no image (no group with a 'descriptors' dataset)", path)
    return found[0]


# --- npz ----------------------------------------------------------------------------------------


def _npz_member(zf: zipfile.ZipFile, key: str, path: Path) -> Any:
    try:
        return zf.open(f"{key}.npy")
    except KeyError:
        return None


def _npy_header(fh: Any) -> tuple[tuple[int, ...], np.dtype[Any]]:
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    else:
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    if dtype.hasobject:
        raise ValueError("holds Python objects (a pickled array), not numbers")
    return tuple(int(s) for s in shape), dtype


def _read_npz(folder: Path, name: str, orientation: Orientation = "auto") -> RawFeatures:
    transposed = orientation == "d-n"  # [n, d] unless told otherwise
    path = folder / f"{name}.npz"
    if not path.resolve().is_relative_to(folder.resolve()):
        raise _fail("the image name leaves the features folder", "npz", folder, name)
    if not path.is_file():
        raise _fail("missing from the features folder (no such .npz file)", "npz", folder, name)
    try:
        with zipfile.ZipFile(path) as zf:
            heads: dict[str, tuple[tuple[int, ...], np.dtype[Any]]] = {}
            for key in ("keypoints", "descriptors", "image_size"):
                member = _npz_member(zf, key, path)
                if member is None:
                    if key == "image_size":
                        continue
                    raise _fail(f"no {key!r} array in the archive", "npz", folder, name)
                with member:
                    heads[key] = _npy_header(member)
            size_head = heads.get("image_size")
            problem = _check_declared(
                heads["keypoints"][0],
                heads["descriptors"][0],
                heads["descriptors"][1],
                None if size_head is None else size_head[0],
                transposed=transposed,
                orientation=orientation,
            )
            if problem is not None:
                raise _fail(problem, "npz", folder, name)
            arrays = {}
            for key in heads:
                with zf.open(f"{key}.npy") as member:
                    arrays[key] = np.lib.format.read_array(member, allow_pickle=False)
    except InputError:
        raise
    except Exception as exc:  # a damaged archive or member  # noqa: BLE001
        raise _fail(
            f"not a readable .npz archive ({_first_line(exc)})", "npz", folder, name
        ) from None
    feats, problem = _finish(
        name,
        arrays["keypoints"],
        arrays["descriptors"],
        arrays["image_size"].reshape(-1),
        None,
        None,
        transposed=transposed,
    )
    if feats is None:
        raise _fail(problem, "npz", folder, name)
    return feats


def _first_npz(folder: Path) -> str:
    if not folder.is_dir():
        if folder.exists():
            raise InputError("is a file; npz features are a folder of <image name>.npz", folder)
        raise InputError("no such local-features folder", folder)
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".npz"):
                return str((Path(root) / f).relative_to(folder))[: -len(".npz")]
    raise InputError("holds no <image name>.npz file", folder)


# --- the two entry points -----------------------------------------------------------------------


def read_image_features(
    layout: FileLayout,
    path: str | Path,
    name: str,
    facts: FileFacts | None = None,
    orientation: Orientation = "auto",
) -> RawFeatures:
    """The validated features of image ``name`` from a features file (or folder).

    Args:
        layout: ``"h5"`` (hloc's ``features.h5``) or ``"npz"`` (a folder of ``<name>.npz``).
        path: the file or folder.
        name: the image's name in its benchmark.
        facts: what every image must agree with (:func:`probe`: dimension and type).
        orientation: ``"auto"``: the layout's own (h5 ``[d, n]``, npz ``[n, d]``), a square
            descriptor block (as many keypoints as dimensions) refused as ambiguous; ``"d-n"`` or
            ``"n-d"``: every image so.

    Returns:
        :class:`~oxbench.features.local.RawFeatures`: keypoints ``float32 [n, 4]`` (size 1 and
        angle 0 where the file has none), descriptors ``[n, d]`` in the file's type
        (``float64`` as ``float32``), the image size.

    Raises:
        InputError: one line naming the file and the image (module docstring).
    """
    path = Path(path)
    feats = (
        _read_h5(path, name, orientation) if layout == "h5" else _read_npz(path, name, orientation)
    )
    if facts is not None:
        d = feats.descriptors
        if d.shape[1] != facts.dim or d.dtype != facts.dtype:
            raise _fail(
                f"descriptors are {d.dtype} of dimension {d.shape[1]}, but the file's first image "
                f"({facts.first!r}) has {facts.dtype} of dimension {facts.dim}: one file, one kind",
                layout,
                path,
                name,
            )
    return feats


def probe(layout: FileLayout, path: str | Path, orientation: Orientation = "auto") -> FileFacts:
    """The descriptor dimension and type of a features file, from its first image (checked in full).

    Raises:
        InputError: the file is missing, not of its layout, empty, or its first image is bad.
    """
    if layout not in FILE_LAYOUTS:
        raise InputError(f"unknown local-features layout {layout!r}; use one of {FILE_LAYOUTS}")
    path = Path(path)
    first = _first_h5(path) if layout == "h5" else _first_npz(path)
    try:
        feats = read_image_features(layout, path, first, orientation=orientation)
    finally:
        close_files()  # the driver reads one image; its workers open the file themselves
    return FileFacts(int(feats.descriptors.shape[1]), feats.descriptors.dtype, first)
