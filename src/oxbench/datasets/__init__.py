"""Datasets: the registry of benchmarks, verified fetching, import, integrity checks and loading.

``load("roxford5k", root=...)`` returns a :class:`~oxbench.datasets.base.Benchmark`;
``fetch_dataset`` / ``import_dataset`` put a dataset on disk; ``verify`` checks it. The entries
are declared in :mod:`oxbench.datasets.catalog` (ids: ``DATASETS.names()``).
"""

from oxbench.datasets.base import Benchmark, FileImages, ImageSource, crop_box, read_image
from oxbench.datasets.loaders import distractor_count, load, load_ground_truth
from oxbench.datasets.prepare import PrepareReport, fetch_dataset, import_dataset
from oxbench.datasets.spec import DATASETS, DatasetSpec, RemoteFile, get_spec
from oxbench.datasets.verify import VerifyReport, verify

__all__ = [
    "DATASETS",
    "Benchmark",
    "DatasetSpec",
    "FileImages",
    "ImageSource",
    "PrepareReport",
    "RemoteFile",
    "VerifyReport",
    "crop_box",
    "distractor_count",
    "fetch_dataset",
    "get_spec",
    "import_dataset",
    "load",
    "load_ground_truth",
    "read_image",
    "verify",
]
