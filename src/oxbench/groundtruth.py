"""Ground truth of a retrieval benchmark, in one typed form for every protocol.

One :class:`GroundTruth` holds its protocol (:class:`oxbench.protocol.Protocol`), the database
image names and one :class:`Query` per query. Which label fields a query uses depends on the
protocol:

============  ===============================  ==========================
protocol      positives                        ignored
============  ===============================  ==========================
``revisited``  ``easy`` / ``hard`` (per setup)   ``junk`` (+ the other class)
``original``   ``good`` + ``ok``                 ``junk``
``holidays``   ``good`` (the group's others)     ``junk`` (the query image)
``ukbench``    ``good`` (the object's 4)         none
``gldv2``      ``good`` (the relevant index       none (queries of another split
               images)                           are left out of its mean)
``ilias``      ``good`` (the instance's           none
               positives)
============  ===============================  ==========================

All label arrays are sorted, unique ``int64`` indices into :attr:`GroundTruth.db_names`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.protocol import Protocol, get_protocol

BBox = tuple[float, float, float, float]
IndexArray = NDArray[np.int64]

_LABEL_FIELDS = ("easy", "hard", "good", "ok", "junk")


def _empty() -> IndexArray:
    return np.zeros(0, dtype=np.int64)


_INT64 = np.iinfo(np.int64)


def short_repr(value: object, limit: int = 40) -> str:
    """``repr(value)`` cut to about ``limit`` characters (a 5,000-digit number stays one line)."""
    text = repr(value)
    return (
        text
        if len(text) <= limit
        else f"{text[: limit // 2]}...{text[-8:]} ({len(text)} characters)"
    )


def as_index_array(
    values: Iterable[int] | NDArray[np.integer], *, what: str, source: str | None = None
) -> IndexArray:
    """Convert label values to a sorted unique int64 array, refusing anything but integers.

    Booleans, floats (even ``2.0``), strings, nested or ragged lists, 2-D arrays and integers
    beyond int64 are refused, naming the value: a label is an index, and a wrapped or rounded
    value would silently label another image. Duplicates are folded (the official Oxford files
    list one image twice: it is one positive).
    """
    if isinstance(values, np.ndarray):
        if values.size == 0:
            return _empty()
        if values.ndim != 1:
            raise InputError(
                f"{what}: labels must be a flat list of indices, got shape {values.shape}", source
            )
        if values.dtype == bool or not np.issubdtype(values.dtype, np.integer):
            raise InputError(f"{what}: labels must be integer indices, got {values.dtype}", source)
        if values.dtype == np.uint64 and int(values.max()) > _INT64.max:
            raise InputError(f"{what}: label {int(values.max())} is beyond 64-bit integers", source)
        return np.unique(values.astype(np.int64))
    if isinstance(values, str | bytes):
        raise InputError(
            f"{what}: labels must be a list of integer indices, got {short_repr(values)}", source
        )
    items = list(values)
    for v in items:
        if isinstance(v, bool | np.bool_) or not isinstance(v, int | np.integer):
            kind = "a nested list" if isinstance(v, list | tuple) else short_repr(v)
            raise InputError(f"{what}: labels must be integer indices, got {kind}", source)
        if not _INT64.min <= int(v) <= _INT64.max:
            raise InputError(
                f"{what}: label {short_repr(int(v))} is beyond 64-bit integers", source
            )
    if not items:
        return _empty()
    return np.unique(np.asarray(items, dtype=np.int64))


def as_bbox(values: Sequence[float], *, what: str, source: str | None = None) -> BBox:
    """Four box coordinates as floats, refusing strings, booleans, nested values and overflows."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise InputError(f"{what}: bbox must be 4 numbers, got {short_repr(values)}", source)
    vals: list[float] = []
    for v in values:
        if isinstance(v, bool | np.bool_) or not isinstance(
            v, int | float | np.integer | np.floating
        ):
            raise InputError(f"{what}: bbox must be 4 numbers, got {short_repr(v)}", source)
        try:
            vals.append(float(v))
        except OverflowError:
            raise InputError(f"{what}: bbox value {short_repr(v)} is too large", source) from None
    if len(vals) != 4:
        raise InputError(f"{what}: bbox must have 4 numbers, got {len(vals)}", source)
    return (vals[0], vals[1], vals[2], vals[3])


@dataclass(frozen=True, eq=False)
class Query:
    """One query: its image name, its box and its labelled database images.

    Attributes:
        name: query image name, without extension.
        bbox: ``(x1, y1, x2, y2)`` in pixels of the full query image (0-based, as in the revisitop
            pickles), or ``None`` when the whole image is the query (Holidays, UKBench).
        easy, hard: revisited positives.
        good, ok: original-protocol positives (old-protocol pickles put good+ok in ``ok``);
            Holidays and UKBench put their positives in ``good``.
        junk: ignored images (revisited Unclear, original junk, the Holidays query itself).
        query_id: original protocol: the query's id (``all_souls_1``, the stem of its
            ``_query.txt`` file), when known.
        setups: the setups of the protocol the query is scored in (GLDv2: ``public`` or
            ``private``); empty: every setup.
    """

    name: str
    bbox: BBox | None = None
    easy: IndexArray = field(default_factory=_empty)
    hard: IndexArray = field(default_factory=_empty)
    good: IndexArray = field(default_factory=_empty)
    ok: IndexArray = field(default_factory=_empty)
    junk: IndexArray = field(default_factory=_empty)
    query_id: str | None = None
    setups: tuple[str, ...] = ()

    @property
    def positives(self) -> IndexArray:
        """All positives of the query, whatever the protocol (easy+hard or good+ok)."""
        return np.union1d(np.union1d(self.easy, self.hard), np.union1d(self.good, self.ok))

    def labels(self) -> dict[str, IndexArray]:
        """The non-empty label arrays by field name."""
        return {f: getattr(self, f) for f in _LABEL_FIELDS if getattr(self, f).size}


@dataclass(frozen=True, eq=False)
class GroundTruth:
    """Ground truth of one benchmark.

    Attributes:
        dataset: dataset id (``roxford5k``, ``oxford5k``, ``holidays``, ...), used in printed lines.
        protocol: which scoring rules apply (see the module docstring): the protocol object; its
            name is accepted and resolved (:func:`oxbench.protocol.get_protocol`).
        db_names: database image names, without extension; label indices point into this.
        queries: the queries, in the official order.
        source: where it was read from (a path), for error messages.
    """

    dataset: str
    protocol: Protocol
    db_names: tuple[str, ...]
    queries: tuple[Query, ...]
    source: str = "<memory>"

    def __post_init__(self) -> None:
        try:
            protocol = get_protocol(self.protocol)
        except InputError as exc:
            raise InputError(exc.problem, self.source) from None
        object.__setattr__(self, "protocol", protocol)

    @property
    def n_db(self) -> int:
        return len(self.db_names)

    @property
    def n_queries(self) -> int:
        return len(self.queries)

    @property
    def query_names(self) -> tuple[str, ...]:
        return tuple(q.name for q in self.queries)

    @property
    def query_ids(self) -> tuple[str, ...]:
        """Per query its id (``all_souls_1``) where known, else its name."""
        return tuple(q.query_id or q.name for q in self.queries)

    def annotations(self) -> dict[str, Any]:
        """What else the protocol reads beyond names, boxes and labels (JSON-able; empty here),
        part of the ground truth's digest."""
        return {}

    def validate(self) -> GroundTruth:
        """Check the labels and return self; raise :class:`InputError` naming the query otherwise.

        Checks: no name holds a NUL character, every label indexes the database, and no query
        labels one image two ways (e.g. positive and junk) -- the official programs silently
        double-count those.
        """
        # a NUL cannot be in a file name or a line of a ranked list: refused here, at the boundary
        for what, names in (("query", self.query_names), ("database image", self.db_names)):
            bad = next((i for i, name in enumerate(names) if "\x00" in name), None)
            if bad is not None:
                raise InputError(
                    f"{what} {bad} has a name with a NUL character ({names[bad]!r})", self.source
                )
        n = self.n_db
        for qi, q in enumerate(self.queries):
            unknown = [s for s in q.setups if s not in self.protocol.setups]
            if unknown:
                raise InputError(
                    f"query {qi} ({q.name}): setup {unknown[0]!r} is not one of the {self.protocol} "
                    f"protocol's ({', '.join(self.protocol.setups)})",
                    self.source,
                )
            seen: dict[int, str] = {}
            for fname, arr in q.labels().items():
                if arr.size and (arr[0] < 0 or arr[-1] >= n):
                    bad = int(arr[0] if arr[0] < 0 else arr[-1])
                    raise InputError(
                        f"query {qi} ({q.name}): {fname} label {bad} is outside the database (0..{n - 1})",
                        self.source,
                    )
                for idx in arr.tolist():
                    if idx in seen:
                        raise InputError(
                            f"query {qi} ({q.name}): image {idx} ({self.db_names[idx]}) is labelled both "
                            f"{seen[idx]} and {fname}",
                            self.source,
                        )
                    seen[idx] = fname
            if q.bbox is not None:
                x1, y1, x2, y2 = q.bbox
                if not all(np.isfinite(q.bbox)) or x2 < x1 or y2 < y1:
                    raise InputError(f"query {qi} ({q.name}): malformed bbox {q.bbox}", self.source)
        return self


def make_query(
    name: str,
    bbox: Sequence[float] | None = None,
    *,
    source: str | None = None,
    **labels: Iterable[int] | NDArray[np.integer],
) -> Query:
    """Build a :class:`Query`, normalising label lists to sorted unique int64 arrays."""
    unknown = set(labels) - set(_LABEL_FIELDS)
    if unknown:
        raise InputError(f"query {name}: unknown label field(s) {sorted(unknown)}", source)
    arrays: dict[str, Any] = {
        k: as_index_array(v, what=f"query {name} {k}", source=source) for k, v in labels.items()
    }
    box = None if bbox is None else as_bbox(bbox, what=f"query {name}", source=source)
    return Query(name=name, bbox=box, **arrays)
