"""Google Landmarks v2 retrieval (Weyand et al., CVPR 2020): mAP@100 and mP@k, Public and Private.

Exactly as the challenge computes them (tensorflow/models ``research/delf/delf/python/datasets/
google_landmarks_dataset/metrics.py``, ``MeanAveragePrecision`` and ``MeanPrecisions``), for each
split (setup) of the solution:

- per query, the first :data:`MAX_PREDICTIONS` predictions are read in order; a prediction already
  seen is skipped but keeps its position (the rank counts every entry);
- ``AP = (1 / min(relevant, 100)) * sum over relevant hits of (hits so far) / (1-based position)``;
- mAP is the sum of the APs of the queries that have a prediction, in the order the submission
  lists them, divided by the number of queries of the split: a query without a prediction
  counts 0;
- mP@k (k <= 100): per query ``(relevant hits in the first k) / k`` (duplicates not counted twice;
  a list shorter than k still divides by k), averaged over every query of the split.

The arithmetic is the official one, in its order, so the numbers are equal bit for bit
(docs/conformance.md). Printed::

    gldv2-retrieval: mAP@100 public 25.21, private 27.50
    gldv2-retrieval: mP@k[1 5 10 50 100] public [...], private [...]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.evaluation.labelled import json_float, pct, ranked_lists
from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.groundtruth import GroundTruth
from oxbench.protocol import Headline, Protocol, register_protocol

#: Predictions read per query (the challenge's ``max_predictions``).
MAX_PREDICTIONS = 100
#: The mP@k the challenge's script prints.
DEFAULT_KS = (1, 5, 10, 50, 100)


class Gldv2(Protocol):
    """GLDv2 retrieval: Public and Private setups, mAP@100 and mP@k."""

    setups = ("public", "private")
    labels = ("positive", "negative")
    setup_labels = {
        "public": (frozenset({"positive"}), frozenset()),
        "private": (frozenset({"positive"}), frozenset()),
    }
    default_ks = DEFAULT_KS
    command = "gldv2"
    full_name = "GLDv2 retrieval"
    headline_metric = Headline(f"mAP@{MAX_PREDICTIONS}", "ap")
    about = "Google Landmarks v2 retrieval: mAP@100 and mP@k of the Public and Private test images"

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
    ) -> EvaluationResult:
        """Ranked lists ``[n_queries, k]`` of database indices: each row is its query's prediction
        (a -1 padding ends it); only the first :data:`MAX_PREDICTIONS` count."""
        lists = ranked_lists(gt, ranks, n_distractors=n_distractors, padding=padding, source=source)
        predicted = [row[:MAX_PREDICTIONS] for row in lists]
        return score_predictions(
            gt, tuple(range(gt.n_queries)), predicted, ks=ks, n_distractors=n_distractors
        )

    def evaluate_scores(
        self, gt: GroundTruth, scores: ArrayLike, **options: Any
    ) -> EvaluationResult:
        from oxbench.evaluation.ranking import ranks_from_scores

        matrix = np.asarray(scores)
        if matrix.ndim != 2:
            raise InputError(f"scores must be 2-D [n_db, n_queries], got shape {matrix.shape}")
        ranks = ranks_from_scores(matrix, k=min(MAX_PREDICTIONS, matrix.shape[0]))
        return self.evaluate(gt, ranks, **options)

    # -- writing ------------------------------------------------------------------------------
    def lines(self, result: EvaluationResult) -> list[str]:
        name = result.dataset
        maps = ", ".join(f"{n} {pct(s.map)}" for n, s in result.setups.items())
        out = [f"{name}: {self.headline_metric.label} {maps}"]
        if result.ks:
            kstr = " ".join(str(k) for k in result.ks)
            mps = ", ".join(
                f"{n} [" + " ".join(pct(s.mp_at_k[k]) for k in result.ks) + "]"
                for n, s in result.setups.items()
            )
            out.append(f"{name}: mP@k[{kstr}] {mps}")
        return out

    def table(self, result: EvaluationResult) -> tuple[list[str], list[list[str]]]:
        header = ["setup", "queries", "predicted", self.headline_metric.label]
        header += [f"mP@{k}" for k in result.ks]
        rows = []
        for n, s in result.setups.items():
            used = len(s.ap) - len(s.skipped)
            predicted = result.summary.get("predicted", {}).get(n, 0)
            rows.append(
                [n, str(used), str(predicted), pct(s.map)] + [pct(s.mp_at_k[k]) for k in result.ks]
            )
        return header, rows

    def result_dict(self, result: EvaluationResult) -> dict[str, Any]:
        setups = {}
        for n, s in result.setups.items():
            skipped = set(s.skipped)
            d: dict[str, Any] = {
                "queries": len(s.ap) - len(skipped),
                "predicted": result.summary.get("predicted", {}).get(n, 0),
                "map": json_float(s.map),
            }
            for k in result.ks:
                d[f"mp@{k}"] = json_float(s.mp_at_k[k])
            d["ap"] = {
                q: json_float(v)
                for i, (q, v) in enumerate(zip(result.query_names, s.ap, strict=True))
                if i not in skipped
            }
            setups[n] = d
        return {"max_predictions": MAX_PREDICTIONS, "setups": setups}

    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        setups = metrics.get("setups")
        if not isinstance(setups, dict) or set(setups) != set(per_query):
            raise InputError(f"expected 'setups' with {sorted(per_query)}")
        for name, s in setups.items():
            if not isinstance(s, dict):
                raise InputError(f"setup {name!r}: expected an object")
            for key, stored in s.items():
                column = "ap" if key == "map" else (key[1:] if key.startswith("mp@") else None)
                if column is not None:
                    yield f"{name} {key}", stored, name, column


GLDV2 = register_protocol(Gldv2("gldv2"))


def _check_ks(ks: Sequence[int] | None) -> tuple[int, ...]:
    out = DEFAULT_KS if ks is None else tuple(ks)
    bad = [k for k in out if isinstance(k, bool) or not isinstance(k, int | np.integer)]
    if bad or any(not 1 <= k <= MAX_PREDICTIONS for k in out) or len(set(out)) != len(out):
        raise InputError(
            f"ks must be distinct whole numbers in 1..{MAX_PREDICTIONS} (mP@k of the first "
            f"{MAX_PREDICTIONS} predictions), got {list(out)}"
        )
    return tuple(int(k) for k in out)


def query_scores(
    relevant: NDArray[np.int64], predicted: NDArray[np.int64]
) -> tuple[float, NDArray[np.float64]]:
    """One query's AP@100 and its precisions at 1..100, as the challenge's loops compute them.

    Args:
        relevant: the relevant database indices (sorted, unique).
        predicted: the predicted database indices, best first (-1: an id of no database image).

    Example:
        >>> ap, p = query_scores(np.array([3, 7]), np.array([7, 7, 1, 3]))  # 7 again: skipped
        >>> ap  # (1/1 + 2/4) / min(2, 100)
        0.75
        >>> p[:4].tolist()
        [1.0, 0.5, 0.3333333333333333, 0.5]
    """
    relevant_set = set(relevant.tolist())
    num_expected = min(len(relevant_set), MAX_PREDICTIONS)
    precisions = np.zeros(MAX_PREDICTIONS)
    already: set[int] = set()
    ap = 0.0
    num_correct = 0
    items = predicted[:MAX_PREDICTIONS].tolist()
    for i in range(MAX_PREDICTIONS):
        if i < len(items):
            p = items[i]
            if p not in already:
                if p in relevant_set:
                    num_correct += 1
                    ap += num_correct / (i + 1)
                already.add(p)
        precisions[i] = num_correct / (i + 1)
    return ap / num_expected, precisions


def score_predictions(
    gt: GroundTruth,
    order: Sequence[int],
    predicted: Sequence[NDArray[np.int64]],
    *,
    ks: Sequence[int] | None = None,
    n_distractors: int = 0,
) -> EvaluationResult:
    """Score predictions of GLDv2 ground truth (each query in one setup: ``public``, ``private``).

    Args:
        gt: ground truth of the ``gldv2`` protocol (:meth:`Gldv2Solution.ground_truth`).
        order: the queries that have a prediction, in the order they were given (the official
            sums run in that order).
        predicted: per query of ``order`` its predicted database indices (-1: no database image).
        ks: the k of mP@k (default :data:`DEFAULT_KS`, each at most :data:`MAX_PREDICTIONS`).
        n_distractors: recorded in the result.

    Raises:
        InputError: a query given twice, a query of no setup, a bad k.
    """
    ks = _check_ks(ks)
    nq = gt.n_queries
    if len(order) != len(predicted):
        raise ValueError("order and predicted differ in length")
    if len(set(order)) != len(order):
        q = next(q for q in order if list(order).count(q) > 1)
        raise InputError(f"query {gt.query_names[q]} has two predictions")
    ap = np.zeros(nq)
    precisions = np.zeros((nq, MAX_PREDICTIONS))
    for q, pred in zip(order, predicted, strict=True):
        ap[q], precisions[q] = query_scores(gt.queries[q].good, np.asarray(pred, np.int64))
    n_pos = np.array([q.good.size for q in gt.queries], dtype=np.int64)
    setup_of = []
    for qi, query in enumerate(gt.queries):
        if len(query.setups) != 1:
            raise InputError(f"query {qi} ({query.name}): a GLDv2 query is in exactly one setup")
        setup_of.append(query.setups[0])
    setups: dict[str, SetupResult] = {}
    predicted_count: dict[str, int] = {}
    for name in GLDV2.setups:
        members = [qi for qi in range(nq) if setup_of[qi] == name]
        if not members:
            raise InputError(f"{gt.dataset}: no query in the {name!r} setup; nothing to evaluate")
        in_setup = set(members)
        ordered = [q for q in order if q in in_setup]
        mean_ap = 0.0
        for q in ordered:  # MeanAveragePrecision: summed in submission order
            mean_ap += float(ap[q])
        mean_ap /= len(members)
        # MeanPrecisions: one row per query, those with a prediction first in submission order
        rows = np.zeros((len(members), MAX_PREDICTIONS))
        rows[: len(ordered)] = precisions[ordered]
        mean_p = np.mean(rows, axis=0)
        skipped = tuple(qi for qi in range(nq) if qi not in in_setup)
        setup_ap = np.where(np.isin(np.arange(nq), members), ap, np.nan)
        setup_p = np.full((nq, len(ks)), np.nan)
        setup_p[members] = precisions[members][:, [k - 1 for k in ks]]
        setups[name] = SetupResult(
            map=mean_ap,
            mp_at_k={k: float(mean_p[k - 1]) for k in ks},
            ap=setup_ap,
            p_at_k=setup_p,
            skipped=skipped,
            n_positives=n_pos,
        )
        predicted_count[name] = len(ordered)
    return EvaluationResult(
        dataset=gt.dataset,
        protocol=GLDV2,
        setups=setups,
        ks=ks,
        query_names=gt.query_names,
        n_distractors=n_distractors,
        summary={"predicted": predicted_count},
    )
