"""Datasets: the registry of benchmarks, verified fetching, import, integrity checks and loading.

``load("roxford5k", root=...)`` returns a :class:`~oxbench.datasets.base.Benchmark`.
"""

from oxbench.datasets.base import Benchmark, FileImages, ImageSource, crop_box, read_image

__all__ = ["Benchmark", "FileImages", "ImageSource", "crop_box", "read_image"]
