"""``oxbench evaluate``: score a ranking with an official protocol (a thin layer over the library).

Subcommands (JSON numbers are fractions at full precision; without ``--json`` the familiar lines
and a table are printed)::

    oxbench evaluate revisited --gnd GND.pkl --ranks RANKS [--distractors N] [--ks 1,5,10] [--json]
        (or --scores S, or --db-features X --query-features Q [--layout d-n] [--normalize];
        --dataset ID [--root DIR] instead of --gnd)
    oxbench evaluate oxford --gt-dir DIR --ranked-dir DIR [--json]
    oxbench evaluate oxford --gnd gnd_oxford5k.pkl --ranks RANKS [--json]
    oxbench evaluate holidays --results FILE [--images holidays_images.dat] [--ks 1,5,10] [--json]
    oxbench evaluate ukbench --ranks RANKS [--ks 4] [--json]
    oxbench evaluate gldv2 --solution retrieval_solution_v2.1.csv --predictions submission.csv [--json]
        (or --ranks R --query-names Q --index-names I)
    oxbench evaluate ilias --gt DIR --similarities FILE.json|.pkl [--k 1000] [--taxonomy F] [--json]
    oxbench evaluate localization RUN_DIR [--root DIR] [--json]

Inputs are read by :mod:`oxbench.formats.arrays`: ``.npy``, ``.npz`` and MATLAB ``.mat`` (``--key``
picks an array), texmex ``.fvecs/.bvecs`` features and ``.ivecs`` ranks, text rank files (one query
per line). Ranks in array files are in the revisitop layout: rows = ranked positions (possibly
truncated), columns = queries. Bad input exits with code 2 and one line naming the file, query and
problem. The metrics are computed and printed before any file is written, so a failed write loses
nothing that was asked for; nothing is written on bad input.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import click

from oxbench.errors import InputError

_CAPPED = (
    "capped mP@K: revisitop's P@K, whose denominator is min(K, rank of the last retrieved positive), "
    "so 3 positives at ranks 1-3 give 1.0 at K=10 (not plain P@K)"
)
_KS_HELP = f"Comma-separated K of the {_CAPPED}.  [default: 1,5,10]"
_KS_OPT_HELP = f"Also report the {_CAPPED}, at these comma-separated K. Off by default."
_JSON_HELP = "Print JSON (fractions at full precision) instead of lines and a table."
_PADDING_HELP = (
    "Accept this value as padding at the end of short ranked lists (only -1, as FAISS writes where "
    "fewer than k results exist); recorded in the result. Without it negative indices are refused."
)


def _parse_ks(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        ks = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise InputError(f"--ks must be comma-separated positive integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise InputError(f"--ks must be distinct positive integers, got {text!r}")
    return ks


def _load_gt(gnd: str | None, dataset: str | None, root: str | None, command: str) -> Any:
    """The ground truth of --gnd or --dataset, refused when another subcommand scores its protocol."""
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
    if gt.protocol.command != command:
        raise InputError(
            f"this is {gt.protocol}-protocol ground truth; use 'oxbench evaluate {gt.protocol.command}'",
            gnd or dataset,
        )
    return gt


def _read_rank_file(
    path: str, key: str | None, padding: int | None, n_queries: int
) -> tuple[Any, int | None]:
    """Ranks in the internal layout, and the padding to evaluate them with."""
    from oxbench.formats.arrays import read_ranks

    if not Path(path).exists():
        raise InputError("ranks file not found", path)
    ranks = read_ranks(path, key=key, padding=padding)
    if ranks.shape[0] != n_queries:
        if Path(path).suffix.lower() in (".txt", ".ivecs"):
            raise InputError(
                f"ranks hold {ranks.shape[0]} lists (one query a line/record) but the ground truth has "
                f"{n_queries} queries",
                path,
            )
        hint = "; this one looks transposed: save its transpose (FAISS's I [n_queries, k] as I.T)"
        raise InputError(
            f"ranks have {ranks.shape[0]} columns but the ground truth has {n_queries} queries (revisitop "
            f"layout: rows = ranked positions, columns = queries{hint if ranks.shape[1] == n_queries else ''})",
            path,
        )
    if (
        Path(path).suffix.lower() == ".txt"
        and padding is None
        and ranks.size
        and int(ranks.min()) == -1
    ):
        padding = -1  # lines of different lengths: the reader padded them
    return ranks, padding


def _report_coverage(path: str, ranks: Any, n_index: int) -> None:
    """Say once on stderr when the lists are shorter than the collection they rank."""
    if ranks.shape[1] < n_index:
        click.echo(f"{path}: ranks cover top {ranks.shape[1]:,} of {n_index:,} images", err=True)


def _features(
    gt: Any,
    db_features: str,
    query_features: str,
    *,
    key: str | None,
    query_key: str | None,
    layout: str,
    normalize: bool,
    n_distractors: int,
) -> tuple[Any, Any]:
    """Read both descriptor files and check their orientation against each other and the ground truth."""
    from oxbench.formats.arrays import Layout, read_features

    other = "n-d" if layout == "d-n" else "d-n"
    lay = cast(Layout, layout)
    x = read_features(db_features, layout=lay, key=key, normalize=normalize)
    q = read_features(
        query_features,
        layout=lay,
        key=query_key if query_key is not None else key,
        normalize=normalize,
    )
    n_index = gt.n_db + n_distractors
    if x.shape[0] != n_index and x.shape[1] == n_index:
        raise InputError(
            f"read as --layout {layout}, the database features are {x.shape[0]} vectors of dimension "
            f"{x.shape[1]}, but the database has {n_index:,} images: the file is transposed, use --layout {other}",
            db_features,
        )
    if q.shape[0] != gt.n_queries and q.shape[1] == gt.n_queries:
        raise InputError(
            f"read as --layout {layout}, the query features are {q.shape[0]} vectors of dimension {q.shape[1]}, "
            f"but there are {gt.n_queries} queries: the file is transposed, use --layout {other}",
            query_features,
        )
    if q.shape[1] != x.shape[1]:
        raise InputError(
            f"query features have dimension {q.shape[1]} but database features {x.shape[1]} ({db_features}); "
            f"if one file is stored the other way round, transpose it",
            query_features,
        )
    return q, x


def _warn_not_unit_norm(path: str, features: Any) -> None:
    """One line on stderr when descriptors are not unit vectors: ranking by their dot product is then
    not ranking by cosine similarity, which global descriptors are compared by."""
    import numpy as np

    if not features.size:
        return
    norms = np.sqrt(np.einsum("ij,ij->i", features, features, dtype=np.float64))
    lo, hi = float(norms.min()), float(norms.max())
    if lo < 1 - 1e-3 or hi > 1 + 1e-3:
        click.echo(
            f"{path}: warning: the features are not unit-norm (norms {lo:.3g} .. {hi:.3g}); they are "
            "scored by their dot product as given: pass --normalize to L2-normalise them (cosine)",
            err=True,
        )


@dataclass(frozen=True)
class ScoreInputs:
    """What the array subcommands score: exactly one of ranks, scores or the two descriptor files,
    with how to read them (the options of :func:`_inputs`)."""

    ranks: str | None = None
    scores: str | None = None
    db_features: str | None = None
    query_features: str | None = None
    key: str | None = None
    query_key: str | None = None
    layout: str = "n-d"
    normalize: bool = False
    padding: int | None = None
    n_distractors: int = 0

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> ScoreInputs:
        """The click options of :func:`_inputs` (``--padding`` arrives as text)."""
        padding = options.pop("padding", None)
        return cls(padding=None if padding is None else int(padding), **options)

    def check(self) -> None:
        """One line for a combination that does not go together, before any file is read."""
        from oxbench.evaluation.protocols import MAX_DISTRACTORS

        n = self.n_distractors
        if n < 0:
            raise InputError(f"--distractors must be >= 0, got {n}")
        if n > MAX_DISTRACTORS:
            raise InputError(
                f"--distractors {n} is beyond any collection (at most {MAX_DISTRACTORS:,}; R1M is 1,001,001)"
            )
        features = self.db_features is not None or self.query_features is not None
        if sum([self.ranks is not None, self.scores is not None, features]) != 1:
            raise InputError(
                "give exactly one of --ranks, --scores, or --db-features with --query-features"
            )
        if self.ranks is None and self.padding is not None:
            raise InputError("--padding applies to --ranks")
        if (self.layout != "n-d" or self.normalize) and self.db_features is None:
            raise InputError("--layout and --normalize apply to --db-features/--query-features")
        if features and (self.db_features is None or self.query_features is None):
            raise InputError("--db-features and --query-features go together")


def _score(gt: Any, inputs: ScoreInputs, ks: tuple[int, ...] | None) -> Any:
    """Score the ranks, the similarities or the descriptors ``inputs`` names against ``gt``."""
    from oxbench.evaluation import evaluate, evaluate_features, evaluate_scores

    inputs.check()
    n_distractors = inputs.n_distractors
    if inputs.ranks is not None:
        arr, pad = _read_rank_file(inputs.ranks, inputs.key, inputs.padding, gt.n_queries)
        result = evaluate(
            gt, arr, ks=ks, n_distractors=n_distractors, padding=pad, source=inputs.ranks
        )
        _report_coverage(inputs.ranks, arr, gt.n_db + n_distractors)
        return result
    if inputs.scores is not None:
        from oxbench.formats.arrays import read_matrix

        if not Path(inputs.scores).exists():
            raise InputError("scores file not found", inputs.scores)
        matrix = read_matrix(inputs.scores, key=inputs.key)
        return evaluate_scores(gt, matrix, ks=ks, n_distractors=n_distractors, source=inputs.scores)
    db_features, query_features = inputs.db_features, inputs.query_features
    assert db_features is not None and query_features is not None  # check() saw to it
    q, x = _features(
        gt,
        db_features,
        query_features,
        key=inputs.key,
        query_key=inputs.query_key,
        layout=inputs.layout,
        normalize=inputs.normalize,
        n_distractors=n_distractors,
    )
    result = evaluate_features(
        gt, q, x, ks=ks, n_distractors=n_distractors, source=f"{db_features}, {query_features}"
    )
    if not inputs.normalize:  # after scoring: a refusal stays one line
        _warn_not_unit_norm(db_features, x)
        _warn_not_unit_norm(query_features, q)
    return result


def _check_output(per_query: str | None) -> None:
    """Refuse a --per-query path that cannot be written (a link, FIFO, device, folder) before any work."""
    if per_query is not None:
        from oxbench.fileio import check_output_path

        check_output_path(per_query)


def _emit(result: Any, as_json: bool, per_query: str | None, also: Any = ()) -> None:
    """Print the metrics (then any cross-protocol view, apart from the official numbers), then
    write the per-query CSV (a failed write loses nothing printed)."""
    if as_json:
        payload = result.to_dict()
        if also:
            payload["also"] = {
                v.name: {"setups": {s: m for s, m in v.means.items()}, "note": v.note} for v in also
            }
        click.echo(json.dumps(payload))
    else:
        for line in result.lines():
            click.echo(line)
        click.echo("")
        from oxbench.report.tables import result_table

        click.echo(result_table(result))
        for v in also:
            letters = result.protocol.letters
            values = ", ".join(f"{letters.get(s, s)}: {100 * m:.2f}" for s, m in v.means.items())
            click.echo("")
            click.echo(f"{result.dataset}: {v.name} (not official) {values}")
            click.echo(f"note: {v.note}")
    if per_query is not None:
        from oxbench.fileio import atomic_write_text
        from oxbench.report.tables import csv_text

        atomic_write_text(per_query, csv_text(result.per_query_rows()))


def _common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--per-query", type=click.Path(), help="Also write per-query AP/P@K as CSV.")(
        f
    )
    f = click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)(f)
    return f


def _ks_option(help_text: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option("--ks", default=None, help=help_text)


def _key_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--padding", type=click.Choice(["-1"]), default=None, help=_PADDING_HELP)(f)
    f = click.option(
        "--key",
        help="Name of the array inside an .npz or .mat file holding several (revisitop .mat: X).",
    )(f)
    return f


def _inputs(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--normalize",
        is_flag=True,
        help="L2-normalise the descriptors first. Off by default: cosine similarity needs it.",
    )(f)
    f = click.option(
        "--layout",
        type=click.Choice(["n-d", "d-n"]),
        default="n-d",
        show_default=True,
        help="Descriptor files: n-d = one vector a row (numpy, FAISS, .fvecs); d-n = one a column "
        "(revisitop's .mat X and Q).",
    )(f)
    f = click.option(
        "--query-key",
        help="Name of the query array in the --query-features file (default: --key; revisitop .mat: Q).",
    )(f)
    f = click.option(
        "--query-features",
        type=click.Path(),
        help="Query descriptors [n_queries, d]: .npy .npz .mat .fvecs .bvecs.",
    )(f)
    f = click.option(
        "--db-features",
        type=click.Path(),
        help="Database descriptors [n_db (+ distractors), d] (.npy .npz .mat .fvecs .bvecs); dot product.",
    )(f)
    f = click.option(
        "--scores",
        type=click.Path(),
        help="Similarities [n_db (+ distractors), n_queries]: .npy .npz .mat.",
    )(f)
    f = click.option(
        "--ranks",
        type=click.Path(),
        help="Ranks: .npy/.npz/.mat in the revisitop layout (rows = ranked positions, columns = queries), "
        ".ivecs or text (one query per line).",
    )(f)
    f = _key_options(f)
    f = click.option(
        "--distractors",
        "n_distractors",
        default=0,
        show_default=True,
        type=int,
        help="Admit indices n_db .. n_db+N-1 as distractors (R1M: 1001001).",
    )(f)
    f = click.option("--root", type=click.Path(), help="Data root for --dataset.")(f)
    f = click.option(
        "--dataset", help="Take the ground truth of an installed dataset instead of --gnd."
    )(f)
    return f


@click.group("evaluate")
def evaluate() -> None:
    """Score a ranking with an official protocol (revisited, oxford, holidays, ukbench, gldv2, ilias), or a run's boxes (localization)."""


@evaluate.command("revisited")
@click.option("--gnd", type=click.Path(), help="Revisited ground truth, e.g. gnd_roxford5k.pkl.")
@_inputs
@_ks_option(_KS_HELP)
@click.option(
    "--also",
    "views",
    multiple=True,
    help="Also print another toolkit's number on the same --ranks, beside (never in) the official "
    "line: map@K (MIEB/MTEB's map_cut, e.g. map@5). Repeatable.",
)
@_common
def revisited(
    gnd: str | None,
    dataset: str | None,
    root: str | None,
    ks: str | None,
    views: tuple[str, ...],
    as_json: bool,
    per_query: str | None,
    **inputs: Any,
) -> None:
    """Revisited Oxford/Paris: mAP and capped mP@K for the Easy, Medium and Hard setups (revisitop's
    compute_map, exactly)."""
    from oxbench.evaluation.views import parse_view

    k = _parse_ks(ks)
    asked = [parse_view(v) for v in views]
    if asked and inputs["ranks"] is None:
        raise InputError("--also scores --ranks (the ranked lists the views read)")
    _check_output(per_query)
    gt = _load_gt(gnd, dataset, root, "revisited")
    args = ScoreInputs.from_options(inputs)
    result = _score(gt, args, k)
    also = []
    if asked:
        from oxbench.evaluation.views import map_at_k

        assert args.ranks is not None  # --also was refused without --ranks
        arr, pad = _read_rank_file(args.ranks, args.key, args.padding, gt.n_queries)
        for _, cutoff in asked:
            also.append(
                map_at_k(
                    gt,
                    arr,
                    cutoff,
                    n_distractors=args.n_distractors,
                    padding=pad,
                    source=args.ranks,
                )
            )
    _emit(result, as_json, per_query, also)


@evaluate.command("oxford")
@click.option(
    "--gt-dir",
    type=click.Path(),
    help="Original ground-truth folder (gt_files_170407, paris_120310).",
)
@click.option(
    "--ranked-dir",
    type=click.Path(),
    help="Folder of <query>.txt ranked lists (one image name per line).",
)
@click.option(
    "--gnd", type=click.Path(), help="Old-protocol pickle (gnd_oxford5k.pkl, gnd_paris6k.pkl)."
)
@_inputs
@_ks_option(_KS_HELP)
@_common
def oxford(
    gt_dir: str | None,
    ranked_dir: str | None,
    gnd: str | None,
    dataset: str | None,
    root: str | None,
    ks: str | None,
    as_json: bool,
    per_query: str | None,
    **inputs: Any,
) -> None:
    """Original Oxford 5K / Paris 6K: good+ok positive, junk ignored (compute_ap.cpp). Works for the
    Paris files too. Per-query results are keyed by the query id (all_souls_1).

    Ranked lists of image names (--ranked-dir) are scored against --gt-dir, or against an installed
    --dataset (oxford5k, paris6k), whose images are the database: then the lists' coverage of it is
    reported (the gt files alone name only the images they label)."""
    k = _parse_ks(ks)
    _check_output(per_query)
    args = ScoreInputs.from_options(inputs)
    if gt_dir is not None or ranked_dir is not None:
        if ranked_dir is None or (gt_dir is None and dataset is None):
            raise InputError(
                "--ranked-dir goes with --gt-dir or --dataset (whose gt files and images it reads)"
            )
        arrays = ("ranks", "scores", "db_features", "query_features")
        if gnd is not None or any(getattr(args, a) is not None for a in arrays):
            raise InputError("--gt-dir/--ranked-dir cannot be combined with --gnd or array inputs")
        from oxbench.evaluation import evaluate as evaluate_ranks
        from oxbench.formats.oxford_gt import read_gt_dir, read_ranked_dir

        if (
            dataset is not None
        ):  # the database is the dataset's images, not the names the gt files cite
            gt = _load_gt(None, dataset, root, "oxford")
            if gt_dir is not None:
                gt = read_gt_dir(gt_dir, db_names=gt.db_names, dataset=gt.dataset)
        else:
            assert gt_dir is not None
            gt = read_gt_dir(gt_dir)
        gt2, internal = read_ranked_dir(ranked_dir, gt)  # shorter lists are padded with -1
        n_distractors = args.n_distractors
        result = evaluate_ranks(
            gt2, internal, ks=k, n_distractors=n_distractors, padding=-1, source=str(ranked_dir)
        )
        if (
            dataset is not None
        ):  # the gt files alone name only some images: no database size to compare with
            _report_coverage(ranked_dir, internal, gt2.n_db + n_distractors)
    else:
        gt = _load_gt(gnd, dataset, root, "oxford")
        result = _score(gt, args, k)
    _emit(result, as_json, per_query)


@evaluate.command("holidays")
@click.option(
    "--results",
    required=True,
    type=click.Path(),
    help="Result file: 'query.jpg r0 name0 r1 name1 ...'.",
)
@click.option(
    "--images",
    type=click.Path(),
    help="holidays_images.dat (default: the installed holidays dataset).",
)
@click.option("--root", type=click.Path(), help="Data root of the installed dataset.")
@_ks_option(_KS_OPT_HELP)
@_common
def holidays(
    results: str,
    images: str | None,
    root: str | None,
    ks: str | None,
    as_json: bool,
    per_query: str | None,
) -> None:
    """INRIA Holidays: mAP; the query image is ignored, written rank numbers count (holidays_map.py)."""
    from oxbench.evaluation import evaluate as evaluate_ranks
    from oxbench.formats.holidays import read_ground_truth, read_results

    k = _parse_ks(ks)
    _check_output(per_query)
    if images is not None:
        gt = read_ground_truth(images)
    else:
        from oxbench.datasets import load_ground_truth

        gt = load_ground_truth("holidays", root)
    internal = read_results(results, gt)  # positions the file skips are -1 gaps
    _emit(evaluate_ranks(gt, internal, ks=k, gaps=True, source=results), as_json, per_query)


@evaluate.command("ukbench")
@click.option(
    "--ranks",
    type=click.Path(),
    help="Ranks: >= 4 rows (ranked positions), one column per image (.npy .npz .mat), or .ivecs / text "
    "(one image's list per line).",
)
@click.option(
    "--scores", type=click.Path(), help="Similarities [n_images, n_images]: .npy .npz .mat."
)
@_key_options
@_ks_option(_KS_OPT_HELP)
@_common
def ukbench(
    ranks: str | None,
    scores: str | None,
    key: str | None,
    padding: str | None,
    ks: str | None,
    as_json: bool,
    per_query: str | None,
) -> None:
    """UKBench: N-S score = mean number of the object's 4 images in the top 4 (query i = image i)."""
    from oxbench.evaluation import evaluate as evaluate_ranks
    from oxbench.evaluation import evaluate_scores
    from oxbench.formats.arrays import read_matrix, read_ranks
    from oxbench.formats.ukbench import ukbench_ground_truth

    k = _parse_ks(ks)
    _check_output(per_query)
    if (ranks is None) == (scores is None):
        raise InputError("give exactly one of --ranks or --scores")
    if scores is not None and padding is not None:
        raise InputError("--padding applies to --ranks")
    path = ranks if ranks is not None else scores
    assert path is not None
    if not Path(path).exists():
        raise InputError(f"{'ranks' if ranks is not None else 'scores'} file not found", path)
    pad = None if padding is None else int(padding)
    if ranks is not None:
        arr = read_ranks(path, key=key, padding=pad)  # internal layout: one row per image
        n_images = int(arr.shape[0])
        if arr.shape[1] < 4:
            raise InputError(
                f"UKBench needs at least the top 4 of each list (rows), got {arr.shape[1]}", path
            )
        if (
            Path(path).suffix.lower() == ".txt"
            and pad is None
            and arr.size
            and int(arr.min()) == -1
        ):
            pad = -1
    else:
        arr = read_matrix(path, key=key)
        if arr.ndim != 2:
            raise InputError(f"expected a 2-D array, got shape {arr.shape}", path)
        n_images = int(arr.shape[1])
    try:
        gt = ukbench_ground_truth(n_images)
    except InputError as exc:
        raise InputError(f"{n_images} columns (images): {exc.problem}", path) from None
    if ranks is not None:
        result = evaluate_ranks(gt, arr, ks=k, padding=pad, source=path)
    else:
        result = evaluate_scores(gt, arr, ks=k, source=path)
    _emit(result, as_json, per_query)


@evaluate.command("gldv2")
@click.option(
    "--solution",
    required=True,
    type=click.Path(),
    help="retrieval_solution_v2.1.csv (id,images,Usage: Public, Private or Ignored).",
)
@click.option(
    "--predictions",
    type=click.Path(),
    help="A Kaggle submission (id,images: predicted index ids, best first, space-separated).",
)
@click.option(
    "--ranks",
    type=click.Path(),
    help="Or ranks (.npy .npz .mat, revisitop layout: rows = ranked positions, columns = queries; "
    ".ivecs or text: one query a line), with --query-names and --index-names.",
)
@click.option("--query-names", type=click.Path(), help="The test image id of each ranked list.")
@click.option(
    "--index-names", type=click.Path(), help="The index image id of each database index in --ranks."
)
@_key_options
@_ks_option("Comma-separated k of mP@k (at most 100).  [default: 1,5,10,50,100]")
@_common
def gldv2(
    solution: str,
    predictions: str | None,
    ranks: str | None,
    query_names: str | None,
    index_names: str | None,
    key: str | None,
    padding: str | None,
    ks: str | None,
    as_json: bool,
    per_query: str | None,
) -> None:
    """Google Landmarks v2 retrieval: mAP@100 and mP@k of the Public and Private test images, as the
    challenge's metrics.py computes them (a repeated prediction keeps its position; a query
    without a prediction counts 0)."""
    from oxbench.evaluation.protocols.gldv2 import score_predictions
    from oxbench.formats.gldv2 import read_predictions, read_solution

    k = _parse_ks(ks)
    _check_output(per_query)
    if (predictions is None) == (ranks is None):
        raise InputError("give exactly one of --predictions or --ranks")
    if ranks is None and (query_names or index_names or key or padding):
        raise InputError("--query-names, --index-names, --key and --padding go with --ranks")
    sol = read_solution(solution)
    if predictions is not None:
        gt = sol.ground_truth()
        read = read_predictions(predictions, gt, sol.ignored)
        result = score_predictions(gt, read.order, read.predicted, ks=k)
    else:
        from oxbench.evaluation import evaluate as evaluate_ranks
        from oxbench.formats.arrays import read_names, read_ranks

        if query_names is None or index_names is None:
            raise InputError("--ranks needs --query-names and --index-names")
        assert ranks is not None
        names = read_names(query_names)
        gt = sol.ground_truth(read_names(index_names))
        arr = read_ranks(ranks, key=key, padding=None if padding is None else int(padding))
        if arr.shape[0] != len(names):
            raise InputError(
                f"ranks hold {arr.shape[0]} lists but --query-names names {len(names)}", ranks
            )
        row_of = {n: i for i, n in enumerate(names)}
        if len(row_of) != len(names):
            raise InputError("a test image is named twice", query_names)
        unknown = [n for n in names if n not in set(gt.query_names) and n not in sol.ignored]
        if unknown:
            raise InputError(f"test image {unknown[0]} is not in the solution", query_names)
        import numpy as np

        if padding is None and Path(ranks).suffix.lower() != ".txt" and arr.size and arr.min() < 0:
            q, j = (int(v) for v in np.argwhere(arr < 0)[0])
            raise InputError(
                f"test image {names[q]}: rank position {j} holds index {int(arr[q, j])}: indices "
                "are 0-based and non-negative (lists padded with -1: give --padding -1)",
                ranks,
            )
        if arr.size and int(arr.max()) >= gt.n_db:
            q, j = (int(v) for v in np.argwhere(arr >= gt.n_db)[0])
            raise InputError(
                f"test image {names[q]}: rank position {j} holds index {int(arr[q, j])}, but "
                f"--index-names names {gt.n_db:,} images (indices 0..{gt.n_db - 1})",
                ranks,
            )
        missing = [q for q in gt.query_names if q not in row_of]
        rows = [row_of.get(q, -1) for q in gt.query_names]

        full = np.full((gt.n_queries, arr.shape[1]), -1, dtype=np.int64)
        for qi, r in enumerate(rows):
            if r >= 0:
                full[qi] = arr[r]
        result = evaluate_ranks(gt, full, ks=k, padding=-1, source=ranks)
        if missing:
            click.echo(
                f"{ranks}: {len(missing)} test images of the solution have no list (they score 0)",
                err=True,
            )
    _emit(result, as_json, per_query)


@evaluate.command("ilias")
@click.option(
    "--gt",
    "gt_dir",
    required=True,
    type=click.Path(),
    help="The ILIAS folder holding image_ids/ (image_query_ids.txt, text_query_ids.txt, "
    "positive_ids.txt).",
)
@click.option(
    "--similarities",
    required=True,
    type=click.Path(),
    help="knn_search's output: .json {query: {db id: score}} or .pkl (query_ids, db_ids, sims, "
    "ranks).",
)
@click.option("--k", "k_text", default="1000", show_default=True, help="The k of mAP@k.")
@click.option(
    "--taxonomy", type=click.Path(), help="misc/taxonomy.json, for the per-category breakdown."
)
@_common
def ilias(
    gt_dir: str,
    similarities: str,
    k_text: str,
    taxonomy: str | None,
    as_json: bool,
    per_query: str | None,
) -> None:
    """ILIAS: mAP@k as ilias-vrg/ilias evaluation/src/dataset.py computes it (the top k by score,
    tied scores one threshold, AP rescaled by hits / min(k, positives)), the oracle, per scale and
    per clutter group and, with --taxonomy, per category; queries absent from the file are skipped
    and named."""
    from oxbench import schema
    from oxbench.evaluation.protocols.ilias import MAX_K, IliasScorer
    from oxbench.formats.ilias import ground_truth, read_ids, read_similarities, read_taxonomy

    k = schema.Int(lo=1, hi=MAX_K).parse("k", k_text, what="option")
    _check_output(per_query)
    tax = None if taxonomy is None else read_taxonomy(taxonomy)
    gt = ground_truth(read_ids(gt_dir), taxonomy=tax)
    scorer = IliasScorer(gt, k)
    for q, ids, scores in read_similarities(similarities, gt):
        scorer.add(q, ids, scores)
    _emit(scorer.result(source=similarities), as_json, per_query)


@evaluate.command("localization")
@click.argument("run_dir", type=click.Path())
@click.option(
    "--root", type=click.Path(), help="Data root of the run's dataset (default $OXBENCH_DATA)."
)
@click.option("--json", "as_json", is_flag=True, help=_JSON_HELP)
def localization(run_dir: str, root: str | None, as_json: bool) -> None:
    """Localisation of a run: its predicted boxes (boxes.json) scored by IoU.

    For each query, the box predicted in each positive image where the ground truth knows where the
    object lies (the other queries' boxes of the same landmark, Tolias et al. 2016; on the synthetic
    set every positive image's), IoU against that box; a pair without a predicted box scores 0;
    each query's mean, then the mean over queries (mIoU), and the share of pairs with IoU >= 0.5.
    """
    from oxbench.datasets.localization import localization_truth
    from oxbench.evaluation.localization import evaluate_localization
    from oxbench.pipelines.steps import gt_digest
    from oxbench.records import RunRecord

    run = RunRecord.load(run_dir)
    found = run.boxes()
    if found is None:
        raise InputError(
            "the run predicted no boxes (no boxes.json; methods with spatial verification write it)",
            run_dir,
        )
    predictor, boxes = found
    strict = run.config.get("strict", True) is not False
    truth = localization_truth(run.dataset_id, root, strict=strict)
    from oxbench.datasets import load_ground_truth

    digest = gt_digest(load_ground_truth(run.dataset_id, root, strict=strict))
    if digest != run.dataset.get("gt_sha256"):
        raise InputError(
            f"the ground truth of {run.dataset_id} on disk is not the one the run was made on",
            run_dir,
        )
    result = evaluate_localization(truth, boxes, source=run_dir)
    if as_json:
        payload = result.to_dict()
        payload["predictor"] = predictor
        payload["run_dir"] = str(run.path)
        payload["truth"] = truth.kind
        click.echo(json.dumps(payload, indent=1, sort_keys=True))
        return
    for line in result.lines():
        click.echo(line)
    where = {
        "other queries": "the other queries' boxes (Tolias et al. 2016)",
        "generated": "boxes known by construction",
    }
    click.echo(f"predictor: {predictor}; ground truth: {where.get(truth.kind, truth.kind)}")
