"""oxbench.testing: every built-in passes the checks a plugin must pass, and each check catches
the defect it is there for, with a message that says what to fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from oxbench import schema as S
from oxbench.execution import EXECUTORS, Executor, SerialExecutor
from oxbench.features.extractors import LOCAL_EXTRACTORS, local_extractor
from oxbench.pipelines.method import MethodConfig, RetrievalMethod, SearchResult
from oxbench.pipelines.presets import METHODS, method_families, resolve_method
from oxbench.pipelines.rerankers import RERANKERS, Ranking, Reranker
from oxbench.testing import (
    SyntheticSpace,
    check_descriptor,
    check_executor,
    check_family,
    check_local_extractor,
    check_reranker,
)

#: Settings that size a preset to the tiny benchmark (each applied where the preset has it).
SMALL = {"vocabulary.size": 100, "features.max_side": 320, "features.n_features": 300}


def _small(name: str) -> MethodConfig:
    config = METHODS.get(name)
    have = {f.name for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    for nested in ("features", "vocabulary"):
        value = getattr(config, nested, None)
        if dataclasses.is_dataclass(value):
            have |= {f"{nested}.{f.name}" for f in dataclasses.fields(value)}
    small = {k: v for k, v in SMALL.items() if k in have}
    local = getattr(getattr(config, "descriptor", None), "local_features", None)
    if dataclasses.is_dataclass(local):  # a descriptor kind's local features (VLAD's)
        small.update({f"descriptor.{k}": v for k, v in SMALL.items() if k.startswith("features.")})
    return resolve_method(config, **small)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cv2")
    pytest.importorskip("PIL.Image")
    from oxbench.testing import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


# ------------------------------------------------------------------------- every built-in


@pytest.mark.parametrize("preset", [f.presets[0] for f in method_families()])
def test_every_builtin_family_passes_check_family(preset: str, root: Path) -> None:
    pytest.importorskip("faiss")
    check_family(_small(preset), root=root)


@pytest.mark.parametrize("name", RERANKERS.names())
def test_every_builtin_reranker_passes_check_reranker(name: str) -> None:
    check_reranker(RERANKERS.get(name))


@pytest.mark.parametrize("descriptor", ["sift", "rootsift"])
def test_every_builtin_local_extractor_passes_check_local_extractor(
    descriptor: str, root: Path
) -> None:
    import dataclasses

    # the extractors that describe pixels (h5:, npz: read files: tests/test_local_feature_files.py)
    assert {"sift", "rootsift", "h5", "npz"} <= set(LOCAL_EXTRACTORS.names())
    extractor = local_extractor(descriptor)
    check_local_extractor(dataclasses.replace(extractor, max_side=320, n_features=300), root=root)


def _tiny_kind(name: str, root: Path, tmp_path: Path) -> Any:
    """Each built-in descriptor kind sized to the tiny benchmark (the user's files made here)."""
    import oxbench
    from oxbench.pipelines.descriptors import DESCRIPTORS
    from oxbench.pipelines.steps import part_names

    kind = DESCRIPTORS.get(name)()
    if name == "vlad":
        features = dataclasses.replace(kind.features, max_side=320, n_features=300)  # type: ignore[attr-defined]
        vocabulary = dataclasses.replace(kind.vocabulary, size=8)  # type: ignore[attr-defined]
        return dataclasses.replace(kind, features=features, vocabulary=vocabulary)
    if name == "cnn":
        pytest.importorskip("torch")
        return dataclasses.replace(
            kind, backbone="resnet18", weights="random", max_side=64, scales=(1.0,)
        )
    bench = oxbench.load("synthetic", root, progress=False)
    rng = np.random.default_rng(0)
    n_db, n_q = len(part_names(bench, "database")), len(part_names(bench, "queries"))
    np.save(tmp_path / "db.npy", rng.standard_normal((n_db, 16)).astype(np.float32))
    np.save(tmp_path / "q.npy", rng.standard_normal((n_q, 16)).astype(np.float32))
    return dataclasses.replace(
        kind, db_features=str(tmp_path / "db.npy"), query_features=str(tmp_path / "q.npy")
    )


@pytest.mark.parametrize("name", ["vlad", "cnn", "files"])
def test_every_builtin_descriptor_kind_passes_check_descriptor(
    name: str, root: Path, tmp_path: Path
) -> None:
    from oxbench.pipelines.descriptors import DESCRIPTORS

    pytest.importorskip("faiss")
    assert {"vlad", "cnn", "files"} <= set(DESCRIPTORS.names())
    check_descriptor(_tiny_kind(name, root, tmp_path), root=root)


def test_check_descriptor_names_each_defect(root: Path, tmp_path: Path) -> None:
    """A kind that is not registered under its name, and an object that is no kind, are named."""
    from oxbench.pipelines.descriptors.files import FeatureFilesDescriptor

    @dataclasses.dataclass(frozen=True)
    class Unregistered(FeatureFilesDescriptor):
        kind: ClassVar[str] = "unregistered-files"

    good = _tiny_kind("files", root, tmp_path)
    with pytest.raises(AssertionError, match="is not registered as 'unregistered-files'"):
        check_descriptor(Unregistered(**dataclasses.asdict(good)), root=root)
    with pytest.raises(AssertionError, match="is not a DescriptorKind"):
        check_descriptor(object(), root=root)


@pytest.mark.parametrize("name", EXECUTORS.names())
def test_every_builtin_executor_passes_check_executor(name: str) -> None:
    if name == "dask":
        pytest.importorskip("distributed")
    check_executor(EXECUTORS.get(name))


# ------------------------------------------------------------------ each check catches its defect


@dataclass(frozen=True)
class ShuffleConfig(MethodConfig):
    """A family whose defects are switched on by its settings."""

    family: ClassVar[str] = "shuffle"
    name: str
    seed: int = S.setting(0, S.Int(lo=0), doc="seed of the shuffle")
    cache_steps: bool = S.setting(True, S.Bool(), doc="record the index step as a hit when redone")
    reseed: bool = S.setting(False, S.Bool(), doc="a new seed on every build (not deterministic)")

    def __post_init__(self) -> None:
        S.validate(self)

    @property
    def needs_training(self) -> bool:
        return False

    def build(self) -> Shuffle:
        return Shuffle(self)


class Shuffle(RetrievalMethod):
    builds = 0

    def __init__(self, config: ShuffleConfig) -> None:
        self.config = config
        Shuffle.builds += 1

    def fit(self, train: Any, ctx: Any) -> Shuffle:
        return self

    def index(self, bench: Any, ctx: Any) -> Shuffle:
        marker = ctx.cache / "shuffle-index"
        hit = marker.exists() and self.config.cache_steps
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        ctx.record_step("shuffle-index", hit=hit)
        self.n = bench.n_index
        return self

    def search(self, bench: Any, ctx: Any) -> SearchResult:
        seed = self.config.seed + (Shuffle.builds if self.config.reseed else 0)
        rng = np.random.default_rng(seed)
        ranks = np.stack([rng.permutation(self.n) for _ in range(bench.gt.n_queries)])
        return SearchResult(ranks.astype(np.int64))


@dataclass(frozen=True)
class NoSpecConfig(ShuffleConfig):
    colour: str = "red"


def test_check_family_passes_a_sound_family_and_names_each_defect(root: Path) -> None:
    check_family(ShuffleConfig("shuffle"), root=root)
    with pytest.raises(AssertionError, match="ranks differently; make every step deterministic"):
        check_family(ShuffleConfig("shuffle", reseed=True), root=root)
    with pytest.raises(
        AssertionError, match="step.s. shuffle-index computed again on a second run"
    ):
        check_family(ShuffleConfig("shuffle", cache_steps=False), root=root)
    with pytest.raises(AssertionError, match="setting colour has no spec.*oxbench.schema.setting"):
        check_family(NoSpecConfig("shuffle"), root=root)


class _Base(Reranker):
    needs = frozenset({"vectors"})


class MutatesInput(_Base):
    def rerank(self, ranking: Ranking, space: Any, ctx: Any) -> Ranking:
        ranking.ranks[:, :2] = ranking.ranks[:, 1::-1].copy()
        return ranking


class RepeatsAnImage(_Base):
    def rerank(self, ranking: Ranking, space: Any, ctx: Any) -> Ranking:
        ranks = ranking.ranks.copy()
        ranks[:, 1] = ranks[:, 0]
        return Ranking(ranks, ranking.scores.copy(), ranking.queries, info=dict(ranking.info))


class DropsInfo(_Base):
    def rerank(self, ranking: Ranking, space: Any, ctx: Any) -> Ranking:
        return Ranking(ranking.ranks.copy(), ranking.scores.copy(), ranking.queries)


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        (MutatesInput, "changed the ranking it was given; copy before changing"),
        (RepeatsAnImage, "ranks an image twice in one list"),
        (DropsInfo, "dropped the info of the stages before it"),
    ],
)
def test_check_reranker_names_each_defect(cls: type, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        check_reranker(cls)


@dataclasses.dataclass(frozen=True)
class _LooseSettings:
    width: float = 1.0  # no spec: --set text would be neither parsed nor checked


class _LooseStage(_Base):
    name = "loose"
    settings_type = _LooseSettings

    def __init__(self, settings: _LooseSettings) -> None:
        self.width = settings.width

    def rerank(self, ranking: Ranking, space: Any, ctx: Any) -> Ranking:
        return ranking


def test_check_reranker_names_a_setting_without_spec() -> None:
    with pytest.raises(AssertionError, match="setting loose.width declares no spec"):
        check_reranker(_LooseStage)


def test_the_synthetic_space_ranks_and_verifies_by_its_groups() -> None:
    space = SyntheticSpace()
    scores, ranks = space.rank(space.queries)
    assert ranks.shape == (5, 120) and (np.diff(scores, axis=1) <= 0).all()
    # each query's own group leads its list (the groups are well apart), and verification knows it
    assert (space.groups[ranks[:, :5]] == np.arange(5)[:, None]).mean() > 0.9
    verified = space.first_ranking(verified=True, top_r=20)
    assert verified.verified is not None
    for qi, res in enumerate(verified.verified):
        assert (space.groups[res.verified] == qi).all() and (res.inliers == 30).all()
        assert np.array_equal(verified.ranks[qi, : len(res.verified)], res.verified)


@dataclass(frozen=True)
class Corners:
    """A local feature with switchable defects: keypoints at the image corners."""

    outside: bool = False
    dtype: str = "float32"

    dim: ClassVar[int] = 4

    @property
    def stored_dtype(self) -> Any:
        return np.float32

    def to_dict(self) -> dict[str, object]:
        return {"kind": "corners", "outside": self.outside, "dtype": self.dtype}

    def digest(self) -> str:
        return f"corners-{int(self.outside)}-{self.dtype}"

    def extract(self, image: Any) -> tuple[Any, Any]:
        h, w = image.shape[:2]
        if image.std() == 0:
            return np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)
        far = 2.0 if self.outside else 1.0
        kp = np.array([[0, 0, 8, 0], [w * far - 1, h - 1, 8, 0]], np.float32)
        desc = np.stack([image[0, 0, :].tolist() + [1], image[-1, -1, :].tolist() + [1]])
        return kp, desc.astype(self.dtype)

    def finish(self, stored: Any) -> Any:
        return np.asarray(stored, np.float32)


def test_check_local_extractor_passes_a_sound_one_and_names_each_defect(root: Path) -> None:
    check_local_extractor(Corners(), root=root)
    with pytest.raises(AssertionError, match="keypoints outside the image"):
        check_local_extractor(Corners(outside=True), root=root)
    with pytest.raises(AssertionError, match="return float32 .2, 4. as stored_dtype and dim"):
        check_local_extractor(Corners(dtype="float64"), root=root)


class Reversed(SerialExecutor):
    """Results in the wrong order."""

    backend = "reversed"

    def map(
        self, job: Callable[[Any], Any], items: Sequence[Any], **kwargs: Any
    ) -> Generator[Any, None, None]:
        yield from reversed(list(super().map(job, items, **kwargs)))


class Swallows(SerialExecutor):
    """Errors of the job lost."""

    backend = "swallows"

    def map(
        self, job: Callable[[Any], Any], items: Sequence[Any], **kwargs: Any
    ) -> Generator[Any, None, None]:
        for item in items:
            try:
                yield job(item)
            except ValueError:
                continue


@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (Reversed, "returns items in the order .12, 11"),
        (Swallows, "an item that raises is not reported"),
        (lambda workers: "not an executor", "is not an Executor"),
    ],
)
def test_check_executor_names_each_defect(factory: Callable[[int], Executor], problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        check_executor(factory)


def test_an_executor_plugins_own_facts_round_trip_through_the_run_record() -> None:
    """An executor of a plugin that records facts of its own (a cluster kind the built-ins do not
    know) passes the check kit, and a run record holding them reads back; the facts of the Dask
    backend are still checked by the Dask backend."""
    from oxbench.errors import InputError
    from oxbench.execution import EXECUTORS, SerialExecutor
    from oxbench.records import ExecutionFacts

    class SlurmLike(SerialExecutor):
        backend = "slurm-like"

        def describe(self) -> dict[str, object]:
            return {**super().describe(), "cluster": "slurm", "partition": "gpu"}

    EXECUTORS.register("slurm-like", SlurmLike)
    try:
        check_executor(SlurmLike)
        facts = ExecutionFacts.from_dict(SlurmLike().describe())
        assert facts.own == {"cluster": "slurm", "partition": "gpu"}
        assert facts.to_dict() == SlurmLike().describe()
    finally:
        EXECUTORS.unregister("slurm-like")
    dask_facts = {"backend": "dask", "workers": 2, "threads_per_worker": 1}
    ExecutionFacts.from_dict({**dask_facts, "cluster": "local"})
    with pytest.raises(InputError, match="'execution.cluster' must be 'local' or 'address'"):
        ExecutionFacts.from_dict({**dask_facts, "cluster": "slurm"})
    with pytest.raises(InputError, match="execution.workers"):
        ExecutionFacts.from_dict({"backend": "serial", "workers": 0, "threads_per_worker": 1})


def test_check_family_from_a_plain_script_starts_no_process() -> None:
    """The check kit crashed when run as docs/plugins.md shows it (``python check.py`` without a
    ``__main__`` guard: spawned workers imported the script again). From a plain script the
    two-worker run stays in the process and pickles what a worker process would receive."""
    import sys

    from oxbench import testing

    executor = testing._two_workers(False)
    assert executor.workers == 2
    assert list(executor.map(abs, [-1, 2, -3])) == [1, 2, 3]
    with pytest.raises(AssertionError, match="the job of a parallel stage does not pickle"):
        list(executor.map(lambda x: x, [1]))
    main = sys.modules["__main__"]
    assert testing._main_is_a_plain_script() == (
        getattr(main, "__spec__", None) is None and hasattr(main, "__file__")
    )
