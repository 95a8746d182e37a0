"""oxbench outside a checkout: the sdist and the wheel build, and the wheel installed into a fresh
virtual environment runs (``oxbench --version`` and a small run), without a network.

The sdist is made by setuptools' PEP 517 backend (what ``python -m build --sdist`` calls) from a copy
of the source tree, and the wheel from the unpacked sdist (as ``python -m build`` does, so a file
missing from the sdist fails here). The fresh environment gets its dependencies (numpy, scipy ...)
from this one's site-packages through a ``.pth`` line, never from an index, and the wheel is
installed with ``--no-deps --no-index``.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "*.so", ".*_cache", ".hypothesis"
)


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, (
        f"{cmd}: {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout


def _clean_env() -> dict[str, str]:
    """This environment without anything that would put the checkout's sources on the path."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV") and not k.startswith("OXBENCH_")
    }


def test_the_dev_extra_pins_the_linters_ci_runs() -> None:
    """`pip install -e ".[dev]"` gives the ruff and mypy that .ci/run lints with."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    ci = (REPO / ".ci" / "run").read_text()
    pinned = set(re.findall(r'"((?:ruff|mypy)==[0-9.]+)"', ci))
    assert pinned == {"ruff==0.17.6", "mypy==2.4.1"}
    assert set(extras["dev"]) == pinned


def test_a_missing_extra_names_both_install_forms() -> None:
    from oxbench.errors import MissingExtraError

    text = str(MissingExtraError("matplotlib", "plots"))
    assert 'pip install "oxbench[plots]"' in text and 'pip install -e ".[plots]"' in text


@pytest.mark.slow
def test_the_wheel_builds_and_installs_into_a_fresh_environment(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")  # in the test extra: the backend builds offline
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=_NOT_SOURCE)
    env = _clean_env()
    # 1. the sdist, by the backend python -m build calls
    sdist_name = _run(
        [
            sys.executable,
            "-c",
            "from setuptools import build_meta as b; print(b.build_sdist('dist'))",
        ],
        src,
        env,
    ).split()[-1]
    sdist = src / "dist" / sdist_name
    assert sdist_name == "oxbench-0.1.0.tar.gz"
    with tarfile.open(sdist) as tar:
        members = set(tar.getnames())
        tar.extractall(tmp_path / "unpacked", filter="data")
    for needed in (
        "setup.py",
        "pyproject.toml",
        "README.md",
        "src/oxbench/evaluation/_accel.c",
        "src/oxbench/py.typed",
    ):
        assert f"oxbench-0.1.0/{needed}" in members, needed
    # 2. the wheel, from the unpacked sdist
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(wheels),
            str(tmp_path / "unpacked" / "oxbench-0.1.0"),
        ],
        tmp_path,
        env,
    )
    (whl,) = wheels.glob("oxbench-0.1.0-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        entry = z.read("oxbench-0.1.0.dist-info/entry_points.txt").decode()
    assert {"oxbench/__init__.py", "oxbench/py.typed", "oxbench/cli/__init__.py"} <= names
    assert "oxbench = oxbench.cli:main" in entry
    accel = [n for n in names if re.fullmatch(r"oxbench/evaluation/_accel\..*\.so", n)]
    if shutil.which("cc") or shutil.which("gcc"):
        assert accel and "py3-none-any" not in whl.name  # the C kernel, a platform wheel
    # 3. a fresh environment: its dependencies from this one's site-packages, oxbench from the wheel
    fresh = tmp_path / "fresh"
    _run([sys.executable, "-m", "venv", str(fresh)], tmp_path, env)
    py = fresh / "bin" / "python"
    site = _run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path, env
    )
    here = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.strip()) / "_oxbench_test_deps.pth").write_text("\n".join(sorted(here)) + "\n")
    _run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(whl)], tmp_path, env
    )
    where = _run([str(py), "-c", "import oxbench; print(oxbench.__file__)"], tmp_path, env)
    assert Path(where.strip()).is_relative_to(fresh), where  # the wheel's copy, not the checkout
    version = _run([str(fresh / "bin" / "oxbench"), "--version"], tmp_path, env)
    assert version.strip() == "oxbench, version 0.1.0"
    # 4. a small run from the installed package: the features preset on a ground-truth-only root
    root = tmp_path / "data" / "roxford5k"
    root.mkdir(parents=True)
    gnd = [
        {"bbx": [0.0, 0.0, 9.0, 9.0], "easy": [3 * q], "hard": [3 * q + 1], "junk": []}
        for q in range(3)
    ]
    (root / "gnd_roxford5k.pkl").write_bytes(
        pickle.dumps(
            {"imlist": [f"d{i}" for i in range(12)], "qimlist": ["q0", "q1", "q2"], "gnd": gnd}
        )
    )
    rng = np.random.default_rng(0)
    db = rng.normal(size=(12, 8)).astype(np.float32)
    db[[1, 4, 7]] = db[[0, 3, 6]] + 0.01 * rng.normal(size=(3, 8)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", db[[0, 3, 6]])  # each query: its Easy image, its Hard one next
    out = _run(
        [
            str(fresh / "bin" / "oxbench"),
            "run",
            "--dataset",
            "roxford5k",
            "--method",
            "features",
            "--root",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / "runs"),
            "--allow-partial",
            "--no-progress",
            "--set",
            f"descriptor.db_features={tmp_path / 'db.npy'}",
            "--set",
            f"descriptor.query_features={tmp_path / 'q.npy'}",
        ],
        tmp_path,
        env,
    )
    assert out.splitlines()[0] == "roxford5k: mAP E: 100.00, M: 100.00, H: 100.00", out
