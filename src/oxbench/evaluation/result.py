"""Typed evaluation results and their exporters (the familiar lines, a table, JSON, CSV rows).

An :class:`EvaluationResult` holds one :class:`SetupResult` per setup of its protocol
(:class:`oxbench.protocol.Protocol`: ``easy``, ``medium``, ``hard`` for the revisited protocol,
``public`` and ``private`` for GLDv2 retrieval, one setup for the others); the protocol writes its
lines, its table's rows and JSON (:func:`oxbench.report.tables.result_table` renders the rows).

All values are fractions (``0.8481``); the printed lines and tables show percent with two
decimals, as the field does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.protocol import Protocol


@dataclass(frozen=True, eq=False)
class SetupResult:
    """Scores of one setup (e.g. revisited ``hard``).

    Attributes:
        map: mean AP over the non-skipped queries (a fraction).
        mp_at_k: mean P@K (revisitop's capped denominator) per K, over the non-skipped queries.
        ap: per-query AP, shape ``[n_queries]``; ``nan`` for skipped queries.
        p_at_k: per-query P@K, shape ``[n_queries, len(ks)]``; ``nan`` rows for skipped queries.
        skipped: indices of the queries without positives in this setup (left out of the means).
        n_positives: per-query number of positives in the ground truth, shape ``[n_queries]``.
        score: UKBench only: the N-S score (mean number of the object's 4 images in the top 4).
        per_query_score: UKBench only: per-query count of the object's images in the top 4.
        extra: further per-query columns of the protocol (ILIAS ``oracle``), ``nan`` where none.
    """

    map: float
    mp_at_k: dict[int, float]
    ap: NDArray[np.float64]
    p_at_k: NDArray[np.float64]
    skipped: tuple[int, ...] = ()
    n_positives: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    score: float | None = None
    per_query_score: NDArray[np.float64] | None = None
    extra: Mapping[str, NDArray[np.float64]] = field(default_factory=dict)


def _json_float(x: float) -> float | None:
    x = float(x)
    return None if math.isnan(x) else x


@dataclass(frozen=True, eq=False)
class EvaluationResult:
    """The result of scoring one ranking against one ground truth.

    Attributes:
        dataset: dataset id, used in the printed line (``roxford5k: mAP E: ...``).
        protocol: the protocol (:class:`~oxbench.protocol.Protocol`, equal to its name:
            ``revisited``, ``original``, ``holidays``, ``ukbench``, ``gldv2``, ``ilias``).
        setups: one :class:`SetupResult` per setup, in the protocol's order.
        ks: the K values of the P@K columns.
        query_names: query names in the ground truth's order (keys of per-query exports).
        n_distractors: how many distractor indices the ranking was allowed to use.
        query_ids: original protocol: the query ids (``all_souls_1``: the stem of the
            ``_query.txt`` file), the keys of its JSON ``ap``; empty for the other protocols.
        padding: the value that padded lists shorter than the others (-1, FAISS), or None.
        summary: further numbers of the protocol (ILIAS: the oracle, the per-scale, per-clutter
            and taxonomy breakdowns; GLDv2: the cut-off), written in its JSON.
    """

    dataset: str
    protocol: Protocol
    setups: Mapping[str, SetupResult]
    ks: tuple[int, ...]
    query_names: tuple[str, ...] = ()
    n_distractors: int = 0
    query_ids: tuple[str, ...] = ()
    padding: int | None = None
    summary: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, setup: str) -> SetupResult:
        return self.setups[setup]

    # -- exporters -------------------------------------------------------------------------
    def lines(self) -> list[str]:
        """The familiar text line(s), percent with two decimals, as the protocol writes them.

        Revisited (as revisitop's example script prints them)::

            roxford5k: mAP E: 84.81, M: 64.67, H: 38.47
            roxford5k: mP@k[1 5 10] E: [97.06 92.06 86.49], M: [...], H: [...]

        Others: ``oxford5k: mAP 87.80, mP@k[1 5 10] [...]``; Holidays: ``holidays: mAP 87.80``;
        UKBench: ``ukbench: score 3.5000 (of 4), mAP ...``. The capped ``mP@k`` part (revisitop's
        rule, see :func:`~oxbench.evaluation.ap.precision_at_ks`) appears when ``ks`` is not empty.
        """
        return self.protocol.lines(self)

    @property
    def title(self) -> str:
        """The table's title: ``roxford5k (revisited protocol)``."""
        return f"{self.dataset} ({self.protocol} protocol)"

    def table_rows(self) -> tuple[list[str], list[list[str]]]:
        """The table as the protocol lays it out: a header and one row of text cells per setup
        (queries used, mAP and mP@K in percent). :func:`oxbench.report.tables.result_table`
        renders it as text, markdown or LaTeX."""
        return self.protocol.table(self)

    def to_dict(self) -> dict[str, Any]:
        """The CLI's JSON object; numbers are fractions at full precision, skipped APs ``None``.

        - revisited: ``{"setups": {"easy": {"map", "mp@1", "mp@5", "mp@10", "ap": [...]}, ...}}``
        - original: ``{"map": f, "ap": {"<query id>": f}}``, keyed by the query id
          (``all_souls_1``), as ``compute_ap`` and the ranked-list files name queries;
        - holidays: ``{"map": f, "ap": {"<query image>": f}}``;
        - ukbench: ``{"score": f}``;
        - gldv2 and ilias: see their protocols (:mod:`oxbench.evaluation.protocols`).

        With ``padding`` set, ``"padding": -1`` is added.
        """
        out = self.protocol.result_dict(self)
        if self.padding is not None:
            out["padding"] = self.padding
        return out

    def per_query_rows(self) -> list[dict[str, Any]]:
        """One dict per (setup, query): ``setup, query_index, [query_id,] query, n_positives, ap, p@K...``.

        ``query_id`` (``all_souls_1``) is there for the original protocol; ``query`` is the query
        image name.

        Skipped queries have ``ap`` and ``p@K`` ``None``. Ready for :class:`csv.DictWriter`.
        """
        rows = []
        for n, s in self.setups.items():
            for qi in range(len(s.ap)):
                row: dict[str, Any] = {
                    "setup": n,
                    "query_index": qi,
                }
                if self.query_ids:
                    row["query_id"] = self.query_ids[qi]
                row |= {
                    "query": self.query_names[qi] if self.query_names else str(qi),
                    "n_positives": int(s.n_positives[qi]) if len(s.n_positives) else None,
                    "ap": _json_float(s.ap[qi]),
                }
                for j, k in enumerate(self.ks):
                    row[f"p@{k}"] = _json_float(s.p_at_k[qi, j])
                if s.per_query_score is not None:
                    row["score"] = _json_float(s.per_query_score[qi])
                for column, values in s.extra.items():
                    row[column] = _json_float(values[qi])
                rows.append(row)
        return rows
