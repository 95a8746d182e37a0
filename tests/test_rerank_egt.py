"""Explore-exploit graph traversal (Chang et al. CVPR 2019): Algorithm 1 on a hand-worked graph,
the symmetric k-NN graph by hand, invariants, the settings fuzzed, the real Oxford descriptors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.test_rerank_k_reciprocal import HOSTILE, real_headline

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.pipelines import resolve_method
from oxbench.pipelines.rerankers.egt import (
    EgtSettings,
    KnnGraph,
    egt_rerank,
    knn_graph,
    traverse,
)


def hand_graph() -> KnnGraph:
    """Edges 0-1 .9, 1-2 .8, 0-4 .5, 2-3 .3, 3-4 .2, heaviest first per image."""
    lists = {0: [(1, 0.9), (4, 0.5)], 1: [(0, 0.9), (2, 0.8)], 2: [(1, 0.8), (3, 0.3)]}
    lists |= {3: [(2, 0.3), (4, 0.2)], 4: [(0, 0.5), (3, 0.2)]}
    indptr = np.cumsum([0] + [len(lists[i]) for i in range(5)])
    ids = np.array([j for i in range(5) for j, _ in lists[i]])
    w = np.array([x for i in range(5) for _, x in lists[i]])
    return KnnGraph(indptr.astype(np.int64), ids.astype(np.int64), w)


@pytest.mark.parametrize(
    ("tau", "p", "order", "weights"),
    [
        # tau .7: every step explores -- 0 (.6); 1 (.9, via 0); 2 (.8, via 1); 3 (.55, the
        # query's edge: 2's edge .3 is lighter and never pushed); 4 (.5, via 0)
        (0.7, 5, [0, 1, 2, 3, 4], [0.6, 0.9, 0.8, 0.55, 0.5]),
        # tau .5: after 0, the query's edge to 3 (.55 > .5) is exploited at once; then 1 (.9),
        # 2 (.8 via 1, heavier than 3's .3), 4 (.5)
        (0.5, 5, [0, 3, 1, 2, 4], [0.6, 0.55, 0.9, 0.8, 0.5]),
        (0.7, 2, [0, 1], [0.6, 0.9]),
    ],
)
def test_traversal_by_hand(tau: float, p: int, order: list[int], weights: list[float]) -> None:
    """The query is linked to 0 (.6) and 3 (.55)."""
    out, w = traverse(hand_graph(), np.array([0, 3]), np.array([0.6, 0.55]), p, tau)
    assert out.tolist() == order
    np.testing.assert_allclose(w, weights)


def test_symmetric_knn_graph_by_hand() -> None:
    """x0 = (1, 0), x1 = (.8, .6), x2 = (0, 1), k = 1: 0 -> 1 (.8), 1 -> 0 (.8), 2 -> 1 (.6);
    made symmetric, 1 also links 2."""
    g = knn_graph(np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], np.float32), 1)
    lists = [
        list(zip(g.indices[a:b].tolist(), np.round(g.weights[a:b], 6).tolist(), strict=True))
        for a, b in zip(g.indptr[:-1], g.indptr[1:], strict=True)
    ]
    assert lists == [[(1, 0.8)], [(0, 0.8), (2, 0.6)], [(1, 0.6)]]


def test_the_stage_ranks_the_traversal_then_the_rest_with_falling_scores() -> None:
    db = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]], np.float32)
    q = np.array([[0.0, 1.0]], np.float32)
    ranks = np.array([[2, 1, 0, 3]])
    out, scores = egt_rerank(q, db, ranks, EgtSettings(k=1, tau=0.42, p=2))
    # the query links 2 (1.0); 2 reaches 1 (.6); p = 2 stops there; then the rest in ranking order
    assert out.tolist() == [[2, 1, 0, 3]]
    np.testing.assert_allclose(scores[0], [1.0, 0.6, 0.6, 0.6])


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    n=st.integers(2, 30),
    k=st.integers(1, 8),
    p=st.integers(1, 40),
    tau=st.floats(-1, 1),
)
def test_invariants(seed: int, n: int, k: int, p: int, tau: float) -> None:
    """A permutation of each ranking, scores never rise, and permuting the database permutes only
    the positions."""
    rng = np.random.default_rng(seed)
    db = rng.normal(size=(n, 5))
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    q = rng.normal(size=(2, 5))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    ranks = np.argsort(-(q @ db.T), axis=1, kind="stable")
    s = EgtSettings(k=k, tau=tau, p=p)
    out, scores = egt_rerank(q, db, ranks, s)
    assert all(sorted(a) == sorted(b) for a, b in zip(out.tolist(), ranks.tolist(), strict=True))
    assert (np.diff(scores, axis=1) <= 0).all()
    perm = rng.permutation(n)
    inv = np.argsort(perm)
    out2, _ = egt_rerank(q, db[perm], inv[ranks], s)
    assert np.array_equal(perm[out2], out)


def test_a_database_too_large_is_one_line() -> None:
    db = np.eye(4, dtype=np.float32)
    with pytest.raises(InputError, match=r"egt.max_images=3"):
        egt_rerank(db[:1], db, np.zeros((1, 4), np.int64), EgtSettings(max_images=3))


@pytest.mark.parametrize("name", ["k", "tau", "p", "max_images"])
def test_settings_fuzz_one_line(name: str) -> None:
    for raw in HOSTILE:
        try:
            resolved = resolve_method("features", rerank="egt", **{f"egt.{name}": raw})
        except InputError as exc:
            assert "\n" not in str(exc) and name in str(exc), (raw, str(exc))
            continue
        value = getattr(resolved.stage("egt"), name)  # type: ignore[attr-defined]
        assert not isinstance(value, float) or math.isfinite(value), (name, raw)


@pytest.mark.parametrize("setting", ["egt.k=1e30", "egt.tau=NaN", "egt.p=abc"])
def test_hostile_setting_exits_2(
    setting: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(
            ["run", "--method", "features", "--root", str(tmp_path), "--set", "rerank=egt"]
            + ["--set", setting, "--no-progress"]
        )
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and setting.split("=")[0] in err


@pytest.mark.shared_data
def test_real_oxford_beside_the_authors_code(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The authors' EGT (their egt.py graph and jar, k 250, tau .42, p 5000) gives E / M / H
    29.38 / 21.62 / 4.81 on these inputs; the stage, on the paper's symmetric graph, 29.37 /
    21.62 / 4.81 (docs/conformance.md)."""
    line = real_headline(shared_data, tmp_path, capsys, ["rerank=egt"])
    assert line == "roxford5k: mAP E: 29.37, M: 21.62, H: 4.81", line
