"""The field's milestones, run as seed groups beside the published figures (``oxbench milestones``).

:data:`MILESTONES` are the presets the field reached one after another (BoW, + spatial
re-ranking, + query expansion, soft assignment, Hamming embedding, DQE, DBA, ASMK), each with the
Oxford 5K mAP its paper published where the project's reference numbers quote one (section 5,
"Reference numbers", of the project's facts: the ``source`` of each row says which line; a row
whose paper is not quoted there has ``published=None``). :data:`TRENDS` are the published claims
between them ("spatial re-ranking improves BoW").

:func:`run_milestones` runs each preset as a seed group (:mod:`oxbench.pipelines.seedgroup`) on a
dataset -- the synthetic benchmark by default, the real subset's layout, or a user's ROxford /
RParis -- and :func:`milestone_table` renders ours (mean and spread over the seeds) beside the
published figure, then whether each trend holds against the spread: the two-level bootstrap over
seeds and queries (:func:`oxbench.evaluation.bootstrap.two_level_test`) and the paired query test
must both reject "no difference", in the published direction. The synthetic set is not Oxford:
what is compared is the trend, not the numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.evaluation.bootstrap import spread_note, spread_text, two_level_test
from oxbench.report.compare import _p
from oxbench.report.paper import _md
from oxbench.report.seeds import SeedGroup
from oxbench.report.stats import paired_test

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.pipelines.session import RecordOptions, Session

#: Where the published figures are quoted: a file every user has (docs/protocols.md, "Published
#: results").
FACTS = "docs/protocols.md (Published results)"


@dataclass(frozen=True)
class Milestone:
    """One row: a preset and what its paper published.

    Attributes:
        label: the row's name (``+ spatial re-ranking``).
        preset: the oxbench preset run.
        paper: the paper (``Philbin et al. 2007``).
        published: its Oxford 5K mAP (%), ``None`` where the project's facts quote none.
        source: where ``published`` comes from (the facts' line), or why there is none.
        default: run unless ``--methods`` names rows (DBA verifies the whole database: off).
    """

    label: str
    preset: str
    paper: str
    published: float | None
    source: str
    default: bool = True


@dataclass(frozen=True)
class Trend:
    """A published claim: ``better`` scores above ``base``."""

    claim: str
    base: str
    better: str
    published: str  # what the paper reported for it, with the source


MILESTONES: tuple[Milestone, ...] = (
    Milestone(
        "BoW, large vocabulary",
        "rootsift-bow",
        "Philbin et al. 2007",
        61.8,
        f"{FACTS}: Philbin et al. 2007, Oxford 5K, 1M-word vocabulary: 61.8",
    ),
    Milestone(
        "+ spatial re-ranking",
        "rootsift-bow-sv",
        "Philbin et al. 2007",
        64.7,
        f"{FACTS}: Philbin et al. 2007, with spatial re-ranking: 64.7",
    ),
    Milestone(
        "+ average query expansion",
        "rootsift-bow-sv-qe",
        "Chum et al. 2007",
        None,
        f"not quoted in the {FACTS}",
    ),
    Milestone(
        "soft assignment (database side)",
        "rootsift-bow-sa",
        "Philbin et al. 2008",
        None,
        f"not quoted in the {FACTS}",
    ),
    Milestone(
        "soft assignment + SV + QE",
        "rootsift-bow-sa-sv-qe",
        "Philbin et al. 2008",
        71.8,
        f"{FACTS}: Philbin et al. 2008, SA + SV + QE: 71.8 (Paris vocabulary; 82.5 Oxford's)",
    ),
    Milestone(
        "Hamming embedding",
        "rootsift-he",
        "Jegou et al. 2008",
        None,
        f"not quoted in the {FACTS}",
    ),
    Milestone(
        "HE + weak geometric consistency",
        "rootsift-he-wgc",
        "Jegou et al. 2008",
        None,
        f"not quoted in the {FACTS} (bench/README's 54.7, 20K words, is not among them)",
    ),
    Milestone(
        "HE + WGC + SV + QE",
        "rootsift-he-wgc-sv-qe",
        "Jegou et al. 2008",
        None,
        f"not quoted in the {FACTS}",
    ),
    Milestone(
        "RootSIFT + SV + DQE",
        "rootsift-bow-sv-dqe",
        "Arandjelovic & Zisserman 2012",
        None,
        f"not quoted in the {FACTS}",
    ),
    Milestone(
        "RootSIFT + DBA + SV + DQE",
        "rootsift-bow-dba-sv-dqe",
        "Arandjelovic & Zisserman 2012",
        80.9,
        f"{FACTS}: Arandjelovic & Zisserman 2012, RootSIFT + DBA + DQE: 80.9 Oxford 5K with an "
        "independent vocabulary (92.9 with the test set's)",
        default=False,
    ),
    Milestone("ASMK", "rootsift-asmk", "Tolias et al. 2013", None, f"not quoted in the {FACTS}"),
    Milestone(
        "ASMK + SV", "rootsift-asmk-sv", "Tolias et al. 2013", None, f"not quoted in the {FACTS}"
    ),
)

TRENDS: tuple[Trend, ...] = (
    Trend(
        "SV improves BoW",
        "rootsift-bow",
        "rootsift-bow-sv",
        f"+2.9 (61.8 -> 64.7, Philbin et al. 2007; {FACTS})",
    ),
    Trend("AQE improves SV", "rootsift-bow-sv", "rootsift-bow-sv-qe", "helps (Chum et al. 2007)"),
    Trend(
        "soft assignment improves BoW",
        "rootsift-bow",
        "rootsift-bow-sa",
        "helps (Philbin et al. 2008)",
    ),
    Trend(
        "SA + SV + QE improves hard SV + QE",
        "rootsift-bow-sv-qe",
        "rootsift-bow-sa-sv-qe",
        "helps (Philbin et al. 2008)",
    ),
    Trend("HE improves BoW", "rootsift-bow", "rootsift-he", "helps (Jegou et al. 2008)"),
    Trend("WGC improves HE", "rootsift-he", "rootsift-he-wgc", "helps (Jegou et al. 2008)"),
    Trend(
        "DQE improves AQE",
        "rootsift-bow-sv-qe",
        "rootsift-bow-sv-dqe",
        "helps (Arandjelovic & Zisserman 2012)",
    ),
    Trend(
        "DBA improves SV + DQE",
        "rootsift-bow-sv-dqe",
        "rootsift-bow-dba-sv-dqe",
        "helps (Arandjelovic & Zisserman 2012)",
    ),
    Trend("ASMK improves BoW", "rootsift-bow", "rootsift-asmk", "helps (Tolias et al. 2013)"),
    Trend(
        "ASMK + SV improves BoW + SV",
        "rootsift-bow-sv",
        "rootsift-asmk-sv",
        "helps (Tolias et al. 2013)",
    ),
)


def choose(methods: Sequence[str] | None) -> list[Milestone]:
    """The rows to run: the default ones, or those whose presets ``methods`` names (in table order).

    Raises:
        InputError: a name that is not a milestone preset, or one named twice.
    """
    if not methods:
        return [m for m in MILESTONES if m.default]
    known = {m.preset for m in MILESTONES}
    twice = sorted({n for n in methods if list(methods).count(n) > 1})
    if twice:
        raise InputError(f"--methods: {twice[0]!r} is given twice")
    unknown = [n for n in methods if n not in known]
    if unknown:
        raise InputError(
            f"--methods: {unknown[0]!r} is not a milestone preset (one of {', '.join(sorted(known))})"
        )
    return [m for m in MILESTONES if m.preset in methods]


def settings_for(preset: str, settings: Mapping[str, object]) -> dict[str, object]:
    """The ``--set`` settings that ``preset`` has (:func:`oxbench.pipelines.presets.settings_rows`):
    one ``--set vocabulary.size=64`` serves every row that has a vocabulary."""
    from oxbench.pipelines.presets import METHODS, settings_rows

    names = {r.name for r in settings_rows(METHODS.get(preset))}
    return {k: v for k, v in settings.items() if k in names}


def check_settings(rows: Sequence[Milestone], settings: Mapping[str, object]) -> None:
    """Refuse a ``--set`` key no chosen row has (a typo would otherwise change nothing).

    Raises:
        InputError: naming the key.
    """
    used = {k for m in rows for k in settings_for(m.preset, settings)}
    for key in settings:
        if key not in used:
            raise InputError(
                f"--set {key}: no milestone preset run here has this setting "
                "(`oxbench methods NAME` lists a preset's settings)"
            )


def run_milestones(
    rows: Sequence[Milestone],
    seeds: Sequence[int],
    session: Session | None = None,
    record: RecordOptions | None = None,
    *,
    dataset: str = "synthetic",
    train_dataset: str | None = None,
    settings: Mapping[str, object] | None = None,
    on_group: Callable[[Milestone, SeedGroup], None] | None = None,
) -> dict[str, SeedGroup]:
    """Run each row's preset as a seed group (``oxbench.run(..., seeds=seeds)``) in ``session``,
    its records as ``record`` says, and read it back.

    ``settings`` are ``--set`` settings, each given to the rows that have it (:func:`settings_for`).
    ``on_group`` is called as each group completes.

    Returns:
        The groups by preset.
    """
    from oxbench.pipelines.runner import run
    from oxbench.records import RunRecord
    from oxbench.report.seeds import load_group

    settings = dict(settings or {})
    check_settings(rows, settings)
    out: dict[str, SeedGroup] = {}
    for m in rows:
        outcome = run(
            dataset,
            m.preset,
            session,
            record,
            train_dataset=train_dataset,
            overrides=settings_for(m.preset, settings),
            seeds=list(seeds),
        )
        group = load_group(RunRecord.load(outcome.run_dir))
        out[m.preset] = group
        if on_group is not None:
            on_group(m, group)
    return out


@dataclass(frozen=True)
class TrendVerdict:
    """Whether a published trend holds here: ``holds``, ``reversed`` or ``does not hold``."""

    trend: Trend
    setup: str
    verdict: str
    diff_text: str  # the per-seed differences: "+10.9 (9.8-12.0)" / "+10.9 ± 0.8"
    p_seeds: float
    p_queries: float


def judge(
    trend: Trend,
    groups: Mapping[str, SeedGroup],
    *,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> TrendVerdict | None:
    """The verdict of ``trend`` on the main setup (``medium`` where the protocol has it), ``None``
    when either preset was not run (:func:`trend_verdict` on the two groups' per-query values)."""
    a, b = groups.get(trend.base), groups.get(trend.better)
    if a is None or b is None:
        return None
    setup = "medium" if "medium" in a.setups else a.setups[0]
    verdict, text, p_seeds, p_queries = trend_verdict(
        a.per_query_matrix(setup),
        b.per_query_matrix(setup),
        alpha=alpha,
        n_resamples=n_resamples,
        seed=seed,
    )
    return TrendVerdict(trend, setup, verdict, text, p_seeds, p_queries)


def trend_verdict(
    a: NDArray[np.float64],
    b: NDArray[np.float64],
    *,
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[str, str, float, float]:
    """Whether ``b`` (seeds x queries) is above ``a``: ``(verdict, per-seed difference text,
    two-level p, query p)``.

    It ``holds`` when the difference of the means is positive and both the two-level bootstrap
    over seeds and queries and the paired randomization test over the queries (on each query's
    value averaged over the seeds) give p < ``alpha``; ``reversed`` when it is negative under the
    same tests; else it does not hold, saying which spread it is within. The difference shown is
    per seed (seed ``i`` of both: the same vocabulary for BoW and BoW + SV), in percent.
    """
    two = two_level_test(a, b, n_resamples=n_resamples, seed=seed)
    p_queries = paired_test(
        np.nanmean(a, axis=0), np.nanmean(b, axis=0), n_resamples=n_resamples, seed=seed
    ).p_value
    n = min(a.shape[0], b.shape[0])
    keep = ~(np.isnan(a).any(axis=0) | np.isnan(b).any(axis=0))
    diffs = b[:n, keep].mean(axis=1) - a[:n, keep].mean(axis=1)
    text = spread_text(diffs, 1)
    text = text if text.startswith("-") else "+" + text
    seeds_ok, queries_ok = two.p_value < alpha, p_queries < alpha
    if seeds_ok and queries_ok:
        verdict = "holds" if two.diff > 0 else "reversed"
    elif seeds_ok:
        verdict = f"does not hold (not significant over {two.n_queries} queries)"
    elif queries_ok:
        verdict = "does not hold (within the seed spread)"
    else:
        verdict = "does not hold (within spread)"
    return verdict, text, two.p_value, p_queries


def _cell(group: SeedGroup | None, decimals: int) -> str:
    if group is None:
        return "not run"
    return " / ".join(spread_text(group.member_means(s), decimals) for s in group.setups)


def milestone_table(
    rows: Sequence[Milestone],
    groups: Mapping[str, SeedGroup],
    *,
    fmt: str = "md",
    alpha: float = 0.05,
    n_resamples: int = 10_000,
    seed: int = 0,
    decimals: int = 2,
) -> str:
    """The milestone table (bench/README's layout) and the trend verdicts, as ``md`` or ``latex``.

    Raises:
        InputError: an unknown format.
    """
    from oxbench.report.tables import latex_table, markdown_table

    if fmt not in ("md", "latex"):
        raise InputError(f"--format: {fmt!r} is not md or latex")
    any_group = next(iter(groups.values()), None)
    dataset = any_group.dataset_id if any_group else "dataset"
    setups = " / ".join(s[0].upper() for s in any_group.setups) if any_group else ""
    n = min((g.n for g in groups.values()), default=0)
    header = [
        "milestone",
        "preset",
        f"{dataset} {setups} (ours, {n} seeds)",
        "published Oxford 5K",
        "source",
    ]
    body = []
    for m in rows:
        pub = "-" if m.published is None else f"{m.published:.1f} ({m.paper})"
        body.append([m.label, m.preset, _cell(groups.get(m.preset), decimals), pub, m.source])
    verdicts = [
        v
        for t in TRENDS
        if (v := judge(t, groups, alpha=alpha, n_resamples=n_resamples, seed=seed)) is not None
    ]
    note = (
        f"Ours: {spread_note(n)} (sd for 5 or more seeds, min-max below), mAP %. A trend holds "
        f"when the difference has the published sign and both a two-level bootstrap over seeds and "
        f"queries and a paired randomization test over the queries give p < {alpha:g} "
        f"({n_resamples:,} resamples, seed {seed}); the difference shown is per seed (seed i of "
        "both presets), Medium where the protocol has it. The synthetic set is not Oxford: the "
        "trend is compared, not the number."
    )
    trend_rows = [
        [
            v.trend.claim,
            f"{v.verdict} ({v.diff_text})",
            f"{_p(v.p_seeds)} / {_p(v.p_queries)}",
            v.trend.published,
        ]
        for v in verdicts
    ]
    trend_header = [
        "published trend",
        f"here ({verdicts[0].setup if verdicts else 'mAP'})",
        "p seeds+queries / queries",
        "published",
    ]
    if fmt == "md":
        out = markdown_table(header, [[_md(c) for c in r] for r in body])
        if trend_rows:
            out += "\n\n" + markdown_table(trend_header, [[_md(c) for c in r] for r in trend_rows])
        return out + f"\n\n{note}\n"
    from oxbench.report.tables import _tex

    out = latex_table(header, body)
    if trend_rows:
        out += "\n" + latex_table(trend_header, trend_rows)
    return out + f"\n% {_tex(note)}\n"


def default_runs_dir() -> Path:
    """Where ``oxbench milestones`` keeps its seed groups by default."""
    return Path("runs") / "milestones"


__all__ = [
    "MILESTONES",
    "TRENDS",
    "Milestone",
    "Trend",
    "TrendVerdict",
    "check_settings",
    "choose",
    "judge",
    "milestone_table",
    "run_milestones",
    "settings_for",
    "trend_verdict",
]
