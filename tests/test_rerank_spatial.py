"""Spatial verification and re-ranking on synthetic correspondences with known geometry."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.refinement.spatial import (
    Verification,
    _group_words,
    _matches_from_groups,
    rerank_by_inliers,
    spatial_rerank,
    tentative_matches,
    verify_pair,
)

pytest.importorskip("cv2")


# ------------------------------------------------------------------ reference implementation


#: The affine MAGSAC verification these synthetic pairs are built for (the package default is
#: Philbin's fast spatial matching of a similarity, which needs keypoint scale and orientation).
AFFINE: dict[str, Any] = {"model": "affine", "method": "magsac", "min_inliers": 8}


def naive_tentative_matches(q_words, d_words, max_per_word):
    """Deliberately simple Python-loop reference of :func:`tentative_matches`."""
    q_pos, d_pos = defaultdict(list), defaultdict(list)
    for i, w in enumerate(q_words):
        if w >= 0:
            q_pos[int(w)].append(i)
    for j, w in enumerate(d_words):
        if w >= 0:
            d_pos[int(w)].append(j)
    pairs = []
    for w, qs in q_pos.items():
        ds = d_pos.get(w, [])
        if not ds or (max_per_word is not None and len(qs) * len(ds) > max_per_word):
            continue
        pairs.extend((i, j) for i in qs for j in ds)
    return np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)


# ------------------------------------------------------------------ synthetic scenes


def keypoints(xy: np.ndarray) -> np.ndarray:
    kp = np.zeros((xy.shape[0], 4), dtype=np.float32)
    kp[:, :2] = xy
    kp[:, 2] = 4.0
    return kp


def affine_pair(rng, n_inliers=80, n_outliers=120, transform=None, noise=0.5, side=1000.0):
    """Query and candidate keypoints, matches 0..n-1 aligned; the first n_inliers follow T."""
    if transform is None:
        transform = np.array([[0.9, 0.15, 40.0], [-0.1, 1.05, -25.0], [0.0, 0.0, 1.0]])
    n = n_inliers + n_outliers
    q_xy = rng.uniform(0.1 * side, 0.9 * side, (n, 2))
    p = np.c_[q_xy, np.ones(n)] @ transform.T
    d_xy = p[:, :2] / p[:, 2:]
    d_xy[:n_inliers] += rng.normal(0.0, noise, (n_inliers, 2))
    d_xy[n_inliers:] = rng.uniform(0.0, side, (n_outliers, 2))
    matches = np.stack([np.arange(n), np.arange(n)], axis=1)
    return keypoints(q_xy), keypoints(d_xy), matches, transform


def project(t: np.ndarray, xy: np.ndarray) -> np.ndarray:
    p = np.c_[xy, np.ones(len(xy))] @ t.T
    return p[:, :2] / p[:, 2:]


# ------------------------------------------------------------------ tentative matches


def test_tentative_matches_small_example():
    q = np.array([5, 7, 9, 5, -1])
    d = np.array([9, 1, 5, 5, -1, 7])
    got = tentative_matches(q, d, max_per_word=4)
    # word 5: q{0,3} x d{2,3}; word 7: (1,5); word 9: (2,0); -1 never matches.
    expected = [[0, 2], [0, 3], [1, 5], [2, 0], [3, 2], [3, 3]]
    np.testing.assert_array_equal(got, expected)
    # A burst of 2x2 = 4 pairs is dropped when the cap is 3.
    np.testing.assert_array_equal(tentative_matches(q, d, max_per_word=3), [[1, 5], [2, 0]])


def test_tentative_matches_empty_and_bad_input():
    assert tentative_matches(
        np.array([], dtype=np.int64), np.array([1, 2]), max_per_word=8
    ).shape == (0, 2)
    assert tentative_matches(np.array([1, 2]), np.array([3, 4]), max_per_word=8).shape == (0, 2)
    with pytest.raises(InputError):
        tentative_matches(np.array([[1, 2]]), np.array([1]), max_per_word=8)
    with pytest.raises(InputError):
        tentative_matches(np.array([1.5]), np.array([1]), max_per_word=8)
    with pytest.raises(InputError):
        tentative_matches(np.array([1]), np.array([1]), max_per_word=0)


word_lists = st.lists(st.integers(-1, 12), min_size=0, max_size=40)


@settings(max_examples=60, deadline=None)
@given(q=word_lists, d=word_lists, cap=st.one_of(st.none(), st.integers(1, 6)))
def test_tentative_matches_equals_naive_reference(q, d, cap):
    q_arr, d_arr = np.array(q, dtype=np.int64), np.array(d, dtype=np.int64)
    got = tentative_matches(q_arr, d_arr, max_per_word=cap)
    expected = naive_tentative_matches(q_arr, d_arr, cap)
    np.testing.assert_array_equal(got, expected)
    # The lookup-table path spatial_rerank uses (query grouped once) gives the same pairs.
    grouped = _group_words(q_arr, with_lookup=True)
    np.testing.assert_array_equal(_matches_from_groups(grouped, d_arr, cap), expected)


@settings(max_examples=40, deadline=None)
@given(q=word_lists, d=word_lists, seed=st.integers(0, 2**16))
def test_tentative_matches_invariances(q, d, seed):
    q_arr, d_arr = np.array(q, dtype=np.int64), np.array(d, dtype=np.int64)
    base = tentative_matches(q_arr, d_arr, max_per_word=8)
    # Renaming the words with a bijection changes nothing.
    perm = np.random.default_rng(seed).permutation(13) + 100
    relabel = lambda w: np.where(w >= 0, perm[np.clip(w, 0, None)], -1)  # noqa: E731
    np.testing.assert_array_equal(
        tentative_matches(relabel(q_arr), relabel(d_arr), max_per_word=8), base
    )
    # Swapping the two images swaps the columns.
    swapped = tentative_matches(d_arr, q_arr, max_per_word=8)[:, ::-1]
    np.testing.assert_array_equal(swapped[np.lexsort((swapped[:, 1], swapped[:, 0]))], base)


# ------------------------------------------------------------------ verify_pair


@pytest.mark.parametrize("model", ["affine", "homography"])
@pytest.mark.parametrize("method", ["magsac", "accurate"])
def test_verify_pair_recovers_affine_with_outliers(rng, model, method):
    q_kp, d_kp, matches, t = affine_pair(rng, n_inliers=80, n_outliers=160)
    res = verify_pair(q_kp, d_kp, matches, Verification(model=model, method=method, min_inliers=10))
    assert res.verified and res.status == "verified"
    # Inliers are (nearly) the true ones: outliers land within 8 px only by chance.
    true = np.arange(len(matches)) < 80
    assert (res.inlier_mask & true).sum() >= 78
    assert (res.inlier_mask & ~true).sum() <= 4
    assert res.n_inliers == res.inlier_mask.sum()
    grid = np.stack(np.meshgrid(np.linspace(100, 900, 5), np.linspace(100, 900, 5)), -1)
    grid = grid.reshape(-1, 2)
    assert np.abs(project(res.transform, grid) - project(t, grid)).max() < 2.0


def test_verify_pair_similarity_model(rng):
    ang = np.deg2rad(30.0)
    t = np.array(
        [
            [1.5 * np.cos(ang), -1.5 * np.sin(ang), 100.0],
            [1.5 * np.sin(ang), 1.5 * np.cos(ang), -50.0],
            [0, 0, 1],
        ]
    )
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=60, n_outliers=60, transform=t)
    res = verify_pair(q_kp, d_kp, matches, Verification(model="similarity", min_inliers=10))
    assert res.verified and res.n_inliers >= 58
    np.testing.assert_allclose(res.transform, t, atol=0.5)


def oriented_pair(rng, n_inliers=60, n_outliers=240, scale=1.4, angle_deg=35.0, shear=0.15):
    """Like :func:`affine_pair`, with keypoint sizes and angles that follow the transform's local
    similarity part (as SIFT's do: A = scale * R(angle_d - angle_q) in image coordinates)."""
    ang = np.deg2rad(angle_deg)
    rot = np.array([[np.cos(ang), -np.sin(ang)], [np.sin(ang), np.cos(ang)]])
    lin = scale * rot @ np.array([[1.0, shear], [0.0, 1.0]])
    t = np.eye(3)
    t[:2, :2], t[:2, 2] = lin, [120.0, -80.0]
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers, n_outliers, transform=t)
    q_kp[:, 2] = rng.uniform(3, 20, len(q_kp))
    q_kp[:, 3] = rng.uniform(0, 360, len(q_kp))
    d_kp[:, 2] = rng.uniform(3, 20, len(d_kp))
    d_kp[:, 3] = rng.uniform(0, 360, len(d_kp))
    d_kp[:n_inliers, 2] = q_kp[:n_inliers, 2] * scale * rng.uniform(0.9, 1.1, n_inliers)
    d_kp[:n_inliers, 3] = (q_kp[:n_inliers, 3] + angle_deg + rng.normal(0, 4, n_inliers)) % 360
    return q_kp, d_kp, matches, t


@pytest.mark.parametrize("model", ["affine", "homography", "similarity"])
def test_fsm_recovers_transform_from_oriented_keypoints(rng, model):
    shear = 0.0 if model == "similarity" else 0.15
    q_kp, d_kp, matches, t = oriented_pair(rng, shear=shear)
    res = verify_pair(q_kp, d_kp, matches, Verification(model=model, method="fsm"))
    true = np.arange(len(matches)) < 60
    assert res.verified
    assert (res.inlier_mask & true).sum() >= 58 and (res.inlier_mask & ~true).sum() <= 3
    grid = np.stack(np.meshgrid(np.linspace(100, 900, 5), np.linspace(100, 900, 5)), -1)
    grid = grid.reshape(-1, 2)
    assert np.abs(project(res.transform, grid) - project(t, grid)).max() < 2.0
    # Deterministic without any seed: exhaustive hypotheses.
    again = verify_pair(q_kp, d_kp, matches, Verification(model=model, method="fsm"), seed=99)
    np.testing.assert_array_equal(again.inlier_mask, res.inlier_mask)


def test_fsm_uses_orientation_and_scale(rng):
    """Keypoint angles that do not follow the geometry give fsm no good hypothesis."""
    q_kp, d_kp, matches, _ = oriented_pair(rng, n_inliers=30, n_outliers=270)
    d_kp[:30, 3] = (d_kp[:30, 3] + 180.0) % 360  # wrong by half a turn
    assert not verify_pair(
        q_kp, d_kp, matches, Verification(model="affine", method="fsm", min_inliers=15)
    ).verified
    assert verify_pair(
        q_kp, d_kp, matches, Verification(model="affine", method="magsac", min_inliers=15)
    ).verified
    with pytest.raises(InputError, match="size and angle"):
        verify_pair(q_kp[:, :2], d_kp, matches, Verification(method="fsm"))


def test_threshold_is_relative_to_image_size(rng):
    """Scaling the candidate image by 4 (and saying so) gives the same inliers."""
    q_kp, d_kp, matches, _ = affine_pair(rng, noise=3.0)
    big = d_kp.copy()
    big[:, :2] *= 4.0
    a = verify_pair(
        q_kp, d_kp, matches, Verification(**AFFINE), d_size=(1000, 1000), q_size=(1000, 1000)
    )
    b = verify_pair(
        q_kp, big, matches, Verification(**AFFINE), d_size=(4000, 4000), q_size=(1000, 1000)
    )
    assert a.n_inliers == b.n_inliers > 0
    np.testing.assert_array_equal(a.inlier_mask, b.inlier_mask)
    np.testing.assert_allclose(
        b.transform, np.diag([4.0, 4.0, 1.0]) @ a.transform, rtol=1e-4, atol=1e-3
    )


def test_pure_outliers_do_not_verify(rng):
    n = 300
    q_kp = keypoints(rng.uniform(0, 1000, (n, 2)))
    d_kp = keypoints(rng.uniform(0, 1000, (n, 2)))
    matches = np.stack([np.arange(n), np.arange(n)], axis=1)
    for model in ("affine", "homography"):
        res = verify_pair(q_kp, d_kp, matches, Verification(model=model, min_inliers=15))
        assert not res.verified


def test_reflection_is_rejected(rng):
    mirror = np.array([[-1.0, 0.0, 1000.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=100, n_outliers=0, transform=mirror)
    res = verify_pair(q_kp, d_kp, matches, Verification(model="affine"))
    assert res.status == "degenerate" and res.n_inliers == 0 and res.transform is None
    assert not res.inlier_mask.any()


def test_extreme_scale_is_rejected(rng):
    shrink = np.diag([0.02, 0.02, 1.0])
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=100, n_outliers=0, transform=shrink)
    res = verify_pair(
        q_kp, d_kp, matches, Verification(**AFFINE), q_size=(1000, 1000), d_size=(1000, 1000)
    )
    assert res.status == "degenerate"
    relaxed = verify_pair(
        q_kp,
        d_kp,
        matches,
        Verification(**AFFINE, threshold_px=1.0),
        q_size=(1000, 1000),
        d_size=(1000, 1000),
        max_scale=100.0,
    )
    assert relaxed.verified


def test_too_few_matches_and_bad_input(rng):
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=5, n_outliers=0)
    res = verify_pair(q_kp, d_kp, matches, Verification(min_inliers=8))
    assert res.status == "too_few_matches" and res.n_inliers == 0
    assert res.inlier_mask.shape == (5,)
    assert (
        verify_pair(q_kp, d_kp, np.zeros((0, 2), np.int64), Verification()).status
        == "too_few_matches"
    )
    with pytest.raises(InputError):
        verify_pair(q_kp, d_kp, matches, Verification(model="projective"))
    with pytest.raises(InputError):
        verify_pair(q_kp, d_kp, np.array([[0, 99]]), Verification())
    with pytest.raises(InputError):
        verify_pair(q_kp, d_kp, matches.astype(float), Verification())


def test_burst_inliers_count_once(rng):
    """A query feature matched to many coincident db features counts once."""
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=40, n_outliers=0)
    # Duplicate every candidate keypoint (e.g. SIFT's multiple orientations) and match both.
    d2 = np.vstack([d_kp, d_kp])
    m2 = np.vstack([matches, matches + [0, len(d_kp)]])
    res = verify_pair(q_kp, d2, m2, Verification(**AFFINE))
    assert res.inlier_mask.sum() == 80
    assert res.n_inliers == 40


def test_verify_pair_is_deterministic(rng):
    q_kp, d_kp, matches, _ = affine_pair(rng, n_inliers=30, n_outliers=200, noise=2.0)
    results = [verify_pair(q_kp, d_kp, matches, Verification(model="homography")) for _ in range(3)]
    for r in results[1:]:
        assert r.n_inliers == results[0].n_inliers
        np.testing.assert_array_equal(r.transform, results[0].transform)


# ------------------------------------------------------------------ re-ranking


def test_rerank_by_inliers_hand_example():
    order = np.array([10, 11, 12, 13, 14, 15, 16])
    inliers = np.array([3, 20, 0, 20, 50])  # top 5 verified
    new, verified = rerank_by_inliers(order, inliers, min_inliers=10)
    # 14 (50) first, then 11 and 13 (20, tie -> initial order), then 10, 12; 15, 16 untouched.
    np.testing.assert_array_equal(new, [14, 11, 13, 10, 12, 15, 16])
    np.testing.assert_array_equal(verified, [14, 11, 13])


def make_database(rng, n_images=40, n_relevant=(3, 7, 15, 30), vocab=3000, n_feat=300):
    """A query and a database: ``n_relevant`` images see the query scene through an affine map."""
    q_xy = rng.uniform(50, 950, (n_feat, 2))
    q_words = rng.integers(0, vocab, n_feat)
    images = []
    for i in range(n_images):
        words = rng.integers(0, vocab, n_feat)
        xy = rng.uniform(0, 1000, (n_feat, 2))
        if i in n_relevant:
            k = 60 + 5 * i  # number of the query's features visible, differs per image
            ang = rng.uniform(-0.3, 0.3)
            s = rng.uniform(0.7, 1.4)
            t = np.array(
                [
                    [s * np.cos(ang), -s * np.sin(ang), rng.uniform(-50, 50)],
                    [s * np.sin(ang), s * np.cos(ang), rng.uniform(-50, 50)],
                    [0, 0, 1],
                ]
            )
            idx = rng.choice(n_feat, k, replace=False)
            xy[:k] = project(t, q_xy[idx]) + rng.normal(0, 0.7, (k, 2))
            words[:k] = q_words[idx]
        images.append((keypoints(xy), words))
    return keypoints(q_xy), q_words, images


def test_spatial_rerank_contract(rng):
    q_kp, q_words, images = make_database(rng)
    order = np.arange(40)[::-1].copy()  # relevant images 3, 7, 15, 30 somewhere in the list
    top_r = 25  # covers positions 0..24 = images 39..15: includes 30 and 15, not 7 and 3
    cands = [images[i] for i in order[:top_r]]
    res = spatial_rerank(q_kp, q_words, cands, order, Verification(min_inliers=15), top_r=top_r)
    assert sorted(res.order.tolist()) == list(range(40))
    np.testing.assert_array_equal(res.order[top_r:], order[top_r:])  # below R untouched
    assert set(res.verified.tolist()) == {30, 15}
    np.testing.assert_array_equal(res.order[:2], res.verified)
    assert res.verified[0] == 30  # more visible features -> more inliers
    assert res.inliers.shape == (top_r,) and len(res.transforms) == top_r
    pos30 = int(np.flatnonzero(order == 30)[0])
    assert res.inliers[pos30] >= 60 * 0.9 + 5 * 30 * 0.9
    # Unverified top-R images keep their initial relative order.
    rest = [i for i in res.order[:top_r] if i not in (30, 15)]
    assert rest == [i for i in order[:top_r] if i not in (30, 15)]
    assert res.n_matches.shape == (top_r,) and (res.n_matches >= res.inliers).all()
    # Determinism.
    again = spatial_rerank(q_kp, q_words, cands, order, Verification(min_inliers=15), top_r=top_r)
    np.testing.assert_array_equal(again.order, res.order)
    np.testing.assert_array_equal(again.inliers, res.inliers)


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**16))
def test_spatial_rerank_candidate_permutation(seed):
    """Permuting the initial top R permutes the inlier counts; verified set and order agree."""
    rng = np.random.default_rng(7)
    q_kp, q_words, images = make_database(rng, n_images=16, n_relevant=(2, 5, 9))
    order = np.arange(16)
    perm = np.random.default_rng(seed).permutation(16)
    a = spatial_rerank(q_kp, q_words, [images[i] for i in order], order, Verification(), top_r=16)
    b = spatial_rerank(
        q_kp, q_words, [images[i] for i in order[perm]], order[perm], Verification(), top_r=16
    )
    np.testing.assert_array_equal(b.inliers, a.inliers[perm])
    # Distinct inlier counts among verified: their order does not depend on the initial order.
    np.testing.assert_array_equal(a.verified, b.verified)
    assert set(a.verified.tolist()) == {2, 5, 9}


def test_spatial_rerank_bad_input(rng):
    q_kp, q_words, images = make_database(rng, n_images=5, n_relevant=())
    order = np.arange(5)
    with pytest.raises(InputError, match="top 3"):
        spatial_rerank(q_kp, q_words, images[:2], order, Verification(), top_r=3)
    with pytest.raises(InputError):
        spatial_rerank(q_kp, q_words[:-1], images[:3], order, Verification(), top_r=3)
    res = spatial_rerank(
        q_kp, q_words, images, order, Verification(), top_r=100
    )  # R larger than the list
    np.testing.assert_array_equal(res.order, order)
    assert res.verified.size == 0
    empty = spatial_rerank(q_kp, q_words, [], order, Verification(), top_r=0)
    np.testing.assert_array_equal(empty.order, order)


@settings(max_examples=100, deadline=None)
@given(
    inliers=st.lists(st.integers(0, 30), min_size=0, max_size=25),
    extra=st.integers(0, 10),
    threshold=st.integers(1, 30),
)
def test_rerank_by_inliers_properties(inliers, extra, threshold):
    r = len(inliers)
    order = np.random.default_rng(r + extra).permutation(r + extra) + 1000
    inl = np.array(inliers, dtype=np.int64)
    new, verified = rerank_by_inliers(order, inl, threshold)
    assert sorted(new.tolist()) == sorted(order.tolist())
    np.testing.assert_array_equal(new[r:], order[r:])
    count = dict(zip(order[:r].tolist(), inl.tolist(), strict=True))
    first = {v: i for i, v in enumerate(order.tolist())}
    k = len(verified)
    np.testing.assert_array_equal(new[:k], verified)
    assert all(count[v] >= threshold for v in verified.tolist())
    assert all(count[v] < threshold for v in new[k:r].tolist())
    # Verified: by decreasing inliers, ties by initial position; the rest keep their order.
    keys = [(-count[v], first[v]) for v in verified.tolist()]
    assert keys == sorted(keys)
    rest = [first[v] for v in new[k:r].tolist()]
    assert rest == sorted(rest)


def test_importing_rerank_does_not_import_opencv():
    import subprocess
    import sys

    code = "import sys, oxbench.refinement; assert 'cv2' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_spatial_rerank_returns_inliers_and_takes_given_or_multiple_word_matches(rng):
    from oxbench.refinement.spatial import _group_words, _matches_from_groups, expand_query_words

    q_kp, q_words, images = make_database(rng)
    order = np.arange(40)[::-1].copy()
    cands = [images[i] for i in order[:25]]
    res = spatial_rerank(q_kp, q_words, cands, order, Verification(min_inliers=15), top_r=25)
    for pos, pairs in enumerate(res.inlier_matches):
        assert (pairs is not None) == (order[pos] in (30, 15))
        if (
            pairs is not None
        ):  # inlier correspondences: query and candidate points agree with the model
            t = res.transforms[pos]
            d_xy = cands[pos][0][pairs[:, 1], :2]
            assert np.abs(project(t, q_kp[pairs[:, 0], :2]) - d_xy).max() < 8.0 * 1000 / 1024 + 1
    # precomputed tentative matches: the same ranking as from the words they came from
    given = [_matches_from_groups(_group_words(q_words), c[1], 8) for c in cands]
    res2 = spatial_rerank(
        q_kp,
        np.zeros(0, np.int64),
        cands,
        order,
        Verification(min_inliers=15),
        top_r=25,
        tentative=given,
    )
    np.testing.assert_array_equal(res2.order, res.order)
    np.testing.assert_array_equal(res2.inliers, res.inliers)
    # [n, k] query words: a second word per feature that matches nothing changes nothing
    two = np.stack([q_words, np.full_like(q_words, 10**6)], axis=1)
    res3 = spatial_rerank(q_kp, two, cands, order, Verification(min_inliers=15), top_r=25)
    np.testing.assert_array_equal(res3.order, res.order)
    words, feature = expand_query_words(two)
    assert words.size == 2 * q_words.size and np.array_equal(
        np.bincount(feature), np.full(q_words.size, 2)
    )
    with pytest.raises(InputError, match="tentative match arrays"):
        spatial_rerank(q_kp, q_words, cands, order, Verification(), top_r=25, tentative=given[:3])
