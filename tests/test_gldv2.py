"""GLDv2 retrieval: the challenge's mAP@100 and mP@k, hand-computed, against a slow independent
implementation of the definition, and the command line's refusals (one line, exit 2).

The definition (Weyand et al., CVPR 2020; the challenge's ``metrics.py``): per test image, the first
100 predictions in order, a repeated prediction skipped but keeping its position; ``AP = (1 / min(R,
100)) * sum over relevant hits of (hits so far) / position``; the mean over every test image of the
split, those without a prediction counting 0. mP@k: the relevant hits in the first k over k.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.evaluation import evaluate
from oxbench.evaluation.protocols.gldv2 import query_scores, score_predictions
from oxbench.formats.gldv2 import Gldv2Solution, read_predictions, read_solution


def run(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def write_csv(path, header, rows, tail=""):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        f.write(tail)
    return path


def slow_ap(relevant: set[str], predicted: list[str]) -> float:
    """The definition, written out: positions 1..100, first occurrences only."""
    hits, total = 0, 0.0
    for position, p in enumerate(predicted[:100], 1):
        if p in relevant and p not in predicted[: position - 1]:
            hits += 1
            total += hits / position
    return total / min(len(relevant), 100)


def slow_precision(relevant: set[str], predicted: list[str], k: int) -> float:
    first = [p for i, p in enumerate(predicted[:k]) if p not in predicted[:i]]
    return sum(p in relevant for p in first) / k


SOLUTION = [
    ["q1", "a b c", "Public"],
    ["q2", "d", "Public"],
    ["q3", "e f", "Private"],
    ["q4", "", "Ignored"],
    ["q5", "g", "Private"],
]
SUBMISSION = [
    ["q1", "a a zz b"],  # a repeated: skipped, keeps its position
    ["q4", "a"],  # Ignored: skipped
    ["q3", "e "],  # one trailing space dropped
    ["q2", ""],  # no prediction
]


@pytest.fixture
def files(tmp_path):
    sol = write_csv(tmp_path / "solution.csv", ["id", "images", "Usage"], SOLUTION)
    sub = write_csv(tmp_path / "submission.csv", ["id", "images"], SUBMISSION, "\n")
    return tmp_path, sol, sub


def test_hand_computed_map_and_precisions(files):
    _, sol_path, sub_path = files
    sol = read_solution(sol_path)
    assert sol.ignored == frozenset({"q4"}) and sol.queries == ("q1", "q2", "q3", "q5")
    gt = sol.ground_truth()
    read = read_predictions(sub_path, gt, sol.ignored)
    res = score_predictions(gt, read.order, read.predicted, ks=(1, 2, 4))
    # q1: a at 1 (1/1), a again at 2 skipped, zz, b at 4 (2/4): (1 + 0.5) / 3 = 0.5; q2 no prediction
    assert res["public"].map == pytest.approx((0.5 + 0.0) / 2)
    assert res["public"].ap[0] == 0.5 and res["public"].ap[1] == 0.0
    # q3: e at 1: 1/2; q5: no row at all: 0
    assert res["private"].map == pytest.approx(0.25)
    # public P@4: q1 has a, b in the first 4 -> 2/4; q2 0 -> mean 0.25; P@2: q1 1/2 -> 0.25
    assert res["public"].mp_at_k == pytest.approx({1: 0.5, 2: 0.25, 4: 0.25})
    # the other split's queries are left out of a setup (nan), and named as such
    assert math.isnan(res["public"].ap[2]) and res["public"].skipped == (2, 3)


def test_the_query_scores_doc_example_is_the_definition():
    ap, p = query_scores(np.array([3, 7]), np.array([7, 7, 1, 3]))
    assert ap == slow_ap({"3", "7"}, ["7", "7", "1", "3"]) == 0.75
    assert p[3] == 0.5 and p[99] == 2 / 100


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sets(st.integers(0, 30), min_size=1, max_size=12),
            st.one_of(st.none(), st.lists(st.integers(0, 40), max_size=130)),
            st.booleans(),
        ),
        min_size=2,
        max_size=12,
    ),
    st.randoms(use_true_random=False),
)
def test_equal_to_the_slow_definition(queries, random):
    """Random solutions and submissions (duplicates, long lists, absent queries, shuffled rows)."""
    queries[0] = (queries[0][0], queries[0][1], True)  # both splits present
    queries[1] = (queries[1][0], queries[1][1], False)
    rows = [[f"t{i}", " ".join(f"i{v}" for v in sorted(rel)), "Public" if pub else "Private"]
            for i, (rel, _, pub) in enumerate(queries)]  # fmt: skip
    sol = Gldv2Solution(
        tuple(r[0] for r in rows),
        tuple("public" if r[2] == "Public" else "private" for r in rows),
        tuple(tuple(r[1].split(" ")) for r in rows),
        frozenset(),
    )
    gt = sol.ground_truth()
    index_of = {n: i for i, n in enumerate(gt.db_names)}
    given_rows = [i for i, (_, pred, _) in enumerate(queries) if pred is not None]
    random.shuffle(given_rows)
    predicted = [
        np.array([index_of.get(f"i{v}", -1) for v in queries[i][1]], dtype=np.int64)
        for i in given_rows
    ]
    res = score_predictions(gt, given_rows, predicted, ks=(1, 5, 100))
    for split, pub in (("public", True), ("private", False)):
        members = [i for i, q in enumerate(queries) if q[2] == pub]
        aps = [
            slow_ap({f"i{v}" for v in queries[i][0]}, [f"i{v}" for v in queries[i][1] or []])
            for i in members
        ]
        assert res[split].map == pytest.approx(sum(aps) / len(aps), rel=1e-12, abs=1e-15)
        assert 0.0 <= res[split].map <= 1.0
        for k in (1, 5, 100):
            ps = [
                slow_precision(
                    {f"i{v}" for v in queries[i][0]}, [f"i{v}" for v in queries[i][1] or []], k
                )
                for i in members
            ]
            assert res[split].mp_at_k[k] == pytest.approx(sum(ps) / len(ps), rel=1e-12, abs=1e-15)


@settings(max_examples=60, deadline=None)
@given(st.permutations(list(range(6))))
def test_the_order_of_the_submission_only_moves_the_last_bits(order):
    rng = np.random.default_rng(3)
    sol = Gldv2Solution(
        tuple(f"t{i}" for i in range(6)),
        ("public",) * 5 + ("private",),
        tuple(tuple(f"i{v}" for v in rng.choice(50, 7, replace=False)) for _ in range(6)),
        frozenset(),
    )
    gt = sol.ground_truth()
    preds = [rng.choice(gt.n_db + 3, 20) for _ in range(6)]
    preds = [np.where(p >= gt.n_db, -1, p).astype(np.int64) for p in preds]
    a = score_predictions(gt, list(range(6)), preds)
    b = score_predictions(gt, list(order), [preds[i] for i in order])
    np.testing.assert_array_equal(a["public"].ap, b["public"].ap)
    assert a["public"].map == pytest.approx(b["public"].map, rel=1e-15)


def test_a_split_without_queries_is_one_line():
    sol = Gldv2Solution(("t0",), ("public",), (("a",),), frozenset())
    with pytest.raises(InputError, match="no query in the 'private' setup"):
        score_predictions(sol.ground_truth(), [], [])


def test_a_perfect_submission_scores_one_and_relevant_beyond_100_count_in_the_divisor():
    sol = Gldv2Solution(
        ("t0", "t1"),
        ("public", "private"),
        (("a", "b"), tuple(f"r{i}" for i in range(150))),
        frozenset(),
    )
    gt = sol.ground_truth()
    perfect = [np.array([gt.db_names.index("b"), gt.db_names.index("a")], dtype=np.int64)]
    res = score_predictions(gt, [0], perfect)
    assert res["public"].map == 1.0
    first_100 = np.array([gt.db_names.index(f"r{i}") for i in range(100)], dtype=np.int64)
    res = score_predictions(gt, [1], [first_100])
    assert res["private"].map == 1.0  # min(150, 100) = 100 expected


def test_ranks_with_names_equal_the_submission(files, tmp_path):
    _, sol_path, sub_path = files
    sol = read_solution(sol_path)
    gt = sol.ground_truth()
    read = read_predictions(sub_path, gt, sol.ignored)
    expected = score_predictions(gt, read.order, read.predicted)
    ranks = np.full((gt.n_queries, 5), -1, dtype=np.int64)
    for q, pred in zip(read.order, read.predicted, strict=True):
        known = pred[pred >= 0]
        ranks[q, : known.size] = known
    got = evaluate(gt, ranks, padding=-1)
    # zz (no index image) took a position in the submission and not in the ranks: q1 differs
    assert got["private"].map == expected["private"].map
    assert got["public"].ap[0] == pytest.approx((1 + 2 / 3) / 3)


def test_cli_prints_both_splits_and_json(files, capsys):
    tmp, sol, sub = files
    code, out, _ = run(["evaluate", "gldv2", "--solution", sol, "--predictions", sub], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "gldv2-retrieval: mAP@100 public 25.00, private 25.00"
    assert lines[1].startswith("gldv2-retrieval: mP@k[1 5 10 50 100] public [50.00 ")
    per_query = tmp / "per_query.csv"
    code, out, _ = run(
        ["evaluate", "gldv2", "--solution", sol, "--predictions", sub, "--json",
         "--per-query", per_query],
        capsys,
    )  # fmt: skip
    data = json.loads(out)
    assert data["setups"]["public"]["map"] == 0.25 and data["setups"]["private"]["predicted"] == 1
    assert data["setups"]["public"]["ap"] == {"q1": 0.5, "q2": 0.0}
    assert "setup,query_index,query,n_positives,ap" in per_query.read_text()


def test_cli_from_ranks_with_names(files, capsys):
    tmp, sol, _ = files
    index = ["a", "b", "c", "d", "e", "f", "g", "zz"]
    (tmp / "index.txt").write_text("\n".join(index) + "\n")
    (tmp / "queries.txt").write_text("q1\nq3\n")
    ranks = np.array([[0, 7, 1], [4, 5, 6]]).T  # revisitop layout: rows = positions
    np.save(tmp / "ranks.npy", ranks)
    code, out, err = run(
        ["evaluate", "gldv2", "--solution", sol, "--ranks", tmp / "ranks.npy",
         "--query-names", tmp / "queries.txt", "--index-names", tmp / "index.txt", "--json"],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["setups"]["public"]["ap"]["q1"] == pytest.approx((1 + 2 / 3) / 3)
    assert data["setups"]["private"]["ap"] == {"q3": 1.0, "q5": 0.0}
    assert "have no list" in err


@pytest.mark.parametrize("value", [8, 2**62])
def test_cli_ranks_beyond_the_index_names_are_refused_not_scored_zero(files, capsys, value):
    # Found by the hostile pass of issue 43: an index past the names scored 0, exit 0.
    tmp, sol, _ = files
    (tmp / "index.txt").write_text("\n".join(["a", "b", "c", "d", "e", "f", "g", "zz"]) + "\n")
    (tmp / "queries.txt").write_text("q1\nq3\n")
    np.save(tmp / "ranks.npy", np.array([[0, value], [4, 5]], dtype=np.int64))
    code, out, err = run(
        ["evaluate", "gldv2", "--solution", sol, "--ranks", tmp / "ranks.npy",
         "--query-names", tmp / "queries.txt", "--index-names", tmp / "index.txt"],
        capsys,
    )  # fmt: skip
    assert code == 2 and out == ""
    assert f"holds index {value}" in err and len(err.strip().splitlines()) == 1


def test_cli_ranks_padded_with_minus_one_need_the_padding_option(files, capsys):
    # Found by the hostile pass of issue 43 (this turn's GLDv2 files): a -1 in --ranks was taken as
    # padding without --padding, which the help says refuses negative indices.
    tmp, sol, _ = files
    (tmp / "index.txt").write_text("\n".join(["a", "b", "c", "d", "e", "f", "g", "zz"]) + "\n")
    (tmp / "queries.txt").write_text("q1\nq3\n")
    np.save(tmp / "ranks.npy", np.array([[0, 4], [1, -1]], dtype=np.int64))
    args = ["evaluate", "gldv2", "--solution", sol, "--ranks", tmp / "ranks.npy",
            "--query-names", tmp / "queries.txt", "--index-names", tmp / "index.txt"]  # fmt: skip
    code, out, err = run(args, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "test image q3: rank position 1 holds index -1" in err and "--padding -1" in err
    code, out, err = run([*args, "--padding", "-1"], capsys)
    assert code == 0 and out.startswith("gldv2"), err


def test_evaluate_refuses_an_index_past_the_database_for_the_list_protocols(files):
    _, sol, _ = files
    gt = read_solution(sol).ground_truth(("a", "b", "c", "d", "e", "f", "g"))
    ranks = np.zeros((gt.n_queries, 3), dtype=np.int64)
    ranks[1, 2] = 7  # one past the database: used to score as a miss
    with pytest.raises(InputError, match="rank position 2 holds index 7"):
        evaluate(gt, ranks)


def test_a_field_past_the_csv_limit_is_named_as_such(files, tmp_path):
    _, sol, _ = files
    (tmp_path / "long.csv").write_text("id,images\nq1," + "a" * 200_000 + "\n")
    with pytest.raises(InputError, match="a field longer than"):
        read_predictions(tmp_path / "long.csv", read_solution(sol).ground_truth(), frozenset())


@pytest.mark.parametrize(
    ("solution", "submission", "message"),
    [
        ([["q1", "a", "Public", "x"]], [], "line 2: 4 fields, expected 3"),
        ([["q1", "a", "Secret"]], [], "unknown Usage 'Secret'"),
        ([["q1", "a", "Public"], ["q1", "b", "Private"]], [], "test image q1 is listed twice"),
        ([["q1", "", "Public"]], [], "needs its relevant index image ids"),
        ([["q1", "a a", "Public"]], [], "lists index image a twice"),
        ([["q1", "a", "Public"]], [["q9", "a"]], "test image q9 is not in the solution"),
        ([["q1", "a", "Public"]], [["q1", "a"], ["q1", "b"]], "test image q1 is repeated"),
        ([["q1", "a", "Public"]], [["q1"]], "line 2: 1 fields, expected 2"),
    ],
)
def test_bad_files_are_one_line_and_exit_2(tmp_path, capsys, solution, submission, message):
    sol = write_csv(tmp_path / "s.csv", ["id", "images", "Usage"], solution)
    sub = write_csv(tmp_path / "p.csv", ["id", "images"], submission)
    code, out, err = run(["evaluate", "gldv2", "--solution", sol, "--predictions", sub], capsys)
    assert code == 2 and out == "" and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_file_without_the_header_is_refused(tmp_path):
    (tmp_path / "s.csv").write_text("q1,a,Public\n")
    with pytest.raises(InputError, match="the first line must be the header id,images,Usage"):
        read_solution(tmp_path / "s.csv")


@pytest.mark.parametrize("ks", ["0", "101", "1,1", "1e30", "nan"])
def test_bad_ks_are_one_line(files, capsys, ks):
    _, sol, sub = files
    code, _, err = run(
        ["evaluate", "gldv2", "--solution", sol, "--predictions", sub, "--ks", ks], capsys
    )
    assert code == 2 and len(err.strip().splitlines()) == 1
