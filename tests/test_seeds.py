"""Every random or learned step takes a named seed, and every run records its seeds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.pipelines import RecordOptions, Session, resolve_method
from oxbench.pipelines.presets import METHODS
from oxbench.schema import MAX_SEEDS, describe, is_seed_setting, parse_seeds, seed_settings

#: The seeds each family declares, by the step they drive (the audit of issue 32).
FAMILY_SEEDS = {
    # the vocabulary k-means and the sample of training descriptors it is fitted on
    "bow": {"vocabulary.seed"},
    "asmk": {"vocabulary.seed"},
    # + the random orthogonal projection of Hamming embedding and its training sample
    "he": {"vocabulary.seed", "he.seed"},
    # the CNN's random weights / training, VLAD's codebook k-means (descriptor.vocabulary.seed);
    # IVF-PQ's quantiser k-means (search.seed) only with that search
    "global": {"descriptor.seed"},
}


def test_every_preset_declares_the_seeds_of_its_family() -> None:
    for name in METHODS.names():
        m = METHODS.get(name)
        if m.family not in FAMILY_SEEDS:
            continue  # a family registered by another test
        seeds = seed_settings(m)
        expected = FAMILY_SEEDS[m.family]
        if m.family == "global":
            kind = m.descriptor.kind
            if kind == "files":
                expected = expected - {
                    "descriptor.seed"
                }  # the user's files learn nothing at random
            if kind == "vlad":
                expected = {"descriptor.vocabulary.seed"}
            if m.search.kind == "faiss-ivfpq":
                expected = expected | {"search.seed"}
        assert set(seeds) == expected, name
        assert all(isinstance(v, int) and not isinstance(v, bool) for v in seeds.values())
        # a seed is an ordinary setting: typed, ranged, documented
        rows = {r.name: r for r in describe(m) if r.name in seeds}
        assert all(r.kind == "int" and r.doc for r in rows.values()), name


def test_seed_names_follow_one_rule() -> None:
    assert is_seed_setting("seed") and is_seed_setting("vocabulary.seed")
    assert is_seed_setting("features.seed") and not is_seed_setting("seeds")
    assert not is_seed_setting("vocab_seed")  # the names of earlier versions: refused, renamed
    assert not is_seed_setting("seed_count") and not is_seed_setting("vocab_size")
    m = resolve_method("rootsift-he", **{"he.seed": 7}, **{"vocabulary.seed": "3"})
    assert seed_settings(m) == {"vocabulary.seed": 3, "he.seed": 7}
    for bad in ("-1", "nan", "1.5", str(2**32)):
        with pytest.raises(InputError, match="he.seed"):
            resolve_method("rootsift-he", **{"he.seed": bad})


def test_the_search_seed_drives_the_ivfpq_quantisers() -> None:
    pytest.importorskip("faiss")
    from oxbench.index.search import FaissIndex

    m = resolve_method(
        "features-ivfpq",
        **{"search.nlist": 4, "search.m": 2, "search.nbits": 4, "search.nprobe": 2},
        **{"search.seed": 5},
    )
    settings = m.search
    assert settings.seed == 5 and settings.to_dict()["seed"] == 5
    x = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)

    def codebooks(seed: int) -> np.ndarray:
        import faiss

        st = resolve_method(m, **{"search.seed": seed}).search
        idx = FaissIndex(st, threads=1).fit(x).index_
        return faiss.vector_to_array(idx.pq.centroids)

    np.testing.assert_array_equal(codebooks(5), codebooks(5))
    assert not np.array_equal(codebooks(5), codebooks(6))


def test_a_run_records_its_seeds(tmp_path: Path) -> None:
    pytest.importorskip("faiss")
    from oxbench.pipelines import run
    from test_features_method import _gnd_only_root

    root = _gnd_only_root(tmp_path / "data")
    db = np.random.default_rng(0).normal(size=(30, 8)).astype(np.float32)
    np.save(tmp_path / "db.npy", db)
    np.save(tmp_path / "q.npy", db[[0, 3, 6]])
    out = run(
        "roxford5k",
        "features",
        overrides={
            "descriptor.db_features": str(tmp_path / "db.npy"),
            "descriptor.query_features": str(tmp_path / "q.npy"),
            "search": "faiss-ivfpq",
            **{"search.nlist": 2, "search.m": 2, "search.nbits": 4, "search.nprobe": 2},
            "search.seed": 11,
        },
        session=Session(root=root, cache=tmp_path / "c", progress=False, strict=False),
        record=RecordOptions(out=tmp_path / "r"),
    )
    record = json.loads((out.run_dir / "record.json").read_text())
    assert record["seeds"] == {"search.seed": 11}  # the files kind has no seed of its own
    assert out.config.to_dict()["method"]["search"]["seed"] == 11  # a seed is part of the config


# --- the text of --seeds (the seed groups themselves are not here) ---------------------------------


@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=MAX_SEEDS, unique=True))
def test_seed_lists_round_trip_through_their_text(seeds: list[int]) -> None:
    assert parse_seeds(",".join(map(str, seeds))) == tuple(seeds)
    assert parse_seeds(" , ".join(map(str, seeds)) + " ") == tuple(seeds)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "at least one seed"),
        ("  ", "at least one seed"),
        ("0,-1,2", "seed 2: must be in [0, 4294967295]"),
        ("0,1,1", "seed 1 is given twice"),
        ("3,07,3", "seed 3 is given twice"),
        ("0,,1", "comma-separated whole numbers"),
        ("0,1.5", "comma-separated whole numbers"),
        ("nan", "comma-separated whole numbers"),
        ("0,inf", "comma-separated whole numbers"),
        ("zero", "comma-separated whole numbers"),
        (str(2**32), "seed 1: must be in [0, 4294967295]"),
        (",".join(map(str, range(MAX_SEEDS + 1))), f"at most {MAX_SEEDS} seeds, got 101"),
        (",".join(map(str, range(10**6))), "at most 4,096"),  # 10^6 seeds: not even read
    ],
)
def test_bad_seed_lists_are_one_line_naming_the_option(text: str, why: str) -> None:
    with pytest.raises(InputError) as exc:
        parse_seeds(text)
    message = str(exc.value)
    assert message.startswith("option --seeds: ") and why in message, message
    assert "\n" not in message and len(message) < 300
