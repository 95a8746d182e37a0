"""Bring your own features: a global method over the user's descriptor files.

A global method whose descriptor kind is ``features``
(:class:`~oxbench.pipelines.descriptors.files.FeatureFilesDescriptor`; presets ``features``,
``features-aqe``, ``features-alpha-qe``, ``features-dba``, ``features-diffusion``; the paths come
with ``--set descriptor.db_features=PATH --set descriptor.query_features=PATH``; ``query_key`` /
``query_layout`` when the query array is named or laid out otherwise, as revisitop's one ``.mat``
holding ``X`` and ``Q``: ``--set descriptor.db_features=f.mat --set descriptor.key=X --set
descriptor.query_features=f.mat --set descriptor.query_key=Q --set descriptor.layout=d-n``)
skips description: the database and query
descriptors are read from the files, L2-normalised, and go through the same whitening, DBA, search,
query expansion and diffusion as any global method, through the same runner and run folder.

Which row is which image: by default one row per database image / query in the ground truth's
order (database then distractors). ``db_names=FILE`` / ``query_names=FILE`` name the rows instead
(a text file, one name a line, or the array of strings inside an ``.npz`` / ``.h5`` / ``.mat``, which
may be the feature file itself); ``row_order=sorted`` declares rows in sorted image-name order
(one row per image of the part, or per image of the whole dataset, as a folder of ``.jpg`` files
gives them). Named rows may include images of the dataset the part does not need (one file of all
5,063 Oxford images serves ROxford's database and its queries); a duplicate name, a name that is
no image of the dataset, a needed image without a row, or a list of another length than the file is
refused.

Whitening needs training descriptors that are *not* the test set's: ``train_features=PATH`` (PCA),
plus ``train_pairs=PATH`` (an ``[m, 2]`` integer ``.npy`` of matching row pairs) for learned
whitening. Without them, ``whitening`` must stay ``none``.
"""

from __future__ import annotations

import hashlib
import io
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark
from oxbench.errors import InputError
from oxbench.fileio import read_input_bytes
from oxbench.formats.arrays import read_features, read_names
from oxbench.index.whitening import LearnedWhitening, PCAWhitening
from oxbench.pipelines.steps.keys import part_names

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.pipelines.descriptors import FamilySettings


class FileSettings(Protocol):
    """The settings of the ``features`` descriptor kind this module reads (see
    :class:`~oxbench.pipelines.descriptors.files.FeatureFilesDescriptor`)."""

    @property
    def db_features(self) -> str | None: ...

    @property
    def query_features(self) -> str | None: ...

    @property
    def train_features(self) -> str | None: ...

    @property
    def train_pairs(self) -> str | None: ...

    @property
    def layout(self) -> Literal["n-d", "d-n"]: ...

    @property
    def key(self) -> str | None: ...

    @property
    def query_key(self) -> str | None: ...

    @property
    def query_layout(self) -> Literal["n-d", "d-n"] | None: ...

    @property
    def db_names(self) -> str | None: ...

    @property
    def query_names(self) -> str | None: ...

    @property
    def row_order(self) -> Literal["dataset", "sorted"]: ...

    @property
    def max_bytes(self) -> int | None: ...


#: How the settings of the files are named on the command line (``--set descriptor.db_features=``).
PREFIX = "descriptor."


def _read(m: FileSettings, path: str | None, setting: str) -> NDArray[np.float32]:
    if not path:
        raise InputError(
            f"this method reads descriptor files: set {PREFIX}{setting}=PATH "
            f"(--set {PREFIX}{setting}=...)"
        )
    if (
        setting == "query_features"
    ):  # its own key and layout when given: revisitop's one .mat holds X and Q
        layout = m.query_layout or m.layout
        key = m.query_key if m.query_key is not None else m.key
        return read_features(path, layout=layout, key=key, normalize=True, max_bytes=m.max_bytes)
    return read_features(path, layout=m.layout, key=m.key, normalize=True, max_bytes=m.max_bytes)


_NAME_HINT = (
    f"; rows of other images or in another order: name them ({PREFIX}db_names=FILE, "
    f"{PREFIX}query_names=FILE, {PREFIX}row_order=sorted)"
)


def _transposed_hint(x: NDArray[np.float32], n: int, layout: str) -> str:
    if x.shape[1] == n and x.shape[0] != n:
        other = "d-n" if layout == "n-d" else "n-d"
        return f"; the file has {n:,} columns: it looks transposed, set {PREFIX}layout={other}"
    return ""


def _named_rows(
    m: FileSettings,
    bench: Benchmark,
    x: NDArray[np.float32],
    path: str,
    names_setting: str,
    wanted: list[str],
    part: str,
) -> NDArray[np.float32] | None:
    """The rows of ``x`` for the images ``wanted``, found by name; ``None`` when the file declares
    no names (rows in the ground truth's order)."""
    names_path = getattr(m, names_setting)
    if names_path is None and m.row_order == "dataset":
        return None
    parts = ["database", "queries"] + (["distractors"] if bench.n_distractors else [])
    known = {n for p in parts for n in part_names(bench, p)}
    layout = m.layout if names_setting == "db_names" else (m.query_layout or m.layout)
    if names_path is not None:
        source = names_path
        names = read_names(names_path)
        if len(names) != len(x):
            raise InputError(
                f"{PREFIX}{names_setting}: {len(names):,} names for the {len(x):,} rows of {path}"
                + _transposed_hint(x, len(names), layout),
                names_path,
            )
    else:
        source = path
        everything = sorted(known)
        names = tuple(sorted(set(wanted)) if len(x) == len(set(wanted)) else everything)
        if len(names) != len(x):
            raise InputError(
                f"{PREFIX}row_order=sorted: {len(x):,} rows, but {bench.id} has {len(set(wanted)):,} "
                f"{part} images and {len(everything):,} images in all"
                + _transposed_hint(x, len(set(wanted)), layout)
                + _transposed_hint(x, len(everything), layout),
                path,
            )
    row: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in row:
            raise InputError(
                f"{PREFIX}{names_setting}: image {name!r} names rows {row[name] + 1} and {i + 1}",
                source,
            )
        if name not in known:
            raise InputError(
                f"{PREFIX}{names_setting}: row {i + 1} names {name!r}, which is no image of {bench.id}",
                source,
            )
        row[name] = i
    missing = [n for n in wanted if n not in row]
    if missing:
        raise InputError(
            f"{PREFIX}{names_setting}: {len(missing):,} of {bench.id}'s {part} images have no row, "
            f"e.g. {missing[0]!r}",
            source,
        )
    return x[np.fromiter((row[n] for n in wanted), dtype=np.int64, count=len(wanted))]


def benchmark_features(m: FileSettings, bench: Benchmark, part: str) -> NDArray[np.float32]:
    """The user's descriptors of one part of ``bench`` (``database``, ``distractors``, ``queries``).

    The database file holds the database rows followed by the distractors' rows, unless its rows
    are named (``db_names``, ``row_order=sorted``: see the module docstring).

    Raises:
        InputError: a missing setting or file, a row count that does not fit the dataset, a names
            list that does not fit the file or the dataset, or query and database descriptors of
            different dimensions.
    """
    n_db, n_dis = bench.gt.n_db, bench.n_distractors
    db = _read(m, m.db_features, "db_features")
    assert m.db_features is not None
    wanted = part_names(bench, "database") + (part_names(bench, "distractors") if n_dis else [])
    named = _named_rows(m, bench, db, m.db_features, "db_names", wanted, "database")
    if named is not None:
        db = named
    elif db.shape[0] != n_db + n_dis:
        extra = f" + {n_dis} distractors" if n_dis else ""
        raise InputError(
            f"{db.shape[0]} descriptors for {bench.id}'s {n_db} database images{extra}"
            + (_transposed_hint(db, n_db + n_dis, m.layout) or _NAME_HINT),
            m.db_features,
        )
    if part == "database":
        return db[:n_db]
    if part == "distractors":
        return db[n_db:]
    q = _read(m, m.query_features, "query_features")
    assert m.query_features is not None
    q_named = _named_rows(
        m, bench, q, m.query_features, "query_names", part_names(bench, "queries"), "query"
    )
    if q_named is not None:
        q = q_named
    elif q.shape[0] != bench.gt.n_queries:
        raise InputError(
            f"{q.shape[0]} descriptors for {bench.id}'s {bench.gt.n_queries} queries"
            + (_transposed_hint(q, bench.gt.n_queries, m.query_layout or m.layout) or _NAME_HINT),
            m.query_features,
        )
    if q.shape[1] != db.shape[1]:
        raise InputError(
            f"query descriptors have dimension {q.shape[1]}, the database descriptors "
            f"({m.db_features}) {db.shape[1]}",
            m.query_features,
        )
    return q


def fit_file_whitening(m: FileSettings, w: FamilySettings) -> PCAWhitening | None:
    """The whitening ``w`` asks for, learned on ``m.train_features`` (and ``m.train_pairs``), or
    ``None``."""
    if w.whitening == "none":
        return None
    if not m.train_features:
        raise InputError(
            f"method {w.name}: whitening={w.whitening} on your features needs training "
            f"descriptors that are not the test set's: set {PREFIX}train_features=PATH"
        )
    x = _read(m, m.train_features, "train_features")
    try:
        if w.whitening == "pca":
            pca = PCAWhitening(
                w.whitening_dim, power=w.whitening_power, shrinkage=w.whitening_shrinkage
            )
            return pca.fit(x, fitted_on=f"{m.train_features} ({len(x)} descriptors)")
        if not m.train_pairs:
            raise InputError(
                f"method {w.name}: learned whitening needs matching pairs: set "
                f"{PREFIX}train_pairs=PATH (an [m, 2] integer .npy of row pairs of train_features)"
            )
        pairs = read_pairs(m.train_pairs)
        lw = LearnedWhitening(w.whitening_dim, shrinkage=w.whitening_shrinkage)
        return lw.fit(
            x, pairs, fitted_on=f"{m.train_features} ({len(x)} descriptors, {len(pairs)} pairs)"
        )
    except InputError as exc:
        if exc.source is not None:
            raise
        raise InputError(exc.problem, m.train_features) from None


def _row_digests(x: NDArray[np.float32]) -> NDArray[np.uint64]:
    """A 64-bit digest of each row's bytes (equal rows, equal digests)."""
    rows = np.ascontiguousarray(x)
    return np.array(
        [int.from_bytes(hashlib.blake2b(r.data, digest_size=8).digest(), "little") for r in rows],
        dtype=np.uint64,
    )


def test_rows_in_training(m: FileSettings, w: FamilySettings, bench: Benchmark) -> str | None:
    """Why ``train_features`` holds ``bench``'s test set, or ``None``: it is flagged when it contains
    every database row or every query row (as read, L2-normalised, compared byte for byte) --
    whatever the file is called and wherever it lies."""
    if w.whitening == "none" or not m.train_features:
        return None
    train = _row_digests(_read(m, m.train_features, "train_features"))
    db = _row_digests(benchmark_features(m, bench, "database"))
    queries = _row_digests(benchmark_features(m, bench, "queries"))
    for part, rows in (("database", db), ("queries", queries)):
        if len(rows) and np.isin(rows, train).all():
            return (
                f"{PREFIX}train_features ({m.train_features}) contains every row of the test "
                f"{part} descriptors of {bench.id}"
            )
    return None


def read_pairs(path: str) -> NDArray[np.int64]:
    """An ``[m, 2]`` integer array of matching pairs from an ``.npy`` file."""
    try:
        p = np.load(io.BytesIO(read_input_bytes(path, limit=1 << 34)), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        if isinstance(exc, InputError):
            raise
        raise InputError(f"not a readable .npy pair file ({exc})", path) from None
    if (
        not isinstance(p, np.ndarray)
        or p.ndim != 2
        or p.shape[1] != 2
        or not np.issubdtype(p.dtype, np.integer)
    ):
        raise InputError(
            f"matching pairs must be an [m, 2] integer array, got {getattr(p, 'shape', None)}", path
        )
    return p.astype(np.int64)


def feature_provenance(m: FileSettings) -> dict[str, str | None]:
    """Which files the descriptors came from (recorded in the run)."""
    return {
        "db": m.db_features,
        "queries": m.query_features,
        "train": m.train_features,
        "train_pairs": m.train_pairs,
        "db_names": m.db_names,
        "query_names": m.query_names,
    }
