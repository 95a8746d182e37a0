"""Fast kernels: where each query's *labelled* images sit in its ranking.

Every protocol only needs, per query, the 0-based positions of the labelled images (positives and
ignored ones) in the ranked list; everything else is a negative. Both kernels return, per query,
``(positions, codes)``: strictly increasing ``int64`` positions and the ``uint8`` label code of the
image there (see :data:`EASY` ...). The scoring in :mod:`oxbench.evaluation.protocols` works on those
short arrays only.

- :func:`labelled_positions_from_ranks` streams a ``[n_queries, k]`` ranks array (C-ordered, or the
  transposed view of a revisitop ``(k, n_queries)`` file) in blocks of positions: one gather of a
  small per-query label table (``uint8``) per entry, plus an exact range and duplicate check (each
  entry marks its image as seen in the same table). Extra memory: one byte per (query, database
  image) for the queries processed together (at most 1/8 of the ranks array, by default) and a
  block.
- :func:`labelled_ranks_from_scores` never sorts the score matrix. The rank of a labelled image
  ``i`` with score ``s`` in the stable descending order is ``#{score > s} + #{score == s, index <
  i}``. A monotone map of scores to a few thousand bins per query (linear between the query's lowest
  and highest labelled score) turns the first term into a histogram count, except inside the bins
  that hold a labelled score, whose images are collected and compared exactly. One pass over the
  matrix in row blocks; the result is exact (ties included), whatever the score distribution.

Both are numpy-only.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError

log = logging.getLogger(__name__)

# Label codes in the per-query tables. 0 = unlabelled (negative).
EASY = 1  # revisited easy; also the single positive class of the other protocols
HARD = 2  # revisited hard
JUNK = 3  # ignored (revisited unclear/junk, original junk, the Holidays query itself)
POSITIVE = EASY
_SEEN = 0x80

# A query's labels: sorted unique database indices and their codes.
Labels = tuple[NDArray[np.int64], NDArray[np.uint8]]
Found = tuple[NDArray[np.int64], NDArray[np.uint8]]


def _qname(names: Sequence[str] | None, q: int) -> str:
    return f"query {q} ({names[q]})" if names is not None and q < len(names) else f"query {q}"


def _range_text(n_db: int, n_index: int) -> str:
    if n_index == n_db:
        return f"database indices are 0..{n_db - 1}"
    return f"database indices are 0..{n_db - 1} and distractors {n_db}..{n_index - 1}"


def _int_block(blk: np.ndarray, g0: int, j0: int, names: Sequence[str] | None, source: str | None) -> np.ndarray:
    """Convert a block of ranks to int64, refusing non-integer values (with their position)."""
    if blk.dtype == np.int64:
        return blk
    if np.issubdtype(blk.dtype, np.integer):
        if np.issubdtype(blk.dtype, np.unsignedinteger) and blk.size and blk.max() > np.iinfo(np.int64).max:
            r, c = np.unravel_index(int(np.argmax(blk)), blk.shape)
            raise InputError(f"{_qname(names, g0 + r)}: rank position {j0 + c} holds {blk[r, c]}, not an index", source)
        return blk.astype(np.int64)
    if np.issubdtype(blk.dtype, np.floating):
        bad = ~np.isfinite(blk)
        bad[~bad] = blk[~bad] != np.round(blk[~bad])
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise InputError(
                f"{_qname(names, g0 + r)}: rank position {j0 + c} holds {float(blk[r, c])!r}, not an integer index",
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


def _raise_duplicate(row: np.ndarray, q: int, names: Sequence[str] | None, source: str | None) -> None:
    valid = row[row >= 0]
    vals, first, counts = np.unique(valid, return_index=True, return_counts=True)
    dup = vals[counts > 1]
    v = int(dup[0]) if dup.size else -1
    where = np.flatnonzero(row == v)[:2].tolist()
    raise InputError(
        f"{_qname(names, q)}: image {v} appears more than once in the ranked list (positions "
        f"{', '.join(map(str, where))}); the official programs would count it twice",
        source,
    )


def labelled_positions_from_ranks(
    ranks: np.ndarray,
    labels: Sequence[Labels],
    n_index: int,
    *,
    n_db: int | None = None,
    names: Sequence[str] | None = None,
    source: str | None = None,
    memory_fraction: float = 0.125,
    block_elems: int = 1 << 20,
) -> list[Found]:
    """Positions and codes of each query's labelled images in its ranked list, with validation.

    Args:
        ranks: ``[n_queries, k]`` integer array (``-1`` = unnamed negative); any memory order.
        labels: per query, sorted database indices and their codes.
        n_index: number of valid indices (database + declared distractors).
        n_db: database size, for error messages (default ``n_index``).
        names: query names, for error messages.
        source: input name, for error messages.
        memory_fraction: label tables for several queries are kept at once, up to this fraction of
            ``ranks.nbytes`` (at least one query's table).
        block_elems: entries per streamed block.

    Returns:
        Per query ``(positions, codes)``, positions strictly increasing.

    Raises:
        InputError: an index below -1 or beyond ``n_index - 1``, a non-integer value, or an image
            repeated in one list -- naming the query and the position.
    """
    nq, k = ranks.shape
    n_db = n_index if n_db is None else n_db
    check_ranks_dtype(ranks, source)
    found_pos: list[list[np.ndarray]] = [[] for _ in range(nq)]
    found_code: list[list[np.ndarray]] = [[] for _ in range(nq)]
    table_len = n_index + 1  # last slot: the -1 sentinel, never labelled
    group = int(max(1, min(nq, (ranks.nbytes * memory_fraction) // table_len)))
    for g0 in range(0, nq, group):
        g1 = min(nq, g0 + group)
        luts = np.zeros((g1 - g0, table_len), dtype=np.uint8)
        for q in range(g0, g1):
            idx, codes = labels[q]
            luts[q - g0, idx] = codes
        n_missing = np.zeros(g1 - g0, dtype=np.int64)  # -1 entries per query
        step = max(256, block_elems // (g1 - g0))
        for j0 in range(0, k, step):
            j1 = min(k, j0 + step)
            blk = _int_block(np.ascontiguousarray(ranks[g0:g1, j0:j1]), g0, j0, names, source)
            lo, hi = int(blk.min()), int(blk.max())
            if lo < -1 or hi >= n_index:
                bad = (blk < -1) | (blk >= n_index)
                r, c = np.argwhere(bad)[0]
                raise InputError(
                    f"{_qname(names, g0 + r)}: rank position {j0 + c} holds index {blk[r, c]}, "
                    f"but {_range_text(n_db, n_index)} (-1 marks a gap)",
                    source,
                )
            if lo == -1:
                n_missing += np.count_nonzero(blk == -1, axis=1)
            for r in range(g1 - g0):
                row = blk[r]
                lut = luts[r]
                codes = lut.take(row)
                lut[row] = _SEEN
                lut[-1] = 0
                nz = np.flatnonzero(codes)
                if nz.size:
                    c = codes[nz]
                    if c.max() >= _SEEN:  # an image already seen in an earlier block
                        _raise_duplicate(np.asarray(ranks[g0 + r]), g0 + r, names, source)
                    found_pos[g0 + r].append(nz + j0)
                    found_code[g0 + r].append(c)
        # Duplicates inside one block: fewer distinct images seen than entries given.
        distinct = np.count_nonzero(luts == _SEEN, axis=1)
        expected = k - n_missing
        for r in np.flatnonzero(distinct != expected):
            _raise_duplicate(np.asarray(ranks[g0 + r]), g0 + int(r), names, source)
    out: list[Found] = []
    for q in range(nq):
        if found_pos[q]:
            out.append((np.concatenate(found_pos[q]), np.concatenate(found_code[q])))
        else:
            out.append((np.zeros(0, np.int64), np.zeros(0, np.uint8)))
    return out


# ---------------------------------------------------------------------------------------------
# Scores


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
    n_bins: int = 4096,
    block_rows: int | None = None,
) -> list[Found]:
    """Positions and codes of each query's labelled images in the stable descending score order.

    Equivalent to ranking each column with a stable ``argsort(-scores[:, q])`` (ties to the lower
    database index) and locating the labelled images, but without sorting: see the module docstring.

    Args:
        scores: ``[n_index, n_queries]`` similarities (revisitop orientation); float or integer.
        labels: per query, sorted database indices (``< n_index``) and their codes.
        names: query names, for error messages.
        source: input name, for error messages.
        n_bins: histogram bins per query between its lowest and highest labelled score.
        block_rows: database rows per streamed block (default: about 2**20 entries).

    Returns:
        Per query ``(positions, codes)``, positions strictly increasing.

    Raises:
        InputError: a NaN score (naming the query and the database index).
    """
    n, nq = scores.shape
    wd = _work_dtype(scores.dtype)
    nbt = n_bins + 5  # bins 0..n_bins+4; labelled scores land in 2..n_bins+2
    top = float(n_bins + 4)

    scale = np.ones(nq, dtype=wd)
    offset = np.zeros(nq, dtype=wd)
    fast = np.zeros(nq, dtype=bool)
    lab_vals: list[np.ndarray] = []
    mark = np.zeros(nq * nbt, dtype=bool)
    for q in range(nq):
        idx, _ = labels[q]
        vals = scores[idx, q].astype(wd)
        lab_vals.append(vals)
        if idx.size == 0:
            continue
        if np.isnan(vals).any():
            bad = int(idx[np.flatnonzero(np.isnan(vals))[0]])
            raise InputError(f"{_qname(names, q)}: score of database image {bad} is NaN", source)
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

    hist = np.zeros(nq * nbt, dtype=np.int64)
    qoff = (np.arange(nq, dtype=np.int64) * nbt)[None, :]
    rows = block_rows or max(1, (1 << 20) // max(nq, 1))
    cand_item: list[np.ndarray] = []
    cand_q: list[np.ndarray] = []
    cand_val: list[np.ndarray] = []
    cand_bin: list[np.ndarray] = []
    buf = np.empty((rows, nq), dtype=wd)
    for i0 in range(0, n, rows):
        i1 = min(n, i0 + rows)
        blk = scores[i0:i1]
        y = buf[: i1 - i0]
        np.multiply(blk, scale, out=y, casting="unsafe")
        y += offset
        np.clip(y, 0.0, top, out=y)
        if np.isnan(y.min()):
            r, c = np.argwhere(np.isnan(np.asarray(blk, dtype=wd)))[0]
            raise InputError(f"{_qname(names, int(c))}: score of database image {i0 + r} is NaN", source)
        bins = y.astype(np.int64)
        bins += qoff
        flat = bins.ravel()
        hist += np.bincount(flat, minlength=nq * nbt)
        hit = np.flatnonzero(mark.take(flat))
        if hit.size:
            r, c = np.divmod(hit, nq)
            cand_item.append(r + i0)
            cand_q.append(c)
            cand_val.append(np.asarray(blk, dtype=wd)[r, c])
            cand_bin.append(flat[hit] - c * nbt)

    if cand_item:
        ci = np.concatenate(cand_item)
        cq = np.concatenate(cand_q)
        cv = np.concatenate(cand_val)
        cb = np.concatenate(cand_bin)
        # Group by query, then bin, then descending score, then database index.
        order = np.lexsort((ci, -cv, cb, cq))
        ci, cq, cv, cb = ci[order], cq[order], cv[order], cb[order]
        q_start = np.searchsorted(cq, np.arange(nq + 1))
    else:
        ci = cq = cb = np.zeros(0, np.int64)
        cv = np.zeros(0, wd)
        q_start = np.zeros(nq + 1, np.int64)

    out: list[Found] = []
    for q in range(nq):
        idx, codes = labels[q]
        if idx.size == 0:
            out.append((np.zeros(0, np.int64), np.zeros(0, np.uint8)))
            continue
        if fast[q]:
            h = hist[q * nbt : (q + 1) * nbt]
            above = np.concatenate([np.cumsum(h[::-1])[::-1][1:], [0]])  # items in higher bins
            a, b = q_start[q], q_start[q + 1]
            qi, qb = ci[a:b], cb[a:b]
            pos_in_q = np.arange(b - a)
            bin_start = np.searchsorted(qb, qb)  # first candidate of the same bin
            cand_rank = above[qb] + (pos_in_q - bin_start)
            where = np.searchsorted(idx, qi)
            where_c = np.minimum(where, idx.size - 1)
            is_lab = idx[where_c] == qi
            lab_rank = np.empty(idx.size, dtype=np.int64)
            lab_rank[where_c[is_lab]] = cand_rank[is_lab]
            if np.count_nonzero(is_lab) != idx.size:  # cannot happen: labelled bins are marked
                raise AssertionError("labelled image missing from its own bin")
        else:
            log.debug("query %d: non-finite labelled scores, exact fallback", q)
            col = np.ascontiguousarray(scores[:, q]).astype(wd)
            if np.isnan(col).any():
                bad = int(np.flatnonzero(np.isnan(col))[0])
                raise InputError(f"{_qname(names, q)}: score of database image {bad} is NaN", source)
            lab_rank = _exact_ranks_in_column(col, idx)
        order = np.argsort(lab_rank, kind="stable")
        out.append((lab_rank[order], codes[order]))
    return out
