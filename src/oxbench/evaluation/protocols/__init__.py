"""The scoring protocols, one module each, and the scoring entry points.

Each module declares one :class:`~oxbench.protocol.Protocol` and registers it
(:func:`oxbench.protocol.register_protocol`); the registry imports every module here on its first
lookup:

- :mod:`.revisited` -- revisited Oxford/Paris (revisitop ``compute_map``), Easy / Medium / Hard;
- :mod:`.original` -- Oxford 5K / Paris 6K (``compute_ap.cpp``);
- :mod:`.holidays` -- INRIA Holidays (``holidays_map.py``);
- :mod:`.ukbench` -- UKBench (the N-S score);
- :mod:`.gldv2` -- Google Landmarks v2 retrieval (the challenge's mAP@100, Public / Private);
- :mod:`.ilias` -- ILIAS (mAP@k as ``ilias-vrg/ilias`` computes it).

A new protocol is one more module: a ``Protocol`` subclass (its setups, labels, scoring, lines,
JSON) and ``register_protocol(MyProtocol("name"))``; a package of one's own declares it in the
``oxbench.protocols`` entry-point group.

The functions below score whatever protocol the ground truth holds (they are
:mod:`oxbench.evaluation.labelled`'s).
"""

from oxbench.evaluation.labelled import (
    DEFAULT_KS,
    MAX_DISTRACTORS,
    check_rank_values,
    evaluate,
    evaluate_features,
    evaluate_scores,
    query_labels,
    score_found,
)

__all__ = [
    "DEFAULT_KS",
    "MAX_DISTRACTORS",
    "check_rank_values",
    "evaluate",
    "evaluate_features",
    "evaluate_scores",
    "query_labels",
    "score_found",
]
