"""The protocol-sensitivity study: which system "wins" depends on what counts as relevant.

The study and its reference numbers are described in docs/protocols.md ("Reference numbers").

A synthetic benchmark (no images) with the shape of Oxford 5K: 11 landmarks x 5 queries and a
database of 5,000 images. Each database image has a *true* relation to each landmark -- Easy, Hard,
Unclear or Negative -- and an *old-style* annotation (good / junk / absent) drawn from it, as the
2007 annotators might have labelled it. Two retrieval systems score every (query, image) pair as
``mean(true relation) + N(0, 1)``; system A is strong on Easy images, system B on Hard ones. Both
rankings are then scored with the official rules:

====================  ==========================  =================================
column                positives                   ignored
====================  ==========================  =================================
``oxford``            annotated good              annotated junk (the official rule)
``oxford_junk_neg``   annotated good              nothing (junk counts as negative)
``easy``              true Easy                   true Hard + Unclear
``medium``            true Easy + Hard            true Unclear
``hard``              true Hard                   true Easy + Unclear
``hard_mp10``         mP@10 of the Hard setup     (same as ``hard``)
====================  ==========================  =================================

Details the description in docs/protocols.md leaves open, decided here:

- Counts: per landmark, the numbers of Easy, Hard and Unclear images are drawn uniformly from the
  integers in [10, 80), [5, 60) and [3, 20). The related images of different landmarks are
  disjoint (a photo shows one landmark), drawn without replacement from the 5,000; every other
  image is Negative for that landmark.
- Annotations are per landmark and shared by its 5 queries, as in the real Oxford files (the
  five ``<landmark>_<n>_{good,junk}.txt`` lists of a landmark are the same). The old annotation of
  (landmark, image) is good / junk / absent with probabilities (0.97, 0.02, 0.01) for Easy,
  (0.20, 0.70, 0.10) for Hard, (0.20, 0.50, 0.30) for Unclear; a Negative becomes good with
  probability 2e-4 (an annotator's slip) and is absent otherwise.
- Query images are not in the database (as in the revisited protocol); every query ranks all
  5,000 images. Ties in score (probability 0) would be broken by lower database index.
- Scores: mean by true relation -- A: Easy 3.0, Hard 1.0, Unclear 0.8; B: Easy 2.6, Hard 2.0,
  Unclear 0.8; Negative 0 -- plus independent standard normal noise for every (system, query,
  image): each query of each system gets its own noise vector.
- Randomness: one ``numpy.random.Generator`` per seed (``default_rng(seed)``), used in a fixed order
  (counts, placement, annotation, then noise for A and B), so a seed always gives the same numbers.
- A query with no positive in a setup gets no AP there and is left out of that mean (the revisited
  rule); with these counts it does not happen in practice.

Scoring goes through the evaluation engine: each draw becomes three :class:`GroundTruth` objects
(the old annotation with junk ignored, the same without junk, the true relations as revisited
Easy/Hard/Unclear) and the rankings are scored by :func:`oxbench.evaluation.evaluate`; single
ranked lists (the worked example) by :func:`oxbench.evaluation.ap.average_precision` and
:func:`~oxbench.evaluation.ap.precision_at_ks`, the functions ``evaluate`` uses per query.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.evaluation.ap import average_precision, precision_at_ks
from oxbench.evaluation.labelled import evaluate
from oxbench.evaluation.ranking import ranks_from_scores
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.protocol import get_protocol

# True relation codes.
NEGATIVE, EASY, HARD, UNCLEAR = 0, 1, 2, 3
# Old-style annotation codes.
ABSENT, GOOD, JUNK = 0, 1, 2

N_LANDMARKS = 11
QUERIES_PER_LANDMARK = 5
N_DATABASE = 5000
# [low, high) of the per-landmark counts of Easy, Hard and Unclear images.
COUNT_RANGES: Mapping[int, tuple[int, int]] = {EASY: (10, 80), HARD: (5, 60), UNCLEAR: (3, 20)}
# P(good, junk, absent | true relation).
ANNOTATION_PROBS: Mapping[int, tuple[float, float, float]] = {
    EASY: (0.97, 0.02, 0.01),
    HARD: (0.20, 0.70, 0.10),
    UNCLEAR: (0.20, 0.50, 0.30),
}
NEGATIVE_GOOD_PROB = 2e-4
# Score mean by true relation (NEGATIVE, EASY, HARD, UNCLEAR).
SYSTEMS: Mapping[str, tuple[float, float, float, float]] = {
    "A": (0.0, 3.0, 1.0, 0.8),
    "B": (0.0, 2.6, 2.0, 0.8),
}
COLUMNS: tuple[str, ...] = ("oxford", "oxford_junk_neg", "easy", "medium", "hard", "hard_mp10")
COLUMN_TITLES: Mapping[str, str] = {
    "oxford": "Oxford (junk ignored)",
    "oxford_junk_neg": "Oxford, junk as negative",
    "easy": "Easy",
    "medium": "Medium",
    "hard": "Hard",
    "hard_mp10": "Hard mP@10",
}
#: How many seeds the reference numbers average (seeds 0..9, as the default study).
SPEC_SEEDS = 10
# The reference numbers (docs/protocols.md): mean, min, max over SPEC_SEEDS seeds, x100.
SPEC_TABLE: Mapping[str, Mapping[str, tuple[float, float, float]]] = {
    "A": {
        "oxford": (56.4, 52.4, 60.0),
        "oxford_junk_neg": (55.1, 51.1, 58.9),
        "easy": (66.6, 63.8, 68.9),
        "medium": (47.2, 42.8, 53.0),
        "hard": (3.3, 2.7, 4.2),
        "hard_mp10": (8.3, 4.5, 10.9),
    },
    "B": {
        "oxford": (46.1, 42.7, 48.9),
        "oxford_junk_neg": (41.2, 37.5, 45.4),
        "easy": (50.9, 47.7, 53.4),
        "medium": (48.8, 45.8, 50.2),
        "hard": (20.9, 17.8, 24.5),
        "hard_mp10": (41.1, 32.5, 51.5),
    },
}

# The worked example of docs/protocols.md (original protocol).
WORKED_EXAMPLE: tuple[str, ...] = (
    "good",
    "junk",
    "junk",
    "ok",
    "absent",
    "good",
    "junk",
    "absent",
    "ok",
)
WORKED_EXAMPLE_SPEC: Mapping[str, float] = {
    "junk_ignored": 0.835,
    "junk_as_negative": 0.569,
    "junk_as_positive": 0.918,
}


def list_scores(
    positive: NDArray[np.bool_],
    ignored: NDArray[np.bool_],
    *,
    n_positives: int | None = None,
    ks: Sequence[int] = (),
) -> tuple[float, NDArray[np.float64]]:
    """AP and P@K of one ranked list given per-position flags.

    Ignored positions are deleted, then the positions of the remaining positives are handed to
    :func:`oxbench.evaluation.ap.average_precision` / :func:`~oxbench.evaluation.ap.precision_at_ks`.

    Args:
        positive: ``bool [n]``, True where the ranked item is a positive.
        ignored: ``bool [n]``, True where it is ignored (never also positive).
        n_positives: N; default the number of positives in the list (a complete ranking).
        ks: the K of P@K.

    Returns:
        ``(ap, p_at_k)``; ``ap`` is nan when there is no positive at all.
    """
    keep = ~np.asarray(ignored, dtype=bool)
    pos = np.asarray(positive, dtype=bool)[keep]
    positions = np.flatnonzero(pos)
    n = int(positions.size if n_positives is None else n_positives)
    if n == 0:
        return float("nan"), np.zeros(len(ks))
    return average_precision(positions, n), precision_at_ks(positions, ks)


def worked_example() -> dict[str, float]:
    """The worked example's ranked labels ``good junk junk ok absent good junk absent ok``, three ways.

    Returns:
        AP with junk ignored (official, 0.835), junk counted as negative (0.569) and junk counted
        as positive (0.918), unrounded.
    """
    labels = np.array(WORKED_EXAMPLE)
    pos = np.isin(labels, ("good", "ok"))
    junk = labels == "junk"
    none = np.zeros(labels.size, dtype=bool)
    return {
        "junk_ignored": list_scores(pos, junk)[0],
        "junk_as_negative": list_scores(pos, none)[0],
        "junk_as_positive": list_scores(pos | junk, none)[0],
    }


@dataclass(frozen=True)
class SyntheticBenchmark:
    """One draw of the synthetic benchmark.

    Attributes:
        relation: ``int8 [n_landmarks, n_db]`` true relation (NEGATIVE/EASY/HARD/UNCLEAR).
        annotation: ``int8 [n_landmarks, n_db]`` old-style label (ABSENT/GOOD/JUNK).
        query_landmark: ``int64 [n_queries]`` the landmark of each query.
    """

    relation: NDArray[np.int8]
    annotation: NDArray[np.int8]
    query_landmark: NDArray[np.int64]


def draw_benchmark(
    rng: np.random.Generator,
    *,
    n_landmarks: int = N_LANDMARKS,
    queries_per_landmark: int = QUERIES_PER_LANDMARK,
    n_db: int = N_DATABASE,
) -> SyntheticBenchmark:
    """Draw true relations and old-style annotations (see the module docstring for the rules)."""
    counts = {rel: rng.integers(lo, hi, size=n_landmarks) for rel, (lo, hi) in COUNT_RANGES.items()}
    total = sum(int(c.sum()) for c in counts.values())
    if total > n_db:
        raise ValueError(f"{total} related images do not fit a database of {n_db}")
    placement = rng.permutation(n_db)[:total]
    relation = np.zeros((n_landmarks, n_db), dtype=np.int8)
    start = 0
    for lm in range(n_landmarks):
        for rel in (EASY, HARD, UNCLEAR):
            c = int(counts[rel][lm])
            relation[lm, placement[start : start + c]] = rel
            start += c
    u = rng.random((n_landmarks, n_db))
    annotation = np.zeros_like(relation)
    annotation[(relation == NEGATIVE) & (u < NEGATIVE_GOOD_PROB)] = GOOD
    for rel, (p_good, p_junk, _) in ANNOTATION_PROBS.items():
        is_rel = relation == rel
        annotation[is_rel & (u < p_good)] = GOOD
        annotation[is_rel & (u >= p_good) & (u < p_good + p_junk)] = JUNK
    query_landmark = np.repeat(np.arange(n_landmarks, dtype=np.int64), queries_per_landmark)
    return SyntheticBenchmark(relation, annotation, query_landmark)


def rank_system(
    bench: SyntheticBenchmark, means: Sequence[float], rng: np.random.Generator
) -> NDArray[np.int64]:
    """Rank the database for every query: score = mean(true relation) + N(0, 1), best first.

    Returns:
        ``int64 [n_queries, n_db]`` database indices (stable sort: ties by lower index).
    """
    mean_of = np.asarray(means, dtype=np.float64)
    rel = bench.relation[bench.query_landmark]  # [n_queries, n_db]
    scores = mean_of[rel] + rng.standard_normal(rel.shape)
    return ranks_from_scores(scores.T)


def ground_truths(bench: SyntheticBenchmark) -> dict[str, GroundTruth]:
    """The draw as ground truth for the engine.

    Returns:
        ``oxford`` (original protocol: good positive, junk ignored), ``oxford_junk_neg`` (the same
        without junk: junk counts as negative) and ``revisited`` (easy = true Easy, hard = true
        Hard, junk = true Unclear: its Easy/Medium/Hard setups are the study's columns).
    """
    names = tuple(f"db{i}" for i in range(bench.relation.shape[1]))
    old, old_neg, rev = [], [], []
    for qi, lm in enumerate(bench.query_landmark.tolist()):
        rel, ann = bench.relation[lm], bench.annotation[lm]
        good, junk = np.flatnonzero(ann == GOOD), np.flatnonzero(ann == JUNK)
        old.append(make_query(f"q{qi}", good=good, junk=junk))
        old_neg.append(make_query(f"q{qi}", good=good))
        rev.append(
            make_query(
                f"q{qi}",
                easy=np.flatnonzero(rel == EASY),
                hard=np.flatnonzero(rel == HARD),
                junk=np.flatnonzero(rel == UNCLEAR),
            )
        )
    original = get_protocol("original")
    return {
        "oxford": GroundTruth("simulated", original, names, tuple(old)),
        "oxford_junk_neg": GroundTruth("simulated", original, names, tuple(old_neg)),
        "revisited": GroundTruth("simulated", get_protocol("revisited"), names, tuple(rev)),
    }


def score_rankings(bench: SyntheticBenchmark, ranks: NDArray[np.int64]) -> dict[str, float]:
    """The six columns (fractions) for one system's rankings of one benchmark draw.

    Scored by :func:`oxbench.evaluation.evaluate` against :func:`ground_truths`.
    """
    gts = ground_truths(bench)
    out = {
        name: evaluate(gts[name], ranks, ks=()).setups["original"].map
        for name in ("oxford", "oxford_junk_neg")
    }
    rev = evaluate(gts["revisited"], ranks, ks=(10,))
    for name in ("easy", "medium", "hard"):
        out[name] = rev.setups[name].map
    out["hard_mp10"] = rev.setups["hard"].mp_at_k[10]
    return {c: out[c] for c in COLUMNS}


@dataclass(frozen=True)
class StudyResult:
    """Per-seed results of the protocol study.

    Attributes:
        seeds: the seeds, one run each.
        systems: system names, ``("A", "B")``.
        columns: the six column keys (:data:`COLUMNS`).
        values: ``float64 [n_seeds, n_systems, n_columns]`` mAP / mP@10 as fractions.
        worked_example: :func:`worked_example`.
    """

    seeds: tuple[int, ...]
    systems: tuple[str, ...]
    columns: tuple[str, ...]
    values: NDArray[np.float64]
    worked_example: dict[str, float] = field(default_factory=worked_example)

    def mean(self) -> NDArray[np.float64]:
        """``[n_systems, n_columns]`` mean over seeds (fractions)."""
        return self.values.mean(axis=0)

    def min(self) -> NDArray[np.float64]:
        """``[n_systems, n_columns]`` minimum over seeds (fractions)."""
        return self.values.min(axis=0)

    def max(self) -> NDArray[np.float64]:
        """``[n_systems, n_columns]`` maximum over seeds (fractions)."""
        return self.values.max(axis=0)

    def spec_comparison(self) -> list[dict[str, Any]]:
        """Our mean (x100) against the reference mean and [min, max], one row per (system, column).

        Each row: ``system``, ``column``, ``mean``, ``spec_mean``, ``spec_min``, ``spec_max`` (the
        reference numbers), ``diff`` (ours - the reference mean) and ``inside`` (our mean within
        the reference range).
        """
        rows = []
        mean = self.mean() * 100
        for si, s in enumerate(self.systems):
            for ci, c in enumerate(self.columns):
                if s not in SPEC_TABLE or c not in SPEC_TABLE[s]:
                    continue
                sm, lo, hi = SPEC_TABLE[s][c]
                m = float(mean[si, ci])
                rows.append(
                    {
                        "system": s,
                        "column": c,
                        "mean": m,
                        "spec_mean": sm,
                        "spec_min": lo,
                        "spec_max": hi,
                        "diff": m - sm,
                        "inside": lo <= m <= hi,
                    }
                )
        return rows

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: fractions at full precision.

        Keys: ``seeds``, ``columns``, ``systems`` (per system and column: ``mean``, ``min``, ``max``,
        ``per_seed``), ``worked_example`` and ``spec`` (:meth:`spec_comparison`, x100 like the
        reference table).
        """
        mean, lo, hi = self.mean(), self.min(), self.max()
        systems = {
            s: {
                c: {
                    "mean": float(mean[si, ci]),
                    "min": float(lo[si, ci]),
                    "max": float(hi[si, ci]),
                    "per_seed": [float(v) for v in self.values[:, si, ci]],
                }
                for ci, c in enumerate(self.columns)
            }
            for si, s in enumerate(self.systems)
        }
        return {
            "seeds": list(self.seeds),
            "columns": list(self.columns),
            "systems": systems,
            "worked_example": dict(self.worked_example),
            "spec": self.spec_comparison(),
        }

    def table(self) -> str:
        """The terminal table: mean [min, max] x100 per system and column, the reference below."""
        titles = [COLUMN_TITLES.get(c, c) for c in self.columns]
        mean, lo, hi = self.mean() * 100, self.min() * 100, self.max() * 100
        rows: list[list[str]] = [["system", *titles]]
        for si, s in enumerate(self.systems):
            rows.append(
                [s]
                + [
                    f"{mean[si, ci]:.1f} [{lo[si, ci]:.1f}, {hi[si, ci]:.1f}]"
                    for ci in range(len(self.columns))
                ]
            )
            if s in SPEC_TABLE:
                spec = SPEC_TABLE[s]
                rows.append(
                    [f"{s} (reference)"]
                    + [
                        "{:.1f} [{:.1f}, {:.1f}]".format(*spec[c]) if c in spec else "-"
                        for c in self.columns
                    ]
                )
        if len(self.systems) == 2:
            a, b = self.systems
            diff = (self.values[:, 0] - self.values[:, 1]).mean(axis=0) * 100
            rows.append([f"{a} - {b}"] + [f"{d:+.1f}" for d in diff])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        n = len(self.seeds)
        head = f"Protocol sensitivity study (docs/protocols.md): mean [min, max] over {n} seed(s), x100"
        return "\n".join([head, "", *lines])

    def worked_example_lines(self) -> list[str]:
        """The worked example of docs/protocols.md with its reference values."""
        labels = " ".join(WORKED_EXAMPLE)
        out = [f"Worked example (original protocol), ranked labels: {labels}"]
        for key, title in (
            ("junk_ignored", "junk ignored (official)"),
            ("junk_as_negative", "junk counted as negative"),
            ("junk_as_positive", "junk counted as positive"),
        ):
            out.append(
                f"  AP {title}: {self.worked_example[key]:.3f} (reference {WORKED_EXAMPLE_SPEC[key]:.3f})"
            )
        return out


def run_seed(seed: int, systems: Mapping[str, Sequence[float]] = SYSTEMS) -> NDArray[np.float64]:
    """One seed of the study: ``float64 [n_systems, n_columns]`` (fractions)."""
    rng = np.random.default_rng(seed)
    bench = draw_benchmark(rng)
    out = np.empty((len(systems), len(COLUMNS)))
    for si, means in enumerate(systems.values()):
        scores = score_rankings(bench, rank_system(bench, means, rng))
        out[si] = [scores[c] for c in COLUMNS]
    return out


def run_study(
    seeds: int | Iterable[int] = 10,
    *,
    first_seed: int = 0,
    systems: Mapping[str, Sequence[float]] = SYSTEMS,
) -> StudyResult:
    """Run the protocol-sensitivity study (docs/protocols.md, "Reference numbers").

    Args:
        seeds: the number of seeds (run ``first_seed``, ``first_seed + 1``, ...) or the seeds.
        first_seed: the first seed when ``seeds`` is a number.
        systems: name -> score means for (Negative, Easy, Hard, Unclear); default A and B of the study.

    Returns:
        A :class:`StudyResult` with every seed's six columns for each system.

    Example:
        >>> r = run_study(1)
        >>> r.values.shape
        (1, 2, 6)
    """
    if isinstance(seeds, int | np.integer):
        if seeds < 1:
            raise ValueError(f"need at least one seed, got {seeds}")
        seed_list = tuple(range(first_seed, first_seed + int(seeds)))
    else:
        seed_list = tuple(int(s) for s in seeds)
        if not seed_list:
            raise ValueError("need at least one seed")
    values = np.stack([run_seed(s, systems) for s in seed_list])
    return StudyResult(seed_list, tuple(systems), COLUMNS, values)
