"""``oxbench evaluate``: score a ranking with an official protocol (a thin layer over the library).

Subcommands (JSON numbers are fractions at full precision; without ``--json`` the familiar lines
and a table are printed)::

    oxbench evaluate revisited --gnd GND.pkl --ranks RANKS.npy [--distractors N] [--ks 1,5,10] [--json]
        (or --scores S.npy, or --db-features X.npy --query-features Q.npy; --dataset ID [--root DIR]
        instead of --gnd)
    oxbench evaluate oxford --gt-dir DIR --ranked-dir DIR [--json]
    oxbench evaluate oxford --gnd gnd_oxford5k.pkl --ranks RANKS.npy [--json]
    oxbench evaluate holidays --results FILE [--images holidays_images.dat] [--json]
    oxbench evaluate ukbench --ranks RANKS.npy [--json]

``RANKS.npy`` is in the revisitop layout: rows = ranked positions (possibly truncated), columns =
queries. Bad input exits with code 2 and one line naming the file, query and problem; nothing is
written then.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import numpy as np

from oxbench.errors import InputError

_KS_HELP = "Comma-separated K of the mP@K columns."
_JSON_HELP = "Print JSON (fractions at full precision) instead of lines and a table."


def _load_npy(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} file not found", p)
    try:
        arr = np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"not a readable .npy array ({str(exc).splitlines()[0]})", p) from exc
    if not isinstance(arr, np.ndarray):
        raise InputError("expected a single .npy array", p)
    return arr


def _parse_ks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise InputError(f"--ks must be comma-separated positive integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise InputError(f"--ks must be distinct positive integers, got {text!r}")
    return ks


def _load_gt(gnd: str | None, dataset: str | None, root: str | None, expect: str) -> Any:
    from oxbench.groundtruth import GroundTruth

    if (gnd is None) == (dataset is None):
        raise InputError("give exactly one of --gnd or --dataset")
    if gnd is not None:
        from oxbench.formats.revisitop import read_gnd

        gt: GroundTruth = read_gnd(gnd)
    else:
        from oxbench.datasets import load_ground_truth

        assert dataset is not None  # exactly one of gnd / dataset was given
        gt = load_ground_truth(dataset, root)
    if gt.protocol != expect:
        other = "oxford" if gt.protocol == "original" else gt.protocol
        raise InputError(
            f"this is {gt.protocol}-protocol ground truth; use 'oxbench evaluate {other}'",
            gnd or dataset,
        )
    return gt


def _score(
    gt: Any,
    *,
    ranks: str | None,
    scores: str | None,
    db_features: str | None,
    query_features: str | None,
    n_distractors: int,
    ks: tuple[int, ...],
) -> Any:
    from oxbench.evaluation import evaluate, evaluate_features, evaluate_scores, from_revisitop

    if n_distractors < 0:
        raise InputError(f"--distractors must be >= 0, got {n_distractors}")
    given = [ranks is not None, scores is not None, db_features is not None or query_features is not None]
    if sum(given) != 1:
        raise InputError("give exactly one of --ranks, --scores, or --db-features with --query-features")
    if ranks is not None:
        arr = _load_npy(ranks, "ranks")
        if arr.ndim != 2:
            raise InputError(
                f"ranks must be 2-D (rows = ranked positions, columns = queries), got shape {arr.shape}",
                ranks,
            )
        if arr.shape[1] != gt.n_queries:
            raise InputError(
                f"ranks have {arr.shape[1]} columns but the ground truth has {gt.n_queries} queries "
                f"(revisitop layout: rows = ranked positions, columns = queries; shape {arr.shape})",
                ranks,
            )
        return evaluate(gt, from_revisitop(arr, source=ranks), ks=ks, n_distractors=n_distractors, source=ranks)
    if scores is not None:
        arr = _load_npy(scores, "scores")
        return evaluate_scores(gt, arr, ks=ks, n_distractors=n_distractors, source=scores)
    if db_features is None or query_features is None:
        raise InputError("--db-features and --query-features go together")
    x = _load_npy(db_features, "database features")
    q = _load_npy(query_features, "query features")
    return evaluate_features(
        gt, q, x, ks=ks, n_distractors=n_distractors, source=f"{db_features}, {query_features}"
    )


def _emit(result: Any, as_json: bool, per_query: str | None) -> None:
    if per_query is not None:
        from oxbench.formats.revisitop import atomic_write_bytes
        from oxbench.report.tables import csv_text

        atomic_write_bytes(Path(per_query), csv_text(result.per_query_rows()).encode())
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    for line in result.lines():
        click.echo(line)
    click.echo("")
    click.echo(result.table())


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--per-query", type=click.Path(dir_okay=False), help="Also write per-query AP/P@K as CSV.")(f)
    f = click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)(f)
    f = click.option("--ks", default="1,5,10", show_default=True, help=_KS_HELP)(f)
    return f


def _inputs(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--query-features", type=click.Path(), help="Query descriptors .npy [n_queries, d].")(f)
    f = click.option(
        "--db-features", type=click.Path(), help="Database descriptors .npy [n_db (+ distractors), d]; dot product."
    )(f)
    f = click.option("--scores", type=click.Path(), help="Similarities .npy [n_db (+ distractors), n_queries].")(f)
    f = click.option(
        "--ranks", type=click.Path(), help="Ranks .npy, revisitop layout: rows = ranked positions, columns = queries."
    )(f)
    f = click.option(
        "--distractors",
        "n_distractors",
        default=0,
        show_default=True,
        type=int,
        help="Admit indices n_db .. n_db+N-1 as distractors (R1M: 1001001).",
    )(f)
    f = click.option("--root", type=click.Path(), help="Data root for --dataset.")(f)
    f = click.option("--dataset", help="Take the ground truth of an installed dataset instead of --gnd.")(f)
    return f


@click.group("evaluate")
def evaluate() -> None:
    """Score a ranking with an official protocol (revisited, oxford, holidays, ukbench)."""


@evaluate.command("revisited")
@click.option("--gnd", type=click.Path(), help="Revisited ground truth, e.g. gnd_roxford5k.pkl.")
@_inputs
@_common
def revisited(
    gnd: str | None,
    dataset: str | None,
    root: str | None,
    n_distractors: int,
    ranks: str | None,
    scores: str | None,
    db_features: str | None,
    query_features: str | None,
    ks: str,
    as_json: bool,
    per_query: str | None,
) -> None:
    """Revisited Oxford/Paris: mAP and mP@K for the Easy, Medium and Hard setups (revisitop's
    compute_map, exactly)."""
    k = _parse_ks(ks)
    gt = _load_gt(gnd, dataset, root, "revisited")
    result = _score(
        gt, ranks=ranks, scores=scores, db_features=db_features, query_features=query_features,
        n_distractors=n_distractors, ks=k,
    )
    _emit(result, as_json, per_query)


@evaluate.command("oxford")
@click.option("--gt-dir", type=click.Path(), help="Original ground-truth folder (gt_files_170407, paris_120310).")
@click.option("--ranked-dir", type=click.Path(), help="Folder of <query>.txt ranked lists (one image name per line).")
@click.option("--gnd", type=click.Path(), help="Old-protocol pickle (gnd_oxford5k.pkl, gnd_paris6k.pkl).")
@_inputs
@_common
def oxford(
    gt_dir: str | None,
    ranked_dir: str | None,
    gnd: str | None,
    dataset: str | None,
    root: str | None,
    n_distractors: int,
    ranks: str | None,
    scores: str | None,
    db_features: str | None,
    query_features: str | None,
    ks: str,
    as_json: bool,
    per_query: str | None,
) -> None:
    """Original Oxford 5K / Paris 6K: good+ok positive, junk ignored (compute_ap.cpp). Works for the
    Paris files too."""
    k = _parse_ks(ks)
    if gt_dir is not None or ranked_dir is not None:
        if gt_dir is None or ranked_dir is None:
            raise InputError("--gt-dir and --ranked-dir go together")
        if any(v is not None for v in (gnd, dataset, ranks, scores, db_features, query_features)):
            raise InputError("--gt-dir/--ranked-dir cannot be combined with --gnd, --dataset or array inputs")
        from oxbench.evaluation import evaluate as evaluate_ranks
        from oxbench.formats.oxford_gt import read_gt_dir, read_ranked_dir

        gt = read_gt_dir(gt_dir)
        gt2, internal = read_ranked_dir(ranked_dir, gt)
        result = evaluate_ranks(gt2, internal, ks=k, n_distractors=n_distractors, source=str(ranked_dir))
    else:
        gt = _load_gt(gnd, dataset, root, "original")
        result = _score(
            gt, ranks=ranks, scores=scores, db_features=db_features, query_features=query_features,
            n_distractors=n_distractors, ks=k,
        )
    _emit(result, as_json, per_query)


@evaluate.command("holidays")
@click.option("--results", required=True, type=click.Path(), help="Result file: 'query.jpg r0 name0 r1 name1 ...'.")
@click.option(
    "--images", type=click.Path(), help="holidays_images.dat (default: the installed holidays dataset)."
)
@click.option("--root", type=click.Path(), help="Data root of the installed dataset.")
@_common
def holidays(
    results: str, images: str | None, root: str | None, ks: str, as_json: bool, per_query: str | None
) -> None:
    """INRIA Holidays: the query image is ignored, written rank numbers count (holidays_map.py)."""
    from oxbench.evaluation import evaluate as evaluate_ranks
    from oxbench.formats.holidays import read_ground_truth, read_results

    k = _parse_ks(ks)
    if images is not None:
        gt = read_ground_truth(images)
    else:
        from oxbench.datasets import load_ground_truth

        gt = load_ground_truth("holidays", root)
    internal = read_results(results, gt)
    _emit(evaluate_ranks(gt, internal, ks=k, source=results), as_json, per_query)


@evaluate.command("ukbench")
@click.option(
    "--ranks", type=click.Path(), help="Ranks .npy: >= 4 rows (ranked positions), one column per image."
)
@click.option("--scores", type=click.Path(), help="Similarities .npy [n_images, n_images].")
@_common
def ukbench(ranks: str | None, scores: str | None, ks: str, as_json: bool, per_query: str | None) -> None:
    """UKBench: N-S score = mean number of the object's 4 images in the top 4 (query i = image i)."""
    from oxbench.evaluation import evaluate as evaluate_ranks
    from oxbench.evaluation import evaluate_scores, from_revisitop
    from oxbench.formats.ukbench import ukbench_ground_truth

    k = _parse_ks(ks)
    if (ranks is None) == (scores is None):
        raise InputError("give exactly one of --ranks or --scores")
    path = ranks if ranks is not None else scores
    assert path is not None
    arr = _load_npy(path, "ranks" if ranks is not None else "scores")
    if arr.ndim != 2:
        raise InputError(f"expected a 2-D array, got shape {arr.shape}", path)
    if ranks is not None and arr.shape[0] < 4:
        raise InputError(f"UKBench needs at least the top 4 of each list (rows), got {arr.shape[0]}", path)
    try:
        gt = ukbench_ground_truth(int(arr.shape[1]))
    except InputError as exc:
        raise InputError(f"{arr.shape[1]} columns (images): {exc.problem}", path) from None
    if ranks is not None:
        result = evaluate_ranks(gt, from_revisitop(arr), ks=k, source=path)
    else:
        result = evaluate_scores(gt, arr, ks=k, source=path)
    _emit(result, as_json, per_query)
