"""The compiled accelerator (``oxbench.evaluation._accel``) against the numpy kernels.

Both paths must give identical numbers and identical errors. The numpy path is forced with the
environment variable ``OXBENCH_NO_ACCEL=1`` (read at every call); comparisons with the compiled
path are skipped when the extension was not built.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation import evaluate, evaluate_scores, from_revisitop
from oxbench.evaluation import kernels as K
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.index.postings import CompressedPostings, vbyte_encode

needs_accel = pytest.mark.skipif(not K.ACCELERATED, reason="compiled extension not built")


def _with_env(monkeypatch: pytest.MonkeyPatch, no_accel: bool, fn, *args, **kw):
    """Run ``fn``; return ("ok", result) or ("err", type, message)."""
    with monkeypatch.context() as m:
        if no_accel:
            m.setenv("OXBENCH_NO_ACCEL", "1")
        else:
            m.delenv("OXBENCH_NO_ACCEL", raising=False)
        try:
            return ("ok", fn(*args, **kw))
        except InputError as e:
            return ("err", type(e), str(e))


def _same(a, b) -> None:
    assert a[0] == b[0], (a, b)
    if a[0] == "err":
        assert a[1:] == b[1:]
        return
    ra, rb = a[1], b[1]
    assert len(ra) == len(rb)
    for (pa, ca), (pb, cb) in zip(ra, rb, strict=True):
        assert pa.dtype == pb.dtype == np.int64 and ca.dtype == cb.dtype == np.uint8
        np.testing.assert_array_equal(pa, pb)
        np.testing.assert_array_equal(ca, cb)


def _both(monkeypatch: pytest.MonkeyPatch, fn, *args, **kw):
    fast = _with_env(monkeypatch, False, fn, *args, **kw)
    slow = _with_env(monkeypatch, True, fn, *args, **kw)
    _same(fast, slow)
    return fast


def _labels(rng: np.random.Generator, nq: int, n_db: int, max_lab: int) -> list[K.Labels]:
    out = []
    for _ in range(nq):
        m = int(rng.integers(0, min(max_lab, n_db) + 1))
        idx = np.sort(rng.choice(n_db, size=m, replace=False)).astype(np.int64)
        out.append((idx, rng.integers(1, 4, size=m).astype(np.uint8)))
    return out


def _ranks(rng: np.random.Generator, nq: int, n_index: int, k: int, gaps: float) -> np.ndarray:
    r = np.stack([rng.permutation(n_index)[:k] for _ in range(nq)]).astype(np.int64)
    r[rng.random(r.shape) < gaps] = -1
    return r


def _layouts(r: np.ndarray) -> dict[str, np.ndarray]:
    """The same internal-layout ranks in several memory layouts and dtypes."""
    wide = np.full((r.shape[0], 2 * r.shape[1]), 7, dtype=np.int64)
    wide[:, ::2] = r
    return {
        "internal": r,
        "revisitop": from_revisitop(np.ascontiguousarray(r.T)),
        "strided": wide[:, ::2],
        "reversed-queries": np.ascontiguousarray(r[::-1])[::-1],
        "int32": r.astype(np.int32),
        "int32-revisitop": from_revisitop(np.ascontiguousarray(r.T.astype(np.int32))),
        "float": r.astype(np.float64),
        "uint16": r.astype(np.uint16) if r.min(initial=0) >= 0 else r.astype(np.int16),
    }


def test_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OXBENCH_NO_ACCEL", "1")
    assert not K.accelerated()
    monkeypatch.setenv("OXBENCH_NO_ACCEL", "0")
    assert K.accelerated() == K.ACCELERATED
    monkeypatch.delenv("OXBENCH_NO_ACCEL")
    assert K.accelerated() == K.ACCELERATED


@needs_accel
@pytest.mark.parametrize("seed", range(6))
def test_ranks_random_layouts(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(seed)
    nq, n_db = int(rng.integers(1, 9)), int(rng.integers(5, 300))
    n_index = n_db + int(rng.integers(0, 2)) * int(
        rng.integers(0, 2000)
    )  # with/without distractors
    k = int(rng.integers(1, n_index + 1))  # truncated lists
    labels = _labels(rng, nq, n_db, 40)
    r = _ranks(rng, nq, n_index, k, gaps=float(rng.choice([0.0, 0.05, 0.5])))
    ref = _with_env(
        monkeypatch, True, K.labelled_positions_from_ranks, r, labels, n_index, n_db=n_db
    )
    assert ref[0] == "ok"
    # the compiled kernel accepts clean int64/int32 input (it does not silently decline)
    assert K._accel_positions_from_ranks(r, labels, n_index, 0.2) is not None
    for name, arr in _layouts(r).items():
        got = _both(monkeypatch, K.labelled_positions_from_ranks, arr, labels, n_index, n_db=n_db)
        _same(got, ref), name


@needs_accel
@pytest.mark.parametrize("seed", range(8))
def test_ranks_errors_identical(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    nq, n_db, n_index, k = 5, 60, 90, 50
    labels = _labels(rng, nq, n_db, 10)
    names = [f"q{i}" for i in range(nq)]
    r = _ranks(rng, nq, n_index, k, gaps=0.1)
    q, j, j2 = int(rng.integers(nq)), int(rng.integers(k)), int(rng.integers(k))
    kind = seed % 4
    if kind == 0:  # duplicate (maybe of a labelled image)
        r[q, j] = labels[q][0][0] if labels[q][0].size else 3
        r[q, (j + 1 + j2) % k] = r[q, j]
    elif kind == 1:
        r[q, j] = n_index
    elif kind == 2:
        r[q, j] = -2
    else:
        r[q, j] = 10**12
    for arr in _layouts(r).values():
        if arr.dtype == np.uint16 or (arr.dtype == np.int16 and kind == 3):
            continue
        got = _both(
            monkeypatch,
            K.labelled_positions_from_ranks,
            arr,
            labels,
            n_index,
            n_db=n_db,
            names=names,
            source="r.npy",
        )
        assert got[0] == "err" and "r.npy" in got[2]


@needs_accel
def test_ranks_group_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queries scanned in several groups (tiny budget) give the same result."""
    rng = np.random.default_rng(7)
    labels = _labels(rng, 40, 50, 8)
    r = _ranks(rng, 40, 50, 30, gaps=0.1)
    a = K._accel_positions_from_ranks(r, labels, 50, 0.2)
    b = K._accel_positions_from_ranks(from_revisitop(np.ascontiguousarray(r.T)), labels, 50, 0.0)
    with monkeypatch.context() as m:
        m.setenv("OXBENCH_NO_ACCEL", "1")
        c = K.labelled_positions_from_ranks(r, labels, 50)
    _same(("ok", a), ("ok", c))
    _same(("ok", b), ("ok", c))


@needs_accel
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_ranks_hypothesis(monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    n_index = data.draw(st.integers(1, 30))
    nq = data.draw(st.integers(1, 4))
    k = data.draw(st.integers(0, 35))
    ranks = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(-3, n_index + 1), min_size=k, max_size=k),
                min_size=nq,
                max_size=nq,
            )
        ),
        dtype=np.int64,
    ).reshape(nq, k)
    labels = []
    for _ in range(nq):
        idx = np.array(
            sorted(data.draw(st.sets(st.integers(0, n_index - 1), max_size=6))), np.int64
        )
        labels.append(
            (
                idx,
                np.array(
                    data.draw(st.lists(st.integers(1, 3), min_size=idx.size, max_size=idx.size)),
                    np.uint8,
                ),
            )
        )
    layout = data.draw(st.sampled_from(["internal", "revisitop", "int32"]))
    arr = {
        "internal": ranks,
        "revisitop": from_revisitop(np.ascontiguousarray(ranks.T)),
        "int32": ranks.astype(np.int32),
    }[layout]
    _both(
        monkeypatch, K.labelled_positions_from_ranks, arr, labels, n_index, names=None, source="x"
    )


# ---------------------------------------------------------------------------------------------
# Scores


def _reference_from_scores(scores: np.ndarray, labels: list[K.Labels]) -> list[K.Found]:
    """Deliberately simple: stable descending argsort of each column."""
    out = []
    for q, (idx, codes) in enumerate(labels):
        col = scores[:, q].astype(np.float64)
        rank_of = np.empty(col.size, np.int64)
        rank_of[np.argsort(-col, kind="stable")] = np.arange(col.size)
        r = rank_of[idx]
        o = np.argsort(r, kind="stable")
        out.append((r[o], codes[o]))
    return out


def _score_layouts(s: np.ndarray) -> dict[str, np.ndarray]:
    big = np.zeros((s.shape[0] * 2, s.shape[1] * 3), dtype=s.dtype)
    big[::2, ::3] = s
    return {
        "C": np.ascontiguousarray(s),
        "F": np.asfortranarray(s),
        "strided": big[::2, ::3],
        "negative-stride": np.ascontiguousarray(s[::-1])[::-1],
    }


@needs_accel
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scores_random_with_ties(monkeypatch: pytest.MonkeyPatch, seed: int, dtype) -> None:
    rng = np.random.default_rng(seed)
    n, nq = int(rng.integers(1, 3000)), int(rng.integers(1, 7))
    s = rng.normal(size=(n, nq))
    if seed % 2:  # heavy ties, signed zeros, infinities
        s = np.round(s * 3) / 3
        s[rng.random(s.shape) < 0.1] = 0.0
        s[rng.random(s.shape) < 0.1] = -0.0
        s[rng.random(s.shape) < 0.02] = np.inf
        s[rng.random(s.shape) < 0.02] = -np.inf
    s = s.astype(dtype)
    labels = _labels(rng, nq, n, 50)
    ref = _reference_from_scores(s, labels)
    assert K._accel_ranks_from_scores(s, labels) is not None
    for arr in _score_layouts(s).values():
        got = _both(monkeypatch, K.labelled_ranks_from_scores, arr, labels)
        _same(got, ("ok", ref))


@needs_accel
@pytest.mark.parametrize("where", ["labelled", "other"])
@pytest.mark.parametrize("order", ["C", "F"])
def test_scores_nan_refused_identically(
    monkeypatch: pytest.MonkeyPatch, where: str, order: str
) -> None:
    rng = np.random.default_rng(3)
    s = rng.random((500, 4)).astype(np.float32)
    labels = _labels(rng, 4, 500, 20)
    q = next(i for i, (idx, _) in enumerate(labels) if idx.size)
    row = (
        int(labels[q][0][0])
        if where == "labelled"
        else int(np.setdiff1d(np.arange(500), labels[q][0])[-1])
    )
    s[row, q] = np.nan
    arr = np.asfortranarray(s) if order == "F" else s
    got = _both(
        monkeypatch, K.labelled_ranks_from_scores, arr, labels, names=list("abcd"), source="s"
    )
    assert got[0] == "err" and "NaN" in got[2]


@needs_accel
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float16, np.uint8])
def test_scores_other_dtypes_fall_back(monkeypatch: pytest.MonkeyPatch, dtype) -> None:
    rng = np.random.default_rng(5)
    s = rng.integers(0, 20, size=(300, 3)).astype(dtype)
    labels = _labels(rng, 3, 300, 15)
    got = _both(monkeypatch, K.labelled_ranks_from_scores, s, labels)
    _same(got, ("ok", _reference_from_scores(s, labels)))


@needs_accel
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_scores_hypothesis(monkeypatch: pytest.MonkeyPatch, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 40))
    nq = data.draw(st.integers(1, 9))  # 4 and more contiguous float32 queries: the SSE2 bin map
    pool = st.sampled_from([0.0, -0.0, 0.5, -0.5, 1.0, 1e30, -1e30, np.inf, -np.inf, 3e-39, 0.25])
    vals = data.draw(
        st.lists(st.one_of(pool, st.floats(-2, 2, width=32)), min_size=n * nq, max_size=n * nq)
    )
    dtype = data.draw(st.sampled_from([np.float32, np.float64]))
    s = np.array(vals, dtype=dtype).reshape(n, nq)
    if data.draw(st.booleans()):
        s = np.asfortranarray(s)
    labels = []
    for _ in range(nq):
        idx = np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=8))), np.int64)
        labels.append((idx, np.full(idx.size, data.draw(st.integers(1, 3)), np.uint8)))
    got = _both(monkeypatch, K.labelled_ranks_from_scores, s, labels)
    _same(got, ("ok", _reference_from_scores(s, labels)))


# ---------------------------------------------------------------------------------------------
# End to end: evaluate / evaluate_scores give equal results on both paths.


def _revisited_case(rng: np.random.Generator, n_db: int, nq: int) -> GroundTruth:
    queries = []
    for i in range(nq):
        lab = rng.choice(n_db, size=12, replace=False)
        queries.append(make_query(f"q{i}", easy=lab[:5], hard=lab[5:9], junk=lab[9:]))
    return GroundTruth("toy", "revisited", tuple(f"db{i}" for i in range(n_db)), tuple(queries))


@needs_accel
def test_end_to_end_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    gt = _revisited_case(rng, 200, 6)
    s = np.round(rng.random((200 + 500, 6)), 2).astype(np.float32)  # ties
    res = {}
    for flag in (False, True):
        with monkeypatch.context() as m:
            if flag:
                m.setenv("OXBENCH_NO_ACCEL", "1")
            a = evaluate_scores(gt, s, n_distractors=500)
            ranks = np.argsort(-s, axis=0, kind="stable")  # full lists: same as the scores
            b = evaluate(gt, from_revisitop(ranks), n_distractors=500)
            res[flag] = (a.to_dict(), b.to_dict())
    assert res[False] == res[True]
    assert res[False][0] == res[False][1]


@needs_accel
def test_ranks_several_query_groups_and_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large index (bitsets of 375 KB a query: groups of 2 queries) and several position blocks."""
    rng = np.random.default_rng(21)
    n_db, n_index, nq, k = 300, 3_000_000, 5, 40
    labels = _labels(rng, nq, n_db, 30)
    r = np.stack(
        [
            np.concatenate(
                [
                    rng.permutation(n_db)[: k // 2],
                    rng.choice(n_index - n_db, k // 2, replace=False) + n_db,
                ]
            )
            for _ in range(nq)
        ]
    ).astype(np.int64)
    rev = np.ascontiguousarray(r.T)
    got = _both(
        monkeypatch,
        K.labelled_positions_from_ranks,
        from_revisitop(rev),
        labels,
        n_index,
        n_db=n_db,
    )
    _same(
        got,
        _with_env(
            monkeypatch, True, K.labelled_positions_from_ranks, r, labels, n_index, n_db=n_db
        ),
    )
    # tiny group and block budgets: one query and 16 positions at a time
    out: list[np.ndarray] = []
    sizes = np.array([idx.size for idx, _ in labels])
    off = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    tables = np.zeros((nq, n_db), np.uint8)
    for q, (idx, codes) in enumerate(labels):
        tables[q, idx] = codes
    pos, code, count = (
        np.empty(off[-1], np.int64),
        np.empty(off[-1], np.uint8),
        np.zeros(nq, np.int64),
    )
    assert (
        K._accel.scan_ranks(from_revisitop(rev), tables, n_index, off, pos, code, count, 1, 1) == 0
    )
    for q in range(nq):
        out.append(pos[off[q] : off[q] + count[q]])
        np.testing.assert_array_equal(out[q], got[1][q][0])
    # a duplicate in the last group is still found
    rev[30, 4] = rev[31, 4]
    bad = _both(
        monkeypatch,
        K.labelled_positions_from_ranks,
        from_revisitop(rev),
        labels,
        n_index,
        n_db=n_db,
    )
    assert bad[0] == "err" and "more than once" in bad[2]


@needs_accel
@pytest.mark.parametrize("ties", [False, True])
def test_scores_several_query_groups(monkeypatch: pytest.MonkeyPatch, ties: bool) -> None:
    """70 queries (several groups of queries sharing a cache budget), C and F order."""
    rng = np.random.default_rng(31)
    n, nq = 5000, 70
    s = rng.normal(size=(n, nq)).astype(np.float32)
    if ties:
        s = np.round(s * 4) / 4
    labels = _labels(rng, nq, n, 120)
    ref = _reference_from_scores(s, labels)
    for arr in (s, np.asfortranarray(s)):
        got = _both(monkeypatch, K.labelled_ranks_from_scores, arr, labels)
        _same(got, ("ok", ref))


# ---------------------------------------------------------------------------------------------
# The C entry points themselves, called directly with hostile arguments: a ValueError, never a crash.

_HOSTILE = r"""
import numpy as np
from oxbench.evaluation import _accel

def ranks_args(**over):
    a = dict(ranks=np.array([[0, 1, 2], [2, 1, 0]], np.int64), tables=np.zeros((2, 3), np.uint8),
             n_index=3, off=np.array([0, 1, 2], np.int64), pos=np.zeros(2, np.int64),
             code=np.zeros(2, np.uint8), count=np.zeros(2, np.int64))
    a["tables"][:, 1] = 1
    a.update(over)
    return (a["ranks"], a["tables"], a["n_index"], a["off"], a["pos"], a["code"], a["count"])

def scores_args(**over):
    a = dict(scores=np.zeros((4, 2), np.float64), row_outer=True, u=np.zeros(2), u_off=np.array([0, 1, 2], np.int64),
             ev_row=np.array([0, 1], np.int64), ev_q=np.array([0, 1], np.int64), ev_key=np.array([1, 1], np.int64),
             snap=np.zeros(2, np.int64), cnt=np.zeros(6, np.int64), cnt_off=np.array([0, 3, 6], np.int64),
             n_bins=16, group=1)
    a.update(over)
    return tuple(a.values())

assert _accel.scan_ranks(*ranks_args()) == 0
assert _accel.score_ranks(*scores_args()) == 0
cases = [
    ("scan", dict(n_index=-1)), ("scan", dict(n_index=-(2**62))), ("scan", dict(n_index=2**62)),
    ("scan", dict(off=np.array([-5, 0, 2], np.int64))), ("scan", dict(off=np.array([0, 2, 1], np.int64))),
    ("scan", dict(off=np.array([3, 4, 5], np.int64))), ("scan", dict(off=np.array([0, 1], np.int64))),
    ("scan", dict(off=np.array([0, 1, 2**40], np.int64))), ("scan", dict(pos=np.zeros(1, np.int64))),
    ("scan", dict(tables=np.zeros((3, 3), np.uint8))), ("scan", dict(count=np.zeros(1, np.int64))),
    ("score", dict(u_off=np.array([-1, 0, 1], np.int64))), ("score", dict(u_off=np.array([0, 2, 1], np.int64))),
    ("score", dict(u_off=np.array([0, 1, 9], np.int64))), ("score", dict(cnt_off=np.array([-3, 0, 3], np.int64))),
    ("score", dict(cnt_off=np.array([0, 5, 6], np.int64))), ("score", dict(cnt=np.zeros(2, np.int64))),
    ("score", dict(n_bins=2**30)), ("score", dict(n_bins=-5)), ("score", dict(group=0)),
    ("score", dict(ev_q=np.array([0, 7], np.int64))), ("score", dict(ev_row=np.array([0, -1], np.int64))),
    ("score", dict(ev_key=np.array([1, 99], np.int64))), ("score", dict(snap=np.zeros(1, np.int64))),
]
for kind, over in cases:
    fn, args = (_accel.scan_ranks, ranks_args(**over)) if kind == "scan" else (_accel.score_ranks, scores_args(**over))
    try:
        fn(*args)
    except ValueError:
        continue
    raise SystemExit(f"accepted {kind} {over}")
print("ok", len(cases))
"""


@needs_accel
def test_c_entry_points_refuse_hostile_sizes_and_offsets():
    """Negative n_index, negative / decreasing / overlong offsets, short buffers: ValueError, no crash.

    Run in a child process, so that a crash fails this test instead of killing the test run.
    """
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    res = subprocess.run(
        [sys.executable, "-c", _HOSTILE], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, (res.returncode, res.stdout, res.stderr[-2000:])
    assert res.stdout.startswith("ok 24")


# --- bag of words: the compressed lists' scatter (oxbench.index.postings) ---------------------

needs_bow_kernel = pytest.mark.skipif(
    not K.ACCELERATED or not hasattr(K._accel, "bow_scatter"),
    reason="compiled extension oxbench.evaluation._accel (with bow_scatter) not built: setup.py",
)


def _slow_bow_scores(postings: sp.csr_matrix, q: sp.csr_matrix, dtype: str) -> np.ndarray:
    """The float32 scores written out one posting at a time: the query's words in increasing
    order, each list in image order, ``score = f32(score + f32(q_w * stored weight))``."""
    out = np.zeros((q.shape[0], postings.shape[1]), np.float32)
    for i in range(q.shape[0]):
        row = q[i].tocoo()
        for word, qv in sorted(zip(row.col.tolist(), row.data.tolist(), strict=True)):
            a, b = postings.indptr[word], postings.indptr[word + 1]
            for image, w in zip(postings.indices[a:b], postings.data[a:b], strict=True):
                stored = np.float32(np.asarray(w, np.float32).astype(dtype))
                out[i, image] = np.float32(out[i, image] + np.float32(np.float32(qv) * stored))
    return out


def _weights(rng: np.random.Generator, size: int) -> np.ndarray:
    """Weights of every kind of float32: ordinary, tiny (subnormal), huge, negative, zeros."""
    kind = rng.integers(0, 6, size)
    w = rng.standard_normal(size).astype(np.float32)
    w[kind == 1] *= np.float32(1e-41)  # float32 subnormals
    w[kind == 2] *= np.float32(1e30)
    w[kind == 3] = np.float32(rng.choice([0.0, -0.0]))
    w[kind == 4] = rng.random(int((kind == 4).sum())).astype(np.float32)  # tf-idf-like
    return w


def _random_lists(rng: np.random.Generator, n_words: int, n_db: int) -> sp.csr_matrix:
    """``[n_words, n_db]`` posting lists, each word's images distinct (gaps of 1 to n_db)."""
    rows, cols = [], []
    for word in range(n_words):
        m = int(rng.integers(0, min(n_db, 40) + 1))
        if rng.random() < 0.2:
            m = min(n_db, int(rng.integers(0, 3)))  # near-empty lists
        cols.append(np.sort(rng.choice(n_db, size=m, replace=False)))
        rows.append(np.full(m, word))
    r, c = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((_weights(rng, len(r)), (r, c)), shape=(n_words, n_db))


def _random_queries(rng: np.random.Generator, nq: int, n_words: int) -> sp.csr_matrix:
    rows, cols = [], []
    for i in range(nq):
        w = rng.choice(n_words, size=int(rng.integers(0, n_words + 1)), replace=False)
        rows.append(np.full(len(w), i))
        cols.append(w)
    r, c = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((_weights(rng, len(r)), (r, c)), shape=(nq, n_words))


def _bow_both(monkeypatch: pytest.MonkeyPatch, lists, q):
    return (
        _with_env(monkeypatch, False, lists.scores_of_vectors, q),
        _with_env(monkeypatch, True, lists.scores_of_vectors, q),
    )


@needs_bow_kernel
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31),
    n_words=st.integers(1, 30),
    n_db=st.one_of(st.integers(1, 400), st.sampled_from([2**14 + 3, 2**21 + 5])),
    nq=st.integers(1, 3),
    dtype=st.sampled_from(["float32", "float16"]),
)
def test_bow_kernel_scores_as_numpy_and_the_slow_sums_to_the_bit(
    tmp_path_factory: pytest.TempPathFactory, seed: int, n_words: int, n_db: int, nq: int, dtype
) -> None:
    """Random compressed lists (gaps of 1 to 2 million: 1- to 4-byte codes; float32 weights of
    every kind, and float16), random weighted queries: the compiled kernel's scores, numpy's and
    the one-posting-at-a-time float32 sums agree to the bit, and so do the full rankings."""
    rng = np.random.default_rng(seed)
    postings = _random_lists(rng, n_words, n_db)
    q = _random_queries(rng, nq, n_words)
    with np.errstate(over="ignore", invalid="ignore"):  # huge weights: inf, inf * 0 = NaN
        lists = CompressedPostings.write(postings, tmp_path_factory.mktemp("bow"), weights=dtype)
        with pytest.MonkeyPatch.context() as m:
            fast, slow = _bow_both(m, lists, q)
            want = _slow_bow_scores(postings, q, dtype)
            assert fast[0] == slow[0] == "ok"
            np.testing.assert_array_equal(fast[1].view(np.uint32), slow[1].view(np.uint32))
            np.testing.assert_array_equal(fast[1].view(np.uint32), want.view(np.uint32))
            if not np.isnan(want).any():  # the full rankings
                m.delenv("OXBENCH_NO_ACCEL", raising=False)
                ranks = lists.search(q)
                m.setenv("OXBENCH_NO_ACCEL", "1")
                np.testing.assert_array_equal(ranks, lists.search(q))


@needs_bow_kernel
def test_bow_kernel_widens_every_float16_as_numpy() -> None:
    """Every finite and infinite float16 as a weight (one list of 63,488 images, gaps of 1),
    times 1 and times a float32 that rounds: numpy's widening and products, to the bit."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    half = bits.view(np.float16)
    half = half[~np.isnan(half)]
    m = len(half)
    code = vbyte_encode(np.ones(m, np.uint64))
    code[0] = 0  # the first id is 0, every later one the previous + 1
    offsets = np.array([[0, 0], [len(code), m]], np.int64)
    for qv in (np.float32(1.0), np.float32(0.3)):
        got = np.zeros(m, np.float32)
        status = K._accel.bow_scatter(
            got, code, half, offsets, np.array([0]), np.array([qv], np.float32)
        )
        assert status == 0
        with np.errstate(over="ignore"):
            want = np.float32(0) + qv * half.astype(np.float32)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _bow_args(n: int = 6) -> list:
    """A clean call: word 0 lists images 1, 3 (weights 2, 4), word 1 image 0 (weight 8)."""
    return [
        np.zeros(n, np.float32),
        np.array([1, 2, 0], np.uint8),
        np.array([2.0, 4.0, 8.0], np.float32),
        np.array([[0, 0], [2, 2], [3, 3]], np.int64),
        np.array([0, 1], np.int64),
        np.array([0.5, 1.0], np.float32),
    ]


@needs_bow_kernel
def test_bow_kernel_refuses_what_it_cannot_handle() -> None:
    """A buffer of another kind or layout: status 2 with the scores untouched; a damaged list
    or a word or offset out of range: status 1 (the caller reruns numpy from zeros)."""
    good = _bow_args()
    assert K._accel.bow_scatter(*good) == 0
    assert good[0].tolist() == [8.0, 1.0, 0.0, 2.0, 0.0, 0.0]
    unsupported: dict[str, tuple[int, np.ndarray]] = {
        "float64 scores": (0, np.zeros(6)),
        "read-only scores": (0, np.zeros(6, np.float32)),
        "strided scores": (0, np.zeros(12, np.float32)[::2]),
        "int8 code": (1, np.array([1, 2, 0], np.int8)),
        "float64 weights": (2, np.array([2.0, 4.0, 8.0])),
        "big-endian weights": (2, np.array([2.0, 4.0, 8.0], ">f4")),
        "offsets of 3 columns": (3, np.zeros((3, 3), np.int64)),
        "int32 offsets": (3, np.array([[0, 0], [2, 2], [3, 3]], np.int32)),
        "uint64 words": (4, np.array([0, 1], np.uint64)),
        "float64 query weights": (5, np.array([0.5, 1.0])),
        "fewer query weights than words": (5, np.array([0.5], np.float32)),
    }
    unsupported["read-only scores"][1].flags.writeable = False
    for name, (j, value) in unsupported.items():
        args = _bow_args()
        args[j] = value
        before = np.array(args[0], copy=True)
        assert K._accel.bow_scatter(*args) == 2, name
        np.testing.assert_array_equal(args[0], before, err_msg=name)
    damaged: dict[str, tuple[int, np.ndarray]] = {
        "a value cut at its list's end": (1, np.array([1, 0x82, 0], np.uint8)),
        "a value of 10 bytes": (1, np.array([0xFF] * 9 + [1, 2, 0], np.uint8)),
        "an id past the index": (1, np.array([1, 5, 0], np.uint8)),
        "a gap past the index": (1, np.array([1, 0x80 | 7, 0], np.uint8)),
        "fewer ids than weights": (3, np.array([[0, 0], [1, 2], [2, 3]], np.int64)),
        "more ids than weights": (3, np.array([[0, 0], [2, 1], [3, 3]], np.int64)),
        "offsets past the code": (3, np.array([[0, 0], [2, 2], [4, 3]], np.int64)),
        "offsets past the weights": (3, np.array([[0, 0], [2, 2], [3, 4]], np.int64)),
        "decreasing offsets": (3, np.array([[2, 0], [0, 2], [3, 3]], np.int64)),
        "negative offsets": (3, np.array([[-1, 0], [2, 2], [3, 3]], np.int64)),
        "a word past the vocabulary": (4, np.array([0, 2], np.int64)),
        "a negative word": (4, np.array([-1, 1], np.int32)),
    }
    for name, (j, value) in damaged.items():
        args = _bow_args(n=4)
        args[j] = value
        assert K._accel.bow_scatter(*args) == 1, name


@needs_bow_kernel
@pytest.mark.parametrize("damage", ["cut", "past", "count"])
def test_bow_damaged_lists_raise_numpys_error_either_way(
    tmp_path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """A list damaged on disk (a value cut at its end, an id past the index, fewer ids than its
    offsets say) is the same one-line InputError through either path, never scores."""
    rng = np.random.default_rng(5)
    postings = _random_lists(rng, 8, 300)
    lists = CompressedPostings.write(postings, tmp_path / "bow")
    code = np.array(lists._ids, copy=True)
    offsets = lists._offsets.copy()
    word = int(np.flatnonzero(np.diff(offsets[:, 1]) >= 3)[0])
    b1 = int(offsets[word + 1, 0])
    if damage == "cut":
        code[b1 - 1] |= 0x80
    elif damage == "past":
        code[offsets[word, 0] : b1] = 0x7F  # every gap 127: the third id, 381, past 300 images
    else:
        offsets[word + 1 :, 1] += 1
    broken = CompressedPostings(
        lists.folder, lists.n_words, lists.n_db, "float32", offsets, code, lists._weights
    )
    q = sp.csr_matrix(
        (np.ones(2, np.float32), ([0, 0], [word, (word + 1) % 8])), shape=(1, lists.n_words)
    )
    fast, slow = _bow_both(monkeypatch, broken, q)
    assert fast[0] == slow[0] == "err" and fast[1:] == slow[1:], (fast, slow)
    assert "damaged" in fast[2] or "inside a value" in fast[2]
