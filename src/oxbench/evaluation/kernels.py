"""Fast kernels: where each query's *labelled* images sit in its ranking.

Every protocol only needs, per query, the 0-based positions of the labelled images (positives and
ignored ones) in the ranked list; everything else is a negative. Both kernels return, per query,
``(positions, codes)``: strictly increasing ``int64`` positions and the ``uint8`` label code of the
image there (see :data:`EASY` ...). The scoring in :mod:`oxbench.evaluation.protocols` works on those
short arrays only.

- :func:`labelled_positions_from_ranks` scans each query's list once against a 1-byte-per-index
  table: one gather of the query's label codes (or, when distractors dominate, one comparison that
  finds the few database entries), and one scatter that marks every image as seen in the same table
  -- an exact duplicate check (an image met again reads "seen"; at the end, fewer distinct marks
  than entries means a repeat) and, with the scatter's bounds check and a sentinel slot for -1, an
  exact range check. A transposed view of a revisitop ``(k, n_queries)`` array is read 16 queries
  at a time in cache-sized slabs into a work buffer; the extra memory (one table per query read
  together, plus the buffer) is a fraction of the ranks array (measured in ``bench/README.md``).
- :func:`labelled_ranks_from_scores` never sorts the score matrix. The rank of a labelled image
  ``i`` with score ``s`` in the stable descending order is ``#{score > s} + #{score == s, index <
  i}``. A monotone map of scores to bins (linear between the query's lowest and highest labelled
  score, about one bin per 16 database items) turns the first term into a histogram count, except
  inside the few bins that hold a labelled score, whose images are collected and ranked exactly.
  One pass over the matrix in row chunks (transposed in cache-sized slabs); exact, ties included,
  whatever the score distribution (skewed distributions only make more images to compare).

Both have two implementations giving identical numbers and identical errors: the numpy code in
this module (always available, the reference) and, when it was built, the optional compiled
extension :mod:`oxbench.evaluation._accel` (``setup.py``; C, buffer protocol, no GIL). It reads
the array once in memory order, in cache-sized blocks of rows, each block once per group of
queries. Ranks: per entry a range check, a test-and-set in the query's seen-bitset (exact duplicate
check; ``n_index / 8`` bytes a query, about 2 % of an R1M ranks array) and a 1-byte label lookup;
labelled entries are written out. Scores: per query the distinct labelled scores ``u``; every
score gets the key ``2 * #{u < x} + (x in u)``, from a monotone bin map (labelled scores in bins
2 .. n-3) whose bins without a labelled score just count, the others compare exactly; a labelled
image's rank is the count of higher keys plus the equal scores met at lower rows (a snapshot taken
when the scan reaches its row). Only float32/float64 scores and int32/int64 ranks are handled
there. The extension only reports whether the input was clean; on any anomaly (an index out of range, a
repeated image, a NaN score, a dtype it does not handle) the numpy path is rerun and raises the
exact same :class:`~oxbench.errors.InputError`. :data:`ACCELERATED` says whether the extension was
importable, :func:`accelerated` whether it is used now (set ``OXBENCH_NO_ACCEL=1`` to force numpy).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError

log = logging.getLogger(__name__)

try:  # the optional compiled accelerator (setup.py builds it when a C compiler is present)
    from oxbench.evaluation import _accel  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on the build
    _accel = None

#: True when the compiled extension :mod:`oxbench.evaluation._accel` was importable.
ACCELERATED: bool = _accel is not None


def accelerated() -> bool:
    """Whether the compiled kernels are used now.

    True when the extension was built and the environment variable ``OXBENCH_NO_ACCEL`` is unset
    (or empty/``0``); read at every call, so tests and users can force the numpy path.
    """
    return _accel is not None and os.environ.get("OXBENCH_NO_ACCEL", "") in ("", "0")


# Label codes in the per-query tables. 0 = unlabelled (negative).
EASY = 1  # revisited easy; also the single positive class of the other protocols
HARD = 2  # revisited hard
JUNK = 3  # ignored (revisited unclear/junk, original junk, the Holidays query itself)
POSITIVE: int = EASY
_SEEN = 0x80

# A query's labels: sorted unique database indices and their codes.
Labels = tuple[NDArray[np.int64], NDArray[np.uint8]]
Found = tuple[NDArray[np.int64], NDArray[np.uint8]]


def qname(names: Sequence[str] | None, q: int) -> str:
    return f"query {q} ({names[q]})" if names is not None and q < len(names) else f"query {q}"


def range_text(n_db: int, n_index: int) -> str:
    if n_index == n_db:
        return f"database indices are 0..{n_db - 1}"
    return f"database indices are 0..{n_db - 1} and distractors {n_db}..{n_index - 1}"


def out_of_range_text(value: int, n_db: int, n_index: int, *, minus_one: bool = False) -> str:
    """``holds index V, but <the valid range>`` and what to do: the -1 remark only where -1 is
    accepted (padding or gaps asked for), a hint to ``--distractors`` for an index past the end."""
    text = f"holds index {value}, but {range_text(n_db, n_index)}"
    if minus_one:
        text += " (-1 marks a gap)"
    if value >= n_index:
        if n_index == n_db:
            text += (
                "; ranks of an index with distractors after the database (R1M) need their number: "
                "--distractors N"
            )
        else:
            text += f"; does the index hold more than the {n_index - n_db:,} distractors --distractors gives?"
    return text


def _int_block(
    blk: np.ndarray, g0: int, j0: int, names: Sequence[str] | None, source: str | None
) -> np.ndarray:
    """Convert a block of ranks to int64, refusing non-integer values (with their position)."""
    if blk.dtype == np.int64:
        return blk
    if np.issubdtype(blk.dtype, np.integer):
        if (
            np.issubdtype(blk.dtype, np.unsignedinteger)
            and blk.size
            and blk.max() > np.iinfo(np.int64).max
        ):
            r, c = np.unravel_index(int(np.argmax(blk)), blk.shape)
            raise InputError(
                f"{qname(names, g0 + int(r))}: rank position {j0 + c} holds {blk[r, c]}, not an index",
                source,
            )
        return blk.astype(np.int64)
    if np.issubdtype(blk.dtype, np.floating):
        bad = ~np.isfinite(blk)
        bad[~bad] = blk[~bad] != np.round(blk[~bad])
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise InputError(
                f"{qname(names, g0 + int(r))}: rank position {j0 + c} holds {float(blk[r, c])!r}, not an integer index",
                source,
            )
        return blk.astype(np.int64)
    raise InputError(f"ranks must hold integer indices, got dtype {blk.dtype}", source)


def check_ranks_dtype(ranks: np.ndarray, source: str | None) -> None:
    """Refuse ranks arrays whose dtype cannot hold indices (bool, object, complex, strings)."""
    if ranks.dtype == bool or not (
        np.issubdtype(ranks.dtype, np.integer) or np.issubdtype(ranks.dtype, np.floating)
    ):
        raise InputError(f"ranks must hold integer indices, got dtype {ranks.dtype}", source)


def _raise_duplicate(
    row: np.ndarray, q: int, names: Sequence[str] | None, source: str | None
) -> None:
    valid = row[row >= 0]
    vals, first, counts = np.unique(valid, return_index=True, return_counts=True)
    dup = vals[counts > 1]
    v = int(dup[0]) if dup.size else -1
    where = np.flatnonzero(row == v)[:2].tolist()
    raise InputError(
        f"{qname(names, q)}: image {v} appears more than once in the ranked list (positions "
        f"{', '.join(map(str, where))}); the official programs would count it twice",
        source,
    )


def _transposed_chunk(
    src: np.ndarray,
    out: np.ndarray,
    g0: int,
    j0: int,
    names: Sequence[str] | None,
    source: str | None,
) -> np.ndarray:
    """Copy ``src`` ``[G, L]`` (any strides, any numeric dtype) into ``out[:, :L]`` as int64.

    When ``src`` is a transposed view of a C-ordered revisitop array, copying it in slabs of a few
    hundred positions keeps both sides in cache (a whole-chunk transposed copy does not).
    """
    length = src.shape[1]
    dst = out[:, :length]
    slab = _SLAB
    for s0 in range(0, length, slab):
        part = src[:, s0 : s0 + slab]
        if part.dtype != np.int64:
            part = _int_block(np.asarray(part), g0, j0 + s0, names, source)
        np.copyto(dst[:, s0 : s0 + slab], part)
    return dst


_SLAB = 256


class _RowScanner:
    """Scans one query's ranked list at a time against a 1-byte-per-index table.

    The table holds the query's label codes; every scanned entry marks its image ``_SEEN`` in the
    same table, so an image met again reads ``_SEEN`` (a duplicate across segments) and, at the
    end, fewer distinct marks than entries reveals a duplicate inside one segment. One table is
    reused for every query (about 1 MB at R1M scale: it stays in cache while a list is scanned).
    """

    def __init__(
        self,
        labels: Sequence[Labels],
        n_index: int,
        n_db: int,
        k: int,
        names: Sequence[str] | None,
        source: str | None,
        segment: int,
        minus_one: bool = False,
    ) -> None:
        self.labels, self.n_index, self.n_db, self.k = labels, n_index, n_db, k
        self.minus_one = minus_one
        self.names, self.source, self.segment = names, source, segment
        self.table = np.zeros(n_index + 1, dtype=np.uint8)  # last slot: the -1 sentinel
        self.q = -1
        self.n_missing = 0
        self.pos: list[np.ndarray] = []
        self.code: list[np.ndarray] = []
        self.sparse = k < (n_index + 1) // 64  # reset by scatter instead of a full fill
        self.codes_buf = np.zeros(segment + 8, dtype=np.uint8)
        self.db_only = n_db * 4 <= n_index  # distractors dominate (R1M): see scan()

    def start(self, q: int) -> None:
        self.q, self.n_missing, self.pos, self.code = q, 0, [], []
        idx, codes = self.labels[q]
        self.table[idx] = codes

    def _out_of_range(self, seg: np.ndarray, at: int) -> None:
        c = int(np.flatnonzero((seg < -1) | (seg >= self.n_index))[0])
        raise InputError(
            f"{qname(self.names, self.q)}: rank position {at + c} "
            f"{out_of_range_text(int(seg[c]), self.n_db, self.n_index, minus_one=self.minus_one)}",
            self.source,
        )

    def scan(self, row: np.ndarray, j0: int, full_row: Callable[[], np.ndarray]) -> None:
        """Scan ``row`` = positions ``j0 ..`` of the current query's list (int64, contiguous)."""
        table = self.table
        for s0 in range(0, row.shape[0], self.segment):
            seg = row[s0 : s0 + self.segment]
            at = j0 + s0
            lo = int(seg.min())
            if lo < -1 or (seg.size and int(seg.max()) > self.n_index):
                # (take's "wrap" mode costs value / n_index steps per entry: refuse huge ones first)
                self._out_of_range(seg, at)
            if lo == -1:
                self.n_missing += int(np.count_nonzero(seg == -1))
            if self.db_only:
                # Labels index the database only and distractors dominate the list: find the
                # database entries by one comparison, look up just those.
                nz = np.flatnonzero(seg < self.n_db)
                c = table.take(seg[nz], mode="wrap") if nz.size else np.zeros(0, np.uint8)
                keep = c != 0
                nz, c = nz[keep], c[keep]
            else:
                length = seg.shape[0]
                padded = (length + 7) & ~7
                codes = self.codes_buf[:padded]
                table.take(seg, out=codes[:length], mode="wrap")  # -1 -> sentinel; range below
                codes[length:] = 0
                # Labelled entries are rare: find the non-zero 8-byte words, then the bytes.
                words = np.flatnonzero(codes.view(np.uint64))
                if words.size:
                    sub_r, sub_c = np.nonzero(codes.reshape(-1, 8)[words])
                    nz = words[sub_r] * 8 + sub_c
                    c = codes[nz]
                else:
                    nz, c = words, np.zeros(0, np.uint8)
            try:
                table[seg] = _SEEN  # a labelled image seen again reads _SEEN: a duplicate
            except IndexError:  # an index beyond n_index
                self._out_of_range(seg, at)
            if table[-1]:  # the sentinel slot: a -1 gap, or the index n_index itself
                table[-1] = 0
                if lo >= 0 or int(seg.max()) >= self.n_index:
                    self._out_of_range(seg, at)
            if nz.size:
                if c.max() >= _SEEN:  # met in an earlier segment
                    _raise_duplicate(full_row(), self.q, self.names, self.source)
                self.pos.append(nz + at)
                self.code.append(c)

    def finish(self, full_row: Callable[[], np.ndarray]) -> Found:
        table = self.table
        if np.count_nonzero(table == _SEEN) != self.k - self.n_missing:
            _raise_duplicate(full_row(), self.q, self.names, self.source)
        if self.sparse:
            row = full_row()
            table[row] = 0
            table[self.labels[self.q][0]] = 0
            table[-1] = 0
        else:
            table.fill(0)
        if not self.pos:
            return np.zeros(0, np.int64), np.zeros(0, np.uint8)
        return np.concatenate(self.pos), np.concatenate(self.code)


def labelled_positions_from_ranks(
    ranks: np.ndarray,
    labels: Sequence[Labels],
    n_index: int,
    *,
    n_db: int | None = None,
    names: Sequence[str] | None = None,
    source: str | None = None,
    budget_fraction: float = 0.2,
    group: int | None = None,
    block_elems: int | None = None,
    minus_one: bool = False,
) -> list[Found]:
    """Positions and codes of each query's labelled images in its ranked list, with validation.

    Each list is scanned once against a 1-byte-per-index table of the query's labels (one gather),
    marking every image seen in the same table (one scatter): an exact duplicate and range check
    for the price of the label lookup. When the rows are not contiguous (the transposed view of a
    revisitop ``(k, n_queries)`` array), ``group`` queries at a time are copied into an int64 work
    buffer in small cache-friendly slabs.

    Args:
        ranks: ``[n_queries, k]`` integer array (``-1`` = unnamed negative); any memory order.
        labels: per query, sorted database indices and their codes.
        n_index: number of valid indices (database + declared distractors).
        n_db: database size, for error messages (default ``n_index``).
        names: query names, for error messages.
        source: input name, for error messages.
        budget_fraction: the tables of the queries read together plus the int64 work buffer use
            at most about this fraction of ``ranks.nbytes`` (at least a few hundred positions).
        group: numpy path: at most this many queries are read together (default 16; each needs a
            table; reading more together means fewer passes over the revisitop rows).
        block_elems: numpy path: positions per chunk and segment (for tests; default from the
            budget). Giving ``group`` or ``block_elems`` selects the numpy path.
        minus_one: whether -1 entries were accepted (padding or gaps), for error messages.

    Returns:
        Per query ``(positions, codes)``, positions strictly increasing.

    Raises:
        InputError: an index below -1 or beyond ``n_index - 1``, a non-integer value, or an image
            repeated in one list -- naming the query and the position.
    """
    nq, k = ranks.shape
    n_db = n_index if n_db is None else n_db
    check_ranks_dtype(ranks, source)
    if group is None and block_elems is None and accelerated():
        found = _accel_positions_from_ranks(ranks, labels, n_index, budget_fraction)
        if found is not None:
            return found
        log.debug("compiled ranks kernel declined; numpy path")
    group = 16 if group is None else group
    segment = block_elems or (1 << 16)
    table_len = n_index + 1
    out: list[Found] = []
    rows_contiguous = ranks.dtype == np.int64 and (k <= 1 or ranks.strides[1] == ranks.itemsize)
    if rows_contiguous:
        scanner = _RowScanner(labels, n_index, n_db, k, names, source, segment, minus_one)
        for q in range(nq):
            row = ranks[q]
            scanner.start(q)
            scanner.scan(row, 0, functools.partial(np.asarray, row))
            out.append(scanner.finish(functools.partial(np.asarray, row)))
        return out
    budget = ranks.nbytes * budget_fraction
    # queries read together (fewer passes over the revisitop rows), tables within half the budget
    g = max(1, min(group, nq, int(budget / 2) // table_len))
    chunk = block_elems or max(_SLAB, int(budget - g * table_len) // (8 * g))
    chunk = min(chunk, max(k, 1))
    buf = np.empty((g, chunk), dtype=np.int64)
    scanners = [
        _RowScanner(labels, n_index, n_db, k, names, source, segment, minus_one) for _ in range(g)
    ]
    for g0 in range(0, nq, g):
        g1 = min(nq, g0 + g)
        for r in range(g1 - g0):
            scanners[r].start(g0 + r)
        for j0 in range(0, k, chunk):
            j1 = min(k, j0 + chunk)
            rows = _transposed_chunk(ranks[g0:g1, j0:j1], buf[: g1 - g0], g0, j0, names, source)
            for r in range(g1 - g0):
                q = g0 + r
                scanners[r].scan(rows[r], j0, functools.partial(np.asarray, ranks[q]))
        for r in range(g1 - g0):
            q = g0 + r
            out.append(scanners[r].finish(functools.partial(np.asarray, ranks[q])))
    return out


def _accel_positions_from_ranks(
    ranks: np.ndarray, labels: Sequence[Labels], n_index: int, budget_fraction: float
) -> list[Found] | None:
    """The compiled ranks kernel; None when it declines (bad input or dtype: numpy path decides).

    Queries are scanned in groups whose label tables and seen-bitsets (``n_lab`` bytes + ``n_index
    / 8`` bytes each) fit in ``budget_fraction`` of ``ranks.nbytes`` (at least 16 MiB).
    """
    assert _accel is not None
    nq, k = ranks.shape
    if ranks.dtype not in (np.dtype(np.int64), np.dtype(np.int32)):
        return None
    sizes = np.array([idx.size for idx, _ in labels], dtype=np.int64)
    n_lab = max([int(idx[-1]) + 1 for idx, _ in labels if idx.size], default=1)
    if n_lab > n_index:  # labels outside the admitted range: let the numpy path decide
        return None
    per_query = n_lab + (n_index + 63) // 64 * 8
    g = max(1, min(nq, int(max(ranks.nbytes * budget_fraction, 1 << 24)) // per_query))
    out: list[Found] = []
    for g0 in range(0, max(nq, 1), g):
        g1 = min(nq, g0 + g)
        tables = np.zeros((g1 - g0, n_lab), dtype=np.uint8)
        for r in range(g1 - g0):
            idx, codes = labels[g0 + r]
            tables[r, idx] = codes
        off = np.zeros(g1 - g0 + 1, dtype=np.int64)
        np.cumsum(sizes[g0:g1], out=off[1:])
        pos = np.empty(int(off[-1]), dtype=np.int64)
        code = np.empty(int(off[-1]), dtype=np.uint8)
        count = np.zeros(g1 - g0, dtype=np.int64)
        if _accel.scan_ranks(ranks[g0:g1], tables, n_index, off, pos, code, count):
            return None
        for r in range(g1 - g0):
            a, c = int(off[r]), int(count[r])
            out.append((pos[a : a + c].copy(), code[a : a + c].copy()))
    return out


def _accel_ranks_from_scores(scores: np.ndarray, labels: Sequence[Labels]) -> list[Found] | None:
    """The compiled score kernel; None when it declines (NaN, a dtype other than float32/64).

    Per query the distinct labelled scores ``u`` (float64, exact for both dtypes); the kernel
    counts, for every score ``x``, the key ``2 * #{u < x} + (x is one of u)`` and snapshots the
    count of each labelled score's own key just before its row (= equal scores at a lower index).
    A labelled image's rank = #keys above its own + that snapshot.
    """
    assert _accel is not None
    n, nq = scores.shape
    if scores.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        return None
    us: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    for q in range(nq):
        idx, _ = labels[q]
        vals = scores[idx, q].astype(np.float64)
        if np.isnan(vals).any():
            return None
        u = np.unique(vals)  # sorted; -0.0 and 0.0 are one value, as in every comparison
        us.append(u)
        keys.append(2 * np.searchsorted(u, vals) + 1)
    d = np.array([u.size for u in us], dtype=np.int64)
    u_off = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(d, out=u_off[1:])
    cnt_off = np.zeros(nq + 1, dtype=np.int64)
    np.cumsum(2 * d + 1, out=cnt_off[1:])
    u_all = np.concatenate(us) if us else np.zeros(0)
    ev_row = (
        np.concatenate([labels[q][0] for q in range(nq)]).astype(np.int64)
        if nq
        else np.zeros(0, np.int64)
    )
    ev_q = np.repeat(np.arange(nq, dtype=np.int64), [labels[q][0].size for q in range(nq)])
    ev_key = np.concatenate(keys).astype(np.int64) if nq else np.zeros(0, np.int64)
    # Loop order = memory order: database rows outer for a C-ordered [n, nq] matrix.
    # (then queries in groups whose bin counters, 4 bytes a bin, stay in a 128 KiB cache)
    row_outer = nq > 1 and abs(scores.strides[0]) >= abs(scores.strides[1])
    n_bins = int(min(4096, max(1024, 16 * int(d.max(initial=0)))))  # measured best at R1M
    group = max(1, (1 << 17) // (4 * n_bins))
    # events in scan order: (group, row, query) for rows outer, else (query, row)
    order = np.lexsort((ev_q, ev_row, ev_q // group)) if row_outer else np.arange(ev_row.size)
    ev_row, ev_q, ev_key = ev_row[order], ev_q[order], ev_key[order]
    snap = np.zeros(ev_row.size, dtype=np.int64)
    cnt = np.zeros(int(cnt_off[-1]), dtype=np.int64)
    if _accel.score_ranks(
        scores, row_outer, u_all, u_off, ev_row, ev_q, ev_key, snap, cnt, cnt_off, n_bins, group
    ):
        return None
    rank = np.empty(ev_row.size, dtype=np.int64)
    rank[order] = snap
    out: list[Found] = []
    a = 0
    for q in range(nq):
        idx, codes = labels[q]
        c = cnt[cnt_off[q] : cnt_off[q + 1]]
        above = np.zeros(c.size, dtype=np.int64)  # above[key] = #scores with a higher key
        above[:-1] = np.cumsum(c[:0:-1])[::-1]
        lab_rank = above[keys[q]] + rank[a : a + idx.size]
        a += idx.size
        o = np.argsort(lab_rank, kind="stable")
        out.append((lab_rank[o], codes[o]))
    return out


# ---------------------------------------------------------------------------------------------
# Scores


def _nonzero_sparse(table: np.ndarray, idx: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(table[idx])`` for a uint8 ``table`` where hits are rare (via 8-byte words).

    ``idx`` must be in range; ``buf`` is a uint8 scratch of at least ``len(idx) + 8`` bytes.
    """
    length = idx.shape[0]
    padded = (length + 7) & ~7
    codes = buf[:padded]
    table.take(idx, out=codes[:length], mode="wrap")
    codes[length:] = 0
    words = np.flatnonzero(codes.view(np.uint64))
    if not words.size:
        return words
    sub_r, sub_c = np.nonzero(codes.reshape(-1, 8)[words])
    return words[sub_r] * 8 + sub_c


def _work_dtype(dtype: np.dtype) -> np.dtype:
    if np.issubdtype(dtype, np.floating):
        return np.dtype(np.float64) if dtype.itemsize >= 8 else np.dtype(np.float32)
    return np.dtype(np.float64)


def _exact_ranks_in_column(col: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Rank of each ``col[idx]`` in the stable descending order, by direct comparisons (slow)."""
    out = np.empty(idx.size, dtype=np.int64)
    for t, i in enumerate(idx.tolist()):
        s = col[i]
        out[t] = np.count_nonzero(col > s) + np.count_nonzero(col[:i] == s)
    return out


def labelled_ranks_from_scores(
    scores: np.ndarray,
    labels: Sequence[Labels],
    *,
    names: Sequence[str] | None = None,
    source: str | None = None,
    n_bins: int | None = None,
    block_rows: int | None = None,
    budget_fraction: float = 0.125,
    max_candidates: int | None = None,
) -> list[Found]:
    """Positions and codes of each query's labelled images in the stable descending score order.

    Equivalent to ranking each column with a stable ``argsort(-scores[:, q])`` (ties to the lower
    database index) and locating the labelled images, but without sorting: see the module docstring.

    Args:
        scores: ``[n_index, n_queries]`` similarities (revisitop orientation); float or integer.
        labels: per query, sorted database indices (``< n_index``) and their codes.
        names: query names, for error messages.
        source: input name, for error messages.
        n_bins: numpy path: histogram bins per query between its lowest and highest labelled
            score (default about one per 16 database items, 1,024 .. 65,536): more bins, fewer images to compare
            exactly.
        block_rows: database rows per streamed chunk (default: from ``budget_fraction``).
        budget_fraction: the transposed work buffer uses at most about this fraction of
            ``scores.nbytes`` (at least a few hundred rows).
        max_candidates: per query, at most this many images are kept for exact comparison
            (default ``max(65536, n // 32)``). A query that needs more -- its labelled scores sit
            in huge ties, e.g. the zeros of a sparse bag-of-words system -- is ranked instead by a
            stable sort of its column (slower, same result). Giving ``n_bins``, ``block_rows`` or
            ``max_candidates`` selects the numpy path.

    Returns:
        Per query ``(positions, codes)``, positions strictly increasing.

    Raises:
        InputError: a NaN score (naming the query and the database index).
    """
    n, nq = scores.shape
    if n_bins is None and block_rows is None and max_candidates is None and accelerated():
        found = _accel_ranks_from_scores(scores, labels)
        if found is not None:
            return found
        log.debug("compiled score kernel declined; numpy path")
    wd = _work_dtype(scores.dtype)
    if n_bins is None:
        n_bins = int(min(1 << 16, max(1 << 10, n // 16)))
    nbt = n_bins + 5  # bins 0..n_bins+4; labelled scores land in 2..n_bins+2
    top = float(n_bins + 4)

    scale = np.ones(nq, dtype=wd)
    offset = np.zeros(nq, dtype=wd)
    fast = np.zeros(nq, dtype=bool)
    mark = np.zeros(nq * nbt, dtype=bool)
    for q in range(nq):
        idx, _ = labels[q]
        vals = scores[idx, q].astype(wd)
        if idx.size == 0:
            continue
        if np.isnan(vals).any():
            bad = int(idx[np.flatnonzero(np.isnan(vals))[0]])
            raise InputError(f"{qname(names, q)}: score of database image {bad} is NaN", source)
        lo, hi = float(vals.min()), float(vals.max())
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            sc = n_bins / (hi - lo) if hi > lo else 1.0
            s_w, o_w = wd.type(sc), wd.type(2.0 - lo * sc)
        if not (np.isfinite(s_w) and s_w > 0 and np.isfinite(o_w)):
            continue  # infinite or extreme labelled scores: exact fallback below
        scale[q], offset[q] = s_w, o_w
        fast[q] = True
        tb = np.clip(vals * s_w + o_w, 0.0, top).astype(np.int64)
        mark[q * nbt + tb] = True

    hist = np.zeros((nq, nbt), dtype=np.int64 if n >= 2**31 else np.int32)
    if block_rows is not None:
        rows = max(1, block_rows)
    else:
        rows = max(_SLAB, int(scores.nbytes * budget_fraction) // (wd.itemsize * max(nq, 1)))
    rows = min(rows, max(n, 1))
    buf = np.empty((nq, rows), dtype=wd)
    ybuf = np.empty(rows, dtype=wd)
    bbuf = np.empty(rows, dtype=np.int64)
    mbuf = np.zeros(rows + 8, dtype=np.uint8)
    marks = mark.reshape(nq, nbt).view(np.uint8)
    cap = max_candidates if max_candidates is not None else max(1 << 16, n // 32)
    n_cand = np.zeros(nq, dtype=np.int64)
    heavy = np.zeros(nq, dtype=bool)
    # per query: candidate database indices, scores, bins (chunks in order: indices ascending)
    cand: list[list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = [[] for _ in range(nq)]
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        length = i1 - i0
        dst = buf[:, :length]
        for s0 in range(0, length, _SLAB):  # slab-wise transposed copy: cache friendly
            np.copyto(
                dst[:, s0 : s0 + _SLAB],
                scores[i0 + s0 : min(i1, i0 + s0 + _SLAB)].T,
                casting="unsafe",
            )
        if wd.kind == "f" and np.isnan(dst.min()):
            r, c = np.argwhere(np.isnan(dst))[0]
            raise InputError(
                f"{qname(names, int(r))}: score of database image {i0 + c} is NaN", source
            )
        y = ybuf[:length]
        b = bbuf[:length]
        for q in np.flatnonzero(fast & ~heavy).tolist():
            row = dst[q]
            np.multiply(row, scale[q], out=y)
            y += offset[q]
            np.clip(y, 0.0, top, out=y)
            b[...] = y  # truncation == floor: y >= 0
            np.add(hist[q], np.bincount(b, minlength=nbt), out=hist[q], casting="unsafe")
            hit = _nonzero_sparse(marks[q], b, mbuf)
            if hit.size:
                n_cand[q] += hit.size
                if n_cand[q] > cap:  # huge ties around a labelled score: sort this column instead
                    heavy[q] = True
                    cand[q] = []
                    continue
                cand[q].append((hit + i0, row[hit], b[hit]))

    out: list[Found] = []
    for q in range(nq):
        idx, codes = labels[q]
        if idx.size == 0:
            out.append((np.zeros(0, np.int64), np.zeros(0, np.uint8)))
            continue
        if fast[q] and not heavy[q]:
            h = hist[q].astype(np.int64)
            above = np.concatenate([np.cumsum(h[::-1])[::-1][1:], [0]])  # items in higher bins
            ci = np.concatenate([c[0] for c in cand[q]])
            cv = np.concatenate([c[1] for c in cand[q]])
            cb = np.concatenate([c[2] for c in cand[q]])
            # Stable descending score order: ties keep database order. Bins are monotone in the
            # score, so each bin's candidates are contiguous here and a candidate's rank is the
            # count of items in higher bins plus its place within its own bin.
            order = np.argsort(-cv, kind="stable")
            ci, cb = ci[order], cb[order]
            neg_b = -cb
            cand_rank = above[cb] + (np.arange(ci.size) - np.searchsorted(neg_b, neg_b))
            where = np.minimum(np.searchsorted(idx, ci), idx.size - 1)
            is_lab = idx[where] == ci
            lab_rank = np.empty(idx.size, dtype=np.int64)
            lab_rank[where[is_lab]] = cand_rank[is_lab]
            if np.count_nonzero(is_lab) != idx.size:  # cannot happen: labelled bins are marked
                raise AssertionError("labelled image missing from its own bin")
        else:
            log.debug(
                "query %d: %s, exact fallback", q, "huge ties" if heavy[q] else "non-finite labels"
            )
            col = np.ascontiguousarray(scores[:, q]).astype(wd)
            if np.isnan(col).any():
                bad = int(np.flatnonzero(np.isnan(col))[0])
                raise InputError(f"{qname(names, q)}: score of database image {bad} is NaN", source)
            if idx.size <= 16:
                lab_rank = _exact_ranks_in_column(col, idx)
            else:
                rank_of = np.empty(n, dtype=np.int64)
                rank_of[np.argsort(-col, kind="stable")] = np.arange(n)
                lab_rank = rank_of[idx]
        order = np.argsort(lab_rank, kind="stable")
        out.append((lab_rank[order], codes[order]))
    return out
