"""The original Oxford 5K / Paris 6K ground-truth text files and ranked-list folders.

One parser serves both datasets (``gt_files_170407`` for Oxford, ``paris_120310`` for Paris). Per
query there are four files ``<landmark>_<n>_{good,ok,junk,query}.txt``:

- ``good`` / ``ok`` / ``junk``: image names, one per line, without extension. Each list is a set
  (Oxford's ``all_souls_1_good.txt`` lists ``all_souls_000091`` twice: one positive). A list may be
  empty (all 55 Paris ``*_good.txt`` files are).
- ``query``: one line ``<image> x1 y1 x2 y2``. Oxford writes the image as ``oxc1_<name>``; the
  prefix is stripped. Paris file names lack the ``paris_`` prefix, but the names inside carry it,
  so nothing needs rewriting there.

In the original protocol the query image is part of the database (and is one of its own
positives); positives are good + ok, junk is ignored.

What is unambiguous is normalised: surrounding whitespace, CR line endings, blank lines and a
``.jpg`` suffix. Everything else is refused with :class:`~oxbench.errors.InputError` naming the
file and line: a name with inner whitespace, a malformed query line, a query missing one of its
four files, an image labelled both positive (good or ok) and junk for one query, and -- when
``db_names`` is given -- a name that is not in the database. Labels that agree are no
contradiction: an image in both ``_good.txt`` and ``_ok.txt`` (or twice in one file) is one
positive, as the official ``compute_ap`` counts it (it reads the lists into one set).

Queries are known by their id (``all_souls_1``, the stem of the ``_query.txt`` file, the name
``compute_ap`` takes): :attr:`Query.query_id <oxbench.groundtruth.Query.query_id>`.

Ranked lists (the input of the official ``compute_ap``) are one ``<query>.txt`` per query, one
image name per line, best first; see :func:`read_ranked_dir`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.formats.text import read_text_lines
from oxbench.groundtruth import GroundTruth, Query, make_query
from oxbench.protocol import get_protocol

log = logging.getLogger(__name__)

_GT_FILE = re.compile(r"(?P<stem>(?P<landmark>.+)_(?P<n>\d+))_(?P<kind>good|ok|junk|query)\.txt")
_KINDS = ("good", "ok", "junk", "query")
_OXFORD_QUERY_PREFIX = "oxc1_"

#: The 11 landmarks of each city in the official order; each has 5 queries (``<landmark>_1..5``).
LANDMARKS: dict[str, tuple[str, ...]] = {
    "oxford5k": (
        "all_souls", "ashmolean", "balliol", "bodleian", "christ_church", "cornmarket", "hertford",
        "keble", "magdalen", "pitt_rivers", "radcliffe_camera",
    ),
    "paris6k": (
        "defense", "eiffel", "invalides", "louvre", "moulinrouge", "museedorsay", "notredame",
        "pantheon", "pompidou", "sacrecoeur", "triomphe",
    ),
}  # fmt: skip
QUERIES_PER_LANDMARK = 5
_EXTENSIONS = (".jpg", ".JPG", ".jpeg", ".JPEG")


def clean_name(raw: str, source: str | Path, lineno: int) -> str | None:
    """Normalise one image name read from a text file; ``None`` for a blank line.

    Surrounding whitespace (including a CR from CRLF files) and a ``.jpg`` suffix are removed.
    A name with inner whitespace is refused: it cannot be told apart from two names.

    Args:
        raw: the line as read.
        source: the file, for the error message.
        lineno: 1-based line number, for the error message.

    Raises:
        InputError: the name contains whitespace inside or is only an extension.

    Example:
        >>> clean_name(" all_souls_000013.jpg\\r\\n", "all_souls_1_good.txt", 1)
        'all_souls_000013'
    """
    name = raw.strip()
    if not name:
        return None
    if any(ch.isspace() for ch in name):
        raise InputError(f"line {lineno}: image name {name!r} contains whitespace", source)
    for ext in _EXTENSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    if not name:
        raise InputError(f"line {lineno}: empty image name {raw.strip()!r}", source)
    return name


def _read_name_list(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, clean name) for every non-blank line of a name list."""
    for lineno, raw in enumerate(read_text_lines(path), start=1):
        name = clean_name(raw, path, lineno)
        if name is not None:
            yield lineno, name


@dataclass(frozen=True)
class QuerySpec:
    """One query's entry in an Oxford/Paris ground-truth folder (before indexing).

    Attributes:
        query_id: the file stem, e.g. ``all_souls_1`` or ``defense_1`` (what ``compute_ap`` takes).
        image: the query image name (``oxc1_`` stripped), e.g. ``all_souls_000013``.
        bbox: ``(x1, y1, x2, y2)`` as written in the query file.
        files: the four files by kind (``good``, ``ok``, ``junk``, ``query``).
    """

    query_id: str
    image: str
    bbox: tuple[float, float, float, float]
    files: dict[str, Path]


def _parse_query_file(path: Path) -> tuple[str, tuple[float, float, float, float], bool]:
    lines = [(i, ln) for i, ln in enumerate(read_text_lines(path), start=1) if ln.strip()]
    if len(lines) != 1:
        raise InputError(
            f"expected one line '<image> x1 y1 x2 y2', found {len(lines)} non-blank lines", path
        )
    lineno, line = lines[0]
    tokens = line.split()
    if len(tokens) != 5:
        raise InputError(
            f"line {lineno}: expected '<image> x1 y1 x2 y2', got {line.strip()!r}", path
        )
    name = clean_name(tokens[0], path, lineno)
    assert name is not None
    oxford = name.startswith(_OXFORD_QUERY_PREFIX)
    if oxford:
        name = name[len(_OXFORD_QUERY_PREFIX) :]
        if not name:
            raise InputError(f"line {lineno}: empty query image name", path)
    try:
        vals = [float(t) for t in tokens[1:]]
    except ValueError:
        raise InputError(
            f"line {lineno}: box coordinates must be numbers, got {tokens[1:]}", path
        ) from None
    if not all(math.isfinite(v) for v in vals):
        raise InputError(f"line {lineno}: box coordinates must be finite, got {tokens[1:]}", path)
    x1, y1, x2, y2 = vals
    if x2 < x1 or y2 < y1:
        raise InputError(f"line {lineno}: malformed box (x2 < x1 or y2 < y1): {tokens[1:]}", path)
    return name, (x1, y1, x2, y2), oxford


def list_queries(gt_dir: str | Path) -> tuple[QuerySpec, ...]:
    """Find the queries of a ground-truth folder, in the official order, and parse their query files.

    The order is landmark name, then query number (``all_souls_1`` ... ``radcliffe_camera_5``), the
    order of ``qimlist`` in the revisitop pickles. Files that do not match
    ``<landmark>_<n>_{good,ok,junk,query}.txt`` are ignored.

    Raises:
        InputError: the folder is missing, holds no query, or a query lacks one of its four files.
    """
    gt_dir = Path(gt_dir)
    if not gt_dir.is_dir():
        raise InputError("ground-truth folder not found", gt_dir)
    found: dict[tuple[str, int], dict[str, Path]] = {}
    for path in gt_dir.iterdir():
        m = _GT_FILE.fullmatch(path.name)
        if m is None or not path.is_file():
            continue
        found.setdefault((m["landmark"], int(m["n"])), {})[m["kind"]] = path
    if not found:
        raise InputError(
            "no ground-truth files '<landmark>_<n>_{good,ok,junk,query}.txt' found", gt_dir
        )
    specs: list[QuerySpec] = []
    for (landmark, n), files in sorted(found.items()):
        stem = f"{landmark}_{n}"
        missing = [k for k in _KINDS if k not in files]
        if missing:
            names = ", ".join(f"{stem}_{k}.txt" for k in missing)
            raise InputError(f"query {stem}: missing file(s) {names}", gt_dir)
        image, bbox, _ = _parse_query_file(files["query"])
        specs.append(QuerySpec(stem, image, bbox, dict(files)))
    return tuple(specs)


def _infer_dataset(gt_dir: Path, specs: Sequence[QuerySpec]) -> str:
    first = read_text_lines(specs[0].files["query"])
    if first and first[0].strip().startswith(_OXFORD_QUERY_PREFIX):
        return "oxford5k"
    if all(s.image.startswith("paris_") for s in specs):
        return "paris6k"
    return gt_dir.name


def read_gt_dir(
    gt_dir: str | Path,
    *,
    db_names: Sequence[str] | None = None,
    dataset: str | None = None,
) -> GroundTruth:
    """Read an original Oxford/Paris ground-truth folder (protocol ``original``).

    Args:
        gt_dir: the folder holding ``<landmark>_<n>_{good,ok,junk,query}.txt`` (Oxford
            ``gt_files_170407`` or Paris ``paris_120310``).
        db_names: the database image names (e.g. ``read_gnd(pkl).db_names``); labels index into
            it and a name not in it is refused. Default: the sorted union of every name in the
            files (query images included).
        dataset: dataset id for printed lines; default ``oxford5k`` when the query files use the
            ``oxc1_`` prefix, ``paris6k`` when every query image is ``paris_*``, else the folder name.

    Returns:
        A validated :class:`GroundTruth`: per query ``good``, ``ok``, ``junk`` and the box; the
        query name is the query image name (as in the revisitop pickles' ``qimlist``), its
        ``query_id`` the file stem (``all_souls_1``).

    Raises:
        InputError: naming the file and line, see the module docstring.
    """
    gt_dir = Path(gt_dir)
    specs = list_queries(gt_dir)
    # name -> (file, line) of its first occurrence, per query and kind
    per_query: list[dict[str, dict[str, tuple[Path, int]]]] = []
    for spec in specs:
        kinds: dict[str, dict[str, tuple[Path, int]]] = {}
        where: dict[str, tuple[str, Path, int]] = {}
        for kind in ("good", "ok", "junk"):
            names: dict[str, tuple[Path, int]] = {}
            path = spec.files[kind]
            for lineno, name in _read_name_list(path):
                if name in names:
                    log.debug("%s line %d: %s listed again (kept once)", path, lineno, name)
                    continue
                if name in where:
                    other_kind, other_path, other_line = where[name]
                    if kind != "junk" and other_kind != "junk":  # good and ok agree: one positive
                        log.debug(
                            "%s line %d: %s is also %s (one positive)",
                            path,
                            lineno,
                            name,
                            other_kind,
                        )
                        continue
                    raise InputError(
                        f"line {lineno}: {name} is also labelled {other_kind} "
                        f"({other_path.name} line {other_line}) for query {spec.query_id}",
                        path,
                    )
                names[name] = (path, lineno)
                where[name] = (kind, path, lineno)
            kinds[kind] = names
        per_query.append(kinds)

    if db_names is None:
        universe = {s.image for s in specs}
        for kinds in per_query:
            for names in kinds.values():
                universe.update(names)
        db = tuple(sorted(universe))
    else:
        db = tuple(db_names)
    index = {name: i for i, name in enumerate(db)}
    if len(index) != len(db):
        raise InputError("db_names lists an image name twice", gt_dir)

    queries: list[Query] = []
    for spec, kinds in zip(specs, per_query, strict=True):
        labels: dict[str, list[int]] = {}
        for kind, names in kinds.items():
            idx: list[int] = []
            for name, (path, lineno) in names.items():
                i = index.get(name)
                if i is None:
                    raise InputError(
                        f"line {lineno}: unknown image {name!r} (not in the database)", path
                    )
                idx.append(i)
            labels[kind] = idx
        query = make_query(spec.image, spec.bbox, source=str(gt_dir), **labels)
        queries.append(dataclasses.replace(query, query_id=spec.query_id))
    name = dataset or _infer_dataset(gt_dir, specs)
    return GroundTruth(name, get_protocol("original"), db, tuple(queries), str(gt_dir)).validate()


def _ranked_file_candidates(gt: GroundTruth, ranked_dir: Path) -> list[list[Path]]:
    """Per query, the accepted ranked-list file names: ``<query image>.txt`` and, when the query id
    is known, ``<query id>.txt`` (``all_souls_1.txt``)."""
    out = []
    for q in gt.queries:
        names = [f"{q.name}.txt"]
        if q.query_id is not None and q.query_id != q.name:
            names.append(f"{q.query_id}.txt")
        out.append([ranked_dir / n for n in names])
    return out


def original_query_ids(names: Sequence[str]) -> tuple[str, ...] | None:
    """The ids (``all_souls_1``) of the 55 Oxford 5K or Paris 6K queries, in the official order.

    The official order (the ``<landmark>_<n>_query.txt`` files sorted, and the revisitop pickles'
    ``qimlist``) is the 11 landmarks of :data:`LANDMARKS` in turn, 5 queries each. A query's image
    does not tell its landmark (``all_souls_3`` is ``oxford_002985``), so the ids come from the
    position. The city is Paris when every query image is ``paris_*``, else Oxford. Used for the
    old-protocol pickles, which store the query images only.

    Returns:
        The 55 ids, or None when there are not 55 queries (not an official query list).

    Example:
        >>> original_query_ids(["paris_defense_000605"] * 55)[5:7]
        ('eiffel_1', 'eiffel_2')
    """
    per = QUERIES_PER_LANDMARK
    city = "paris6k" if names and all(n.startswith("paris_") for n in names) else "oxford5k"
    landmarks = LANDMARKS[city]
    if len(names) != len(landmarks) * per:
        return None
    return tuple(f"{landmarks[i // per]}_{i % per + 1}" for i in range(len(names)))


def read_ranked_dir(
    ranked_dir: str | Path, gt: GroundTruth
) -> tuple[GroundTruth, NDArray[np.int64]]:
    """Read one ranked list per query into the internal ranks layout.

    Each query's list is ``<query>.txt`` in ``ranked_dir``, one image name per line, best first
    (the input of the official ``compute_ap``). ``<query>`` is the query image name
    (``all_souls_000013``) or, when ``gt`` was read by :func:`read_gt_dir`, also the ground-truth
    query id (``all_souls_1``); having both files for one query is refused as ambiguous. Names are
    normalised like the ground truth (whitespace, CR, ``.jpg``; blank lines skipped). Lists may be
    truncated and of different lengths.

    Args:
        ranked_dir: the folder of ranked lists.
        gt: the ground truth the lists rank.

    Returns:
        ``(gt2, ranks)``: ``gt2`` is ``gt`` whose ``db_names`` have the names that are not in the
        database appended, in order of first appearance (they are negatives for every query);
        ``ranks`` is ``int64 [n_queries, k]`` indices into ``gt2.db_names``, ``k`` the longest
        list, shorter rows padded with -1.

    Raises:
        InputError: a missing or ambiguous query file, a name repeated within one list, a name with
            inner whitespace (naming the file and line).
    """
    ranked_dir = Path(ranked_dir)
    if not ranked_dir.is_dir():
        raise InputError("ranked-list folder not found", ranked_dir)
    index = {name: i for i, name in enumerate(gt.db_names)}
    extra: list[str] = []
    rows: list[list[int]] = []
    for q, candidates in zip(gt.queries, _ranked_file_candidates(gt, ranked_dir), strict=True):
        present = [p for p in candidates if p.is_file()]
        if not present:
            raise InputError(
                f"no ranked list for query {q.name} (expected {candidates[-1].name})", ranked_dir
            )
        if len(present) > 1:
            raise InputError(
                f"two ranked lists for query {q.name}: {present[0].name} and {present[1].name}",
                ranked_dir,
            )
        path = present[0]
        seen: dict[str, int] = {}
        row: list[int] = []
        for lineno, name in _read_name_list(path):
            if name in seen:
                raise InputError(
                    f"line {lineno}: {name} is already ranked at line {seen[name]}", path
                )
            seen[name] = lineno
            i = index.get(name)
            if i is None:
                i = len(index)
                index[name] = i
                extra.append(name)
            row.append(i)
        rows.append(row)
    if extra:
        log.info(
            "%d ranked image(s) not in the ground truth's database: counted as negatives",
            len(extra),
        )
    k = max((len(r) for r in rows), default=0)
    ranks = np.full((len(rows), k), -1, dtype=np.int64)
    for qi, row in enumerate(rows):
        ranks[qi, : len(row)] = row
    gt2 = (
        gt
        if not extra
        else GroundTruth(gt.dataset, gt.protocol, gt.db_names + tuple(extra), gt.queries, gt.source)
    )
    return gt2, ranks
