"""Plugins from outside the package, as an installed distribution declares them.

A plugin package is written here into a temporary folder (its own ``pyproject.toml`` with entry
points, built by setuptools) and installed with pip into a target folder, never into the test venv;
the command line then runs in a subprocess with that folder on ``PYTHONPATH``. The package adds a
family with two presets, a re-ranker with a setting, a local extractor and an execution backend;
the command line lists, runs and configures them, and :mod:`oxbench.testing` checks them; a
global descriptor kind (a colour histogram) runs as its own preset and by --set descriptor=...

The bad plugins (one that fails to import, ones that take a name already taken) are distributions
written by hand (a ``.dist-info`` folder with ``METADATA`` and ``entry_points.txt``: what pip
writes), which keeps them quick.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import oxbench
from oxbench.errors import InputError
from oxbench.registry import PluginWarning, Registry
from test_architecture import TOY_EXTRACTOR

SRC = Path(oxbench.__file__).resolve().parents[1]
ROOT = SRC.parent

PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "oxplug"
version = "0.1"
requires-python = ">=3.11"

[project.entry-points."oxbench.families"]
thumbs = "oxplug.family"
colour = "oxplug.colour:PRESETS"

[project.entry-points."oxbench.rerankers"]
swap-top = "oxplug.rerank:SwapTop"

[project.entry-points."oxbench.local_features"]
grid-patches = "oxplug.local:GridPatches"

[project.entry-points."oxbench.executors"]
threads = "oxplug.threads:ThreadExecutor"

[project.entry-points."oxbench.descriptors"]
colour-histogram = "oxplug.colour:ColourHistogram"
"""

DESCRIPTOR = '''
"""A global descriptor kind (a plugin): the image's colour histogram, bins per channel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from oxbench import schema as S
from oxbench.pipelines import GlobalConfig
from oxbench.pipelines.descriptors import DescriptorKind, PartImages, StoredDescriber
from oxbench.schema import setting


@dataclass(frozen=True)
class ColourHistogram(DescriptorKind):
    """The joint RGB histogram of an image, square-rooted (a Hellinger kernel by dot product)."""

    kind: ClassVar[str] = "colour-histogram"

    bins: int = setting(4, S.Int(lo=2, hi=16), doc="colour-histogram: bins per channel")

    @property
    def dim(self) -> int:
        return self.bins**3

    def cache_key(self) -> dict[str, Any]:
        return {"descriptor": self.kind, "bins": self.bins}

    def build(self, m: Any) -> Histograms:
        return Histograms(self, m)


#: A global preset over the plugin's kind (the kind itself is the oxbench.descriptors entry point).
PRESETS = [GlobalConfig("oxplug-colour", descriptor=ColourHistogram(), rerank=("alpha-qe",))]


class Histograms(StoredDescriber):
    shard_size: ClassVar[int] = 16

    def store_key(self, ctx: Any, part: str) -> dict[str, Any]:
        return self.kind.cache_key()

    def compute(self, bench: Any, part: str, names: list[str], ctx: Any) -> Shard:
        return Shard(PartImages(bench, part), self.kind.bins)


class Shard:
    def __init__(self, read: PartImages, bins: int) -> None:
        self.read, self.bins = read, bins

    def __call__(self, positions: list[int]) -> tuple[list[int], np.ndarray]:
        rows = []
        for i in positions:
            image = self.read(i).reshape(-1, 3).astype(np.int64) * self.bins // 256
            cell = (image[:, 0] * self.bins + image[:, 1]) * self.bins + image[:, 2]
            counts = np.bincount(cell, minlength=self.bins**3).astype(np.float64)
            rows.append(np.sqrt(counts / max(counts.sum(), 1.0)).astype(np.float32))
        return positions, np.stack(rows) if rows else np.zeros((0, self.bins**3), np.float32)
'''

FAMILY = '''
"""Thumbnail retrieval (a plugin): every image as a tiny grey thumbnail, compared by cosine."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from oxbench import schema as S
from oxbench.fileio import atomic_write_npy, json_digest
from oxbench.pipelines import MethodConfig, Ranking, RetrievalMethod, register_method
from oxbench.pipelines.rerankers import Pipeline


@dataclass(frozen=True)
class ThumbsConfig(MethodConfig, Pipeline):
    family: ClassVar[str] = "thumbs"
    name: str
    side: int = S.setting(8, S.Int(lo=2, hi=64), doc="thumbnail side in pixels")

    def __post_init__(self) -> None:
        S.validate(self)

    @property
    def needs_training(self) -> bool:
        return False

    def build(self) -> Thumbs:
        return Thumbs(self)


class Describe:
    """The job of the describe stage: one thumbnail per image index (picklable)."""

    def __init__(self, bench: Any, part: str, side: int) -> None:
        self.bench, self.part, self.side = bench, part, side

    def __call__(self, i: int) -> np.ndarray:
        if self.part == "queries":
            image = self.bench.query_crop(i)
        else:
            image = self.bench.database.read(i)
        grey = image.astype(np.float32).mean(axis=2)
        rows = np.linspace(0, grey.shape[0] - 1, self.side).astype(int)
        cols = np.linspace(0, grey.shape[1] - 1, self.side).astype(int)
        v = grey[np.ix_(rows, cols)].ravel()
        v -= v.mean()
        return (v / max(float(np.linalg.norm(v)), 1e-6)).astype(np.float32)


class Space:
    capabilities = frozenset({"vectors"})

    def __init__(self, database: np.ndarray) -> None:
        self.database = database

    def rank(self, queries: Any) -> tuple[np.ndarray, np.ndarray]:
        scores = np.atleast_2d(np.asarray(queries, np.float32)) @ self.database.T
        ranks = np.argsort(-scores, axis=1, kind="stable").astype(np.int64)
        return np.take_along_axis(scores, ranks, axis=1), ranks


class Thumbs(RetrievalMethod):
    def __init__(self, config: ThumbsConfig) -> None:
        self.config = config

    def fit(self, train: Any, ctx: Any) -> Thumbs:
        return self

    def _describe(self, bench: Any, part: str, ctx: Any) -> np.ndarray:
        """Thumbnails of one part, cached under a key of what determines them."""
        n = len(bench.database) if part == "database" else bench.gt.n_queries
        key = json_digest([bench.describe(), part, self.config.side], 12)
        path = ctx.cache / "thumbs" / f"{bench.id}-{part}-{key}.npy"
        if path.is_file():
            ctx.record_step(f"thumbs-{part}", hit=True)
            return np.load(path)
        job = Describe(bench, part, self.config.side)
        with ctx.timed(f"thumbs-{part}"):
            out = np.stack(list(ctx.executor.map(job, list(range(n)), desc=part)))
        atomic_write_npy(path, out)
        ctx.record_step(f"thumbs-{part}", hit=False)
        return out

    capabilities = Space.capabilities

    def index(self, bench: Any, ctx: Any) -> Thumbs:
        self.space = Space(self._describe(bench, "database", ctx))
        return self

    def first_ranking(self, bench: Any, ctx: Any) -> tuple[Space, Ranking]:
        queries = self._describe(bench, "queries", ctx)
        scores, ranks = self.space.rank(queries)
        return self.space, Ranking(ranks, scores, queries, info={"thumb_side": self.config.side})


register_method(
    ThumbsConfig("oxplug-thumbs", rerank=("swap-top",)), about="thumbnails, then swap-top (Nobody 2026)"
)
register_method(ThumbsConfig("oxplug-thumbs-16", side=16))
'''

RERANKER = '''
"""A re-ranker with settings of its own (a plugin): reverses the top ``swap-top.k`` of every list."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oxbench import schema as S
from oxbench.pipelines.rerankers import Ranking, Reranker


@dataclass(frozen=True)
class SwapSettings:
    k: int = S.setting(3, S.Int(lo=2, hi=100), doc="how many of the top it reverses")

    def __post_init__(self) -> None:
        S.validate(self)


class SwapTop(Reranker):
    needs = frozenset({"vectors"})
    settings_type = SwapSettings

    def __init__(self, settings: SwapSettings) -> None:
        self.k = settings.k

    def rerank(self, ranking: Ranking, space: Any, ctx: Any) -> Ranking:
        ranks, scores = ranking.ranks.copy(), ranking.scores.copy()
        k = self.k
        ranks[:, :k], scores[:, :k] = ranks[:, k - 1 :: -1], scores[:, k - 1 :: -1]
        return Ranking(ranks, scores, ranking.queries, info={**ranking.info, "swapped": k})


'''

EXECUTOR = '''
"""An execution backend (a plugin): the items of a stage on a pool of threads."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from oxbench import schema as S
from oxbench.execution import Executor


class ThreadExecutor(Executor):
    backend = "threads"
    options = {"name_prefix": S.Str(min_len=1, max_len=32)}

    def __init__(self, workers: int = 1, *, cores: int | None = None, name_prefix: str = "oxplug") -> None:
        super().__init__(workers, cores=cores)
        self.name_prefix = name_prefix

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "name_prefix": self.name_prefix}

    def map(
        self,
        job: Callable[[Any], Any],
        items: Sequence[Any],
        *,
        desc: str | None = None,
        unit: str = "item",
        progress: bool = False,
    ) -> Generator[Any, None, None]:
        pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name_prefix)
        futures = [pool.submit(job, item) for item in items]
        try:
            for future in futures:
                yield future.result()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
'''

#: After install: checks of oxbench.testing on what the plugin registered, run in a subprocess.
CHECKS = """
import sys
from oxbench.execution import EXECUTORS
from oxbench.features.extractors import LOCAL_EXTRACTORS, local_extractor
from oxbench.pipelines.descriptors import DESCRIPTORS
from oxbench.pipelines.presets import METHODS
from oxbench.pipelines.rerankers import RERANKERS
from oxbench.testing import (
    check_descriptor, check_executor, check_family, check_local_extractor, check_reranker
)

if __name__ == "__main__":
    root = sys.argv[1]
    check_family(METHODS.get("oxplug-thumbs"), root=root)
    check_reranker(RERANKERS.get("swap-top"))
    check_local_extractor(local_extractor("grid-patches"), root=root)
    check_descriptor(DESCRIPTORS.get("colour-histogram")(bins=3), root=root, whitening="pca")
    check_executor(EXECUTORS.get("threads"))
    for registry, name in [(METHODS, "oxplug-thumbs"), (RERANKERS, "swap-top"),
                           (LOCAL_EXTRACTORS, "grid-patches"), (DESCRIPTORS, "colour-histogram"),
                           (EXECUTORS, "threads")]:
        print(name, registry.origin(name))
"""


def _write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return folder


def _hand_installed(target: Path, name: str, entry_points: str, modules: dict[str, str]) -> Path:
    """A distribution ``name`` 0.1 as an installer leaves it in ``target``."""
    info = target / f"{name}-0.1.dist-info"
    _write(
        target,
        {
            f"{info.name}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
            f"{info.name}/entry_points.txt": entry_points,
            **modules,
        },
    )
    return target


def _oxbench(path: list[Path], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(SRC)])}
    env.pop("OXBENCH_CLUSTER", None)
    return subprocess.run(
        [sys.executable, "-m", "oxbench", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def install_into(package: Path, target: Path) -> Path:
    """``pip install`` of the package folder ``package`` into the folder ``target`` (never into
    the test venv; built with the setuptools there is, no index); returns ``target``."""
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--disable-pip-version-check", "--quiet", "--target", str(target)]
    done = subprocess.run(
        [*pip, str(package)], capture_output=True, text=True, timeout=300, cwd=package.parent
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return target


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The oxplug package, built and installed by pip into a target folder (returned)."""
    pytest.importorskip("setuptools")
    tmp = tmp_path_factory.mktemp("oxplug")
    package = _write(
        tmp / "oxplug",
        {
            "pyproject.toml": PYPROJECT,
            "src/oxplug/__init__.py": '"""Thumbnails, a swap re-ranker, grid patches, threads."""\n',
            "src/oxplug/family.py": FAMILY,
            "src/oxplug/rerank.py": RERANKER,
            "src/oxplug/local.py": TOY_EXTRACTOR,
            "src/oxplug/threads.py": EXECUTOR,
            "src/oxplug/colour.py": DESCRIPTOR,
        },
    )
    target = install_into(package, tmp / "site")
    assert (target / "oxplug-0.1.dist-info" / "entry_points.txt").is_file()
    return target


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cv2")
    pytest.importorskip("PIL.Image")
    from oxbench.testing import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


def test_the_plugin_presets_are_listed_with_their_origin(plugin: Path, tmp_path: Path) -> None:
    done = _oxbench([plugin], "methods", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [" ".join(ln.split()) for ln in done.stdout.splitlines()]
    # register_method(config, about=...) says what a preset is; without it, the family's line
    assert "oxplug-thumbs thumbnails, then swap-top (Nobody 2026) [from oxplug 0.1]" in lines
    assert any(
        ln.startswith("oxplug-thumbs-16 Thumbnail retrieval (a plugin)")
        and ln.endswith("[from oxplug 0.1]")
        for ln in lines
    )
    (bow,) = [ln for ln in lines if ln.split()[:1] == ["rootsift-bow"]]
    assert "[from" not in bow  # the built-ins carry no origin
    assert any(ln.startswith("thumbs: Thumbnail retrieval (a plugin)") for ln in lines)
    assert done.stderr == ""
    listing = json.loads(_oxbench([plugin], "methods", "--json", cwd=tmp_path).stdout)
    thumbs = next(f for f in listing if f["family"] == "thumbs")
    assert thumbs["origins"] == {"oxplug-thumbs": "oxplug 0.1", "oxplug-thumbs-16": "oxplug 0.1"}
    # its settings are described from their specs like any preset's
    settings = _oxbench([plugin], "methods", "oxplug-thumbs", cwd=tmp_path)
    row = next(line for line in settings.stdout.splitlines() if line.split()[:1] == ["swap-top.k"])
    assert row.split()[1:3] == ["int", "3"] and row.endswith("[in [2, 100]]"), row


def test_the_plugin_runs_from_the_command_line_and_set_reaches_its_settings(
    plugin: Path, data_root: Path, tmp_path: Path
) -> None:
    def run(*args: str) -> dict:
        common = ["run", "--dataset", "synthetic", "--root", str(data_root), "--json"]
        done = _oxbench([plugin], *common, *args, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain = run("--method", "oxplug-thumbs", "--set", "rerank=none", "--engine", "serial")
    swapped = run(
        "--method", "oxplug-thumbs", "--set", "swap-top.k=2", "--engine", "threads",
        "--engine-option", "name_prefix=oxtest", "--workers", "2",
    )  # fmt: skip
    before = np.load((tmp_path / plain["run_dir"]) / "ranks.npy").T
    after = np.load((tmp_path / swapped["run_dir"]) / "ranks.npy").T
    assert np.array_equal(after[:, :2], before[:, 1::-1]) and np.array_equal(
        after[:, 2:], before[:, 2:]
    )
    record = json.loads(((tmp_path / swapped["run_dir"]) / "record.json").read_text())
    assert record["family"] == "thumbs" and record["plugins"] == {"oxplug": "0.1"}
    config = json.loads((tmp_path / swapped["run_dir"] / "config.json").read_text())
    assert config["method"]["swap-top"] == {"k": 2} and config["method"]["family"] == "thumbs"
    assert record["execution"]["backend"] == "threads" and record["execution"]["workers"] == 2
    assert (
        json.loads(((tmp_path / swapped["run_dir"]) / "metrics.json").read_text())["run"]["swapped"]
        == 2
    )
    # the thumbnails came from the cache the first run filled, whatever backend ran them
    assert record["cache"] == {"thumbs-database": "hit", "thumbs-queries": "hit"}
    # a bad value of its setting, or of its backend's option: one line, exit 2
    common = [
        "run",
        "--dataset",
        "synthetic",
        "--root",
        str(data_root),
        "--method",
        "oxplug-thumbs",
    ]
    bad = _oxbench([plugin], *common, "--set", "swap-top.k=nan", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "swap-top.k" in bad.stderr
    bad = _oxbench(
        [plugin], *common, "--engine", "threads", "--engine-option", "colour=red", cwd=tmp_path
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "backend 'threads' has no option 'colour' (its options: name_prefix)" in bad.stderr


def test_the_plugin_descriptor_kind_runs_by_preset_and_by_set(
    plugin: Path, data_root: Path, tmp_path: Path
) -> None:
    """The plugin's kind is listed with its origin, runs as the plugin's preset and as
    ``--set descriptor=colour-histogram`` on a built-in preset, its setting reached by
    ``descriptor.bins``, recorded in the config and rebuilt from it."""
    listing = _oxbench([plugin], "methods", cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    kinds = next(ln for ln in listing.stdout.splitlines() if ln.startswith("global descriptor"))
    assert "colour-histogram [from oxplug 0.1]" in kinds and "cnn, files, vit, vlad" in kinds
    common = ["run", "--dataset", "synthetic", "--root", str(data_root), "--json"]
    common += ["--engine", "serial"]
    preset = _oxbench([plugin], *common, "--method", "oxplug-colour", cwd=tmp_path)
    assert preset.returncode == 0, preset.stderr
    by_set = _oxbench(
        [plugin], *common, "--method", "rootsift-vlad-w", "--set", "descriptor=colour-histogram",
        "--set", "descriptor.bins=3", cwd=tmp_path,
    )  # fmt: skip
    assert by_set.returncode == 0, by_set.stderr
    run_dir = tmp_path / json.loads(by_set.stdout)["run_dir"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["method"]["descriptor"] == {"kind": "colour-histogram", "bins": 3}
    record = json.loads((run_dir / "record.json").read_text())
    assert record["plugins"] == {"oxplug": "0.1"} and record["cache"]["descriptors.queries"]
    assert record["label"] == "rootsift-vlad-w [descriptor=colour-histogram]"
    ranks = np.load(run_dir / "ranks.npy")
    assert ranks.shape[1] == 4 and (np.sort(ranks, axis=0) == np.arange(40)[:, None]).all()
    # its setting's spec refuses in one line, exit 2
    bad = _oxbench(
        [plugin], "run", "--root", str(data_root), "--method", "oxplug-colour",
        "--set", "descriptor.bins=nan", cwd=tmp_path,
    )  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "setting descriptor.bins: expected a whole number" in bad.stderr


def test_the_plugin_passes_the_checks_of_oxbench_testing(
    plugin: Path, data_root: Path, tmp_path: Path
) -> None:
    script = tmp_path / "checks.py"
    script.write_text(CHECKS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), str(SRC)])}
    done = subprocess.run(
        [sys.executable, str(script), str(data_root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "oxplug-thumbs oxplug 0.1",
        "swap-top oxplug 0.1",
        "grid-patches oxplug 0.1",
        "colour-histogram oxplug 0.1",
        "threads oxplug 0.1",
    ]


def test_a_plugin_that_fails_to_import_is_one_warning_and_the_rest_are_listed(
    plugin: Path, tmp_path: Path
) -> None:
    broken = _hand_installed(
        tmp_path / "broken",
        "oxbroken",
        "[oxbench.families]\nbroken = oxbroken.family\n",
        {"oxbroken/__init__.py": "", "oxbroken/family.py": "import no_such_module_xyz\n"},
    )
    done = _oxbench([plugin, broken], "methods", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [" ".join(ln.split()) for ln in done.stdout.splitlines()]
    assert "oxplug-thumbs thumbnails, then swap-top (Nobody 2026) [from oxplug 0.1]" in lines
    assert any(ln.split()[:1] == ["rootsift-bow"] for ln in lines)
    warning = done.stderr.splitlines()
    assert len(warning) == 1, done.stderr
    assert "PluginWarning" in warning[0] and "'broken'" in warning[0]
    assert "oxbroken 0.1" in warning[0] and "no_such_module_xyz" in warning[0]


def test_a_name_taken_twice_is_one_line_naming_both_origins_and_exit_2(
    plugin: Path, tmp_path: Path
) -> None:
    # a plugin and a built-in: a preset named as a built-in one
    dup = _hand_installed(
        tmp_path / "dup",
        "oxdup",
        "[oxbench.families]\nbow = oxdup:PRESET\n",
        {
            "oxdup/__init__.py": "from oxbench.pipelines import BowConfig\nPRESET = BowConfig('rootsift-bow')\n"
        },
    )
    done = _oxbench([dup], "methods", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert (
        "method 'rootsift-bow' is registered twice: by oxbench.pipelines.families.bow and "
        "by oxdup 0.1" in done.stderr
    )
    # two plugins: a second 'threads' backend
    dup2 = _hand_installed(
        tmp_path / "dup2",
        "oxdup2",
        "[oxbench.executors]\nthreads = oxdup2:Threads\n",
        {"oxdup2/__init__.py": "from oxbench.execution import SerialExecutor as Threads\n"},
    )
    done = _oxbench(
        [plugin, dup2], "run", "--method", "oxplug-thumbs", "--engine", "threads", cwd=tmp_path
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "execution backend 'threads' is registered twice: by oxdup2 0.1 and by oxplug 0.1" in (
        done.stderr
    )


# ------------------------------------------------------------------ the mechanism, in process


def _registry_plugins(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hand_installed(
        folder,
        "thingpkg",
        "[oxbench.test-things]\nmodule = thingpkg.things\nobject = thingpkg:BLUE\n",
        {
            "thingpkg/__init__.py": "BLUE = 'blue thing'\n",
            "thingpkg/things.py": "from oxbench_test_registry import THINGS\nTHINGS.register('red', 'red thing')\n",
        },
    )
    _hand_installed(
        folder,
        "zbroken",
        "[oxbench.test-things]\nbad = zbroken:MISSING\n",
        {"zbroken/__init__.py": ""},
    )
    _hand_installed(  # a plugin whose own check refuses its entry: broken, not a duplicate
        folder,
        "ybadvalue",
        "[oxbench.test-things]\nbadvalue = ybadvalue\n",
        {
            "ybadvalue/__init__.py": "from oxbench.errors import InputError\n"
            "raise InputError('setting side: must be >= 2, got 1')\n"
        },
    )
    monkeypatch.syspath_prepend(str(folder))


def test_a_registry_loads_its_group_on_first_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    _registry_plugins(tmp_path, monkeypatch)
    holder = types.ModuleType("oxbench_test_registry")
    holder.THINGS = things = Registry("thing", group="oxbench.test-things")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "oxbench_test_registry", holder)
    for name in ("thingpkg", "thingpkg.things", "zbroken", "ybadvalue"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    things.register("green", "green thing")
    assert "thingpkg.things" not in sys.modules  # nothing is imported before a lookup
    with pytest.warns(PluginWarning) as caught:
        assert things.names() == ["green", "red", "object"]  # built-ins, then by distribution
    assert len(caught) == 2, [str(w.message) for w in caught]
    missing, bad_value = sorted(str(w.message) for w in caught)
    assert (
        "plugin 'bad' (zbroken:MISSING) of zbroken 0.1" in missing and "AttributeError" in missing
    )
    assert "plugin 'badvalue' (ybadvalue) of ybadvalue 0.1" in bad_value
    assert "InputError: setting side: must be >= 2, got 1" in bad_value
    assert things.get("red") == "red thing" and things.get("object") == "blue thing"
    assert str(things.origin("red")) == "thingpkg 0.1" and not things.origin("red").builtin
    assert things.origin("red").module == "builtins"  # a str's class: the object registered
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        things.names()  # loaded once: no second warning
    with pytest.raises(InputError, match="thing 'red' is registered twice: by thingpkg 0.1 and by"):
        things.register("red", "another")


def test_a_duplicate_from_a_plugin_is_refused_at_every_lookup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import types

    _registry_plugins(tmp_path, monkeypatch)
    holder = types.ModuleType("oxbench_test_registry")
    holder.THINGS = things = Registry(  # type: ignore[attr-defined]
        "thing",
        loader=lambda: things.register("object", "built-in object"),
        group="oxbench.test-things",
    )
    monkeypatch.setitem(sys.modules, "oxbench_test_registry", holder)
    for name in ("thingpkg", "thingpkg.things", "zbroken", "ybadvalue"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for _ in range(2):
        with pytest.raises(InputError) as err:
            things.get("red")
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith(
            "thing 'object' is registered twice: by builtins and by thingpkg 0.1"
        )
        assert (
            "(entry point oxbench.test-things: plugin 'object' (thingpkg:BLUE) of thingpkg 0.1)"
            in message
        )


def test_the_stage_of_the_plugin_docs_installs_as_a_package_and_runs(
    data_root: Path, tmp_path: Path
) -> None:
    """docs/plugins.md's stage, as written there (its module importing ``oxbench.pipelines`` and
    the check kit at its top, its entry point naming the class the module also registers), built
    and installed by pip into a folder: it loads through its entry point and runs in a pipeline."""
    pytest.importorskip("setuptools")
    doc = (ROOT / "docs" / "plugins.md").read_text()
    section = doc[doc.index("## A stage of your own") : doc.index("## A descriptor kind")]
    files = dict(re.findall(r"cat > (mystage/\S+) <<'EOF'\n(.*?)\nEOF\n", section, re.S))
    assert set(files) == {"mystage/pyproject.toml", "mystage/mystage.py"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    target = tmp_path / "plugins"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    pip += ["--no-index", "--disable-pip-version-check", "--quiet", "--target", str(target)]
    done = subprocess.run(
        [*pip, str(tmp_path / "mystage")], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    listed = _oxbench([target], "methods", "rootsift-bow", cwd=tmp_path)
    assert listed.returncode == 0 and "failed to load" not in listed.stderr, listed.stderr
    db, q = np.random.default_rng(0).standard_normal((2, 40, 8)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", q[:4])
    common = ["run", "--dataset", "synthetic", "--root", str(data_root), "--json", "--method"]
    files_set = ["--set", f"descriptor.db_features={tmp_path / 'db.npy'}"]
    files_set += ["--set", f"descriptor.query_features={tmp_path / 'q.npy'}"]
    plain = _oxbench([target], *common, "features", *files_set, cwd=tmp_path)
    swapped = _oxbench(
        [target], *common, "features", *files_set, "--set", "rerank=swap-top", cwd=tmp_path
    )
    assert plain.returncode == 0 and swapped.returncode == 0, swapped.stderr
    before = np.load(tmp_path / json.loads(plain.stdout)["run_dir"] / "ranks.npy").T
    after = np.load(tmp_path / json.loads(swapped.stdout)["run_dir"] / "ranks.npy").T
    assert np.array_equal(after[:, :3], before[:, 2::-1])  # swap-top.k = 3 by default
    assert np.array_equal(after[:, 3:], before[:, 3:])


def test_a_plugin_that_exits_interrupts_prints_or_is_slow_cannot_take_oxbench_down(
    tmp_path: Path,
) -> None:
    """Before: sys.exit(7) on import ended ``methods`` with rc 7 and no output, a
    KeyboardInterrupt gave "Aborted.", a print broke ``--json`` and a slow import was silent."""
    cases = {
        "oxexit": "import sys\nsys.exit(7)\n",
        "oxkbi": "raise KeyboardInterrupt\n",
        "oxbase": "class Odd(BaseException):\n    pass\nraise Odd('odd')\n",
        "oxprint": "print('hello from a plugin')\n",
        "oxslow": "import time\ntime.sleep(2.5)\n",
    }
    path = [
        _hand_installed(
            tmp_path / name,
            name,
            f"[oxbench.families]\n{name} = {name}\n",
            {f"{name}/__init__.py": body},
        )
        for name, body in cases.items()
    ]
    done = _oxbench(path, "methods", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)  # the plugin's print went to stderr
    assert any("rootsift-bow" in f["presets"] for f in listed)
    assert "hello from a plugin" in done.stderr
    failed = [ln for ln in done.stderr.splitlines() if "failed to load" in ln]
    assert len(failed) == 3, done.stderr
    for name, what in (
        ("oxexit", "SystemExit: 7"),
        ("oxkbi", "KeyboardInterrupt"),
        ("oxbase", "Odd: odd"),
    ):
        (line,) = [ln for ln in failed if f"plugin '{name}'" in ln]
        assert "PluginWarning" in line and f"{name} 0.1" in line and what in line, line
    slow = [ln for ln in done.stderr.splitlines() if "still importing" in ln]
    assert len(slow) == 1 and "plugin 'oxslow'" in slow[0], done.stderr


def test_the_users_own_ctrl_c_during_a_plugin_import_stops_the_command(tmp_path: Path) -> None:
    """Only a real SIGINT the user sends stops the command; the plugin is not blamed for it."""
    import signal

    slow = _hand_installed(
        tmp_path / "oxwait",
        "oxwait",
        "[oxbench.families]\noxwait = oxwait\n",
        {"oxwait/__init__.py": "import time\nprint('importing', flush=True)\ntime.sleep(60)\n"},
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(slow), str(SRC)])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "oxbench", "methods"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().strip() == "importing"  # inside the plugin's import now
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, (proc.returncode, err)
    assert "failed to load" not in err and out == ""


def test_a_plugin_local_feature_named_as_a_built_in_is_refused(tmp_path: Path) -> None:
    """A local feature plugin named ``h5`` collides with the built-in: one line naming both."""
    from test_architecture import TOY_EXTRACTOR

    dup = _hand_installed(
        tmp_path / "oxh5",
        "oxh5",
        "[oxbench.local_features]\nh5 = oxh5.local:GridPatches\n",
        {"oxh5/__init__.py": "", "oxh5/local.py": TOY_EXTRACTOR},
    )
    for args in (["methods", "rootsift-bow"], ["run", "--set", "features=h5:x.h5"]):
        done = _oxbench([dup], *args, cwd=tmp_path)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert "local feature 'h5' is registered twice: by oxbench" in done.stderr
        assert "by oxh5 0.1" in done.stderr


def test_every_documented_plugin_install_builds_without_the_wheel_package() -> None:
    """docs/plugins.md's ``pip install --no-build-isolation --target plugins ./pkg`` failed in a
    fresh venv (setuptools 65.5 there needs ``wheel`` for bdist_wheel, which it lacks): each such
    block first brings setuptools to 70.1+, which builds wheels by itself."""
    doc = (ROOT / "docs" / "plugins.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", doc, re.S)
    installs = [b for b in blocks if "--no-build-isolation" in b]
    assert len(installs) >= 2
    for block in installs:
        lines = block.splitlines()
        at = next(i for i, ln in enumerate(lines) if "--no-build-isolation" in ln)
        assert any('"setuptools>=70.1"' in ln for ln in lines[:at]), block
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    assert (major, minor) >= (70, 1)  # what the blocks (run by test_docs) build with here
