"""The synthetic landmark benchmark: rendered buildings with Easy / Hard / Unclear labels by
construction, in the revisited Oxford layout -- oxbench's embedded default dataset.

- :func:`generate` writes a set from a :class:`SynthConfig` (``oxbench data synth``);
- :func:`load_synthetic` loads it as a :class:`~oxbench.datasets.base.Benchmark`;
- :func:`ensure_default` makes ``<root>/synthetic`` and ``<root>/synthetic-train`` on first use;
- :class:`SyntheticDistractors` streams any number of distractors by index.

See ``docs/synthetic.md``.
"""

from oxbench.datasets.synthetic.config import (
    DEFAULT_TEST,
    DEFAULT_TRAIN,
    LANDMARK_NAMES,
    LabelThresholds,
    SynthConfig,
)
from oxbench.datasets.synthetic.generate import generate, label_counts, read_manifest
from oxbench.datasets.synthetic.loader import ensure_default, load_synthetic
from oxbench.datasets.synthetic.stream import SyntheticDistractors

__all__ = [
    "DEFAULT_TEST",
    "DEFAULT_TRAIN",
    "LANDMARK_NAMES",
    "LabelThresholds",
    "SynthConfig",
    "SyntheticDistractors",
    "ensure_default",
    "generate",
    "label_counts",
    "load_synthetic",
    "read_manifest",
]
