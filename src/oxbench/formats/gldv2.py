"""Google Landmarks v2 retrieval files: the solution (``retrieval_solution_v2.1.csv``) and a
Kaggle submission (``id,images``), read as the challenge's ``dataset_file_io.py`` reads them.

Solution: a header ``id,images,Usage`` then one row per test image: its id, the space-separated
ids of the index images relevant to it, and its Usage, ``Public``, ``Private`` or ``Ignored``
(``ReadSolution``; an Ignored row's images are not read). Submission: a header ``id,images`` then
one row per test image, its predicted index ids best first, space-separated (``ReadPredictions``:
an empty row is skipped, one trailing space is dropped, a row of an Ignored image is skipped, a row
with no images is no prediction).

Where the official reader misbehaves, one line names the file, the row and the problem instead: a
header that is not the expected one (the official reader drops the first row whatever it is), a row
with another number of fields, an unknown Usage, a test image listed twice (in either file), a
Public / Private row without images or listing an index image twice, a predicted test image that
is not in the solution. Everything else is the official reading, so that the numbers are the
challenge's (:mod:`oxbench.evaluation.protocols.gldv2`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.formats.text import read_input_bytes
from oxbench.groundtruth import GroundTruth, Query, as_index_array
from oxbench.protocol import get_protocol

#: The Usage values of the solution file and the setup each scores in.
USAGE_SETUP = {"Public": "public", "Private": "private"}
#: The Usage of test images that no split scores.
IGNORED = "Ignored"
#: The dataset id of the printed lines when none is given.
DEFAULT_DATASET = "gldv2-retrieval"


@dataclass(frozen=True, eq=False)
class Gldv2Solution:
    """A retrieval solution file.

    Attributes:
        queries: the Public and Private test image ids, in file order.
        usage: per query its setup, ``public`` or ``private``.
        relevant: per query the relevant index image ids, as listed.
        ignored: the Ignored test image ids.
        source: the file it was read from.
    """

    queries: tuple[str, ...]
    usage: tuple[str, ...]
    relevant: tuple[tuple[str, ...], ...]
    ignored: frozenset[str]
    source: str = "<memory>"

    def ground_truth(
        self, index_names: Sequence[str] | None = None, *, dataset: str = DEFAULT_DATASET
    ) -> GroundTruth:
        """The solution as :class:`~oxbench.groundtruth.GroundTruth` of the ``gldv2`` protocol.

        Args:
            index_names: the index images (the database, in its order); default: the relevant
                ones the solution names, sorted (enough to score a submission of ids).
            dataset: the dataset id of the printed lines.

        Raises:
            InputError: a relevant index image that is not in ``index_names``, or names listed twice.
        """
        if index_names is None:
            names = tuple(sorted({i for rel in self.relevant for i in rel}))
        else:
            names = tuple(index_names)
        position = {n: i for i, n in enumerate(names)}
        if len(position) != len(names):
            raise InputError("the index names list an image twice", self.source)
        queries = []
        for q, rel, setup in zip(self.queries, self.relevant, self.usage, strict=True):
            missing = next((i for i in rel if i not in position), None)
            if missing is not None:
                raise InputError(
                    f"test image {q}: relevant index image {missing} is not in the index",
                    self.source,
                )
            good = as_index_array([position[i] for i in rel], what=f"query {q}", source=self.source)
            queries.append(Query(q, good=good, setups=(setup,)))
        return GroundTruth(
            dataset, get_protocol("gldv2"), names, tuple(queries), self.source
        ).validate()


def _csv_problem(exc: csv.Error) -> str:
    """What a ``csv.Error`` means, in the file's terms."""
    if "field limit" in str(exc):
        # The challenge's metrics.py reads with the csv module too, and stops at the same limit.
        return (
            f"a field longer than {csv.field_size_limit():,} characters (the challenge's csv "
            "reader refuses it too; only the first 100 predictions of a line count)"
        )
    return f"malformed CSV ({exc})"


def _rows(path: str | Path, header: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    """The rows after the header, with their 1-based line numbers; the header must be ``header``."""
    data = read_input_bytes(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path) from None
    if "\x00" in text:
        raise InputError("the file holds a NUL character", path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise InputError(f"line {reader.line_num}: {_csv_problem(exc)}", path) from None
    if not rows or tuple(rows[0][1]) != header:
        found = ",".join(rows[0][1]) if rows else "an empty file"
        raise InputError(
            f"the first line must be the header {','.join(header)}, found {found[:80]!r}", path
        )
    out = []
    for line, row in rows[1:]:
        if not row:
            continue  # an empty line (the official reader skips it)
        if len(row) != len(header):
            raise InputError(
                f"line {line}: {len(row)} fields, expected {len(header)} ({','.join(header)})", path
            )
        if not row[0] or row[0] != row[0].strip():
            raise InputError(f"line {line}: malformed test image id {row[0][:60]!r}", path)
        out.append((line, row))
    return out


def read_index(path: str | Path) -> tuple[str, ...]:
    """The index image ids of ``index.csv`` (a header whose first column is ``id``; the other
    columns, ``url`` ..., are not read), in file order.

    Raises:
        InputError: another header, an empty or malformed id, an id listed twice.
    """
    data = read_input_bytes(path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", path) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        rows = [(reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise InputError(f"line {reader.line_num}: {_csv_problem(exc)}", path) from None
    if not rows or not rows[0][1] or rows[0][1][0] != "id":
        raise InputError("the first line must be a header whose first column is id", path)
    ids: list[str] = []
    seen: set[str] = set()
    for line, row in rows[1:]:
        if not row:
            continue
        image = row[0]
        if not image or image != image.strip() or "\x00" in image:
            raise InputError(f"line {line}: malformed index image id {image[:60]!r}", path)
        if image in seen:
            raise InputError(f"line {line}: index image {image} is listed twice", path)
        seen.add(image)
        ids.append(image)
    if not ids:
        raise InputError("no index image", path)
    return tuple(ids)


def read_solution(path: str | Path) -> Gldv2Solution:
    """Read ``retrieval_solution_v2.1.csv`` (``id,images,Usage``).

    Raises:
        InputError: one line naming the file and the line: see the module docstring.
    """
    queries: list[str] = []
    usage: list[str] = []
    relevant: list[tuple[str, ...]] = []
    ignored: set[str] = set()
    seen: dict[str, int] = {}
    for line, (test_id, images, use) in _rows(path, ("id", "images", "Usage")):
        if test_id in seen:
            raise InputError(
                f"line {line}: test image {test_id} is listed twice (also line {seen[test_id]})",
                path,
            )
        seen[test_id] = line
        if use == IGNORED:
            ignored.add(test_id)
            continue
        setup = USAGE_SETUP.get(use)
        if setup is None:
            raise InputError(
                f"line {line}: test image {test_id} has the unknown Usage {use[:40]!r} "
                "(Public, Private or Ignored)",
                path,
            )
        ids = images.split(" ")
        if not images or "" in ids:
            raise InputError(
                f"line {line}: test image {test_id} ({use}) needs its relevant index image ids, "
                f"separated by single spaces, got {images[:60]!r}",
                path,
            )
        if len(set(ids)) != len(ids):
            twice = next(i for i in ids if ids.count(i) > 1)
            raise InputError(
                f"line {line}: test image {test_id} lists index image {twice} twice", path
            )
        queries.append(test_id)
        usage.append(setup)
        relevant.append(tuple(ids))
    if not queries:
        raise InputError("no Public or Private test image", path)
    return Gldv2Solution(
        tuple(queries), tuple(usage), tuple(relevant), frozenset(ignored), str(path)
    )


@dataclass(frozen=True, eq=False)
class Gldv2Predictions:
    """A submission read against a ground truth.

    Attributes:
        order: the queries (indices into the ground truth's queries) that have a prediction, in
            file order (the order the official means sum in).
        predicted: per query of ``order``, its predicted index images as ground-truth database
            indices, -1 for an id that is not in the database (never relevant), best first.
    """

    order: tuple[int, ...]
    predicted: tuple[NDArray[np.int64], ...]


def read_predictions(
    path: str | Path, gt: GroundTruth, ignored: frozenset[str] = frozenset()
) -> Gldv2Predictions:
    """Read a submission (``id,images``) against ``gt`` (its queries are the Public and Private test
    images; ``ignored`` the Ignored ones, whose rows are skipped).

    Raises:
        InputError: one line naming the file and the line: see the module docstring.
    """
    query_of = {name: qi for qi, name in enumerate(gt.query_names)}
    index_of = {name: i for i, name in enumerate(gt.db_names)}
    seen: dict[str, int] = {}
    order: list[int] = []
    predicted: list[NDArray[np.int64]] = []
    for line, (test_id, images) in _rows(path, ("id", "images")):
        if test_id in seen:
            raise InputError(
                f"line {line}: test image {test_id} is repeated (also line {seen[test_id]})", path
            )
        seen[test_id] = line
        if test_id in ignored:
            continue
        qi = query_of.get(test_id)
        if qi is None:
            raise InputError(
                f"line {line}: test image {test_id} is not in the solution ({gt.source})", path
            )
        if not images:
            continue  # no prediction: the query scores 0 (it still counts in the mean)
        ids = images.split(" ")
        if not ids[-1]:  # one trailing space, as the official reader drops it
            ids = ids[:-1]
        order.append(qi)
        predicted.append(np.array([index_of.get(i, -1) for i in ids], dtype=np.int64))
    return Gldv2Predictions(tuple(order), tuple(predicted))
