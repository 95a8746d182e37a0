"""ILIAS: mAP@k hand-computed and against a slow independent implementation of its definition, the
file readers (JSON and pickle agree; absent queries named), and every bad input one line, exit 2.

The definition (Kordopatis-Zilos et al., CVPR 2025; ilias-vrg/ilias ``evaluation/src/dataset.py``):
the top k of a query's scored images (``argsort(-scores)``), scikit-learn's average precision over
them -- one threshold per distinct score, ``sum over thresholds of (recall step) * precision`` --
times ``hits / min(k, positives)``; 0 when no positive is in the top k.
"""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.evaluation import evaluate
from oxbench.evaluation.protocols.ilias import IliasScorer, query_ap
from oxbench.formats.ilias import ground_truth, read_ids, read_similarities, read_taxonomy


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def slow_ap(top_positive: list[bool], top_scores: list[float], n_positives: int, k: int) -> float:
    """sklearn's AP written as its definition: at each distinct score (descending), the precision
    of everything scored at least that much, weighted by the recall it adds."""
    hits = sum(top_positive)
    if hits == 0:
        return 0.0
    ap = 0.0
    previous_recall = 0.0
    for t in sorted(set(top_scores), reverse=True):
        kept = [p for p, s in zip(top_positive, top_scores, strict=True) if s >= t]
        recall = sum(kept) / hits
        ap += (recall - previous_recall) * (sum(kept) / len(kept))
        previous_recall = recall
    return ap * hits / min(k, n_positives)


def test_hand_computed_tie_inside_the_top_k():
    ids = np.array([5, 1, 2, 6])
    scores = np.array([0.9, 0.8, 0.8, 0.1])
    # top 3: 5 (neg) at 0.9, then 1 (pos) and 2 (neg) tied at 0.8: one threshold, precision 1/3
    ap, oracle = query_ap(ids, scores, np.array([1, 6]), k=3)
    assert ap == pytest.approx(1 / 3 * 1 / 2) and oracle == pytest.approx(1 / 3 * 3 / 2)
    # had 1 scored alone at 0.85, precision 1/2 there
    ap2, _ = query_ap(ids, np.array([0.9, 0.85, 0.8, 0.1]), np.array([1, 6]), k=3)
    assert ap2 == pytest.approx(1 / 2 * 1 / 2)


def test_no_positive_in_the_top_k_scores_zero_and_k_cuts_the_list():
    ids = np.array([9, 8, 1])
    assert query_ap(ids, np.array([3.0, 2.0, 1.0]), np.array([1]), k=2) == (0.0, 0.0)
    assert query_ap(ids, np.array([3.0, 2.0, 1.0]), np.array([1]), k=3)[0] == pytest.approx(1 / 3)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 6)), min_size=1, max_size=40),
    st.integers(1, 50),
    st.integers(0, 5),
)
def test_equal_to_the_slow_definition(entries, k, missed):
    """Integer-valued scores make ties common, inside the top k and across its last place."""
    n = len(entries)
    ids = np.where([p for p, _ in entries], np.arange(n), -1).astype(np.int64)
    scores = np.array([float(s) for _, s in entries])
    positives = np.concatenate([ids[ids >= 0], np.arange(n, n + missed)]).astype(np.int64)
    if positives.size == 0:
        return
    ap, oracle = query_ap(ids, scores, positives, k)
    top = np.argsort(-scores)[:k]  # the protocol's cut: numpy's argsort, as the official code's
    expected = slow_ap(
        [bool(ids[i] >= 0) for i in top], [float(scores[i]) for i in top], positives.size, k
    )
    assert ap == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert 0.0 <= ap <= 1.0 + 1e-12
    hits = sum(bool(ids[i] >= 0) for i in top)
    assert oracle == pytest.approx(hits / len(top) * k / positives.size if hits else 0.0)


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(12))), st.integers(1, 15))
def test_distinct_scores_make_the_input_order_irrelevant_and_a_perfect_list_scores_one(perm, k):
    scores = np.linspace(1.0, 0.0, 12)
    ids = np.where(np.arange(12) % 3 == 0, np.arange(12), -1).astype(np.int64)
    positives = ids[ids >= 0]
    p = np.array(perm)
    assert query_ap(ids[p], scores[p], positives, k) == query_ap(ids, scores, positives, k)
    perfect = np.concatenate([positives, np.full(8, -1)]).astype(np.int64)
    assert query_ap(perfect, scores, positives, k)[0] == pytest.approx(1.0)


# --- the official layout ---------------------------------------------------------------------

IMAGE_QUERIES = ["inst_a/query/Q000_00.jpg", "inst_b/query/Q001_00.jpg", "inst_b/query/Q001_01.jpg"]
TEXT_QUERIES = ["inst_a/query/T000.txt", "inst_b/query/T001.txt"]
POSITIVES = [
    ("inst_a/pos/P000_00.jpg", 0.05, 10),
    ("inst_a/pos/P000_01.jpg", 0.2, 40),
    ("inst_b/pos/P001_00.jpg", 0.5, 60),
]
TAXONOMY = {"product": {"food": {"cake": ["inst_a"]}}, "landmark": {"tower": {"x": ["inst_b"]}}}


def write_layout(root, images=IMAGE_QUERIES, texts=TEXT_QUERIES, positives=POSITIVES):
    ids = root / "image_ids"
    ids.mkdir(parents=True, exist_ok=True)
    (ids / "image_query_ids.txt").write_text("".join(f"{q},{q.split('/')[0]}\n" for q in images))
    (ids / "text_query_ids.txt").write_text("".join(f"{t}\n" for t in texts))
    (ids / "positive_ids.txt").write_text("".join(f"{p},{s},{c}\n" for p, s, c in positives))
    (root / "taxonomy.json").write_text(json.dumps(TAXONOMY))
    return root


SIMS = {
    "inst_a/query/Q000_00.jpg": {
        "yfcc/1": 0.9,
        "inst_a/pos/P000_01.jpg": 0.8,
        "inst_a/pos/P000_00.jpg": 0.8,
        "yfcc/2": 0.1,
    },
    "inst_b/query/Q001_00.jpg": {"inst_b/pos/P001_00.jpg": 0.5, "yfcc/1": 0.7},
    "inst_a/query/T000.txt": {"inst_a/pos/P000_00.jpg": 0.3, "yfcc/3": 0.2},
}


@pytest.fixture
def layout(tmp_path):
    root = write_layout(tmp_path / "ilias")
    (tmp_path / "sims.json").write_text(json.dumps(SIMS))
    return root, tmp_path / "sims.json"


def score_file(root, sims, k=1000, taxonomy=True):
    tax = read_taxonomy(root / "taxonomy.json") if taxonomy else None
    gt = ground_truth(read_ids(root), taxonomy=tax)
    scorer = IliasScorer(gt, k)
    for q, ids, scores in read_similarities(sims, gt):
        scorer.add(q, ids, scores)
    return gt, scorer.result()


def test_layout_hand_computed_with_breakdowns(layout):
    root, sims = layout
    gt, res = score_file(root, sims, k=2)
    # queries: image queries then text queries, each sorted (the official get_queries())
    assert gt.query_names[:3] == tuple(IMAGE_QUERIES) and gt.query_names[3:] == tuple(TEXT_QUERIES)
    s = res.setups["ilias"]
    # Q000_00, k=2: yfcc/1 0.9 then one of the two positives tied at 0.8 (which: argsort's cut):
    # precision 1/2 at the 0.8 threshold, times 1 hit / min(2, 2)
    assert s.ap[0] == pytest.approx(0.25)
    assert s.ap[1] == pytest.approx(0.5)  # yfcc/1 0.7, then the positive: 1/2 * 1/1
    assert s.ap[3] == pytest.approx(0.5)  # T000: its positive first: 1 * 1 / min(2, 2)
    assert s.skipped == (2, 4)  # Q001_01 and T001 are not in the file
    assert res.summary["map"] == pytest.approx(100 * (0.25 + 0.5 + 0.5) / 3)
    assert set(res.summary["categories"]) == {"product", "landmark"}
    assert res.summary["subcategories"]["landmark-tower"] == pytest.approx(50.0)
    # scale: P000_00 (0.05) is the only positive of inst_a in the first group
    assert "0-0.06880213760855043" in res.summary["scale"]
    assert list(res.summary["clutter"]) == ["0-18", "33-53", "53-inf"]


def test_pickle_and_json_agree_and_the_pickle_order_is_kept(layout, tmp_path):
    root, sims = layout
    _, from_json = score_file(root, sims)
    queries = list(reversed(list(SIMS)))
    db = sorted({d for v in SIMS.values() for d in v})
    width = max(len(v) for v in SIMS.values())
    ranks = np.zeros((len(queries), width), dtype=np.int64)
    scores = np.zeros((len(queries), width), dtype=np.float64)
    for i, q in enumerate(queries):
        entries = list(SIMS[q].items())
        entries += [(f"pad/{j}", -1.0) for j in range(width - len(entries))]
        for j, (d, v) in enumerate(entries):
            if d not in db:
                db.append(d)
            ranks[i, j], scores[i, j] = db.index(d), v
    path = tmp_path / "sims.pkl"
    path.write_bytes(
        pickle.dumps({"query_ids": np.array(queries), "db_ids": np.array(db), "sims": scores,
                      "ranks": ranks})
    )  # fmt: skip
    _, from_pkl = score_file(root, path)
    np.testing.assert_array_equal(from_json.setups["ilias"].ap, from_pkl.setups["ilias"].ap)
    assert from_pkl.summary["map"] == pytest.approx(from_json.summary["map"], rel=1e-15)


def test_ranks_and_scores_from_a_run_equal_the_file(layout):
    root, sims = layout
    gt, expected = score_file(root, sims, taxonomy=False)
    lists = read_similarities(sims, gt)
    width = max(len(i) for i in lists.ids)
    ranks = np.full((gt.n_queries, width), -1, dtype=np.int64)
    scores = np.zeros((gt.n_queries, width))
    for q, ids, s in lists:
        known = ids >= 0  # the run's database is the positives: the distractors are not there
        order = np.argsort(-s, kind="stable")
        keep = order[known[order]]
        ranks[q, : keep.size], scores[q, : keep.size] = ids[keep], s[keep]
    got = evaluate(gt, ranks, scores=scores, padding=-1)
    # without the distractors the positives move up: only T000 (its positive first) is unchanged
    assert got.setups["ilias"].ap[3] == expected.setups["ilias"].ap[3]
    assert got.setups["ilias"].ap[1] == 1.0


def test_cli_prints_lines_json_and_names_the_skipped(layout, capsys):
    root, sims = layout
    code, out, _ = run(
        ["evaluate", "ilias", "--gt", root, "--similarities", sims, "--taxonomy",
         root / "taxonomy.json"],
        capsys,
    )  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("ilias: mAP@1000 ") and "(3 queries)" in lines[0]
    assert any(ln.startswith("ilias: mAP@1000 by category: ") for ln in lines)
    skipped = [ln for ln in lines if "skipped" in ln]
    assert skipped == [
        "ilias: 2 queries skipped (not scored): inst_b/query/Q001_01.jpg, inst_b/query/T001.txt"
    ]
    code, out, _ = run(
        ["evaluate", "ilias", "--gt", root, "--similarities", sims, "--json"], capsys
    )
    data = json.loads(out)
    assert data["k"] == 1000 and data["queries"] == 3 and len(data["skipped"]) == 2
    assert data["map"] == pytest.approx(np.mean(list(data["ap"].values())))


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo owned",))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"inst_a/query/Q000_00.jpg": {"x": NaN}}', "NaN is not a number a score can be"),
        ('{"inst_a/query/Q000_00.jpg": {"x": 1e400}}', "is not finite"),
        ('{"inst_a/query/Q000_00.jpg": {"x": true}}', "is not a number"),
        ('{"inst_a/query/Q000_00.jpg": {"x": "0.5"}}', "is not a number"),
        ('{"inst_a/query/Q000_00.jpg": {}, "inst_a/query/Q000_00.jpg": {}}', "listed twice"),
        ('{"inst_a/query/Q000_00.jpg": {"x": 1, "x": 2}}', "database image x is listed twice"),
        ('{"nobody/query/Q.jpg": {"x": 1}}', "is not a query of the ground truth"),
        ("[1, 2]", "expected {query id: {database id: score}}"),
        ("{", "not readable JSON"),
    ],
)
def test_bad_json_is_one_line_and_exit_2(layout, tmp_path, capsys, content, message):
    root, _ = layout
    path = tmp_path / "bad.json"
    path.write_text(content)
    code, out, err = run(["evaluate", "ilias", "--gt", root, "--similarities", path], capsys)
    assert code == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def _pkl(q=("inst_a/query/Q000_00.jpg",), sims=((0.5, 0.2),), ranks=((0, 1),), db=("a", "b")):
    return {
        "query_ids": np.array(q),
        "db_ids": np.array(db),
        "sims": np.array(sims, dtype=np.float32),
        "ranks": np.array(ranks),
    }


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_Evil(), "refusing to load posix.system"),
        ({**_pkl(), "sims": np.array([[0.5, "x"]], dtype=object)}, "refusing dtype 'O8'"),
        (_pkl(sims=((np.nan, 0.2),)), "scores must be finite"),
        (_pkl(sims=((np.inf, 0.2),)), "scores must be finite"),
        (_pkl(q=("inst_a/query/Q000_00.jpg",) * 2, sims=((1, 0),) * 2, ranks=((0, 1),) * 2),
         "is listed twice"),
        (_pkl(ranks=((0, 0),)), "a database image is listed twice"),
        (_pkl(ranks=((0, 5),)), "not an index into 'db_ids'"),
        ({"query_ids": []}, "expected a dict with"),
    ],
)  # fmt: skip
def test_bad_pickles_are_one_line_and_exit_2(layout, tmp_path, capsys, obj, message):
    root, _ = layout
    path = tmp_path / "bad.pkl"
    path.write_bytes(pickle.dumps(obj))
    code, out, err = run(["evaluate", "ilias", "--gt", root, "--similarities", path], capsys)
    assert code == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("k", ["0", "1000000000000000000000000000000", "1e3", "nan", "-5", "ten"])
def test_bad_k_is_one_line_naming_it(layout, capsys, k):
    root, sims = layout
    code, _, err = run(
        ["evaluate", "ilias", "--gt", root, "--similarities", sims, "--k", k], capsys
    )
    assert code == 2 and "option k:" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("images", "texts", "positives", "message"),
    [
        (IMAGE_QUERIES, TEXT_QUERIES, [("inst_a/pos/P.jpg", "x", 3)], "is not a finite number"),
        (IMAGE_QUERIES, TEXT_QUERIES, [("inst_a/pos/P.jpg", "nan", 3)], "is not a finite number"),
        (IMAGE_QUERIES, TEXT_QUERIES, [("inst_a/pos/P.jpg", 0.1, 2.5)], "is not a whole number"),
        (IMAGE_QUERIES, TEXT_QUERIES, [("inst_z/pos/P.jpg", 0.1, 2)], "has no text query"),
        (IMAGE_QUERIES, TEXT_QUERIES, [("inst_a/pos/P.jpg", 0.1, 2)] * 2, "listed twice"),
        (["inst_a/query/Q #1.jpg"], TEXT_QUERIES, POSITIVES, "'#' in an id"),
        (IMAGE_QUERIES, ["inst_a/query/T000.txt extra"], POSITIVES, "malformed entry"),
    ],
)
def test_bad_ground_truth_is_one_line(tmp_path, capsys, images, texts, positives, message):
    root = write_layout(tmp_path / "bad", images, texts, positives)
    (tmp_path / "s.json").write_text("{}")
    code, out, err = run(
        ["evaluate", "ilias", "--gt", root, "--similarities", tmp_path / "s.json"], capsys
    )
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_file_with_no_query_of_the_ground_truth_is_refused(layout, tmp_path):
    root, _ = layout
    (tmp_path / "empty.json").write_text("{}")
    with pytest.raises(InputError, match="no query of the ground truth was scored"):
        score_file(root, tmp_path / "empty.json")


def test_the_scale_bench_streams_the_same_numbers_as_the_in_ram_scorer(tmp_path):
    """bench/bench_ilias.py at its quick size: the top-k stream equals the full-matrix scorer."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_ilias.py"
    spec = importlib.util.spec_from_file_location("bench_ilias", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = module.main(["--small", "--out", str(tmp_path)])
    assert out["small_equal"] is True and 0 < out["map"] < 100
    assert out["stream_bytes"] < out["matrix_bytes_avoided"]
    assert json.loads((tmp_path / "bench_ilias.json").read_text())["k"] == 100
