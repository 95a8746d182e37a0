"""A resumable on-disk store of local features, keyed by image name.

Layout of one store folder (one per dataset part and extraction config)::

    <dir>/meta.json                    config that built it (refused when it differs)
    <dir>/shard-000000.kp.npy          float32 [n_features, 4] keypoints of the shard's images
    <dir>/shard-000000.raw.npy         uint8 [n_features, 128] raw SIFT histograms
    <dir>/shard-000000.index.npz       names, per-image feature counts and image sizes

A shard is complete when its ``.index.npz`` exists: it is written last, through a temporary file and
a rename, so an interrupted extraction leaves no shard that looks complete, and the next run simply
describes the images whose names are in no complete shard. Data files are memory-mapped on read so
that fetching one image's features (spatial verification) costs one slice, not a shard load.

Descriptors are stored as the raw SIFT histograms (exactly representable as ``uint8``) and turned into
the configured descriptor (RootSIFT) on read.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.features.local import LocalFeatures
from oxbench.features.sift import SiftConfig, extract_raw_sift, finish_descriptors
from oxbench.workers import worker_pool

log = logging.getLogger(__name__)

STORE_FORMAT = 1
_SHARD_RE = re.compile(r"^shard-(\d{6})\.index\.npz$")

# (name, keypoints, raw descriptors, (width, height))
RawFeatures = tuple[str, NDArray[np.float32], NDArray[np.uint8], tuple[int, int]]


def _atomic_save_npy(path: Path, array: NDArray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, array)
    os.replace(tmp, path)


def _atomic_save_npz(path: Path, **arrays: NDArray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        # numpy's stub types **kwds together with the bool ``allow_pickle`` keyword
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, path)


@dataclass
class _Shard:
    number: int
    names: NDArray[np.str_]
    offsets: NDArray[np.int64]  # [n_images + 1]
    sizes: NDArray[np.int32]  # [n_images, 2]
    _kp: NDArray[np.float32] | None = None
    _raw: NDArray[np.uint8] | None = None


class FeatureStore:
    """Local features of many images, on disk, keyed by image name.

    Open with :meth:`open` (creates the folder, or checks that an existing one was built with the
    same config); fill with :func:`extract_to_store`; read with :meth:`get` / :meth:`__getitem__`.

    Attributes:
        directory: the store folder.
        config: the extraction config.
        meta: everything recorded in ``meta.json`` (config, role, extra keys).
    """

    def __init__(self, directory: Path, config: SiftConfig, meta: dict[str, object]) -> None:
        self.directory = directory
        self.config = config
        self.meta = meta
        self._shards: list[_Shard] = []
        self._where: dict[str, tuple[int, int]] = {}
        self._next_number = 0

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: SiftConfig,
        *,
        extra: dict[str, object] | None = None,
        create: bool = True,
    ) -> FeatureStore:
        """Open (or create) a store and index its complete shards.

        Args:
            directory: the store folder.
            config: the extraction config the caller expects.
            extra: other things that change the features (e.g. ``{"role": "queries",
                "crop": "python"}``); must match too.
            create: create the folder when missing (else :class:`InputError`).

        Raises:
            InputError: the folder was built with another config, or is missing with
                ``create=False``, or its metadata is unreadable.
        """
        directory = Path(directory)
        expected = {"format": STORE_FORMAT, "config": config.to_dict(), **(extra or {})}
        meta_path = directory / "meta.json"
        if meta_path.exists():
            try:
                found = json.loads(meta_path.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(f"unreadable feature-store metadata ({exc})", meta_path) from None
            if found != expected:
                diff = sorted(
                    k for k in set(found) | set(expected) if found.get(k) != expected.get(k)
                )
                detail = "; ".join(
                    f"{k}: store has {found.get(k)!r}, wanted {expected.get(k)!r}" for k in diff
                )
                raise InputError(
                    f"feature store was built under another config ({detail}); "
                    "delete the folder or use another cache directory",
                    directory,
                )
        elif create:
            directory.mkdir(parents=True, exist_ok=True)
            tmp = meta_path.with_name("meta.json.tmp")
            tmp.write_text(json.dumps(expected, indent=1, sort_keys=True))
            os.replace(tmp, meta_path)
        else:
            raise InputError("no feature store here (extract features first)", directory)
        store = cls(directory, config, expected)
        store.refresh()
        return store

    def refresh(self) -> None:
        """Re-read the list of complete shards (after another process wrote some)."""
        self._shards.clear()
        self._where.clear()
        numbers = []
        for entry in sorted(os.listdir(self.directory)):
            m = _SHARD_RE.match(entry)
            if m:
                numbers.append(int(m.group(1)))
        for number in numbers:
            path = self._path(number, "index.npz")
            try:
                with np.load(path, allow_pickle=False) as z:
                    names, counts, sizes = z["names"], z["counts"], z["sizes"]
            except (OSError, ValueError, KeyError) as exc:
                raise InputError(f"corrupt feature shard ({exc}); delete it", path) from None
            offsets = np.zeros(len(names) + 1, np.int64)
            np.cumsum(counts, out=offsets[1:])
            shard = _Shard(number, names, offsets, sizes)
            si = len(self._shards)
            self._shards.append(shard)
            for j, name in enumerate(names.tolist()):
                self._where[name] = (si, j)
        self._next_number = (max(numbers) + 1) if numbers else 0

    def _path(self, number: int, suffix: str) -> Path:
        return self.directory / f"shard-{number:06d}.{suffix}"

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

    def _arrays(self, shard: _Shard) -> tuple[NDArray[np.float32], NDArray[np.uint8]]:
        if shard._kp is None or shard._raw is None:
            shard._kp = np.load(self._path(shard.number, "kp.npy"), mmap_mode="r")
            shard._raw = np.load(self._path(shard.number, "raw.npy"), mmap_mode="r")
        return shard._kp, shard._raw

    def get_raw(self, name: str) -> RawFeatures:
        """Keypoints and raw uint8 SIFT of one image (no descriptor post-processing)."""
        try:
            si, j = self._where[name]
        except KeyError:
            raise InputError(
                f"no features for image {name!r} (extraction incomplete?)", self.directory
            ) from None
        shard = self._shards[si]
        kp, raw = self._arrays(shard)
        a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
        w, h = (int(v) for v in shard.sizes[j])
        return name, np.array(kp[a:b]), np.array(raw[a:b]), (w, h)

    def get(self, name: str) -> LocalFeatures:
        """The features of one image, descriptors post-processed as configured (RootSIFT).

        Raises:
            InputError: the image has no features in this store.
        """
        _, kp, raw, size = self.get_raw(name)
        return LocalFeatures(kp, finish_descriptors(raw, self.config.descriptor), size)

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
        """Append one complete shard; the index file is written last (its presence = complete)."""
        if not items:
            raise ValueError("empty shard")
        number = self._next_number
        self._next_number += 1
        names = np.array([it[0] for it in items])
        counts = np.array([len(it[1]) for it in items], np.int64)
        sizes = np.array([it[3] for it in items], np.int32).reshape(-1, 2)
        kp = np.concatenate([it[1] for it in items]).astype(np.float32, copy=False).reshape(-1, 4)
        raw = np.concatenate([it[2] for it in items]).astype(np.uint8, copy=False).reshape(-1, 128)
        _atomic_save_npy(self._path(number, "kp.npy"), kp)
        _atomic_save_npy(self._path(number, "raw.npy"), raw)
        index_path = self._path(number, "index.npz")
        _atomic_save_npz(index_path, names=names, counts=counts, sizes=sizes)
        offsets = np.zeros(len(names) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        si = len(self._shards)
        self._shards.append(_Shard(number, names, offsets, sizes))
        for j, name in enumerate(names.tolist()):
            self._where[name] = (si, j)
        return index_path


# ---------------------------------------------------------------------- extraction jobs
class DescribeImages:
    """Picklable job: describe image ``i`` of an image source (whole image)."""

    def __init__(self, source, config: SiftConfig) -> None:  # noqa: ANN001 - ImageSource
        self.source = source
        self.config = config

    def name(self, i: int) -> str:
        return self.source.name(i)

    def __call__(self, i: int) -> RawFeatures:
        image = self.source.read(i)
        kp, raw = extract_raw_sift(image, self.config)
        return self.source.name(i), kp, raw, (int(image.shape[1]), int(image.shape[0]))


class DescribeQueries:
    """Picklable job: describe the CROP of query ``i``; keypoints in full-image coordinates."""

    def __init__(self, benchmark, config: SiftConfig) -> None:  # noqa: ANN001 - Benchmark
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
        kp, raw = extract_raw_sift(image, self.config)
        kp[:, 0] += left
        kp[:, 1] += top
        return self.queries.name(i), kp, raw, (int(w), int(h))


_WORKER_JOB: Callable[[int], RawFeatures] | None = None


def _init_worker(job: Callable[[int], RawFeatures]) -> None:
    global _WORKER_JOB
    _WORKER_JOB = job
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover
        pass


def _run_worker(i: int) -> RawFeatures:
    assert _WORKER_JOB is not None
    return _WORKER_JOB(i)


def extract_to_store(
    job: DescribeImages | DescribeQueries,
    n_items: int,
    store: FeatureStore,
    *,
    workers: int = 1,
    shard_size: int = 64,
    progress: bool = True,
    desc: str = "features",
    stop_after: int | None = None,
) -> Path:
    """Describe every item the store does not hold yet, writing complete shards as it goes.

    Resumable: items whose name is already in a complete shard are skipped, so an interrupted call
    repeated gives the same store as an uninterrupted one.

    Args:
        job: what to run per item index (``DescribeImages`` / ``DescribeQueries``).
        n_items: items ``0 .. n_items - 1`` are described.
        store: where the features go.
        workers: processes (``1`` = in this process).
        shard_size: images per shard (one shard is lost at most on interruption).
        progress: show a tqdm bar.
        desc: the bar's label.
        stop_after: stop after this many shards (tests use it to simulate an interruption).

    Returns:
        The store folder.
    """
    from tqdm.auto import tqdm

    todo = [i for i in range(n_items) if job.name(i) not in store]
    names = [job.name(i) for i in range(n_items)]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"image name {dup!r} appears twice; the store is keyed by name")
    if not todo:
        return store.directory
    log.info("describing %d of %d images into %s", len(todo), n_items, store.directory)
    bar = tqdm(total=len(todo), desc=desc, disable=not progress, unit="img")
    shards_written = 0
    pool = None
    try:
        if workers > 1:
            pool = worker_pool(workers, initializer=_init_worker, initargs=(job,))
        for start in range(0, len(todo), shard_size):
            chunk = todo[start : start + shard_size]
            if pool is not None:
                results = list(pool.map(_run_worker, chunk, chunksize=max(1, len(chunk) // (4 * workers))))
            else:
                results = [job(i) for i in chunk]
            store.write_shard(results)
            bar.update(len(chunk))
            shards_written += 1
            if stop_after is not None and shards_written >= stop_after:
                break
    except BaseException:
        if pool is not None:
            pool.abort()  # an error or Ctrl-C/SIGTERM: stop the workers now, not after the queue
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return store.directory
