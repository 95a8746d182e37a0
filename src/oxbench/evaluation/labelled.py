"""Scoring by label: the engine of the four official protocols of labelled ground truth.

==========  =====================  ==================  ============================================
protocol    setup(s)               positives           ignored (deleted from the list)
==========  =====================  ==================  ============================================
revisited   easy / medium / hard   easy / e+h / hard   hard+junk / junk / easy+junk (revisitop
                                                       ``compute_map``)
original    original               good + ok           junk (``compute_ap.cpp``)
holidays    holidays               group's others      the query image (``holidays_map.py``)
ukbench     ukbench                the object's 4      none; N-S score = mean count in the top 4
==========  =====================  ==================  ============================================

Each of them is a :class:`LabelledProtocol` (one module each in :mod:`oxbench.evaluation.protocols`)
that says which label codes are positive and ignored in each setup; this module scores any of them.
:func:`evaluate`, :func:`evaluate_scores` and :func:`evaluate_features` hand over to the ground
truth's protocol, whatever it is (GLDv2 and ILIAS score otherwise).

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
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.evaluation import kernels as K
from oxbench.evaluation.ap import average_precision, precision_at_ks
from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.groundtruth import GroundTruth, Query
from oxbench.protocol import Protocol

log = logging.getLogger(__name__)

DEFAULT_KS: tuple[int, ...] = (1, 5, 10)

#: The largest ``n_distractors`` accepted (2**40; R1M declares 1,001,001): a larger declared count
#: is a typo, and no kernel's memory depends on it.
MAX_DISTRACTORS: int = 1 << 40

#: Per setup: (positive codes, ignored codes) of :mod:`.kernels`.
CodeSetups = Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]]


def pct(x: float) -> str:
    """A fraction as the printed lines show it: percent with two decimals (``nan`` for none).

    revisitop prints ``np.around(x * 100, decimals=2)``: rounded the same way (half to even on the
    scaled value), then shown with two decimals.
    """
    return "nan" if math.isnan(x) else f"{float(np.around(x * 100.0, 2)):.2f}"


def json_float(x: float) -> float | None:
    """A number for JSON: ``None`` for NaN."""
    x = float(x)
    return None if math.isnan(x) else x


class LabelledProtocol(Protocol):
    """A protocol scored by label: each query labels database images (positive, ignored...) and
    every setup says which labels are positive and which are deleted from the ranked list.

    The printed line of a protocol of one setup is ``oxford5k: mAP 87.80, mP@k[1 5 10] [...]``
    (with the N-S score first where the protocol counts one: ``ukbench: score 3.5000 (of 4), mAP
    ...``); its JSON is ``{"map": f, "ap": {"<query>": f}}``.
    """

    #: Per setup: (positive codes, ignored codes) of :mod:`.kernels`.
    code_setups: ClassVar[CodeSetups] = {}
    #: Count the positives in the top this many (UKBench's N-S score), or ``None``.
    top_count: ClassVar[int | None] = None
    #: Lists shorter than this are refused (UKBench needs its top 4).
    min_list_length: ClassVar[int] = 0
    #: Per-query results are keyed by the query id (``all_souls_1``) where the queries have one.
    keys_by_query_id: ClassVar[bool] = False

    def query_label_parts(self, query: Query) -> tuple[tuple[NDArray[np.int64], int], ...]:
        """Positives (good + ok, or easy + hard) -> POSITIVE, junk -> JUNK."""
        return ((query.positives, K.POSITIVE), (query.junk, K.JUNK))

    def evaluate(self, gt: GroundTruth, ranks: ArrayLike, **options: Any) -> EvaluationResult:
        return evaluate_labelled(gt, ranks, **options)

    def evaluate_scores(
        self, gt: GroundTruth, scores: ArrayLike, **options: Any
    ) -> EvaluationResult:
        return evaluate_labelled_scores(gt, scores, **options)

    # -- writing ------------------------------------------------------------------------------
    def _mp(self, result: EvaluationResult, s: SetupResult) -> str:
        return "[" + " ".join(pct(s.mp_at_k[k]) for k in result.ks) + "]"

    def lines(self, result: EvaluationResult) -> list[str]:
        name = result.dataset
        kstr = " ".join(str(k) for k in result.ks)
        out = []
        for s in result.setups.values():
            line = (
                f"{name}: score {s.score:.4f} (of 4), mAP {pct(s.map)}"
                if s.score is not None
                else (f"{name}: mAP {pct(s.map)}")
            )
            out.append(line + (f", mP@k[{kstr}] {self._mp(result, s)}" if result.ks else ""))
        return out

    def table(self, result: EvaluationResult) -> tuple[list[str], list[list[str]]]:
        header = ["setup", "queries", "mAP"] + [f"mP@{k}" for k in result.ks]
        if any(s.score is not None for s in result.setups.values()):
            header.append("score")
        rows = []
        for n, s in result.setups.items():
            used = len(s.ap) - len(s.skipped)
            row = [n, f"{used}/{len(s.ap)}", pct(s.map)] + [pct(s.mp_at_k[k]) for k in result.ks]
            if "score" in header:
                row.append("" if s.score is None else f"{s.score:.4f}")
            rows.append(row)
        return header, rows

    def result_dict(self, result: EvaluationResult) -> dict[str, Any]:
        (s,) = result.setups.values()
        names = result.query_ids or result.query_names or tuple(str(i) for i in range(len(s.ap)))
        return {
            "map": json_float(s.map),
            "ap": {q: json_float(v) for q, v in zip(names, s.ap, strict=True)},
        }

    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        (setup,) = per_query
        h = self.headline_metric
        key = "map" if h.metric == "ap" else h.metric
        if key not in metrics:
            raise InputError(f"no {key!r}")
        yield key, metrics[key], setup, h.metric


def query_labels(gt: GroundTruth) -> list[K.Labels]:
    """Per query: sorted labelled database indices and their codes (:mod:`.kernels` constants).

    revisited: easy -> EASY, hard -> HARD, junk -> JUNK; other protocols: good + ok (+ easy + hard)
    -> POSITIVE, junk -> JUNK.
    """
    protocol = as_labelled(gt)
    out: list[K.Labels] = []
    for q in gt.queries:
        parts = protocol.query_label_parts(q)
        idx = np.concatenate([p for p, _ in parts]).astype(np.int64)
        codes = np.concatenate([np.full(p.size, c, np.uint8) for p, c in parts])
        order = np.argsort(idx, kind="stable")
        out.append((idx[order], codes[order]))
    return out


def as_labelled(gt: GroundTruth) -> LabelledProtocol:
    """The protocol of ``gt``, which must be scored by label (one line otherwise)."""
    if not isinstance(gt.protocol, LabelledProtocol):
        raise InputError(f"{gt.dataset}: the {gt.protocol} protocol is not scored by label")
    return gt.protocol


def _check_ks(ks: Sequence[int] | None, protocol: Protocol) -> tuple[int, ...]:
    if ks is None:
        return protocol.default_ks
    try:
        out = tuple(int(k) for k in ks)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"ks must be distinct positive integers, got {ks!r}") from None
    if any(k < 1 for k in out) or len(set(out)) != len(out):
        raise InputError(f"ks must be distinct positive integers, got {list(ks)}")
    return out


def _sequential_mean(values: NDArray[np.float64]) -> NDArray[np.float64] | float:
    """Mean accumulated in order (as the official loops do), along axis 0."""
    return np.cumsum(values, axis=0)[-1] / values.shape[0]


def setup_positions(
    labels: Sequence[K.Labels],
    found: Sequence[K.Found],
    pos_codes: Sequence[int],
    ign_codes: Sequence[int],
) -> Iterator[tuple[int, NDArray[np.int64], NDArray[np.int64]]]:
    """Per query of one setup: its number of positives, the 0-based positions of the retrieved
    positives once ignored images are deleted from the list, and their positions as listed."""
    is_pos_code = np.zeros(256, dtype=bool)
    is_pos_code[list(pos_codes)] = True
    is_ign_code = np.zeros(256, dtype=bool)
    is_ign_code[list(ign_codes)] = True
    for q in range(len(labels)):
        n = int(np.count_nonzero(is_pos_code[labels[q][1]]))
        positions, codes = found[q]
        is_pos = is_pos_code[codes]
        is_ign = is_ign_code[codes]
        pos_at = positions[is_pos]
        eff = pos_at - (np.cumsum(is_ign) - is_ign)[is_pos] if is_ign.any() else pos_at
        yield n, eff, pos_at


def score_found(
    gt: GroundTruth,
    labels: Sequence[K.Labels],
    found: Sequence[K.Found],
    ks: Sequence[int] | None = None,
    *,
    n_distractors: int = 0,
    padding: int | None = None,
    source: str | None = None,
) -> EvaluationResult:
    """Score per-query labelled positions (from a kernel) under ``gt.protocol``'s setups.

    Every query's AP and P@K come from :func:`~oxbench.evaluation.ap.average_precision` and
    :func:`~oxbench.evaluation.ap.precision_at_ks` on its positives' positions, ignored items
    deleted.

    Args:
        gt: the ground truth (its protocol picks the setups).
        labels: :func:`query_labels` of ``gt``.
        found: per query ``(positions, codes)`` of the labelled images in its ranked list.
        ks: the K of the capped P@K columns (default: the protocol's ``default_ks``).
        n_distractors: recorded in the result.
        padding: recorded in the result (the value that padded short lists, or None).
        source: input name, for error messages.

    Raises:
        InputError: a setup in which every query has no positives.
    """
    protocol = as_labelled(gt)
    ks = _check_ks(ks, protocol)
    nq = gt.n_queries
    setups: dict[str, SetupResult] = {}
    for name, (pos_codes, ign_codes) in protocol.code_setups.items():
        ap = np.full(nq, np.nan)
        pk = np.full((nq, len(ks)), np.nan)
        n_pos = np.zeros(nq, dtype=np.int64)
        top = protocol.top_count
        top_counts = np.full(nq, np.nan) if top is not None else None
        skipped: list[int] = []
        for q, (n, eff, pos_at) in enumerate(setup_positions(labels, found, pos_codes, ign_codes)):
            n_pos[q] = n
            if n == 0:
                skipped.append(q)
                continue
            ap[q] = average_precision(eff, n)
            pk[q] = precision_at_ks(eff, ks)
            if top_counts is not None and top is not None:
                top_counts[q] = np.count_nonzero(pos_at < top)
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
            score=None if top_counts is None else float(_sequential_mean(top_counts[used])),
            per_query_score=top_counts,
        )
    return EvaluationResult(
        dataset=gt.dataset,
        protocol=protocol,
        setups=setups,
        ks=ks,
        query_names=gt.query_names,
        n_distractors=n_distractors,
        query_ids=gt.query_ids
        if protocol.keys_by_query_id and any(q.query_id for q in gt.queries)
        else (),
        padding=padding,
    )


def _check_distractors(n_distractors: int) -> int:
    if isinstance(n_distractors, bool) or int(n_distractors) != n_distractors or n_distractors < 0:
        raise InputError(f"n_distractors must be a non-negative integer, got {n_distractors!r}")
    if n_distractors > MAX_DISTRACTORS:
        raise InputError(
            f"n_distractors {n_distractors} is beyond any collection (at most {MAX_DISTRACTORS:,}; "
            "R1M declares 1,001,001)"
        )
    return int(n_distractors)


def _find_entry(arr: np.ndarray, bad: Callable[[np.ndarray], np.ndarray]) -> tuple[int, int]:
    """(query, position) of the first entry of ``arr [n_queries, k]`` for which ``bad`` holds."""
    for q in range(arr.shape[0]):
        hit = np.flatnonzero(bad(np.asarray(arr[q])))
        if hit.size:
            return q, int(hit[0])
    raise AssertionError("no such entry")  # pragma: no cover - callers checked that one exists


def check_rank_values(
    ranks: np.ndarray,
    n_db: int,
    n_index: int,
    *,
    padding: int | None = None,
    gaps: bool = False,
    names: Sequence[str] | None = None,
    source: str | None = None,
) -> int:
    """Check that a ranks array ``[n_queries, k]`` holds database indices; return the largest + 1.

    Integer dtypes only: a non-empty floating-point array is refused whatever its values (it is
    almost always a score matrix given as ranks). Every value must be in ``0 .. n_index - 1``, except
    ``-1`` where allowed: with ``padding=-1`` at the end of a list (FAISS pads lists shorter than
    ``k`` with -1), with ``gaps=True`` anywhere (an unnamed negative at that position, as a
    Holidays result file that skips rank numbers).

    Returns:
        The index range the scan needs: ``n_index`` when that is within a few times the number
        of entries, else ``1 +`` the largest index present (0 for an empty array). So memory for
        the scan is bounded by the data, never by a huge declared ``n_index``.

    Raises:
        InputError: naming the query and the position of the first offending entry.
    """
    if padding not in (None, -1):
        raise InputError(f"padding must be -1 (FAISS) or None, got {padding!r}", source)
    if np.issubdtype(ranks.dtype, np.floating) and ranks.size:
        raise InputError(
            f"ranks hold floating-point numbers (dtype {ranks.dtype}), not integer indices: these look "
            "like scores: use --scores (evaluate_scores)",
            source,
        )
    K.check_ranks_dtype(ranks, source)
    if ranks.size == 0:
        return 0
    if ranks.dtype.kind == "f":  # empty: no values to be scores
        return 0
    lo = ranks.min()
    # The scan's tables take about n_index bytes (+ n_index / 8 a query): with the declared count
    # within a few times the data's size they are bounded by the data; beyond, they are sized by the
    # largest index present (one more pass), so a huge declared count costs nothing.
    hi = ranks.max() if n_index > 8 * ranks.size + n_db else None
    if lo < 0:
        allow = padding == -1 or gaps
        if lo < -1 or not allow:
            q, j = _find_entry(ranks, lambda row: row < (-1 if allow else 0))
            v = int(ranks[q, j])
            hint = (
                "; lists shorter than the others may be padded with -1 only when asked (padding=-1, "
                "--padding -1)"
                if v == -1
                else ""
            )
            raise InputError(
                f"{K.qname(names, q)}: rank position {j} holds index {v}: indices are 0-based and "
                f"non-negative{hint}",
                source,
            )
        if not gaps:
            pad = ranks == -1
            inner = pad[:, :-1] & ~pad[:, 1:]
            if inner.any():
                q, j = (int(v) for v in np.argwhere(inner)[0])
                raise InputError(
                    f"{K.qname(names, q)}: rank position {j} holds the padding -1 but position "
                    f"{j + 1} holds an index: padding may only end a list",
                    source,
                )
    if hi is None:
        return n_index  # the scan checks the range
    if hi >= n_index:
        _refuse_out_of_range(
            ranks, n_db, n_index, padding=padding, gaps=gaps, names=names, source=source
        )
    return int(hi) + 1


def _refuse_out_of_range(
    ranks: np.ndarray,
    n_db: int,
    n_index: int,
    *,
    padding: int | None,
    gaps: bool,
    names: Sequence[str] | None,
    source: str | None,
) -> None:
    """Raise the one-line error naming the first entry ``>= n_index`` of ``ranks`` (there is one)."""
    q, j = _find_entry(ranks, lambda row: row >= n_index)
    raise InputError(
        f"{K.qname(names, q)}: rank position {j} "
        f"{K.out_of_range_text(int(ranks[q, j]), n_db, n_index, minus_one=padding == -1 or gaps)}",
        source,
    )


def ranked_lists(
    gt: GroundTruth,
    ranks: ArrayLike,
    *,
    n_distractors: int = 0,
    padding: int | None = None,
    source: str = "ranks",
) -> list[NDArray[np.int64]]:
    """Validate ranked lists ``[n_queries, k]`` of ``gt`` and return each query's list, a -1
    padding (with ``padding=-1``) ending it: what the protocols that read lists as lists (GLDv2,
    ILIAS) score.

    Raises:
        InputError: not one row per query; values as :func:`check_rank_values` refuses them.
    """
    gt.validate()
    arr = np.asarray(ranks)
    if arr.ndim != 2 or arr.shape[0] != gt.n_queries:
        raise InputError(
            f"ranks must be [n_queries, k] with one row per query ({gt.n_queries}), got shape "
            f"{arr.shape}",
            source,
        )
    n_index = gt.n_db + _check_distractors(n_distractors)
    check_rank_values(arr, gt.n_db, n_index, padding=padding, names=gt.query_names, source=source)
    if arr.size and int(arr.max()) >= n_index:  # check_rank_values leaves small ranges to a scan
        _refuse_out_of_range(
            arr, gt.n_db, n_index, padding=padding, gaps=False, names=gt.query_names, source=source
        )
    out = []
    for q in range(gt.n_queries):
        row = np.asarray(arr[q], dtype=np.int64)
        end = np.flatnonzero(row < 0)
        out.append(row if end.size == 0 else row[: end[0]])
    return out


def evaluate(
    gt: GroundTruth,
    ranks: ArrayLike,
    *,
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
    padding: int | None = None,
    gaps: bool = False,
    source: str = "ranks",
    scores: ArrayLike | None = None,
) -> EvaluationResult:
    """Score ranked lists with the official protocol of ``gt`` (exact, validated).

    The ground truth's protocol scores them (:meth:`oxbench.protocol.Protocol.evaluate`): the
    protocols of labelled ground truth as below; GLDv2 retrieval and ILIAS as their challenges do
    (:mod:`oxbench.evaluation.protocols`).

    Matches revisitop ``compute_map`` (revisited, all three setups), ``compute_ap.cpp`` (original;
    we accumulate in double precision), ``holidays_map.py`` (Holidays: written rank numbers are the
    positions, the query image is ignored) and the N-S score (UKBench: mean number of the object's
    4 images in the top 4 of each list; the query is its own first image). Also for UKBench the
    trapezoidal mAP is reported. Per query, AP and P@K are
    :func:`~oxbench.evaluation.ap.average_precision` and
    :func:`~oxbench.evaluation.ap.precision_at_ks` of its positives' positions.

    Args:
        gt: ground truth; ``gt.protocol`` selects the rules.
        ranks: internal layout ``[n_queries, k]``, an integer array: row ``q`` is query ``q``'s
            ranked list of indices ``0 <= v < n_db + n_distractors``, best first. Lists may be
            truncated: positives not in the list add nothing but still count. For a revisitop
            ``(k, n_queries)`` array use ``evaluate(gt, from_revisitop(ranks))`` (a view, no copy).
        ks: the K of the capped mP@K columns (see :func:`~oxbench.evaluation.ap.precision_at_ks`:
            the denominator is ``min(K, rank of the last retrieved positive)``). Default: (1, 5, 10)
            for the revisited and original protocols, none for Holidays and UKBench.
        n_distractors: indices ``n_db .. n_db + n_distractors - 1`` are admitted as distractors
            (always negatives; R1M). At most :data:`MAX_DISTRACTORS`; memory does not depend on it.
        padding: ``-1`` admits FAISS-style padding: lists shorter than ``k`` end in -1 entries
            (only at the end of a list). Recorded in the result. Default: every entry is an index.
        gaps: admit -1 anywhere as an unnamed negative at that position (the ranks that
            :func:`oxbench.formats.holidays.read_results` builds from a file that skips rank numbers).
        source: name of the ranks input, for error messages.
        scores: the score of each ranked entry ``[n_queries, k]``, where the protocol uses scores
            (ILIAS: tied scores form one threshold); the protocols of labelled ground truth ignore it.

    Returns:
        The :class:`EvaluationResult` (per-query AP/P@K, per-setup means, skipped queries).

    Raises:
        InputError: wrong shape or dtype (a floating-point array: "these look like scores"); an
            index that is negative (other than allowed -1) or out of range; an image repeated in
            one list; inconsistent ground truth; a setup in which no query has positives. The
            message names the input, the query and the problem.

    Example:
        >>> from oxbench.groundtruth import GroundTruth, make_query
        >>> gt = GroundTruth("toy", "original", ("a", "b", "c"), (make_query("q", good=[2], junk=[0]),))
        >>> evaluate(gt, [[0, 1, 2]]).setups["original"].map  # junk deleted: b, c -> (0/1 + 1/2) / 2
        0.25
    """
    return gt.protocol.evaluate(
        gt,
        ranks,
        ks=ks,
        n_distractors=n_distractors,
        padding=padding,
        gaps=gaps,
        source=source,
        scores=scores,
    )


def evaluate_labelled(
    gt: GroundTruth,
    ranks: ArrayLike,
    *,
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
    padding: int | None = None,
    gaps: bool = False,
    source: str = "ranks",
    scores: ArrayLike | None = None,
) -> EvaluationResult:
    """:func:`evaluate` for a protocol of labelled ground truth (``scores`` are not used)."""
    ks = _check_ks(ks, as_labelled(gt))
    n_distractors = _check_distractors(n_distractors)
    labels, found = labelled_positions(
        gt, ranks, n_distractors=n_distractors, padding=padding, gaps=gaps, source=source
    )
    return score_found(
        gt, labels, found, ks, n_distractors=n_distractors, padding=padding, source=source
    )


def labelled_positions(
    gt: GroundTruth,
    ranks: ArrayLike,
    *,
    n_distractors: int = 0,
    padding: int | None = None,
    gaps: bool = False,
    source: str = "ranks",
) -> tuple[list[K.Labels], list[K.Found]]:
    """Validate ranked lists ``[n_queries, k]`` of labelled ground truth and find, per query, the
    positions and codes of its labelled images (what :func:`score_found` and the cross-protocol
    views of :mod:`oxbench.evaluation.views` score).

    Raises:
        InputError: as :func:`evaluate`.
    """
    protocol = as_labelled(gt)
    n_distractors = _check_distractors(n_distractors)
    gt.validate()
    arr = np.asarray(ranks)
    if arr.ndim != 2:
        raise InputError(f"ranks must be 2-D [n_queries, k], got shape {arr.shape}", source)
    if arr.shape[0] != gt.n_queries:
        raise InputError(
            f"ranks hold {arr.shape[0]} ranked lists (shape {arr.shape}, internal layout "
            f"[n_queries, k]) but {gt.source} has {gt.n_queries} queries",
            source,
        )
    n_index = gt.n_db + n_distractors
    top = check_rank_values(
        arr, gt.n_db, n_index, padding=padding, gaps=gaps, names=gt.query_names, source=source
    )
    if arr.shape[1] < protocol.min_list_length:
        raise InputError(
            f"{protocol.full_name} needs at least the top {protocol.min_list_length} of each list, "
            f"got {arr.shape[1]}",
            source,
        )
    labels = query_labels(gt)
    # The scan's tables cover the indices present (all valid, checked above), not the declared count.
    found = K.labelled_positions_from_ranks(
        arr,
        labels,
        max(gt.n_db, top),
        n_db=gt.n_db,
        names=gt.query_names,
        source=source,
        minus_one=padding == -1 or gaps,
    )
    return labels, found


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
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
    source: str = "scores",
) -> EvaluationResult:
    """Score a similarity matrix: each query ranks the database by descending score.

    The ground truth's protocol scores it (:meth:`oxbench.protocol.Protocol.evaluate_scores`).

    The order is the stable descending sort (ties go to the lower database index), exactly as
    :func:`oxbench.evaluation.ranking.ranks_from_scores` followed by :func:`evaluate` -- but
    without sorting (see :mod:`oxbench.evaluation.kernels`; speeds in ``bench/README.md``), with
    the same numbers (revisitop's unstable sort may order exactly tied scores differently).

    Args:
        gt: ground truth.
        scores: ``[n_db + n_distractors, n_queries]`` (revisitop orientation, ``X.T @ Q``); any
            float or integer dtype, C- or F-ordered. NaN is refused; +-inf is allowed.
        ks: the K of the capped mP@K columns (default as in :func:`evaluate`).
        n_distractors: rows ``n_db ..`` are distractors (always negatives).
        source: name of the scores input, for error messages.

    Raises:
        InputError: wrong shape or dtype, NaN, inconsistent ground truth, an empty setup.
    """
    return gt.protocol.evaluate_scores(
        gt, scores, ks=ks, n_distractors=n_distractors, source=source
    )


def evaluate_labelled_scores(
    gt: GroundTruth,
    scores: ArrayLike,
    *,
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
    source: str = "scores",
) -> EvaluationResult:
    """:func:`evaluate_scores` for a protocol of labelled ground truth."""
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
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
    chunk_rows: int = 65536,
    source: str = "features",
) -> EvaluationResult:
    """Score descriptors: similarity = dot product (cosine for L2-normalised rows).

    The ``[n_db, n_queries]`` float32 score matrix is filled ``chunk_rows`` database rows at a time
    (so a 1M x 2048 database never needs a second copy), then scored by :func:`evaluate_scores`.
    Descriptors are used as given: L2-normalise them first if you want cosine similarity
    (:func:`oxbench.formats.arrays.read_features` ``normalize=True``). Products that overflow
    float32 (every such score would tie at infinity) are refused like NaN.

    Args:
        gt: ground truth.
        query_features: ``[n_queries, d]``.
        db_features: ``[n_db + n_distractors, d]``, database rows first, then distractors.
        ks: the K of the capped mP@K columns (default as in :func:`evaluate`).
        n_distractors: trailing rows of ``db_features`` that are distractors.
        chunk_rows: database rows per matrix product.
        source: name of the input, for error messages.

    Raises:
        InputError: shapes that do not fit, non-finite descriptors or products.
    """
    q = np.asarray(query_features)
    x = np.asarray(db_features)
    for what, a in (("query features", q), ("database features", x)):
        if a.ndim != 2:
            raise InputError(f"{what} must be 2-D [n, d], got shape {a.shape}", source)
        if (
            not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer))
            or a.dtype == bool
        ):
            raise InputError(f"{what} must be numbers, got dtype {a.dtype}", source)
    if q.shape[1] != x.shape[1]:
        raise InputError(
            f"query features have dimension {q.shape[1]} but database features {x.shape[1]}", source
        )
    if q.shape[0] != gt.n_queries:
        raise InputError(
            f"{q.shape[0]} query descriptors but {gt.source} has {gt.n_queries} queries", source
        )
    n_distractors = _check_distractors(n_distractors)
    if x.shape[0] != gt.n_db + n_distractors:
        raise InputError(
            f"{x.shape[0]} database descriptors but the database has {gt.n_db} images"
            + (f" + {n_distractors} distractors" if n_distractors else "")
            + (
                " (declare the extra rows as distractors)"
                if x.shape[0] > gt.n_db and not n_distractors
                else ""
            ),
            source,
        )
    with np.errstate(over="ignore"):  # beyond float32's range is infinity, refused just below
        qf = np.ascontiguousarray(q, dtype=np.float32)
    if not np.isfinite(qf).all():
        raise InputError(
            "query features contain NaN or infinity (or values beyond float32)", source
        )
    scores = np.empty((x.shape[0], q.shape[0]), dtype=np.float32)
    for i0 in range(0, x.shape[0], chunk_rows):
        with np.errstate(over="ignore"):
            xb = np.asarray(x[i0 : i0 + chunk_rows], dtype=np.float32)
        if not np.isfinite(xb).all():
            bad = i0 + int(np.flatnonzero(~np.isfinite(xb).all(axis=1))[0])
            raise InputError(f"database descriptor {bad} contains NaN or infinity", source)
        block = scores[i0 : i0 + xb.shape[0]]
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below, with the culprits
            np.matmul(xb, qf.T, out=block)
        if not np.isfinite(block).all():
            r, c = (int(v) for v in np.argwhere(~np.isfinite(block))[0])
            raise InputError(
                f"the product of database descriptor {i0 + r} and query descriptor {c} overflows "
                "float32 (scores would tie at infinity): scale or L2-normalise the features",
                source,
            )
    return evaluate_scores(gt, scores, ks=ks, n_distractors=n_distractors, source=source)
