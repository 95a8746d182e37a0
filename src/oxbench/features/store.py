"""A resumable on-disk store of local features, keyed by image name, written in write-once shards.

Layout of one store folder (one per dataset part and extraction config)::

    <dir>/meta.json                        config that built it (refused when it differs), with its digest
    <dir>/plan.json                        the shard plan of the last extraction (size, count, digest)
    <dir>/shard-000000-<items digest>/     one committed shard (a folder that appears whole, by one rename):
        kp.npy                             float32 [n_features, 4] keypoints of the shard's images
        raw.npy                            [n_features, dim] descriptors as the extractor stores them
                                           (uint8 SIFT histograms for SIFT / RootSIFT)
        index.npz                          names, per-image feature counts and image sizes, checksums
    <dir>/.lock                            held by the process that drives an extraction

The shard protocol (the same whatever executes it: this process, local worker processes, a Dask
cluster, or independent ``--partition`` processes):

- the *plan* cuts the images, in benchmark order, into shards of a fixed size (``shard_size``);
  its digest (of the names and the size) is recorded in ``plan.json`` and in every shard;
- shard ``k`` describes the images of planned shard ``k`` that the store does not hold yet -- a pure
  function of those images and the config -- into a uniquely named temporary folder, and commits it
  by renaming the folder to ``shard-<k>-<digest of its image names>``. Two attempts of the same
  shard (a retried task whose first worker was only slow, two partition processes) race for the
  same name: the first rename wins, the loser removes its temporary folder;
- the task returns a small :class:`ShardReceipt` (counts, digest), never features; the driver
  submits only the shards with missing images, then re-reads the store and assembles in shard order.

So an interrupted extraction leaves no shard that looks complete, and the next run describes only
the images whose names are in no committed shard. Data files are memory-mapped on read so that
fetching one image's features (spatial verification) costs one slice, not a shard load. Stores
written by earlier oxbench versions (flat ``shard-000000.{kp.npy,raw.npy,index.npz}`` files) are
still read, so their caches stay warm.

The store cannot lie (:mod:`oxbench.cache`). What is checked, and when:

- ``meta.json`` and each ``index.npz``: a full SHA-256 of their content, on every open;
- each ``kp.npy`` / ``raw.npy``: its size and a *sampled* digest (:func:`oxbench.fileio.
  sampled_digest` of its first, middle and last 4 KiB) on every open -- cheap enough for a million
  images, and it catches truncation exactly -- and, with ``full=True`` (after a corruption was found
  late), its full SHA-256;
- every image's keypoints and descriptors: a CRC-32 recorded per image, checked on every read, so
  a flipped byte anywhere is caught before the features are used.

The store also cannot outlive a changed image: every shard records, for each image it describes,
the identity of the image file when it was described (size, modification time in ns, inode:
:func:`image_identity`, one ``stat``, no read). An extraction compares them with the files now
(:meth:`FeatureStore.changed`) and describes again only the images that changed (a re-downloaded
set, face-blurred copies, a fixed corrupt file), with one warning naming how many; the newer shard
holds those images from then on (shards are read in the order they were written), and a shard
none of whose images it still holds is deleted.

A shard that fails an open-time check (tampered with after its commit) is logged as a warning
naming the file and left out (its images are described again by the next extraction, which deletes
it); a failed per-image check raises :class:`~oxbench.cache.CorruptCache`, which the pipeline turns
into the same recomputation.

Descriptors are stored as the extractor stores them (:class:`~oxbench.features.local.LocalExtractor`:
its ``stored_dtype`` and ``dim``; raw SIFT histograms, exactly representable as ``uint8``) and turned
into the descriptors it matches with (RootSIFT) by its ``finish`` on read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import time
import uuid
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.cache import DIGEST_KEY, CorruptCache, entry_lock, load_npz, save_npz
from oxbench.errors import InputError
from oxbench.execution import Executor
from oxbench.execution.shards import (
    SHARD_DIR_RE,
    ShardReceipt,
    ShardTask,
    check_partition,
    check_shard_size,
    in_partition,
    plan_digest,
    plan_shards,
    run_shard_tasks,
    shard_folder_name,
)
from oxbench.features.local import ExtractionJob, LocalExtractor, LocalFeatures, RawFeatures
from oxbench.fileio import (
    atomic_write_json,
    atomic_write_npy,
    commit_folder,
    discard_folder,
    file_sha256,
    json_digest,
    make_temp_folder,
    sampled_digest,
)
from oxbench.storage import StoreFolder

log = logging.getLogger(__name__)

STORE_FORMAT = 1
#: Images per planned shard unless the caller says otherwise.
DEFAULT_SHARD_SIZE = 64
_LEGACY_RE = re.compile(r"^shard-(\d{6})\.(index\.npz|kp\.npy|raw\.npy)$")


#: Bytes read at the start, middle and end of a data file for its open-time sampled digest.
_SAMPLE = 4096
_DATA_FILES = ("kp.npy", "raw.npy")


def _crc(array: NDArray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).data)


#: The identity of an image that has no file (generated on demand): never compared.
NO_FILE = (-1, -1, -1)
#: The identity of an image file that cannot be found: differs from every recorded one.
MISSING_FILE = (-2, -2, -2)


def image_sha256(path: Path | None) -> str:
    """SHA-256 of an image file's bytes ("" when it has no file or cannot be read)."""
    if path is None:
        return ""
    try:
        return file_sha256(path)
    except OSError:
        return ""


def image_identity(path: Path | None) -> tuple[int, int, int]:
    """``(size, mtime_ns, inode)`` of an image file (one ``stat``, no read): what a feature shard
    records for each image it describes. :data:`NO_FILE` when the image has no file,
    :data:`MISSING_FILE` when it cannot be found."""
    if path is None:
        return NO_FILE
    try:
        st = os.stat(path)
    except OSError:
        return MISSING_FILE
    return int(st.st_size), int(st.st_mtime_ns), int(st.st_ino)


@dataclass
class _Shard:
    number: int
    paths: dict[str, Path]  # "index.npz", "kp.npy", "raw.npy" -> file
    names: NDArray[np.str_]
    offsets: NDArray[np.int64]  # [n_images + 1]
    sizes: NDArray[np.int32]  # [n_images, 2]
    kp_crc: NDArray[np.uint32]  # [n_images] CRC-32 of each image's keypoint rows
    raw_crc: NDArray[np.uint32]  # [n_images] CRC-32 of each image's descriptor rows
    digest: str = ""  # content digest of its index (what a receipt names)
    # [n_images, 3] size, mtime_ns, inode of each image's file when it was described
    identities: NDArray[np.int64] | None = None
    image_sha256: NDArray[np.str_] | None = None  # [n_images] of the files' bytes when described
    written_ns: int = 0  # when it was written (a later shard holds an image described again)
    _kp: NDArray[np.float32] | None = None
    _raw: NDArray[Any] | None = None


def write_shard_folder(
    directory: Path,
    number: int,
    items: Sequence[RawFeatures],
    config: LocalExtractor,
    *,
    plan: str = "",
    tag: str = "",
    folder: str | None = None,
    identities: Sequence[tuple[int, int, int]] | None = None,
    image_sha256: Sequence[str] | None = None,
) -> ShardReceipt:
    """Write one shard into a unique temporary folder of ``directory`` and commit it by one rename.

    The first commit of a folder name wins; a later attempt of the same shard removes its temporary
    folder and reports ``committed=False``. Nothing outside the temporary folder is touched before
    the rename, so a killed attempt leaves only a temporary folder (removed by the run that owns
    ``tag``, or after an hour by anyone).

    Args:
        directory: the store folder.
        number: the shard's number in the plan.
        items: its images' raw features, in plan order.
        config: the extraction config (the descriptors' dtype and dimension).
        plan: the plan's digest, recorded in the shard.
        tag: put in the temporary folder's name (the owning run's token).
        folder: the committed name (default :func:`shard_folder_name`).
        identities: each image's :func:`image_identity` taken before it was read (default:
            :data:`NO_FILE` each).
        image_sha256: the SHA-256 of each image's file as it was read ("" for none).

    Raises:
        ValueError: no items, identities of another length, or descriptors of another dtype /
            dimension than the config's.
    """
    t0 = time.perf_counter()
    if not items:
        raise ValueError("empty shard")
    names = np.array([it.name for it in items])
    final = Path(directory) / (folder or shard_folder_name(number, names.tolist()))
    counts = np.array([len(it) for it in items], np.int64)
    sizes = np.array([it.image_size for it in items], np.int32).reshape(-1, 2)
    stats = np.array(identities if identities is not None else [NO_FILE] * len(items), np.int64)
    hashes = np.array(list(image_sha256) if image_sha256 is not None else [""] * len(items))
    if stats.shape != (len(items), 3) or hashes.shape != (len(items),):
        raise ValueError(f"{stats.shape[0]} image identities for {len(items)} images")
    kps = [np.asarray(it.keypoints, np.float32) for it in items]
    dtype, dim = np.dtype(config.stored_dtype), config.dim
    raws = []
    for it in items:
        raw = np.asarray(it.descriptors)
        if raw.dtype != dtype or raw.shape[1] != dim:
            raise ValueError(
                f"image {it.name!r}: descriptors {raw.dtype} {raw.shape}, the store holds {dtype} [n, {dim}]"
            )
        raws.append(raw)
    tmp = make_temp_folder(final, tag=tag)
    try:
        files = {}
        for suffix, parts in (("kp.npy", kps), ("raw.npy", raws)):
            path = tmp / suffix
            atomic_write_npy(path, np.concatenate(parts))
            files[suffix] = {
                "size": path.stat().st_size,
                "sampled_sha256": sampled_digest(path, sample=_SAMPLE),
                "sha256": file_sha256(path),
            }
        arrays = {
            "names": names,
            "counts": counts,
            "sizes": sizes,
            "kp_crc": np.array([_crc(k) for k in kps], np.uint32),
            "raw_crc": np.array([_crc(r) for r in raws], np.uint32),
            "files": np.array(json.dumps(files, sort_keys=True)),
            "plan": np.array(plan),
            "image_identity": stats,
            "image_sha256": hashes.astype("U64"),
        }
        save_npz(tmp / "index.npz", arrays)
        digest = str(load_npz(tmp / "index.npz", what="feature-shard index")[DIGEST_KEY])
    except BaseException:
        discard_folder(tmp)
        raise
    committed = commit_folder(tmp, final)
    return ShardReceipt(
        number,
        final.name,
        len(items),
        int(counts.sum()),
        digest,
        committed,
        time.perf_counter() - t0,
    )


def store_folder(directory: str | Path) -> StoreFolder:
    """A feature store's folder, as :mod:`oxbench.storage` checks it (its ``meta.json``: the
    extraction config and the store's role, with their digest)."""
    names = ("plan.json", ".lock", "shard-*")
    return StoreFolder(Path(directory), "feature store", STORE_FORMAT, frozenset(names))


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
        self._found: dict[str, dict[str, Path]] = {}  # shard id -> its files, complete or not
        self._bad: list[str] = []
        self._warned: set[str] = set()
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
        box = store_folder(directory)
        expected = box.fields({"config": config.to_dict(), **(extra or {})})
        store = cls(directory, config, expected)
        state = box.refuse_foreign()  # never written into, nor cleaned
        if state == "own":
            box.remove_temps()
        problem = store._check_meta()
        if problem is not None:
            if not create:
                if isinstance(problem, CorruptCache):
                    raise problem
                raise InputError("no feature store here (extract features first)", directory)
            if state in ("absent", "empty"):  # appears with its meta.json, by one rename
                box.create({"config": config.to_dict(), **(extra or {})})
                problem = store._check_meta()  # another process may have made it first
        if problem is not None:
            with entry_lock(store.lock_path, what=f"the feature store {directory}"):
                problem = store._check_meta()  # another process may have mended it meanwhile
                if isinstance(problem, CorruptCache):
                    log.warning("%s; emptying the store and describing its images again", problem)
                    store._scan()
                    store._remove_shards(store._found)
                if problem is not None:
                    box.write_meta({"config": config.to_dict(), **(extra or {})})
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
            found = store_folder(self.directory).read_meta()
        except CorruptCache as exc:
            problem = exc.problem.removeprefix("corrupt cache file: ")
            return CorruptCache(problem, path, lock=self.lock_path)
        if found is None:
            return CorruptCache(
                "feature-store metadata without a digest (written by an older oxbench?)",
                path,
                lock=self.lock_path,
            )
        expected = self.meta
        if found != expected:
            diff = sorted(k for k in set(found) | set(expected) if found.get(k) != expected.get(k))
            detail = "; ".join(
                f"{k}: store has {found.get(k)!r}, wanted {expected.get(k)!r}" for k in diff
            )
            raise InputError(
                f"feature store was built under another config ({detail}); "
                "delete the folder or use another cache directory",
                self.directory,
            )
        return None

    def _scan(self) -> None:
        """Find every shard in the folder, complete or not: committed shard folders, and the flat
        ``shard-NNNNNN.*`` files of stores written by earlier oxbench versions."""
        found: dict[str, dict[str, Path]] = {}
        try:
            entries = os.listdir(self.directory)
        except FileNotFoundError:
            entries = []
        numbers = []
        for entry in entries:
            if m := SHARD_DIR_RE.match(entry):
                folder = self.directory / entry
                found[entry] = {s: folder / s for s in ("index.npz", *_DATA_FILES)}
                numbers.append(int(m.group(1)))
            elif m := _LEGACY_RE.match(entry):
                stem = f"shard-{m.group(1)}"
                found[stem] = {
                    s: self.directory / f"{stem}.{s}" for s in ("index.npz", *_DATA_FILES)
                }
                numbers.append(int(m.group(1)))
        # earlier versions' flat shards first: a shard folder holding the same image wins
        self._found = dict(
            sorted(
                found.items(), key=lambda kv: (kv[1]["index.npz"].parent != self.directory, kv[0])
            )
        )
        self._next_number = max(numbers) + 1 if numbers else 0

    @staticmethod
    def _number(shard_id: str) -> int:
        return int(shard_id[6:12])

    def _remove_shards(self, shard_ids: Iterable[str]) -> None:
        """Delete shards (call with the store's lock held, or for shards only this process writes)."""
        for sid in sorted(shard_ids):
            paths = self._found.get(sid)
            if paths is None:
                continue
            if (
                paths["index.npz"].parent == self.directory
            ):  # an earlier version's flat files, index first
                for suffix in ("index.npz", *_DATA_FILES):
                    paths[suffix].unlink(missing_ok=True)
            else:
                discard_folder(paths["index.npz"].parent)

    def refresh(self, *, full: bool = False) -> None:
        """Re-read the list of complete shards (after another process wrote some).

        Shards failing their checks (see the module docstring; ``full``: also hash the data files
        in full) are logged as warnings and left out; their numbers are in :attr:`bad_shards`.
        """
        self._shards.clear()
        self._where.clear()
        self.bad_shards = []
        self._bad = []
        self._scan()
        shards = []
        for sid, paths in self._found.items():
            legacy = paths["index.npz"].parent == self.directory
            if legacy and not paths["index.npz"].exists():
                continue  # an earlier version's unfinished shard (deleted by :meth:`writing`)
            try:
                shard = self._read_shard(self._number(sid), paths, full=full)
            except CorruptCache as exc:  # said once per shard, however often the store is re-read
                (log.debug if sid in self._warned else log.warning)(
                    "%s; its images will be described again", exc
                )
                self._warned.add(sid)
                self.bad_shards.append(self._number(sid))
                self._bad.append(sid)
                continue
            shards.append(shard)
        # in the order they were written (stable: earlier versions' shards first, as scanned), so
        # that an image described again is held by its newest shard
        for shard in sorted(shards, key=lambda s: s.written_ns):
            self._add(shard)

    def _add(self, shard: _Shard) -> None:
        si = len(self._shards)
        self._shards.append(shard)
        for j, name in enumerate(shard.names.tolist()):
            self._where[name] = (si, j)

    def _corrupt(
        self, number: int, paths: dict[str, Path], problem: str, path: Path
    ) -> CorruptCache:
        """The error for a damaged shard: deleting it makes its images be described again."""
        files = tuple(paths[s] for s in ("index.npz", *_DATA_FILES))
        return CorruptCache(problem, path, discard=files, lock=self.lock_path)

    def _read_shard(self, number: int, paths: dict[str, Path], *, full: bool) -> _Shard:
        index_path = paths["index.npz"]
        bad = self._corrupt(number, paths, "", index_path)
        if not index_path.exists():
            raise self._corrupt(
                number, paths, "committed feature shard without its index", index_path
            )
        z = load_npz(index_path, what="feature-shard index", discard=bad.discard, lock=bad.lock)
        try:
            names, counts, sizes = z["names"], z["counts"], z["sizes"]
            kp_crc, raw_crc = z["kp_crc"], z["raw_crc"]
            files = json.loads(str(z["files"]))
            n = len(names)
            if not (
                counts.shape == kp_crc.shape == raw_crc.shape == (n,) and sizes.shape == (n, 2)
            ):
                raise ValueError("arrays of different lengths")
        except (KeyError, ValueError, TypeError) as exc:
            raise self._corrupt(
                number, paths, f"malformed feature-shard index ({exc})", index_path
            ) from None
        folder = index_path.parent
        if folder != self.directory and folder.name != shard_folder_name(number, names.tolist()):
            raise self._corrupt(
                number, paths, "feature shard holds other images than its name says", index_path
            )
        for suffix in _DATA_FILES:
            path = paths[suffix]
            rec = files.get(suffix, {}) if isinstance(files, dict) else {}
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise self._corrupt(
                    number, paths, "feature shard data file missing", path
                ) from None
            if size != rec.get("size"):
                raise self._corrupt(
                    number,
                    paths,
                    f"feature shard is {size:,} bytes, {rec.get('size')} were written (truncated?)",
                    path,
                )
            if sampled_digest(path, sample=_SAMPLE) != rec.get("sampled_sha256"):
                raise self._corrupt(
                    number,
                    paths,
                    "feature shard does not match its recorded digest (sampled)",
                    path,
                )
            if full and file_sha256(path) != rec.get("sha256"):
                raise self._corrupt(
                    number, paths, "feature shard does not match its recorded digest", path
                )
        identities, hashes = z.get("image_identity"), z.get("image_sha256")
        if (
            identities is not None and (identities.shape != (n, 3) or identities.dtype != np.int64)
        ) or (hashes is not None and hashes.shape != (n,)):
            raise self._corrupt(number, paths, "malformed image identities", index_path)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return _Shard(
            number,
            paths,
            names,
            offsets,
            sizes,
            kp_crc,
            raw_crc,
            str(z[DIGEST_KEY]),
            identities,
            hashes,
            # when it was committed: not in its content, which is a pure function of its images
            index_path.stat().st_mtime_ns,
        )

    def changed(self, identities: dict[str, tuple[int, int, int]]) -> list[str]:
        """The stored images whose file is not the one described: ``identities`` (``{name:
        image_identity now}``) differs from what the shard holding the image recorded, or the
        shard recorded nothing (written by an older oxbench). Images without a file now
        (:data:`NO_FILE`) are not compared."""
        out = []
        for name, now in identities.items():
            where = self._where.get(name)
            if where is None or tuple(now) == NO_FILE:
                continue
            si, j = where
            recorded = self._shards[si].identities
            if recorded is None or tuple(int(v) for v in recorded[j]) != tuple(now):
                out.append(name)
        return out

    def changed_bytes(self, paths: dict[str, Path | None]) -> list[str]:
        """The stored images whose file's bytes (SHA-256, read in full: :func:`image_sha256`) are
        not those described, or were not recorded; images without a file are not compared."""
        out = []
        for name, path in paths.items():
            where = self._where.get(name)
            if where is None or path is None:
                continue
            si, j = where
            recorded = self._shards[si].image_sha256
            if recorded is None or str(recorded[j]) != image_sha256(path):
                out.append(name)
        return out

    def skipped(self, names: Iterable[str]) -> list[str]:
        """The images among ``names`` stored as skipped (:func:`skipped_features`: size 0 x 0)."""
        out = []
        for name in names:
            where = self._where.get(name)
            if where is not None and not self._shards[where[0]].sizes[where[1]].any():
                out.append(name)
        return out

    def superseded(self) -> list[str]:
        """Committed shards none of whose images the store takes from them any more (every one
        was described again into a later shard)."""
        holding = {si for si, _ in self._where.values()}
        return [
            s.paths["index.npz"].parent.name
            for si, s in enumerate(self._shards)
            if si not in holding and s.paths["index.npz"].parent != self.directory
        ]

    def content_digest(self) -> str:
        """One digest of everything the store holds now (its intact shards' index digests, which
        cover each image's name, size and feature checksums): what a result computed from the
        store records, so that it is not reused once the store holds other features."""
        return json_digest(sorted(s.digest for s in self._shards))

    def features_digest(self, names: Sequence[str]) -> str:
        """A digest of the features the store holds for ``names`` (in that order), from the
        checksums recorded when they were written (no read): what a result computed from these
        features (their visual words) records, so that it is computed again once any of them
        was described again.

        Raises:
            InputError: an image has no features in this store.
        """
        self.require_all(names)
        h = hashlib.sha256()
        for name in names:
            si, j = self._where[name]
            shard = self._shards[si]
            n = int(shard.offsets[j + 1] - shard.offsets[j])
            h.update(f"{name}\0{n}\0{int(shard.kp_crc[j])}\0{int(shard.raw_crc[j])}\n".encode())
        return h.hexdigest()

    def shard_digests(self) -> dict[str, str]:
        """``{committed shard folder name: content digest of its index}`` (flat shards left out)."""
        return {
            s.paths["index.npz"].parent.name: s.digest
            for s in self._shards
            if s.paths["index.npz"].parent != self.directory
        }

    def clean(self) -> None:
        """Re-read the store and delete its corrupt shards and earlier versions' unfinished ones
        (call with the lock held, or where no other process reads the store)."""
        self.refresh()
        stale = (
            set(self._bad)
            | set(self.superseded())
            | {
                sid
                for sid, p in self._found.items()
                if p["index.npz"].parent == self.directory and not p["index.npz"].exists()
            }
        )
        if stale:
            self._remove_shards(stale)
            for sid in stale:
                self._found.pop(sid, None)
            if set(self.superseded()) & stale:
                self.refresh()

    @contextlib.contextmanager
    def writing(self, *, full: bool = False) -> Iterator[FeatureStore]:
        """Hold the store's lock, re-read it, and delete corrupt and incomplete shards.

        A second process waits here (saying so in the log) until the first has finished, and then
        sees its shards. ``full``: check the data files in full (see :meth:`refresh`).
        """
        with entry_lock(self.lock_path, what=f"the feature store {self.directory}"):
            if full:
                self.refresh(full=True)
                self._remove_shards(self._bad)
            self.clean()
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

    def disk_bytes_of(self, names: Iterable[str]) -> int:
        """Bytes on disk of the features of ``names`` (those stored): each shard's data files in
        proportion to the names' feature rows in it and its index in proportion to its images,
        plus the store's own ``meta.json`` and ``plan.json``. A store that holds more images than
        an index (the distractors of a larger run) is charged only for the index's; the whole
        store when every image is named."""
        rows: dict[int, int] = {}
        images: dict[int, int] = {}
        for name in names:
            where = self._where.get(name)
            if where is None:
                continue
            si, j = where
            offsets = self._shards[si].offsets
            rows[si] = rows.get(si, 0) + int(offsets[j + 1] - offsets[j])
            images[si] = images.get(si, 0) + 1

        def size(path: Path) -> int:
            try:
                return os.stat(path).st_size
            except OSError:
                return 0

        total = sum(size(self.directory / f) for f in ("meta.json", "plan.json"))
        share = 0.0
        for si, n in images.items():
            shard = self._shards[si]
            n_rows = int(shard.offsets[-1])
            data = sum(size(shard.paths[f]) for f in _DATA_FILES)
            share += data * (rows[si] / n_rows if n_rows else n / len(shard.names))
            share += size(shard.paths["index.npz"]) * n / len(shard.names)
        return total + round(share)

    def _arrays(self, shard: _Shard) -> tuple[NDArray[np.float32], NDArray[Any]]:
        if shard._kp is None or shard._raw is None:
            arrays = []
            for suffix, cols in zip(_DATA_FILES, (4, self.config.dim), strict=True):
                path = shard.paths[suffix]
                try:
                    a = np.load(path, mmap_mode="r", allow_pickle=False)
                    if a.ndim != 2 or a.shape != (int(shard.offsets[-1]), cols):
                        raise ValueError(f"shape {a.shape}")
                except Exception as exc:  # noqa: BLE001 - any failure to map a damaged file
                    raise self._corrupt(
                        shard.number, shard.paths, f"unreadable feature shard ({exc})", path
                    ) from None
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
        for suffix, arr, want in (
            ("kp.npy", kp_i, shard.kp_crc[j]),
            ("raw.npy", raw_i, shard.raw_crc[j]),
        ):
            if _crc(arr) != int(want):
                raise self._corrupt(
                    shard.number,
                    shard.paths,
                    f"the features of image {name!r} do not match their recorded checksum",
                    shard.paths[suffix],
                )
        w, h = (int(v) for v in shard.sizes[j])
        return RawFeatures(name, kp_i, raw_i, (w, h))

    def get(self, name: str) -> LocalFeatures:
        """The features of one image, descriptors finished by the extractor (RootSIFT).

        Raises:
            InputError: the image has no features in this store.
        """
        return self.get_raw(name).finished(self.config)

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
        """Commit one more shard of ``items`` (numbered after every shard in the folder) and add it.

        Call it inside :meth:`writing` when other processes may write the same store;
        :func:`extract_to_store` writes planned shards instead.
        """
        number = self._next_number
        self._next_number += 1
        receipt = write_shard_folder(self.directory, number, items, self.config)
        folder = self.directory / receipt.folder
        paths = {s: folder / s for s in ("index.npz", *_DATA_FILES)}
        self._found[receipt.folder] = paths
        self._add(self._read_shard(number, paths, full=False))
        return paths["index.npz"]


# ---------------------------------------------------------------------- extraction jobs
def skipped_features(name: str, config: LocalExtractor) -> RawFeatures:
    """What a store holds for an image skipped under ``--allow-partial`` (it cannot be decoded, or
    is over the pixel budget): no features, and the size ``0 x 0`` no image has, which marks it."""
    return RawFeatures(
        name,
        np.zeros((0, 4), np.float32),
        np.zeros((0, config.dim), config.stored_dtype),
        (0, 0),
    )


def _read_or_skip(job: Any, i: int, read: Any) -> Any:
    """``read(i)``, or ``None`` when it fails and the job allows partial sets."""
    try:
        return read(i)
    except InputError:
        if not job.allow_partial:
            raise
        return None


class DescribeImages:
    """Picklable job: describe image ``i`` of an image source (whole image).

    ``allow_partial``: an image that cannot be read (undecodable, over the pixel budget) is stored
    as :func:`skipped_features` instead of stopping the extraction (named in one warning by
    :func:`extract_to_store`; a later run without it describes the image again, and fails).
    """

    def __init__(self, source, config: LocalExtractor, *, allow_partial: bool = False) -> None:  # noqa: ANN001 - ImageSource
        self.source = source
        self.config = config
        self.allow_partial = allow_partial

    def name(self, i: int) -> str:
        return self.source.name(i)

    def identity(self, i: int) -> tuple[int, int, int]:
        """:func:`image_identity` of image ``i``'s file."""
        return image_identity(self.source.path(i))

    def path(self, i: int) -> Path | None:
        """Image ``i``'s file (``None``: generated on demand)."""
        return self.source.path(i)

    def __call__(self, i: int) -> RawFeatures:
        image = _read_or_skip(self, i, self.source.read)
        if image is None:
            return skipped_features(self.source.name(i), self.config)
        kp, raw = self.config.extract(image)
        return RawFeatures(self.source.name(i), kp, raw, (int(image.shape[1]), int(image.shape[0])))


class DescribeQueries:
    """Picklable job: describe the CROP of query ``i``; keypoints in full-image coordinates."""

    def __init__(self, benchmark, config: LocalExtractor, *, allow_partial: bool = False) -> None:  # noqa: ANN001 - Benchmark
        self.queries = benchmark.queries
        self.bboxes = [q.bbox for q in benchmark.gt.queries]
        self.crop = benchmark.crop
        self.config = config
        self.allow_partial = allow_partial

    def name(self, i: int) -> str:
        return self.queries.name(i)

    def identity(self, i: int) -> tuple[int, int, int]:
        """:func:`image_identity` of query ``i``'s image file."""
        return image_identity(self.queries.path(i))

    def path(self, i: int) -> Path | None:
        """Query ``i``'s image file (``None``: generated on demand)."""
        return self.queries.path(i)

    def __call__(self, i: int) -> RawFeatures:
        from oxbench.datasets.base import crop_box

        image = _read_or_skip(self, i, self.queries.read)
        if image is None:
            return skipped_features(self.queries.name(i), self.config)
        h, w = image.shape[:2]
        bbox = self.bboxes[i]
        left = top = 0
        if bbox is not None:
            left, top, right, bottom = crop_box(bbox, w, h, self.crop)
            image = image[top:bottom, left:right]
        kp, raw = self.config.extract(image)
        kp[:, 0] += left
        kp[:, 1] += top
        return RawFeatures(self.queries.name(i), kp, raw, (int(w), int(h)))


class DescribeShard:
    """Picklable job of the shard protocol: describe one planned shard's images, commit the shard,
    return its :class:`ShardReceipt` (the features stay on disk)."""

    def __init__(
        self,
        describe: ExtractionJob,
        directory: Path,
        config: LocalExtractor,
        *,
        plan: str,
        tag: str,
    ) -> None:
        self.describe = describe
        self.directory = Path(directory)
        self.config = config
        self.plan = plan
        self.tag = tag

    def __call__(self, task: ShardTask) -> ShardReceipt:
        t0 = time.perf_counter()
        identities = [_identity(self.describe, i) for i in task.items]  # before reading: a change
        items = [self.describe(i) for i in task.items]  # while it is read shows on the next run
        hashes = [image_sha256(_path(self.describe, i)) for i in task.items]  # just read: cached
        receipt = write_shard_folder(
            self.directory,
            task.number,
            items,
            self.config,
            plan=self.plan,
            tag=self.tag,
            folder=task.folder,
            identities=identities,
            image_sha256=hashes,
        )
        return dataclasses.replace(receipt, seconds=time.perf_counter() - t0)


def extract_to_store(
    job: ExtractionJob,
    n_items: int,
    store: FeatureStore,
    *,
    executor: Executor | None = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: bool = True,
    desc: str = "features",
    stop_after: int | None = None,
    full_check: bool = False,
    partition: tuple[int, int] | None = None,
    verify_images: bool = False,
) -> int:
    """Describe every item the store does not hold yet, by the shard protocol (module docstring).

    Resumable: items whose name is already in a complete, intact shard are skipped, so an
    interrupted call repeated gives the same store as an uninterrupted one. Corrupt and incomplete
    shards are deleted and their images described again. The store's lock is held throughout: a
    second process extracting into the same store waits, then finds the work done -- except with
    ``partition``, where processes run side by side on disjoint shards and the commit protocol
    alone keeps them apart.

    Args:
        job: what to run per item index (``DescribeImages`` / ``DescribeQueries``).
        n_items: items ``0 .. n_items - 1`` are described.
        store: where the features go.
        executor: where the shards are described (:mod:`oxbench.execution`; default: this process).
        shard_size: images per planned shard (one shard's work is lost at most on interruption).
        progress: show a tqdm bar (one step per shard).
        desc: the bar's label.
        stop_after: stop after this many shards (tests use it to simulate an interruption).
        full_check: hash the existing shards' data files in full, not only sampled.
        partition: ``(i, n)``: describe only the planned shards numbered ``i`` modulo ``n``
            (:func:`check_partition`).
        verify_images: compare each stored image's file by its bytes (a full read and SHA-256
            of every image), not only by its size, modification time and inode (one ``stat``).

    Returns:
        How many images were described (0: every image came from the store).

    Raises:
        InputError: duplicate names, a bad shard size or partition, or shards whose images are
            missing after their tasks returned.
    """
    names = [job.name(i) for i in range(n_items)]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InputError(f"image name {dup!r} appears twice; the store is keyed by name")
    check_shard_size(shard_size)
    partition = check_partition(partition)
    what = f"the feature store {store.directory}"
    with contextlib.ExitStack() as stack:
        if partition is None:
            stack.enter_context(store.writing(full=full_check))
        else:  # only the clean-up is exclusive: partitions compute side by side
            with entry_lock(store.lock_path, what=what):
                if full_check:
                    store.refresh(full=True)
                    store._remove_shards(store._bad)
                store.clean()
        changed = _changed_images(job, names, store, verify_images=verify_images)
        tasks = plan_shards(names, shard_size, set(store.names) - set(changed))
        tasks = in_partition(tasks, partition)
        if changed:
            with entry_lock(store.lock_path, what=what) if partition is not None else _held():
                _clear_folders(store, {t.folder for t in tasks})
        if not tasks:
            return 0
        if stop_after is not None:
            tasks = tasks[:stop_after]
        plan = plan_digest(names, shard_size)
        n_plan = -(-n_items // shard_size)
        atomic_write_json(
            store.directory / "plan.json",
            {"images": n_items, "shard_size": shard_size, "shards": n_plan, "digest": plan},
        )
        n_todo = sum(len(t.items) for t in tasks)
        log.info(
            "describing %d of %d images (%d of %d shards) into %s",
            n_todo,
            n_items,
            len(tasks),
            n_plan,
            store.directory,
        )
        tag = uuid.uuid4().hex[:12]
        shard_job = DescribeShard(job, store.directory, store.config, plan=plan, tag=tag)
        receipts = run_shard_tasks(
            shard_job, tasks, store.directory, tag, executor=executor, desc=desc, progress=progress
        )
        store.refresh()
        _check_receipts(store, tasks, receipts, names)
        skipped = store.skipped(names[i] for t in tasks for i in t.items)
        if skipped:
            log.warning(
                "%d image(s) of %s could not be read and were skipped (partial set allowed): they "
                "have no features, e.g. %r",
                len(skipped),
                store.directory,
                skipped[0],
            )
    return n_todo


def _path(job: object, i: int) -> Path | None:
    """Item ``i``'s image file by ``job.path`` (a job without one: ``None``)."""
    path = getattr(job, "path", None)
    return path(i) if path is not None else None


def _identity(job: object, i: int) -> tuple[int, int, int]:
    """Item ``i``'s :func:`image_identity` by ``job.identity`` (a job without one: :data:`NO_FILE`)."""
    identity = getattr(job, "identity", None)
    return identity(i) if identity is not None else NO_FILE


@contextlib.contextmanager
def _held() -> Iterator[None]:
    """The store's lock, already held by the caller."""
    yield


def _changed_images(
    job: ExtractionJob,
    names: Sequence[str],
    store: FeatureStore,
    *,
    verify_images: bool = False,
) -> list[str]:
    """The stored images whose file changed since they were described (one ``stat`` each;
    ``verify_images``: and their bytes), said in one warning; they are described again."""
    identities = {names[i]: _identity(job, i) for i in range(len(names)) if names[i] in store}
    changed = store.changed(identities)
    if not getattr(job, "allow_partial", False):  # skipped by a partial run: read them now
        seen = set(changed)
        changed += [n for n in store.skipped(identities) if n not in seen]
    if verify_images:
        seen = set(changed)
        paths = {names[i]: _path(job, i) for i in range(len(names)) if names[i] in identities}
        changed += [n for n in store.changed_bytes(paths) if n not in seen]
    if changed:
        log.warning(
            "%d of %d images in %s changed since they were described (size, modification time or "
            "file; or described by an older oxbench that recorded none), e.g. %r; describing "
            "them again",
            len(changed),
            len(identities),
            store.directory,
            changed[0],
        )
    return changed


def _clear_folders(store: FeatureStore, folders: set[str]) -> None:
    """Delete committed shards named like a shard about to be written (the same images described
    before, now changed): the new commit must not lose to the stale one."""
    stale = [sid for sid in store._found if sid in folders]
    if stale:
        store._remove_shards(stale)
        store.refresh()


def _check_receipts(
    store: FeatureStore,
    tasks: Sequence[ShardTask],
    receipts: Sequence[ShardReceipt],
    names: Sequence[str],
) -> None:
    """Every task's images are in the store, under the folder its receipt names, with its digest."""
    digests = store.shard_digests()
    for task, receipt in zip(tasks, receipts, strict=True):
        missing = [names[i] for i in task.items if names[i] not in store]
        if missing or receipt.folder != task.folder or receipt.folder not in digests:
            raise InputError(
                f"{task}: {len(missing) or len(task.items)} image(s) missing from the store after "
                f"the shard was committed, e.g. {(missing or [names[task.items[0]]])[0]!r}",
                store.directory,
            )
        if digests[receipt.folder] != receipt.digest:
            log.warning(
                "%s: the committed copy differs from a later attempt's (is the extractor deterministic?)",
                task,
            )
