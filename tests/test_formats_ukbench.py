"""UKBench ground truth from the naming."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.formats.ukbench import ukbench_ground_truth, ukbench_name


def test_full_set():
    gt = ukbench_ground_truth()
    assert gt.protocol == "ukbench" and gt.dataset == "ukbench"
    assert gt.n_db == gt.n_queries == 10200
    assert gt.db_names[0] == "ukbench00000" and gt.db_names[-1] == "ukbench10199"
    assert gt.query_names == gt.db_names
    assert gt.queries[10199].good.tolist() == [10196, 10197, 10198, 10199]
    assert gt.queries[5].good.tolist() == [4, 5, 6, 7] and gt.queries[5].junk.size == 0
    gt.validate()


@given(st.integers(min_value=1, max_value=60))
def test_each_image_is_in_its_own_group_of_four(n_objects):
    gt = ukbench_ground_truth(4 * n_objects)
    for i, q in enumerate(gt.queries):
        assert q.good.size == 4 and i in q.good and q.bbox is None
        assert {int(g) // 4 for g in q.good} == {i // 4}


@pytest.mark.parametrize("n", [0, -4, 10, 10201, 2.0, True])
def test_refuses_not_multiple_of_four(n):
    with pytest.raises(InputError, match="UKBench image count"):
        ukbench_ground_truth(n)


@pytest.mark.shared_data
def test_real_images_follow_the_naming(shared_data):
    names = sorted(p.stem for p in (shared_data / "ukbench" / "images").glob("*.jpg"))
    assert names and all(n == ukbench_name(int(n[len("ukbench") :])) for n in names)
