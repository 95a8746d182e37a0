"""Checks a plugin (or a built-in) must pass, as scikit-learn's ``check_estimator``.

Each check runs the real protocol of its kind on a tiny synthetic input made in memory or in a
temporary folder, and raises :class:`AssertionError` with a message saying what the plugin must
fix. A plugin's own tests call them on what it registers::

    from oxbench.testing import (
        check_descriptor, check_executor, check_family, check_local_extractor, check_reranker
    )

    def test_my_plugin_passes_the_checks(tmp_path):
        check_family(resolve_method("my-preset", **{"vocabulary.size": 64}), root=tmp_path)
        check_reranker(MyReranker)
        check_local_extractor(MyExtractor())
        check_descriptor(MyDescriptor(), root=tmp_path)
        check_executor(MyExecutor)

- :func:`check_family` -- the config is a frozen, hashable dataclass whose every setting has a spec,
  that survives ``to_dict`` / JSON and ``--set KEY=VALUE`` text, refuses bad values in one line;
  the method fits, indexes and searches the tiny synthetic benchmark (:func:`make_tiny_root`) with
  ranks of the right shape and dtype, every row a permutation of the index, the same ranks again
  from the cache (every step it computed a cache hit the second time) and from an empty cache with
  two worker processes;
- :func:`check_descriptor` -- a global descriptor kind as data (frozen, registered, rebuilt from
  its ``to_dict()``, a stable JSON cache key) and at work: a global method with it passes
  :func:`check_family`, and every part is described as one finite ``float32`` row per image;
- :func:`check_reranker` -- a stage built from its settings takes a ranking over a synthetic
  re-ranking space (:class:`SyntheticSpace`: grouped vectors, and a verification that knows the
  groups) to a ranking of the same shape whose rows are permutations, leaves its input alone, and
  gives the same ranking again;
- :func:`check_local_extractor` -- keypoints and descriptors of the declared shape and dtype, inside
  the image, none on a flat image, deterministic, finished to float32; stored through the feature
  store of the pipelines and found there (a cache hit) the second time;
- :func:`check_executor` -- results in item order and equal to the serial ones (numpy arrays bit
  for bit), nothing for no items, an error of a job raised, a stage left early and a second stage
  after it, ``describe`` JSON-able, ``close`` twice harmless;
- :func:`check_dataset` -- a catalog entry and its family: registered under its id, its protocols
  known; a copy not on disk one line with the remedy; on the family's tiny example copy
  (``write_example``) the ground truth valid, of its protocol, the same twice, loaded with and
  without images, a perfect ranking scoring 1 in every setup, the result's lines, table and JSON
  read back as the protocol reads them, ``verify`` clean, and ``oxbench.run`` of the ``features``
  method on random descriptors named by image writing a run record that reads back (a distractor
  set: attached after a benchmark it belongs with).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "SyntheticSpace",
    "check_dataset",
    "check_descriptor",
    "check_executor",
    "check_family",
    "check_local_extractor",
    "check_reranker",
    "make_tiny_root",
]


def _fail(what: str, problem: str, remedy: str) -> AssertionError:
    return AssertionError(f"{what}: {problem}; {remedy}")


@contextmanager
def _folder(root: str | Path | None, prefix: str) -> Iterator[Path]:
    if root is not None:
        Path(root).mkdir(parents=True, exist_ok=True)
        yield Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


# ------------------------------------------------------------------------- the tiny benchmark


def make_tiny_root(root: str | Path) -> Path:
    """A tiny synthetic test city (40 database images, 4 queries) and training city (30 images)
    under ``root``, 320 x 240 pixels (about 2 s; needs opencv and Pillow; a complete set already
    there is kept). Returns ``root``."""
    from oxbench.datasets.synthetic.generate import make_tiny_cities

    return make_tiny_cities(root)


# ------------------------------------------------------------------------------ families


def _setting_text(value: Any) -> str:
    """``value`` as ``--set KEY=VALUE`` text."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple | list):
        return ",".join(_setting_text(v) for v in value)
    return str(value)


#: Text each kind of spec must refuse (NaN for every number: a range check must reject it).
_BAD_TEXT = {
    "Int": "1.5",
    "Size": "1.5",
    "Float": "nan",
    "Bool": "maybe",
    "Choice": "no-such-choice",
    "FloatTuple": "nan",
    "Str": "a\x00b",
}


def _settings(config: Any) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """``(dotted name, field, value)`` of every setting that applies (nested configs as dotted
    names, as deep as they go -- ``descriptor.features.max_side`` -- and the settings of each stage
    instance of the pipeline as ``instance.setting``)."""
    from oxbench.pipelines.method import STAGE_SETTINGS_FIELD

    for f in dataclasses.fields(config):
        if f.name == "name" or not config.applies(f.name):
            continue
        value = getattr(config, f.name)
        if f.name == STAGE_SETTINGS_FIELD:
            for instance in config.stage_instances:
                settings = config.stage(instance)
                for g in dataclasses.fields(settings) if settings is not None else ():
                    yield f"{instance}.{g.name}", g, getattr(settings, g.name)
        else:
            yield from _nested(f.name, f, value)


def _nested(
    name: str, f: dataclasses.Field[Any], value: Any
) -> Iterator[tuple[str, dataclasses.Field[Any], Any]]:
    """``(name, f, value)``, or for a nested config the settings inside it, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for g in dataclasses.fields(value):
            yield from _nested(f"{name}.{g.name}", g, getattr(value, g.name))
    else:
        yield name, f, value


def _check_frozen(what: str, settings: Any) -> None:
    """Settings (a config, a descriptor kind) are a frozen, hashable dataclass: data, usable as a
    cache key."""
    if not type(settings).__dataclass_params__.frozen:
        raise _fail(what, "is not frozen", "declare it @dataclass(frozen=True)")
    try:
        hash(settings)
    except TypeError as exc:
        raise _fail(
            what, f"is not hashable ({exc})", "use tuples, not lists, in settings"
        ) from None


def _check_config(config: Any) -> None:
    """The static half of :func:`check_family`: the config as data."""
    from oxbench.errors import InputError
    from oxbench.pipelines.method import MethodConfig
    from oxbench.pipelines.presets import resolve_method
    from oxbench.schema import SPEC_KEY

    what = f"family config {type(config).__name__}"
    if not isinstance(config, MethodConfig) or not dataclasses.is_dataclass(config):
        raise _fail(
            what, "is not a MethodConfig dataclass", "subclass oxbench.pipelines.MethodConfig"
        )
    what = f"family {config.family or '?'} preset {getattr(config, 'name', '?')!r}"
    if not config.family:
        raise _fail(what, "has no family name", "set the class attribute family = '...'")
    _check_frozen(what, config)
    data = config.to_dict()
    try:
        text = json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(what, f"to_dict() is not JSON ({exc})", "keep settings plain data") from None
    if json.loads(text) != data or data.get("family") != config.family:
        raise _fail(what, "to_dict() does not survive JSON", "keep settings plain data")
    if config.digest() != config.digest() or not isinstance(config.digest(), str):
        raise _fail(what, "digest() is not a stable text", "leave MethodConfig.digest alone")
    for key, f, value in _settings(config):
        spec = f.metadata.get(SPEC_KEY)
        if spec is None:
            raise _fail(
                what,
                f"setting {key} has no spec, so --set text is neither parsed nor checked",
                "declare it with oxbench.schema.setting(default, Spec, doc=...)",
            )
        try:
            again = resolve_method(config, **{key: _setting_text(value)})
        except InputError as exc:
            raise _fail(
                what,
                f"--set {key}={_setting_text(value)} (its own value) is refused: {exc}",
                "make the spec accept the text of every value the setting holds",
            ) from None
        if again.to_dict() != data:
            raise _fail(
                what,
                f"--set {key}={_setting_text(value)} (its own value) changes the config",
                "make the spec parse the text of a value back to that value",
            )
        inner = getattr(spec, "inner", spec)  # Optional(X) refuses what X refuses
        bad = _BAD_TEXT.get(type(inner).__name__)
        if bad is None:
            continue
        try:
            resolve_method(config, **{key: bad})
        except InputError as exc:
            if "\n" in str(exc) or key.rsplit(".", 1)[-1] not in str(exc):
                raise _fail(
                    what,
                    f"--set {key}={bad!r} is refused as {str(exc)!r}",
                    "a refusal is one line that names the setting",
                ) from None
        else:
            raise _fail(
                what, f"--set {key}={bad!r} is accepted", "give the setting a spec that refuses it"
            )
    try:
        resolve_method(config, no_such_setting_xyz="1")
    except InputError as exc:
        if "no_such_setting_xyz" not in str(exc) or "\n" in str(exc):
            raise _fail(
                what, f"an unknown setting is refused as {str(exc)!r}", "name it in one line"
            ) from None
    else:
        raise _fail(what, "an unknown setting is accepted", "do not override resolve_method")


def check_family(
    config: Any,
    *,
    root: str | Path | None = None,
    dataset: str = "synthetic",
    processes: bool | None = None,
) -> None:
    """Check a method family through one of its configs (sized to run on the tiny benchmark).

    Args:
        config: a :class:`~oxbench.pipelines.MethodConfig` (a preset with small settings, e.g.
            ``resolve_method("rootsift-bow", **{"vocabulary.size": 64})``).
        root: a folder for the tiny benchmark (:func:`make_tiny_root`, reused when there) and the
            check's cache; default: a temporary folder, removed afterwards.
        dataset: the benchmark the method runs on (under ``root``).
        processes: whether the two-worker run starts two worker processes; ``False``: two workers
            in this process, every job, item and result through pickle as to a process; ``None``
            (default): processes unless the check runs from a plain script (``python check.py``),
            whose worker processes would import the script again and run its checks again (a
            script without an ``if __name__ == "__main__":`` guard cannot start processes).

    Raises:
        AssertionError: what the family must fix.
    """
    import oxbench
    from oxbench.errors import require_installed
    from oxbench.pipelines.method import RetrievalMethod, RunContext, SearchResult
    from oxbench.pipelines.runner import training_set_of

    _check_config(config)
    what = f"family {config.family} preset {config.name!r}"
    require_installed(config.requires)
    with _folder(root, "oxbench-check-family-") as folder:
        data = folder.parent if root is not None else folder
        make_tiny_root(data)
        bench = oxbench.load(dataset, data, progress=False)
        train_id = training_set_of(config, dataset, None)
        train = None if train_id is None else oxbench.load(train_id, data, progress=False)
        from oxbench.execution import SerialExecutor

        runs = []
        # the second run must take every step from the first one's cache; the third starts from
        # an empty cache with two workers (the jobs must pickle) and must rank the same
        for cache, executor in [
            ("cache", SerialExecutor()),
            ("cache", SerialExecutor()),
            ("fresh-cache", _two_workers(processes)),
        ]:
            method = config.build()
            if not isinstance(method, RetrievalMethod):
                raise _fail(
                    what, f"build() returned {type(method).__name__}", "return a RetrievalMethod"
                )
            ctx = RunContext(folder / cache, executor=executor, progress=False, root=data)
            with executor:
                fitted = method.fit(train, ctx)
                indexed = method.index(bench, ctx)
                if fitted is not method or indexed is not method:
                    raise _fail(what, "fit() or index() does not return self", "return self")
                result = method.search(bench, ctx)
            if not isinstance(result, SearchResult):
                raise _fail(
                    what, f"search() returned {type(result).__name__}", "return a SearchResult"
                )
            runs.append((result, dict(ctx.steps)))
        (first, steps1), (second, steps2), (fresh, _) = runs
        n_q, n_index = bench.gt.n_queries, bench.n_index
        _check_ranks(what, first.ranks, first.scores, n_q, n_index, "search()")
        try:
            json.dumps(_plain(first.info), allow_nan=True)
        except TypeError as exc:
            raise _fail(
                what, f"SearchResult.info is not JSON-able ({exc})", "keep it plain data"
            ) from None
        if not np.array_equal(first.ranks, second.ranks):
            raise _fail(
                what,
                "a second run (from the first one's cache) ranks differently",
                "make every step deterministic and key its cache by everything that changes it",
            )
        if not np.array_equal(first.ranks, fresh.ranks):
            raise _fail(
                what,
                "a run from an empty cache with 2 worker processes ranks differently",
                "seed every random choice and make results independent of the workers",
            )
        computed = sorted(s for s, how in steps1.items() if how == "computed")
        missed = [s for s in computed if steps2.get(s) != "hit"]
        if missed:
            raise _fail(
                what,
                f"step(s) {', '.join(missed)} computed again on a second run",
                "cache each step's output and record it with ctx.record_step(step, hit=True)",
            )


def _main_is_a_plain_script() -> bool:
    """Whether ``__main__`` is a script run by path (``python check.py``): what a spawned worker
    process imports again, running its module-level code (the checks) a second time."""
    import sys

    main = sys.modules.get("__main__")
    return (
        main is not None
        and getattr(main, "__spec__", None) is None
        and getattr(main, "__file__", None) is not None
    )


def _two_workers(processes: bool | None) -> Any:
    """The executor of :func:`check_family`'s third run: two worker processes, or (``processes``
    false, or ``None`` from a plain script) two workers in this process that pickle what a process
    would receive and return."""
    from oxbench.execution import ProcessExecutor

    if processes is None:
        processes = not _main_is_a_plain_script()
    return ProcessExecutor(2, cores=2) if processes else _pickling_executor()


def _pickling_executor() -> Any:
    """Two workers in this process: each job, item and result is pickled and unpickled on its way,
    as to and from a worker process, so that a job that would not reach a process fails here
    (the class is made here: :mod:`oxbench.execution` loads only when a check runs)."""
    import pickle
    from collections.abc import Callable, Generator, Sequence

    from oxbench.execution import Executor
    from oxbench.fileio import progress_bar

    class PicklingExecutor(Executor):
        backend = "in-process, pickled"

        def __init__(self) -> None:
            super().__init__(2, cores=2)

        def map(
            self,
            job: Callable[[Any], Any],
            items: Sequence[Any],
            *,
            desc: str | None = None,
            unit: str = "item",
            progress: bool = False,
        ) -> Generator[Any, None, None]:
            def through(value: Any, what: str) -> Any:
                try:
                    return pickle.loads(pickle.dumps(value))
                except Exception as exc:
                    raise AssertionError(
                        f"the {what} of a parallel stage does not pickle ({exc}): a worker "
                        "process could not receive it; make it a module-level callable "
                        "holding plain data"
                    ) from None

            sent = through(job, "job")
            bar = progress_bar(total=len(items), desc=desc, enabled=progress, unit=unit)
            try:
                for item in items:
                    yield through(sent(through(item, "item")), "result")
                    bar.update(1)
            finally:
                bar.close()

    return PicklingExecutor()


def _plain(value: Any) -> Any:
    from oxbench.records import jsonable

    return jsonable(value)


def _check_ranks(
    what: str,
    ranks: Any,
    scores: Any,
    n_queries: int,
    n_index: int,
    source: str,
    *,
    full: bool = True,
) -> None:
    """``ranks`` int64 ``[n_queries, k]`` (``k == n_index`` and every row a permutation with
    ``full``), ``scores`` float32 aligned and finite (or ``None``)."""
    if not isinstance(ranks, np.ndarray) or ranks.dtype != np.int64 or ranks.ndim != 2:
        raise _fail(
            what,
            f"{source} ranks are {getattr(ranks, 'dtype', type(ranks).__name__)} "
            f"{getattr(ranks, 'shape', '')}",
            "return int64 [n_queries, k]",
        )
    if ranks.shape[0] != n_queries:
        raise _fail(
            what,
            f"{source} ranks {n_queries} queries as {ranks.shape[0]} rows",
            "one row per query",
        )
    if full and ranks.shape[1] != n_index:
        raise _fail(
            what, f"{source} ranks {ranks.shape[1]} of {n_index} images", "rank every image"
        )
    if ranks.size and (ranks.min() < 0 or ranks.max() >= n_index):
        raise _fail(
            what, f"{source} ranks hold positions outside 0..{n_index - 1}", "rank index positions"
        )
    ordered = np.sort(ranks, axis=1)
    if ranks.shape[1] > 1 and (np.diff(ordered, axis=1) == 0).any():
        raise _fail(
            what, f"{source} ranks an image twice in one list", "make every row a permutation"
        )
    if scores is not None:
        if (
            not isinstance(scores, np.ndarray)
            or scores.dtype != np.float32
            or scores.shape != ranks.shape
        ):
            raise _fail(
                what,
                f"{source} scores are {getattr(scores, 'dtype', type(scores).__name__)} "
                f"{getattr(scores, 'shape', '')}",
                "return float32 scores aligned with the ranks",
            )
        if not np.isfinite(scores).all():
            raise _fail(what, f"{source} scores hold NaN or inf", "return finite scores")


# ------------------------------------------------------------------------ descriptor kinds


def check_descriptor(kind: Any, *, root: str | Path | None = None, **family: Any) -> None:
    """Check a global descriptor kind: as data, and at work in the global family.

    The kind must be a frozen, hashable :class:`~oxbench.pipelines.descriptors.DescriptorKind`
    dataclass registered under its ``kind`` (:data:`~oxbench.pipelines.descriptors.DESCRIPTORS`),
    whose ``to_dict()`` is JSON with its ``kind`` and rebuilds the same kind, whose cache key is
    JSON and stable. A global method with this kind (and the ``family`` settings:
    ``whitening="pca"`` ...) then passes :func:`check_family` on the tiny benchmark -- each
    ``descriptor.<setting>`` parsed from its own text and bad text refused in one line; fit, index
    and search; the same ranks from the cache and from two worker processes -- and its describer
    gives every part ``float32 [n, D]`` finite descriptors of one dimension, the same again.

    Args:
        kind: the kind's settings (sized to run on the tiny benchmark: a small network).
        root: a folder for the tiny benchmark and the caches (default: a temporary folder).
        family: settings of the global family to run it with.

    Raises:
        AssertionError: what the kind must fix.
    """
    import oxbench
    from oxbench.pipelines.descriptors import (
        DESCRIPTORS,
        DescriptorKind,
        descriptor_from_dict,
    )
    from oxbench.pipelines.families.global_descriptors import GlobalConfig
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.runner import training_set_of
    from oxbench.pipelines.steps import part_names, parts_of

    what = f"descriptor kind {type(kind).__name__}"
    if not isinstance(kind, DescriptorKind) or not dataclasses.is_dataclass(kind):
        raise _fail(what, "is not a DescriptorKind dataclass", "subclass DescriptorKind")
    _check_frozen(what, kind)
    if (
        not kind.kind
        or kind.kind not in DESCRIPTORS
        or DESCRIPTORS.get(kind.kind) is not type(kind)
    ):
        raise _fail(
            what,
            f"is not registered as {kind.kind!r}",
            "call register_descriptor(Cls) or declare an oxbench.descriptors entry point",
        )
    data = kind.to_dict()
    try:
        text = json.dumps(data, sort_keys=True, allow_nan=False)
        key = json.dumps(kind.cache_key(), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(
            what, f"to_dict() or cache_key() is not JSON ({exc})", "keep plain data"
        ) from None
    if data.get("kind") != kind.kind:
        raise _fail(what, "to_dict() does not name its kind", "keep DescriptorKind.to_dict")
    if descriptor_from_dict(json.loads(text)) != kind:
        raise _fail(what, "to_dict() does not rebuild the same kind", "keep settings plain data")
    if json.dumps(kind.cache_key(), sort_keys=True) != key:
        raise _fail(what, "cache_key() is not stable", "derive it from the settings alone")
    config = GlobalConfig(f"check-{kind.kind}", descriptor=kind, **family)
    check_family(config, root=root)
    with _folder(root, "oxbench-check-descriptor-") as folder:
        data_root = folder.parent if root is not None else folder
        make_tiny_root(data_root)
        bench = oxbench.load("synthetic", data_root, progress=False)
        train_id = training_set_of(config, "synthetic", None)
        train = None if train_id is None else oxbench.load(train_id, data_root, progress=False)
        ctx = RunContext(folder / "cache", progress=False, root=data_root)
        describer = kind.build(config)
        if train is not None and kind.learns:
            describer.fit(train, ctx)
        dims = set()
        for part in parts_of(bench):
            for _ in range(2):
                x = describer.describe(bench, part, ctx)
                n = len(part_names(bench, part))
                if not isinstance(x, np.ndarray) or x.dtype != np.float32 or x.ndim != 2:
                    raise _fail(
                        what,
                        f"describe() of {part} gives {getattr(x, 'dtype', type(x))} "
                        f"{getattr(x, 'shape', '')}",
                        "return float32 [n, D]",
                    )
                if x.shape[0] != n or not np.isfinite(x).all():
                    raise _fail(
                        what,
                        f"describe() of {part} gives {x.shape[0]} rows for {n} images, or NaN",
                        "return one finite row per image of the part, in part order",
                    )
                dims.add(x.shape[1])
        if len(dims) != 1 or (kind.dim is not None and dims != {kind.dim}):
            raise _fail(
                what,
                f"describes parts with dimensions {sorted(dims)} (declared {kind.dim})",
                "give every image one dimension, the one dim declares",
            )


# ----------------------------------------------------------------------------- re-rankers


class SyntheticSpace:
    """A re-ranking space over grouped synthetic vectors, offering what a family may offer.

    ``n_groups`` groups of ``per_group`` database vectors around random centres, and one query per
    group near its centre; ``rank`` is the dot product, ``verify`` counts inliers from the groups
    (30 for an image of the query's group, 0 otherwise), as spatial verification would on real
    images. ``capabilities`` is what the stage under test may use.
    """

    def __init__(
        self,
        capabilities: frozenset[str] = frozenset({"vectors", "local"}),
        *,
        n_groups: int = 5,
        per_group: int = 24,
        dim: int = 16,
        seed: int = 0,
    ) -> None:
        rng = np.random.default_rng(seed)
        centres = rng.standard_normal((n_groups, dim)).astype(np.float32)
        self.groups = np.repeat(np.arange(n_groups), per_group)
        db = centres[self.groups] + 0.8 * rng.standard_normal((len(self.groups), dim)).astype(
            np.float32
        )
        q = centres + 0.8 * rng.standard_normal((n_groups, dim)).astype(np.float32)
        self._capabilities = frozenset(capabilities)
        self._db = (db / np.linalg.norm(db, axis=1, keepdims=True)).astype(np.float32)
        self.queries = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
        self.query_groups = np.arange(n_groups)

    @property
    def capabilities(self) -> frozenset[str]:
        return self._capabilities

    @property
    def database(self) -> NDArray[np.float32]:
        return self._db

    def rank(self, queries: Any) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """``(scores, ranks)`` of every database vector, best first (ties by position)."""
        scores = np.atleast_2d(np.asarray(queries, np.float32)) @ self._db.T  # one row: 1-D too
        ranks = np.argsort(-scores, axis=1, kind="stable").astype(np.int64)
        return np.take_along_axis(scores, ranks, axis=1).astype(np.float32), ranks

    def first_ranking(self, *, verified: bool = False, top_r: int = 20) -> Any:
        """The ranking a family hands its first stage (``info["first"]`` set); with ``verified``,
        as after spatial verification of the top ``top_r`` (verified images first, by inliers)."""
        from oxbench.pipelines.rerankers import Ranking, aligned_to_index
        from oxbench.pipelines.steps.verify import verified_first

        scores, ranks = self.rank(self.queries)
        if not verified:
            return Ranking(ranks, scores, self.queries, info={"first": True})
        results = self.verify(ranks, top_r, None)
        by_index = aligned_to_index(ranks, scores, ranks.shape[1])
        final, final_scores = np.empty_like(ranks), np.empty_like(scores)
        for qi, res in enumerate(results):
            final[qi], final_scores[qi] = verified_first(
                ranks[qi], by_index[qi], res.verified, res.inliers
            )
        from oxbench.refinement.spatial import Verification

        return Ranking(
            final,
            final_scores,
            self.queries,
            tuple(results),
            info={"first": True},
            verification=Verification(),
        )

    @property
    def dense_database(self) -> NDArray[np.float32]:
        """``"dense"``: the database vectors (the space's own)."""
        return self._db

    def dense_queries(self, ranking: Any) -> NDArray[np.float32]:
        """``"dense"``: the (expanded) query vectors of the ranking so far."""
        return np.asarray(ranking.queries, np.float32)

    def use_database(self, database: Any) -> None:
        """``"augment"``: replace the database vectors (an index-phase stage does)."""
        self._db = np.asarray(database, np.float32)

    def verified_neighbours(self, r: int, ctx: Any, settings: Any = None) -> NDArray[np.int64]:
        """``"augment"`` with ``"local"``: each database image's top ``r`` others by its vector,
        those of its own group "verified" (``-1`` pads)."""
        scores = self._db @ self._db.T
        np.fill_diagonal(scores, -np.inf)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :r]
        out = np.full(top.shape, -1, np.int64)
        for i, row in enumerate(top):
            same = row[self.groups[row] == self.groups[i]]
            out[i, : len(same)] = same
        return out

    def verify(
        self,
        ranks: NDArray[np.int64],
        r: int,
        ctx: Any,
        settings: Any = None,
        *,
        rows: dict[int, NDArray[np.int64]] | None = None,
        stage: str = "spatial",
    ) -> list[Any]:
        """Each query's top ``r`` (or its list in ``rows``) verified by the groups (``settings``:
        the verification's, unread: the groups are the truth)."""
        from oxbench.pipelines.steps.verify import VerifiedList

        out = []
        for qi in range(ranks.shape[0]):
            head = np.asarray(
                rows[qi] if rows is not None and qi in rows else ranks[qi, :r], np.int64
            )
            group = self.query_groups[qi % len(self.query_groups)]
            inliers = np.where(self.groups[head] == group, 30, 0).astype(np.int64)
            order = np.argsort(-inliers, kind="stable")
            keep = order[inliers[order] > 0]
            out.append(
                VerifiedList(head[order].copy(), head[keep].copy(), inliers[keep].copy(), {})
            )
        return out


def _reranker_stage(cls: Any, settings: Any) -> Any:
    """The stage ``cls`` built from ``settings`` (default: its settings' defaults), after checking
    its settings class: a frozen dataclass whose every field declares its spec (type, range, doc)
    and whose defaults construct, and that refuses NaN in one line naming ``stage.setting`` --
    what ``--set stage.setting=...`` relies on."""
    from oxbench.errors import InputError
    from oxbench.schema import SPEC_KEY, parse

    what = f"re-ranker {cls.__name__}"
    scls = cls.settings_type
    if scls is None:
        return cls()
    params = getattr(scls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise _fail(what, "its settings_type is not a frozen dataclass", "@dataclass(frozen=True)")
    stage = cls.name or "stage"
    for f in dataclasses.fields(scls):
        label = f"{stage}.{f.name}"
        if SPEC_KEY not in f.metadata:
            raise _fail(
                what,
                f"setting {label} declares no spec",
                "declare it with oxbench.schema.setting(default, spec, doc=...)",
            )
        spec = f.metadata[SPEC_KEY]
        if spec.kind in ("int", "float", "size"):
            try:
                parse(scls, f.name, "nan", label=label)
            except InputError as exc:
                if "\n" in str(exc) or label not in str(exc):
                    raise _fail(
                        what, f"{label}=nan: {exc}", "one line naming stage.setting"
                    ) from None
            else:
                raise _fail(what, f"{label} takes nan", "a range check that refuses NaN")
    try:
        values = settings if settings is not None else scls()
    except Exception as exc:  # noqa: BLE001 - reported as what the plugin must fix
        raise _fail(
            what, f"its settings have no valid defaults ({exc})", "give every setting a default"
        ) from None
    return cls(values)


def check_reranker(cls: type, settings: Any = None) -> None:
    """Check a re-ranking stage on a synthetic space (:class:`SyntheticSpace`).

    Args:
        cls: a :class:`~oxbench.pipelines.rerankers.Reranker` subclass.
        settings: an instance of its ``settings_type`` the stage is built from (default: its
            defaults).

    Raises:
        AssertionError: what the stage must fix.
    """
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.rerankers import Ranking, Reranker

    what = f"re-ranker {getattr(cls, '__name__', cls)!r}"
    if not isinstance(cls, type) or not issubclass(cls, Reranker):
        raise _fail(
            what, "is not a Reranker subclass", "subclass oxbench.pipelines.rerankers.Reranker"
        )
    from oxbench.pipelines.rerankers import CAPABILITY_WORDS

    if not isinstance(cls.needs, frozenset) or not cls.needs <= set(CAPABILITY_WORDS):
        raise _fail(
            what,
            f"needs {cls.needs!r}",
            f"declare needs as a frozenset of {', '.join(sorted(CAPABILITY_WORDS))}",
        )
    if cls.phase not in ("query", "index"):
        raise _fail(what, f"phase {cls.phase!r}", "phase 'query' or 'index'")
    results = []
    with tempfile.TemporaryDirectory(prefix="oxbench-check-reranker-") as tmp:
        for _ in range(2):
            space = SyntheticSpace(cls.needs)
            stage = _reranker_stage(cls, settings)
            if not isinstance(stage, cls):
                raise _fail(what, f"its settings built a {type(stage).__name__}", "return cls(...)")
            ctx = RunContext(Path(tmp) / "cache", progress=False)
            shape = space.database.shape
            facts = stage.prepare(space, ctx)
            if not isinstance(facts, Mapping):
                raise _fail(
                    what, "prepare() returned no mapping", "return a dict of facts ({} for none)"
                )
            db = np.asarray(space.database)
            if db.shape != shape or not np.isfinite(db).all():
                raise _fail(
                    what,
                    f"prepare() left a database of shape {db.shape} (was {shape}) or non-finite",
                    "an index-phase stage replaces the vectors one for one, finite",
                )
            ranking = space.first_ranking(verified="local" in cls.needs)
            ranks, scores = ranking.ranks, ranking.scores
            before = ranks.copy(), scores.copy()
            out = stage.rerank(ranking, space, ctx)
            if not isinstance(out, Ranking):
                raise _fail(what, f"rerank() returned {type(out).__name__}", "return a Ranking")
            if not (np.array_equal(ranks, before[0]) and np.array_equal(scores, before[1])):
                raise _fail(
                    what, "rerank() changed the ranking it was given", "copy before changing"
                )
            _check_ranks(
                what, out.ranks, out.scores, len(space.queries), len(space.database), "rerank()"
            )
            try:
                json.dumps(_plain({**facts, **out.info}))
            except TypeError as exc:
                raise _fail(
                    what, f"its facts or info are not JSON-able ({exc})", "keep them plain data"
                ) from None
            if out.info.get("first") is not True:
                raise _fail(
                    what,
                    "rerank() dropped the info of the stages before it",
                    "keep {**ranking.info, ...}",
                )
            results.append(out)
    if not (
        np.array_equal(results[0].ranks, results[1].ranks)
        and np.array_equal(results[0].scores, results[1].scores)
    ):
        raise _fail(
            what, "a second run ranks differently", "make the stage deterministic (seed it)"
        )


# --------------------------------------------------------------------- local extractors


def _textured_image(height: int = 240, width: int = 320, seed: int = 0) -> NDArray[np.uint8]:
    """An RGB test image with corners and texture at every scale (seeded)."""
    rng = np.random.default_rng(seed)
    image = np.full((height, width, 3), 128, np.uint8)
    for _ in range(40):
        x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
        w, h = int(rng.integers(8, 60)), int(rng.integers(8, 60))
        image[y0 : y0 + h, x0 : x0 + w] = rng.integers(0, 256, 3, dtype=np.uint8)
    noise = rng.integers(-10, 11, image.shape)
    return np.clip(image.astype(np.int16) + noise, 0, 255).astype(np.uint8)


def check_local_extractor(extractor: Any, *, root: str | Path | None = None) -> None:
    """Check a local-feature extractor on synthetic images and through the feature store.

    Args:
        extractor: a :class:`~oxbench.features.local.LocalExtractor` (its settings object).
        root: a folder for the tiny benchmark and the store (default: a temporary folder).

    Raises:
        AssertionError: what the extractor must fix.
    """
    from oxbench.features.local import LocalExtractor, LocalFeatures

    what = f"local extractor {type(extractor).__name__}"
    if not isinstance(extractor, LocalExtractor):
        missing = [
            a
            for a in ("dim", "stored_dtype", "to_dict", "digest", "extract", "finish")
            if not hasattr(extractor, a)
        ]
        raise _fail(
            what, f"lacks {', '.join(missing)}", "implement oxbench.features.local.LocalExtractor"
        )
    try:
        hash(extractor)
    except TypeError as exc:
        raise _fail(what, f"is not hashable ({exc})", "make it a frozen dataclass") from None
    if dataclasses.is_dataclass(extractor) and not type(extractor).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise _fail(what, "is not frozen", "declare it @dataclass(frozen=True)")
    settings = extractor.to_dict()
    try:
        json.dumps(settings, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise _fail(what, f"to_dict() is not JSON ({exc})", "keep settings plain data") from None
    if not isinstance(settings.get("kind"), str) or not settings["kind"]:
        raise _fail(what, "to_dict() has no 'kind'", "name the extractor in to_dict()['kind']")
    digest = extractor.digest()
    if not isinstance(digest, str) or not digest or digest != extractor.digest():
        raise _fail(
            what, "digest() is not a stable text", "hash to_dict() (it names the store folder)"
        )
    dim, dtype = extractor.dim, np.dtype(extractor.stored_dtype)
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise _fail(what, f"dim is {dim!r}", "declare the descriptor dimension as a positive int")
    image = _textured_image()
    h, w = image.shape[:2]
    runs = [extractor.extract(image.copy()) for _ in range(2)]
    for kp, desc in runs:
        if (
            not isinstance(kp, np.ndarray)
            or kp.dtype != np.float32
            or kp.ndim != 2
            or kp.shape[1] != 4
        ):
            raise _fail(
                what,
                f"extract() keypoints are {getattr(kp, 'dtype', '?')} {getattr(kp, 'shape', '')}",
                "return float32 [n, 4] (x, y, size, angle)",
            )
        if not isinstance(desc, np.ndarray) or desc.dtype != dtype or desc.shape != (len(kp), dim):
            raise _fail(
                what,
                f"extract() descriptors are {getattr(desc, 'dtype', '?')} {getattr(desc, 'shape', '')}",
                f"return {dtype} [{len(kp)}, {dim}] as stored_dtype and dim declare",
            )
    kp, desc = runs[0]
    if len(kp) == 0:
        raise _fail(
            what, "extract() finds nothing on a textured 320 x 240 image", "detect features"
        )
    if (
        not np.isfinite(kp).all()
        or (kp[:, 0] < 0).any()
        or (kp[:, 1] < 0).any()
        or (kp[:, 0] > w).any()
        or (kp[:, 1] > h).any()
    ):
        raise _fail(
            what,
            "extract() puts keypoints outside the image (or NaN)",
            "return pixel coordinates of the image",
        )
    if not (np.array_equal(kp, runs[1][0]) and np.array_equal(desc, runs[1][1])):
        raise _fail(
            what, "extract() of the same image differs between calls", "make it deterministic"
        )
    finished = extractor.finish(desc)
    if (
        not isinstance(finished, np.ndarray)
        or finished.dtype != np.float32
        or finished.shape != (len(kp), dim)
    ):
        raise _fail(
            what,
            f"finish() returns {getattr(finished, 'dtype', '?')} {getattr(finished, 'shape', '')}",
            f"return float32 [n, {dim}]",
        )
    if not np.isfinite(finished).all():
        raise _fail(what, "finish() returns NaN or inf", "return finite descriptors")
    LocalFeatures(kp, finished, (w, h))  # the one shape the pipelines exchange
    flat_kp, flat_desc = extractor.extract(np.full((h, w, 3), 90, np.uint8))
    if len(flat_kp) != 0 or flat_desc.shape != (0, dim) or flat_desc.dtype != dtype:
        raise _fail(
            what,
            f"extract() of a flat image gives {flat_kp.shape[0]} features, descriptors {flat_desc.dtype} {flat_desc.shape}",
            f"return [0, 4] keypoints and {dtype} [0, {dim}] descriptors",
        )
    _check_extractor_store(what, extractor, root)


def _check_extractor_store(what: str, extractor: Any, root: str | Path | None) -> None:
    """The extractor through the pipelines' feature step: stored, read back, a hit the second time."""
    import oxbench
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.steps import open_store, step_features

    with _folder(root, "oxbench-check-local-") as folder:
        data = folder.parent if root is not None else folder
        make_tiny_root(data)
        bench = oxbench.load("synthetic", data, progress=False)
        ctx = RunContext(folder / "cache", progress=False)
        first = step_features(bench, extractor, ctx, parts=["database"])["database"]
        again = step_features(bench, extractor, ctx, parts=["database"])["database"]
        if first.hit or not again.hit:
            raise _fail(
                what,
                "the feature store is not reused on a second extraction",
                "keep to_dict()/digest() stable",
            )
        store = open_store(ctx.cache, bench, extractor, "database")
        name = bench.gt.db_names[0]
        feats = store.get(name)
        if feats.dim != extractor.dim or feats.descriptors.dtype != np.float32:
            raise _fail(
                what,
                f"the store reads back {feats.dim}-D {feats.descriptors.dtype}",
                "declare dim as extracted",
            )


# ----------------------------------------------------------------------------- executors


class _Job:
    """A picklable job: a seeded random matrix product per item (fails on ``fail_on``)."""

    def __init__(self, size: int = 24, fail_on: int | None = None) -> None:
        self.size, self.fail_on = size, fail_on

    def __call__(self, item: int) -> tuple[int, NDArray[np.float64]]:
        if item == self.fail_on:
            raise ValueError(f"oxbench.testing: item {item} fails on purpose")
        rng = np.random.default_rng(item)
        a = rng.standard_normal((self.size, self.size))
        return item, a @ a.T


def check_executor(executor_or_factory: Any, *, workers: int = 2) -> None:
    """Check an execution backend against the serial one.

    Args:
        executor_or_factory: an :class:`~oxbench.execution.Executor`, or a class / callable that
            makes one from ``workers`` (it is closed at the end).
        workers: the workers a factory is given.

    Raises:
        AssertionError: what the backend must fix.
    """
    from oxbench.execution import Executor, SerialExecutor

    executor = executor_or_factory
    if not isinstance(executor, Executor) and callable(executor):
        executor = executor(workers)
    what = f"executor {type(executor).__name__}"
    if not isinstance(executor, Executor):
        raise _fail(what, "is not an Executor", "subclass oxbench.execution.Executor")
    if not isinstance(executor.backend, str) or not executor.backend:
        raise _fail(what, "has no backend name", "set the class attribute backend = '...'")
    try:
        if (
            not isinstance(executor.workers, int)
            or executor.workers < 1
            or executor.threads_per_worker < 1
        ):
            raise _fail(
                what,
                f"has {executor.workers!r} workers x {executor.threads_per_worker!r} threads",
                "call Executor.__init__",
            )
        facts = executor.describe()
        try:
            json.dumps(_plain(facts))
        except TypeError as exc:
            raise _fail(
                what, f"describe() is not JSON-able ({exc})", "keep it plain data"
            ) from None
        if facts.get("backend") != executor.backend:
            raise _fail(what, "describe() does not name its backend", "extend super().describe()")
        from oxbench.errors import InputError
        from oxbench.records import ExecutionFacts

        try:  # what a run records of it is read back as it was written
            recorded = json.loads(json.dumps(_plain(facts)))
            if ExecutionFacts.from_dict(recorded).to_dict() != recorded:
                raise InputError("its facts do not read back as written")
        except InputError as exc:
            raise _fail(
                what,
                f"a run record of its describe() does not read back ({exc.problem})",
                "give backend, workers and threads_per_worker; check facts of your own in "
                "check_facts",
            ) from None
        items = list(range(13))
        expected = list(SerialExecutor().map(_Job(), items))
        got = list(executor.map(_Job(), items, desc=None))
        if [i for i, _ in got] != items:
            raise _fail(
                what,
                f"map() returns items in the order {[i for i, _ in got]}",
                "yield results in item order",
            )
        if not all(np.array_equal(a, b) for (_, a), (_, b) in zip(expected, got, strict=True)):
            raise _fail(what, "map() results differ from the serial ones", "run the job unchanged")
        if list(executor.map(_Job(), [])) != []:
            raise _fail(what, "map() of no items yields something", "yield nothing")
        try:
            list(executor.map(_Job(fail_on=3), items))
        except Exception:  # noqa: BLE001 - any error the backend raises will do, not silence
            pass
        else:
            raise _fail(
                what, "an item that raises is not reported", "raise the job's error from map()"
            )
        stage = executor.map(_Job(), items)
        next(stage)
        stage.close()  # a stage left early ...
        after = [i for i, _ in executor.map(_Job(), [5, 6, 7])]  # ... and the next one still runs
        if after != [5, 6, 7]:
            raise _fail(
                what,
                f"a stage after one left early returns {after}",
                "stop the queued work of a closed map",
            )
        with tempfile.TemporaryDirectory() as tmp:
            executor.check_paths({"scratch": tmp})
    finally:
        executor.close()
    executor.close()  # twice is harmless


# ------------------------------------------------------------------------------ datasets


def _perfect_ranks(gt: Any) -> NDArray[np.int64]:
    """Per query: its positives, then its ignored images, then the rest (a list scoring 1)."""
    rows = []
    for q in gt.queries:
        positives = np.union1d(q.positives, q.good).astype(np.int64)
        first = np.concatenate([positives, np.setdiff1d(q.junk, positives)])
        rest = np.setdiff1d(np.arange(gt.n_db), first)
        rows.append(np.concatenate([first, rest]))
    return np.stack(rows).astype(np.int64)


def _check_result(what: str, gt: Any, result: Any) -> None:
    """A perfect ranking's result: 1 in every setup, lines, table and JSON read back."""
    protocol = gt.protocol
    if set(result.setups) != set(protocol.setups):
        raise _fail(
            what, f"result setups {sorted(result.setups)}", f"the protocol's are {protocol.setups}"
        )
    for name, s in result.setups.items():
        if not np.isclose(s.map, 1.0):
            raise _fail(
                what,
                f"a perfect ranking (positives first) scores {s.map!r} in setup {name!r}",
                "the ground truth's positives must be the ones its protocol counts",
            )
    lines = result.lines()
    if not lines or not all(isinstance(ln, str) and ln.startswith(gt.dataset) for ln in lines):
        raise _fail(what, f"printed lines {lines!r}", "each line starts with the dataset id")
    from oxbench.report.tables import result_table

    if not isinstance(result_table(result), str):
        raise _fail(what, "the table is not text", "Protocol.table returns header and rows")
    payload = json.loads(json.dumps(result.to_dict()))
    columns: dict[str, dict[str, NDArray[np.float64]]] = {}
    for name, s in result.setups.items():
        cols = {"ap": np.asarray(s.ap, np.float64)}
        cols |= {f"p@{k}": s.p_at_k[:, j] for j, k in enumerate(result.ks)}
        if s.per_query_score is not None:
            cols["score"] = s.per_query_score
        cols |= dict(s.extra)
        columns[name] = cols
    from oxbench.records import sequential_mean

    for label, stored, setup, column in protocol.stored_means(payload, columns):
        if column not in columns[setup]:
            continue
        if not np.isclose(float(stored), sequential_mean(columns[setup][column]), atol=1e-9):
            raise _fail(
                what,
                f"metrics JSON {label} is {stored!r}, its per-query values give another mean",
                "Protocol.stored_means must read back what result_dict writes",
            )
    from oxbench.protocol import number_text

    headline = protocol.headline(number_text(lambda s, m: 1.0))
    if not headline.startswith(protocol.headline_metric.label):
        raise _fail(what, f"headline {headline!r}", "Protocol.headline writes the compact line")


def _run_on_random_descriptors(what: str, spec_id: str, bench: Any, base: Path) -> None:
    """``oxbench.run(<id>, "features")`` on random descriptors named by image; the record reads back."""
    from oxbench import RecordOptions, Session, run
    from oxbench.records import RunRecord

    rng = np.random.default_rng(0)
    files = {}
    for part, names in (("db", bench.gt.db_names), ("query", bench.gt.query_names)):
        x = rng.standard_normal((len(names), 8)).astype(np.float32)
        (base / f"{part}_names.txt").write_text("".join(f"{n}\n" for n in reversed(names)))
        np.save(base / f"{part}.npy", x[::-1].copy())
        files[f"descriptor.{part}_features"] = str(base / f"{part}.npy")
        files[f"descriptor.{part}_names"] = str(base / f"{part}_names.txt")
    outcome = run(
        spec_id,
        "features",
        Session(root=base, progress=False, strict=False, engine="serial"),
        RecordOptions(runs_dir=base / "runs"),
        overrides=files,
    )
    record = RunRecord.load(outcome.run_dir)
    if record.protocol != bench.gt.protocol or record.n_queries != bench.gt.n_queries:
        raise _fail(what, "the run record names another protocol or query count", "report it")
    if not record.headline().startswith(bench.gt.protocol.headline_metric.label):
        raise _fail(what, f"the run's headline {record.headline()!r}", "report it")


def check_dataset(dataset: Any, *, root: str | Path | None = None, run: bool = True) -> None:
    """Check a dataset entry and its family (see the module docstring).

    Args:
        dataset: a catalog id or its :class:`~oxbench.datasets.spec.DatasetSpec`.
        root: a folder to work in (default: a temporary folder, removed after).
        run: also run the ``features`` method on the example copy (a few seconds).

    Raises:
        AssertionError: what the entry or its family must fix.
    """
    from oxbench.datasets.catalog import DATASETS
    from oxbench.datasets.spec import DatasetSpec

    spec = dataset if isinstance(dataset, DatasetSpec) else DATASETS.get(str(dataset))
    logger = logging.getLogger("oxbench")
    level = logger.level
    logger.setLevel(logging.ERROR)  # the example's counts are not the official ones: no warnings
    try:
        _check_dataset(spec, root=root, run=run)
    finally:
        logger.setLevel(level)


def _check_dataset(spec: Any, *, root: str | Path | None, run: bool) -> None:
    from oxbench.datasets import load, load_ground_truth, verify
    from oxbench.datasets.catalog import DATASETS
    from oxbench.datasets.spec import DatasetFamily, Placement
    from oxbench.errors import InputError
    from oxbench.groundtruth import GroundTruth
    from oxbench.pipelines.steps import gt_digest
    from oxbench.protocol import get_protocol

    what = f"dataset {spec.id}"
    if spec.id not in DATASETS or DATASETS.get(spec.id) is not spec:
        raise _fail(
            what,
            "not in the catalog under its id",
            "register it (oxbench.datasets.catalog.register)",
        )
    if not isinstance(spec.family, DatasetFamily):
        raise _fail(what, f"family {spec.family!r}", "a DatasetFamily subclass")
    for p in spec.protocols:
        try:
            get_protocol(p)
        except InputError as exc:
            raise _fail(
                what, str(exc), "register the protocol (oxbench.protocol.register_protocol)"
            ) from None
    if not all(isinstance(p, Placement) for p in spec.layout):
        raise _fail(
            what, "layout holds other than Placements", "DatasetFamily.layout returns Placements"
        )
    if spec.n_images < 0 or spec.n_queries < 0:
        raise _fail(what, "negative counts", "n_images and n_queries count images")
    with _folder(root, "oxbench-check-dataset-") as base:
        if not spec.synthetic:
            try:
                load_ground_truth(spec.id, base)
                raise _fail(
                    what, "loads with nothing on disk", "refuse a missing copy with the remedy"
                )
            except InputError as exc:
                if "\n" in str(exc) or spec.id not in str(exc):
                    raise _fail(
                        what, f"a missing copy says {str(exc)!r}", "one line naming the dataset"
                    ) from None
        ddir = base / spec.id
        spec.family.write_example(spec, ddir)
        missing = [f for f in spec.family.required_files(spec) if not (ddir / f).exists()]
        if missing:
            raise _fail(what, f"the example copy lacks {missing}", "write_example writes them")
        if not spec.protocols:  # a distractor set: attached after a benchmark it belongs with
            if not spec.distractors_for:
                raise _fail(
                    what, "no protocol and no distractors_for", "name the benchmarks it serves"
                )
            other = DATASETS.get(spec.distractors_for[0])
            other.family.write_example(other, base / other.id)
            bench = load(other.id, base, distractors=spec.id, strict=False, progress=False)
            if bench.n_distractors == 0 or bench.distractors is None:
                raise _fail(what, "no distractor attached", "the example copy holds images")
            image = bench.distractors.read(0)
            if image.ndim != 3 or image.dtype != np.uint8:
                raise _fail(what, "a distractor does not read as H x W x 3 uint8", "report it")
            return
        gt = load_ground_truth(spec.id, base, strict=False)
        if not isinstance(gt, GroundTruth) or str(gt.protocol) not in spec.protocols:
            raise _fail(
                what,
                f"ground truth of protocol {getattr(gt, 'protocol', None)}",
                f"one of {spec.protocols}",
            )
        gt.validate()
        if gt.n_queries < 1 or gt.n_db < 1:
            raise _fail(
                what, "the example has no query or no database image", "write_example writes both"
            )
        if gt_digest(load_ground_truth(spec.id, base, strict=False)) != gt_digest(gt):
            raise _fail(
                what, "two readings of the ground truth differ", "read it deterministically"
            )
        bench = load(spec.id, base, strict=False, progress=False)
        if bench.gt.db_names != gt.db_names or bench.gt.query_names != gt.query_names:
            raise _fail(what, "load and load_ground_truth disagree", "build both from one reader")
        if len(bench.database) != gt.n_db or len(bench.queries) != gt.n_queries:
            raise _fail(
                what, "image sets of other lengths than the ground truth", "one image per name"
            )
        if any(bench.database.name(i) != gt.db_names[i] for i in range(gt.n_db)):
            raise _fail(what, "database image names out of the ground truth's order", "same order")
        for images in (bench.database, bench.queries):
            pixels = images.read(0)
            if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
                raise _fail(what, "an image does not read as H x W x 3 uint8", "report it")
        unread = load(spec.id, base, strict=False, progress=False, images=False)
        if unread.gt.db_names != gt.db_names or unread.gt.query_names != gt.query_names:
            raise _fail(what, "load(images=False) gives other names", "read the same ground truth")
        from oxbench.evaluation import evaluate

        _check_result(what, gt, evaluate(gt, _perfect_ranks(gt)))
        report = verify(spec.id, base, progress=False)  # a subset: images may be missing
        if report.corrupt or report.ground_truth:
            raise _fail(
                what,
                f"verify of the example: corrupt {report.corrupt[:3]}, ground truth "
                f"{report.ground_truth[:3]}",
                "verify_plan reads the ground truth the example holds",
            )
        test = spec.family.image_test(spec, ddir)
        if not isinstance(test("jpg/x.jpg"), bool):
            raise _fail(what, "image_test does not answer True or False", "return a bool")
        if run:
            _run_on_random_descriptors(what, spec.id, bench, base)
