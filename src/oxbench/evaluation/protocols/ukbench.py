"""UKBench (Nister and Stewenius, CVPR 2006): every image queries the whole set; the N-S score is
the mean number of the object's 4 images in the top 4 (0..4). The trapezoidal mAP is reported too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from oxbench.errors import InputError
from oxbench.evaluation import kernels as K
from oxbench.evaluation.labelled import LabelledProtocol, json_float
from oxbench.evaluation.result import EvaluationResult
from oxbench.protocol import Headline, register_protocol


class UKBench(LabelledProtocol):
    """UKBench: one setup, the N-S score counted in the top 4."""

    setups = ("ukbench",)
    labels = ("positive", "negative")
    setup_labels = {"ukbench": (frozenset({"positive"}), frozenset({"junk"}))}
    code_setups = {"ukbench": ((K.POSITIVE,), (K.JUNK,))}
    top_count = 4
    min_list_length = 4
    command = "ukbench"
    full_name = "UKBench"
    headline_metric = Headline("score", "score", scale=1.0, decimals=4)
    about = "UKBench: the N-S score (the object's 4 images counted in the top 4)"

    def result_dict(self, result: EvaluationResult) -> dict[str, Any]:
        (s,) = result.setups.values()
        return {"score": json_float(s.score if s.score is not None else float("nan"))}

    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        (setup,) = per_query
        if "score" not in metrics:
            raise InputError("no 'score'")
        yield "score", metrics["score"], setup, "score"


UKBENCH = register_protocol(UKBench("ukbench"))
