"""Revisited Oxford / Paris (Radenovic et al., CVPR 2018): Easy, Medium and Hard setups.

==========  ===============  ===========================
setup       positives        ignored (deleted from list)
==========  ===============  ===========================
easy        easy             hard + junk
medium      easy + hard      junk
hard        hard             easy + junk
==========  ===============  ===========================

Scored as revisitop's ``compute_map`` does, bit for bit; printed as its example script prints::

    roxford5k: mAP E: 84.81, M: 64.67, H: 38.47
    roxford5k: mP@k[1 5 10] E: [97.06 92.06 86.49], M: [...], H: [...]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.evaluation import kernels as K
from oxbench.evaluation.labelled import DEFAULT_KS, LabelledProtocol, json_float, pct
from oxbench.evaluation.result import EvaluationResult
from oxbench.groundtruth import Query
from oxbench.protocol import register_protocol


class Revisited(LabelledProtocol):
    """The revisited protocol: three setups over easy / hard / junk labels."""

    setups = ("easy", "medium", "hard")
    letters = {"easy": "E", "medium": "M", "hard": "H"}
    labels = ("easy", "hard", "junk", "negative")
    setup_labels = {
        "easy": (frozenset({"easy"}), frozenset({"hard", "junk"})),
        "medium": (frozenset({"easy", "hard"}), frozenset({"junk"})),
        "hard": (frozenset({"hard"}), frozenset({"easy", "junk"})),
    }
    code_setups = {
        "easy": ((K.EASY,), (K.HARD, K.JUNK)),
        "medium": ((K.EASY, K.HARD), (K.JUNK,)),
        "hard": ((K.HARD,), (K.EASY, K.JUNK)),
    }
    default_ks = DEFAULT_KS
    scores_feature_files = True
    command = "revisited"
    full_name = "revisited Oxford/Paris"
    about = "revisited Oxford/Paris: mAP and capped mP@K in the Easy, Medium and Hard setups"

    def query_label_parts(self, query: Query) -> tuple[tuple[NDArray[np.int64], int], ...]:
        return ((query.easy, K.EASY), (query.hard, K.HARD), (query.junk, K.JUNK))

    def lines(self, result: EvaluationResult) -> list[str]:
        name = result.dataset
        kstr = " ".join(str(k) for k in result.ks)
        setups = result.setups.items()
        maps = ", ".join(f"{self.letters.get(n, n)}: {pct(s.map)}" for n, s in setups)
        mps = ", ".join(f"{self.letters.get(n, n)}: {self._mp(result, s)}" for n, s in setups)
        return [f"{name}: mAP {maps}"] + ([f"{name}: mP@k[{kstr}] {mps}"] if result.ks else [])

    def result_dict(self, result: EvaluationResult) -> dict[str, Any]:
        setups = {}
        for n, s in result.setups.items():
            d: dict[str, Any] = {"map": json_float(s.map)}
            for k in result.ks:
                d[f"mp@{k}"] = json_float(s.mp_at_k[k])
            d["ap"] = [json_float(v) for v in s.ap]
            setups[n] = d
        return {"setups": setups}

    def stored_means(
        self, metrics: Mapping[str, Any], per_query: Mapping[str, Mapping[str, Any]]
    ) -> Iterator[tuple[str, Any, str, str]]:
        setups = metrics.get("setups")
        if not isinstance(setups, dict):
            raise InputError("expected 'setups' (an object per setup)")
        if set(setups) != set(per_query):
            raise InputError(
                f"setups {sorted(setups)} differ from per_query.json's {sorted(per_query)}"
            )
        for name, s in setups.items():
            if not isinstance(s, dict):
                raise InputError(f"setup {name!r}: expected an object")
            for key, stored in s.items():
                if key == "ap":
                    if not (isinstance(stored, list) and len(stored) == len(per_query[name]["ap"])):
                        raise InputError(f"setup {name!r}: 'ap' must list one value per query")
                    continue
                column = "ap" if key == "map" else (key[1:] if key.startswith("mp@") else None)
                if column is not None:
                    yield f"{name} {key}", stored, name, column


REVISITED = register_protocol(Revisited("revisited"))
