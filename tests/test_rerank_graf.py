"""Spatial verification on the real Oxford affine "graf" sequence against its ground-truth homographies.

graf1 -> graf2 / graf3 are 20 / 30 degree viewpoint changes of a planar scene; ``H1to{k}p`` maps
graf1 pixels to graf{k} pixels. Features are OpenCV SIFT; visual words are made in the test, either
from nearest-neighbour descriptor matching (word of a db feature = the query feature it matches) or
from a tiny k-means vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxbench.refinement.spatial import Verification, spatial_rerank, tentative_matches, verify_pair

cv2 = pytest.importorskip("cv2")

pytestmark = pytest.mark.shared_data


@pytest.fixture(scope="module")
def graf(request) -> Path:
    shared = request.getfixturevalue("shared_data")
    folder = shared / "oxford_affine" / "graf"
    if not (folder / "graf1.png").is_file():
        pytest.skip(f"{folder} is absent")
    return folder


def sift_features(image: np.ndarray, n: int = 1500) -> tuple[np.ndarray, np.ndarray]:
    cv2.setRNGSeed(0)
    sift = cv2.SIFT_create(nfeatures=n)
    kps, des = sift.detectAndCompute(image, None)
    kp = np.array([[k.pt[0], k.pt[1], k.size, k.angle] for k in kps], dtype=np.float32)
    return kp, des.astype(np.float32)


@pytest.fixture(scope="module")
def features(graf):
    out = {}
    for i in (1, 2, 3):
        image = cv2.imread(str(graf / f"graf{i}.png"), cv2.IMREAD_GRAYSCALE)
        assert image is not None and image.shape == (640, 800)
        out[i] = sift_features(image)
    noise = np.random.default_rng(0).integers(0, 256, (640, 800), dtype=np.uint8)
    out["noise"] = sift_features(cv2.GaussianBlur(noise, (5, 5), 1.5))
    return out


def words_by_matching(q_des: np.ndarray, d_des: np.ndarray, ratio: float | None = 0.8):
    """Word ids from descriptor matching: query feature i has word i; a db feature whose nearest
    query feature is i (passing the ratio test) also gets word i, the rest get unique words."""
    bf = cv2.BFMatcher(cv2.NORM_L2)
    q_words = np.arange(len(q_des), dtype=np.int64)
    d_words = np.arange(len(q_des), len(q_des) + len(d_des), dtype=np.int64)
    for pair in bf.knnMatch(d_des, q_des, k=2):
        best, second = pair[0], pair[1]
        if ratio is None or best.distance < ratio * second.distance:
            d_words[best.queryIdx] = best.trainIdx
    return q_words, d_words


def grid_error(h_true: np.ndarray, h_est: np.ndarray) -> np.ndarray:
    xs, ys = np.meshgrid(np.linspace(150, 650, 6), np.linspace(150, 490, 5))
    p = np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)], axis=1)
    a, b = p @ h_true.T, p @ h_est.T
    return np.linalg.norm(a[:, :2] / a[:, 2:] - b[:, :2] / b[:, 2:], axis=1)


@pytest.mark.parametrize("method", ["magsac", "fsm"])
@pytest.mark.parametrize(("k", "min_inl"), [(2, 300), (3, 150)])
def test_homography_recovers_ground_truth(graf, features, k, min_inl, method):
    q_kp, q_des = features[1]
    d_kp, d_des = features[k]
    q_words, d_words = words_by_matching(q_des, d_des)
    matches = tentative_matches(q_words, d_words, max_per_word=8)
    res = verify_pair(
        q_kp,
        d_kp,
        matches,
        Verification(model="homography", method=method),
        q_size=(800, 640),
        d_size=(800, 640),
    )
    assert res.verified
    assert res.n_inliers >= min_inl
    h_true = np.loadtxt(graf / f"H1to{k}p")
    err = grid_error(h_true, res.transform)
    assert np.median(err) < 2.0
    assert err.max() < 5.0
    # The inliers agree with the ground truth too.
    inl = matches[res.inlier_mask]
    d_gt = np.c_[q_kp[inl[:, 0], :2], np.ones(len(inl))] @ h_true.T
    d_gt = d_gt[:, :2] / d_gt[:, 2:]
    assert np.median(np.linalg.norm(d_gt - d_kp[inl[:, 1], :2], axis=1)) < 2.0


def test_unrelated_pair_gets_no_inliers(features):
    q_kp, q_des = features[1]
    d_kp, d_des = features["noise"]
    # Without a ratio test every noise feature is matched to something: many tentative matches.
    q_words, d_words = words_by_matching(q_des, d_des, ratio=None)
    matches = tentative_matches(q_words, d_words, max_per_word=8)
    assert len(matches) > 500
    for model, method in [("homography", "magsac"), ("affine", "magsac"), ("affine", "fsm")]:
        res = verify_pair(
            q_kp, d_kp, matches, Verification(model=model, method=method, min_inliers=8)
        )
        assert res.n_inliers <= 6
        assert not res.verified


def test_tiny_vocabulary_reranks_graf(features):
    """Words from a 500-word k-means vocabulary trained on other images (graf3 + noise)."""
    faiss = pytest.importorskip("faiss")
    train = np.vstack([features[3][1], features["noise"][1]])
    km = faiss.Kmeans(128, 500, niter=8, seed=1, verbose=False, min_points_per_centroid=1)
    km.train(train)

    def words(des):
        return km.index.search(des, 1)[1].ravel().astype(np.int64)

    q_kp, q_des = features[1]
    candidates = [(features[k][0], words(features[k][1])) for k in ("noise", 2)]
    order = np.array([0, 1])  # 0 = noise, 1 = graf2: the noise image is ranked first
    res = spatial_rerank(
        q_kp,
        words(q_des),
        candidates,
        order,
        Verification(model="affine", method="magsac", min_inliers=8),
        top_r=2,
    )
    np.testing.assert_array_equal(res.order, [1, 0])
    np.testing.assert_array_equal(res.verified, [1])
    assert res.inliers[1] >= 40 and res.inliers[0] < 8


@pytest.mark.slow
def test_real_paris_query_verifies_only_true_positives(shared_data):
    """RParis query p15 and its 20 labelled candidates (5 hard positives, 15 negatives): with
    RootSIFT matched by the ratio test, the images that pass verification are true positives."""
    import csv

    root = shared_data / "revisited_pixel_retrieval_subset"
    if not (root / "manifest.tsv").is_file():
        pytest.skip(f"{root} is absent")
    with open(root / "manifest.tsv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh, delimiter="\t") if r["query_folder"] == "p15"]
    assert len(rows) == 20

    def rootsift(path):
        image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE)
        h, w = image.shape
        s = min(1.0, 1024 / max(h, w))
        small = cv2.resize(image, (round(w * s), round(h * s)), interpolation=cv2.INTER_AREA)
        kp, des = sift_features(small, n=2000)
        kp[:, :3] /= s  # back to original pixels
        des = np.sqrt(des / (des.sum(axis=1, keepdims=True) + 1e-9)).astype(np.float32)
        return kp, des, (w, h)

    q_kp, q_des, q_size = rootsift(root / "queries" / "p15" / "query.jpg")
    candidates, positive = [], []
    for row in rows:
        kp, des, size = rootsift(root / "db_images" / row["image_file"])
        _, d_words = words_by_matching(q_des, des, ratio=0.85)
        candidates.append((kp, d_words, size))
        positive.append(row["repo_label"] == "TP")
    positive = np.array(positive)
    res = spatial_rerank(
        q_kp,
        np.arange(len(q_kp)),
        candidates,
        np.arange(20),
        Verification(),
        top_r=20,
        query_size=q_size,
    )
    assert len(res.verified) >= 1
    assert positive[res.verified].all()
    # The two candidates with most inliers are true positives (the negatives reach ~5).
    assert positive[np.argsort(-res.inliers, kind="stable")[:2]].all()
