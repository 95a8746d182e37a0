"""Hamming embedding and weak geometric consistency against slow references written from the paper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.cli import main
from oxbench.errors import InputError
from oxbench.index.hamming import (
    N_BITS,
    HammingEmbedding,
    HammingIndex,
    hamming_distances,
    pack_bits,
    random_orthogonal_projection,
    wgc_bins,
    wgc_scores,
)
from oxbench.pipelines import resolve_method


def _slow_signature(x: np.ndarray, word: int, he: HammingEmbedding) -> int:
    """Bit b of the signature is 1 when the b-th projection exceeds the word's b-th median."""
    assert he.projection_ is not None and he.medians_ is not None
    value = 0
    for b in range(N_BITS):
        proj = sum(float(he.projection_[b, j]) * float(x[j]) for j in range(len(x)))
        if proj > float(he.medians_[word, b]):
            value |= 1 << b
    return value


def _slow_hamming(a: int, b: int) -> int:
    return sum(((a >> i) & 1) != ((b >> i) & 1) for i in range(N_BITS))


def test_projection_rows_are_orthonormal_and_seeded() -> None:
    p = random_orthogonal_projection(64, 128, seed=3)
    assert p.shape == (64, 128)
    assert np.allclose(p @ p.T, np.eye(64), atol=1e-5)
    assert np.array_equal(p, random_orthogonal_projection(64, 128, seed=3))
    assert not np.allclose(p, random_orthogonal_projection(64, 128, seed=4))
    with pytest.raises(InputError, match="bits"):
        random_orthogonal_projection(65, 64)


def test_medians_are_per_word_and_signatures_match_the_slow_reference() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((301, 128)).astype(np.float32)
    words = rng.integers(0, 5, size=301)
    words[words == 4] = 3  # word 4 gets no training descriptor
    he = HammingEmbedding(5, seed=1).fit(x, words)
    assert (
        he.medians_ is not None and he.projection_ is not None and he.trained_per_word_ is not None
    )
    proj = x.astype(np.float64) @ he.projection_.T.astype(np.float64)
    for w in range(4):
        assert np.allclose(he.medians_[w], np.median(proj[words == w], axis=0), atol=1e-5)
    assert np.allclose(he.medians_[4], np.median(proj, axis=0), atol=1e-5)
    assert he.trained_per_word_.tolist() == np.bincount(words, minlength=5).tolist()
    # on its own training data, each bit of each word splits the word's descriptors in half
    sig = he.signatures(x, words)
    for w in range(4):
        bits = (sig[words == w][:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
        n = int((words == w).sum())
        assert np.all(np.abs(bits.sum(axis=0).astype(int) - n / 2) <= 1)
    q = rng.standard_normal((20, 128)).astype(np.float32)
    qw = rng.integers(0, 5, size=20)
    got = he.signatures(q, qw)
    assert got.dtype == np.uint64
    assert [int(s) for s in got] == [_slow_signature(q[i], int(qw[i]), he) for i in range(20)]


def test_embedding_round_trips_through_its_file(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 64)).astype(np.float32)
    he = HammingEmbedding(3).fit(x, rng.integers(0, 3, 50))
    back = HammingEmbedding.load(he.save(tmp_path / "he.npz"))
    assert np.array_equal(
        back.signatures(x, np.zeros(50, int)), he.signatures(x, np.zeros(50, int))
    )
    with pytest.raises(InputError, match="word outside"):
        he.signatures(x, np.full(50, 3))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.booleans(), min_size=64, max_size=64),
    st.lists(st.booleans(), min_size=64, max_size=64),
)
def test_packing_and_popcount_agree_with_bit_by_bit(a: list[bool], b: list[bool]) -> None:
    pa, pb = pack_bits(np.array([a])), pack_bits(np.array([b]))
    assert int(pa[0]) == sum(1 << i for i, bit in enumerate(a) if bit)
    assert (
        int(hamming_distances(pa, pb)[0])
        == _slow_hamming(int(pa[0]), int(pb[0]))
        == sum(x != y for x, y in zip(a, b, strict=True))
    )


def test_wgc_votes_on_hand_made_matches() -> None:
    # image 0: four matches rotated by ~90 degrees and zoomed x2, one outlier; image 1: scattered
    angle_diff = np.array([91.0, 92.0, 89.5, 93.0, 250.0, 10.0, 100.0, 200.0, 300.0])
    scale_diff = np.array([1.0, 1.1, 0.9, 1.2, -2.5, 1.0, -1.0, 0.2, 3.0])
    image = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1])
    ab, sb = wgc_bins(angle_diff, scale_diff, angle_bins=8, scale_bins=8, scale_range=4.0)
    assert ab.tolist() == [2, 2, 1, 2, 5, 0, 2, 4, 6]
    assert sb.tolist() == [5, 5, 4, 5, 1, 5, 3, 4, 7]
    got = wgc_scores(image, np.ones(9), ab, sb, 3, 8, 8)
    # image 0: angle peak 3 (bin 2), scale peak 3 (bin 5) -> 3; image 1: peaks 1 and 1; image 2: none
    assert got.tolist() == [3.0, 1.0, 0.0]
    weighted = wgc_scores(image, np.array([1, 1, 5, 1, 1, 1, 1, 1, 1.0]), ab, sb, 3, 8, 8)
    assert weighted.tolist() == [5.0, 1.0, 0.0]  # min(angle peak 5 in bin 1, scale peak 5 in bin 4)


def _slow_scores(index_feats, query, n_images, idf, ht, sigma, wgc):  # noqa: ANN001, ANN202
    """Sum over every (query feature, database feature) pair of the definition, image by image."""
    qw, qs, qa, ql = query
    tf = np.zeros((n_images, len(idf)))
    for w, i, *_ in index_feats:
        tf[i, w] += 1
    q_tf = np.bincount(qw, minlength=len(idf))
    out = []
    for img in range(n_images):
        votes = []
        for w, i, s, a, ls in index_feats:
            if i != img:
                continue
            for f in range(len(qw)):
                h = _slow_hamming(int(qs[f]), int(s))
                if qw[f] == w and h <= ht:
                    weight = idf[w] ** 2 * (np.exp(-(h**2) / sigma**2) if sigma else 1.0)
                    votes.append((weight, (a - qa[f]) % 360, ls - ql[f]))
        if wgc:
            ha, hs = np.zeros(8), np.zeros(8)
            for weight, da, ds in votes:
                ha[min(int(da // 45), 7)] += weight
                hs[min(int((min(max(ds, -4), 4) + 4) // 1), 7)] += weight
            raw = min(ha.max(), hs.max())
        else:
            raw = sum(v[0] for v in votes)
        norm = np.sqrt(((tf[img] * idf) ** 2).sum()) * np.sqrt(((q_tf * idf) ** 2).sum())
        out.append(raw / norm if norm > 0 else 0.0)
    return np.array(out)


@pytest.mark.parametrize(
    ("ht", "sigma", "wgc"),
    [(64, None, False), (24, 16.0, False), (20, None, True), (0, 16.0, True)],
)
def test_index_scores_follow_the_definition(ht: int, sigma: float | None, wgc: bool) -> None:
    rng = np.random.default_rng(5)
    n_words, n_images, n = 6, 4, 60
    words = rng.integers(0, n_words, n)
    images = rng.integers(0, n_images - 1, n)  # the last image has no features
    base = rng.integers(0, 2**63, 3, dtype=np.uint64)
    sigs = base[rng.integers(0, 3, n)] ^ (np.uint64(1) << rng.integers(0, 64, n).astype(np.uint64))
    angles = rng.uniform(0, 360, n).astype(np.float32)
    scales = rng.uniform(-3, 3, n).astype(np.float32)
    index = HammingIndex(n_words).fit(words, images, sigs, angles, scales, n_images)
    qn = 15
    query = (
        rng.integers(0, n_words, qn),
        base[rng.integers(0, 3, qn)],
        rng.uniform(0, 360, qn).astype(np.float32),
        rng.uniform(-3, 3, qn).astype(np.float32),
    )
    got = index.scores(*query, ht=ht, sigma=sigma, wgc=wgc)
    assert index.idf_ is not None
    df = np.array(
        [
            len({int(i) for w, i in zip(words, images, strict=True) if w == word})
            for word in range(n_words)
        ]
    )
    assert np.allclose(index.idf_, np.where(df > 0, np.log(n_images / np.maximum(df, 1)), 0.0))
    feats = list(
        zip(
            words.tolist(),
            images.tolist(),
            sigs.tolist(),
            angles.tolist(),
            scales.tolist(),
            strict=True,
        )
    )
    want = _slow_scores(feats, query, n_images, index.idf_, ht, sigma, wgc)
    assert np.allclose(got, want, rtol=1e-6, atol=1e-9)
    assert got[-1] == 0.0


def test_all_bits_threshold_without_weights_is_the_tf_idf_cosine() -> None:
    from oxbench.index.inverted import InvertedFile, bow_matrix

    rng = np.random.default_rng(7)
    n_words, n_images = 9, 5
    per_image = [rng.integers(0, n_words, rng.integers(3, 12)) for _ in range(n_images)]
    words = np.concatenate(per_image)
    images = np.concatenate([np.full(len(w), i) for i, w in enumerate(per_image)])
    n = len(words)
    index = HammingIndex(n_words).fit(
        words,
        images,
        rng.integers(0, 2**63, n, dtype=np.uint64),
        np.zeros(n),
        np.zeros(n),
        n_images,
    )
    q = rng.integers(0, n_words, 8)
    got = index.scores(
        q, rng.integers(0, 2**63, 8, dtype=np.uint64), np.zeros(8), np.zeros(8), ht=64, sigma=None
    )
    ivf = InvertedFile(n_words, burst="none").fit(bow_matrix(per_image, n_words))
    assert np.allclose(got, ivf.scores(bow_matrix([q], n_words))[0], atol=1e-6)


@pytest.mark.parametrize(
    ("setting", "value"),
    [("he_ht", "65"), ("he_ht", "-1"), ("he_sigma", "nan"), ("inverted_file", "disk")],
)
def test_bad_settings_are_one_line(
    setting: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(InputError, match=setting):
        resolve_method("rootsift-he", **{setting: value})
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--method", "rootsift-he", "--set", f"{setting}={value}"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err and setting in err
    with pytest.raises(InputError, match="Hamming threshold"):
        HammingIndex(2).fit(
            np.zeros(0, int), np.zeros(0, int), np.zeros(0, np.uint64), np.zeros(0), np.zeros(0), 1
        ).matches(np.zeros(1, int), np.zeros(1, np.uint64), 65)


@pytest.mark.slow
def test_he_presets_run_on_the_tiny_city(tmp_path: Path) -> None:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.evaluation import evaluate
    from oxbench.pipelines import RunContext
    from test_pipeline import load_tiny, make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")
    maps = {}
    for name in ("rootsift-bow", "rootsift-he", "rootsift-he-wgc", "rootsift-he-wgc-sv-qe"):
        ctx = RunContext(tmp_path / "cache", progress=False)
        res = (
            resolve_method(name, **{"vocabulary.size": 200}, **tiny(name))
            .build()
            .fit(train, ctx)
            .index(bench, ctx)
            .search(bench, ctx)
        )
        maps[name] = evaluate(bench.gt, res.ranks).setups["medium"].map
        for qi in range(len(res.ranks)):
            assert sorted(res.ranks[qi].tolist()) == list(range(40))
    assert (tmp_path / "cache" / "hamming").is_dir()
    assert maps["rootsift-he-wgc-sv-qe"] >= maps["rootsift-he-wgc"] - 0.05


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=3, max_size=3))
def test_hamming_distance_is_a_metric(values: list[int]) -> None:
    a, b, c = (np.array([v], np.uint64) for v in values)
    ab, bc, ac = (int(hamming_distances(x, y)[0]) for x, y in ((a, b), (b, c), (a, c)))
    assert ab == int(hamming_distances(b, a)[0]) and 0 <= ab <= 64
    assert (ab == 0) == (values[0] == values[1])
    assert ac <= ab + bc


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 40), st.integers(1, 12), st.integers(1, 12))
def test_wgc_never_exceeds_the_sum_of_votes_and_ignores_their_order(
    seed: int, m: int, angle_bins: int, scale_bins: int
) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 3, m)
    weight = rng.uniform(0, 2, m)
    ab, sb = rng.integers(0, angle_bins, m), rng.integers(0, scale_bins, m)
    got = wgc_scores(image, weight, ab, sb, 3, angle_bins, scale_bins)
    assert np.all(got <= np.bincount(image, weight, minlength=3) + 1e-9) and np.all(got >= 0)
    p = rng.permutation(m)
    assert np.allclose(
        wgc_scores(image[p], weight[p], ab[p], sb[p], 3, angle_bins, scale_bins), got
    )
    if angle_bins == scale_bins == 1:  # one bin each: WGC is the plain sum
        assert np.allclose(got, np.bincount(image, weight, minlength=3))


@pytest.mark.slow
def test_the_mapped_inverted_file_ranks_as_the_in_ram_one(tmp_path: Path) -> None:
    """``inverted_file=mapped`` (:mod:`oxbench.index.he_file`) gives the in-RAM index's ranks and
    scores, with and without WGC, through the whole family (features, signatures, chunks)."""
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.pipelines import RunContext
    from oxbench.pipelines.families import he
    from test_pipeline import load_tiny, make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")
    for name in ("rootsift-he", "rootsift-he-wgc-sv"):
        got = {}
        for inverted_file in ("memory", "mapped"):
            ctx = RunContext(tmp_path / "cache", progress=False)
            settings = {**tiny(name), "vocabulary.size": 200, "inverted_file": inverted_file}
            method = resolve_method(name, **settings).build().fit(train, ctx)
            if inverted_file == "mapped":  # several chunks of images
                he.INDEX_CHUNK, chunk = 7, he.INDEX_CHUNK
                try:
                    method.index(bench, ctx)
                finally:
                    he.INDEX_CHUNK = chunk
                assert list((tmp_path / "cache").glob("*/he-lists/*/signatures.npy"))
            else:
                method.index(bench, ctx)
            got[inverted_file] = method.search(bench, ctx)
        np.testing.assert_array_equal(got["memory"].ranks, got["mapped"].ranks)
        np.testing.assert_allclose(got["memory"].scores, got["mapped"].scores, rtol=1e-6)
        assert (got["mapped"].scores[:, 0] > 0).all()
