"""Local features from files: ``h5:PATH`` (hloc's ``features.h5``) and ``npz:FOLDER``.

The user's own keypoints and descriptors (DELF, HOW, SuperPoint, R2D2, ...), one entry per image
name, read instead of described (:mod:`oxbench.formats.local_features` holds the layouts and every
check). A method whose ``features`` are such files reads no pixel: its runs need the ground truth
and the files, not the images (``MethodConfig.reads_images`` is false).

A query is described from its crop only (docs/protocols.md): here, the query image's entry is
restricted to the keypoints inside the query box (the same box the built-in extractors crop).

The vocabulary (and HE's medians) learn on the TRAINING set's features, so the training images
need an entry too: ``train`` names a second file or folder holding them. Without one, the method
learns on the test set's own features, says so in a warning and records
``trained_on_test_set: true`` (results not comparable).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.features.extractors import ExtractorEntry, register_local_extractor
from oxbench.features.local import RawFeatures
from oxbench.fileio import json_digest
from oxbench.formats.local_features import (
    FILE_LAYOUTS,
    ORIENTATIONS,
    FileFacts,
    probe,
    read_image_features,
)
from oxbench.schema import setting, validate

#: The ``kind`` :meth:`LocalFeatureFiles.to_dict` records.
FILES_KIND = "local-feature-files"


@dataclass(frozen=True)
class LocalFeatureFiles:
    """Local features read from the user's files (a :class:`~oxbench.features.local.LocalExtractor`
    that reads names, not pixels).

    Attributes:
        layout: ``h5`` (hloc's ``features.h5``) or ``npz`` (a folder of ``<image name>.npz``).
        path: the test set's file or folder (made absolute, so workers elsewhere find it).
        train: the training set's file or folder, same layout; ``None``: the method learns on
            the test set's features (warned, recorded as ``trained_on_test_set``).
    """

    layout: Literal["h5", "npz"] = setting(
        spec=S.Choice(*FILE_LAYOUTS), doc="h5: hloc's features.h5; npz: a folder of <name>.npz"
    )
    path: str = setting(spec=S.PathSetting(), doc="the test set's features file", input=True)
    train: str | None = setting(
        None,
        S.Optional(S.PathSetting()),
        doc="the training set's features (none: learn on the test set's, flagged)",
        input=True,
    )
    orientation: Literal["auto", "d-n", "n-d"] = setting(
        "auto",
        S.Choice(*ORIENTATIONS),
        doc="descriptor blocks: auto (h5 [d, n], npz [n, d]; a square block refused as "
        "ambiguous), d-n or n-d",
        input=True,
    )

    #: No step reads the benchmark's pixels.
    reads_images = False

    def __post_init__(self) -> None:
        validate(self)
        object.__setattr__(self, "path", os.path.abspath(self.path))
        if self.train is not None:
            object.__setattr__(self, "train", os.path.abspath(self.train))

    def __str__(self) -> str:
        return f"{self.layout}:{self.path}"

    # --- facts of the files (metadata and the first image, read once) ---------------------------
    def facts(self) -> FileFacts:
        """Dimension and type of the descriptors, from the file's first image."""
        cached = self.__dict__.get("_facts")
        if cached is None:
            cached = probe(self.layout, self.path, self.orientation)
            object.__setattr__(self, "_facts", cached)
        return cached

    @property
    def dim(self) -> int:
        """The descriptor dimension (the file's first image)."""
        return self.facts().dim

    @property
    def stored_dtype(self) -> Any:
        """Stored in the file's own type (``uint8``, ``float16``, ``float32``)."""
        return self.facts().dtype.type

    def fingerprint(self) -> dict[str, object]:
        """SHA-256 of the file's bytes (of every ``.npz`` of the folder) with its size: a changed,
        swapped or rewritten file keys new caches instead of meeting features cached from the old
        one (:func:`_fingerprint`)."""
        cached = self.__dict__.get("_fingerprint")
        if cached is None:
            cached = _fingerprint(Path(self.path))
            if self.train is not None:
                train = _fingerprint(Path(self.train))
                cached = {**cached, **{f"train_{k}": v for k, v in train.items()}}
            object.__setattr__(self, "_fingerprint", cached)
        return cached

    # --- the LocalExtractor protocol ------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        """Every setting, the files' fingerprint, and the descriptors' dimension and type."""
        return {
            "kind": FILES_KIND,
            **asdict(self),
            "files": self.fingerprint(),
            "dim": self.dim,
            "dtype": str(np.dtype(self.stored_dtype)),
        }

    def digest(self) -> str:
        """A short stable hash of :meth:`to_dict` (names feature-store folders)."""
        return json_digest(self.to_dict(), 12)

    def extract(self, image: NDArray[np.uint8]) -> tuple[NDArray[np.float32], NDArray[Any]]:
        """Not available: these features are read by image name (:meth:`read`)."""
        raise InputError(
            f"local features from {self.path} are read by image name, not described from pixels"
        )

    def finish(self, stored: NDArray[Any]) -> NDArray[np.float32]:
        """The descriptors as the file gives them, as ``float32`` (no normalisation is added)."""
        return np.asarray(stored, dtype=np.float32)

    def read(self, name: str) -> RawFeatures:
        """The checked features of image ``name`` (:func:`~oxbench.formats.local_features.read_image_features`)."""
        return read_image_features(self.layout, self.path, name, self.facts(), self.orientation)

    # --- the training set -----------------------------------------------------------------------
    def has_training_features(self) -> bool:
        """Whether the training images have their own file (else the test set's is used)."""
        return self.train is not None

    def for_training(self) -> LocalFeatureFiles:
        """The extractor of the training images: the ``train`` file (this one without it).

        Raises:
            InputError: the training descriptors have another dimension or type.
        """
        if self.train is None:
            return self
        other = replace(self, path=self.train, train=None)
        mine, theirs = self.facts(), other.facts()
        if (mine.dim, mine.dtype) != (theirs.dim, theirs.dtype):
            raise InputError(
                f"training features are {theirs.dtype} of dimension {theirs.dim}, the test set's "
                f"({self.path}) {mine.dtype} of dimension {mine.dim}",
                self.train,
            )
        return other


def _fingerprint(path: Path) -> dict[str, object]:
    """The content of the features: SHA-256 of the file (of every ``<name>.npz`` of the folder, per
    file), with size and count. File identity (inode, size, ``mtime_ns``, ``ctime_ns``) only spares a
    rehash in this process; two files swapped by ``mv``, or one edited in place with its ``mtime``
    restored, get their new digest and key new caches."""
    from oxbench.provenance import input_record

    if path.is_dir():
        members = sorted(
            os.path.join(root, f)
            for root, _, files in os.walk(path)
            for f in files
            if f.endswith(".npz")
        )
        record = input_record(path, files=members)
        return {"sha256": record.sha256, "bytes": record.size, "files": record.files}
    record = input_record(path)
    if record.kind != "file":
        raise InputError("not a regular file (FIFO, device or socket); give a file", path)
    return {"sha256": record.sha256, "bytes": record.size}


class ReadFeatures:
    """Picklable extraction job: the features of image ``i`` read from the files; a query's
    restricted to its box (as the built-in extractors describe the crop only)."""

    def __init__(
        self,
        extractor: LocalFeatureFiles,
        names: Sequence[str],
        boxes: Sequence[tuple[float, float, float, float] | None] | None = None,
        crop: str = "python",
    ) -> None:
        self.extractor = extractor
        self.names = list(names)
        self.boxes = None if boxes is None else list(boxes)
        self.crop = crop

    def name(self, i: int) -> str:
        return self.names[i]

    def __call__(self, i: int) -> RawFeatures:
        feats = self.extractor.read(self.names[i])
        box = None if self.boxes is None else self.boxes[i]
        if box is None:
            return feats
        from oxbench.datasets.base import crop_box

        w, h = feats.image_size
        left, top, right, bottom = crop_box(box, w, h, self.crop)  # type: ignore[arg-type]
        x, y = feats.keypoints[:, 0], feats.keypoints[:, 1]
        # pixel i covers [i - 0.5, i + 0.5]: the crop's pixels left .. right - 1
        inside = (x >= left - 0.5) & (x <= right - 0.5) & (y >= top - 0.5) & (y <= bottom - 0.5)
        keep = np.flatnonzero(inside)
        return RawFeatures(
            feats.name,
            np.ascontiguousarray(feats.keypoints[keep]),
            np.ascontiguousarray(feats.descriptors[keep]),
            feats.image_size,
        )


def _from_dict(settings: Mapping[str, Any]) -> LocalFeatureFiles:
    """A record's :meth:`LocalFeatureFiles.to_dict` back to the extractor (derived facts dropped)."""
    return LocalFeatureFiles(
        **{k: v for k, v in settings.items() if k not in ("kind", "files", "dim", "dtype")}
    )


def _h5(argument: str) -> LocalFeatureFiles:
    return LocalFeatureFiles(layout="h5", path=argument)


def _npz(argument: str) -> LocalFeatureFiles:
    return LocalFeatureFiles(layout="npz", path=argument)


register_local_extractor(
    ExtractorEntry(
        "h5",
        "keypoints and descriptors from hloc's features.h5 (one group per image)",
        FILES_KIND,
        _h5,
        _from_dict,
        argument="PATH",
    )
)
register_local_extractor(
    ExtractorEntry(
        "npz",
        "keypoints and descriptors from a folder of <image name>.npz",
        FILES_KIND,
        _npz,
        _from_dict,
        argument="FOLDER",
    )
)
