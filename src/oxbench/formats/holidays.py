"""INRIA Holidays: the image list, the ground truth it implies, and result files.

- ``holidays_images.dat`` lists the 1,491 image names (``100000.jpg`` ... ``149902.jpg``), one per
  line (the official file has no newline after the last one). Image number // 100 is the group;
  the image whose number is divisible by 100 is the group's query, the others its positives.
- A result file (the input of ``holidays_map.py``) has one line per query:
  ``query.jpg r0 name0 r1 name1 ...`` with 0-based rank numbers. The *written* rank numbers are
  the positions, not the place on the line: the official example files list the top 10 and then
  only the positives at their true ranks (``... 9 135601.jpg 20 100001.jpg 1107 100002.jpg``).
  Unlisted positions are unnamed negatives (-1 in the internal ranks).
- The query's own image is ignored wherever it appears (it is the query's ``junk``), so every
  later positive moves up one rank -- exactly what ``holidays_map.py`` does.

Names are kept without the ``.jpg`` extension (like every :class:`GroundTruth`); the extension is
accepted and removed on input.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.formats.text import read_text_lines
from oxbench.groundtruth import GroundTruth, Query, make_query, short_repr
from oxbench.protocol import get_protocol

log = logging.getLogger(__name__)

# Holidays names are 6 digits; up to 18 keeps any plausible name and every number inside int64
# (and far from Python's 4,300-digit limit on int(), which a 5,000-digit name would hit).
_MAX_DIGITS = 18
_NAME = re.compile(rf"(?P<num>[0-9]{{1,{_MAX_DIGITS}}})(?:\.jpg)?", re.IGNORECASE | re.ASCII)


def _image_number(name: str, source: str | Path | None, where: str) -> tuple[str, int]:
    m = _NAME.fullmatch(name)
    if m is None:
        raise InputError(
            f"{where}: {short_repr(name)} is not a Holidays image name (at most {_MAX_DIGITS} digits, "
            "optional .jpg)",
            source,
        )
    return m["num"], int(m["num"])


def read_image_list(path: str | Path) -> tuple[str, ...]:
    """Read ``holidays_images.dat``: the image names, without ``.jpg``, in file order.

    Surrounding whitespace, CR line endings, blank lines and a missing final newline are accepted.

    Raises:
        InputError: a missing file, a line that is not ``<digits>[.jpg]``, a name listed twice, or an
            empty list (naming the file and line).
    """
    path = Path(path)
    names: list[str] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(read_text_lines(path), start=1):
        token = raw.strip()
        if not token:
            continue
        name, _ = _image_number(token, path, f"line {lineno}")
        if name in seen:
            raise InputError(f"line {lineno}: {name} is already listed at line {seen[name]}", path)
        seen[name] = lineno
        names.append(name)
    if not names:
        raise InputError("no image names", path)
    return tuple(names)


def holidays_ground_truth(names: Sequence[str], *, source: str = "<memory>") -> GroundTruth:
    """The Holidays ground truth implied by the image names (protocol ``holidays``).

    The database is every image, in the given order. Each image whose number is divisible by 100 is
    a query (in list order); its ``good`` are the other images of its group (number // 100), its
    ``junk`` is its own image (ignored wherever it is ranked). No box: the whole image is the query.

    Args:
        names: image names (``100000`` or ``100000.jpg``), e.g. from :func:`read_image_list`.
        source: where the names came from, for messages.

    Raises:
        InputError: a malformed or repeated name, a group without its query image, or no query.

    Example:
        >>> gt = holidays_ground_truth(["100000.jpg", "100001.jpg", "100100.jpg", "100101.jpg", "100102.jpg"])
        >>> q = gt.queries[1]  # group 1001: query 100100, positives 100101 and 100102
        >>> q.name, q.good.tolist(), q.junk.tolist()
        ('100100', [3, 4], [2])
    """
    clean: list[str] = []
    groups: dict[int, list[int]] = {}
    query_of: dict[int, int] = {}
    seen: set[str] = set()
    for i, raw in enumerate(names):
        name, num = _image_number(raw.strip(), source, f"image {i}")
        if name in seen:
            raise InputError(f"image {i}: {name} is listed twice", source)
        seen.add(name)
        clean.append(name)
        groups.setdefault(num // 100, []).append(i)
        if num % 100 == 0:
            query_of[num // 100] = i
    orphans = sorted(g for g in groups if g not in query_of)
    if orphans:
        g = orphans[0]
        raise InputError(
            f"group {g} has no query image {g * 100} ({len(orphans)} group(s) without a query)",
            source,
        )
    queries: list[Query] = []
    for qi in sorted(query_of.values()):
        num = int(clean[qi])
        members = groups[num // 100]
        queries.append(
            make_query(
                clean[qi], None, source=source, good=[m for m in members if m != qi], junk=[qi]
            )
        )
    if not queries:
        raise InputError("no query image (number divisible by 100)", source)
    return GroundTruth(
        "holidays", get_protocol("holidays"), tuple(clean), tuple(queries), source
    ).validate()


def read_ground_truth(path: str | Path) -> GroundTruth:
    """:func:`holidays_ground_truth` of :func:`read_image_list` (``holidays_images.dat``)."""
    return holidays_ground_truth(read_image_list(path), source=str(path))


def read_results(path: str | Path, gt: GroundTruth) -> NDArray[np.int64]:
    """Read a Holidays result file into the internal ranks layout.

    Args:
        path: the result file, one line per query: ``query.jpg r0 name0 r1 name1 ...``.
        gt: the Holidays ground truth (:func:`holidays_ground_truth`).

    Returns:
        ``int64 [n_queries, k]``, row i = ``gt.queries[i]``: ``ranks[i, r]`` is the database index
        of the image written at rank ``r``; positions not written are -1 (unnamed negatives).
        ``k`` is the largest written rank + 1. As in ``holidays_map.py``, the query image moves
        the later positives up only where it is written; an unwritten position is a negative.

    Raises:
        InputError: naming the file and line, for a query line that omits or repeats a query, an
            unknown query or image, an odd number of tokens after the query, a rank that is not a
            non-negative integer below the database size, two results at the same rank, or an
            image listed twice on one line.
    """
    path = Path(path)
    index = {name: i for i, name in enumerate(gt.db_names)}
    query_row = {q.name: i for i, q in enumerate(gt.queries)}
    n_db = gt.n_db
    rows: dict[int, tuple[int, dict[int, int]]] = {}
    for lineno, raw in enumerate(read_text_lines(path), start=1):
        tokens = raw.split()
        if not tokens:
            continue
        where = f"line {lineno}"
        qname, _ = _image_number(tokens[0], path, where)
        if qname not in query_row:
            kind = "not a query" if qname in index else "unknown image"
            raise InputError(f"{where}: {tokens[0]} is {kind}", path)
        qi = query_row[qname]
        if qi in rows:
            raise InputError(
                f"{where}: query {qname} is repeated (first at line {rows[qi][0]})", path
            )
        pairs = tokens[1:]
        if len(pairs) % 2:
            raise InputError(
                f"{where}: query {qname}: expected 'rank name' pairs, got an odd number of tokens ({len(pairs)})",
                path,
            )
        by_rank: dict[int, int] = {}
        name_rank: dict[int, int] = {}
        for r_tok, n_tok in zip(pairs[0::2], pairs[1::2], strict=True):
            if not r_tok.isdigit() or not r_tok.isascii():
                raise InputError(
                    f"{where}: query {qname}: rank {short_repr(r_tok)} is not a non-negative integer",
                    path,
                )
            if len(r_tok.lstrip("0")) > _MAX_DIGITS:  # beyond any database; int() of it could fail
                raise InputError(
                    f"{where}: query {qname}: rank {short_repr(r_tok)} is beyond the database ({n_db} images)",
                    path,
                )
            rank = int(r_tok)
            if rank >= n_db:
                raise InputError(
                    f"{where}: query {qname}: rank {rank} is beyond the database ({n_db} images)",
                    path,
                )
            name, _ = _image_number(n_tok, path, f"{where}: query {qname}")
            img = index.get(name)
            if img is None:
                raise InputError(f"{where}: query {qname}: unknown image {n_tok}", path)
            if rank in by_rank:
                other = gt.db_names[by_rank[rank]]
                raise InputError(
                    f"{where}: query {qname}: rank {rank} is given to {other} and {name}", path
                )
            if img in name_rank:
                raise InputError(
                    f"{where}: query {qname}: {name} is listed twice (ranks {name_rank[img]} and {rank})",
                    path,
                )
            by_rank[rank] = img
            name_rank[img] = rank
        rows[qi] = (lineno, by_rank)
    missing = [q.name for i, q in enumerate(gt.queries) if i not in rows]
    if missing:
        raise InputError(
            f"{len(missing)} quer{'y' if len(missing) == 1 else 'ies'} missing, e.g. {missing[0]}.jpg",
            path,
        )
    k = max((max(by_rank) + 1 for _, by_rank in rows.values() if by_rank), default=0)
    ranks = np.full((gt.n_queries, k), -1, dtype=np.int64)
    for qi, (_, by_rank) in rows.items():
        if by_rank:
            pos = np.fromiter(by_rank.keys(), dtype=np.int64, count=len(by_rank))
            ranks[qi, pos] = np.fromiter(by_rank.values(), dtype=np.int64, count=len(by_rank))
    return ranks
