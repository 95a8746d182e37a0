"""Localisation: IoU against a pixel count, Tolias et al.'s pairs on hand-made ground truth with
known IoUs, the projected-box predictor, the synthetic set's boxes from its plan, refusals."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation.localization import (
    LocalizationTruth,
    box_iou,
    evaluate_localization,
    landmark_groups,
    truth_from_queries,
)
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.refinement.localize import affine_from_pairs, predict_box


def pixel_iou(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> float:
    """The slow reference: paint both integer boxes on a grid and count unit cells."""
    size = max(a[2], a[3], b[2], b[3]) + 1
    ma, mb = np.zeros((size, size), bool), np.zeros((size, size), bool)
    ma[a[1] : a[3], a[0] : a[2]] = True
    mb[b[1] : b[3], b[0] : b[2]] = True
    union = (ma | mb).sum()
    return float((ma & mb).sum() / union) if union else 0.0


def int_box() -> st.SearchStrategy[tuple[int, int, int, int]]:
    return st.tuples(
        st.integers(0, 30), st.integers(0, 30), st.integers(1, 20), st.integers(1, 20)
    ).map(lambda t: (t[0], t[1], t[0] + t[2], t[1] + t[3]))


@given(a=int_box(), b=int_box())
@settings(max_examples=200, deadline=None)
def test_iou_is_the_pixel_count_and_symmetric(
    a: tuple[int, int, int, int], b: tuple[int, int, int, int]
) -> None:
    assert box_iou(a, b) == pytest.approx(pixel_iou(a, b), abs=1e-12)
    assert box_iou(a, b) == pytest.approx(box_iou(b, a), abs=1e-15)
    assert box_iou(a, a) == 1.0 and 0.0 <= box_iou(a, b) <= 1.0


def oxford_like() -> GroundTruth:
    """Six database images; queries a_1, a_2, a_3 (landmark a) and b_1 (landmark b) whose images are
    database images 0, 1, 2 and 4. Image 3 shows landmark a but is no query's image; image 1 is also
    positive for b_1 (a shows in the background), image 5 is a negative."""
    q = [
        dataclasses.replace(make_query("img0", (0, 0, 10, 10), good=[0, 1, 2, 3]), query_id="a_1"),
        dataclasses.replace(
            make_query("img1", (10, 10, 30, 30), good=[0, 1, 2, 3]), query_id="a_2"
        ),
        dataclasses.replace(
            make_query("img2", (0, 0, 40, 20), ok=[0, 1, 3], junk=[2]), query_id="a_3"
        ),
        dataclasses.replace(make_query("img4", (5, 5, 15, 15), good=[1, 4]), query_id="b_1"),
    ]
    return GroundTruth("toy", "original", tuple(f"img{i}" for i in range(6)), tuple(q))


def test_pairs_are_the_other_queries_boxes_in_positive_images() -> None:
    t = truth_from_queries(oxford_like())
    assert t.kind == "other queries"
    # a_1: images 1 and 2 (a_2's and a_3's boxes); not its own image 0, not image 3 (no query there)
    # a_2: images 0 and 2; a_3: image 0 and 1 (2 is its own); b_1: no other query of landmark b
    assert dict(t.boxes) == {
        (0, 1): ((10.0, 10.0, 30.0, 30.0),),
        (0, 2): ((0.0, 0.0, 40.0, 20.0),),
        (1, 0): ((0.0, 0.0, 10.0, 10.0),),
        (1, 2): ((0.0, 0.0, 40.0, 20.0),),
        (2, 0): ((0.0, 0.0, 10.0, 10.0),),
        (2, 1): ((10.0, 10.0, 30.0, 30.0),),
    }


def test_known_ious_missing_boxes_score_zero_and_queries_are_averaged() -> None:
    t = truth_from_queries(oxford_like())
    predicted = {
        (0, 1): (10, 10, 30, 30),  # exact: 1
        (0, 2): (0, 0, 20, 20),  # inter 20x20=400, union 800+400-400=800: 0.5
        (1, 0): (5, 0, 15, 10),  # inter 50, union 150: 1/3
        # (1, 2) missing: 0
        (2, 0): (20, 20, 30, 30),  # disjoint: 0
        (2, 1): (10, 10, 30, 30),  # 1
        (3, 1): (0, 0, 5, 5),  # b_1 has no pair: ignored
        (0, 5): (0, 0, 1, 1),  # a negative: ignored
    }
    r = evaluate_localization(t, predicted)
    per_query = [(1 + 0.5) / 2, (1 / 3 + 0) / 2, (0 + 1) / 2]
    np.testing.assert_allclose(r.per_query_iou[:3], per_query)
    assert math.isnan(r.per_query_iou[3]) and r.per_query_pairs.tolist() == [2, 2, 2, 0]
    assert r.miou == pytest.approx(sum(per_query) / 3)
    assert r.correct == pytest.approx(
        (1.0 + 0.0 + 0.5) / 3
    )  # IoU >= 0.5: (1, .5), (1/3, 0), (0, 1)
    assert r.n_pairs == 6 and r.n_predicted == 5 and r.n_scored_queries == 3
    assert r.miou_boxed == pytest.approx(
        ((1 + 0.5) / 2 + 1 / 3 + (0 + 1) / 2) / 3
    )  # (1, 2) unboxed: left out
    assert r.lines()[0].startswith(
        f"toy: localization mIoU: {100 * r.miou:.2f}, IoU>=0.5: 50.00 (6 pairs over 3 queries"
    )
    d = r.to_dict()
    assert d["per_query"][3] == {"iou": None, "correct": None, "pairs": 0} and d[
        "miou"
    ] == pytest.approx(r.miou)


def test_several_boxes_in_one_image_the_best_counts() -> None:
    t = LocalizationTruth("toy", ("q",), {(0, 7): ((0, 0, 10, 10), (20, 20, 30, 30))})
    assert evaluate_localization(t, {(0, 7): (20, 20, 30, 30)}).miou == 1.0


@given(perm=st.permutations(range(4)))
@settings(max_examples=20, deadline=None)
def test_permuting_queries_permutes_the_per_query_scores(perm: list[int]) -> None:
    gt = oxford_like()
    moved = dataclasses.replace(gt, queries=tuple(gt.queries[i] for i in perm))
    boxes = {
        (0, 1): (10, 12, 30, 30),
        (1, 0): (0, 0, 9, 9),
        (2, 0): (1, 1, 10, 10),
        (0, 2): (0, 0, 30, 20),
    }
    base = evaluate_localization(truth_from_queries(gt), boxes)
    where = {old: new for new, old in enumerate(perm)}
    moved_boxes = {(where[q], d): b for (q, d), b in boxes.items()}
    res = evaluate_localization(truth_from_queries(moved), moved_boxes)
    np.testing.assert_allclose(res.per_query_iou[[where[i] for i in range(4)]], base.per_query_iou)
    assert res.miou == pytest.approx(base.miou)


def test_landmarks_without_ids_come_from_mutual_positives() -> None:
    gt = oxford_like()
    no_ids = dataclasses.replace(
        gt, queries=tuple(dataclasses.replace(q, query_id=None) for q in gt.queries)
    )
    # a_1, a_2 and a_3 are each other's positives; b_1's image 4 is no positive of the a queries
    assert landmark_groups(no_ids) == [0, 0, 0, 3]
    assert landmark_groups(gt) == [0, 0, 0, 1]


def test_bad_input_is_refused() -> None:
    gt = oxford_like()
    no_box = dataclasses.replace(
        gt, queries=(dataclasses.replace(gt.queries[0], bbox=None), *gt.queries[1:])
    )
    with pytest.raises(InputError, match="query img0 has no box"):
        truth_from_queries(no_box)
    with pytest.raises(InputError, match=r"lies outside the 20x20 image"):
        truth_from_queries(gt, {2: (20, 20)})  # a_3's box (0, 0, 40, 20) in image 2
    t = truth_from_queries(gt, {0: (50, 50), 1: (50, 50), 2: (50, 50)})
    for box, words in (
        ((0, 0, 60, 10), "outside the 50x50 image"),
        ((5, 5, 5, 9), "empty"),
        ((0, 0, float("nan"), 3), "finite"),
        ((0, 0, 1), "four finite numbers"),
    ):
        with pytest.raises(InputError, match=words):
            evaluate_localization(t, {(0, 1): box})
    with pytest.raises(InputError, match="there are 4 queries"):
        evaluate_localization(t, {(9, 1): (0, 0, 1, 1)})
    revisited_like = GroundTruth(
        "r", "revisited", ("x", "y"), (make_query("qa", (0, 0, 1, 1), easy=[0, 1]),)
    )
    with pytest.raises(InputError, match="no localisation pairs"):
        truth_from_queries(revisited_like)


# --- the predictor -----------------------------------------------------------------------------


@given(
    sx=st.floats(0.3, 3), sy=st.floats(0.3, 3), shear=st.floats(-0.5, 0.5), tx=st.floats(-50, 50), ty=st.floats(-50, 50),
    seed=st.integers(0, 2**31 - 1),
)  # fmt: skip
@settings(max_examples=50, deadline=None)
def test_an_exact_affine_is_recovered_and_the_box_projected(
    sx: float, sy: float, shear: float, tx: float, ty: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    a = np.array([[sx, shear, tx], [0.0, sy, ty]])
    src = rng.uniform(10, 90, (12, 2))
    dst = np.column_stack([src, np.ones(12)]) @ a.T
    pairs = np.column_stack([src, dst])
    np.testing.assert_allclose(affine_from_pairs(pairs), a, atol=1e-6)
    box, how = predict_box(pairs, (10, 20, 90, 80), (10_000, 10_000)) or ((0, 0, 0, 0), "")
    corners = np.array([[10, 20, 1], [90, 20, 1], [90, 80, 1], [10, 80, 1]]) @ a.T
    lo, hi = corners.min(0), corners.max(0)
    expected = (max(lo[0], 0), max(lo[1], 0), hi[0], hi[1])
    if expected[2] > expected[0] and expected[3] > expected[1]:
        assert how == "projected"
        np.testing.assert_allclose(box, expected, atol=0.011)  # rounded to 0.01 px


def test_fallbacks_clip_and_nothing() -> None:
    two = [[0, 0, 5, 6], [3, 3, 12, 10]]
    assert predict_box(two, (0, 0, 5, 5), (100, 100)) == ((5.0, 6.0, 12.0, 10.0), "inliers")
    line = [[0, 0, 1, 1], [1, 1, 2, 2], [2, 2, 3, 3], [3, 3, 4, 4]]  # collinear: no affine
    assert affine_from_pairs(line) is None
    assert predict_box(line, (0, 0, 5, 5), (100, 100)) == ((1.0, 1.0, 4.0, 4.0), "inliers")
    shift = [
        [0, 0, 50, 50],
        [10, 0, 60, 50],
        [0, 10, 50, 60],
    ]  # translation by 50: box leaves a 70x70 image
    assert predict_box(shift, (0, 0, 40, 40), (70, 70)) == ((50.0, 50.0, 70.0, 70.0), "projected")
    assert predict_box(shift, None, (70, 70)) == ((50.0, 50.0, 60.0, 60.0), "inliers")
    assert predict_box(np.zeros((0, 4)), (0, 0, 1, 1), (10, 10)) is None


# --- boxes.json in a run record ----------------------------------------------------------------


def test_run_record_boxes_are_read_and_checked(tmp_path) -> None:  # noqa: ANN001
    import json

    from oxbench.records import RunRecord
    from run_layout import random_ranks, tiny_gt, write_run

    gt = tiny_gt()
    run = write_run(tmp_path / "runs", gt, random_ranks(gt, 1))
    assert RunRecord.load(run).boxes() is None  # no boxes.json: none predicted
    path = run / "boxes.json"
    path.write_text(
        json.dumps(
            {"predictor": "p", "queries": {"0": {"3": {"box": [1, 2, 3, 4.5], "how": "inliers"}}}}
        )
    )
    assert RunRecord.load(run).boxes() == ("p", {(0, 3): (1.0, 2.0, 3.0, 4.5)})
    for doc, words in (
        ({"queries": {}}, 'expected {"predictor"'),
        ({"predictor": "p", "queries": {"99": {}}}, "is not a query index"),
        ({"predictor": "p", "queries": {"0": {"x": {"box": [0, 0, 1, 1]}}}}, "is not an index"),
        ({"predictor": "p", "queries": {"0": {"3": {"box": [0, 0, 1]}}}}, 'expected {"box"'),
        ({"predictor": "p", "queries": {"0": {"3": [0, 0, 1, 1]}}}, 'expected {"box"'),
    ):
        path.write_text(json.dumps(doc))
        with pytest.raises(InputError, match=re.escape(words)):
            RunRecord.load(run).boxes()
