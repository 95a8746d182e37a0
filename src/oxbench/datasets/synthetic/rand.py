"""Seeded randomness: every random choice derives from (city seed, purpose, index).

Images can therefore be generated one by one, in parallel and in any order, and the same config
always gives the same bytes.
"""

from __future__ import annotations

import numpy as np

from oxbench.datasets.synthetic.config import stable_int


def rng_for(*keys: int | str) -> np.random.Generator:
    """A PCG64 generator seeded from a tuple of ints and strings (strings hashed stably)."""
    entropy = [k if isinstance(k, int) else stable_int(k) for k in keys]
    if any(k < 0 for k in entropy):
        raise ValueError("seed keys must be non-negative")
    return np.random.default_rng(np.random.SeedSequence(entropy))
