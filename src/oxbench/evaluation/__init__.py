"""Exact official evaluation: trapezoidal AP, revisitop mP@K, the protocols, fast at R1M scale.

Each protocol is an object (:class:`oxbench.protocol.Protocol`, one module each in
:mod:`oxbench.evaluation.protocols`; :func:`get_protocol` finds one by name) held by the ground
truth. Main entry points (all pure functions returning an :class:`EvaluationResult`, scored by the
ground truth's protocol):

- :func:`evaluate` -- ground truth + ranks ``[n_queries, k]`` (internal layout);
- :func:`evaluate_scores` -- ground truth + scores ``[n_db(+distractors), n_queries]``;
- :func:`evaluate_features` -- ground truth + query / database descriptors (dot product).

Layout adapters: :func:`from_revisitop`, :func:`to_revisitop`; :func:`ranks_from_scores` ranks a
score matrix (stable descending, ties to the lower database index).
"""

from oxbench.evaluation.ap import average_precision, average_precision_textbook, precision_at_ks
from oxbench.evaluation.labelled import (
    DEFAULT_KS,
    evaluate,
    evaluate_features,
    evaluate_scores,
    query_labels,
)
from oxbench.evaluation.ranking import from_revisitop, ranks_from_scores, to_revisitop
from oxbench.evaluation.result import EvaluationResult, SetupResult
from oxbench.protocol import PROTOCOLS, Protocol, get_protocol

__all__ = [
    "DEFAULT_KS",
    "PROTOCOLS",
    "EvaluationResult",
    "Protocol",
    "SetupResult",
    "average_precision",
    "average_precision_textbook",
    "evaluate",
    "evaluate_features",
    "evaluate_scores",
    "from_revisitop",
    "get_protocol",
    "precision_at_ks",
    "query_labels",
    "ranks_from_scores",
    "to_revisitop",
]
