"""Evaluation: golden values, a slow literal reference, properties, validation, real ground truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation import (
    evaluate,
    evaluate_features,
    evaluate_scores,
    from_revisitop,
    ranks_from_scores,
    to_revisitop,
)
from oxbench.evaluation.kernels import labelled_positions_from_ranks, labelled_ranks_from_scores
from oxbench.evaluation.protocols import query_labels
from oxbench.evaluation.ranking import descending_order
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.report.tables import result_table

# ---------------------------------------------------------------------------------------------
# The deliberately simple reference: the scoring rules of docs/protocols.md, literally, in plain Python.

REF_SETUPS = {
    "revisited": {
        "easy": (("easy",), ("hard", "junk")),
        "medium": (("easy", "hard"), ("junk",)),
        "hard": (("hard",), ("easy", "junk")),
    },
    "original": {"original": (("good", "ok"), ("junk",))},
    "holidays": {"holidays": (("good",), ("junk",))},
    "ukbench": {"ukbench": (("good",), ("junk",))},
}


def ref_query(ranked: list[int], positives: set[int], ignored: set[int], ks: tuple[int, ...]):
    """AP, P@K and top-4 count of one list: walk it, skip ignored, apply the formula."""
    ap = 0.0
    found = 0
    rank = 0  # 0-based rank among the non-ignored items
    pos_1based = []
    top4 = 0
    for position, item in enumerate(ranked):
        if item in positives and position < 4:
            top4 += 1
        if item in ignored:
            continue
        if item in positives:
            p0 = 1.0 if rank == 0 else found / rank
            p1 = (found + 1) / (rank + 1)
            ap += (p0 + p1) / 2
            found += 1
            pos_1based.append(rank + 1)
        rank += 1
    ap /= len(positives)
    pk = []
    for k in ks:
        if not pos_1based:
            pk.append(0.0)
            continue
        kq = min(k, max(pos_1based))
        pk.append(sum(1 for p in pos_1based if p <= kq) / kq)
    return ap, pk, top4


def ref_evaluate(gt: GroundTruth, ranks: list[list[int]], ks=(1, 5, 10)):
    out = {}
    for setup, (pos_f, ign_f) in REF_SETUPS[gt.protocol].items():
        aps, pks, tops = [], [], []
        for q, ranked in zip(gt.queries, ranks, strict=True):
            positives = {int(i) for f in pos_f for i in getattr(q, f)}
            ignored = {int(i) for f in ign_f for i in getattr(q, f)}
            if not positives:
                aps.append(math.nan)
                pks.append([math.nan] * len(ks))
                tops.append(math.nan)
                continue
            ap, pk, top4 = ref_query(list(ranked), positives, ignored, ks)
            aps.append(ap)
            pks.append(pk)
            tops.append(top4)
        used = [i for i, a in enumerate(aps) if not math.isnan(a)]
        out[setup] = {
            "ap": aps,
            "pk": pks,
            "map": sum(aps[i] for i in used) / len(used),
            "mpk": [sum(pks[i][t] for i in used) / len(used) for t in range(len(ks))],
            "score": sum(tops[i] for i in used) / len(used),
            "skipped": tuple(i for i, a in enumerate(aps) if math.isnan(a)),
        }
    return out


def assert_matches_reference(gt, ranks, result, ks=None):
    ks = result.ks if ks is None else ks  # Holidays / UKBench report no mP@K unless asked
    ref = ref_evaluate(gt, ranks, ks)
    assert list(result.setups) == list(ref)
    for setup, r in ref.items():
        s = result.setups[setup]
        np.testing.assert_allclose(s.ap, r["ap"], rtol=0, atol=1e-12, equal_nan=True)
        np.testing.assert_allclose(s.p_at_k, r["pk"], rtol=0, atol=1e-12, equal_nan=True)
        assert s.map == pytest.approx(r["map"], abs=1e-12)
        assert [s.mp_at_k[k] for k in ks] == pytest.approx(r["mpk"], abs=1e-12)
        assert s.skipped == r["skipped"]
        if gt.protocol == "ukbench":
            assert s.score == pytest.approx(r["score"], abs=1e-12)


# ---------------------------------------------------------------------------------------------
# Random cases


def random_gt(
    rng: np.random.Generator, protocol: str, n_db: int, nq: int, *, allow_empty=True
) -> GroundTruth:
    queries = []
    for q in range(nq):
        perm = rng.permutation(n_db)
        if protocol == "revisited":
            ne = int(rng.integers(0 if allow_empty else 1, 6))
            nh = int(rng.integers(0 if allow_empty else 1, 6))
            nj = int(rng.integers(0, 5))
            e, h, j = perm[:ne], perm[ne : ne + nh], perm[ne + nh : ne + nh + nj]
            queries.append(make_query(f"q{q}", easy=e, hard=h, junk=j))
        else:
            npos = int(rng.integers(1, 7))
            nj = int(rng.integers(0, 5)) if protocol != "ukbench" else 0
            queries.append(make_query(f"q{q}", good=perm[:npos], junk=perm[npos : npos + nj]))
    return GroundTruth("rand", protocol, tuple(f"im{i}" for i in range(n_db)), tuple(queries))


def random_ranks(rng, gt: GroundTruth, n_index: int, *, min_k: int = 1) -> list[list[int]]:
    """Random (possibly truncated) lists with -1 gaps, sometimes ignored items at the top."""
    lists = []
    for q in gt.queries:
        order = rng.permutation(n_index).tolist()
        if rng.random() < 0.3 and q.junk.size:  # ignored items at the top
            junk = set(q.junk.tolist())
            order = [i for i in order if i in junk] + [i for i in order if i not in junk]
        k = int(rng.integers(min_k, n_index + 1))
        lst = order[:k]
        for _ in range(int(rng.integers(0, 3))):
            lst.insert(int(rng.integers(0, len(lst) + 1)), -1)
        lists.append(lst)
    width = max(len(lst) for lst in lists)
    return [lst + [-1] * (width - len(lst)) for lst in lists]


@pytest.mark.parametrize("protocol", ["revisited", "original", "holidays", "ukbench"])
def test_differential_random(protocol):
    rng = np.random.default_rng(hash(protocol) % 2**32)
    for _ in range(60):
        n_db = int(rng.integers(6, 40))
        nq = int(rng.integers(1, 6))
        # few distractors, none, or many (labels then sit in a small part of the index range)
        n_distr = [0, int(rng.integers(0, 6)), 4 * n_db][int(rng.integers(0, 3))]
        gt = random_gt(rng, protocol, n_db, nq)
        ranks = random_ranks(rng, gt, n_db + n_distr, min_k=4 if protocol == "ukbench" else 1)
        try:
            ref_evaluate(gt, ranks)
        except ZeroDivisionError:  # a setup where every query is empty
            with pytest.raises(InputError, match="no query has positives"):
                evaluate(gt, np.array(ranks), n_distractors=n_distr, gaps=True)
            continue
        res = evaluate(gt, np.array(ranks), n_distractors=n_distr, gaps=True)
        assert_matches_reference(gt, ranks, res)


def test_differential_blocks_and_groups():
    """Small blocks and one query per label table exercise every streaming branch."""
    rng = np.random.default_rng(7)
    for _ in range(30):
        gt = random_gt(rng, "revisited", int(rng.integers(10, 60)), 4, allow_empty=False)
        n_index = gt.n_db * int(rng.choice([1, 6]))  # x6: the distractor-dominated branch
        ranks = np.array(random_ranks(rng, gt, n_index))
        labels = query_labels(gt)
        a = labelled_positions_from_ranks(ranks, labels, n_index, n_db=gt.n_db)
        ref = [np.flatnonzero(np.isin(r, idx)) for r, (idx, _) in zip(ranks, labels, strict=True)]
        for (pos, _), exp in zip(a, ref, strict=True):
            np.testing.assert_array_equal(pos, exp)
        f = np.asfortranarray(ranks)
        others = [
            labelled_positions_from_ranks(ranks, labels, n_index, n_db=gt.n_db, block_elems=1),
            labelled_positions_from_ranks(f, labels, n_index, n_db=gt.n_db),  # whole lists
            labelled_positions_from_ranks(f, labels, n_index, n_db=gt.n_db, group=3, block_elems=7),
            labelled_positions_from_ranks(
                f.astype(np.int32), labels, n_index, n_db=gt.n_db, group=2
            ),
            labelled_positions_from_ranks(
                ranks.astype(float), labels, n_index, n_db=gt.n_db, block_elems=5
            ),
        ]
        for other in others:
            for x, y in zip(a, other, strict=True):
                np.testing.assert_array_equal(x[0], y[0])
                np.testing.assert_array_equal(x[1], y[1])


# ---------------------------------------------------------------------------------------------
# Golden values

WORKED = "good junk junk ok absent good junk absent ok".split()


def worked_gt(junk_as: str | None) -> GroundTruth:
    labels = {"good": [], "ok": [], "junk": []}
    for i, lab in enumerate(WORKED):
        if lab == "junk" and junk_as == "negative":
            continue
        if lab == "junk" and junk_as == "positive":
            lab = "good"
        if lab in labels:
            labels[lab].append(i)
    return GroundTruth(
        "worked", "original", tuple(f"im{i}" for i in range(9)), (make_query("q", **labels),)
    )


@pytest.mark.parametrize(
    ("junk_as", "expected"), [(None, 0.835), ("negative", 0.569), ("positive", 0.918)]
)
def test_worked_example(junk_as, expected):
    gt = worked_gt(junk_as)
    ranks = np.arange(9)[None, :]
    res = evaluate(gt, ranks)
    assert round(res.setups["original"].map, 3) == expected
    # the same ranking expressed as scores (strictly decreasing), and as a revisitop column
    assert (
        evaluate_scores(gt, np.linspace(1, 0, 9)[:, None]).setups["original"].map
        == res.setups["original"].map
    )
    assert (
        evaluate(gt, from_revisitop(ranks.T)).setups["original"].map == res.setups["original"].map
    )


def test_revisited_lines_and_dict():
    gt = GroundTruth(
        "roxford5k",
        "revisited",
        tuple(f"im{i}" for i in range(6)),
        (make_query("a", easy=[0], hard=[1], junk=[2]), make_query("b", hard=[3], junk=[4])),
    )
    res = evaluate(gt, np.array([[2, 1, 0, 3, 4, 5], [5, 3, 4, 0, 1, 2]]))
    easy, medium, hard = (res.setups[s] for s in ("easy", "medium", "hard"))
    assert easy.skipped == (1,) and math.isnan(easy.ap[1])
    assert easy.ap[0] == 1.0  # junk 2 and hard 1 deleted: easy 0 comes first
    assert hard.ap.tolist() == [1.0, 0.25]  # b: 5 (negative) then 3 -> (0/1 + 1/2) / 2
    assert medium.map == (1.0 + 0.25) / 2
    lines = res.lines()
    assert lines[0] == "roxford5k: mAP E: 100.00, M: 62.50, H: 62.50"
    assert lines[1] == (
        "roxford5k: mP@k[1 5 10] E: [100.00 100.00 100.00], M: [50.00 75.00 75.00], "
        "H: [50.00 75.00 75.00]"
    )
    d = res.to_dict()
    assert set(d) == {"setups"} and set(d["setups"]) == {"easy", "medium", "hard"}
    assert set(d["setups"]["easy"]) == {"map", "mp@1", "mp@5", "mp@10", "ap"}
    assert d["setups"]["easy"]["ap"][1] is None
    table = result_table(res)
    assert (
        table.startswith("roxford5k (revisited protocol)\n") and "easy" in table and "1/2" in table
    )
    rows = res.per_query_rows()
    assert len(rows) == 6 and rows[1]["ap"] is None and rows[3]["p@5"] == 0.5


def test_truncated_list_without_positives_scores_zero():
    gt = GroundTruth("t", "original", tuple("abcdef"), (make_query("q", good=[4, 5], junk=[0]),))
    res = evaluate(gt, np.array([[0, 1, 2]]))
    s = res.setups["original"]
    assert s.ap.tolist() == [0.0] and s.p_at_k.tolist() == [[0.0, 0.0, 0.0]]
    assert evaluate(gt, np.array([[-1, -1, 0]]), gaps=True).setups["original"].map == 0.0


def test_ukbench_score():
    names = tuple(f"ukbench{i:05d}" for i in range(8))
    queries = tuple(
        make_query(n, good=range(4 * (i // 4), 4 * (i // 4) + 4)) for i, n in enumerate(names)
    )
    gt = GroundTruth("ukbench", "ukbench", names, queries)
    ranks = np.array(
        [[q, *[j for j in range(8) if j != q]] for q in range(8)]
    )  # self first, then order
    res = evaluate(gt, ranks)
    exp = [sum(1 for j in ranks[q, :4] if j // 4 == q // 4) for q in range(8)]
    assert res.setups["ukbench"].score == pytest.approx(sum(exp) / 8)
    assert res.to_dict() == {"score": pytest.approx(sum(exp) / 8)}
    assert "score" in res.lines()[0]
    with pytest.raises(InputError, match="top 4"):
        evaluate(gt, ranks[:, :3])


# ---------------------------------------------------------------------------------------------
# Scores path == ranks path (stable descending, ties to the lower index)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.float16])
def test_scores_equal_ranks_with_ties(dtype):
    rng = np.random.default_rng(3)
    for _ in range(25):
        n = int(rng.integers(8, 300))
        gt = random_gt(rng, "revisited", n, 5, allow_empty=False)
        scores = rng.integers(0, int(rng.integers(2, 30)), size=(n, 5)).astype(dtype)  # many ties
        a = evaluate_scores(gt, scores)
        b = evaluate(gt, ranks_from_scores(scores))
        for s in a.setups:
            np.testing.assert_array_equal(a.setups[s].ap, b.setups[s].ap)
            np.testing.assert_array_equal(a.setups[s].p_at_k, b.setups[s].p_at_k)


def assert_matches_stable_sort(got, labels, scores):
    """The kernel's labelled positions equal those of a full stable descending sort."""
    order = ranks_from_scores(scores)
    n = scores.shape[0]
    for q, (idx, codes) in enumerate(labels):
        rank_of = np.empty(n, np.int64)
        rank_of[order[q]] = np.arange(n)
        np.testing.assert_array_equal(got[q][0], np.sort(rank_of[idx]))
        np.testing.assert_array_equal(got[q][1], codes[np.argsort(rank_of[idx])])


@pytest.mark.parametrize("n_bins", [1, 3, 64, 4096])
def test_score_kernel_exact_for_any_bin_count(n_bins):
    rng = np.random.default_rng(n_bins)
    n, nq = 2000, 6
    gt = random_gt(rng, "revisited", n, nq, allow_empty=False)
    base = rng.standard_normal((n, nq)).astype(np.float32)
    base[rng.random((n, nq)) < 0.3] = 0.25  # a big tie
    base[5, 2] = np.inf
    base[6, 3] = -np.inf
    labels = query_labels(gt)
    got = labelled_ranks_from_scores(base, labels, n_bins=n_bins, block_rows=97)
    assert_matches_stable_sort(got, labels, base)


@pytest.mark.parametrize("max_candidates", [None, 10])
def test_score_kernel_huge_ties(max_candidates):
    """Sparse-retrieval scores: most images (labelled ones too) score exactly 0."""
    rng = np.random.default_rng(11)
    n, nq = 3000, 5
    gt = random_gt(rng, "revisited", n, nq, allow_empty=False)
    scores = np.zeros((n, nq), np.float32)
    hits = rng.random((n, nq)) < 0.02
    scores[hits] = rng.integers(1, 5, hits.sum())  # few, tied, retrieved
    labels = query_labels(gt)
    got = labelled_ranks_from_scores(scores, labels, max_candidates=max_candidates, block_rows=500)
    assert_matches_stable_sort(got, labels, scores)


def test_score_kernel_infinite_labelled_scores_fall_back():
    gt = GroundTruth("t", "original", tuple("abcde"), (make_query("q", good=[1, 3], junk=[0]),))
    scores = np.array([[np.inf], [np.inf], [0.0], [-np.inf], [1.0]])
    a = evaluate_scores(gt, scores)
    b = evaluate(gt, ranks_from_scores(scores))
    assert a.setups["original"].ap.tolist() == b.setups["original"].ap.tolist()


def test_features_path_matches_scores():
    rng = np.random.default_rng(5)
    gt = random_gt(rng, "original", 300, 4)
    q = rng.standard_normal((4, 16)).astype(np.float32)
    x = rng.standard_normal((310, 16)).astype(np.float32)
    a = evaluate_features(gt, q, x, n_distractors=10, chunk_rows=33)
    b = evaluate_scores(gt, x @ q.T, n_distractors=10)
    assert a.setups["original"].ap.tolist() == b.setups["original"].ap.tolist()


# ---------------------------------------------------------------------------------------------
# Properties


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    protocol = draw(st.sampled_from(["revisited", "original", "holidays"]))
    gt = random_gt(
        rng, protocol, draw(st.integers(12, 30)), draw(st.integers(1, 4)), allow_empty=False
    )
    return gt, random_ranks(rng, gt, gt.n_db)


@settings(max_examples=60, deadline=None)
@given(cases())
def test_ap_in_unit_interval_and_reference(case):
    gt, ranks = case
    res = evaluate(gt, np.array(ranks), gaps=True)
    for s in res.setups.values():
        assert np.all((s.ap >= 0) & (s.ap <= 1 + 1e-12))
        assert np.all((s.p_at_k >= 0) & (s.p_at_k <= 1 + 1e-12))
    assert_matches_reference(gt, ranks, res)


@settings(max_examples=40, deadline=None)
@given(cases())
def test_perfect_ranking_scores_one(case):
    gt, _ = case
    for setup, (pos_f, _ign) in REF_SETUPS[gt.protocol].items():
        ranks = []
        for q in gt.queries:
            pos = [int(i) for f in pos_f for i in getattr(q, f)]
            rest = [i for i in range(gt.n_db) if i not in set(pos)]
            ranks.append(pos + rest)
        s = evaluate(gt, np.array(ranks)).setups[setup]
        used = [i for i in range(gt.n_queries) if i not in s.skipped]
        # exactly 1 up to the official accumulation order (N terms of 1/N)
        np.testing.assert_allclose(s.ap[used], 1.0, rtol=0, atol=1e-12)
        assert s.map == pytest.approx(1.0, abs=1e-12)
        assert all(v == 1.0 for v in s.mp_at_k.values())


@settings(max_examples=40, deadline=None)
@given(cases())
def test_deleting_ignored_items_changes_nothing(case):
    gt, ranks = case
    res = evaluate(gt, np.array(ranks), gaps=True)
    for setup, (_pos, ign_f) in REF_SETUPS[gt.protocol].items():
        pruned = []
        for q, lst in zip(gt.queries, ranks, strict=True):
            ign = {int(i) for f in ign_f for i in getattr(q, f)}
            pruned.append([i for i in lst if i not in ign])
        width = max(len(p) for p in pruned)
        pruned_arr = np.array([p + [-1] * (width - len(p)) for p in pruned])
        other = evaluate(gt, pruned_arr, gaps=True).setups[setup]
        np.testing.assert_allclose(other.ap, res.setups[setup].ap, atol=1e-12, equal_nan=True)


@settings(max_examples=40, deadline=None)
@given(cases(), st.randoms(use_true_random=False))
def test_permuting_queries_permutes_results(case, rnd):
    gt, ranks = case
    perm = list(range(gt.n_queries))
    rnd.shuffle(perm)
    gt2 = GroundTruth(gt.dataset, gt.protocol, gt.db_names, tuple(gt.queries[i] for i in perm))
    a = evaluate(gt, np.array(ranks), gaps=True)
    b = evaluate(gt2, np.array(ranks)[perm], gaps=True)
    for s in a.setups:
        np.testing.assert_array_equal(b.setups[s].ap, a.setups[s].ap[perm])
        np.testing.assert_array_equal(b.setups[s].p_at_k, a.setups[s].p_at_k[perm])
        assert b.setups[s].map == pytest.approx(a.setups[s].map, abs=1e-12)


_SPECIAL = [0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 0.5, 1e-40, -1e-40, 3.4e38, -3.4e38, 2.0**-149]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(_SPECIAL), st.floats(-1e6, 1e6, width=32)), max_size=80))
def test_descending_order_is_the_stable_float_sort(values):
    """The key sort of float32 scores is exactly ``argsort(-s, kind="stable")``: ties (``-0.0`` is
    ``0.0``), infinities and subnormals included."""
    col = np.array(values, np.float32)
    assert np.array_equal(descending_order(col), np.argsort(-col, kind="stable"))
    col64 = col.astype(np.float64)
    assert np.array_equal(descending_order(col64), np.argsort(-col64, kind="stable"))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 6), st.sampled_from([np.float32, np.float64]))
def test_scores_path_equals_ranks_path_property(seed, n_values, dtype):
    """Few distinct score values = many ties: the stable order decides, both paths agree."""
    rng = np.random.default_rng(seed)
    gt = random_gt(
        rng, "revisited", int(rng.integers(12, 80)), int(rng.integers(1, 4)), allow_empty=False
    )
    scores = rng.integers(0, n_values, size=(gt.n_db, gt.n_queries)).astype(dtype)
    a = evaluate_scores(gt, scores)
    b = evaluate(gt, ranks_from_scores(scores))
    for name in a.setups:
        np.testing.assert_array_equal(a.setups[name].ap, b.setups[name].ap)
        np.testing.assert_array_equal(a.setups[name].p_at_k, b.setups[name].p_at_k)


def test_revisitop_layout_round_trip():
    r = np.arange(12).reshape(3, 4)
    assert to_revisitop(from_revisitop(r)) is not None
    np.testing.assert_array_equal(to_revisitop(from_revisitop(r)), r)
    assert from_revisitop(r).shape == (4, 3)
    with pytest.raises(InputError, match="2-D"):
        from_revisitop(np.arange(3))


# ---------------------------------------------------------------------------------------------
# Bad input


@pytest.fixture
def small_gt() -> GroundTruth:
    return GroundTruth(
        "small",
        "revisited",
        tuple(f"im{i}" for i in range(10)),
        (
            make_query("qa", easy=[0, 1], hard=[2], junk=[3]),
            make_query("qb", easy=[4], hard=[5, 6]),
        ),
    )


def full(q0, q1=None):
    """Two ranked lists, the shorter padded with -1."""
    q1 = list(range(10)) if q1 is None else q1
    w = max(len(q0), len(q1))
    return np.array([list(q0) + [-1] * (w - len(q0)), list(q1) + [-1] * (w - len(q1))])


@pytest.mark.parametrize(
    ("ranks", "match"),
    [
        (full([0, 1, 2, 2, 4, 5, 6, 7, 8, 9]), r"query 0 \(qa\): image 2 appears more than once"),
        (
            full([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [9, 8, 7, 6, 5, 4, 3, 2, 1, 9]),
            r"query 1 \(qb\): image 9",
        ),
        (full([0, 1, -2, 3, 4, 5, 6, 7, 8, 9]), r"query 0 \(qa\): rank position 2 holds index -2"),
        (full([0, 1, 2, 3, 4, 5, 6, 7, 8, 10]), r"holds index 10, but database indices are 0..9"),
        (full([0, 1, 2, 3, 4, 5, 6, 7, 8, 9.5]), r"these look like scores: use --scores"),
        (np.arange(10), r"2-D"),
        (np.arange(10)[None, :], r"1 ranked lists .* 2 queries"),
        (np.zeros((2, 10), dtype=bool), r"integer indices"),
        (np.array([["a"] * 3] * 2), r"integer indices"),
    ],
)
def test_bad_ranks(small_gt, ranks, match):
    with pytest.raises(InputError, match=match) as exc:
        evaluate(small_gt, ranks, source="R.npy")
    assert str(exc.value).startswith("R.npy: ")
    assert "\n" not in str(exc.value)


def test_duplicates_across_blocks_and_inside_one(small_gt):
    labels = query_labels(small_gt)
    bad = full([0, 1, 2, 3, 4, 5, 6, 7, 8, 0])
    for arr in (bad, np.asfortranarray(bad)):
        for kw in (
            {"block_elems": 1},
            {"block_elems": 1 << 20},
            {"group": 1, "block_elems": 3},
            {},
        ):
            with pytest.raises(InputError, match="image 0 appears more than once"):
                labelled_positions_from_ranks(arr, labels, 10, **kw)
    # a repeated unlabelled image is an error too, and -1 gaps are not duplicates
    with pytest.raises(InputError, match="image 9 appears"):
        evaluate(small_gt, full([9, 0, 9]), padding=-1)
    res = evaluate(small_gt, full([-1, 0, -1, -1], [-1, -1, 4, -1]), gaps=True)
    assert res.setups["easy"].ap.tolist() == pytest.approx([0.5 * (0 + 1 / 2) / 2, (0 + 1 / 3) / 2])


def test_distractors(small_gt):
    ranks = full([12, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    with pytest.raises(InputError, match="holds index 12, but database indices are 0..9"):
        evaluate(small_gt, ranks, padding=-1)
    res = evaluate(small_gt, ranks, n_distractors=3, padding=-1)
    assert res.setups["easy"].ap[0] == pytest.approx(
        (1 / 2 * (0 + 1 / 2) + 1 / 2 * (1 / 2 + 2 / 3)) / 2
    )
    with pytest.raises(InputError, match="distractors 10..12"):
        evaluate(small_gt, full([13]), n_distractors=3, padding=-1)


@pytest.mark.parametrize("layout", ["C", "F"])
def test_bad_ranks_with_many_distractors(small_gt, layout):
    """With distractors dominating, labelled images are found by comparison: same checks."""
    n = 10 + 40

    def check(rows, match):
        arr = np.array(rows)
        arr = np.asfortranarray(arr) if layout == "F" else arr
        with pytest.raises(InputError, match=match):
            evaluate(small_gt, arr, n_distractors=40, gaps=True)

    base = list(range(n))
    check([base, base[:-1] + [n]], r"query 1 \(qb\): rank position 49 holds index 50")
    check([base, base[:-1] + [n + 7]], "holds index 57")
    check([base, [-1, -3] + base[2:]], "holds index -3")
    check([base, [-1, 50] + base[2:]], "holds index 50")
    check([base[:-1] + [45], base], r"query 0 \(qa\): image 45 appears")
    check([base[:-1] + [4], base], "image 4 appears")
    res = evaluate(small_gt, np.array([base, [-1] * 5 + base[5:]]), n_distractors=40, gaps=True)
    assert_matches_reference(small_gt, [base, [-1] * 5 + base[5:]], res)


def test_inconsistent_ground_truth():
    gt = GroundTruth("x", "revisited", ("a", "b", "c"), (make_query("q", easy=[0], junk=[0]),))
    with pytest.raises(InputError, match="labelled both easy and junk"):
        evaluate(gt, np.array([[0, 1, 2]]))
    gt = GroundTruth("x", "revisited", ("a", "b", "c"), (make_query("q", easy=[5]),))
    with pytest.raises(InputError, match="outside the database"):
        evaluate(gt, np.array([[0, 1, 2]]))


def test_every_query_empty_in_a_setup():
    gt = GroundTruth(
        "x", "revisited", ("a", "b", "c"), (make_query("q", hard=[1]), make_query("r", hard=[2]))
    )
    with pytest.raises(InputError, match="no query has positives in the 'easy' setup"):
        evaluate(gt, np.array([[0, 1, 2], [0, 1, 2]]))


def test_bad_scores(small_gt):
    s = np.zeros((10, 2), np.float32)
    s[7, 1] = np.nan
    with pytest.raises(InputError, match=r"query 1 \(qb\): score of database image 7 is NaN"):
        evaluate_scores(small_gt, s)
    s[5, 1] = np.nan  # a labelled one
    with pytest.raises(InputError, match="score of database image 5 is NaN"):
        evaluate_scores(small_gt, s)
    with pytest.raises(InputError, match="12 rows but the database has 10 images"):
        evaluate_scores(small_gt, np.zeros((12, 2)))
    with pytest.raises(InputError, match="3 columns"):
        evaluate_scores(small_gt, np.zeros((10, 3)))
    assert evaluate_scores(small_gt, np.zeros((12, 2)), n_distractors=2).setups["easy"].map > 0
    with pytest.raises(InputError, match="ks must be"):
        evaluate(small_gt, full(list(range(10))), ks=(0, 5))


# ---------------------------------------------------------------------------------------------
# Real ground truth (skipped without $OXBENCH_SHARED_DATA)


def _lopq(shared_data, gt_old):
    raw = np.fromfile(shared_data / "oxford5k/lopq_features/oxford_features.fvecs", dtype=np.int32)
    d = int(raw[0])
    x = raw.reshape(-1, d + 1)[:, 1:].view(np.float32)
    row = {n: i for i, n in enumerate(sorted(gt_old.db_names))}
    x = x[[row[n] for n in gt_old.db_names]]
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.shared_data
def test_real_oxford_descriptors_regression_anchor(shared_data):
    from oxbench.formats.revisitop import read_gnd

    old = read_gnd(shared_data / "oxford5k/gnd_oxford5k.pkl")
    x = _lopq(shared_data, old)
    pos = {n: i for i, n in enumerate(old.db_names)}
    res = evaluate_features(old, x[[pos[n] for n in old.query_names]], x)
    assert res.lines()[0].startswith("oxford5k: mAP 40.29")
    rev = read_gnd(shared_data / "roxford5k/gnd_roxford5k.pkl")
    xr = x[[pos[n] for n in rev.db_names]]
    qr = x[[pos[n] for n in rev.query_names]]
    res = evaluate_features(rev, qr, xr)
    assert res.lines()[0] == "roxford5k: mAP E: 28.89, M: 21.13, H: 4.60"
    assert len(res.setups["easy"].skipped) == 2 and not res.setups["hard"].skipped
    # the ranks path (revisitop layout, truncated to the top 1000) agrees with the reference
    ranks = ranks_from_scores(xr @ qr.T)[:, :1000]
    truncated = evaluate(rev, from_revisitop(to_revisitop(ranks)))
    assert_matches_reference(rev, ranks.tolist(), truncated)


def test_table_exporters():
    from oxbench.report.tables import csv_text

    gt = worked_gt(None)
    res = evaluate(gt, np.arange(9)[None, :])
    md = result_table(res, "markdown").splitlines()
    assert md[0] == "| setup | queries | mAP | mP@1 | mP@5 | mP@10 |"
    assert md[2].startswith("| original | 1/1 | 83.54 |")
    tex = result_table(res, "latex")
    assert (
        tex.startswith(r"\begin{tabular}{lrrrrr}")
        and r"mAP & mP@1" in tex
        and r"\bottomrule" in tex
    )
    csv = csv_text(res.per_query_rows()).splitlines()
    assert csv[0] == "setup,query_index,query,n_positives,ap,p@1,p@5,p@10"
    assert csv[1].startswith("original,0,q,4,0.8354166666666666,1.0,0.6,")


def test_docstring_examples():
    import doctest

    import oxbench.evaluation.ap as ap_mod
    import oxbench.evaluation.protocols as protocols_mod
    import oxbench.evaluation.ranking as ranking_mod
    import oxbench.report.tables as tables_mod

    for mod in (ap_mod, protocols_mod, ranking_mod, tables_mod):
        failed, _ = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert failed == 0, mod.__name__


# ---------------------------------------------------------------------------------------------
# One scoring engine: the exported AP / P@K are evaluate's per-query numbers, bit for bit.


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from("pjn"), min_size=1, max_size=60),
    st.integers(0, 5),
    st.lists(st.integers(1, 70), min_size=1, max_size=4, unique=True),
)
def test_exported_ap_and_pk_equal_evaluate_bit_for_bit(labels, missing, ks):
    """A ranked list of positives (p), ignored (j) and negatives (n), plus positives it misses."""
    from oxbench.evaluation import average_precision, precision_at_ks

    n = len(labels)
    good = [i for i, c in enumerate(labels) if c == "p"] + list(range(n, n + missing))
    if not good:
        return
    junk = [i for i, c in enumerate(labels) if c == "j"]
    gt = GroundTruth(
        "x",
        "original",
        tuple(f"i{i}" for i in range(n + missing)),
        (make_query("q", good=good, junk=junk),),
    )
    res = evaluate(gt, np.arange(n)[None, :], ks=ks).setups["original"]
    kept = [c for c in labels if c != "j"]
    positions = [r for r, c in enumerate(kept) if c == "p"]
    assert average_precision(positions, len(good)) == res.ap[0]  # exactly, not approximately
    assert precision_at_ks(positions, ks).tolist() == res.p_at_k[0].tolist()


def test_declared_distractor_counts_are_bounded(small_gt):
    from oxbench.evaluation.protocols import MAX_DISTRACTORS

    ranks = full(list(range(10)))
    for bad in (2**63 - 1, MAX_DISTRACTORS + 1, -1, 2.5, True):
        with pytest.raises(InputError, match="n_distractors"):
            evaluate(small_gt, ranks, n_distractors=bad, padding=-1)
    assert (
        evaluate(small_gt, ranks, n_distractors=MAX_DISTRACTORS, padding=-1).n_distractors
        == MAX_DISTRACTORS
    )
