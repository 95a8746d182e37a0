"""The real ROxford/RParis subset: loading its labels, and re-ranking candidates (skips when absent)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "bench")
)  # the fixture lives in bench/
from pixel_subset import candidate_map, load_subset_city  # noqa: E402

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def subset(shared_data: Path) -> Path:
    folder = shared_data / "revisited_pixel_retrieval_subset"
    if not folder.is_dir():
        pytest.skip("revisited_pixel_retrieval_subset is absent")
    return folder


def test_subset_cities_and_their_labels(subset: Path) -> None:
    ox = load_subset_city(subset, "roxford5k")
    pa = load_subset_city(subset, "rparis6k")
    assert ox.bench.gt.query_names == ("o15", "o25", "o30", "o40", "o53", "o55", "o58", "o66")
    assert len(ox.candidates) == len(pa.candidates) == 8
    assert ox.bench.gt.n_db + pa.bench.gt.n_db == 280
    for city in (ox, pa):
        for q, cand in zip(city.bench.gt.queries, city.candidates, strict=True):
            assert len(cand) == 20 and len(set(cand.tolist())) == 20
            assert len(q.hard) == 5 and set(q.hard.tolist()) <= set(cand.tolist())
    # a perfect ranking scores 1, the positives last scores low
    perfect = [
        np.concatenate([q.hard, np.setdiff1d(c, q.hard)])
        for q, c in zip(ox.bench.gt.queries, ox.candidates, strict=True)
    ]
    assert candidate_map(ox, perfect)[0] == pytest.approx(1.0)
    worst = [
        np.concatenate([np.setdiff1d(c, np.union1d(q.hard, q.junk)), q.hard])
        for q, c in zip(ox.bench.gt.queries, ox.candidates, strict=True)
    ]
    assert candidate_map(ox, worst)[0] < 0.3


@pytest.mark.slow
def test_rank_real_candidates_with_other_city_vocabulary(subset: Path, tmp_path: Path) -> None:
    """Small settings (256 px, 512 words from the RParis images): BoW and +SV give valid mAPs."""
    from oxbench.pipelines.presets import resolve_method
    from pixel_subset import rank_subset_city

    ox = load_subset_city(subset, "roxford5k")
    pa = load_subset_city(subset, "rparis6k")
    m = resolve_method(
        "rootsift-bow-sv",
        **{"vocabulary.size": 512},
        **{"features.max_side": 256, "features.n_features": 300},
    )
    res = rank_subset_city(ox, pa.bench, tmp_path, m)
    assert res["trained_on"] == "rparis6k-pixel-subset"
    assert 0.0 < res["map"] <= 1.0
    assert len(res["ap"]) == 8 and len(res["verified"]) == 8


def test_all_280_setting_has_the_full_revisited_labels(subset: Path, shared_data: Path) -> None:
    from oxbench.evaluation import evaluate
    from oxbench.formats.revisitop import read_gnd
    from pixel_subset import load_subset_all

    for dataset in ("roxford5k", "rparis6k"):
        city = load_subset_city(subset, dataset)
        bench = load_subset_all(subset, dataset, shared_data)
        full = read_gnd(shared_data / dataset / f"gnd_{dataset}.pkl", dataset=dataset)
        assert bench.gt.n_db == 280 and bench.gt.n_queries == 8
        for q, cq, cand in zip(
            bench.gt.queries, city.bench.gt.queries, city.candidates, strict=True
        ):
            # the candidates' labelled positives are among the query's hard positives in the 280
            tp = {city.bench.gt.db_names[i] for i in cq.hard.tolist()}
            assert tp <= {bench.gt.db_names[i] for i in q.hard.tolist()}
            # every labelled image is a subset image of this city named by its revisited index
            for i in np.concatenate([q.easy, q.hard, q.junk]).tolist():
                index, _, name = bench.database.paths[i].stem.partition("_")
                assert full.db_names[int(index)] == name
            assert len(cand) == 20
        # a ranking with the positives first scores 1 in Medium
        perfect = np.array(
            [
                np.concatenate(
                    [
                        np.union1d(q.easy, q.hard),
                        np.setdiff1d(np.arange(280), np.union1d(q.easy, q.hard)),
                    ]
                )
                for q in bench.gt.queries
            ]
        )
        assert evaluate(bench.gt, perfect).setups["medium"].map == pytest.approx(1.0)


def test_layout_loads_as_the_all_280_setting(
    subset: Path, shared_data: Path, tmp_path: Path
) -> None:
    """``write_layout``'s data roots load through ``oxbench.datasets.load`` as the all-280 setting
    (same images, same labels) with the other city's subset images beside it to train on."""
    from oxbench.datasets import load
    from pixel_subset import load_subset_all, write_layout

    roots = write_layout(subset, shared_data, tmp_path / "layout")
    assert set(roots) == {"roxford5k", "rparis6k"}
    for dataset, other in (("roxford5k", "rparis6k"), ("rparis6k", "roxford5k")):
        want = load_subset_all(subset, dataset, shared_data)
        got = load(dataset, root=roots[dataset], strict=False, progress=False)
        assert got.gt.db_names == want.gt.db_names and got.gt.n_queries == 8
        for p, w in zip(got.database.paths, want.database.paths, strict=True):
            assert p.resolve() == w.resolve()
        for q, w in zip(got.gt.queries, want.gt.queries, strict=True):
            assert q.name == f"query_{w.name}"
            for part in ("easy", "hard", "junk"):
                np.testing.assert_array_equal(getattr(q, part), getattr(w, part))
            assert q.bbox is not None and q.bbox[:2] == (0.0, 0.0) and min(q.bbox[2:]) > 0
        train = load(other, root=roots[dataset], strict=False, progress=False)
        assert set(train.gt.db_names) == set(load_subset_city(subset, other).bench.gt.db_names)
    # writing again over an existing layout gives the same ground truth
    before = (roots["roxford5k"] / "roxford5k" / "gnd_roxford5k.pkl").read_bytes()
    write_layout(subset, shared_data, tmp_path / "layout")
    assert (roots["roxford5k"] / "roxford5k" / "gnd_roxford5k.pkl").read_bytes() == before
