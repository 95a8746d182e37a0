"""Cross-protocol views: other toolkits' numbers on the same ranks, beside the official ones.

MIEB (the image part of MTEB) reports ROxford / RParis Easy, Medium and Hard as **map@5**: MTEB's
``Any2AnyMultiChoiceEvaluator`` (embeddings-benchmark/mteb,
``mteb/evaluation/evaluators/Image/Any2AnyMultiChoiceEvaluator.py``) scores each query with
``pytrec_eval``'s ``map_cut.5`` (trec_eval's AP cut at rank 5) after pushing every database image
outside the query's judgements to the bottom (score -1: the ignored images of the setup). Per query
of a setup::

    map@k = (1 / N) * sum over the positives at 1-based rank r <= k of (positives in the top r) / r

with the ignored images deleted from the list first and ``N`` the number of positives of the setup
(all of them, not ``min(N, k)``); the mean runs over the queries of the setup that have positives
(as revisitop's; whether MIEB's copies keep the queries without positives is not stated). It is not
the official mAP: it sees only the top k, so a method that finds every hard positive at rank 50
scores as one that finds none, and it is never mixed into the official line.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from oxbench.errors import InputError
from oxbench.evaluation.labelled import as_labelled, labelled_positions, setup_positions
from oxbench.groundtruth import GroundTruth

#: What ``--also`` offers, by name, with the line that says how each differs from the official.
VIEWS = {
    "map@k": (
        "map@{k} is MIEB/MTEB's (pytrec_eval map_cut.{k}: precision summed over the positives in "
        "the top {k}, divided by all positives, ignored images deleted); it sees only the top {k} "
        "and is not the official mAP: never compare it with revisitop's numbers"
    ),
}
#: The largest k of map@k.
MAX_K = 1_000_000


@dataclass(frozen=True, eq=False)
class ViewResult:
    """One view's numbers.

    Attributes:
        name: the view (``map@5``).
        means: per setup the mean over the queries with positives.
        per_query: per setup the per-query values (``nan`` where the query has no positives).
        note: one line saying how the view differs from the official protocol.
    """

    name: str
    means: dict[str, float]
    per_query: dict[str, NDArray[np.float64]]
    note: str


def parse_view(text: str) -> tuple[str, int]:
    """``map@5`` -> ``("map@k", 5)``.

    Raises:
        InputError: not ``map@K`` with K a whole number in 1..MAX_K.
    """
    head, _, tail = text.strip().partition("@")
    from oxbench import schema

    if head.lower() != "map" or not tail:
        raise InputError(f"--also takes map@K (MIEB/MTEB's map at cut-off K), got {text[:40]!r}")
    k = schema.Int(lo=1, hi=MAX_K).parse("also map@K", tail, what="option")
    return "map@k", int(k)


def map_at_k(
    gt: GroundTruth,
    ranks: ArrayLike,
    k: int,
    *,
    n_distractors: int = 0,
    padding: int | None = None,
    gaps: bool = False,
    source: str = "ranks",
) -> ViewResult:
    """MIEB/MTEB's map@k of each setup of labelled ground truth (see the module docstring).

    Example:
        >>> from oxbench.groundtruth import GroundTruth, make_query
        >>> gt = GroundTruth("t", "revisited", tuple("abcdefg"),
        ...                  (make_query("q", easy=[1], hard=[6], junk=[0]),))
        >>> # ranks: a (junk, deleted) b (easy, rank 1) c d e f g (hard, rank 6)
        >>> result = map_at_k(gt, [[0, 1, 2, 3, 4, 5, 6]], 5)
        >>> result.means["medium"]  # b and g are positive; only b is in the top 5: (1/1) / 2
        0.5
        >>> result.means["hard"]  # b is ignored too, so g moves to rank 5: (1/5) / 1
        0.2
    """
    protocol = as_labelled(gt)
    labels, found = labelled_positions(
        gt, ranks, n_distractors=n_distractors, padding=padding, gaps=gaps, source=source
    )
    means: dict[str, float] = {}
    per_query: dict[str, NDArray[np.float64]] = {}
    for setup, (pos_codes, ign_codes) in protocol.code_setups.items():
        values = np.full(gt.n_queries, np.nan)
        for q, (n, eff, _) in enumerate(setup_positions(labels, found, pos_codes, ign_codes)):
            if n == 0:
                continue
            total = 0.0
            for hits, r in enumerate(np.sort(eff).tolist(), 1):
                if r < k:
                    total += hits / (r + 1)
            values[q] = total / n
        used = values[~np.isnan(values)]
        if used.size == 0:
            raise InputError(f"{gt.dataset}: no query has positives in the {setup!r} setup")
        means[setup] = float(sum(used.tolist()) / used.size)
        per_query[setup] = values
    return ViewResult(f"map@{k}", means, per_query, VIEWS["map@k"].format(k=k))
