"""Distractor pools of other kinds and R1M's selection procedure (issue 33 item 1), at tiny sizes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.datasets.mining import (
    distractor_scores,
    read_selection,
    select_most_distracting,
    selection_path,
)
from oxbench.datasets.synthetic.config import SynthConfig
from oxbench.datasets.synthetic.distractor_kinds import (
    KIND_LETTERS,
    KINDS,
    KindSpec,
    kind_name,
    kind_of,
    kind_tag,
    parse_kind_spec,
    scene_subject,
)
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth, Query
from oxbench.pipelines import RecordOptions, Session

CONFIG = SynthConfig(image_size=(160, 120))


# --- specs ----------------------------------------------------------------------------------------


def test_kind_specs_parse_and_bad_ones_are_one_line() -> None:
    assert parse_kind_spec("synthetic-mixed:1000") == KindSpec("mixed", 1000)
    assert parse_kind_spec("synthetic-mined-scene:7") == KindSpec("scene", 7, mined=True)
    assert parse_kind_spec("synthetic-city:5").text == "synthetic-city:5"
    for bad, words in (
        ("synthetic-forest:5", "unknown distractor kind 'forest'"),
        ("synthetic-mixed:0", "1 to"),
        ("synthetic-mixed:", "expected a count"),
        ("synthetic-mixed:-3", "expected a count"),
        ("synthetic-mixed:1e3", "expected a count"),
        ("synthetic-mixed:nan", "expected a count"),
        ("synthetic-mixed:200000000", "1 to 100,000,000"),
    ):
        with pytest.raises(InputError, match=words) as exc:
            parse_kind_spec(bad)
        assert "\n" not in str(exc.value)
    assert kind_tag("synthetic-mined-mixed:3") == " mined mixed" and kind_tag(5) == ""


# --- renderers ------------------------------------------------------------------------------------

pytest.importorskip("cv2")
pytest.importorskip("PIL.Image")


def test_each_kind_is_deterministic_by_index_and_mixed_reuses_the_kinds() -> None:
    from oxbench.datasets.synthetic.distractor_kinds import render_kind

    seen: dict[str, np.ndarray] = {}
    for kind in KIND_LETTERS:
        for j in range(3):
            a, b = render_kind(CONFIG, kind, j), render_kind(CONFIG, kind, j)
            assert a.shape == (120, 160, 3) and a.dtype == np.uint8 and np.array_equal(a, b)
            name = kind_name(CONFIG, kind, j)
            assert name == f"northford_x{KIND_LETTERS[kind]}{j:07d}" and name not in seen
            seen[name] = a
    assert not np.array_equal(seen["northford_xc0000000"], seen["northford_xs0000000"])
    drawn = {kind_of(CONFIG, "mixed", j) for j in range(30)}
    assert drawn == set(KIND_LETTERS)  # every kind appears in a mixed set
    for j in range(3):  # mixed image j is image j of the kind drawn: same name, same pixels
        name = kind_name(CONFIG, "mixed", j)
        assert np.array_equal(render_kind(CONFIG, "mixed", j), seen[name])


def test_other_cities_have_other_styles_and_scenes_cycle_subjects() -> None:
    import dataclasses

    from oxbench.datasets.synthetic.facade import city_style

    own = city_style(CONFIG.city_seed)
    others = {
        city_style(dataclasses.replace(CONFIG, city=f"northford-other{c}").city_seed).walls
        for c in range(4)
    }
    assert own.walls not in others and len(others) == 4
    assert [scene_subject(j) for j in range(6)] == [
        "vegetation",
        "sky",
        "crowd",
        "interior",
        "texture",
        "vegetation",
    ]


def test_a_kind_source_names_and_reads_its_images() -> None:
    from oxbench.datasets.synthetic.distractor_kinds import render_kind
    from oxbench.datasets.synthetic.stream import SyntheticDistractors

    src = SyntheticDistractors(CONFIG, 3, kind="nearmiss")
    assert [src.name(i) for i in range(3)] == [f"northford_xn{j:07d}" for j in range(3)]
    mined = SyntheticDistractors(CONFIG, 2, kind="scene", pool=(4, 9))
    assert mined.name(1) == "northford_xs0000009"
    assert np.array_equal(mined.read(0), render_kind(CONFIG, "scene", 4))
    with pytest.raises(ValueError, match="unknown distractor kind"):
        SyntheticDistractors(CONFIG, 1, kind="forest")
    with pytest.raises(ValueError, match="exactly"):
        SyntheticDistractors(CONFIG, 3, kind="scene", pool=(1,))
    assert set(KINDS) == {"city", "scene", "nearmiss", "mixed"}


# --- the seed's scoring rule ----------------------------------------------------------------------


def _gt(positives: list[tuple[list[int], list[int]]], n_db: int) -> GroundTruth:
    queries = tuple(
        Query(f"q{i}", easy=np.array(e, np.int64), hard=np.array(h, np.int64))
        for i, (e, h) in enumerate(positives)
    )
    return GroundTruth("t", "revisited", tuple(f"d{i}" for i in range(n_db)), queries)


def _reference_scores(gt: GroundTruth, ranks: np.ndarray, n_candidates: int) -> np.ndarray:
    """The rule read literally: for each query and listed candidate, count the Easy and Hard
    images after it in the list or missing from it."""
    out = np.zeros(n_candidates)
    for qi, q in enumerate(gt.queries):
        pos = set(q.easy.tolist()) | set(q.hard.tolist())
        if not pos:
            continue
        lst = ranks[:, qi].tolist()
        for r, idx in enumerate(lst):
            if idx >= gt.n_db:
                before = set(lst[:r])
                out[idx - gt.n_db] += len(pos - before) / len(pos)
    return out


def test_scores_of_a_worked_example() -> None:
    # db 0..3, candidates 4, 5, 6. Query 0: positives {0 easy, 1 hard}; query 1: none
    gt = _gt([([0], [1]), ([], [])], 4)
    ranks = np.array([[4, 0], [0, 1], [5, 2], [1, 4], [2, 5]])  # query 0: c0, d0, c1, d1, d2
    # c0 above both positives: 1.0; c1 between d0 and d1: 0.5; c2 not listed: 0; query 1 adds 0
    np.testing.assert_allclose(distractor_scores(gt, ranks, 3), [1.0, 0.5, 0.0])
    truncated = ranks[:3]  # d1 is cut: it counts as below c1
    np.testing.assert_allclose(distractor_scores(gt, truncated, 3), [1.0, 0.5, 0.0])
    with pytest.raises(InputError, match="do not fit 2 queries"):
        distractor_scores(gt, ranks[:, :1], 3)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12))
def test_scores_match_the_literal_rule_on_random_lists(seed: int, keep_len: int) -> None:
    rng = np.random.default_rng(seed)
    n_db, n_c, n_q = 8, 6, 3
    gt = _gt(
        [
            (
                sorted(rng.choice(n_db, rng.integers(0, 3), replace=False).tolist()),
                sorted(rng.choice(n_db, rng.integers(0, 3), replace=False).tolist()),
            )
            for _ in range(n_q)
        ],
        n_db,
    )
    ranks = np.stack([rng.permutation(n_db + n_c) for _ in range(n_q)], axis=1)[:keep_len]
    got = distractor_scores(gt, ranks, n_c)
    np.testing.assert_allclose(got, _reference_scores(gt, ranks, n_c))
    assert np.all(got >= 0) and np.all(got <= n_q)


def test_selection_keeps_the_highest_scores_ties_to_the_lower_index() -> None:
    kept = select_most_distracting(np.array([0.5, 2.0, 0.5, 1.0, 0.5]), 3)
    assert kept.tolist() == [0, 1, 3]
    with pytest.raises(InputError, match="cannot keep 6 distractors from a pool of 5"):
        select_most_distracting(np.zeros(5), 6)


def test_a_selection_file_is_checked(tmp_path: Path) -> None:
    path = selection_path(tmp_path, "scene", 2)
    with pytest.raises(InputError, match="mine-distractors --kind scene --keep 2"):
        read_selection(tmp_path, "scene", 2)
    path.parent.mkdir()
    good = {"format": 1, "kind": "scene", "pool_size": 5, "kept": [3, 1]}
    path.write_text(json.dumps(good))
    assert read_selection(tmp_path, "scene", 2) == (1, 3)
    for bad in ({**good, "kept": [1, 1]}, {**good, "kept": [1, 5]}, {**good, "kind": "city"}, []):
        path.write_text(json.dumps(bad))
        with pytest.raises(InputError, match="not a mined distractor selection"):
            read_selection(tmp_path, "scene", 2)
    path.write_text("{not json")
    with pytest.raises(InputError, match="not a mined"):
        read_selection(tmp_path, "scene", 2)


# --- end to end at a tiny size --------------------------------------------------------------------

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_pipeline import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from oxbench.cli import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


TINY = ["--set", "features.max_side=320", "--set", "features.n_features=300"]


def test_bad_kinds_and_pools_are_one_line_exit_2(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    for args, words in (
        (["run", "--distractors", "synthetic-forest:4"], "unknown distractor kind 'forest'"),
        (["run", "--distractors", "synthetic-mined-scene:4"], "no mined selection"),
        (
            ["data", "mine-distractors", "--kind", "scene", "--pool", "3", "--keep", "5"],
            "a pool of 3 candidates cannot give 5",
        ),  # fmt: skip
        (
            ["data", "mine-distractors", "--kind", "forest", "--pool", "9", "--keep", "5"],
            "unknown distractor kind",
        ),  # fmt: skip
    ):
        extra = ["--out", str(out), "--method", "rootsift-bow"] if args[0] == "run" else []
        code, _, err = _cli(
            capsys, *args, "--root", str(tiny_root), "--cache", str(tmp_path / "c"), *extra
        )
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (args, err)
    assert not out.exists() and not (tmp_path / "c").exists()


def test_mining_keeps_the_candidates_the_rule_scores_highest_and_a_run_uses_them(
    tiny_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import oxbench
    from oxbench.datasets import load

    cache, runs = tmp_path / "cache", tmp_path / "runs"
    code, out, err = _cli(
        capsys,
        "data", "mine-distractors", "--kind", "mixed", "--pool", "6", "--keep", "2",
        "--methods", "rootsift-bow", "--set", "vocabulary.size=256", *TINY, "--root", str(tiny_root),
        "--cache", str(cache), "--runs", str(runs), "--workers", "1", "--no-progress",
    )  # fmt: skip
    assert code == 0, err
    doc = json.loads(selection_path(tiny_root / "synthetic", "mixed", 2).read_text())
    assert "kept 2 of 6 mixed candidates" in out and doc["pool"] == "synthetic-mixed:6"
    # the scores again, from the run's own ranks by the literal rule
    bench = load("synthetic", tiny_root, distractors="synthetic-mixed:6", images=False)
    ranks = np.load(Path(doc["runs"]["rootsift-bow"]) / "ranks.npy")
    ref = _reference_scores(bench.gt, ranks, 6)
    np.testing.assert_allclose(doc["scores"], ref)
    order = sorted(range(6), key=lambda i: (-ref[i], i))
    assert doc["kept"] == sorted(order[:2])
    mined = oxbench.run(
        "synthetic",
        "rootsift-bow",
        distractors="synthetic-mined-mixed:2",
        overrides={"vocabulary.size": 256, "features.max_side": 320, "features.n_features": 300},
        session=Session(root=tiny_root, cache=cache, workers=1, progress=False),
        record=RecordOptions(runs_dir=runs),
    )
    bench2 = load("synthetic", tiny_root, distractors="synthetic-mined-mixed:2", images=False)
    assert bench2.distractors is not None
    assert [bench2.distractors.name(i) for i in range(2)] == doc["kept_names"]
    assert mined.record["footprint"]["n_index"] == 42 and "+2 mined mixed" in mined.record["label"]
    assert mined.record["cache"]["features"] == "hit"  # the pool's features were reused
