"""The four official protocols: ground truth + ranking (or scores, or descriptors) -> result.

==========  =====================  ==================  ============================================
protocol    setup(s)               positives           ignored (deleted from the list)
==========  =====================  ==================  ============================================
revisited   easy / medium / hard   easy / e+h / hard   hard+junk / junk / easy+junk (revisitop
                                                       ``compute_map``)
original    original               good + ok           junk (``compute_ap.cpp``)
holidays    holidays               group's others      the query image (``holidays_map.py``)
ukbench     ukbench                the object's 4      none; N-S score = mean count in the top 4
==========  =====================  ==================  ============================================

AP is the trapezoidal AP of all official programs (:func:`oxbench.evaluation.ap.average_precision`),
accumulated in the same order and in double precision, so revisited numbers equal revisitop's
``compute_map`` bit for bit (``compute_ap.cpp`` accumulates in single precision: its numbers differ
from ours by < 5e-7). A query whose list retrieves none of its positives scores AP 0 and P@K 0 (the
official Python crashes there). A query with no positives in a setup is skipped there: AP ``nan``,
listed in ``SetupResult.skipped``, left out of the means; a setup in which every query is empty is
an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.evaluation import kernels as K
from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.groundtruth import GroundTruth

log = logging.getLogger(__name__)

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)

# setup -> (positive codes, ignored codes)
SETUPS: dict[str, dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {
    "revisited": {
        "easy": ((K.EASY,), (K.HARD, K.JUNK)),
        "medium": ((K.EASY, K.HARD), (K.JUNK,)),
        "hard": ((K.HARD,), (K.EASY, K.JUNK)),
    },
    "original": {"original": ((K.POSITIVE,), (K.JUNK,))},
    "holidays": {"holidays": ((K.POSITIVE,), (K.JUNK,))},
    "ukbench": {"ukbench": ((K.POSITIVE,), (K.JUNK,))},
}


def query_labels(gt: GroundTruth) -> list[K.Labels]:
    """Per query: sorted labelled database indices and their codes (:mod:`.kernels` constants).

    revisited: easy -> EASY, hard -> HARD, junk -> JUNK; other protocols: good + ok (+ easy + hard)
    -> POSITIVE, junk -> JUNK.
    """
    out: list[K.Labels] = []
    for q in gt.queries:
        if gt.protocol == "revisited":
            parts = [(q.easy, K.EASY), (q.hard, K.HARD), (q.junk, K.JUNK)]
        else:
            parts = [(q.positives, K.POSITIVE), (q.junk, K.JUNK)]
        idx = np.concatenate([p for p, _ in parts]).astype(np.int64)
        codes = np.concatenate([np.full(p.size, c, np.uint8) for p, c in parts])
        order = np.argsort(idx, kind="stable")
        out.append((idx[order], codes[order]))
    return out


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(k) for k in ks)
    if not out or any(k < 1 for k in out) or len(set(out)) != len(out):
        raise InputError(f"ks must be distinct positive integers, got {list(ks)}")
    return out


def _ap_official(eff: NDArray[np.int64], n_pos: int) -> float:
    """revisitop ``compute_ap`` on 0-based ranks ``eff`` (ignored deleted), same operation order."""
    if eff.size == 0:
        return 0.0
    j = np.arange(eff.size, dtype=np.float64)
    r = eff.astype(np.float64)
    p0 = np.divide(j, r, out=np.ones_like(j), where=r != 0)
    p1 = (j + 1.0) / (r + 1.0)
    terms = (p0 + p1) * (1.0 / n_pos) / 2.0
    return float(np.cumsum(terms)[-1])  # sequential, like the official loop


def _p_at_ks(eff: NDArray[np.int64], ks: tuple[int, ...]) -> NDArray[np.float64]:
    out = np.zeros(len(ks), dtype=np.float64)
    if eff.size == 0:
        return out
    last = int(eff[-1]) + 1
    # eff is strictly increasing: |{pos <= kq}| = searchsorted(eff, kq - 1, "right")
    for t, k in enumerate(ks):
        kq = min(last, k)
        out[t] = int(np.searchsorted(eff, kq - 1, side="right")) / kq
    return out


def _sequential_mean(values: NDArray[np.float64]) -> NDArray[np.float64] | float:
    """Mean accumulated in order (as the official loops do), along axis 0."""
    return np.cumsum(values, axis=0)[-1] / values.shape[0]


def score_found(
    gt: GroundTruth,
    labels: Sequence[K.Labels],
    found: Sequence[K.Found],
    ks: Sequence[int] = DEFAULT_KS,
    *,
    n_distractors: int = 0,
    source: str | None = None,
) -> EvaluationResult:
    """Score per-query labelled positions (from a kernel) under ``gt.protocol``'s setups.

    Args:
        gt: the ground truth (its protocol picks the setups).
        labels: :func:`query_labels` of ``gt``.
        found: per query ``(positions, codes)`` of the labelled images in its ranked list.
        ks: the K of the P@K columns.
        n_distractors: recorded in the result.
        source: input name, for error messages.

    Raises:
        InputError: a setup in which every query has no positives.
    """
    ks = _check_ks(ks)
    nq = gt.n_queries
    setups: dict[str, SetupResult] = {}
    for name, (pos_codes, ign_codes) in SETUPS[gt.protocol].items():
        is_pos_code = np.zeros(256, dtype=bool)
        is_pos_code[list(pos_codes)] = True
        is_ign_code = np.zeros(256, dtype=bool)
        is_ign_code[list(ign_codes)] = True
        ap = np.full(nq, np.nan)
        pk = np.full((nq, len(ks)), np.nan)
        n_pos = np.zeros(nq, dtype=np.int64)
        top4 = np.full(nq, np.nan) if gt.protocol == "ukbench" else None
        skipped: list[int] = []
        for q in range(nq):
            n = int(np.count_nonzero(is_pos_code[labels[q][1]]))
            n_pos[q] = n
            if n == 0:
                skipped.append(q)
                continue
            positions, codes = found[q]
            is_pos = is_pos_code[codes]
            is_ign = is_ign_code[codes]
            pos_at = positions[is_pos]
            eff = pos_at - (np.cumsum(is_ign) - is_ign)[is_pos] if is_ign.any() else pos_at
            ap[q] = _ap_official(eff, n)
            pk[q] = _p_at_ks(eff, ks)
            if top4 is not None:
                top4[q] = np.count_nonzero(pos_at < 4)
        used = np.setdiff1d(np.arange(nq), skipped)
        if used.size == 0:
            raise InputError(
                f"{gt.dataset}: no query has positives in the {name!r} setup; nothing to evaluate",
                source or gt.source,
            )
        if skipped:
            log.info("%s %s: %d queries without positives skipped", gt.dataset, name, len(skipped))
        m = float(_sequential_mean(ap[used]))
        mp = cast(NDArray[np.float64], _sequential_mean(pk[used]))  # 2-D in: one mean per k
        setups[name] = SetupResult(
            map=m,
            mp_at_k={k: float(mp[t]) for t, k in enumerate(ks)},
            ap=ap,
            p_at_k=pk,
            skipped=tuple(skipped),
            n_positives=n_pos,
            score=None if top4 is None else float(_sequential_mean(top4[used])),
            per_query_score=top4,
        )
    return EvaluationResult(
        dataset=gt.dataset,
        protocol=gt.protocol,
        setups=setups,
        ks=ks,
        query_names=gt.query_names,
        n_distractors=n_distractors,
    )


def _check_distractors(n_distractors: int) -> int:
    if int(n_distractors) != n_distractors or n_distractors < 0:
        raise InputError(f"n_distractors must be a non-negative integer, got {n_distractors!r}")
    return int(n_distractors)


def evaluate(
    gt: GroundTruth,
    ranks: ArrayLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    n_distractors: int = 0,
    source: str = "ranks",
) -> EvaluationResult:
    """Score ranked lists with the official protocol of ``gt`` (exact, validated).

    Matches revisitop ``compute_map`` (revisited, all three setups), ``compute_ap.cpp`` (original;
    we accumulate in double precision), ``holidays_map.py`` (Holidays: written rank numbers are the
    positions, the query image is ignored) and the N-S score (UKBench: mean number of the object's
    4 images in the top 4 of each list; the query is its own first image). Also for UKBench the
    trapezoidal mAP is reported.

    Args:
        gt: ground truth; ``gt.protocol`` selects the rules.
        ranks: internal layout ``[n_queries, k]``: row ``q`` is query ``q``'s ranked list of indices
            ``0 <= v < n_db + n_distractors``, best first; ``-1`` = an unnamed negative at that
            position (a gap, or padding of a shorter list). Lists may be truncated: positives not
            in the list add nothing but still count. For a revisitop ``(k, n_queries)`` array use
            ``evaluate(gt, from_revisitop(ranks))`` (a view, no copy).
        ks: the K of the mP@K columns.
        n_distractors: indices ``n_db .. n_db + n_distractors - 1`` are admitted as distractors
            (always negatives; R1M).
        source: name of the ranks input, for error messages.

    Returns:
        The :class:`EvaluationResult` (per-query AP/P@K, per-setup means, skipped queries).

    Raises:
        InputError: wrong shape or dtype; an index that is negative (other than -1), non-integer or
            out of range; an image repeated in one list; inconsistent ground truth; a setup in
            which no query has positives. The message names the input, the query and the problem.

    Example:
        >>> from oxbench.groundtruth import GroundTruth, make_query
        >>> gt = GroundTruth("toy", "original", ("a", "b", "c"), (make_query("q", good=[2], junk=[0]),))
        >>> evaluate(gt, [[0, 1, 2]]).setups["original"].map  # junk deleted: b, c -> (0/1 + 1/2) / 2
        0.25
    """
    n_distractors = _check_distractors(n_distractors)
    gt.validate()
    arr = np.asarray(ranks)
    if arr.ndim != 2:
        raise InputError(f"ranks must be 2-D [n_queries, k], got shape {arr.shape}", source)
    K.check_ranks_dtype(arr, source)
    if arr.shape[0] != gt.n_queries:
        raise InputError(
            f"ranks hold {arr.shape[0]} ranked lists (shape {arr.shape}, internal layout "
            f"[n_queries, k]) but {gt.source} has {gt.n_queries} queries",
            source,
        )
    if gt.protocol == "ukbench" and arr.shape[1] < 4:
        raise InputError(f"UKBench needs at least the top 4 of each list, got {arr.shape[1]}", source)
    labels = query_labels(gt)
    found = K.labelled_positions_from_ranks(
        arr, labels, gt.n_db + n_distractors, n_db=gt.n_db, names=gt.query_names, source=source
    )
    return score_found(gt, labels, found, ks, n_distractors=n_distractors, source=source)


def _check_scores(gt: GroundTruth, scores: np.ndarray, n_distractors: int, source: str) -> None:
    if scores.ndim != 2:
        raise InputError(f"scores must be 2-D [n_db, n_queries], got shape {scores.shape}", source)
    if scores.dtype == bool or not (
        np.issubdtype(scores.dtype, np.floating) or np.issubdtype(scores.dtype, np.integer)
    ):
        raise InputError(f"scores must be numbers, got dtype {scores.dtype}", source)
    n_index = gt.n_db + n_distractors
    if scores.shape[1] != gt.n_queries:
        raise InputError(
            f"scores have {scores.shape[1]} columns (queries) but {gt.source} has {gt.n_queries} queries "
            f"(shape {scores.shape}; expected [n_db + n_distractors, n_queries])",
            source,
        )
    if scores.shape[0] != n_index:
        extra = "" if scores.shape[0] < gt.n_db else " (declare the extra rows as distractors)"
        raise InputError(
            f"scores have {scores.shape[0]} rows but the database has {gt.n_db} images"
            + (f" + {n_distractors} distractors" if n_distractors else "")
            + extra,
            source,
        )


def evaluate_scores(
    gt: GroundTruth,
    scores: ArrayLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    n_distractors: int = 0,
    source: str = "scores",
) -> EvaluationResult:
    """Score a similarity matrix: each query ranks the database by descending score.

    The order is the stable descending sort (ties go to the lower database index), exactly as
    :func:`oxbench.evaluation.ranking.ranks_from_scores` followed by :func:`evaluate` -- but
    without sorting (see :mod:`oxbench.evaluation.kernels`), so at R1M scale it is much faster than
    revisitop's ``argsort(-sim, axis=0)`` + ``compute_map`` (measured in ``bench/README.md``), with
    the same numbers (revisitop's unstable sort may order exactly tied scores differently).

    Args:
        gt: ground truth.
        scores: ``[n_db + n_distractors, n_queries]`` (revisitop orientation, ``X.T @ Q``); any
            float or integer dtype, C- or F-ordered. NaN is refused; +-inf is allowed.
        ks: the K of the mP@K columns.
        n_distractors: rows ``n_db ..`` are distractors (always negatives).
        source: name of the scores input, for error messages.

    Raises:
        InputError: wrong shape or dtype, NaN, inconsistent ground truth, an empty setup.
    """
    n_distractors = _check_distractors(n_distractors)
    gt.validate()
    arr = np.asarray(scores)
    _check_scores(gt, arr, n_distractors, source)
    labels = query_labels(gt)
    found = K.labelled_ranks_from_scores(arr, labels, names=gt.query_names, source=source)
    return score_found(gt, labels, found, ks, n_distractors=n_distractors, source=source)


def evaluate_features(
    gt: GroundTruth,
    query_features: ArrayLike,
    db_features: ArrayLike,
    *,
    ks: Sequence[int] = DEFAULT_KS,
    n_distractors: int = 0,
    chunk_rows: int = 65536,
    source: str = "features",
) -> EvaluationResult:
    """Score descriptors: similarity = dot product (cosine for L2-normalised rows).

    The ``[n_db, n_queries]`` float32 score matrix is filled ``chunk_rows`` database rows at a time
    (so a 1M x 2048 database never needs a second copy), then scored by :func:`evaluate_scores`.
    Descriptors are used as given: normalise them first if you want cosine similarity.

    Args:
        gt: ground truth.
        query_features: ``[n_queries, d]``.
        db_features: ``[n_db + n_distractors, d]``, database rows first, then distractors.
        ks: the K of the mP@K columns.
        n_distractors: trailing rows of ``db_features`` that are distractors.
        chunk_rows: database rows per matrix product.
        source: name of the input, for error messages.

    Raises:
        InputError: shapes that do not fit, non-finite descriptors.
    """
    q = np.asarray(query_features)
    x = np.asarray(db_features)
    for what, a in (("query features", q), ("database features", x)):
        if a.ndim != 2:
            raise InputError(f"{what} must be 2-D [n, d], got shape {a.shape}", source)
        if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)) or a.dtype == bool:
            raise InputError(f"{what} must be numbers, got dtype {a.dtype}", source)
    if q.shape[1] != x.shape[1]:
        raise InputError(f"query features have dimension {q.shape[1]} but database features {x.shape[1]}", source)
    if q.shape[0] != gt.n_queries:
        raise InputError(f"{q.shape[0]} query descriptors but {gt.source} has {gt.n_queries} queries", source)
    qf = np.ascontiguousarray(q, dtype=np.float32)
    if not np.isfinite(qf).all():
        raise InputError("query features contain NaN or infinity", source)
    scores = np.empty((x.shape[0], q.shape[0]), dtype=np.float32)
    for i0 in range(0, x.shape[0], chunk_rows):
        xb = np.asarray(x[i0 : i0 + chunk_rows], dtype=np.float32)
        if not np.isfinite(xb).all():
            bad = i0 + int(np.flatnonzero(~np.isfinite(xb).all(axis=1))[0])
            raise InputError(f"database descriptor {bad} contains NaN or infinity", source)
        np.matmul(xb, qf.T, out=scores[i0 : i0 + xb.shape[0]])
    return evaluate_scores(gt, scores, ks=ks, n_distractors=n_distractors, source=source)
