"""Original Oxford/Paris ground-truth text files and ranked-list folders."""

from __future__ import annotations

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.formats.oxford_gt import read_gt_dir, read_ranked_dir
from oxbench.formats.revisitop import read_gnd


def _write_query(d, stem, *, good=(), ok=(), junk=(), query="oxc1_a_1 1.5 2 30 40.25", skip=()):
    files = {"good": "\n".join(good), "ok": "\n".join(ok), "junk": "\n".join(junk), "query": query}
    for kind, text in files.items():
        if kind in skip:
            continue
        (d / f"{stem}_{kind}.txt").write_text(text + ("\n" if text else ""))


@pytest.fixture
def toy(tmp_path):
    d = tmp_path / "gt"
    d.mkdir()
    _write_query(d, "alpha_1", good=["a_1", "a_2", "a_2"], ok=["a_3"], junk=["a_4"])
    _write_query(d, "alpha_2", good=["a_2"], ok=["a_1"], junk=[], query="oxc1_a_2 0 0 10 10")
    _write_query(d, "beta_1", good=[], ok=["b_1"], junk=["a_4"], query="oxc1_b_1 5 5 6 6")
    return d


def test_toy_folder(toy):
    gt = read_gt_dir(toy)
    assert gt.protocol == "original" and gt.dataset == "oxford5k"
    assert gt.db_names == ("a_1", "a_2", "a_3", "a_4", "b_1")
    assert gt.query_names == ("a_1", "a_2", "b_1")
    q0 = gt.queries[0]
    assert q0.good.tolist() == [0, 1]  # a_2 listed twice -> one positive
    assert q0.ok.tolist() == [2] and q0.junk.tolist() == [3]
    assert q0.bbox == (1.5, 2.0, 30.0, 40.25)
    assert gt.queries[2].good.size == 0 and gt.queries[2].positives.tolist() == [4]


def test_query_order_is_numeric(tmp_path):
    for n in (10, 2, 1):
        _write_query(tmp_path, f"z_{n}", good=[f"i{n}"], query=f"i{n} 0 0 1 1")
    gt = read_gt_dir(tmp_path, dataset="mine")
    assert gt.query_names == ("i1", "i2", "i10") and gt.dataset == "mine"


def test_normalises_unambiguous_noise(tmp_path):
    (tmp_path / "x_1_good.txt").write_bytes(b"p_1.jpg\r\n  p_2 \r\n\r\n")
    (tmp_path / "x_1_ok.txt").write_bytes(b"")
    (tmp_path / "x_1_junk.txt").write_bytes(b"j_1\t\n")
    (tmp_path / "x_1_query.txt").write_bytes(b"oxc1_p_1 0 0 1 1\r\n")
    (tmp_path / "README").write_text("ignored")
    gt = read_gt_dir(tmp_path)
    assert gt.db_names == ("j_1", "p_1", "p_2")
    assert gt.queries[0].good.tolist() == [1, 2]


def test_db_names_index_and_unknown(toy):
    db = ("zz", "b_1", "a_4", "a_3", "a_2", "a_1")
    gt = read_gt_dir(toy, db_names=db)
    assert gt.queries[0].good.tolist() == [4, 5]
    with pytest.raises(InputError, match=r"alpha_1_ok.txt: line 1: unknown image 'a_3'"):
        read_gt_dir(toy, db_names=("a_1", "a_2", "a_4", "b_1"))


@pytest.mark.parametrize(
    ("stem", "kwargs", "message"),
    [
        ("c_1", {"good": ["two words"]}, r"c_1_good.txt: line 1: .*whitespace"),
        (
            "c_1",
            {"good": ["x"], "junk": ["y", "x"]},
            r"c_1_junk.txt: line 2: x is also labelled good",
        ),
        ("c_1", {"ok": ["x"], "junk": ["x"]}, r"c_1_junk.txt: line 1: x is also labelled ok"),
        ("c_1", {"query": "oxc1_x 0 0 1"}, r"c_1_query.txt: line 1: expected"),
        (
            "c_1",
            {"query": "oxc1_x 0 0 one 1"},
            r"c_1_query.txt: line 1: box coordinates must be numbers",
        ),
        ("c_1", {"query": "oxc1_x 0 0 nan 1"}, r"finite"),
        ("c_1", {"query": "oxc1_x 5 0 1 1"}, r"malformed box"),
        ("c_1", {"query": "oxc1_x 0 0 1 1\noxc1_y 0 0 1 1"}, r"found 2 non-blank lines"),
        ("c_1", {"query": ""}, r"found 0 non-blank lines"),
        ("c_1", {"skip": ("junk",)}, r"query c_1: missing file\(s\) c_1_junk.txt"),
        ("c_1", {"skip": ("query",)}, r"missing file\(s\) c_1_query.txt"),
    ],
)
def test_refuses_malformed(tmp_path, stem, kwargs, message):
    _write_query(tmp_path, stem, **kwargs)
    with pytest.raises(InputError, match=message):
        read_gt_dir(tmp_path)


def test_labels_that_agree_are_one_positive(tmp_path):
    """good + ok (or a name twice in one file) is one positive, as compute_ap's sets count it."""
    from oxbench.evaluation import evaluate

    _write_query(
        tmp_path, "c_1", good=["x", "y", "x"], ok=["y", "z"], junk=["w"], query="oxc1_x 0 0 1 1"
    )
    gt = read_gt_dir(tmp_path)
    q = gt.queries[0]
    names = [gt.db_names[i] for i in q.positives]
    assert names == ["x", "y", "z"] and [gt.db_names[i] for i in q.junk] == ["w"]
    assert q.query_id == "c_1"
    ranks = np.array([[gt.db_names.index(n) for n in ("y", "w", "x", "z")]])
    assert evaluate(gt, ranks).setups["original"].ap[0] == 1.0  # 3 positives, junk deleted


def test_refuses_missing_and_empty_folder(tmp_path):
    with pytest.raises(InputError, match="not found"):
        read_gt_dir(tmp_path / "nope")
    with pytest.raises(InputError, match="no ground-truth files"):
        read_gt_dir(tmp_path)


def _ranked(d, files):
    d.mkdir(exist_ok=True)
    for name, lines in files.items():
        (d / f"{name}.txt").write_text("".join(f"{ln}\n" for ln in lines))
    return d


def test_ranked_dir(toy, tmp_path):
    gt = read_gt_dir(toy)
    rd = _ranked(
        tmp_path / "ranked",
        {
            "alpha_1": ["a_1", "new_1", "a_3.jpg"],  # by query id
            "a_2": ["a_1", "a_2", "new_2", "new_1", "b_1"],  # by query image name
            "beta_1": [],
        },
    )
    gt2, ranks = read_ranked_dir(rd, gt)
    assert gt2.db_names == gt.db_names + ("new_1", "new_2")
    assert gt2.queries is gt.queries
    assert ranks.dtype == np.int64 and ranks.shape == (3, 5)
    assert ranks.tolist() == [[0, 5, 2, -1, -1], [0, 1, 6, 5, 4], [-1] * 5]


def test_ranked_dir_by_image_name_without_gt_folder(toy, tmp_path):
    gnd_like = read_gt_dir(toy)
    import dataclasses

    from oxbench.groundtruth import GroundTruth

    queries = tuple(dataclasses.replace(q, query_id=None) for q in gnd_like.queries)  # ids unknown
    gt = GroundTruth(gnd_like.dataset, "original", gnd_like.db_names, queries, "<memory>")
    rd = _ranked(tmp_path / "r", {"a_1": ["a_1"], "a_2": ["a_2"], "b_1": ["b_1"]})
    _, ranks = read_ranked_dir(rd, gt)
    assert ranks.tolist() == [[0], [1], [4]]
    (rd / "b_1.txt").unlink()
    (rd / "beta_1.txt").write_text("b_1\n")  # query ids are unknown here
    with pytest.raises(InputError, match="no ranked list for query b_1"):
        read_ranked_dir(rd, gt)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"alpha_1": ["a_1"], "alpha_2": ["a_1"]},
            r"no ranked list for query b_1 \(expected beta_1.txt\)",
        ),
        (
            {"alpha_1": ["a_1"], "a_1": ["a_1"], "alpha_2": [], "beta_1": []},
            "two ranked lists for query a_1",
        ),
        (
            {"alpha_1": ["a_1", "a_2", "a_1.jpg"], "alpha_2": [], "beta_1": []},
            r"alpha_1.txt: line 3: a_1 is already",
        ),
        ({"alpha_1": ["a 1"], "alpha_2": [], "beta_1": []}, r"alpha_1.txt: line 1: .*whitespace"),
    ],
)
def test_ranked_dir_refuses(toy, tmp_path, files, message):
    gt = read_gt_dir(toy)
    rd = _ranked(tmp_path / "ranked", files)
    with pytest.raises(InputError, match=message):
        read_ranked_dir(rd, gt)


@pytest.mark.parametrize(
    ("pkl", "folder", "dataset", "n_names"),
    [
        ("oxford5k/gnd_oxford5k.pkl", "oxford5k/gt_files_170407", "oxford5k", 845),
        ("paris6k/gnd_paris6k.pkl", "paris6k/paris_120310", "paris6k", 3399),
    ],
)
@pytest.mark.shared_data
def test_real_files_equal_old_protocol_pickles(shared_data, pkl, folder, dataset, n_names):
    gnd = read_gnd(shared_data / pkl)
    gt = read_gt_dir(shared_data / folder, db_names=gnd.db_names)
    assert gt.dataset == dataset and gt.n_queries == 55
    assert gt.query_names == gnd.query_names
    for a, b in zip(gnd.queries, gt.queries, strict=True):
        np.testing.assert_array_equal(b.positives, a.ok, err_msg=a.name)
        np.testing.assert_array_equal(b.junk, a.junk, err_msg=a.name)
        assert b.bbox == a.bbox
        assert gnd.db_names.index(a.name) in b.positives  # query image in the database, positive
    if dataset == "paris6k":
        assert all(q.good.size == 0 for q in gt.queries)  # the empty *_good.txt files
    assert read_gt_dir(shared_data / folder).n_db == n_names


@pytest.mark.shared_data
def test_real_all_souls_duplicate(shared_data):
    gt = read_gt_dir(shared_data / "oxford5k/gt_files_170407")
    q = gt.queries[0]
    assert q.name == "all_souls_000013"
    assert q.good.size == 24  # 25 lines, all_souls_000091 twice


@pytest.mark.shared_data
def test_real_ranked_round_trip(shared_data, tmp_path):
    """A perfect ranking written as Oxford ranked files reads back to the same indices."""
    gnd = read_gnd(shared_data / "oxford5k/gnd_oxford5k.pkl")
    folder = shared_data / "oxford5k/gt_files_170407"
    gt = read_gt_dir(folder, db_names=gnd.db_names)
    rd = tmp_path / "ranked"
    rd.mkdir()
    expected = []
    ids = {
        p.read_text().split()[0][len("oxc1_") :]: p.name[: -len("_query.txt")]
        for p in folder.glob("*_query.txt")
    }
    for i, q in enumerate(gt.queries):
        order = np.concatenate([q.positives, q.junk])
        expected.append(order)
        stem = q.name if i % 2 else ids[q.name]  # both file namings are accepted
        (rd / f"{stem}.txt").write_text("".join(f"{gnd.db_names[j]}\n" for j in order))
    gt2, ranks = read_ranked_dir(rd, gt)
    assert gt2.db_names == gt.db_names
    for row, exp in zip(ranks, expected, strict=True):
        assert row[row >= 0].tolist() == exp.tolist()


def test_utf8_bom_is_not_part_of_a_name(toy):
    path = toy / "alpha_1_good.txt"
    path.write_bytes(b"\xef\xbb\xbfa_1\na_2\n")
    gt = read_gt_dir(toy, db_names=("a_1", "a_2", "a_3", "a_4", "b_1"))
    assert gt.queries[0].good.tolist() == [0, 1]


@pytest.mark.shared_data
def test_real_ranked_lists_score_through_evaluate(shared_data, tmp_path):
    """Ranked files -> read_ranked_dir -> evaluate: perfect lists 1.0; junk first changes nothing;
    an unknown name on top (an appended negative) costs exactly what the AP formula says."""
    from oxbench.evaluation import average_precision, evaluate

    gt = read_gt_dir(shared_data / "paris6k/paris_120310")
    rd = tmp_path / "ranked"
    rd.mkdir()
    for i, q in enumerate(gt.queries):
        order = [gt.db_names[j] for j in np.concatenate([q.junk, q.positives])]
        if i == 0:
            order.insert(0, "not_in_the_ground_truth")
        (rd / f"{q.name}.txt").write_text("\n".join(order) + "\n")
    gt2, ranks = read_ranked_dir(rd, gt)
    assert gt2.n_db == gt.n_db + 1
    res = evaluate(gt2, ranks, padding=-1).setups["original"]  # shorter lists are padded with -1
    n0 = gt.queries[0].positives.size
    assert res.ap[0] == pytest.approx(average_precision(np.arange(1, n0 + 1), n0))
    np.testing.assert_allclose(res.ap[1:], 1.0)
