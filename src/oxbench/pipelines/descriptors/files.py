"""The user's own descriptor files (``descriptor=files``): nothing is described, the rows are read.

The database and query descriptors come from the files (``db_features``, ``query_features``; how
rows are matched to images and every check: :mod:`oxbench.pipelines.featurefiles`), L2-normalised,
and go through the family's whitening, search and stages. Whitening learns on the user's training
descriptors (``train_features``, with ``train_pairs`` for learned whitening), never on the test
set's; the runner flags a training file that holds the test rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.pipelines.descriptors import (
    Describer,
    DescriptorKind,
    FamilySettings,
    register_descriptor,
)
from oxbench.pipelines.featurefiles import (
    benchmark_features,
    feature_provenance,
    fit_file_whitening,
    test_rows_in_training,
)
from oxbench.pipelines.method import RunContext
from oxbench.schema import setting

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.index.whitening import PCAWhitening


@dataclass(frozen=True)
class FeatureFilesDescriptor(DescriptorKind):
    """Descriptors read from the user's files.

    Attributes:
        db_features, query_features: the database / query descriptor files (rows in database /
            query order of the dataset unless named).
        train_features: the user's training descriptors, for ``whitening`` (never the test set's
            unless the user says so); train_pairs: ``[m, 2]`` matching pairs of its rows
            (``.npy``), for ``whitening="learned"``.
        layout: ``"n-d"`` (``[n, d]``, one row per image) or ``"d-n"`` (``[d, n]``, revisitop's
            MATLAB files) in the files, as ``oxbench evaluate --layout`` reads them.
        key: the array inside an ``.npz`` / ``.mat`` file.
        query_key, query_layout: the query file's own array name and layout (default: ``key``,
            ``layout``), so one revisitop ``.mat`` holding ``X`` and ``Q`` serves both files.
        db_names, query_names: names of the rows (a ``.txt``, or strings in ``.npz`` / ``.h5`` /
            ``.mat``); row_order: ``"dataset"`` (the ground truth's order) or ``"sorted"`` (sorted
            image names).
    """

    kind: ClassVar[str] = "files"

    db_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: database descriptor file", input=True
    )
    query_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: query descriptor file", input=True
    )
    train_features: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: training descriptors", input=True
    )
    train_pairs: str | None = setting(
        None, S.Optional(S.PathSetting()), doc="features: matching pairs (.npy)", input=True
    )
    layout: Literal["n-d", "d-n"] = setting(
        "n-d", S.Choice("n-d", "d-n"), doc="features: rows or columns per image", input=True
    )
    key: str | None = setting(
        None,
        S.Optional(S.Str(min_len=1, max_len=256)),
        doc="features: array in .npz/.mat",
        input=True,
    )
    query_key: str | None = setting(
        None,
        S.Optional(S.Str(min_len=1, max_len=256)),
        doc="features: query array in .npz/.mat (default: key; revisitop .mat: Q)",
        input=True,
    )
    query_layout: Literal["n-d", "d-n"] | None = setting(
        None,
        S.Optional(S.Choice("n-d", "d-n")),
        doc="features: query file's layout (default: layout)",
        input=True,
    )
    db_names: str | None = setting(
        None,
        S.Optional(S.PathSetting()),
        doc="features: names of db_features' rows (.txt, or strings in .npz/.h5/.mat)",
        input=True,
    )
    query_names: str | None = setting(
        None,
        S.Optional(S.PathSetting()),
        doc="features: names of query_features' rows (as db_names)",
        input=True,
    )
    row_order: Literal["dataset", "sorted"] = setting(
        "dataset",
        S.Choice("dataset", "sorted"),
        doc="features: rows in the ground truth's order, or in sorted image-name order",
        input=True,
    )
    max_bytes: int | None = setting(
        None,
        S.Optional(S.Int(lo=1 << 20)),
        doc="features: most bytes one descriptor file's array may need, checked on its declared "
        "shape before reading (default: a quarter of the machine's memory)",
        input=True,
    )

    @property
    def whitens_on_training_set(self) -> bool:
        """The whitening learns on ``train_features``, not on a training benchmark."""
        return False

    @property
    def reads_images(self) -> bool:
        return False

    def cache_key(self) -> dict[str, Any]:
        """Nothing is cached: the files are read in every run (their digests are the run's
        inputs)."""
        return {"descriptor": "features"}

    def test_data_in_training(self, bench: Benchmark, m: FamilySettings) -> str | None:
        """``train_features`` holding the test descriptors
        (:func:`~oxbench.pipelines.featurefiles.test_rows_in_training`)."""
        return test_rows_in_training(self, m, bench)

    def build(self, m: FamilySettings) -> FeatureFilesDescriber:
        return FeatureFilesDescriber(self, m)


register_descriptor(FeatureFilesDescriptor)


class FeatureFilesDescriber(Describer):
    """Reads the user's descriptors; learns the whitening from their training file."""

    kind: FeatureFilesDescriptor

    def fit_whitening(self) -> PCAWhitening | None:
        return fit_file_whitening(self.kind, self.m)

    def describe(self, bench: Benchmark, part: str, ctx: RunContext) -> NDArray[np.float32]:
        return benchmark_features(self.kind, bench, part)

    def stores_on_disk(
        self, bench: Benchmark, parts: list[str], ctx: RunContext
    ) -> dict[str, list[Path]]:
        db = self.kind.db_features
        return {"descriptor_files": [Path(db)] if db else []}

    def provenance(self) -> dict[str, Any]:
        return {"feature_files": feature_provenance(self.kind)}
