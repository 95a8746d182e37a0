"""ILIAS (Kordopatis-Zilos et al., CVPR 2025): mAP@k as ``ilias-vrg/ilias`` computes it.

Exactly as ``evaluation/src/dataset.py`` (``ILIAS._compute_AP``, ``_per_scale``, ``_per_clutter``,
``_evaluate_json`` / ``_evaluate_pkl``) does, query by query:

- the query's scored database images are ordered by ``numpy.argsort(-scores)`` (the same call, on
  scores of the same dtype in the same order, so ties are cut where the official code cuts them),
  and the top ``k`` kept;
- AP is scikit-learn's ``average_precision_score`` over those ``k`` (tied scores form one
  threshold), multiplied by ``hits / min(k, positives)``; a list with no positive scores 0;
- the oracle is ``(hits / listed) * (k / positives)``;
- per scale and per clutter group (the positives' annotated scale and clutter, the official
  thresholds): the positives outside the group are deleted from the list and from the positives,
  and the AP computed again, for the queries whose instance has positives in the group;
- per category and sub-category of the taxonomy (``misc/taxonomy.json``), when given: the mean
  over instances of each instance's mean AP.

Means are over the queries scored (a query not in the similarities is skipped and named), in the
order they were read, in percent, as the official report computes them; the JSON and the run
records hold fractions (those percents / 100). The database images carry no junk class.

:class:`IliasScorer` takes one query's top-k at a time (a stream: nothing of size database x
queries is ever held), which is how the CLI, the runner and ``bench/bench_ilias.py`` score.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.evaluation.labelled import json_float
from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.formats.ilias import IliasGroundTruth, check_scores, instance
from oxbench.groundtruth import GroundTruth
from oxbench.protocol import Headline, Protocol, register_protocol

#: The k of mAP@k unless another is asked for (the paper's mAP@1k).
DEFAULT_K = 1000
#: The largest k accepted.
MAX_K = 10_000_000
#: The official clutter groups ``[lo, hi)`` (``CLUTTER_GROUPS`` of ``dataset.py``).
CLUTTER_GROUPS: tuple[tuple[float, float], ...] = ((0, 18), (18, 33), (33, 53), (53, math.inf))
#: The official scale groups ``[lo, hi)`` (``SCALE_GROUPS`` of ``dataset.py``).
SCALE_GROUPS: tuple[tuple[float, float], ...] = (
    (0, 0.06880213760855043),
    (0.06880213760855043, 0.13526567164179104),
    (0.13526567164179104, 0.2729876723163842),
    (0.2729876723163842, math.inf),
)


def group_key(lo: float, hi: float) -> str:
    """The official name of a group: ``f"{t1}-{t2}"`` (``0-18``, ``53-inf``)."""
    return f"{lo}-{hi}"


def _sklearn_average_precision(y_true: NDArray[np.bool_], y_score: NDArray[Any]) -> float:
    """scikit-learn's ``average_precision_score(y_true, y_score)`` for ``y_score`` already in
    non-increasing order (as ``_compute_AP`` hands it over), in scikit-learn's arithmetic: one
    threshold per distinct score, precision and recall at each, ``-sum(diff(recall) *
    precision[:-1])`` over the reversed curve."""
    threshold_idxs = np.concatenate([np.nonzero(np.diff(y_score))[0], [y_true.shape[0] - 1]])
    tps = np.cumsum(y_true.astype(np.float64) * 1.0, dtype=np.float64)[threshold_idxs]
    fps = 1 + threshold_idxs.astype(np.float64) - tps
    ps = tps + fps
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(ps != 0, np.divide(tps, ps), 0.0)
    recall = tps / tps[-1]
    precision = np.concatenate((np.flip(precision), np.asarray([1.0])))
    recall = np.concatenate((np.flip(recall), np.asarray([0.0])))
    return float(max(0.0, -np.sum(np.diff(recall) * precision[:-1])))


def query_ap(
    ids: NDArray[np.int64],
    scores: NDArray[Any],
    positives: NDArray[np.int64],
    k: int,
    excluded: NDArray[np.int64] | None = None,
) -> tuple[float, float]:
    """One query's AP@k and oracle (``ILIAS._compute_AP``).

    Args:
        ids: the database index of each scored entry (-1: an image that is no positive).
        scores: their scores (any real dtype; ties are one threshold).
        positives: the database indices of the query's positives.
        k: the cut-off.
        excluded: positives deleted from the list and from the positives (a scale or clutter
            group leaves the others out).

    Example:
        >>> ids = np.array([5, 1, 2, 6]); scores = np.array([0.9, 0.8, 0.8, 0.1])
        >>> # the tie at 0.8 is one threshold: precision 1/3 there; times 1 hit / min(3, 2)
        >>> [float(v) for v in query_ap(ids, scores, np.array([1, 6]), k=3)]
        [0.16666666666666666, 0.5]
    """
    gt = positives
    if excluded is not None and excluded.size:
        keep = ~np.isin(ids, excluded)
        ids, scores = ids[keep], scores[keep]
        gt = np.setdiff1d(positives, excluded)
    order = np.argsort(-scores)
    top_ids = ids[order[:k]]
    y_true = np.isin(top_ids, gt)
    y_score = scores[order][:k]
    if not y_true.any():
        return 0.0, 0.0
    ap = _sklearn_average_precision(y_true, y_score)
    ap *= y_true.sum() / min(k, len(gt))
    oracle = y_true.mean() * (k / len(gt))
    return ap, oracle


def _group_exclusions(
    values: NDArray[np.float64], positives: NDArray[np.int64], groups: Sequence[tuple[float, float]]
) -> list[tuple[str, NDArray[np.int64] | None]]:
    """Per group with positives: its name and the positives outside it (deleted), else ``None``."""
    out: list[tuple[str, NDArray[np.int64] | None]] = []
    v = values[positives]
    for lo, hi in groups:
        outside = (v < lo) | (v >= hi)
        out.append((group_key(lo, hi), None if outside.all() else positives[outside]))
    return out


class IliasScorer:
    """Scores ILIAS queries one at a time, from each query's scored list (a top-k stream).

    Example:
        >>> scorer = IliasScorer(gt, k=1000)                     # doctest: +SKIP
        >>> for q, ids, scores in stream: scorer.add(q, ids, scores)  # doctest: +SKIP
        >>> result = scorer.result()                              # doctest: +SKIP
    """

    def __init__(self, gt: IliasGroundTruth, k: int = DEFAULT_K, *, breakdown: bool = True) -> None:
        if not isinstance(gt, IliasGroundTruth):
            raise InputError(f"{gt.dataset}: ILIAS scoring needs ILIAS ground truth")
        self.gt = gt
        self.k = check_k(k)
        self.breakdown = breakdown
        n = gt.n_queries
        self.ap = np.full(n, np.nan)
        self.oracle = np.full(n, np.nan)
        self.order: list[int] = []
        self.scale: dict[str, list[float]] = {}
        self.clutter: dict[str, list[float]] = {}
        self.categories: dict[str, dict[str, list[float]]] = {}
        self.subcategories: dict[str, dict[str, list[float]]] = {}

    def add(self, query: int, ids: NDArray[np.int64], scores: NDArray[Any]) -> None:
        """Score query ``query`` (its index in the ground truth) from its scored entries.

        Raises:
            InputError: the query was scored already.
        """
        if not np.isnan(self.ap[query]):
            raise InputError(f"query {self.gt.query_names[query]} is scored twice")
        positives = self.gt.queries[query].good
        ap, oracle = query_ap(ids, scores, positives, self.k)
        self.ap[query], self.oracle[query] = ap, oracle
        self.order.append(query)
        if not self.breakdown:
            return
        name = instance(self.gt.query_names[query])
        if self.gt.taxonomy is not None:
            label = self.gt.taxonomy[name]
            self.categories.setdefault(label.split("-")[0], {}).setdefault(name, []).append(
                ap * 100
            )
            self.subcategories.setdefault(label, {}).setdefault(name, []).append(ap * 100)
        for values, groups, into in (
            (self.gt.scale, SCALE_GROUPS, self.scale),
            (self.gt.clutter, CLUTTER_GROUPS, self.clutter),
        ):
            for key, excluded in _group_exclusions(values, positives, groups):
                if excluded is not None:
                    into.setdefault(key, []).append(
                        query_ap(ids, scores, positives, self.k, excluded)[0] * 100
                    )

    def result(self, *, source: str | None = None) -> EvaluationResult:
        """The result of the queries added (the others are skipped).

        Raises:
            InputError: no query was scored.
        """
        gt = self.gt
        if not self.order:
            raise InputError(
                f"{gt.dataset}: no query of the ground truth was scored", source or gt.source
            )
        used = self.order
        aps = [self.ap[q] * 100 for q in used]
        summary: dict[str, Any] = {
            "k": self.k,
            "queries": len(used),
            "map": float(np.mean(aps)),
        }
        if self.breakdown:
            summary["oracle"] = float(np.mean([self.oracle[q] * 100 for q in used]))
            summary["scale"] = {g: float(np.mean(v)) for g, v in self.scale.items()}
            summary["clutter"] = {g: float(np.mean(v)) for g, v in self.clutter.items()}
            if gt.taxonomy is not None:
                for key, groups in (
                    ("categories", self.categories),
                    ("subcategories", self.subcategories),
                ):
                    summary[key] = {
                        c: float(np.mean([np.mean(v) for v in per.values()]))
                        for c, per in groups.items()
                    }
        skipped = tuple(q for q in range(gt.n_queries) if np.isnan(self.ap[q]))
        setup = SetupResult(
            map=summary["map"] / 100,
            mp_at_k={},
            ap=self.ap.copy(),
            p_at_k=np.zeros((gt.n_queries, 0)),
            skipped=skipped,
            n_positives=np.array([q.good.size for q in gt.queries], dtype=np.int64),
            extra={"oracle": self.oracle.copy()} if self.breakdown else {},
        )
        return EvaluationResult(
            dataset=gt.dataset,
            protocol=ILIAS,
            setups={"ilias": setup},
            ks=(),
            query_names=gt.query_names,
            summary=summary,
        )


def check_k(k: Any) -> int:
    """``k`` as a whole number in ``1 .. MAX_K`` (one line naming it otherwise)."""
    from oxbench import schema

    return int(schema.Int(lo=1, hi=MAX_K).check("k", k, what="option"))


def _lists_with_scores(
    lists: Sequence[NDArray[np.int64]], scores: NDArray[Any] | None
) -> Iterator[tuple[int, NDArray[np.int64], NDArray[Any]]]:
    for q, row in enumerate(lists):
        n = row.size
        s = None if scores is None else np.asarray(scores[q][:n])
        if s is None or (s.size > 1 and bool((np.diff(s) > 0).any())):
            # no scores, or scores out of the ranking's order (a re-ranker's verified images
            # carry inlier counts): the ranking is the order, strictly decreasing, no ties
            s = -np.arange(n, dtype=np.float64)
        yield q, row, s


class Ilias(Protocol):
    """ILIAS: one setup, mAP@k with ties as one threshold, breakdowns in the summary."""

    setups = ("ilias",)
    labels = ("positive", "negative")
    setup_labels = {"ilias": (frozenset({"positive"}), frozenset())}
    command = "ilias"
    full_name = "ILIAS"
    headline_metric = Headline("mAP@1k", "ap")
    about = "ILIAS: mAP@k (scikit-learn AP over the top k, rescaled), by scale, clutter, taxonomy"

    def evaluate(
        self,
        gt: GroundTruth,
        ranks: ArrayLike,
        *,
        ks: Sequence[int] | None = None,
        n_distractors: int = 0,
        padding: int | None = None,
        gaps: bool = False,
        source: str = "ranks",
        scores: ArrayLike | None = None,
        k: int = DEFAULT_K,
    ) -> EvaluationResult:
        """Ranked lists ``[n_queries, k']`` of database indices (-1 padding ends a list), with
        their ``scores`` (ties are one threshold) or without (the order is then the ranking, as it
        is for a list whose scores do not follow it)."""
        from oxbench.evaluation.labelled import ranked_lists

        if not isinstance(gt, IliasGroundTruth):
            raise InputError(f"{gt.dataset}: ILIAS scoring needs ILIAS ground truth", source)
        if ks:
            raise InputError("ILIAS reports mAP@k, no mP@k: leave ks out", source)
        lists = ranked_lists(gt, ranks, n_distractors=n_distractors, padding=padding, source=source)
        sc = None
        if scores is not None:
            sc = np.asarray(scores)
            if sc.shape != np.shape(ranks):
                raise InputError(
                    f"scores of shape {sc.shape} do not fit ranks of shape {np.shape(ranks)}",
                    source,
                )
            check_scores(sc, source)
        scorer = IliasScorer(gt, k)
        for q, ids, s in _lists_with_scores(lists, sc):
            scorer.add(q, ids, s)
        return scorer.result(source=source)

    def evaluate_scores(
        self,
        gt: GroundTruth,
        scores: ArrayLike,
        *,
        n_distractors: int = 0,
        source: str = "scores",
        k: int = DEFAULT_K,
        **options: Any,
    ) -> EvaluationResult:
        """Every database image scored: ``[n_db (+ distractors), n_queries]``."""
        if not isinstance(gt, IliasGroundTruth):
            raise InputError(f"{gt.dataset}: ILIAS scoring needs ILIAS ground truth", source)
        matrix = np.asarray(scores)
        if matrix.ndim != 2 or matrix.shape != (gt.n_db + n_distractors, gt.n_queries):
            raise InputError(
                f"scores must be [n_db + n_distractors, n_queries] = "
                f"[{gt.n_db + n_distractors}, {gt.n_queries}], got {matrix.shape}",
                source,
            )
        check_scores(matrix, source)
        scorer = IliasScorer(gt, k)
        ids = np.arange(matrix.shape[0], dtype=np.int64)
        ids[gt.n_db :] = -1
        for q in range(gt.n_queries):
            scorer.add(q, ids, np.ascontiguousarray(matrix[:, q]))
        return scorer.result(source=source)

    # -- writing ------------------------------------------------------------------------------
    def lines(self, result: EvaluationResult) -> list[str]:
        name, s = result.dataset, result.setups["ilias"]
        summary = result.summary
        k = summary.get("k", DEFAULT_K)
        first = f"{name}: mAP@{k} {summary['map']:.2f}"
        if "oracle" in summary:
            first += f", oracle {summary['oracle']:.2f}"
        out = [first + f" ({summary['queries']} queries)"]
        for key, what in (("scale", "by scale"), ("clutter", "by clutter")):
            if summary.get(key):
                out.append(
                    f"{name}: mAP@{k} {what}: "
                    + ", ".join(f"{g} {v:.2f}" for g, v in summary[key].items())
                )
        for key, what in (("categories", "by category"), ("subcategories", "by sub-category")):
            if summary.get(key):
                out.append(
                    f"{name}: mAP@{k} {what}: "
                    + ", ".join(f"{g} {v:.2f}" for g, v in summary[key].items())
                )
        if s.skipped:
            shown = ", ".join(result.query_names[q] for q in s.skipped[:10])
            more = f" ... ({len(s.skipped)} in all)" if len(s.skipped) > 10 else ""
            out.append(f"{name}: {len(s.skipped)} queries skipped (not scored): {shown}{more}")
        return out

    def table(self, result: EvaluationResult) -> tuple[list[str], list[list[str]]]:
        summary, s = result.summary, result.setups["ilias"]
        k = summary.get("k", DEFAULT_K)
        header = ["setup", "queries", f"mAP@{k}", "oracle"]
        oracle = f"{summary['oracle']:.2f}" if "oracle" in summary else ""
        return header, [
            ["ilias", f"{summary['queries']}/{len(s.ap)}", f"{summary['map']:.2f}", oracle]
        ]

    def result_dict(self, result: EvaluationResult) -> dict[str, Any]:
        s = result.setups["ilias"]
        summary = result.summary

        def fractions(values: Mapping[str, float]) -> dict[str, float | None]:
            return {key: json_float(v / 100) for key, v in values.items()}

        out: dict[str, Any] = {"k": summary.get("k", DEFAULT_K), "queries": summary["queries"]}
        out["map"] = json_float(s.map)
        if "oracle" in summary:
            out["oracle"] = json_float(summary["oracle"] / 100)
        for key in ("scale", "clutter", "categories", "subcategories"):
            if key in summary:
                out[key] = fractions(summary[key])
        skipped = set(s.skipped)
        out["ap"] = {
            q: json_float(v)
            for i, (q, v) in enumerate(zip(result.query_names, s.ap, strict=True))
            if i not in skipped
        }
        out["skipped"] = [result.query_names[q] for q in s.skipped]
        return out

    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        if "map" not in metrics:
            raise InputError("no 'map'")
        yield "map", metrics["map"], "ilias", "ap"


ILIAS = register_protocol(Ilias("ilias"))
