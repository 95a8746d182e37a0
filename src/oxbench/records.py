"""The run record: its layout, its writer and its one checked reader.

A run record is the folder one execution of ``oxbench run`` writes (format :data:`RECORD_FORMAT`)::

    runs/<dataset>-<method>-<config digest>/     config folder (stable for one resolved config)
        config.json
        <run id>/                                one execution: UTC "YYYYMMDDTHHMMSSZ-<4 hex>"
            record.json  config.json  dataset.json  ranks.npy  [scores.npy]  metrics.json
            per_query.json  per_query.csv  retrieved.json  timings.json  summary.txt  run.log
            [matches.json]  [boxes.json]

Everything about that layout lives here, so the writer (:mod:`oxbench.pipelines.runner`), the readers
(``runs``, ``compare``, ``report``, ``plot``, ``view``, ``export``) and the tests agree: the file list,
the format version, the label vocabularies of ``retrieved.json``, what a run folder is
(:func:`is_run_folder`), the writer of the files (:func:`write_run_files`) and the reader
(:meth:`RunRecord.load`).

The reader trusts nothing in the folder: every file must be a regular file (a link, a FIFO or a
device is refused before it is opened, so nothing hangs or fills memory), no larger than its limit,
JSON at most :data:`MAX_JSON_DEPTH` deep, of the types the writer writes; ``metrics.json`` must agree
with ``per_query.json``. A record that fails is refused with one
:class:`~oxbench.errors.InputError` line naming the file or the record; :func:`find_runs` (``oxbench
runs``) skips it with one warning.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.fileio import (
    atomic_write_json,
    atomic_write_npy,
    atomic_write_text,
    json_digest,
    os_reason,
)
from oxbench.protocol import PROTOCOLS, Protocol, get_protocol, number_text
from oxbench.schema import setting, validate

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

#: The run-record format written and read (``record.json`` ``"format"``).
RECORD_FORMAT = 1

#: Files every complete run folder holds.
RUN_FILES = (
    "record.json", "config.json", "dataset.json", "ranks.npy", "metrics.json", "per_query.json",
    "per_query.csv", "retrieved.json", "timings.json", "summary.txt", "run.log",
)  # fmt: skip
#: Files a run folder may hold besides :data:`RUN_FILES`.
OPTIONAL_FILES = ("scores.npy", "matches.json", "boxes.json")

#: A run id: UTC start time to the second and 4 random hex digits.
RUN_ID_PATTERN = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{4}")


class _ByProtocol(Mapping[str, Any]):
    """A read-only mapping from protocol name to what that protocol's object answers."""

    def __init__(self, answer: Callable[[Protocol], Any]) -> None:
        self._answer = answer

    def __getitem__(self, name: str) -> Any:
        return self._answer(get_protocol(name))

    def __iter__(self) -> Iterator[str]:
        return iter(PROTOCOLS.names())

    def __len__(self) -> int:
        return len(PROTOCOLS.names())


#: Ground-truth label field -> its ``retrieved.json`` label.
FIELD_LABEL = {"easy": "easy", "hard": "hard", "good": "positive", "ok": "positive", "junk": "junk"}

#: Label vocabulary of each protocol, as written in ``retrieved.json`` (its ``labels``).
PROTOCOL_LABELS: Mapping[str, tuple[str, ...]] = _ByProtocol(lambda p: p.labels)
#: Per protocol: setup -> (positive labels, ignored labels) of ``retrieved.json``'s vocabulary.
SETUP_LABELS: Mapping[str, Mapping[str, tuple[frozenset[str], frozenset[str]]]] = _ByProtocol(
    lambda p: p.setup_labels
)

#: Size limit of each file the reader opens (bytes); ranked lists of a 1M-image index stay well below.
FILE_LIMITS: dict[str, int] = {
    "record.json": 16 << 20, "config.json": 16 << 20, "dataset.json": 64 << 20, "metrics.json": 256 << 20,
    "per_query.json": 256 << 20, "timings.json": 1 << 20, "retrieved.json": 1 << 30, "matches.json": 1 << 30,
    "boxes.json": 1 << 30,
    "ranks.npy": 1 << 36, "scores.npy": 1 << 36,
}  # fmt: skip
#: Deepest nesting of lists and objects a record's JSON may have (the writer's deepest is 6).
MAX_JSON_DEPTH = 32
#: Tolerance of the ``metrics.json`` / ``per_query.json`` cross-check (means are recomputed in order).
_CROSS_CHECK_TOL = 1e-9
_INDEX_KEY = re.compile(r"[0-9]{1,12}\Z")


# --- what a run folder is -----------------------------------------------------------------------


def is_run_folder(path: str | Path) -> bool:
    """Whether ``path`` is a run folder: a folder named by a run id holding a ``record.json``.

    Nothing is opened; ``record.json`` need not be valid (:meth:`RunRecord.load` checks that).
    """
    path = Path(path)
    if not RUN_ID_PATTERN.fullmatch(path.name):
        return False
    try:
        return stat.S_ISDIR(os.stat(path).st_mode) and os.path.lexists(path / "record.json")
    except OSError:
        return False


def list_runs(config_dir: str | Path) -> list[Path]:
    """The run folders of a config folder, oldest first (run ids sort by time)."""
    config_dir = Path(config_dir)
    try:
        entries = sorted(config_dir.iterdir())
    except OSError:
        return []
    return [p for p in entries if is_run_folder(p)]


def latest_run(config_dir: str | Path) -> Path:
    """The newest run folder of a config folder.

    Raises:
        InputError: the folder holds no run folder.
    """
    config_dir = Path(config_dir)
    runs = list_runs(config_dir)
    if not runs:
        raise InputError(
            "not a run folder: no run-id folder (YYYYMMDDTHHMMSSZ-xxxx) with a record.json inside",
            config_dir,
        )
    return runs[-1]


def new_run_id() -> str:
    """A fresh run id: UTC time to the second plus 4 random hex digits (unique across processes)."""
    import secrets
    from datetime import UTC, datetime

    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(2)}"


# --- the run's label -----------------------------------------------------------------------------

#: Longest run label accepted (characters): a table row, a legend, one line of ``runs``.
MAX_LABEL_CHARS = 120
_PRESET_KEYS = ("name", "family")


def check_label(text: object, *, source: str = "--label") -> str:
    """A run label as given (``--label TEXT``, ``record.json`` ``"label"``), checked.

    A label is one line of printable text, not blank, at most :data:`MAX_LABEL_CHARS` characters:
    it becomes a table row, a legend entry and a line of ``oxbench runs``.

    Raises:
        InputError: not text, blank, a newline or another control character, or too long (one line
            naming ``source``).
    """
    if not isinstance(text, str):
        raise InputError(f"a run label is text, got {_show(text)}", source)
    bad = next((c for c in text if not c.isprintable()), None)
    if bad is not None:
        raise InputError(
            f"a run label is one line of printable text; it holds {bad!r} at position {text.index(bad)}",
            source,
        )
    if not text.strip():
        raise InputError("a run label must not be blank", source)
    if len(text) > MAX_LABEL_CHARS:
        raise InputError(
            f"a run label is at most {MAX_LABEL_CHARS} characters, got {len(text):,}", source
        )
    return text


def flat_settings(settings: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A method's settings (``MethodConfig.to_dict()``) as dotted names: ``{"features.max_side": 1024}``."""
    out: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, Mapping):
            out.update(flat_settings(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _label_value(v: Any) -> str:
    """A setting's value as a label writes it: text as is, an empty list as ``none`` (the word
    ``--set rerank=`` and ``--set rerank=none`` both mean), anything else as compact JSON."""
    if isinstance(v, str):
        return v
    if isinstance(v, list | tuple) and not v:
        return "none"
    return json.dumps(v, separators=(",", ":"))


def default_label(
    method: str,
    settings: Mapping[str, Any] | None,
    preset: Mapping[str, Any] | None,
    *,
    inputs: Collection[str] = (),
) -> str:
    """The label of a run that was given none: the preset name plus the settings that differ from it.

    ``default_label("features-alpha-qe", run_settings, preset_settings)`` ->
    ``"features-alpha-qe [whitening=pca]"``; the name alone when nothing differs or either side is
    unknown. ``inputs`` (dotted names) are left out: settings that say which files are read, not
    what the method does. Longer than :data:`MAX_LABEL_CHARS`, it ends in ``...]``.
    """
    if not settings or not preset:
        return method
    # a nested config of another kind (local features read from files instead of RootSIFT) is
    # named by its kind, not by every sub-setting it has
    settings = {
        k: v["kind"]
        if isinstance(v, Mapping)
        and isinstance(preset.get(k), Mapping)
        and v.get("kind") != preset[k].get("kind")
        else v
        for k, v in settings.items()
    }
    ours, theirs = flat_settings(settings), flat_settings(preset)
    changed = [
        f"{k}={_label_value(v)}"
        for k, v in ours.items()
        if k not in _PRESET_KEYS and k not in inputs and (k not in theirs or theirs[k] != v)
    ]
    label = f"{method} [{', '.join(changed)}]" if changed else method
    label = "".join(c if c.isprintable() else "?" for c in label)
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 4] + "...]"


def distractor_tag(n_distractors: int, source: str | int | None = None) -> str:
    """How many distractors a run searched among, as the field writes it in labels and headers.

    ``distractor_tag(1000)`` -> ``"+1K"``, ``distractor_tag(1_001_001, "revisitop1m")`` ->
    ``"+R1M"`` (``R`` for the revisitop 1M set), ``distractor_tag(99_782, "oxford100k")`` ->
    ``"+100K"``; ``""`` for none. Two significant digits at most: the record keeps the exact count.
    """
    if n_distractors <= 0:
        return ""
    prefix = "R" if source == "revisitop1m" else ""
    for unit, letter in ((1_000_000, "M"), (1_000, "K")):
        if n_distractors >= unit:
            v = n_distractors / unit
            text = f"{round(v)}" if v >= 9.95 else f"{v:.1f}".removesuffix(".0")
            return f"+{prefix}{text}{letter}"
    return f"+{prefix}{n_distractors}"


# --- writing ------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and arrays turned into Python numbers and lists (keys as text)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def retrieved_document(
    gt: GroundTruth,
    ranks: NDArray[np.int64],
    scores: NDArray[np.floating] | None,
    k: int,
    *,
    image_name: Callable[[int], str],
    image_path: Callable[[int], str | None],
    query_image: Callable[[int], str | None],
) -> dict[str, Any]:
    """``retrieved.json``: the top ``k`` of every query with index, name, image path, score and label.

    Args:
        gt: the ground truth (labels, query names and boxes).
        ranks: ``int64 [n_queries, n]`` internal layout (negative entries pad a short list).
        scores: ``[n_queries, >= k]`` aligned scores, or ``None``.
        k: how many of each list to record.
        image_name, image_path: name and path (or ``None``) of index position ``i``.
        query_image: path (or ``None``) of query ``q``'s full image.
    """
    queries = []
    for qi, q in enumerate(gt.queries):
        label_of: dict[int, str] = {}
        counts: dict[str, int] = {}
        for fname, arr in q.labels().items():
            lab = FIELD_LABEL[fname]
            counts[lab] = counts.get(lab, 0) + int(arr.size)
            label_of.update(dict.fromkeys(arr.tolist(), lab))
        top = []
        for r, idx in enumerate(np.asarray(ranks[qi, :k]).tolist()):
            if idx < 0:  # padding of a short list
                break
            score = None if scores is None else float(scores[qi, r])
            top.append(
                {
                    "rank": r + 1,
                    "index": idx,
                    "name": image_name(idx),
                    "image": image_path(idx),
                    "score": score,
                    "label": label_of.get(idx, "negative"),
                }
            )
        queries.append(
            {
                "index": qi,
                "name": q.name,
                "id": q.query_id,
                "image": query_image(qi),
                "bbox": None if q.bbox is None else [float(v) for v in q.bbox],
                "n_labelled": counts,
                "top": top,
            }
        )
    return {
        "k": k,
        "protocol": str(gt.protocol),
        "labels": list(gt.protocol.labels),
        "queries": queries,
    }


def write_run_files(
    folder: str | Path,
    *,
    record: Mapping[str, Any],
    config: Mapping[str, Any],
    dataset: Mapping[str, Any],
    ranks_revisitop: NDArray[np.integer],
    metrics: Mapping[str, Any],
    per_query: Sequence[Mapping[str, Any]],
    retrieved: Mapping[str, Any],
    timings: Mapping[str, float],
    summary: str,
    scores: NDArray[np.floating] | None = None,
    matches: Mapping[int, Mapping[int, Any]] | None = None,
    boxes: Mapping[str, Any] | None = None,
    log_text: str | None = None,
) -> None:
    """Write every file of a run folder into ``folder``, each atomically, ``record.json`` last.

    ``folder`` is the run's temporary folder (renamed into place by the caller when complete);
    ``record.json``'s presence marks a complete run. ``run.log`` is the caller's (the runner logs
    into it while running); ``log_text`` writes it here instead. ``boxes`` is ``boxes.json``:
    ``{"predictor": name, "queries": {query: {db index: {"box": [x1, y1, x2, y2], "how": ...}}}}``,
    the predicted box of the query's object in each retrieved image that has one
    (:meth:`RunRecord.boxes` reads it).
    """
    folder = Path(folder)
    atomic_write_json(folder / "config.json", dict(config))
    atomic_write_json(folder / "dataset.json", dict(dataset))
    atomic_write_npy(folder / "ranks.npy", np.asarray(ranks_revisitop))
    if scores is not None:
        atomic_write_npy(folder / "scores.npy", np.asarray(scores, dtype=np.float32))
    atomic_write_json(folder / "metrics.json", jsonable(metrics))
    rows = [dict(r) for r in per_query]
    atomic_write_json(folder / "per_query.json", rows)
    buf = io.StringIO()
    if rows:
        writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    atomic_write_text(folder / "per_query.csv", buf.getvalue())
    atomic_write_json(folder / "retrieved.json", dict(retrieved), indent=None)
    if matches:
        atomic_write_json(
            folder / "matches.json",
            {
                "queries": {
                    str(q): {
                        str(i): np.asarray(m, np.float32).round(2).tolist() for i, m in per.items()
                    }
                    for q, per in matches.items()
                }
            },
            indent=None,
        )
    if boxes is not None:
        atomic_write_json(folder / "boxes.json", jsonable(dict(boxes)), indent=None)
    atomic_write_json(folder / "timings.json", dict(timings))
    atomic_write_text(folder / "summary.txt", summary if summary.endswith("\n") else summary + "\n")
    if log_text is not None:
        atomic_write_text(folder / "run.log", log_text)
    atomic_write_json(
        folder / "record.json", dict(record)
    )  # last: its presence marks a complete run


# --- reading: bounded, typed --------------------------------------------------------------------


def read_record_bytes(path: Path, limit: int) -> bytes:
    """The bytes of one file of a record: a regular file (not a link), at most ``limit`` bytes.

    The file is opened without following links and without blocking, then checked with ``fstat``,
    so a link to ``/dev/zero``, a FIFO or a device is refused without being read.

    Raises:
        InputError: missing, a link, not a regular file, larger than ``limit``, or unreadable.
    """
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        )
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except OSError as exc:
        if os.path.islink(path):
            raise InputError(
                "a run record's files are regular files; this one is a symbolic link", path
            ) from None
        raise InputError(f"cannot read: {os_reason(exc)}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError("not a regular file (a folder, FIFO, device or socket)", path)
        if st.st_size > limit:
            raise InputError(
                f"file is {st.st_size:,} bytes; the limit for this file of a run record is {limit:,}",
                path,
            )
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 24, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise InputError(f"file grew past the limit of {limit:,} bytes while being read", path)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"cannot read: {os_reason(exc)}", path) from None
    finally:
        os.close(fd)


def _too_deep(obj: Any, max_depth: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def read_record_json(
    path: Path, *, limit: int | None = None, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """One JSON file of a record: bounded read (:func:`read_record_bytes`), UTF-8, at most
    ``max_depth`` levels of lists and objects.

    Raises:
        InputError: one line naming the file.
    """
    data = read_record_bytes(path, FILE_LIMITS.get(path.name, 1 << 30) if limit is None else limit)
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path) from None
    except json.JSONDecodeError as exc:
        raise InputError(
            f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", path
        ) from None
    except RecursionError:
        raise InputError(f"JSON nested deeper than {max_depth} levels", path) from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise InputError(f"not valid JSON ({' '.join(str(exc).split())[:120]})", path) from None
    if _too_deep(obj, max_depth):
        raise InputError(f"JSON nested deeper than {max_depth} levels", path)
    return obj


def _need(cond: bool, message: str, path: Path) -> None:
    if not cond:
        raise InputError(message, path)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond float range
        return False


def _is_text(v: Any, *, empty: bool = False) -> bool:
    return isinstance(v, str) and (empty or v != "") and "\x00" not in v


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True, eq=False)
class QueryRetrieved:
    """One query's stored top-k (from ``retrieved.json``).

    Attributes:
        index: query index (column of ``ranks.npy``).
        name: query image name.
        id: the query's id where the protocol has one (original Oxford/Paris: ``all_souls_1``),
            else ``None``.
        image: path of the full query image as recorded, or ``None``.
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


def _parse_retrieved(
    obj: Any, n_queries: int, path: Path
) -> tuple[Protocol, int, tuple[str, ...], tuple[QueryRetrieved, ...]]:
    _need(isinstance(obj, dict), "expected a JSON object", path)
    name = obj.get("protocol")
    _need(
        isinstance(name, str) and name in PROTOCOLS,
        f"unknown protocol {_show(name)}",
        path,
    )
    protocol = get_protocol(name)
    k = obj.get("k")
    _need(_is_int(k) and k >= 1, f"'k' must be a positive integer, got {_show(k)}", path)
    labels = obj.get("labels")
    _need(
        isinstance(labels, list) and all(isinstance(x, str) for x in labels),
        "'labels' must be a list of strings",
        path,
    )
    _need(
        set(labels) <= set(protocol.labels),
        f"labels {labels} are not of the {protocol} vocabulary {list(protocol.labels)}",
        path,
    )
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
        _need(
            q.get("index") == qi and _is_int(q.get("index")),
            f"{where}: 'index' is {_show(q.get('index'))}, expected {qi}",
            path,
        )
        name = q.get("name")
        _need(_is_text(name), f"{where}: 'name' must be a non-empty string without NUL", path)
        image = q.get("image")
        _need(image is None or _is_text(image), f"{where}: 'image' must be a path or null", path)
        bbox = q.get("bbox")
        _need(
            bbox is None
            or (isinstance(bbox, list) and len(bbox) == 4 and all(_is_num(v) for v in bbox)),
            f"{where}: 'bbox' must be [x1, y1, x2, y2] or null",
            path,
        )
        n_lab = q.get("n_labelled", {})
        _need(
            isinstance(n_lab, dict)
            and all(isinstance(a, str) and _is_int(b) and b >= 0 for a, b in n_lab.items()),
            f"{where}: 'n_labelled' must map labels to counts",
            path,
        )
        qid = q.get("id")
        _need(qid is None or _is_text(qid), f"{where}: 'id' must be a string or null", path)
        top = q.get("top")
        _need(
            isinstance(top, list) and len(top) <= k,
            f"{where}: 'top' must be a list of at most k={k} entries",
            path,
        )
        seen: set[int] = set()
        for j, t in enumerate(top):
            tw = f"{where}, rank {j + 1}"
            _need(isinstance(t, dict), f"{tw}: expected an object", path)
            _need(
                t.get("rank") == j + 1 and _is_int(t.get("rank")),
                f"{tw}: 'rank' is {_show(t.get('rank'))}, expected {j + 1}",
                path,
            )
            idx = t.get("index")
            _need(
                _is_int(idx) and idx >= 0 and idx not in seen,
                f"{tw}: 'index' must be a new non-negative integer",
                path,
            )
            seen.add(idx)
            _need(
                _is_text(t.get("name")),
                f"{tw}: 'name' must be a non-empty string without NUL",
                path,
            )
            _need(
                t.get("image") is None or _is_text(t.get("image")),
                f"{tw}: 'image' must be a path or null",
                path,
            )
            _need(
                t.get("score") is None or _is_num(t.get("score")),
                f"{tw}: 'score' must be a number or null",
                path,
            )
            _need(
                isinstance(t.get("label"), str) and t["label"] in vocab,
                f"{tw}: label {_show(t.get('label'))} is not one of {labels}",
                path,
            )
        out.append(
            QueryRetrieved(
                index=qi,
                name=name,
                image=image,
                bbox=None
                if bbox is None
                else (float(bbox[0]), float(bbox[1]), float(bbox[2]), float(bbox[3])),
                n_labelled=dict(n_lab),
                top=tuple(top),
                id=qid,
            )
        )
    return protocol, int(k), tuple(labels), tuple(out)


_TEXT_COLUMNS = ("setup", "query_index", "query", "query_id")


def _parse_per_query(
    rows: Any, n_queries: int, path: Path
) -> dict[str, dict[str, NDArray[np.float64]]]:
    """setup -> column ("ap", "p@10", "n_positives", ...) -> array over queries (nan for null)."""
    _need(isinstance(rows, list) and len(rows) > 0, "expected a non-empty list of rows", path)
    out: dict[str, dict[str, NDArray[np.float64]]] = {}
    seen: set[tuple[str, int]] = set()
    for i, row in enumerate(rows):
        where = f"row {i}"
        _need(isinstance(row, dict), f"{where}: expected an object", path)
        setup, qi = row.get("setup"), row.get("query_index")
        _need(isinstance(setup, str), f"{where}: 'setup' must be a string", path)
        _need(
            _is_int(qi) and 0 <= qi < n_queries,
            f"{where}: 'query_index' must be 0..{n_queries - 1}",
            path,
        )
        _need(
            (setup, qi) not in seen,
            f"{where}: setup {_show(setup)} query {qi} is listed twice",
            path,
        )
        seen.add((setup, qi))
        _need("ap" in row, f"{where}: no 'ap'", path)
        cols = out.setdefault(setup, {})
        for key, v in row.items():
            if key in _TEXT_COLUMNS:
                _need(
                    key != "query" or isinstance(v, str), f"{where}: 'query' must be a string", path
                )
                _need(
                    key != "query_id" or isinstance(v, str),
                    f"{where}: 'query_id' must be a string",
                    path,
                )
                continue
            _need(
                v is None or _is_num(v),
                f"{where}: {_show(key)} must be a number or null, got {_show(v)}",
                path,
            )
            col = cols.setdefault(key, np.full(n_queries, np.nan))
            col[qi] = np.nan if v is None else float(v)
    for setup, cols in out.items():
        n = sum(1 for s, _ in seen if s == setup)
        _need(
            n == n_queries,
            f"setup {_show(setup)} has rows for {n} of the {n_queries} queries",
            path,
        )
        ap = cols["ap"]
        # the official summation order can land a perfect list one ulp above 1 (1.0000000000000002)
        _need(
            bool(np.all(np.isnan(ap) | ((ap >= 0) & (ap <= 1 + 1e-9)))),
            f"setup {_show(setup)}: an AP outside [0, 1]",
            path,
        )
    return out


def sequential_mean(values: NDArray[np.float64]) -> float:
    """Mean over the non-NaN values, accumulated in order as the official loops do (nan if none)."""
    v = values[~np.isnan(values)]
    return float(np.cumsum(v)[-1] / v.size) if v.size else math.nan


def _same(stored: Any, recomputed: float) -> bool:
    if stored is None:
        return math.isnan(recomputed)
    return (
        _is_num(stored)
        and not math.isnan(recomputed)
        and abs(float(stored) - recomputed) <= _CROSS_CHECK_TOL
    )


def _cross_check(
    metrics: Mapping[str, Any],
    protocol: Protocol,
    per_query: Mapping[str, Mapping[str, NDArray[np.float64]]],
    folder: Path,
) -> None:
    """``metrics.json``'s means must be those of ``per_query.json`` (one line naming the record);
    the protocol says which means ``metrics.json`` holds (:meth:`Protocol.stored_means`)."""
    path = folder / "metrics.json"
    try:
        stored_means = list(protocol.stored_means(metrics, per_query))
    except InputError as exc:
        raise InputError(exc.problem, path) from None
    for what, stored, setup, column in stored_means:
        cols = per_query[setup]
        if column not in cols:
            if column == protocol.headline_metric.metric:  # the protocol's own number: required
                raise InputError(f"per-query rows have no {column!r}", folder / "per_query.json")
            continue
        recomputed = sequential_mean(cols[column])
        if not _same(stored, recomputed):
            raise InputError(
                f"run record is inconsistent: metrics.json {what} is {_show(stored)} but "
                f"per_query.json gives {recomputed:.6g}; the record was edited or damaged (re-run, "
                "or restore it)",
                folder,
            )


# --- record.json: the typed parts, declared once ---------------------------------------------------

#: How ``record.json`` names a field in errors (``record field 'execution.workers'``).
_RECORD_FIELD = "record field"


def _validated(instance: Any, prefix: str) -> None:
    """Every spec'd field of a record part checked, errors naming ``prefix.field``."""
    validate(instance, what=_RECORD_FIELD, label=lambda n: f"{prefix}{n}")


def _counts(value: Any, name: str) -> dict[str, int]:
    """``{part: non-negative integer}``, or one line naming ``name``."""
    if not isinstance(value, Mapping) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()
    ):
        raise InputError(f"'{name}' must map parts to non-negative byte counts")
    return {str(k): int(v) for k, v in value.items()}


def _from_fields(cls: Any, values: Any, name: str) -> Any:
    """``cls(**values)`` for a part written as an object: a missing field or one it does not
    have is one line naming the part."""
    if not isinstance(values, Mapping):
        raise InputError(f"'{name}' must be an object")
    names = {f.name for f in dataclasses.fields(cls)}
    missing = sorted(
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise InputError(f"'{name}' has no {missing[0]!r}")
    return cls(**{k: v for k, v in values.items() if k in names})


@dataclass(frozen=True)
class ExecutionFacts:
    """``record.json``'s ``execution``: where the parallel stages ran, as the executor describes
    itself (:meth:`oxbench.execution.Executor.describe`): its backend, workers and threads per
    worker, and the facts of its own (a Dask cluster's address and retries, a plugin's cluster),
    which its class checks (:meth:`oxbench.execution.Executor.check_facts`) when it is installed.
    """

    backend: str = setting(spec=S.Str(min_len=1, max_len=256), doc="execution backend")
    workers: int = setting(spec=S.Int(lo=1, hi=1 << 24), doc="workers")
    threads_per_worker: int = setting(spec=S.Int(lo=1, hi=1 << 16), doc="threads per worker")
    own: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        from oxbench.execution import EXECUTORS

        _validated(self, "execution.")
        if self.backend in EXECUTORS:
            EXECUTORS.get(self.backend).check_facts(self.own)

    @classmethod
    def from_dict(cls, values: Any) -> ExecutionFacts:
        if not isinstance(values, Mapping):
            raise InputError("'execution' must be an object")
        common = ("backend", "workers", "threads_per_worker")
        own = {k: v for k, v in values.items() if k not in common}
        return cls(**{k: values.get(k) for k in common}, own=own)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workers": self.workers,
            "threads_per_worker": self.threads_per_worker,
            **self.own,
        }


@dataclass(frozen=True)
class FootprintFacts:
    """``record.json``'s ``footprint``: the index's measured RAM and disk
    (:meth:`oxbench.index.footprint.Footprint.to_dict`)."""

    n_index: int = setting(spec=S.Int(lo=0, hi=1 << 48), doc="indexed images")
    ram_bytes: int = setting(spec=S.Int(lo=0, hi=1 << 60), doc="RAM bytes")
    disk_bytes: int = setting(spec=S.Int(lo=0, hi=1 << 60), doc="disk bytes")
    ram_bytes_per_image: float = setting(spec=S.Float(lo=0), doc="RAM bytes per image")
    disk_bytes_per_image: float = setting(spec=S.Float(lo=0), doc="disk bytes per image")
    ram: Mapping[str, int] = dataclasses.field(default_factory=dict)
    disk: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fixed_ram: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fixed_disk: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _validated(self, "footprint.")
        for key in ("ram", "disk", "fixed_ram", "fixed_disk"):
            object.__setattr__(self, key, _counts(getattr(self, key), f"footprint.{key}"))

    @classmethod
    def from_dict(cls, values: Any) -> FootprintFacts:
        return _from_fields(cls, values, "footprint")  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class SeedGroupFacts:
    """``record.json``'s ``seed_group`` (:mod:`oxbench.pipelines.seedgroup`): the group's id, this
    member's seed, the group's seeds and the settings each sets."""

    id: str = setting(spec=S.Str(min_len=1, max_len=256), doc="group id")
    seed: int = setting(spec=S.Int(lo=0, hi=2**63 - 1), doc="this member's seed")
    seeds: tuple[int, ...] = setting(spec=S.SeedList(), doc="the group's seeds")
    settings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _validated(self, "seed_group.")
        if self.seed not in self.seeds:
            raise InputError(f"'seed_group' seed {self.seed} is not one of its seeds")
        if not isinstance(self.settings, list | tuple) or not all(
            isinstance(x, str) and x for x in self.settings
        ):
            raise InputError("'seed_group' settings must be a list of setting names")
        object.__setattr__(self, "settings", tuple(self.settings))

    @classmethod
    def from_dict(cls, values: Any) -> SeedGroupFacts:
        return _from_fields(cls, values, "seed_group")  # type: ignore[no-any-return]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seed": self.seed,
            "seeds": list(self.seeds),
            "settings": list(self.settings),
        }


def _object(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{name!r} must be an object")
    return dict(value)


@dataclass(frozen=True)
class RecordFile:
    """``record.json``: who ran what, where, from what, and what it cost -- declared once, written
    by the runner (:meth:`to_dict`) and checked by every reader (:meth:`from_dict`).

    Attributes:
        format: :data:`RECORD_FORMAT`.
        run_id, status, started, ended: the run's id, ``complete``, and UTC ISO times.
        command: the command line.
        method, label, family, dataset: what ran, under which name, on what.
        oxbench_version, git_commit, versions, plugins, accel: what code ran.
        host: the machine (CPU, cores, GPU, platform).
        execution: where the parallel stages ran (:class:`ExecutionFacts`).
        cache, cache_computed, cache_dir: each step from the cache or computed, and where.
        footprint: the index's measured RAM and disk (:class:`FootprintFacts`), or ``None``.
        inputs: every input file by path, size and SHA-256.
        seeds: every seed setting's value.
        deterministic: the learned steps ran single-threaded.
        seed_group: the seed group this run is a member of (:class:`SeedGroupFacts`), or ``None``.
        preprocessing: the preprocessing card of a run that describes pixels with a network (resize
            rule and side, query crop, scales, normalisation, pooling, weights digest: the
            describer's ``preprocessing()``), or ``None``.
    """

    format: int
    run_id: str
    status: str
    started: str
    method: str
    dataset: str
    command: tuple[str, ...] = ()
    ended: str | None = None
    oxbench_version: str | None = None
    git_commit: str | None = None
    host: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    versions: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    plugins: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    accel: bool | None = None
    cache: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    cache_computed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    label: str | None = None
    family: str | None = None
    cache_dir: str | None = None
    execution: ExecutionFacts | None = None
    footprint: FootprintFacts | None = None
    inputs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seeds: Mapping[str, int] = dataclasses.field(default_factory=dict)
    deterministic: bool = False
    seed_group: SeedGroupFacts | None = None
    preprocessing: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.format != RECORD_FORMAT or not isinstance(self.format, int):
            raise InputError(
                f"run-record format {_show(self.format)}; this oxbench reads format "
                f"{RECORD_FORMAT} (re-run, or use the oxbench that wrote it)"
            )
        if self.status != "complete":
            raise InputError(f"the run did not complete (status {_show(self.status)})")
        for key in ("run_id", "method", "dataset", "started"):
            if not _is_text(getattr(self, key)):
                raise InputError(
                    f"{key!r} must be a non-empty string, got {_show(getattr(self, key))}"
                )
        if self.ended is not None and not isinstance(self.ended, str):
            raise InputError("'ended' must be a string")
        if not isinstance(self.command, list | tuple) or not all(
            isinstance(c, str) for c in self.command
        ):
            raise InputError("'command' must be a list of strings")
        object.__setattr__(self, "command", tuple(self.command))
        for key in ("host", "versions", "plugins", "cache"):
            object.__setattr__(self, key, _object(getattr(self, key), key))
        if self.label is not None:
            check_label(self.label, source="'label'")
        if self.preprocessing is not None:
            object.__setattr__(self, "preprocessing", _object(self.preprocessing, "preprocessing"))

    @classmethod
    def from_dict(cls, values: Any, path: Path | None = None) -> RecordFile:
        """The record a ``record.json`` object describes.

        Raises:
            InputError: one line naming the file and the field.
        """
        try:
            if not isinstance(values, Mapping):
                raise InputError("expected a JSON object")
            known = {f.name for f in dataclasses.fields(cls)}
            kw = {k: v for k, v in values.items() if k in known}
            missing = [k for k in ("format", "run_id", "status", "started", "method", "dataset")]
            for k in missing:
                kw.setdefault(k, None)
            if kw.get("format") == RECORD_FORMAT and kw.get("status") == "complete":
                for key, part in (
                    ("execution", ExecutionFacts),
                    ("footprint", FootprintFacts),
                    ("seed_group", SeedGroupFacts),
                ):
                    if kw.get(key) is not None:
                        kw[key] = part.from_dict(kw[key])
            kw.setdefault("command", [])
            return cls(**kw)
        except InputError as exc:
            field = f"{exc.source}: " if exc.source else ""  # the field, as 'label' names itself
            raise InputError(field + exc.problem, path) from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``record.json`` (``seed_group`` only for a member of one,
        ``preprocessing`` only where there is a card)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("seed_group", "preprocessing") and value is None:
                continue
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out


@dataclass(frozen=True, eq=False)
class RunRecord:
    """One run (a run-id folder), read and checked. Build it with :meth:`load`.

    Attributes:
        path: the run-id folder.
        record: ``record.json`` (format, run id, command, host, versions, method, dataset, ...).
        config: the resolved config.
        dataset: ``dataset.json`` (``id``, ``gt_sha256``, ``n_db``, ``n_queries``, ``n_distractors``,
            ``root``...).
        metrics: ``metrics.json`` (checked against ``per_query.json``).
        timings: ``timings.json``.
        protocol: the protocol (:class:`~oxbench.protocol.Protocol`, equal to its name:
            ``revisited``, ``original``, ``holidays``, ``ukbench``, ``gldv2``, ``ilias``).
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
    protocol: Protocol
    k: int
    labels: tuple[str, ...]
    queries: tuple[QueryRetrieved, ...]
    _per_query: Mapping[str, Mapping[str, NDArray[np.float64]]]

    @classmethod
    def load(cls, path: str | Path) -> RunRecord:
        """Read a run folder, or a config folder (its latest run).

        Raises:
            InputError: not a run folder, a missing, oversized, special or malformed file, another
                format version, a run that did not complete, files that disagree (one line naming
                the file or the record).
        """
        folder = Path(path)
        try:
            st = os.stat(folder)
        except OSError:
            raise InputError("run folder not found", folder) from None
        if not stat.S_ISDIR(st.st_mode):
            raise InputError("not a folder", folder)
        if not is_run_folder(folder):
            folder = latest_run(folder)
        rec_path = folder / "record.json"
        record = read_record_json(rec_path)
        _need(isinstance(record, dict), "expected a JSON object", rec_path)
        fmt = record.get("format")
        _need(
            fmt == RECORD_FORMAT and _is_int(fmt),
            f"run-record format {_show(fmt)}; this oxbench reads format {RECORD_FORMAT} "
            "(re-run, or use the oxbench that wrote it)",
            rec_path,
        )
        missing = [n for n in RUN_FILES if not os.path.lexists(folder / n)]
        _need(not missing, f"incomplete run folder: missing {', '.join(missing)}", folder)
        RecordFile.from_dict(record, rec_path)  # every field checked, one line naming it
        ds_path = folder / "dataset.json"
        dataset = read_record_json(ds_path)
        _need(isinstance(dataset, dict), "expected a JSON object", ds_path)
        for key in ("id", "gt_sha256"):
            _need(_is_text(dataset.get(key)), f"{key!r} must be a non-empty string", ds_path)
        for key in ("n_db", "n_queries", "n_distractors"):
            _need(
                _is_int(dataset.get(key)) and dataset[key] >= 0,
                f"{key!r} must be a non-negative integer",
                ds_path,
            )
        _need(dataset["n_queries"] >= 1, "'n_queries' must be at least 1", ds_path)
        for key in ("root", "distractors_root"):
            _need(
                dataset.get(key) is None or _is_text(dataset[key]),
                f"{key!r} must be a path or null",
                ds_path,
            )
        nq = int(dataset["n_queries"])
        config = read_record_json(folder / "config.json")
        metrics = read_record_json(folder / "metrics.json")
        timings = read_record_json(folder / "timings.json")
        for name, obj in (
            ("config.json", config),
            ("metrics.json", metrics),
            ("timings.json", timings),
        ):
            _need(isinstance(obj, dict), "expected a JSON object", folder / name)
        _need(
            all(isinstance(v, int | float) and not isinstance(v, bool) for v in timings.values()),
            "expected seconds per stage (numbers)",
            folder / "timings.json",
        )
        protocol, k, labels, queries = _parse_retrieved(
            read_record_json(folder / "retrieved.json"), nq, folder / "retrieved.json"
        )
        per_query = _parse_per_query(
            read_record_json(folder / "per_query.json"), nq, folder / "per_query.json"
        )
        expected = set(protocol.setups)
        _need(
            set(per_query) == expected,
            f"setups {sorted(per_query)} do not fit the {protocol} protocol ({sorted(expected)})",
            folder / "per_query.json",
        )
        _cross_check(metrics, protocol, per_query, folder)
        for name in ("ranks.npy", "summary.txt", "per_query.csv", "run.log"):
            _regular(folder / name)
        for name in OPTIONAL_FILES:
            if os.path.lexists(folder / name):
                _regular(folder / name)
        return cls(
            path=folder,
            record=record,
            config=config,
            dataset=dataset,
            metrics=metrics,
            timings=timings,
            protocol=protocol,
            k=k,
            labels=labels,
            queries=queries,
            _per_query={s: per_query[s] for s in protocol.setups},
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
    def label(self) -> str:
        """The run's label: the one recorded (``--label``, or the default the runner derived:
        :func:`default_label`), or for a record written before labels, its method's name."""
        recorded = self.record.get("label")
        return str(recorded) if recorded is not None else self.method

    @property
    def started(self) -> str:
        """The UTC start time as recorded (ISO 8601)."""
        return str(self.record["started"])

    @property
    def dataset_id(self) -> str:
        return str(self.dataset["id"])

    @property
    def gt_sha256(self) -> str:
        return str(self.dataset["gt_sha256"])

    @property
    def footprint(self) -> Mapping[str, Any] | None:
        """The index's measured RAM and disk (``record.json`` ``footprint``), when recorded."""
        fp = self.record.get("footprint")
        return fp if isinstance(fp, dict) else None

    @property
    def n_distractors(self) -> int:
        return int(self.dataset["n_distractors"])

    @property
    def distractor_tag(self) -> str:
        """``+1K``, ``+R1M`` or ``""``: :func:`distractor_tag` of this run's distractors."""
        return distractor_tag(self.n_distractors, self.config.get("distractors"))

    @property
    def image_roots(self) -> tuple[Path, ...]:
        """The folders the run's images were read from (dataset root, distractor root), as recorded."""
        return tuple(
            Path(self.dataset[k]) for k in ("root", "distractors_root") if self.dataset.get(k)
        )

    @property
    def n_queries(self) -> int:
        return len(self.queries)

    @property
    def seed_group(self) -> Mapping[str, Any] | None:
        """``record.json``'s ``seed_group`` (checked), ``None`` for a run of no seed group."""
        group = self.record.get("seed_group")
        return group if isinstance(group, dict) else None

    @property
    def preprocessing(self) -> Mapping[str, Any] | None:
        """``record.json``'s preprocessing card (how pixels became descriptors), or ``None``."""
        card = self.record.get("preprocessing")
        return card if isinstance(card, dict) else None

    @property
    def query_names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queries)

    @property
    def setups(self) -> tuple[str, ...]:
        """The protocol's setups, in order (``easy``, ``medium``, ``hard`` for revisited)."""
        return tuple(self._per_query)

    def describe(self) -> str:
        """``<label> on <dataset>[+N distractors] (<run folder>)``, for messages and legends."""
        extra = f"+{self.n_distractors} distractors" if self.n_distractors else ""
        return f"{self.label} on {self.dataset_id}{extra} ({self.path})"

    def headline(self) -> str:
        """The numbers ``oxbench runs`` prints, as the protocol writes its headline:
        ``mAP E 84.81 M 64.67 H 38.47``, ``mAP 80.10``, ``score 3.5000``."""
        return self.protocol.headline(number_text(self.mean))

    # -- per-query numbers -------------------------------------------------------------------
    def _setup(self, setup: str) -> str:
        if setup not in self._per_query:
            raise InputError(
                f"no setup {setup!r} in this run (setups: {', '.join(self.setups)})", self.path
            )
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
            InputError: not a regular file, unreadable, not 2-D integers, or not one column per query.
        """
        from oxbench.formats.arrays import map_npy

        path = self.path / "ranks.npy"
        _regular(path)
        arr = map_npy(path)  # a header claiming more than the file holds is one line
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
            InputError: a malformed, oversized or special ``matches.json``.
        """
        path = self.path / "matches.json"
        if not os.path.lexists(path):
            return None
        obj = read_record_json(path)
        _need(
            isinstance(obj, dict) and isinstance(obj.get("queries"), dict),
            'expected {"queries": {...}}',
            path,
        )
        out: dict[int, dict[int, list[list[float]]]] = {}
        for qk, per_db in obj["queries"].items():
            _need(
                bool(_INDEX_KEY.match(qk)) and int(qk) < self.n_queries,
                f"query key {_show(qk)} is not a query index",
                path,
            )
            _need(isinstance(per_db, dict), f"query {qk}: expected an object", path)
            inner: dict[int, list[list[float]]] = {}
            for dk, pairs in per_db.items():
                _need(
                    bool(_INDEX_KEY.match(dk)),
                    f"query {qk}: database key {_show(dk)} is not an index",
                    path,
                )
                _need(
                    isinstance(pairs, list)
                    and all(
                        isinstance(p, list) and len(p) == 4 and all(_is_num(v) for v in p)
                        for p in pairs
                    ),
                    f"query {qk}, image {dk}: expected a list of [xq, yq, xd, yd]",
                    path,
                )
                inner[int(dk)] = [[float(v) for v in p] for p in pairs]
            out[int(qk)] = inner
        return out

    def boxes(self) -> tuple[str, dict[tuple[int, int], tuple[float, float, float, float]]] | None:
        """The predicted boxes, ``(predictor, {(query index, db index): (x1, y1, x2, y2)})``, or
        ``None`` when the run predicted none (``boxes.json`` absent).

        Raises:
            InputError: a malformed, oversized or special ``boxes.json``.
        """
        path = self.path / "boxes.json"
        if not os.path.lexists(path):
            return None
        obj = read_record_json(path)
        _need(
            isinstance(obj, dict)
            and isinstance(obj.get("queries"), dict)
            and isinstance(obj.get("predictor"), str),
            'expected {"predictor": name, "queries": {...}}',
            path,
        )
        out: dict[tuple[int, int], tuple[float, float, float, float]] = {}
        for qk, per_db in obj["queries"].items():
            _need(
                bool(_INDEX_KEY.match(qk)) and int(qk) < self.n_queries,
                f"query key {_show(qk)} is not a query index",
                path,
            )
            _need(isinstance(per_db, dict), f"query {qk}: expected an object", path)
            for dk, entry in per_db.items():
                _need(
                    bool(_INDEX_KEY.match(dk)),
                    f"query {qk}: database key {_show(dk)} is not an index",
                    path,
                )
                box = entry.get("box") if isinstance(entry, dict) else None
                _need(
                    isinstance(box, list) and len(box) == 4 and all(_is_num(v) for v in box),
                    f'query {qk}, image {dk}: expected {{"box": [x1, y1, x2, y2]}}',
                    path,
                )
                assert isinstance(box, list)
                out[(int(qk), int(dk))] = (
                    float(box[0]),
                    float(box[1]),
                    float(box[2]),
                    float(box[3]),
                )
        return obj["predictor"], out


def _regular(path: Path) -> None:
    """Refuse a record file that is a link or not a regular file, or too large (nothing is read)."""
    try:
        st = os.lstat(path)
    except OSError:
        raise InputError("file not found", path) from None
    if stat.S_ISLNK(st.st_mode):
        raise InputError(
            "a run record's files are regular files; this one is a symbolic link", path
        )
    if not stat.S_ISREG(st.st_mode):
        raise InputError("not a regular file (a folder, FIFO, device or socket)", path)
    limit = FILE_LIMITS.get(path.name)
    if limit is not None and st.st_size > limit:
        raise InputError(
            f"file is {st.st_size:,} bytes; the limit for this file of a run record is {limit:,}",
            path,
        )


def load_runs(paths: Sequence[str | Path]) -> list[RunRecord]:
    """:meth:`RunRecord.load` of each path, in order."""
    return [RunRecord.load(p) for p in paths]


# --- listing ------------------------------------------------------------------------------------

#: The card entries :func:`preprocessing_tag` shows, in order (the rest is in the digest).
_CARD_SHOWN = ("token_pooling", "pooling", "max_side", "query_crop", "query_resize", "scales")


def preprocessing_tag(card: Mapping[str, Any] | None) -> str:
    """A preprocessing card in one short line -- the pooling, side, query crop and scales, the
    weights' digest and the card's own digest -- so runs that differ only in their preprocessing
    read apart (``oxbench runs``, ``oxbench report``); ``""`` for no card.

    Example:
        >>> preprocessing_tag({"token_pooling": "cls", "max_side": 518, "query_crop": "full",
        ...                    "scales": [1.0], "weights_sha256": "ab" * 32})
        'cls 518px full x1 w:abababab #29f87154'
    """
    if not card:
        return ""
    parts: list[str] = []
    for key in _CARD_SHOWN:
        value = card.get(key)
        if value is None:
            continue
        if key == "max_side":
            parts.append(f"{value}px")
        elif key == "scales":
            parts.append("x" + ",".join(f"{float(v):g}" for v in value))
        else:
            parts.append(str(value))
    sha = card.get("weights_sha256")
    if isinstance(sha, str):
        parts.append(f"w:{sha[:8]}")
    return " ".join(parts + [f"#{json_digest(dict(card), 8)}"])


@dataclass(frozen=True)
class RunSummary:
    """One line of ``oxbench runs``: where a run is and its headline numbers."""

    run_dir: Path
    run_id: str
    dataset: str
    method: str
    started: str
    headline: str
    label: str = ""
    n_distractors: int = 0
    seed_group: Mapping[str, Any] | None = None
    preprocessing: Mapping[str, Any] | None = None


def find_runs(
    runs_dir: str | Path = "runs", *, skipped: list[Path] | None = None
) -> list[RunSummary]:
    """Every run below ``runs_dir`` (itself, and config folders one level down), oldest first.

    Each is read and checked by :meth:`RunRecord.load`; one that fails is skipped with one warning
    naming it and why (and appended to ``skipped`` when given), so ``runs`` lists exactly the
    records the other commands accept.
    """
    runs_dir = Path(runs_dir)
    try:
        children = sorted(runs_dir.iterdir())
    except OSError:
        return []
    candidates = [runs_dir] + [
        p for p in children if not p.name.startswith(".") and not is_run_folder(p) and p.is_dir()
    ]
    out: list[RunSummary] = []
    for cfg in candidates:
        for run_dir in list_runs(cfg):
            try:
                rec = RunRecord.load(run_dir)
            except InputError as exc:
                log.warning("skipped a run record: %s", exc)
                if skipped is not None:
                    skipped.append(run_dir)
                continue
            out.append(
                RunSummary(
                    run_dir,
                    rec.run_id,
                    rec.dataset_id,
                    rec.method,
                    rec.started,
                    rec.headline(),
                    rec.label,
                    rec.n_distractors,
                    rec.seed_group,
                    rec.preprocessing,
                )
            )
    return sorted(out, key=lambda r: (r.started, str(r.run_dir)))
