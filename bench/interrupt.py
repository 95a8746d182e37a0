"""The ``__main__`` of every bench script: run its ``main`` and end on Ctrl-C (or SIGTERM) with one line.

A bench script runs for minutes; interrupting it is normal use, not a crash, so it prints
``<script>: interrupted by SIGINT`` and exits 130 (as ``oxbench`` does) instead of a traceback.
Worker pools stop their workers on the way out (:func:`oxbench.cli.stop_on_signals`)::

    if __name__ == "__main__":
        from interrupt import run_script

        run_script(main)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn


def run_script(main: Callable[[], object]) -> NoReturn:
    """Call ``main()``; exit with its return value when it is an int (else 0), 130 when interrupted."""
    from oxbench.cli import Interrupted, stop_on_signals

    script = Path(sys.argv[0]).name or "bench"
    try:
        with stop_on_signals():
            rv = main()
    except Interrupted as exc:
        print(f"{script}: interrupted by {exc.args[0]}", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print(f"{script}: interrupted by SIGINT", file=sys.stderr)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)
