"""The field's milestones: ``oxbench milestones`` (seed groups beside the published figures).

The table of bench/README.md ("The field's milestones") is this command's output: each milestone
preset run with ``--seeds N`` seeds (mean and spread), the published Oxford 5K figure with the
line of the project's facts it comes from, and whether each published trend holds against the
seed and query spread. The rows and the figures live in :mod:`oxbench.milestones`. The real-photo
rows come from ``real_subset.py --methods`` with the same presets, or from
``oxbench milestones --dataset roxford5k --root SUBSET --allow-partial``.

Usage::

    python bench/milestones.py [--root DATA] [--workers 2] [--seeds 3] [--methods rootsift-bow,...]
    # the same as: oxbench milestones [...]
"""

from __future__ import annotations

import sys


def main() -> int:
    from oxbench.cli import main as oxbench_main

    try:
        oxbench_main(["milestones", *sys.argv[1:]])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
