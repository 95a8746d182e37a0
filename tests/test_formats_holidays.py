"""INRIA Holidays: image list, implied ground truth, result files with written rank numbers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation.ap import average_precision
from oxbench.formats.holidays import (
    holidays_ground_truth,
    read_ground_truth,
    read_image_list,
    read_results,
)

NAMES = ("100000", "100001", "100002", "100100", "100101", "100200")


@pytest.fixture
def gt():
    return holidays_ground_truth([f"{n}.jpg" for n in NAMES])


def _ap_holidays(q, row):
    """The holidays_map.py rule, spelled out: drop the query image, score the positives."""
    row = row[~np.isin(row, q.junk)]
    return average_precision(np.flatnonzero(np.isin(row, q.good)), q.good.size)


def test_ground_truth_from_names(gt):
    assert gt.protocol == "holidays" and gt.dataset == "holidays"
    assert gt.db_names == NAMES
    assert gt.query_names == ("100000", "100100", "100200")
    q0, q1, q2 = gt.queries
    assert q0.good.tolist() == [1, 2] and q0.junk.tolist() == [0] and q0.bbox is None
    assert q1.good.tolist() == [4] and q1.junk.tolist() == [3]
    assert q2.good.size == 0


def test_read_image_list(tmp_path):
    p = tmp_path / "holidays_images.dat"
    p.write_bytes(b"100000.jpg\r\n100001.jpg\n\n 100100.jpg")  # CRLF, blank line, no final newline
    assert read_image_list(p) == ("100000", "100001", "100100")
    assert read_ground_truth(p).n_queries == 2


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"100000.jpg\n100000.jpg\n", "line 2: 100000 is already listed at line 1"),
        (b"100000.jpg\nfoo.jpg\n", "line 2: 'foo.jpg' is not a Holidays image name"),
        (b"100000.png\n", "line 1"),
        (b"\n\n", "no image names"),
        (b"100001.jpg\n", "group 1000 has no query image 100000"),
    ],
)
def test_image_list_refuses(tmp_path, content, message):
    p = tmp_path / "list.dat"
    p.write_bytes(content)
    with pytest.raises(InputError, match=message):
        read_ground_truth(p)


def test_results_written_ranks_are_positions(gt, tmp_path):
    p = tmp_path / "res.txt"
    p.write_text(
        "100000.jpg 0 100000.jpg 1 100100.jpg 3 100002.jpg 5 100001.jpg\n"
        "100200.jpg\n"
        "\n"
        "100100.jpg  0 100101.jpg 1 100100.jpg\n"
    )
    ranks = read_results(p, gt)
    assert ranks.dtype == np.int64 and ranks.shape == (3, 6)
    assert ranks[0].tolist() == [0, 3, -1, 2, -1, 1]
    assert ranks[1].tolist() == [4, 3] + [-1] * 4
    assert ranks[2].tolist() == [-1] * 6
    # query 0: after deleting the query image, positives sit at ranks 2 and 4 (one up each)
    q0 = gt.queries[0]
    assert _ap_holidays(q0, ranks[0]) == pytest.approx(average_precision([2, 4], 2))
    assert _ap_holidays(gt.queries[1], ranks[1]) == 1.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("100000.jpg 0 100001.jpg\n100100.jpg\n", "1 query missing, e.g. 100200.jpg"),
        ("100000.jpg\n100100.jpg\n100200.jpg\n100000.jpg\n", "line 4: query 100000 is repeated"),
        (
            "100000.jpg 0 999999.jpg\n100100.jpg\n100200.jpg\n",
            "line 1: query 100000: unknown image 999999.jpg",
        ),
        ("100001.jpg\n", "line 1: 100001.jpg is not a query"),
        ("999900.jpg\n", "line 1: 999900.jpg is unknown image"),
        ("100000.jpg 0 100001.jpg 0 100002.jpg\n", "rank 0 is given to 100001 and 100002"),
        ("100000.jpg 0 100001.jpg 1 100001.jpg\n", "100001 is listed twice"),
        ("100000.jpg 0.5 100001.jpg\n", "rank '0.5' is not a non-negative integer"),
        ("100000.jpg -1 100001.jpg\n", "rank '-1' is not a non-negative integer"),
        ("100000.jpg 6 100001.jpg\n", "rank 6 is beyond the database"),
        ("100000.jpg 0 100001.jpg 1\n", "odd number of tokens"),
        ("100000.jpg 0 100001.jpg 1 foo\n", "'foo' is not a Holidays image name"),
    ],
)
def test_results_refused(gt, tmp_path, text, message):
    p = tmp_path / "res.txt"
    p.write_text(text)
    with pytest.raises(InputError, match=message):
        read_results(p, gt)


def test_results_missing_file(gt, tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_results(tmp_path / "nope.txt", gt)


@pytest.mark.shared_data
def test_real_image_list_and_result_file(shared_data):
    folder = shared_data / "holidays"
    names = read_image_list(folder / "holidays_images.dat")
    assert len(names) == 1491 and names[0] == "100000" and names[-1] == "149902"
    gt = holidays_ground_truth(names)
    assert gt.n_queries == 500 and sum(q.good.size for q in gt.queries) == 991
    ranks = read_results(folder / "peng_result.txt", gt)
    assert ranks.shape == (500, 10) and (ranks >= 0).all()
    try:
        from oxbench.evaluation import evaluate  # helper EVAL's kernel, once it exists
    except ImportError:
        evaluate = None
    if evaluate is not None:
        m = evaluate(gt, ranks).setups["holidays"].map
    else:
        m = float(np.mean([_ap_holidays(q, r) for q, r in zip(gt.queries, ranks, strict=True)]))
    assert m == pytest.approx(0.6892340327, abs=1e-9)  # SOURCES.md: "about 0.689"


@st.composite
def _holidays_case(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    names = [f"{100000 + 100 * g + j}" for g, n in enumerate(sizes) for j in range(n)]
    seed = draw(st.integers(0, 2**32 - 1))
    top = draw(st.integers(0, len(names)))
    return names, seed, top


@settings(max_examples=60, deadline=None)
@given(_holidays_case())
def test_official_sparse_file_scores_like_the_full_list(tmp_path_factory, case):
    """Top-t, then only the positives (and the query image) at their true ranks: same positions,
    same AP as the full list. An unwritten position is an unnamed negative, so the query image
    must be written wherever it is for the later positives to move up (as in holidays_map.py)."""
    names, seed, top = case
    gt = holidays_ground_truth(names)
    rng = np.random.default_rng(seed)
    full = np.stack([rng.permutation(gt.n_db) for _ in gt.queries])
    lines = []
    for q, perm in zip(gt.queries, full, strict=True):
        keep = [r for r, i in enumerate(perm) if r < top or i in q.good or i in q.junk]
        pairs = " ".join(f"{r} {gt.db_names[perm[r]]}.jpg" for r in keep)
        lines.append(f"{q.name}.jpg {pairs}")
    order = rng.permutation(len(lines))  # line order does not matter
    p = tmp_path_factory.mktemp("h") / "res.txt"
    p.write_text("\n".join(lines[i] for i in order))
    ranks = read_results(p, gt)
    for qi, q in enumerate(gt.queries):
        row = ranks[qi]
        written = np.flatnonzero(row >= 0)
        np.testing.assert_array_equal(row[written], full[qi, written])
        if q.good.size:
            assert _ap_holidays(q, row) == pytest.approx(_ap_holidays(q, full[qi]))


def test_utf8_bom_and_unicode_digits(tmp_path):
    p = tmp_path / "list.dat"
    p.write_bytes(b"\xef\xbb\xbf100000.jpg\n100001.jpg")
    assert read_image_list(p) == ("100000", "100001")
    p.write_text("100000.jpg\n\u0661\u0660\u0660\u0660\u0660\u0661.jpg\n", encoding="utf-8")
    with pytest.raises(InputError, match="line 2"):
        read_image_list(p)
