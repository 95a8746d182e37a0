"""The vocabulary-size curve: mAP and query time of bag of words against the number of words.

    python bench/vocab_curve.py [--root DIR] [--sizes 1024,4096,16384,65536]
        [--methods rootsift-bow,rootsift-bow-sv] [--vocabularies other,test]
        [--test synthetic] [--other synthetic-train] [--allow-partial]
        [--two-level-from 16384] [--distractors N] [--set [METHOD:]KEY=VALUE ...] [--workers 2]
        [--json vocab.json] [--plot vocab.png]
    python bench/vocab_curve.py --redraw vocab.json --plot vocab.png

Philbin et al. 2007 measured mAP against the vocabulary size (0.618 at 1M words on Oxford), and
2008 the cost of a vocabulary trained on the other city. This runs each method through
``oxbench.run`` on the ``--test`` benchmark (default: the synthetic one) at each size, with the
vocabulary trained on the ``--other`` city (default ``synthetic-train``, the comparable setting)
and on the test city itself (the run is flagged ``trained_on_test_set``, as the 2007 tables were),
flat k-means below ``--two-level-from`` words and two-level (coarse cells, fine words per cell,
approximate assignment) from there. The real subset laid out by ``subset_layout.py`` runs as
``--root SUBROOT/roxford5k --test roxford5k --other rparis6k --allow-partial``. For every run:
mAP Easy / Medium / Hard, query time (ranking + re-ranking per query, from the run's timings, as
``scale_curve.py``) and the CPU seconds of training the vocabulary.

Before any run the training set's features are described and counted: a size larger than the
training descriptors is one line and exit 2 (k-means cannot make more words than points), as is a
``--test`` or ``--other`` that is not a catalog id, or the same id for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from oxbench.pipelines import RecordOptions, Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_curve import query_seconds  # noqa: E402 - the same query time as the scale curve

#: The vocabulary sources: the other city's training set (``--other``) or the test set itself.
SOURCES = ("other", "test")


def sizes_arg(text: str) -> list[int]:
    """An argparse type: comma-separated vocabulary sizes, each 2 .. 16M, ascending, unique."""
    try:
        values = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated sizes, got {text!r}") from None
    if not values or values[0] < 2 or values[-1] > 1 << 24:
        raise argparse.ArgumentTypeError(f"sizes must be 2 .. {1 << 24:,}, got {text!r}")
    return values


def training_descriptors(
    root: Path | None, cache: Path | None, method: Any, train_id: str, *, strict: bool = True
) -> int:
    """How many descriptors ``train_id``'s database gives ``method``'s vocabulary (its features
    described first when missing, as a run would; ``strict``: official image counts enforced)."""
    from oxbench.datasets import load
    from oxbench.datasets.paths import data_root
    from oxbench.features.local import training_extractor
    from oxbench.pipelines.method import RunContext
    from oxbench.pipelines.steps.keys import part_names
    from oxbench.pipelines.steps.local import open_store, step_features

    root_path = data_root(root)
    train = load(train_id, root_path, strict=strict, progress=False)
    extractor = training_extractor(method.features)
    ctx = RunContext(cache or root_path / "_cache", progress=False)
    step_features(train, extractor, ctx, parts=["database"])
    store = open_store(ctx.cache, train, extractor, "database")
    return sum(store.count(n) for n in part_names(train, "database"))


def check_datasets(test: str, other: str) -> str | None:
    """The one-line refusal of a ``--test`` / ``--other`` that is not a catalog id, or of the
    same id for both (the other city's vocabulary would be the test city's), or ``None``."""
    from oxbench.datasets.catalog import get_spec
    from oxbench.errors import InputError

    for option, dataset_id in (("--test", test), ("--other", other)):
        try:
            get_spec(dataset_id)
        except InputError as exc:
            return f"vocab_curve.py: {option}: {exc}"
    if test == other:
        return (
            f"vocab_curve.py: --other must name another dataset than --test ({test}); "
            "the test city's own vocabulary is --vocabularies test"
        )
    return None


def check_sizes(args: argparse.Namespace, methods: list[str]) -> str | None:
    """The one-line refusal of a size larger than a training set's descriptors, or ``None``;
    each source's count is kept in ``args.train_counts`` (recorded with every point)."""
    from oxbench.pipelines.presets import resolve_method

    args.train_counts = {}
    for source in args.vocabularies:
        m = resolve_method(methods[0], **args.overrides.get(methods[0], {}))
        train_id = args.sources[source]
        n = training_descriptors(args.root, args.cache, m, train_id, strict=not args.allow_partial)
        args.train_counts[source] = n
        if args.sizes[-1] > n:
            return (
                f"vocab_curve.py: a vocabulary of {args.sizes[-1]:,} words is larger than the "
                f"{n:,} training descriptors of {train_id} ({source} city)"
            )
    return None


def one_point(method: str, size: int, source: str, args: argparse.Namespace) -> dict[str, Any]:
    import oxbench

    structure = "two-level" if size >= args.two_level_from else "flat"
    overrides = {
        **args.overrides.get(method, {}),
        "vocabulary.size": size,
        "vocabulary.structure": structure,
    }
    t0 = time.perf_counter()
    outcome = oxbench.run(
        args.sources["test"],
        method,
        train_dataset=args.sources[source],
        distractors=args.distractors or None,
        overrides=overrides,
        session=Session(
            root=args.root,
            cache=args.cache,
            workers=args.workers,
            progress=False,
            strict=not args.allow_partial,
        ),
        record=RecordOptions(runs_dir=args.runs),
    )
    res, timings = outcome.result, dict(outcome.timings)
    return {
        "method": method,
        "dataset": args.sources["test"],
        "train_dataset": args.sources[source],
        "train_descriptors": args.train_counts[source],
        "vocabulary.size": size,
        "structure": structure,
        "vocabulary": source,
        "trained_on_test_set": bool(outcome.info.get("trained_on_test_set")),
        "n_index": outcome.record["footprint"]["n_index"],
        "map": {s: 100 * res.setups[s].map for s in ("easy", "medium", "hard")},
        **query_seconds(timings, len(res.setups["medium"].ap)),
        "vocabulary_cpu_s": timings.get("vocabulary_cpu", 0.0),
        "run_cpu_s": timings.get("total_cpu", 0.0),
        "run_wall_s": time.perf_counter() - t0,
        "run_dir": str(outcome.run_dir),
    }


def table(points: list[dict[str, Any]]) -> str:
    rows = [
        "| method | vocabulary from | words | structure | mAP E | mAP M | mAP H | "
        "query ms (rank + rerank) | vocabulary CPU s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        m = p["map"]
        rows.append(
            f"| {p['method']} | {p['train_dataset']} ({p['vocabulary']} city) | "
            f"{p['vocabulary.size']:,} | {p['structure']} | {m['easy']:.2f} | {m['medium']:.2f} | "
            f"{m['hard']:.2f} | {1e3 * p['query_s']:.1f} ({1e3 * p['rank_s']:.2f} + "
            f"{1e3 * p['rerank_s']:.1f}) | {p['vocabulary_cpu_s']:.0f} |"
        )
    return "\n".join(rows)


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """mAP (Easy, Medium, Hard) and query time against the vocabulary size, log x; one colour per
    method, vocabulary source and number of training descriptors (when the points record it: a
    larger training set of the same city is its own line)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_map, ax_time = fig.subplots(1, 2)

    def key(p: dict[str, Any]) -> tuple[str, str, int | None]:
        return p["method"], p["vocabulary"], p.get("train_descriptors")

    series = dict.fromkeys(key(p) for p in points)
    for i, (method, source, n_train) in enumerate(series):
        pts = sorted(
            (p for p in points if key(p) == (method, source, n_train)),
            key=lambda p: p["vocabulary.size"],
        )
        xs = [p["vocabulary.size"] for p in pts]
        colour = f"C{i}"
        label = f"{method}, {source} city"
        if n_train is not None:
            label += f" ({n_train / 1e6:.2g}M descr.)"
        for setup, style in (("easy", ":"), ("medium", "-"), ("hard", "--")):
            ax_map.plot(
                xs,
                [p["map"][setup] for p in pts],
                style,
                marker="o",
                color=colour,
                label=f"{label} ({setup[0].upper()})",
            )
        ax_time.plot(xs, [1e3 * p["query_s"] for p in pts], "o-", color=colour, label=label)
    for ax, ylabel in ((ax_map, "mAP (%)"), (ax_time, "query time, ms (rank + re-rank)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("visual words")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_time.set_yscale("log")
    fig.legend(*ax_map.get_legend_handles_labels(), loc="outside lower center", ncol=3, fontsize=7)
    test_sets = ", ".join(dict.fromkeys(p.get("dataset", "synthetic") for p in points))
    fig.suptitle(f"{test_sets}: mAP and query time against the vocabulary size")
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=None, help="data root")
    ap.add_argument("--cache", type=Path, default=None, help="cache (default: <root>/_cache)")
    ap.add_argument("--runs", default="runs", help="parent of the run folders")
    ap.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1024,4096,16384,65536"))
    ap.add_argument("--methods", default="rootsift-bow,rootsift-bow-sv")
    ap.add_argument(
        "--vocabularies",
        default="other,test",
        help="other (the --other city) and/or test (the --test set itself), comma-separated",
    )
    ap.add_argument("--test", default="synthetic", help="the benchmark run (a catalog id)")
    ap.add_argument(
        "--other", default="synthetic-train", help="the other city, the vocabulary's training set"
    )
    ap.add_argument(
        "--allow-partial",
        action="store_true",
        help="accept image counts other than the official ones (the real subset)",
    )
    ap.add_argument(
        "--two-level-from", type=int, default=16384, help="two-level k-means from this size"
    )
    ap.add_argument("--distractors", type=int, default=0, help="generated distractors (0: none)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--set", dest="settings", action="append", default=[])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--redraw", type=Path, default=None, help="plot from this --json; run nothing")
    args = ap.parse_args(argv)
    if args.redraw is not None:
        if args.plot is None:
            ap.error("--redraw draws the figure: give --plot PATH")
        plot(json.loads(args.redraw.read_text())["points"], args.plot)
        return 0
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.vocabularies = [v.strip() for v in args.vocabularies.split(",") if v.strip()]
    bad = [v for v in args.vocabularies if v not in SOURCES]
    if bad or not args.vocabularies:
        ap.error(f"--vocabularies: use other and/or test, got {bad or 'none'}")
    refusal = check_datasets(args.test, args.other)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    args.sources = {"other": args.other, "test": args.test}
    args.overrides = {m: {} for m in methods}
    for text in args.settings:
        key, _, value = text.partition("=")
        target, _, key = key.rpartition(":")
        for m in [target] if target else methods:
            args.overrides.setdefault(m, {})[key] = value
    refusal = check_sizes(args, methods)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    points: list[dict[str, Any]] = []
    for source in args.vocabularies:
        for size in args.sizes:
            for method in methods:
                p = one_point(method, size, source, args)
                points.append(p)
                print(
                    f"{method} {size:,} words ({source} city): mAP E {p['map']['easy']:.2f} "
                    f"M {p['map']['medium']:.2f} H {p['map']['hard']:.2f}, "
                    f"query {1e3 * p['query_s']:.1f} ms",
                    flush=True,
                )
                if args.json is not None:
                    args.json.write_text(json.dumps({"points": points}, indent=1))
    print(table(points))
    if args.plot is not None:
        plot(points, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
