"""The architecture's seams, exercised from outside the package.

- a method family written in one new file (outside ``oxbench``) registers a preset and runs through
  :func:`oxbench.run` with the same run record as the built-in families;
- a local-feature extractor written in one new file (a grid of grey patches stored as float16)
  runs through the bag-of-words family, spatial verification included;
- the execution seam: one map loop, ordered results, one line for a bad backend or worker count;
- steps measure their cache hits: an interrupted extraction is recorded as computed on the rerun;
- ``pipelines/`` imports no module in a circle.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import oxbench
from oxbench.errors import InputError
from oxbench.execution import EXECUTORS, ProcessExecutor, SerialExecutor, make_executor
from oxbench.index.vocabulary import VocabularySettings
from oxbench.pipelines import RecordOptions, Session

TOY_FAMILY = '''
"""A toy family: ranks the database by image name, last name first (its ranks are known)."""
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from oxbench.pipelines import MethodConfig, RetrievalMethod, SearchResult, register_method
from oxbench.pipelines.steps import part_names


@dataclass(frozen=True)
class ReverseNamesConfig(MethodConfig):
    family: ClassVar[str] = "toy"
    name: str
    step: int = 1

    @property
    def needs_training(self) -> bool:
        return False

    def build(self) -> "ReverseNames":
        return ReverseNames(self)


class ReverseNames(RetrievalMethod):
    def __init__(self, config: ReverseNamesConfig) -> None:
        self.config = config

    def fit(self, train, ctx):
        return self

    def index(self, bench, ctx):
        self.names = part_names(bench, "database")
        ctx.record_step("toy-index", hit=False)
        return self

    def search(self, bench, ctx):
        order = np.argsort(self.names, kind="stable")[::-1].astype(np.int64)
        return SearchResult(np.tile(order, (bench.gt.n_queries, 1)), info={"toy": True})


register_method(ReverseNamesConfig("toy-reverse-names"))
'''

TOY_EXTRACTOR = '''
"""A toy local feature: grey 8x8 patches on a 16-px grid, L2-normalised, stored as float16."""
import hashlib
import json
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class GridPatches:
    step: int = 16
    size: int = 8

    @property
    def dim(self) -> int:
        return self.size * self.size

    @property
    def stored_dtype(self):
        return np.float16

    def to_dict(self):
        return {"kind": "grid-patches", **asdict(self), "dim": self.dim}

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def extract(self, image):
        grey = np.asarray(image, np.float32).mean(axis=2) if image.ndim == 3 else np.asarray(image, np.float32)
        h, w = grey.shape
        kps, descs = [], []
        for y in range(0, h - self.size + 1, self.step):
            for x in range(0, w - self.size + 1, self.step):
                patch = grey[y : y + self.size, x : x + self.size].ravel()
                patch = patch - patch.mean()
                norm = np.linalg.norm(patch)
                if norm > 1e-3:
                    kps.append((x + self.size / 2, y + self.size / 2, float(self.size), 0.0))
                    descs.append(patch / norm)
        kp = np.array(kps, np.float32).reshape(-1, 4)
        return kp, np.array(descs, np.float16).reshape(-1, self.dim)

    def finish(self, stored):
        return np.asarray(stored, np.float32)
'''


TOY_RERANKER = '''
"""A toy re-ranker with a setting of its own: reverses the top n of every list (its result is known)."""
from dataclasses import dataclass

from oxbench import schema as S
from oxbench.pipelines.rerankers import Ranking, Reranker, register_reranker


@dataclass(frozen=True)
class ReverseSettings:
    n: int = S.setting(3, S.Int(lo=1, hi=100), doc="images reversed at the top")

    def __post_init__(self):
        S.validate(self)


class ReverseTop(Reranker):
    needs = frozenset({"vectors"})
    settings_type = ReverseSettings

    def __init__(self, settings):
        self.n = settings.n

    def rerank(self, ranking, space, ctx):
        ranks, scores, n = ranking.ranks.copy(), ranking.scores.copy(), self.n
        ranks[:, :n], scores[:, :n] = ranks[:, n - 1 :: -1], scores[:, n - 1 :: -1]
        ctx.record_step("toy-rerank", hit=False)
        return Ranking(ranks, scores, ranking.queries, info={**ranking.info, "reversed": n})


class NeedsLocal(Reranker):
    needs = frozenset({"local"})

    def rerank(self, ranking, space, ctx):
        return ranking


register_reranker("reverse-top", ReverseTop)
register_reranker("needs-local", NeedsLocal)
'''


def _import_file(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy_family(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    from oxbench.pipelines.presets import METHODS

    path = tmp_path_factory.mktemp("plugin") / "toy_family.py"
    path.write_text(TOY_FAMILY)
    yield _import_file(path, "toy_family")
    METHODS.unregister("toy-reverse-names")  # other tests list the built-in presets only


def test_a_family_from_one_file_runs_through_oxbench_run(
    toy_family: ModuleType, tmp_path: Path
) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("PIL.Image")
    from oxbench.evaluation import evaluate
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    assert "toy-reverse-names" in oxbench.list_methods()
    outcome = oxbench.run(
        "synthetic",
        "toy-reverse-names",
        session=Session(root=root, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    bench = oxbench.load("synthetic", root)
    names = list(bench.gt.db_names)
    expected = np.tile(np.argsort(names, kind="stable")[::-1], (bench.gt.n_queries, 1))
    assert (
        outcome.result.to_dict()
        == evaluate(bench.gt, expected, source=str(outcome.config_dir)).to_dict()
    )
    record = json.loads((outcome.run_dir / "record.json").read_text())
    assert record["family"] == "toy" and record["cache"] == {"toy-index": "computed"}
    assert json.loads((outcome.run_dir / "metrics.json").read_text())["run"]["toy"] is True
    # its settings resolve like any preset's, and unknown ones are refused by name
    assert oxbench.pipelines.resolve_method("toy-reverse-names", step=2).step == 2  # type: ignore[attr-defined]
    with pytest.raises(InputError, match="unknown method setting 'colour'"):
        oxbench.pipelines.resolve_method("toy-reverse-names", colour="red")


def test_a_duplicate_preset_name_is_one_line(toy_family: ModuleType) -> None:
    with pytest.raises(InputError, match="'rootsift-bow' is registered twice") as err:
        toy_family.register_method(toy_family.ReverseNamesConfig("rootsift-bow"))
    assert "\n" not in str(err.value)
    with pytest.raises(InputError, match="registered twice"):
        toy_family.register_method(toy_family.ReverseNamesConfig("toy-reverse-names"))


def test_a_local_extractor_from_one_file_runs_through_bag_of_words(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    pytest.importorskip("PIL.Image")
    from oxbench.features.local import LocalExtractor
    from oxbench.pipelines import BowConfig, resolve_method, steps
    from test_pipeline import make_tiny_root

    (tmp_path / "grid.py").write_text(TOY_EXTRACTOR)
    grid = _import_file(tmp_path / "grid.py", "toy_grid_patches").GridPatches()
    assert isinstance(grid, LocalExtractor)
    root = make_tiny_root(tmp_path / "data")
    config = resolve_method(
        BowConfig(
            "grid-bow-sv",
            features=grid,
            vocabulary=VocabularySettings(size=32),
            rerank=("spatial",),
        ),
        **{"spatial.top_r": 10},
    )
    outcome = oxbench.run(
        "synthetic",
        config,
        session=Session(root=root, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert outcome.result.to_dict()["setups"]["easy"]["map"] > 0
    record = json.loads((outcome.run_dir / "record.json").read_text())
    assert record["cache"]["features"] == "computed"
    # the store holds the extractor's own dtype and dimension, finished on read
    bench = oxbench.load("synthetic", root)
    store = steps.open_store(root / "_cache", bench, grid, "database")
    stored = store.get_raw(bench.gt.db_names[0]).descriptors
    assert stored.dtype == np.float16 and stored.shape[1] == 64
    assert store.get(bench.gt.db_names[0]).descriptors.dtype == np.float32
    # a rerun takes every step from the cache
    again = oxbench.run(
        "synthetic",
        config,
        session=Session(root=root, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert set(json.loads((again.run_dir / "record.json").read_text())["cache"].values()) == {"hit"}
    assert np.array_equal(
        np.load(again.run_dir / "ranks.npy"), np.load(outcome.run_dir / "ranks.npy")
    )


def test_a_reranker_from_one_file_runs_in_a_family(tmp_path: Path) -> None:
    from oxbench.pipelines import resolve_method
    from oxbench.pipelines.rerankers import RERANKERS

    (tmp_path / "toy_reranker.py").write_text(TOY_RERANKER)
    _import_file(tmp_path / "toy_reranker.py", "toy_reranker")
    try:
        rng = np.random.default_rng(0)
        root = tmp_path / "data"
        bench = _features_benchmark(root)
        db = rng.standard_normal((bench.gt.n_db, 16)).astype(np.float32)
        q = rng.standard_normal((bench.gt.n_queries, 16)).astype(np.float32)
        np.save(tmp_path / "db.npy", db)
        np.save(tmp_path / "q.npy", q)
        files = {
            "descriptor.db_features": str(tmp_path / "db.npy"),
            "descriptor.query_features": str(tmp_path / "q.npy"),
        }
        plain = oxbench.run(
            bench.id,
            "features",
            overrides=files,
            session=Session(root=root, progress=False),
            record=RecordOptions(runs_dir=tmp_path / "runs"),
        )
        toy = oxbench.run(
            bench.id,
            "features",
            overrides={**files, "rerank": "reverse-top"},
            session=Session(root=root, progress=False),
            record=RecordOptions(runs_dir=tmp_path / "runs"),
        )
        before, after = np.load(plain.run_dir / "ranks.npy").T, np.load(toy.run_dir / "ranks.npy").T
        assert np.array_equal(after[:, :3], before[:, 2::-1]) and np.array_equal(
            after[:, 3:], before[:, 3:]
        )
        assert (
            json.loads((toy.run_dir / "record.json").read_text())["cache"]["toy-rerank"]
            == "computed"
        )
        assert json.loads((toy.run_dir / "metrics.json").read_text())["run"]["reversed"] == 3
        # the stage owns its settings: --set reaches them, the run records them under its name
        two = resolve_method("features", rerank="reverse-top", **{"reverse-top.n": "2"})
        assert (
            two.to_dict()["reverse-top"] == {"n": 2}
            and "reverse-top" not in resolve_method("features").to_dict()
        )
        with pytest.raises(
            InputError, match="setting reverse-top.n: must be in \\[1, 100\\], got 0"
        ):
            resolve_method("features", rerank="reverse-top", **{"reverse-top.n": "0"})
        # a stage the family cannot serve, or an unknown one, is one line when the method is resolved
        with pytest.raises(
            InputError,
            match="re-ranker 'needs-local' needs local features .a global method's from its local_source., which the global",
        ):
            resolve_method("features", rerank="needs-local")
        with pytest.raises(
            InputError,
            match="setting rerank: unknown re-ranker .nope.; this family runs: alpha-qe, aqe, cas, dba, diffusion, egt, k-reciprocal, reverse-top, superglobal",
        ):
            resolve_method("features", rerank="nope")
    finally:
        for name in ("reverse-top", "needs-local"):
            RERANKERS.unregister(name)


def _features_benchmark(root: Path):  # noqa: ANN202 - a Benchmark
    """A tiny synthetic set (ground truth and images) to run feature-file methods on."""
    pytest.importorskip("cv2")
    from test_pipeline import make_tiny_root

    make_tiny_root(root)
    return oxbench.load("synthetic", root)


def _square(x: int) -> int:
    return x * x


def test_executors_return_results_in_item_order() -> None:
    items = list(range(23))
    assert list(SerialExecutor().map(_square, items)) == [x * x for x in items]
    assert list(ProcessExecutor(2).map(_square, items)) == [x * x for x in items]
    assert sorted(EXECUTORS.names()) == ["dask", "processes", "serial"]
    assert ProcessExecutor(2, cores=2).threads_per_worker == 1
    assert ProcessExecutor(3, cores=2).threads_per_worker == 1
    assert ProcessExecutor(1, cores=8).threads_per_worker == 8


class _Burn:
    """A job that spends about ``seconds`` of CPU per item and says which process ran it, and how much CPU it used."""

    def __init__(self, seconds: float, tag: str) -> None:
        self.seconds, self.tag = seconds, tag

    def __call__(self, item: int) -> tuple[str, int, float]:
        import os
        import time

        t0 = time.process_time()
        x = 0
        while time.process_time() - t0 < self.seconds:
            x += 1
        return self.tag, os.getpid(), time.process_time() - t0


def test_one_pool_serves_every_stage_and_its_cpu_is_counted_while_it_lives() -> None:
    """ProcessExecutor keeps its workers across map calls (each worker imports the libraries once
    per run), installs each stage's job in them, counts their CPU while they live, and stops them
    on close."""
    import os

    from oxbench.execution import cpu_seconds

    executor = ProcessExecutor(2, cores=2)
    try:
        c0 = cpu_seconds()
        first = list(executor.map(_Burn(0.2, "first"), list(range(6))))
        used = cpu_seconds() - c0
        second = list(executor.map(_Burn(0.0, "second"), list(range(6))))
        assert {t for t, _, _ in first} == {"first"} and {t for t, _, _ in second} == {"second"}
        pids = {p for _, p, _ in first}
        assert {p for _, p, _ in second} <= pids and os.getpid() not in pids and len(pids) <= 2
        burned = sum(c for _, _, c in first)
        assert burned >= 1.0 and used >= 0.9 * burned, (
            used,
            burned,
        )  # the live workers' CPU is in the reading
        jobs = executor._jobs
        assert (
            jobs is not None and jobs.is_dir() and not list(jobs.iterdir())
        )  # finished stages leave no job file
        # leaving a stage early keeps the pool for the next one
        stage = executor.map(_Burn(0.0, "early"), list(range(20)))
        assert next(stage)[0] == "early"
        stage.close()
        assert {t for t, _, _ in executor.map(_Burn(0.0, "after"), [1, 2, 3])} == {"after"}
    finally:
        executor.close()
    assert not jobs.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _page_faults_of_freed_buffers(_: int) -> int:
    """Minor page faults of allocating and freeing 19 numpy buffers of 40 MiB after a first one.

    40 MiB is above glibc's largest adaptive mmap threshold (32 MiB): by default each buffer is
    fresh memory from the kernel, and faulting it in costs a few hundred faults even with numpy's
    huge pages (10,240 without them); reused heap memory costs none.
    """
    import resource

    size = 40 << 20
    np.ones(size // 4, np.float32)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(19):
        np.ones(size // 4, np.float32)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_workers_reuse_freed_buffers_instead_of_faulting_fresh_pages() -> None:
    """keep_freed_memory() in every worker: the pages of a freed buffer serve the next ones (by
    default the 19 buffers fault about 10,000 times with huge pages, 194,560 without)."""
    for faults in ProcessExecutor(2).map(_page_faults_of_freed_buffers, [0, 1, 2, 3]):
        assert faults < (40 << 20) // 4096 // 4, (
            faults
        )  # under a quarter of one buffer's 4 KiB pages


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2", 10**6])
def test_a_bad_worker_count_is_one_line(workers: object) -> None:
    with pytest.raises(InputError, match="workers must be a whole number from 1 to 1024") as err:
        make_executor("processes", workers)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_an_unknown_backend_is_one_line() -> None:
    with pytest.raises(
        InputError, match="unknown execution backend .mpi.; known: dask, processes, serial"
    ):
        make_executor("mpi", 2)


def test_an_interrupted_extraction_is_recorded_as_computed(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    from oxbench.features.store import extract_to_store
    from oxbench.pipelines import RunContext, steps
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    bench = oxbench.load("synthetic", root)
    features = steps.CLASSIC_FEATURES
    ctx = RunContext(tmp_path / "cache", progress=False)
    # an extraction killed after its first shard: the store folder exists and holds part of it
    job, n, _ = steps.extraction_job(bench, "database", features)
    store = steps.open_store(ctx.cache, bench, features, "database", create=True)
    assert extract_to_store(job, n, store, shard_size=8, progress=False, stop_after=1) == 8
    done = steps.step_features(bench, features, ctx, parts=["database"])
    assert done["database"].hit is False and done["database"].computed == n - 8
    again = steps.step_features(bench, features, ctx, parts=["database"])
    assert again["database"].hit is True and again["database"].computed == 0


#: The rooms of the package, top floor first: a module imports only the rooms below its own (a
#: room is a subpackage or a top-level module). docs/architecture.md draws the same layers.
LAYERS = (
    "oxbench.__main__",
    "oxbench.cli",
    "oxbench.testing",
    "oxbench.milestones",
    "oxbench",
    "oxbench.pipelines",
    "oxbench.train",
    "oxbench.refinement",
    "oxbench.index",
    "oxbench.features",
    "oxbench.report",
    "oxbench.datasets",
    "oxbench.records",
    "oxbench.execution",
    "oxbench.provenance",
    "oxbench.storage",
    "oxbench.cache",
    "oxbench.evaluation",
    "oxbench.imaging",
    "oxbench.formats",
    "oxbench.groundtruth",
    "oxbench.protocol",
    "oxbench.fileio",
    "oxbench.schema",
    "oxbench.registry",
    "oxbench.errors",
    "oxbench.version",
)
#: Arrows that still run back up (from a lower room to a higher one), each with why; at most 2.
KNOWN_UP = {
    ("oxbench.formats.local_features", "oxbench.features.local"),
}


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, from the source: every module, ``__init__`` files
    included (as their package), function-level and ``TYPE_CHECKING`` imports included."""
    src = Path(oxbench.__file__).parent
    modules: dict[str, Path] = {}
    for p in src.rglob("*.py"):
        parts = p.relative_to(src.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        package = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                folder = src.parent.joinpath(*base.split("."))
                for a in node.names:
                    if any(folder.glob(f"{a.name}.*")) and f"{base}.{a.name}" not in modules:
                        continue  # a compiled submodule (the optional _accel kernels)
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    if target in modules and target != m:
                        edges[m].add(target)
            elif isinstance(node, ast.Import):
                edges[m].update(a.name for a in node.names if a.name in modules and a.name != m)
            elif (  # importlib.import_module("<a literal name>") is an import too
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value in modules
                and node.args[0].value != m
            ):
                edges[m].add(str(node.args[0].value))
    return edges


def import_edges(package: str) -> dict[str, set[str]]:
    """The imports among the modules of ``oxbench.<package>`` (the package itself included)."""
    inside = f"oxbench.{package}"
    return {
        m: {t for t in targets if t == inside or t.startswith(inside + ".")}
        for m, targets in _import_graph().items()
        if m == inside or m.startswith(inside + ".")
    }


def test_the_package_imports_no_module_in_a_circle_and_layers_import_downward() -> None:
    edges = _import_graph()
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for n in sorted(edges[m]):
            assert state.get(n) != 1, f"import circle: {' -> '.join([*stack, m, n])}"
            if n not in state:
                visit(n, [*stack, m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])

    def room(m: str) -> str:
        return ".".join(m.split(".")[:2])

    floor = {r: i for i, r in enumerate(LAYERS)}
    assert {room(m) for m in edges} <= set(floor), "a new room: give it its floor in LAYERS"
    up = {
        (a, b)
        for a, targets in edges.items()
        for b in targets
        if room(a) != room(b) and floor[room(a)] > floor[room(b)]
    }
    assert up <= KNOWN_UP, f"imports running back up the layers: {sorted(up - KNOWN_UP)}"
    assert len(KNOWN_UP) <= 2
    # and no family imports another family
    families = [m for m in edges if m.startswith("oxbench.pipelines.families.")]
    for m in families:
        assert not edges[m] & set(families), f"{m} imports another family"


def test_pipelines_and_cli_have_no_function_over_100_lines_or_10_parameters() -> None:
    """A run is small steps in readable functions: none over 100 lines, none over 10 parameters
    (a click command's options excepted)."""
    src = Path(oxbench.__file__).parent
    long = []
    for path in [*(src / "pipelines").rglob("*.py"), *(src / "cli").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            n = len(params) + bool(a.vararg) + bool(a.kwarg)
            n -= bool(params) and params[0].arg in ("self", "cls")
            click = any("click." in ast.unparse(d) for d in node.decorator_list)
            lines = node.end_lineno - node.lineno + 1  # type: ignore[operator]
            if lines > 100 or (n > 10 and not click):
                long.append(f"{path.relative_to(src)}:{node.name} ({lines} lines, {n} parameters)")
    assert not long, long


@pytest.mark.slow
def test_gem_r18_synthetic_trains_its_network_in_fit_on_a_fresh_root(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("cv2")
    from oxbench.features.deep.model import load_model
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    model = root / "_models" / "gem-r18-synthetic.pt"
    first = oxbench.run(
        "synthetic",
        "gem-r18-synthetic",
        overrides={"descriptor.train_epochs": 1},
        session=Session(root=root, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert model.is_file()
    training = load_model(model).source["training"]
    assert training["config"]["dataset"] == "synthetic-train" and training["config"]["epochs"] == 1
    assert json.loads((first.run_dir / "record.json").read_text())["cache"]["network"] == "computed"
    # the file is what the next run (and `oxbench train`'s users) load; nothing is trained again
    again = oxbench.run(
        "synthetic",
        "gem-r18-synthetic",
        overrides={"descriptor.train_epochs": 1},
        session=Session(root=root, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert json.loads((again.run_dir / "record.json").read_text())["cache"]["network"] == "hit"
    assert np.array_equal(
        np.load(again.run_dir / "ranks.npy"), np.load(first.run_dir / "ranks.npy")
    )
    # the random floor trains nothing
    floor = oxbench.pipelines.resolve_method(
        "gem-r18-synthetic", **{"descriptor.weights": "random"}
    )
    assert not floor.needs_training  # type: ignore[attr-defined]


def test_backend_options_are_one_mapping_checked_by_the_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("distributed")
    monkeypatch.delenv("OXBENCH_CLUSTER", raising=False)
    dask = make_executor("dask", options={"address": "tcp://127.0.0.1:8786", "retries": "5"})
    # nothing is reached before a stage needs it; an existing cluster's workers are its own
    assert dask.address == "tcp://127.0.0.1:8786" and dask.retries == 5 and dask.workers == 1  # type: ignore[attr-defined]
    assert make_executor("dask", 2, options={"connect_timeout_s": 2}).workers == 2
    with pytest.raises(InputError, match="dask engine option retries: expected a whole number"):
        make_executor("dask", options={"retries": "nan"})
    with pytest.raises(
        InputError, match="backend 'serial' has no option 'address' .its options: none"
    ):
        make_executor("serial", options={"address": "tcp://127.0.0.1:8786"})
    with pytest.raises(InputError, match="has no option 'adress' .its options: address, connect"):
        make_executor("dask", options={"adress": "tcp://127.0.0.1:8786"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster", "tcp://127.0.0.1:8786"], "--cluster is the address of a Dask scheduler and needs --engine dask, not 'processes'"),
        (["--engine", "dask", "--cluster", "tcp://127.0.0.1:8786", "--engine-option", "address=tcp://127.0.0.1:8787"], "--cluster and --engine-option address=... name the same"),
        (["--engine-option", "retries"], "--engine-option takes KEY=VALUE, got 'retries'"),
        (["--engine", "dask", "--engine-option", "retries=1", "--engine-option", "retries=2"], "--engine-option retries is given twice"),
        (["--engine", "dask", "--engine-option", "retries=-1"], "dask engine option retries: must be in [0, 100]"),
        (["--engine", "nope"], "unknown execution backend 'nope'; known: dask, processes, serial"),
    ],
)  # fmt: skip
def test_bad_engine_options_on_the_command_line_are_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from oxbench.cli import main

    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--method",
                "features",
                "--root",
                str(tmp_path),
                "--out",
                str(tmp_path / "o"),
                *args,
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err, err
    assert not (tmp_path / "o").exists()
