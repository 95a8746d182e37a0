"""ILIAS files: the ground-truth ids, the taxonomy and the similarity files of ``ilias-vrg/ilias``.

Ground truth, in ``<dir>/image_ids/`` (``evaluation/download_ids.sh``), read as
``evaluation/src/dataset.py`` reads it:

- ``image_query_ids.txt``: one image query a line, its id first, then comma-separated fields
  oxbench does not use (``bold_bimp_000/query/Q000_00.jpg,...``);
- ``text_query_ids.txt``: one text query id a line (``bold_bimp_000/query/T000.txt``);
- ``positive_ids.txt``: ``id,scale,clutter`` a line (``bold_bimp_000/pos/P000_00.jpg,0.12,25``).

An id's first path part is its object instance; every instance has a text query, and a query's
positives are its instance's. The taxonomy (``misc/taxonomy.json``) is ``{category: {subcategory:
{subsubcategory: [instance, ...]}}}``.

Similarities (``knn_search/search.py`` writes them):

- JSON: ``{query id: {database id: score}}``, each query's entries in any order;
- pickle: ``{"query_ids": [...], "db_ids": [...], "sims": [n_q, k] scores, "ranks": [n_q, k]
  indices into db_ids}`` (numpy arrays), read with :mod:`oxbench.formats.safe_pickle` (arrays of
  numbers and text only: no code of the file runs).

Where the official reader misbehaves, one line names the file and the problem instead: a line with
stray whitespace, a ``#`` (numpy's reader cuts a comment there) or another number of fields than the
others, a scale that is not a finite number, a clutter that is not a whole number, an id listed
twice, a positive or image query of an instance with no text query, a query that is not one of the
ground truth's, a query or a database image twice in one file or list, a score that is not a finite
number (NaN, inf, text, ``true``), a pickle that is not plain data. A query the similarities omit is
skipped, as the official code skips it, and named.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.formats.safe_pickle import load_plain_pickle
from oxbench.formats.text import read_input_bytes, read_text_lines
from oxbench.groundtruth import GroundTruth, Query, as_index_array
from oxbench.protocol import get_protocol

IDS_DIR = "image_ids"
IMAGE_QUERIES = "image_query_ids.txt"
TEXT_QUERIES = "text_query_ids.txt"
POSITIVES = "positive_ids.txt"
#: Largest similarity file read (a top-1000 JSON of every query is about 100 MB).
SIMILARITIES_LIMIT = 8 << 30


@dataclass(frozen=True, eq=False)
class IliasGroundTruth(GroundTruth):
    """ILIAS ground truth: queries (image queries, then text queries, each list sorted, as
    ``ILIAS.get_queries``), their instance's positives as ``good``, and per database image its
    annotations.

    Attributes:
        scale: per database image, the positive's annotated scale (``nan`` for a distractor).
        clutter: per database image, the positive's annotated clutter (``nan`` for a distractor).
        taxonomy: instance -> ``"category-subcategory"`` (``misc/taxonomy.json``), or ``None``.
    """

    scale: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    clutter: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    taxonomy: Mapping[str, str] | None = None

    def annotations(self) -> dict[str, Any]:
        def plain(values: NDArray[np.float64]) -> list[float | None]:
            return [None if math.isnan(v) else float(v) for v in values.tolist()]

        return {
            "scale": plain(self.scale),
            "clutter": plain(self.clutter),
            "taxonomy": None if self.taxonomy is None else dict(sorted(self.taxonomy.items())),
        }

    def validate(self) -> IliasGroundTruth:
        super().validate()
        if self.scale.shape != (self.n_db,) or self.clutter.shape != (self.n_db,):
            raise InputError(
                f"scale and clutter must hold one value per database image ({self.n_db})",
                self.source,
            )
        if self.taxonomy is not None:
            missing = next((q for q in self.queries if instance(q.name) not in self.taxonomy), None)
            if missing is not None:
                raise InputError(
                    f"instance {instance(missing.name)} of query {missing.name} is not in the taxonomy",
                    self.source,
                )
        return self


def instance(query: str) -> str:
    """A query's instance: the first part of its id (``bold_bimp_000/query/Q000_00.jpg``)."""
    return query.split("/")[0]


def check_scores(scores: NDArray[Any], source: str | None = None) -> None:
    """Refuse scores that are not real numbers or not finite (the official code's scikit-learn
    refuses them too, later and with a traceback)."""
    if scores.dtype == bool or not (
        np.issubdtype(scores.dtype, np.floating) or np.issubdtype(scores.dtype, np.integer)
    ):
        raise InputError(f"scores must be real numbers, got dtype {scores.dtype}", source)
    if np.issubdtype(scores.dtype, np.floating) and not np.isfinite(scores).all():
        where = np.argwhere(~np.isfinite(scores))[0]
        raise InputError(
            f"score at {tuple(int(i) for i in where)} is {scores[tuple(where)]}: scores must be finite",
            source,
        )


@dataclass(frozen=True, eq=False)
class IliasIds:
    """The ground-truth id files.

    Attributes:
        image_queries: image query ids, sorted.
        text_queries: text query ids, sorted.
        positives: positive ids, sorted.
        scale: per positive, its annotated scale.
        clutter: per positive, its annotated clutter.
        source: the folder read.
    """

    image_queries: tuple[str, ...]
    text_queries: tuple[str, ...]
    positives: tuple[str, ...]
    scale: NDArray[np.float64]
    clutter: NDArray[np.int64]
    source: str


def _fields(path: Path, *, columns: int | None, sep: str | None) -> list[tuple[int, list[str]]]:
    """Per non-empty line its 1-based number and fields; every line the same number of fields."""
    out: list[tuple[int, list[str]]] = []
    width = columns
    for n, line in enumerate(read_text_lines(path), 1):
        if not line.strip():
            continue
        if "#" in line:
            raise InputError(f"line {n}: '#' in an id (numpy's reader cuts a comment there)", path)
        parts = line.split(sep) if sep is not None else [line]
        if any(not p or p != p.strip() or (sep is None and " " in p) for p in parts):
            raise InputError(f"line {n}: malformed entry {line[:80]!r}", path)
        if width is None:
            width = len(parts)
        elif len(parts) != width:
            raise InputError(f"line {n}: {len(parts)} fields, expected {width}", path)
        out.append((n, parts))
    if not out:
        raise InputError("no ids", path)
    return out


def _unique_sorted(ids: Sequence[str], path: Path) -> tuple[str, ...]:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise InputError(f"{i} is listed twice", path)
        seen.add(i)
    return tuple(sorted(ids))


def read_ids(gt_dir: str | Path) -> IliasIds:
    """Read ``<gt_dir>/image_ids/{image_query_ids,text_query_ids,positive_ids}.txt``.

    Raises:
        InputError: a missing or malformed file (see the module docstring).
    """
    base = Path(gt_dir)
    folder = base / IDS_DIR if (base / IDS_DIR).is_dir() else base
    if not (folder / POSITIVES).exists():
        raise InputError(
            f"no {IDS_DIR}/{POSITIVES}: give the ILIAS folder holding {IDS_DIR}/ "
            "(evaluation/download_ids.sh)",
            base,
        )
    images = [f[0] for _, f in _fields(folder / IMAGE_QUERIES, columns=None, sep=",")]
    texts = [f[0] for _, f in _fields(folder / TEXT_QUERIES, columns=1, sep=None)]
    pos_ids: list[str] = []
    scale: list[float] = []
    clutter: list[int] = []
    for n, (pid, s, c) in _fields(folder / POSITIVES, columns=3, sep=","):
        try:
            value = float(s)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise InputError(
                f"line {n}: scale {s[:40]!r} is not a finite number", folder / POSITIVES
            )
        if not c.lstrip("-").isdigit() or len(c) > 18:
            raise InputError(
                f"line {n}: clutter {c[:40]!r} is not a whole number", folder / POSITIVES
            )
        pos_ids.append(pid)
        scale.append(value)
        clutter.append(int(c))
    order = sorted(range(len(pos_ids)), key=pos_ids.__getitem__)
    positives = _unique_sorted(pos_ids, folder / POSITIVES)
    image_queries = _unique_sorted(images, folder / IMAGE_QUERIES)
    text_queries = _unique_sorted(texts, folder / TEXT_QUERIES)
    instances = {instance(t) for t in text_queries}
    for what, ids, path in (
        ("positive", positives, folder / POSITIVES),
        ("image query", image_queries, folder / IMAGE_QUERIES),
    ):
        orphan = next((i for i in ids if instance(i) not in instances), None)
        if orphan is not None:
            raise InputError(
                f"{what} {orphan}: its instance {instance(orphan)} has no text query "
                f"({TEXT_QUERIES})",
                path,
            )
    clash = sorted(set(positives) & (set(image_queries) | set(text_queries)))
    if clash:
        raise InputError(f"{clash[0]} is both a query and a positive", folder)
    return IliasIds(
        image_queries,
        text_queries,
        positives,
        np.array([scale[i] for i in order], dtype=np.float64),
        np.array([clutter[i] for i in order], dtype=np.int64),
        str(folder),
    )


def read_taxonomy(path: str | Path) -> dict[str, str]:
    """``misc/taxonomy.json`` as instance -> ``"category-subcategory"``.

    Raises:
        InputError: not JSON of that shape, or an instance listed twice.
    """
    try:
        data = json.loads(read_input_bytes(path, limit=64 << 20).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(
            f"not a JSON taxonomy ({' '.join(str(exc).split())[:120]})", path
        ) from None
    out: dict[str, str] = {}
    if not isinstance(data, dict):
        raise InputError("expected {category: {subcategory: {...: [instances]}}}", path)
    for c, sub in data.items():
        if not isinstance(sub, dict):
            raise InputError(f"category {c!r}: expected an object of subcategories", path)
        for sc, leaves in sub.items():
            if not isinstance(leaves, dict):
                raise InputError(f"{c}/{sc}: expected an object of lists of instances", path)
            for group, names in leaves.items():
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    raise InputError(f"{c}/{sc}/{group}: expected a list of instance names", path)
                for n in names:
                    if n in out:
                        raise InputError(f"instance {n} is listed twice", path)
                    out[n] = f"{c}-{sc}"
    return out


def _strip_jpg(name: str) -> str:
    return name[:-4] if name.lower().endswith(".jpg") else name


def ground_truth(
    ids: IliasIds,
    *,
    taxonomy: Mapping[str, str] | None = None,
    queries: str = "all",
    distractors: Sequence[str] = (),
    extension: bool = True,
    dataset: str = "ilias",
) -> IliasGroundTruth:
    """ILIAS ground truth: the database is the positives (sorted), then ``distractors``.

    Args:
        ids: :func:`read_ids`.
        taxonomy: :func:`read_taxonomy`, for the per-category breakdown.
        queries: ``all`` (image then text queries, as the official code iterates them),
            ``image`` or ``text``.
        distractors: database images after the positives (no annotations).
        extension: keep the ids as written; ``False`` drops a ``.jpg`` (the names oxbench's name
            lists use).
        dataset: the dataset id of the printed lines.
    """
    if queries not in ("all", "image", "text"):
        raise InputError(f"queries must be all, image or text, got {queries!r}")
    name = (lambda s: s) if extension else _strip_jpg
    db_names = tuple(name(p) for p in ids.positives) + tuple(distractors)
    if len(set(db_names)) != len(db_names):
        raise InputError("a database image is named twice (positives and distractors)", ids.source)
    by_instance: dict[str, list[int]] = {}
    for i, p in enumerate(ids.positives):
        by_instance.setdefault(instance(p), []).append(i)
    chosen = {
        "all": ids.image_queries + ids.text_queries,
        "image": ids.image_queries,
        "text": ids.text_queries,
    }[queries]
    qs = tuple(
        Query(
            name(q),
            good=as_index_array(by_instance.get(instance(q), []), what=q, source=ids.source),
        )
        for q in chosen
    )
    n = len(db_names)
    scale = np.full(n, np.nan)
    clutter = np.full(n, np.nan)
    scale[: len(ids.positives)] = ids.scale
    clutter[: len(ids.positives)] = ids.clutter
    return IliasGroundTruth(
        dataset,
        get_protocol("ilias"),
        db_names,
        qs,
        ids.source,
        scale=scale,
        clutter=clutter,
        taxonomy=None if taxonomy is None else dict(taxonomy),
    ).validate()


@dataclass(frozen=True, eq=False)
class ScoredLists:
    """Similarities read against a ground truth: per query scored, in the order read.

    Attributes:
        queries: ground-truth query indices, in the order the official code scores them.
        ids: per query, the ground-truth database index of each entry (-1: no image of the
            ground truth, e.g. a distractor).
        scores: per query, the entries' scores (the dtype the file gives).
    """

    queries: tuple[int, ...]
    ids: tuple[NDArray[np.int64], ...]
    scores: tuple[NDArray[Any], ...]

    def __iter__(self) -> Iterator[tuple[int, NDArray[np.int64], NDArray[Any]]]:
        return iter(zip(self.queries, self.ids, self.scores, strict=True))


def _refuse_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a number a score can be")


def _pairs(pairs: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return pairs  # keep every key (a duplicate is refused, not overwritten)


def _scores_of(values: list[Any], where: str, path: Path) -> NDArray[Any]:
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise InputError(f"{where}: score {str(v)[:40]!r} is not a number", path)
        if isinstance(v, float) and not math.isfinite(v):
            raise InputError(f"{where}: score {v} is not finite", path)
    try:
        arr = np.array(values)  # as the official code builds it (int64 if every score is whole)
    except OverflowError:
        arr = np.array([], dtype=object)
    if arr.dtype == object:
        raise InputError(f"{where}: a score is beyond 64-bit numbers", path)
    return arr


def read_similarities(path: str | Path, gt: IliasGroundTruth) -> ScoredLists:
    """Read a similarity file (``.json`` or ``.pkl``) against ``gt``.

    JSON queries are scored in the ground truth's order (the official ``_evaluate_json`` walks
    ``get_queries()``); pickle queries in the file's order (``_evaluate_pkl``).

    Raises:
        InputError: see the module docstring.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".json", ".pkl", ".pickle"):
        raise InputError("similarities must be .json or .pkl (ilias-vrg/ilias knn_search)", p)
    query_of = {name: i for i, name in enumerate(gt.query_names)}
    db_of = {name: i for i, name in enumerate(gt.db_names)}
    # ids keep their .jpg unless the ground truth's names dropped it (ground_truth(extension=False))
    strip = not any(n.lower().endswith(".jpg") for n in gt.db_names[:1] + gt.query_names[:1])

    def key(name: str) -> str:
        return _strip_jpg(name) if strip else name

    if suffix == ".json":
        return _read_json(p, gt, query_of, db_of, key)
    return _read_pickle(p, gt, query_of, db_of, key)


def _query_index(name: Any, query_of: Mapping[str, int], key: Any, path: Path) -> int:
    if not isinstance(name, str):
        raise InputError(f"query id {str(name)[:60]!r} is not text", path)
    qi = query_of.get(key(name))
    if qi is None:
        raise InputError(f"query {name} is not a query of the ground truth", path)
    return qi


def _read_json(
    p: Path, gt: IliasGroundTruth, query_of: Mapping[str, int], db_of: Mapping[str, int], key: Any
) -> ScoredLists:
    data = read_input_bytes(p, limit=SIMILARITIES_LIMIT)
    try:
        top = json.loads(
            data.decode("utf-8-sig"), object_pairs_hook=_pairs, parse_constant=_refuse_constant
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputError(f"not readable JSON ({' '.join(str(exc).split())[:160]})", p) from None
    shape_ok = isinstance(top, list) and all(
        isinstance(item, tuple)
        and isinstance(item[1], list)
        and all(isinstance(e, tuple) for e in item[1])
        for item in top
    )
    if not shape_ok:
        raise InputError("expected {query id: {database id: score}}", p)
    lists: dict[int, tuple[NDArray[np.int64], NDArray[Any]]] = {}
    for name, entries in top:
        qi = _query_index(name, query_of, key, p)
        if qi in lists:
            raise InputError(f"query {name} is listed twice", p)
        seen: set[str] = set()
        ids = np.empty(len(entries), dtype=np.int64)
        for j, (db, _) in enumerate(entries):
            if db in seen:
                raise InputError(f"query {name}: database image {db} is listed twice", p)
            seen.add(db)
            ids[j] = db_of.get(key(db), -1)
        lists[qi] = (ids, _scores_of([v for _, v in entries], f"query {name}", p))
    order = tuple(q for q in range(gt.n_queries) if q in lists)
    return ScoredLists(order, tuple(lists[q][0] for q in order), tuple(lists[q][1] for q in order))


def _read_pickle(
    p: Path, gt: IliasGroundTruth, query_of: Mapping[str, int], db_of: Mapping[str, int], key: Any
) -> ScoredLists:
    obj = load_plain_pickle(p, arrays=True, limit=SIMILARITIES_LIMIT)
    expected = {"query_ids", "db_ids", "sims", "ranks"}
    if not isinstance(obj, dict) or set(obj) != expected:
        found = sorted(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise InputError(f"expected a dict with {sorted(expected)}, found {found}", p)
    q_ids = np.asarray(obj["query_ids"])
    db_ids = np.asarray(obj["db_ids"])
    for what, arr in (("query_ids", q_ids), ("db_ids", db_ids)):
        if arr.ndim != 1 or (arr.size and arr.dtype.kind != "U"):
            raise InputError(f"'{what}' must be a list of ids (text)", p)
    sims = np.asarray(obj["sims"])
    ranks = np.asarray(obj["ranks"])
    if sims.ndim != 2 or ranks.shape != sims.shape or sims.shape[0] != q_ids.size:
        raise InputError(
            f"'sims' {sims.shape} and 'ranks' {ranks.shape} must both be [queries ({q_ids.size}), k]",
            p,
        )
    check_scores(sims, str(p))
    if ranks.size and (ranks.dtype == bool or not np.issubdtype(ranks.dtype, np.integer)):
        raise InputError(f"'ranks' must be integer indices into 'db_ids', got {ranks.dtype}", p)
    if ranks.size and (ranks.min() < 0 or ranks.max() >= db_ids.size):
        bad = int(ranks.min() if ranks.min() < 0 else ranks.max())
        raise InputError(
            f"'ranks' holds {bad}, not an index into 'db_ids' (0..{db_ids.size - 1})", p
        )
    db_names = db_ids.tolist()
    if len(set(db_names)) != len(db_names):
        raise InputError("'db_ids' names a database image twice", p)
    db_map = np.array([db_of.get(key(n), -1) for n in db_names], dtype=np.int64)
    queries: list[int] = []
    ids: list[NDArray[np.int64]] = []
    scores: list[NDArray[Any]] = []
    seen: set[int] = set()
    for i, name in enumerate(q_ids.tolist()):
        qi = _query_index(name, query_of, key, p)
        if qi in seen:
            raise InputError(f"query {name} is listed twice", p)
        seen.add(qi)
        row = np.asarray(ranks[i], dtype=np.int64)
        if np.unique(row).size != row.size:
            raise InputError(f"query {name}: a database image is listed twice", p)
        queries.append(qi)
        ids.append(db_map[row])
        scores.append(sims[i])
    return ScoredLists(tuple(queries), tuple(ids), tuple(scores))
