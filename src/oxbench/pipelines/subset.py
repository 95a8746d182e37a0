"""The real-image ROxford/RParis subset: re-rank each query's 20 labelled candidates.

The real-data folder ``revisited_pixel_retrieval_subset`` (not part of oxbench) holds 16 cropped queries (8 ROxford ``o*``, 8
RParis ``p*``), each with the 20 database images a retrieval system returned for it, labelled
(5 true positives -- all revisited *hard* positives -- and 15 false positives). ``manifest.tsv``
maps each (query, image) pair to its label.

:func:`load_subset_city` turns one city into a :class:`~oxbench.datasets.base.Benchmark`
(database = that city's images of the subset, queries = its crops, whole-image boxes);
:func:`rank_subset_city` ranks each query's 20 candidates with bag-of-words scores, optionally
followed by spatial re-ranking, and :func:`candidate_map` scores the result: mAP over the queries,
positives = TP, junk ignored, as in the revisited Medium/Hard setups restricted to the 20 images.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from oxbench.datasets.base import Benchmark, FileImages
from oxbench.errors import InputError
from oxbench.evaluation.ap import average_precision
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.index.inverted import InvertedFile, bow_matrix, rank_scores
from oxbench.pipelines import bow
from oxbench.pipelines.presets import BowMethod

CITIES = {"roxford5k": "o", "rparis6k": "p"}


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
    gt = GroundTruth(dataset, "revisited", db_names, tuple(queries), source=str(manifest)).validate()
    database = FileImages(db_names, tuple(folder / "db_images" / f for f in db_files))
    qimages = FileImages(tuple(q_folders), tuple(folder / "queries" / q / "query.jpg" for q in q_folders))
    for p in (*database.paths, *qimages.paths):
        if not p.is_file():
            raise InputError("subset image missing", p)
    bench = Benchmark(
        id=f"{dataset}-pixel-subset", gt=gt, database=database, queries=qimages,
        protocols=("revisited",), root=folder,
    )
    return SubsetCity(bench, tuple(candidates))


def candidate_map(city: SubsetCity, ranked: list[NDArray[np.int64]]) -> tuple[float, NDArray[np.float64]]:
    """mAP of per-query rankings of the candidates (TP positive, junk ignored), and per-query AP."""
    aps = []
    for q, order in zip(city.bench.gt.queries, ranked, strict=True):
        order = order[~np.isin(order, q.junk)]
        pos = np.flatnonzero(np.isin(order, q.hard))
        aps.append(average_precision(pos, len(q.hard)))
    ap = np.array(aps)
    return float(ap.mean()), ap


def rank_subset_city(
    city: SubsetCity,
    train: Benchmark,
    cache: Path,
    method: BowMethod,
    *,
    progress: bool = False,
) -> dict[str, object]:
    """Rank each query's candidates by BoW, then re-rank them spatially; score both.

    The vocabulary is trained on ``train`` (the other city, or the synthetic training city); idf
    is learned from the city's database images, as in a normal search.

    Returns:
        ``{"bow": mAP, "bow_sv": mAP, "ap_bow": [...], "ap_bow_sv": [...], "verified": [...]}``.
    """
    from oxbench.rerank.spatial import spatial_rerank

    cache = Path(cache)
    bench = city.bench
    vocab_path = bow.step_vocabulary(method, train, cache, progress=progress)
    bow.step_features(bench, method.features, cache, progress=progress)
    stores = {p: bow.open_store(cache, bench, method.features, p) for p in ("database", "queries")}
    words = {}
    for p in ("database", "queries"):
        names = bow._part_names(bench, p)
        out = cache / bow.dataset_key(bench) / "words" / f"{vocab_path.stem}-k1" / f"{p}.npz"
        bow.step_assign(vocab_path, stores[p], names, out, k=1, progress=progress)
        words[p] = bow.Words.load(out)
    n_words = method.vocab_size
    db_names = list(bench.gt.db_names)
    q_names = [bench.queries.name(i) for i in range(bench.gt.n_queries)]
    ivf = InvertedFile(n_words, idf=method.idf, burst=method.burst).fit(
        bow_matrix([words["database"].of(n)[0][:, 0] for n in db_names], n_words)
    )
    scores = ivf.scores(bow_matrix([words["queries"].of(n)[0][:, 0] for n in q_names], n_words))
    ranked_bow, ranked_sv, verified = [], [], []
    for qi, cand in enumerate(city.candidates):
        order = cand[rank_scores(scores[qi, cand][None, :])[0]]
        ranked_bow.append(order)
        _, q_kp, _, q_size = stores["queries"].get_raw(q_names[qi])
        q_words = words["queries"].of(q_names[qi])[0][:, 0].astype(np.int64)
        cands = []
        for idx in order.tolist():
            _, kp, _, size = stores["database"].get_raw(db_names[idx])
            cands.append((kp, words["database"].of(db_names[idx])[0][:, 0].astype(np.int64), size))
        res = spatial_rerank(
            q_kp, q_words, cands, order, top_r=len(order), model=method.spatial_model,
            min_inliers=method.spatial_min_inliers, threshold_px=method.spatial_threshold_px,
            query_size=q_size,
        )
        ranked_sv.append(np.asarray(res.order, np.int64))
        verified.append(len(res.verified))
    m_bow, ap_bow = candidate_map(city, ranked_bow)
    m_sv, ap_sv = candidate_map(city, ranked_sv)
    return {
        "bow": m_bow, "bow_sv": m_sv, "ap_bow": ap_bow.tolist(), "ap_bow_sv": ap_sv.tolist(),
        "verified": verified, "trained_on": train.id,
    }
