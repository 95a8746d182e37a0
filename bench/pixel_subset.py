"""Benchmark fixture: the real-image ROxford/RParis subset, re-ranking each query's 20 candidates.

Not part of the installed package (``bench/real_subset.py`` and ``tests/test_pipeline_real_subset.py``
import it from here). The folder ``revisited_pixel_retrieval_subset`` of the real data holds 16
cropped queries (8 ROxford ``o*``, 8
RParis ``p*``), each with the 20 database images a retrieval system returned for it, labelled
(5 true positives -- all revisited *hard* positives -- and 15 false positives). ``manifest.tsv``
maps each (query, image) pair to its label.

:func:`load_subset_city` turns one city into a :class:`~oxbench.datasets.base.Benchmark`
(database = that city's images of the subset, queries = its crops, whole-image boxes);
:func:`rerank_candidates` ranks each query's 20 candidates with bag-of-words scores, optionally
followed by spatial re-ranking, and :func:`candidate_map` scores the result through the
evaluation engine: mAP over the queries, positives = TP, junk ignored (the original protocol's rule,
as the revisited Medium/Hard setups restricted to the 20 images).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark, FileImages
from oxbench.errors import InputError
from oxbench.evaluation import evaluate
from oxbench.execution import ProcessExecutor
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.pipelines.method import MethodConfig, RunContext

CITIES = {"roxford5k": "o", "rparis6k": "p"}


def subset_folder(data: Path | None) -> Path | None:
    """The real subset's folder in the data folder ``data``; ``None`` (saying so) when absent, so a
    bench script skips with exit 0."""
    subset = data / "revisited_pixel_retrieval_subset" if data else None
    if subset is None or not subset.is_dir():
        print(
            f"skipped: {subset or 'the subset (set OXBENCH_SHARED_DATA or pass --data)'} is absent"
        )
        return None
    return subset


@dataclass(frozen=True)
class SubsetCity:
    """One city of the subset.

    Attributes:
        bench: benchmark over the city's subset images (revisited protocol; ``hard`` = TP, ``junk``
            = Unclear; every other image unlabelled, i.e. negative).
        candidates: per query, the database indices of its 20 candidates (manifest order).
    """

    bench: Benchmark
    candidates: tuple[NDArray[np.int64], ...]


def load_subset_city(folder: str | Path, dataset: str) -> SubsetCity:
    """Read one city (``roxford5k`` or ``rparis6k``) of the pixel-retrieval subset.

    Raises:
        InputError: missing manifest / images, or an unknown city.
    """
    folder = Path(folder)
    if dataset not in CITIES:
        raise InputError(f"unknown subset city {dataset!r}; use one of {sorted(CITIES)}")
    manifest = folder / "manifest.tsv"
    if not manifest.is_file():
        raise InputError("manifest.tsv not found", folder)
    with open(manifest, newline="") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t") if r["dataset"] == dataset]
    if not rows:
        raise InputError(f"no rows for {dataset}", manifest)
    db_files = sorted({r["image_file"] for r in rows})
    db_names = tuple(Path(f).stem for f in db_files)
    index = {f: i for i, f in enumerate(db_files)}
    q_folders = sorted({r["query_folder"] for r in rows}, key=lambda q: int(q[1:]))
    queries, candidates = [], []
    for qf in q_folders:
        qrows = [r for r in rows if r["query_folder"] == qf]
        cand = np.array([index[r["image_file"]] for r in qrows], np.int64)
        hard = [index[r["image_file"]] for r in qrows if r["gnd_class"] in ("hard", "easy")]
        junk = [index[r["image_file"]] for r in qrows if r["gnd_class"] == "junk"]
        queries.append(make_query(qf, None, hard=hard, junk=junk))
        candidates.append(cand)
    gt = GroundTruth(
        dataset, "revisited", db_names, tuple(queries), source=str(manifest)
    ).validate()
    database = FileImages(db_names, tuple(folder / "db_images" / f for f in db_files))
    qimages = FileImages(
        tuple(q_folders), tuple(folder / "queries" / q / "query.jpg" for q in q_folders)
    )
    for p in (*database.paths, *qimages.paths):
        if not p.is_file():
            raise InputError("subset image missing", p)
    bench = Benchmark(
        id=f"{dataset}-pixel-subset",
        gt=gt,
        database=database,
        queries=qimages,
        protocols=("revisited",),
        root=folder,
    )
    return SubsetCity(bench, tuple(candidates))


def candidate_map(
    city: SubsetCity, ranked: list[NDArray[np.int64]]
) -> tuple[float, NDArray[np.float64]]:
    """mAP of per-query rankings of the candidates (TP positive, junk ignored), and per-query AP.

    Scored by :func:`oxbench.evaluation.evaluate` under the original protocol's rule (good = the
    hard positives, junk ignored); shorter lists are padded with -1.
    """
    gt = city.bench.gt
    old = GroundTruth(
        gt.dataset,
        "original",
        gt.db_names,
        tuple(make_query(q.name, good=q.hard, junk=q.junk) for q in gt.queries),
        gt.source,
    )
    width = max((len(r) for r in ranked), default=0)
    ranks = np.full((len(ranked), width), -1, dtype=np.int64)
    for qi, order in enumerate(ranked):
        ranks[qi, : len(order)] = order
    res = evaluate(old, ranks, ks=(), padding=-1).setups["original"]
    return res.map, res.ap


def rank_subset_city(
    city: SubsetCity,
    train: Benchmark,
    cache: Path,
    method: MethodConfig,
    *,
    workers: int = 1,
    progress: bool = False,
    root: Path | None = None,
) -> dict[str, object]:
    """Run ``method`` on the city's subset images, then rank each query's 20 candidates; score it.

    The method runs through its interface (fit on ``train``, the other city or the synthetic
    training city; index the city's subset images; search), so what is scored is exactly what a
    run does, re-ranking included: each query's full ranking restricted to its 20 candidates (with
    a short list covering the city's images, every candidate is verified). Scored as
    :func:`candidate_map`. ``root``: the data root the method runs with (where ``models:<file>``
    weights are found).

    Returns:
        ``{"map": mAP, "ap": [...], "verified": [...], "trained_on": id}``.
    """
    ctx = RunContext(Path(cache), executor=ProcessExecutor(workers), progress=progress, root=root)
    out = method.build().fit(train, ctx).index(city.bench, ctx).search(city.bench, ctx)
    ranked = [row[np.isin(row, cand)] for row, cand in zip(out.ranks, city.candidates, strict=True)]
    m, ap = candidate_map(city, ranked)
    verified = [
        int(np.isin(row[:n], cand).sum())
        for row, cand, n in zip(
            out.ranks,
            city.candidates,
            out.info.get("verified_per_query", [0] * len(ranked)),
            strict=True,
        )
    ]
    return {"map": m, "ap": ap.tolist(), "verified": verified, "trained_on": train.id}


def load_subset_all(folder: str | Path, dataset: str, gnd_root: str | Path) -> Benchmark:
    """All 280 subset images as one database, one city's queries with the full revisited labels.

    The subset's database files are named ``<dbindex>_<name>.jpg`` with their index in the city's
    revisited ``imlist``; each query keeps its Easy / Hard / Unclear labels from the full
    ``gnd_<dataset>.pkl`` (in ``gnd_root/<dataset>/``) restricted to the subset's images of that
    city (the other city's images are negatives). Scored with the revisited protocol (Medium, Hard).

    Raises:
        InputError: missing files, or a file name whose index does not name that image.
    """
    from oxbench.formats.revisitop import read_gnd

    folder = Path(folder)
    if dataset not in CITIES:
        raise InputError(f"unknown subset city {dataset!r}; use one of {sorted(CITIES)}")
    full = read_gnd(Path(gnd_root) / dataset / f"gnd_{dataset}.pkl", dataset=dataset)
    files = sorted(p.name for p in (folder / "db_images").glob("*.jpg"))
    with open(folder / "manifest.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    city_of = {r["image_file"]: r["dataset"] for r in rows}
    position = {}
    for i, f in enumerate(files):
        if city_of.get(f) != dataset:
            continue
        db_index, _, name = Path(f).stem.partition("_")
        if full.db_names[int(db_index)] != name:
            raise InputError(
                f"{f}: index {db_index} is {full.db_names[int(db_index)]!r} in the revisited list"
            )
        position[int(db_index)] = i
    q_folders = sorted(
        {r["query_folder"] for r in rows if r["dataset"] == dataset}, key=lambda q: int(q[1:])
    )
    queries = []
    for qf in q_folders:
        q = full.queries[int(qf[1:])]

        def keep(idx: NDArray[np.int64]) -> list[int]:
            return sorted(position[i] for i in idx.tolist() if i in position)

        queries.append(
            make_query(qf, None, easy=keep(q.easy), hard=keep(q.hard), junk=keep(q.junk))
        )
    names = tuple(Path(f).stem for f in files)
    gt = GroundTruth(dataset, "revisited", names, tuple(queries), source=str(folder)).validate()
    return Benchmark(
        id=f"{dataset}-pixel-subset-all",
        gt=gt,
        database=FileImages(names, tuple(folder / "db_images" / f for f in files)),
        queries=FileImages(
            tuple(q_folders), tuple(folder / "queries" / q / "query.jpg" for q in q_folders)
        ),
        protocols=("revisited",),
        root=folder,
    )


def write_layout(folder: str | Path, gnd_root: str | Path, out: str | Path) -> dict[str, Path]:
    """Lay the subset out as revisitop data roots, so that ``oxbench run`` (and ``--seeds``,
    ``compare``, ``milestones``) runs the all-280 setting with run records.

    For each city ``<out>/<city>/`` is a data root: ``<city>/`` holds the 280 subset images as
    the database and the city's 8 crops as queries (``query_<folder>``, whole-image boxes), with the
    labels of :func:`load_subset_all`; ``<other city>/`` holds the other city's subset images and
    crops (:func:`load_subset_city`), what ``--train-dataset`` defaults to, as ``real_subset.py
    --train other`` trains. Images are symbolic links to ``folder``; ground truth
    ``gnd_<city>.pkl``. Run it with ``--allow-partial`` (not the official counts).

    Returns:
        The data root of each city.
    """
    from oxbench.formats.revisitop import write_gnd
    from oxbench.imaging import open_image

    def lay(bench: Benchmark, dest: Path) -> None:
        jpg = dest / "jpg"
        jpg.mkdir(parents=True, exist_ok=True)
        queries = []
        db, qs = bench.database, bench.queries
        names = [(db.name(i), db.path(i)) for i in range(len(db))]
        for i, q in enumerate(bench.gt.queries):
            name, path = qs.name(i), qs.path(i)
            if path is None:
                raise InputError(f"query {name!r} has no image file", bench.root)
            with open_image(path) as im:
                w, h = im.size
            qname = f"query_{name}"
            names.append((qname, path))
            box = (0.0, 0.0, float(w), float(h))
            queries.append(make_query(qname, box, easy=q.easy, hard=q.hard, junk=q.junk))
        for name, file in names:
            if file is None:
                raise InputError(f"image {name!r} has no file", bench.root)
            link = jpg / f"{name}.jpg"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(Path(file).resolve())
        gt = bench.gt
        write_gnd(
            GroundTruth(gt.dataset, "revisited", gt.db_names, tuple(queries), gt.source).validate(),
            dest / f"gnd_{gt.dataset}.pkl",
        )

    roots = {}
    for city in CITIES:
        other = next(c for c in CITIES if c != city)
        root = Path(out) / city
        lay(load_subset_all(folder, city, gnd_root), root / city)
        lay(load_subset_city(folder, other).bench, root / other)
        roots[city] = root
    return roots
