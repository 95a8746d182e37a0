"""Datasets: the registry of benchmarks, verified fetching, import, integrity checks and loading.

``load("roxford5k", root=...)`` returns a :class:`~oxbench.datasets.base.Benchmark`;
``fetch_dataset`` / ``import_dataset`` put a dataset on disk; ``dataset_status`` says what is
there; ``verify`` checks it. The entries are declared with their families, one module each in
:mod:`oxbench.datasets.families`; the catalog (:mod:`oxbench.datasets.catalog`, ids:
``DATASETS.names()``) holds them by id, plugins' entries (entry-point group ``oxbench.datasets``)
included.
"""

from oxbench.datasets.base import Benchmark, FileImages, ImageSource, crop_box, read_image
from oxbench.datasets.catalog import DATASETS, get_spec
from oxbench.datasets.disk import DiskStatus, dataset_status
from oxbench.datasets.loaders import distractor_count, load, load_ground_truth
from oxbench.datasets.prepare import PrepareReport, fetch_dataset, import_dataset
from oxbench.datasets.spec import DatasetFamily, DatasetSpec, RemoteFile
from oxbench.datasets.verify import VerifyReport, verify

__all__ = [
    "DATASETS",
    "Benchmark",
    "DatasetFamily",
    "DatasetSpec",
    "DiskStatus",
    "FileImages",
    "ImageSource",
    "PrepareReport",
    "RemoteFile",
    "VerifyReport",
    "crop_box",
    "dataset_status",
    "distractor_count",
    "fetch_dataset",
    "get_spec",
    "import_dataset",
    "load",
    "load_ground_truth",
    "read_image",
    "verify",
]
