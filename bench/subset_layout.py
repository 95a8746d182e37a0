"""The real subset as data roots for ``oxbench run``: the all-280 setting with run records.

    python bench/subset_layout.py OUT [--data $OXBENCH_SHARED_DATA]
    oxbench run --dataset roxford5k --root OUT/roxford5k --allow-partial --method rootsift-asmk \
        --seeds 0,1,2,3,4 --workers 1

``OUT/<city>/`` is a data root (:func:`pixel_subset.write_layout`): ``<city>`` is the 280 subset
images with the city's 8 crops as queries (full revisited labels restricted to the 280, Medium and
Hard, as ``real_subset.py``'s all-280 column), and the other city's subset images, on which the
vocabulary or codebook is trained (``--train-dataset`` defaults to the other city). Images are
symbolic links into the data folder; nothing is copied. Skips (exit 0) when the subset is absent.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

_SHARED = os.environ.get("OXBENCH_SHARED_DATA")


def main() -> int:
    from pixel_subset import subset_folder, write_layout  # bench/, beside this script

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="where the data roots go (one folder per city)")
    ap.add_argument("--data", type=Path, default=Path(_SHARED) if _SHARED else None)
    args = ap.parse_args()
    subset = subset_folder(args.data)
    if subset is None:
        return 0
    for city, root in write_layout(subset, args.data, args.out).items():
        print(f"{city}: --root {root}")
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
