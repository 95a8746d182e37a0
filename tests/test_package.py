"""The package imports light and the CLI answers."""

from __future__ import annotations

import subprocess
import sys


def test_import_needs_only_core():
    code = (
        "import sys, oxbench, oxbench.cli\n"
        "heavy = [m for m in ('cv2', 'faiss', 'torch', 'PIL', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_help_and_unknown_command():
    ok = subprocess.run([sys.executable, "-m", "oxbench", "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "evaluate" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "oxbench", "no-such-command"], capture_output=True, text=True
    )
    assert bad.returncode == 2
