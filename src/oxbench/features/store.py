"""A resumable on-disk store of local features, keyed by image name.

Layout of one store folder (one per dataset part and extraction config)::

    <dir>/meta.json                    config that built it (refused when it differs), with its digest
    <dir>/shard-000000.kp.npy          float32 [n_features, 4] keypoints of the shard's images
    <dir>/shard-000000.raw.npy         [n_features, dim] descriptors as the extractor stores them
                                       (uint8 SIFT histograms for SIFT / RootSIFT)
    <dir>/shard-000000.index.npz       names, per-image feature counts and image sizes, checksums
    <dir>/.lock                        held by the one process that writes the store

A shard is complete when its ``.index.npz`` exists: every file is written through a uniquely named
temporary file and a rename (:mod:`oxbench.fileio`), the index last, so an interrupted extraction
leaves no shard that looks complete, and the next run simply describes the images whose names are in
no complete shard. Data files are memory-mapped on read so that fetching one image's features
(spatial verification) costs one slice, not a shard load.

The store cannot lie (:mod:`oxbench.cache`). What is checked, and when:

- ``meta.json`` and each ``.index.npz``: a full SHA-256 of their content, on every open;
- each ``.kp.npy`` / ``.raw.npy``: its size and a *sampled* digest (:func:`oxbench.fileio.
  sampled_digest` of its first, middle and last 4 KiB) on every open -- cheap enough for a million
  images, and it catches truncation exactly -- and, with ``full=True`` (after a corruption was found
  late), its full SHA-256;
- every image's keypoints and descriptors: a CRC-32 recorded per image, checked on every read, so
  a flipped byte anywhere is caught before the features are used.

A shard that fails an open-time check is logged as a warning naming the file and left out (its
images are described again by the next extraction, which deletes it); a failed per-image check
raises :class:`~oxbench.cache.CorruptCache`, which the pipeline turns into the same recomputation.

Descriptors are stored as the extractor stores them (:class:`~oxbench.features.local.LocalExtractor`:
its ``stored_dtype`` and ``dim``; raw SIFT histograms, exactly representable as ``uint8``) and turned
into the descriptors it matches with (RootSIFT) by its ``finish`` on read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import CorruptCache, entry_lock, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.execution import Executor, SerialExecutor
from oxbench.features.local import LocalExtractor, LocalFeatures
from oxbench.fileio import (
    atomic_write_json,
    atomic_write_npy,
    file_sha256,
    json_digest,
    make_folder,
    read_input_bytes,
    remove_stale_temps,
    sampled_digest,
)

log = logging.getLogger(__name__)

STORE_FORMAT = 1
_SHARD_RE = re.compile(r"^shard-(\d{6})\.(index\.npz|kp\.npy|raw\.npy)$")

# (name, keypoints, stored descriptors, (width, height))
RawFeatures = tuple[str, NDArray[np.float32], NDArray[Any], tuple[int, int]]


#: Bytes read at the start, middle and end of a data file for its open-time sampled digest.
_SAMPLE = 4096
_DATA_FILES = ("kp.npy", "raw.npy")


def _crc(array: NDArray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).data)


@dataclass
class _Shard:
    number: int
    names: NDArray[np.str_]
    offsets: NDArray[np.int64]  # [n_images + 1]
    sizes: NDArray[np.int32]  # [n_images, 2]
    kp_crc: NDArray[np.uint32]  # [n_images] CRC-32 of each image's keypoint rows
    raw_crc: NDArray[np.uint32]  # [n_images] CRC-32 of each image's descriptor rows
    _kp: NDArray[np.float32] | None = None
    _raw: NDArray[Any] | None = None


class FeatureStore:
    """Local features of many images, on disk, keyed by image name.

    Open with :meth:`open` (creates the folder, or checks that an existing one was built with the
    same config); fill with :func:`extract_to_store`; read with :meth:`get` / :meth:`__getitem__`.

    Attributes:
        directory: the store folder.
        config: the extraction config.
        meta: everything recorded in ``meta.json`` (config, role, extra keys).
        bad_shards: numbers of the shards the last :meth:`refresh` found corrupt (left out).
    """

    def __init__(self, directory: Path, config: LocalExtractor, meta: dict[str, object]) -> None:
        self.directory = directory
        self.config = config
        self.meta = meta
        self.bad_shards: list[int] = []
        self._shards: list[_Shard] = []
        self._where: dict[str, tuple[int, int]] = {}
        self._numbers: set[int] = set()
        self._next_number = 0

    @property
    def lock_path(self) -> Path:
        """The lock file held by the process that writes this store."""
        return self.directory / ".lock"

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: LocalExtractor,
        *,
        extra: dict[str, object] | None = None,
        create: bool = True,
    ) -> FeatureStore:
        """Open (or create) a store and index its complete, intact shards.

        Temporary files a killed process left in the folder are removed. A corrupt ``meta.json``
        is logged as a warning and, with ``create``, the store is emptied and started again.

        Args:
            directory: the store folder.
            config: the extraction config the caller expects.
            extra: other things that change the features (e.g. ``{"role": "queries",
                "crop": "python"}``); must match too.
            create: create the folder when missing (else :class:`InputError`).

        Raises:
            InputError: the folder was built with another config, or is missing with
                ``create=False``, or cannot be created.
            CorruptCache: ``create=False`` and ``meta.json`` is corrupt.
        """
        directory = Path(directory)
        expected = {"format": STORE_FORMAT, "config": config.to_dict(), **(extra or {})}
        store = cls(directory, config, expected)
        if directory.is_dir():
            remove_stale_temps(directory)
        problem = store._check_meta()
        if problem is not None:
            if not create:
                if isinstance(problem, CorruptCache):
                    raise problem
                raise InputError("no feature store here (extract features first)", directory)
            make_folder(directory)
            with entry_lock(store.lock_path, what=f"the feature store {directory}"):
                problem = store._check_meta()  # another process may have made it meanwhile
                if isinstance(problem, CorruptCache):
                    log.warning("%s; emptying the store and describing its images again", problem)
                    store._remove_shards(store._shard_numbers())
                if problem is not None:
                    atomic_write_json(directory / "meta.json", {**expected, "digest": json_digest(expected)})
        store.refresh()
        return store

    def _check_meta(self) -> CorruptCache | InputError | None:
        """``None`` when ``meta.json`` is intact and matches; else what is wrong with it.

        Raises:
            InputError: an intact ``meta.json`` of another config.
        """
        path = self.directory / "meta.json"
        if not path.is_file():
            return InputError("no meta.json", path)
        try:
            found = json.loads(read_input_bytes(path, limit=1 << 20))
        except (InputError, ValueError) as exc:
            return CorruptCache(f"unreadable feature-store metadata ({exc})", path, lock=self.lock_path)
        digest = found.pop("digest", None) if isinstance(found, dict) else None
        if digest is None or digest != json_digest(found):
            return CorruptCache("feature-store metadata does not match its recorded digest", path,
                                lock=self.lock_path)  # fmt: skip
        expected = self.meta
        if found != expected:
            diff = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
            detail = "; ".join(f"{k}: store has {found.get(k)!r}, wanted {expected.get(k)!r}" for k in diff)
            raise InputError(
                f"feature store was built under another config ({detail}); "
                "delete the folder or use another cache directory",
                self.directory,
            )
        return None

    def _shard_numbers(self) -> set[int]:
        """Numbers of every shard file in the folder, complete or not."""
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            return set()
        return {int(m.group(1)) for m in map(_SHARD_RE.match, entries) if m}

    def _remove_shards(self, numbers: Iterable[int]) -> None:
        """Delete shards' files, index first (call with the store's lock held)."""
        for number in sorted(numbers):
            for suffix in ("index.npz", *_DATA_FILES):
                self._path(number, suffix).unlink(missing_ok=True)

    def refresh(self, *, full: bool = False) -> None:
        """Re-read the list of complete shards (after another process wrote some).

        Shards failing their checks (see the module docstring; ``full``: also hash the data files
        in full) are logged as warnings and left out; their numbers are in :attr:`bad_shards`.
        """
        self._shards.clear()
        self._where.clear()
        self.bad_shards = []
        self._numbers = self._shard_numbers()
        for number in sorted(self._numbers):
            if not self._path(number, "index.npz").exists():
                continue
            try:
                shard = self._read_shard(number, full=full)
            except CorruptCache as exc:
                log.warning("%s; its images will be described again", exc)
                self.bad_shards.append(number)
                continue
            si = len(self._shards)
            self._shards.append(shard)
            for j, name in enumerate(shard.names.tolist()):
                self._where[name] = (si, j)
        self._next_number = (max(self._numbers) + 1) if self._numbers else 0

    def _corrupt(self, number: int, problem: str, path: Path) -> CorruptCache:
        """The error for a damaged shard: deleting it makes its images be described again."""
        files = tuple(self._path(number, s) for s in ("index.npz", *_DATA_FILES))
        return CorruptCache(problem, path, discard=files, lock=self.lock_path)

    def _read_shard(self, number: int, *, full: bool) -> _Shard:
        index_path = self._path(number, "index.npz")
        bad = self._corrupt(number, "", index_path)
        z = load_npz(index_path, what="feature-shard index", discard=bad.discard, lock=bad.lock)
        try:
            names, counts, sizes = z["names"], z["counts"], z["sizes"]
            kp_crc, raw_crc = z["kp_crc"], z["raw_crc"]
            files = json.loads(str(z["files"]))
            n = len(names)
            if not (counts.shape == kp_crc.shape == raw_crc.shape == (n,) and sizes.shape == (n, 2)):
                raise ValueError("arrays of different lengths")
        except (KeyError, ValueError, TypeError) as exc:
            raise self._corrupt(number, f"malformed feature-shard index ({exc})", index_path) from None
        for suffix in _DATA_FILES:
            path = self._path(number, suffix)
            rec = files.get(suffix, {}) if isinstance(files, dict) else {}
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise self._corrupt(number, "feature shard data file missing", path) from None
            if size != rec.get("size"):
                raise self._corrupt(
                    number, f"feature shard is {size:,} bytes, {rec.get('size')} were written (truncated?)", path
                )
            if sampled_digest(path, sample=_SAMPLE) != rec.get("sampled_sha256"):
                raise self._corrupt(number, "feature shard does not match its recorded digest (sampled)", path)
            if full and file_sha256(path) != rec.get("sha256"):
                raise self._corrupt(number, "feature shard does not match its recorded digest", path)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return _Shard(number, names, offsets, sizes, kp_crc, raw_crc)

    def _path(self, number: int, suffix: str) -> Path:
        return self.directory / f"shard-{number:06d}.{suffix}"

    @contextlib.contextmanager
    def writing(self, *, full: bool = False) -> Iterator[FeatureStore]:
        """Hold the store's lock, re-read it, and delete corrupt and incomplete shards.

        A second process waits here (saying so in the log) until the first has finished, and then
        sees its shards. ``full``: check the data files in full (see :meth:`refresh`).
        """
        with entry_lock(self.lock_path, what=f"the feature store {self.directory}"):
            self.refresh(full=full)
            stale = set(self.bad_shards) | {n for n in self._numbers if not self._path(n, "index.npz").exists()}
            if stale:
                self._remove_shards(stale)
                self._numbers -= stale
                self._next_number = (max(self._numbers) + 1) if self._numbers else 0
            yield self

    # ------------------------------------------------------------------ reading
    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __len__(self) -> int:
        return len(self._where)

    @property
    def names(self) -> list[str]:
        """Names of all stored images, in storage order."""
        return list(self._where)

    def count(self, name: str) -> int:
        """Number of features of one stored image."""
        try:
            si, j = self._where[name]
        except KeyError:
            raise InputError(f"no features for image {name!r}", self.directory) from None
        offsets = self._shards[si].offsets
        return int(offsets[j + 1] - offsets[j])

    def _arrays(self, shard: _Shard) -> tuple[NDArray[np.float32], NDArray[Any]]:
        if shard._kp is None or shard._raw is None:
            arrays = []
            for suffix, cols in zip(_DATA_FILES, (4, self.config.dim), strict=True):
                path = self._path(shard.number, suffix)
                try:
                    a = np.load(path, mmap_mode="r", allow_pickle=False)
                    if a.ndim != 2 or a.shape != (int(shard.offsets[-1]), cols):
                        raise ValueError(f"shape {a.shape}")
                except Exception as exc:  # noqa: BLE001 - any failure to map a damaged file
                    raise self._corrupt(shard.number, f"unreadable feature shard ({exc})", path) from None
                arrays.append(a)
            shard._kp, shard._raw = arrays
        return shard._kp, shard._raw

    def get_raw(self, name: str) -> RawFeatures:
        """Keypoints and stored descriptors of one image (before the extractor's ``finish``).

        Raises:
            InputError: the image has no features in this store.
            CorruptCache: its bytes do not match the checksums recorded when they were written.
        """
        try:
            si, j = self._where[name]
        except KeyError:
            raise InputError(
                f"no features for image {name!r} (extraction incomplete?)", self.directory
            ) from None
        shard = self._shards[si]
        kp, raw = self._arrays(shard)
        a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
        kp_i, raw_i = np.array(kp[a:b]), np.array(raw[a:b])
        for suffix, arr, want in (("kp.npy", kp_i, shard.kp_crc[j]), ("raw.npy", raw_i, shard.raw_crc[j])):
            if _crc(arr) != int(want):
                raise self._corrupt(
                    shard.number, f"the features of image {name!r} do not match their recorded checksum",
                    self._path(shard.number, suffix),
                )
        w, h = (int(v) for v in shard.sizes[j])
        return name, kp_i, raw_i, (w, h)

    def get(self, name: str) -> LocalFeatures:
        """The features of one image, descriptors finished by the extractor (RootSIFT).

        Raises:
            InputError: the image has no features in this store.
        """
        _, kp, raw, size = self.get_raw(name)
        return LocalFeatures(kp, self.config.finish(raw), size)

    def __getitem__(self, name: str) -> LocalFeatures:
        return self.get(name)

    def missing(self, names: Iterable[str]) -> list[str]:
        """The names among ``names`` that have no features yet."""
        return [n for n in names if n not in self._where]

    def require_all(self, names: Sequence[str]) -> None:
        """Raise :class:`InputError` naming the first image without features."""
        missing = self.missing(names)
        if missing:
            raise InputError(
                f"{len(missing)} image(s) have no features, e.g. {missing[0]!r}; "
                "run the extraction step first",
                self.directory,
            )

    def iter_raw(self, names: Sequence[str]) -> Iterator[RawFeatures]:
        """Raw features of ``names`` in that order."""
        self.require_all(names)
        for name in names:
            yield self.get_raw(name)

    # ------------------------------------------------------------------ writing
    def write_shard(self, items: Sequence[RawFeatures]) -> Path:
        """Append one complete shard; the index file is written last (its presence = complete).

        Call it inside :meth:`writing` when other processes may write the same store.
        """
        if not items:
            raise ValueError("empty shard")
        number = self._next_number
        self._next_number += 1
        self._numbers.add(number)
        names = np.array([it[0] for it in items])
        counts = np.array([len(it[1]) for it in items], np.int64)
        sizes = np.array([it[3] for it in items], np.int32).reshape(-1, 2)
        kps = [np.asarray(it[1], np.float32).reshape(-1, 4) for it in items]
        dtype, dim = np.dtype(self.config.stored_dtype), self.config.dim
        raws = []
        for it in items:
            raw = np.asarray(it[2])
            if raw.dtype != dtype or raw.ndim != 2 or raw.shape[1] != dim:
                raise ValueError(f"image {it[0]!r}: descriptors {raw.dtype} {raw.shape}, the store holds {dtype} [n, {dim}]")
            raws.append(raw)
        files = {}
        for suffix, parts in (("kp.npy", kps), ("raw.npy", raws)):
            path = self._path(number, suffix)
            atomic_write_npy(path, np.concatenate(parts))
            files[suffix] = {
                "size": path.stat().st_size,
                "sampled_sha256": sampled_digest(path, sample=_SAMPLE),
                "sha256": file_sha256(path),
            }
        kp_crc = np.array([_crc(k) for k in kps], np.uint32)
        raw_crc = np.array([_crc(r) for r in raws], np.uint32)
        index_path = self._path(number, "index.npz")
        save_npz(index_path, {
            "names": names, "counts": counts, "sizes": sizes, "kp_crc": kp_crc, "raw_crc": raw_crc,
            "files": np.array(json.dumps(files, sort_keys=True)),
        })  # fmt: skip
        offsets = np.zeros(len(names) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        si = len(self._shards)
        self._shards.append(_Shard(number, names, offsets, sizes, kp_crc, raw_crc))
        for j, name in enumerate(names.tolist()):
            self._where[name] = (si, j)
        return index_path


# ---------------------------------------------------------------------- extraction jobs
class DescribeImages:
    """Picklable job: describe image ``i`` of an image source (whole image)."""

    def __init__(self, source, config: LocalExtractor) -> None:  # noqa: ANN001 - ImageSource
        self.source = source
        self.config = config

    def name(self, i: int) -> str:
        return self.source.name(i)

    def __call__(self, i: int) -> RawFeatures:
        image = self.source.read(i)
        kp, raw = self.config.extract(image)
        return self.source.name(i), kp, raw, (int(image.shape[1]), int(image.shape[0]))


class DescribeQueries:
    """Picklable job: describe the CROP of query ``i``; keypoints in full-image coordinates."""

    def __init__(self, benchmark, config: LocalExtractor) -> None:  # noqa: ANN001 - Benchmark
        self.queries = benchmark.queries
        self.bboxes = [q.bbox for q in benchmark.gt.queries]
        self.crop = benchmark.crop
        self.config = config

    def name(self, i: int) -> str:
        return self.queries.name(i)

    def __call__(self, i: int) -> RawFeatures:
        from oxbench.datasets.base import crop_box

        image = self.queries.read(i)
        h, w = image.shape[:2]
        bbox = self.bboxes[i]
        left = top = 0
        if bbox is not None:
            left, top, right, bottom = crop_box(bbox, w, h, self.crop)
            image = image[top:bottom, left:right]
        kp, raw = self.config.extract(image)
        kp[:, 0] += left
        kp[:, 1] += top
        return self.queries.name(i), kp, raw, (int(w), int(h))


def extract_to_store(
    job: DescribeImages | DescribeQueries,
    n_items: int,
    store: FeatureStore,
    *,
    executor: Executor | None = None,
    shard_size: int = 64,
    progress: bool = True,
    desc: str = "features",
    stop_after: int | None = None,
    full_check: bool = False,
) -> int:
    """Describe every item the store does not hold yet, writing complete shards as it goes.

    Resumable: items whose name is already in a complete, intact shard are skipped, so an
    interrupted call repeated gives the same store as an uninterrupted one. Corrupt and incomplete
    shards are deleted and their images described again. The store's lock is held throughout: a
    second process extracting into the same store waits, then finds the work done.

    Args:
        job: what to run per item index (``DescribeImages`` / ``DescribeQueries``).
        n_items: items ``0 .. n_items - 1`` are described.
        store: where the features go.
        executor: where the items are described (:mod:`oxbench.execution`; default: this process).
        shard_size: images per shard (one shard is lost at most on interruption).
        progress: show a tqdm bar.
        desc: the bar's label.
        stop_after: stop after this many shards (tests use it to simulate an interruption).
        full_check: hash the existing shards' data files in full, not only sampled.

    Returns:
        How many images were described (0: every image came from the store).
    """
    names = [job.name(i) for i in range(n_items)]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"image name {dup!r} appears twice; the store is keyed by name")
    with store.writing(full=full_check):
        todo = [i for i in range(n_items) if names[i] not in store]
        if not todo:
            return 0
        log.info("describing %d of %d images into %s", len(todo), n_items, store.directory)
        if stop_after is not None:
            todo = todo[: stop_after * shard_size]
        shard: list[RawFeatures] = []
        run = (executor or SerialExecutor()).map(job, todo, desc=desc, unit="img", progress=progress)
        with contextlib.closing(run):  # an error here stops the workers at once
            for features in run:
                shard.append(features)
                if len(shard) == shard_size:
                    store.write_shard(shard)
                    shard = []
        if shard:
            store.write_shard(shard)
    return len(todo)
