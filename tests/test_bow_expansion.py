"""Bag of words: soft assignment on the database side, DQE from verified images, DBA from verified
neighbours -- each against a slow reference or hand-made answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.pipelines import RunContext, resolve_method
from oxbench.pipelines.families.bow import term_frequencies
from oxbench.pipelines.rerankers import RERANKERS, Ranking
from oxbench.pipelines.steps import VerifiedList, Words
from oxbench.refinement.qe import discriminative_query_expansion


def _words(rng: np.random.Generator, counts: list[int], n_words: int, k: int) -> Words:
    n = sum(counts)
    words = np.stack([rng.choice(n_words, size=k, replace=False) for _ in range(n)]).astype(
        np.int32
    )
    d = np.sort(rng.uniform(0.0, 0.3, size=(n, k)), axis=1).astype(np.float32)
    offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    return Words(tuple(f"im{i}" for i in range(len(counts))), offsets, words, d)


def test_soft_assignment_weights_the_database_and_leaves_the_query_hard() -> None:
    rng = np.random.default_rng(0)
    n_words, k = 12, 4
    words = _words(rng, [5, 0, 7], n_words, k)
    method = resolve_method("rootsift-bow-sa", **{"assignment.k": 3}, **{"assignment.sigma2": 0.01})
    names = list(words.names)
    db = term_frequencies(method, words, names, n_words, side="database").toarray()
    q = term_frequencies(method, words, names, n_words, side="query").toarray()
    want_db, want_q = np.zeros((3, n_words)), np.zeros((3, n_words))
    for i, name in enumerate(names):
        w, d = words.of(name)
        for f in range(len(w)):
            # Philbin et al. 2008: exp(-d^2 / (2 sigma^2)) over the 3 nearest words, summing to 1
            g = [np.exp(-float(d[f, j]) / (2 * 0.01)) for j in range(3)]
            for j in range(3):
                want_db[i, w[f, j]] += g[j] / sum(g)
            want_q[i, w[f, 0]] += 1
    assert np.allclose(db, want_db, atol=1e-5) and np.array_equal(q, want_q)
    assert np.allclose(db.sum(axis=1), [5, 0, 7], atol=1e-5)
    hard = resolve_method("rootsift-bow")
    assert np.array_equal(
        term_frequencies(hard, words, names, n_words, side="database").toarray(), want_q
    )


@pytest.mark.parametrize(
    ("setting", "value"), [("soft_k", "0"), ("soft_k", "-3"), ("soft_sigma2", "nan")]
)
def test_bad_soft_assignment_settings_are_one_line(
    setting: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InputError, match=setting):
        resolve_method("rootsift-bow-sa", **{setting: value})
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--method", "rootsift-bow-sa", "--set", f"{setting}={value}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err and setting in err


class _Space:
    """A dense RerankSpace: dot-product ranking over fixed database vectors."""

    capabilities = frozenset({"vectors", "local"})

    def __init__(self, db: np.ndarray) -> None:
        self.database = db
        self.ranked: list[np.ndarray] = []

    def rank(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q = np.atleast_2d(queries)
        self.ranked.append(q)
        s = q @ self.database.T
        order = np.argsort(-s, axis=1, kind="stable")
        return np.take_along_axis(s, order, axis=1).astype(np.float32), order

    def verify(self, ranks, r, ctx, *, rows=None, stage="spatial"):  # noqa: ANN001, ANN201
        return [
            VerifiedList(order, order[:0], np.zeros(0, np.int64), {})
            for order in (rows or {}).values()
        ]


def test_dqe_trains_on_the_verified_images_against_the_bottom_of_the_ranking(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    db = rng.normal(size=(30, 6))
    db /= np.linalg.norm(db, axis=1, keepdims=True)
    query = db[:1] + 0.1
    ranks = np.argsort(-(query @ db.T), axis=1, kind="stable")
    head = ranks[0, :8]
    verified = VerifiedList(head, head[[0, 2, 5]], np.array([20, 12, 9]), {})
    ranking = Ranking(ranks, np.zeros((1, 30), np.float32), query, (verified,))
    method = resolve_method(
        "rootsift-bow-sv-dqe",
        **{"dqe-verified.negatives": 5},
        **{"dqe-verified.min_inliers": 10},
        **{"dqe-verified.verify_top": 0},
    )
    stage = RERANKERS.get("dqe-verified")(method.stage("dqe-verified"))
    space = _Space(db)
    out = stage.rerank(ranking, space, RunContext(tmp_path, progress=False))
    # positives: the verified images with at least 10 inliers; negatives: the last 5 of the ranking
    want = discriminative_query_expansion(query, db[head[[0, 2]]], db[ranks[0, -5:]], c=1.0)
    assert len(space.ranked) == 1 and np.allclose(space.ranked[0], want)
    # every verified image stays first, in inlier order, then the expanded query's order
    first = head[[0, 2, 5]].tolist()
    assert out.ranks[0, :3].tolist() == first
    order = np.argsort(-(want @ db.T)[0], kind="stable")
    assert out.ranks[0, 3:].tolist() == [i for i in order.tolist() if i not in first]
    with pytest.raises(InputError, match="dqe-verified.negatives"):
        resolve_method("rootsift-bow-sv-dqe", **{"dqe-verified.negatives": 0})


def test_dqe_is_refused_without_verification_and_dba_where_no_family_offers_it() -> None:
    with pytest.raises(InputError, match="'dqe-verified' needs a 'spatial' stage before it"):
        resolve_method("rootsift-bow", rerank="dqe-verified")
    with pytest.raises(
        InputError, match="'dba-verified' needs a database it may augment, which the he"
    ):
        resolve_method("rootsift-he-sv", rerank="dba-verified,spatial")
    # one name, one meaning: top-k DBA over dense vectors is not the verified DBA of bag of words
    with pytest.raises(
        InputError, match="'dba' needs a ranking over dense vectors, which the bow family"
    ):
        resolve_method("rootsift-bow", rerank="dba")


@pytest.mark.slow
def test_dba_augments_each_image_with_its_verified_neighbours(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.evaluation import evaluate
    from oxbench.index.inverted import InvertedFile
    from oxbench.refinement.qe import database_side_augmentation
    from test_pipeline import TINY, load_tiny, make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")
    ctx = RunContext(tmp_path / "cache", progress=False)
    plain = (
        resolve_method("rootsift-bow-sv-dqe", **{"vocabulary.size": 200}, **TINY)
        .build()
        .fit(train, ctx)
        .index(bench, ctx)
    )
    dba = (
        resolve_method(
            "rootsift-bow-dba-sv-dqe",
            **{"vocabulary.size": 200, "dba-verified.top_r": 20},
            **TINY,
        )
        .build()
        .fit(train, ctx)
        .index(bench, ctx)
    )
    assert dba.dba_neighbours_ is not None and dba.dba_neighbours_.shape == (40, 20)
    nb = dba.dba_neighbours_
    assert all(i not in row for i, row in enumerate(nb.tolist()))
    assert (nb >= 0).any()  # the tiny city's images do verify against each other
    # each row's neighbours are images of its own top 20 by tf-idf, and they are what was verified
    original = plain.database
    for i in range(40):
        s = (original[i] @ original.T).toarray().ravel()
        s[i] = -np.inf
        top = np.argsort(-s, kind="stable")[:20]
        assert set(nb[i][nb[i] >= 0].tolist()) <= set(top.tolist())
    want = database_side_augmentation(original, nb)
    assert isinstance(dba.database, sp.csr_matrix)
    assert np.allclose(dba.database.toarray(), want.toarray(), atol=1e-6)
    assert isinstance(dba._ivf, InvertedFile)
    res = dba.search(bench, ctx)
    for qi in range(len(res.ranks)):
        assert sorted(res.ranks[qi].tolist()) == list(range(40))
    assert 0.0 <= evaluate(bench.gt, res.ranks).setups["medium"].map <= 1.0
    # database images verified as queries have cache entries of their own, apart from the queries'
    folders = sorted(p.name for p in (tmp_path / "cache" / "verification").iterdir())
    assert len(folders) == 2
