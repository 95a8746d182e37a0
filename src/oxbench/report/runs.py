"""Reading run records: the one reader behind ``compare``, ``report``, ``plot``, ``view`` and ``export``.

A run record is the folder one execution of ``oxbench run`` writes (format 1)::

    runs/<dataset>-<method>-<config digest>/     config folder (stable for one resolved config)
        config.json
        <run id>/                                one execution: UTC "YYYYMMDDTHHMMSSZ-<4 hex>"
            record.json  config.json  dataset.json  ranks.npy  [scores.npy]  metrics.json
            per_query.json  per_query.csv  retrieved.json  timings.json  summary.txt  run.log
            [matches.json]

:meth:`RunRecord.load` takes a run-id folder, or a config folder (then its latest run). Everything
it returns has been checked: a folder missing a file, of another format version, of a run that did
not complete, or with files that disagree on the number of queries is refused with one
:class:`~oxbench.errors.InputError` line naming the file.

Per-query numbers come from ``per_query.json``; setup means are recomputed from them in the same
order as the official loops, so they equal ``metrics.json`` exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.fileio import read_input_bytes

#: The run-record format this reader understands (``record.json`` ``"format"``).
RUN_FORMAT = 1

#: Files every complete run folder holds (``scores.npy`` and ``matches.json`` are optional).
RUN_FILES = (
    "record.json", "config.json", "dataset.json", "ranks.npy", "metrics.json", "per_query.json",
    "per_query.csv", "retrieved.json", "timings.json", "summary.txt", "run.log",
)

RUN_ID_PATTERN = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{4}")

#: Per protocol: setup -> (positive labels, ignored labels) of ``retrieved.json``'s vocabulary.
SETUP_LABELS: dict[str, dict[str, tuple[frozenset[str], frozenset[str]]]] = {
    "revisited": {
        "easy": (frozenset({"easy"}), frozenset({"hard", "junk"})),
        "medium": (frozenset({"easy", "hard"}), frozenset({"junk"})),
        "hard": (frozenset({"hard"}), frozenset({"easy", "junk"})),
    },
    "original": {"original": (frozenset({"positive"}), frozenset({"junk"}))},
    "holidays": {"holidays": (frozenset({"positive"}), frozenset({"junk"}))},
    "ukbench": {"ukbench": (frozenset({"positive"}), frozenset({"junk"}))},
}

_JSON_LIMIT = 2 << 30


def _read_json(path: Path) -> Any:
    data = read_input_bytes(path, limit=_JSON_LIMIT)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", path) from None


def _need(cond: bool, message: str, path: Path) -> None:
    if not cond:
        raise InputError(message, path)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def latest_run(config_dir: Path) -> Path:
    """The newest run-id folder (run ids sort by time) of a config folder.

    Raises:
        InputError: the folder holds no run-id folder.
    """
    try:
        ids = sorted(p.name for p in config_dir.iterdir() if RUN_ID_PATTERN.fullmatch(p.name) and p.is_dir())
    except OSError as exc:
        raise InputError(f"cannot list the folder ({exc.strerror or exc})", config_dir) from None
    if not ids:
        raise InputError(
            "not a run folder: no record.json, and no run-id folder (YYYYMMDDTHHMMSSZ-xxxx) inside",
            config_dir,
        )
    return config_dir / ids[-1]


@dataclass(frozen=True, eq=False)
class QueryRetrieved:
    """One query's stored top-k (from ``retrieved.json``).

    Attributes:
        index: query index (column of ``ranks.npy``).
        name: query image name.
        id: the query's id where the protocol has one (original Oxford/Paris: ``all_souls_1``),
            else ``None``.
        image: absolute path of the full query image, or ``None``.
        bbox: ``(x1, y1, x2, y2)`` in full-image pixels, or ``None``.
        n_labelled: per label, how many database images the ground truth gives it.
        top: the retrieved images, best first: dicts with ``rank`` (1-based), ``index``, ``name``,
            ``image`` (path or ``None``), ``score`` (float or ``None``) and ``label``.
    """

    index: int
    name: str
    image: str | None
    bbox: tuple[float, float, float, float] | None
    n_labelled: Mapping[str, int]
    top: tuple[Mapping[str, Any], ...]
    id: str | None = None


def _parse_retrieved(obj: Any, n_queries: int, path: Path) -> tuple[str, int, tuple[str, ...], tuple[QueryRetrieved, ...]]:
    _need(isinstance(obj, dict), "expected a JSON object", path)
    protocol = obj.get("protocol")
    _need(protocol in SETUP_LABELS, f"unknown protocol {protocol!r}", path)
    k = obj.get("k")
    _need(_is_int(k) and k >= 1, f"'k' must be a positive integer, got {k!r}", path)
    labels = obj.get("labels")
    _need(isinstance(labels, list) and all(isinstance(x, str) for x in labels), "'labels' must be a list of strings", path)
    queries = obj.get("queries")
    _need(isinstance(queries, list), "'queries' must be a list", path)
    _need(
        len(queries) == n_queries,
        f"holds {len(queries)} queries but dataset.json says {n_queries}",
        path,
    )
    vocab = set(labels)
    out: list[QueryRetrieved] = []
    for qi, q in enumerate(queries):
        where = f"query {qi}"
        _need(isinstance(q, dict), f"{where}: expected an object", path)
        _need(q.get("index") == qi, f"{where}: 'index' is {q.get('index')!r}, expected {qi}", path)
        name = q.get("name")
        _need(isinstance(name, str) and name != "", f"{where}: 'name' must be a non-empty string", path)
        image = q.get("image")
        _need(image is None or isinstance(image, str), f"{where}: 'image' must be a path or null", path)
        bbox = q.get("bbox")
        _need(
            bbox is None or (isinstance(bbox, list) and len(bbox) == 4 and all(_is_num(v) for v in bbox)),
            f"{where}: 'bbox' must be [x1, y1, x2, y2] or null",
            path,
        )
        n_lab = q.get("n_labelled", {})
        _need(
            isinstance(n_lab, dict) and all(isinstance(a, str) and _is_int(b) and b >= 0 for a, b in n_lab.items()),
            f"{where}: 'n_labelled' must map labels to counts",
            path,
        )
        top = q.get("top")
        _need(isinstance(top, list) and len(top) <= k, f"{where}: 'top' must be a list of at most k={k} entries", path)
        seen: set[int] = set()
        for j, t in enumerate(top):
            tw = f"{where}, rank {j + 1}"
            _need(isinstance(t, dict), f"{tw}: expected an object", path)
            _need(t.get("rank") == j + 1, f"{tw}: 'rank' is {t.get('rank')!r}, expected {j + 1}", path)
            idx = t.get("index")
            _need(_is_int(idx) and idx >= 0 and idx not in seen, f"{tw}: 'index' must be a new non-negative integer", path)
            seen.add(idx)
            _need(isinstance(t.get("name"), str) and t["name"] != "", f"{tw}: 'name' must be a non-empty string", path)
            _need(t.get("image") is None or isinstance(t.get("image"), str), f"{tw}: 'image' must be a path or null", path)
            _need(t.get("score") is None or _is_num(t.get("score")), f"{tw}: 'score' must be a number or null", path)
            _need(t.get("label") in vocab, f"{tw}: label {t.get('label')!r} is not one of {labels}", path)
        out.append(
            QueryRetrieved(
                index=qi,
                name=name,
                image=image,
                bbox=None if bbox is None else (float(bbox[0]), float(bbox[1]), float(bbox[2]), float(bbox[3])),
                n_labelled=dict(n_lab),
                top=tuple(top),
                id=q.get("id") if isinstance(q.get("id"), str) else None,
            )
        )
    return str(protocol), int(k), tuple(labels), tuple(out)


def _parse_per_query(rows: Any, n_queries: int, path: Path) -> dict[str, dict[str, NDArray[np.float64]]]:
    """setup -> column ("ap", "p@10", "n_positives", ...) -> array over queries (nan for null)."""
    _need(isinstance(rows, list) and len(rows) > 0, "expected a non-empty list of rows", path)
    out: dict[str, dict[str, NDArray[np.float64]]] = {}
    seen: set[tuple[str, int]] = set()
    for i, row in enumerate(rows):
        where = f"row {i}"
        _need(isinstance(row, dict), f"{where}: expected an object", path)
        setup, qi = row.get("setup"), row.get("query_index")
        _need(isinstance(setup, str), f"{where}: 'setup' must be a string", path)
        _need(_is_int(qi) and 0 <= qi < n_queries, f"{where}: 'query_index' must be 0..{n_queries - 1}", path)
        _need((setup, qi) not in seen, f"{where}: setup {setup!r} query {qi} is listed twice", path)
        seen.add((setup, qi))
        _need("ap" in row, f"{where}: no 'ap'", path)
        cols = out.setdefault(setup, {})
        for key, v in row.items():
            if key in ("setup", "query_index", "query"):
                continue
            _need(v is None or _is_num(v), f"{where}: {key!r} must be a number or null, got {v!r}", path)
            col = cols.setdefault(key, np.full(n_queries, np.nan))
            col[qi] = np.nan if v is None else float(v)
    for setup, cols in out.items():
        n = sum(1 for s, _ in seen if s == setup)
        _need(n == n_queries, f"setup {setup!r} has rows for {n} of the {n_queries} queries", path)
        ap = cols["ap"]
        # the official summation order can land a perfect list one ulp above 1 (1.0000000000000002)
        _need(bool(np.all(np.isnan(ap) | ((ap >= 0) & (ap <= 1 + 1e-9)))), f"setup {setup!r}: an AP outside [0, 1]", path)
    return out


def sequential_mean(values: NDArray[np.float64]) -> float:
    """Mean over the non-NaN values, accumulated in order as the official loops do (nan if none)."""
    v = values[~np.isnan(values)]
    return float(np.cumsum(v)[-1] / v.size) if v.size else math.nan


@dataclass(frozen=True, eq=False)
class RunRecord:
    """One run (a run-id folder), read and checked. Build it with :meth:`load`.

    Attributes:
        path: the run-id folder.
        record: ``record.json`` (format, run id, command, host, versions, method, dataset, ...).
        config: the resolved config.
        dataset: ``dataset.json`` (``id``, ``gt_sha256``, ``n_db``, ``n_queries``, ``n_distractors``...).
        metrics: ``metrics.json``.
        timings: ``timings.json``.
        protocol: ``revisited``, ``original``, ``holidays`` or ``ukbench``.
        k: how many results per query ``retrieved.json`` holds.
        labels: the label vocabulary of ``retrieved.json``.
        queries: per query its stored top-k (:class:`QueryRetrieved`).
    """

    path: Path
    record: Mapping[str, Any]
    config: Mapping[str, Any]
    dataset: Mapping[str, Any]
    metrics: Mapping[str, Any]
    timings: Mapping[str, Any]
    protocol: str
    k: int
    labels: tuple[str, ...]
    queries: tuple[QueryRetrieved, ...]
    _per_query: Mapping[str, Mapping[str, NDArray[np.float64]]]

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        """Read a run-id folder, or a config folder (its latest run).

        Raises:
            InputError: not a run folder, a missing or malformed file, another format version, a
                run that did not complete, files that disagree (one line naming the file).
        """
        folder = Path(path)
        if not folder.is_dir():
            raise InputError("run folder not found" if not folder.exists() else "not a folder", folder)
        if not (folder / "record.json").exists():
            folder = latest_run(folder)
        rec_path = folder / "record.json"
        record = _read_json(rec_path)
        _need(isinstance(record, dict), "expected a JSON object", rec_path)
        fmt = record.get("format")
        _need(
            fmt == RUN_FORMAT,
            f"run-record format {fmt!r}; this oxbench reads format {RUN_FORMAT} (re-run, or use the oxbench that wrote it)",
            rec_path,
        )
        missing = [n for n in RUN_FILES if not (folder / n).is_file()]
        _need(not missing, f"incomplete run folder: missing {', '.join(missing)}", folder)
        _need(
            record.get("status") == "complete",
            f"the run did not complete (status {record.get('status')!r})",
            rec_path,
        )
        for key in ("run_id", "method", "dataset"):
            _need(isinstance(record.get(key), str), f"{key!r} must be a string", rec_path)
        dataset = _read_json(folder / "dataset.json")
        ds_path = folder / "dataset.json"
        _need(isinstance(dataset, dict), "expected a JSON object", ds_path)
        for key in ("id", "gt_sha256"):
            _need(isinstance(dataset.get(key), str) and dataset[key] != "", f"{key!r} must be a non-empty string", ds_path)
        for key in ("n_db", "n_queries", "n_distractors"):
            _need(_is_int(dataset.get(key)) and dataset[key] >= 0, f"{key!r} must be a non-negative integer", ds_path)
        _need(dataset["n_queries"] >= 1, "'n_queries' must be at least 1", ds_path)
        nq = int(dataset["n_queries"])
        config = _read_json(folder / "config.json")
        metrics = _read_json(folder / "metrics.json")
        timings = _read_json(folder / "timings.json")
        for name, obj in (("config.json", config), ("metrics.json", metrics), ("timings.json", timings)):
            _need(isinstance(obj, dict), "expected a JSON object", folder / name)
        protocol, k, labels, queries = _parse_retrieved(_read_json(folder / "retrieved.json"), nq, folder / "retrieved.json")
        per_query = _parse_per_query(_read_json(folder / "per_query.json"), nq, folder / "per_query.json")
        expected = set(SETUP_LABELS[protocol])
        _need(
            set(per_query) == expected,
            f"setups {sorted(per_query)} do not fit the {protocol} protocol ({sorted(expected)})",
            folder / "per_query.json",
        )
        return cls(
            path=folder, record=record, config=config, dataset=dataset, metrics=metrics,
            timings=timings, protocol=protocol, k=k, labels=labels, queries=queries,
            _per_query={s: per_query[s] for s in SETUP_LABELS[protocol]},
        )

    # -- identity ------------------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        return str(self.record["run_id"])

    @property
    def method(self) -> str:
        """The method's preset name (the row label of tables)."""
        return str(self.record["method"])

    @property
    def dataset_id(self) -> str:
        return str(self.dataset["id"])

    @property
    def gt_sha256(self) -> str:
        return str(self.dataset["gt_sha256"])

    @property
    def n_distractors(self) -> int:
        return int(self.dataset["n_distractors"])

    @property
    def n_queries(self) -> int:
        return len(self.queries)

    @property
    def query_names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queries)

    @property
    def setups(self) -> tuple[str, ...]:
        """The protocol's setups, in order (``easy``, ``medium``, ``hard`` for revisited)."""
        return tuple(self._per_query)

    def describe(self) -> str:
        """``<method> on <dataset>[+N distractors] (<run folder>)``, for messages and legends."""
        extra = f"+{self.n_distractors} distractors" if self.n_distractors else ""
        return f"{self.method} on {self.dataset_id}{extra} ({self.path})"

    # -- per-query numbers -------------------------------------------------------------------
    def _setup(self, setup: str) -> str:
        if setup not in self._per_query:
            raise InputError(f"no setup {setup!r} in this run (setups: {', '.join(self.setups)})", self.path)
        return setup

    def per_query(self, setup: str, metric: str = "ap") -> NDArray[np.float64]:
        """Per-query values of ``metric`` (``ap``, ``p@10``, ``n_positives``...) in ``setup``, shape
        ``[n_queries]``; ``nan`` for queries skipped there (no positives).

        Raises:
            InputError: the run has no such setup or metric.
        """
        cols = self._per_query[self._setup(setup)]
        if metric not in cols:
            raise InputError(
                f"setup {setup!r} has no per-query {metric!r} (columns: {', '.join(cols)})",
                self.path / "per_query.json",
            )
        return cols[metric].copy()

    def mean(self, setup: str, metric: str = "ap") -> float:
        """The setup's mean of ``metric`` over its non-skipped queries (mAP for ``ap``), accumulated
        in query order as the official programs do (equal to ``metrics.json``)."""
        return sequential_mean(self.per_query(setup, metric))

    def skipped(self, setup: str) -> tuple[int, ...]:
        """Indices of the queries without positives in ``setup`` (no AP there)."""
        return tuple(int(i) for i in np.flatnonzero(np.isnan(self.per_query(setup, "ap"))))

    # -- arrays and optional files -------------------------------------------------------------
    def ranks(self) -> NDArray[np.int64]:
        """``ranks.npy`` in the revisitop layout ``(n_kept, n_queries)`` (memory-mapped).

        Raises:
            InputError: unreadable, not 2-D integers, or not one column per query.
        """
        path = self.path / "ranks.npy"
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise InputError(f"not a readable .npy array ({str(exc).splitlines()[0]})", path) from None
        _need(isinstance(arr, np.ndarray) and arr.ndim == 2, "expected a 2-D array", path)
        _need(np.issubdtype(arr.dtype, np.integer), f"expected integers, got {arr.dtype}", path)
        _need(
            arr.shape[1] == self.n_queries,
            f"shape {arr.shape}: expected one column per query ({self.n_queries}); revisitop layout",
            path,
        )
        return arr

    def matches(self) -> dict[int, dict[int, list[list[float]]]] | None:
        """Spatially verified correspondences, ``{query index: {db index: [[xq, yq, xd, yd], ...]}}``
        in full-image pixels, or ``None`` when the run stored none (``matches.json`` absent).

        Raises:
            InputError: a malformed ``matches.json``.
        """
        path = self.path / "matches.json"
        if not path.exists():
            return None
        obj = _read_json(path)
        _need(isinstance(obj, dict) and isinstance(obj.get("queries"), dict), "expected {\"queries\": {...}}", path)
        out: dict[int, dict[int, list[list[float]]]] = {}
        for qk, per_db in obj["queries"].items():
            _need(qk.isdigit() and int(qk) < self.n_queries, f"query key {qk!r} is not a query index", path)
            _need(isinstance(per_db, dict), f"query {qk}: expected an object", path)
            inner: dict[int, list[list[float]]] = {}
            for dk, pairs in per_db.items():
                _need(dk.isdigit(), f"query {qk}: database key {dk!r} is not an index", path)
                _need(
                    isinstance(pairs, list)
                    and all(isinstance(p, list) and len(p) == 4 and all(_is_num(v) for v in p) for p in pairs),
                    f"query {qk}, image {dk}: expected a list of [xq, yq, xd, yd]",
                    path,
                )
                inner[int(dk)] = [[float(v) for v in p] for p in pairs]
            out[int(qk)] = inner
        return out


def load_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """:meth:`RunRecord.load` of each path, in order."""
    return [RunRecord.load(p) for p in paths]


def check_comparable(runs: Sequence[RunRecord]) -> None:
    """Refuse runs that cannot be compared query by query.

    They must share the dataset id, the ground-truth digest, the number of distractors, the
    protocol and the queries skipped in every setup.

    Raises:
        InputError: naming the second run's folder and what differs.
    """
    if not runs:
        raise InputError("no run given")
    a = runs[0]
    for b in runs[1:]:
        where = b.path
        if b.dataset_id != a.dataset_id:
            raise InputError(f"dataset {b.dataset_id!r} differs from {a.dataset_id!r} of {a.path}", where)
        if b.gt_sha256 != a.gt_sha256:
            raise InputError(
                f"ground truth differs from {a.path}'s (dataset.json gt_sha256 {b.gt_sha256[:12]} vs {a.gt_sha256[:12]})",
                where,
            )
        if b.n_distractors != a.n_distractors:
            raise InputError(
                f"{b.n_distractors} distractors, {a.path} has {a.n_distractors}: not the same benchmark",
                where,
            )
        if b.protocol != a.protocol or b.query_names != a.query_names:
            raise InputError(f"protocol or queries differ from {a.path}'s", where)
        for setup in a.setups:
            sa, sb = set(a.skipped(setup)), set(b.skipped(setup))
            if sa != sb:
                only = sorted(sa ^ sb)[:5]
                names = ", ".join(a.query_names[i] for i in only)
                raise InputError(
                    f"setup {setup!r}: queries skipped (no positives) in one run and not the other: {names}",
                    where,
                )
