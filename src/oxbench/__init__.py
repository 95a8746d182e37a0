"""oxbench: instance-level image retrieval benchmarks, evaluated the way the papers do it.

The package is split by concern:

- :mod:`oxbench.evaluation` -- AP, mP@K and the four official protocols (pure functions over arrays);
- :mod:`oxbench.formats` -- readers/writers of the official ground-truth and result files;
- :mod:`oxbench.datasets` -- the dataset registry, verified fetching, loading and integrity checks;
- :mod:`oxbench.features`, :mod:`oxbench.index`, :mod:`oxbench.rerank`, :mod:`oxbench.pipelines`
  -- reference retrieval pipelines;
- :mod:`oxbench.report` -- tables and exports of results;
- :mod:`oxbench.cli` -- the ``oxbench`` command, a thin layer over the library.

Importing :mod:`oxbench` does no I/O and needs only numpy/scipy.
"""

from oxbench.errors import OxbenchError
from oxbench.groundtruth import GroundTruth, Query

__version__ = "0.1.0"

__all__ = ["GroundTruth", "OxbenchError", "Query", "__version__"]
