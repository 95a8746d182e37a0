"""The bench scripts end on Ctrl-C with one line and exit 130, through one shared ``__main__``
(``bench/interrupt.py``), not with a traceback (issue 24)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"


def _main_guard(path: Path) -> ast.If | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            return node
    return None


def test_every_bench_script_runs_its_main_through_run_script() -> None:
    scripts = [p for p in sorted(BENCH.glob("*.py")) if _main_guard(p) is not None]
    assert len(scripts) >= 8, scripts
    for path in scripts:
        guard = _main_guard(path)
        assert guard is not None
        assert "run_script(main)" in ast.unparse(guard), (
            f"{path.name}: end with run_script(main) (bench/interrupt.py)"
        )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_script_prints_one_line_and_exits_130(signum: int, tmp_path: Path) -> None:
    script = tmp_path / "slow_bench.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(BENCH)!r})\n"
        "from interrupt import run_script\n"
        "def main():\n"
        "    print('started', flush=True)\n"
        "    time.sleep(60)\n"
        "run_script(main)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.2)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.strip().splitlines() == [
        f"slow_bench.py: interrupted by {signal.Signals(signum).name}"
    ], err


def test_the_return_value_of_main_is_the_exit_code(tmp_path: Path) -> None:
    for body, code in (("return 3", 3), ("return {'x': 1.0}", 0), ("return None", 0)):
        script = tmp_path / "ret.py"
        script.write_text(
            f"import sys\nsys.path.insert(0, {str(BENCH)!r})\nfrom interrupt import run_script\n"
            f"def main():\n    {body}\nrun_script(main)\n"
        )
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        assert (
            subprocess.run([sys.executable, str(script)], env=env, check=False).returncode == code
        )


def test_gpu_foundation_script_runs_tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prepared GPU script (issue 40 item 5) runs on the CPU in its tiny mode and writes its JSON."""
    import json

    pytest.importorskip("timm")
    monkeypatch.syspath_prepend(str(BENCH))
    import gpu_foundation

    result = gpu_foundation.main(["--tiny", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "gpu_foundation.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert set(saved["images_per_second"]) == {"oxbench", "plain-torch"}
    assert all(v > 0 for v in saved["images_per_second"].values())
    ips = saved["images_per_second"]
    assert saved["ratio_oxbench_over_plain"] == pytest.approx(ips["oxbench"] / ips["plain-torch"])
