"""Local features: SIFT/RootSIFT extraction, coordinates, query crops, the resumable store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from oxbench.datasets.base import Benchmark, FileImages
from oxbench.errors import InputError
from oxbench.execution import ProcessExecutor
from oxbench.features.local import LocalFeatures, RawFeatures
from oxbench.features.sift import SiftConfig, extract_features, extract_raw_sift, rootsift
from oxbench.features.store import DescribeImages, DescribeQueries, FeatureStore, extract_to_store
from oxbench.groundtruth import GroundTruth, make_query

cv2 = pytest.importorskip("cv2")


def textured_image(seed: int, w: int = 320, h: int = 240) -> np.ndarray:
    """A deterministic RGB image full of corners and blobs (SIFT finds hundreds of keypoints)."""
    rng = np.random.default_rng(seed)
    noise = cv2.GaussianBlur(rng.random((h, w)).astype(np.float32), (0, 0), 2.0)
    noise = (noise - noise.min()) / (np.ptp(noise) + 1e-9)
    img = np.repeat((noise * 160 + 48).astype(np.uint8)[:, :, None], 3, axis=2)
    for _ in range(80):
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h))
        if rng.random() < 0.5:
            cv2.circle(img, (x, y), int(rng.integers(3, 20)), color, -1)
        else:
            cv2.rectangle(
                img, (x, y), (x + int(rng.integers(4, 30)), y + int(rng.integers(4, 30))), color, -1
            )
    return cv2.GaussianBlur(img, (0, 0), 1.0)


class ArrayImages:
    """In-memory image source (picklable, for the process pool)."""

    def __init__(
        self, images: list[np.ndarray], names: list[str] | None = None, bad: int | None = None
    ) -> None:
        self.images = images
        self.names = names or [f"img{i:03d}" for i in range(len(images))]
        self.bad = bad

    def __len__(self) -> int:
        return len(self.images)

    def name(self, i: int) -> str:
        return self.names[i]

    def path(self, i: int) -> Path | None:
        return None

    def read(self, i: int) -> np.ndarray:
        if i == self.bad:
            raise InputError("cannot decode image (test)", self.names[i])
        return self.images[i]


# ---------------------------------------------------------------------- RootSIFT


def test_rootsift_known_values() -> None:
    out = rootsift(np.array([[1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]))
    np.testing.assert_allclose(out[0], [0.5, np.sqrt(0.75), 0.0], rtol=1e-6)
    np.testing.assert_array_equal(out[1], [0, 0, 0])  # zero rows stay zero
    assert out.dtype == np.float32


@settings(max_examples=50, deadline=None)
@given(arrays(np.int64, (2, 16), elements=st.integers(0, 255)))
def test_rootsift_is_hellinger(x: np.ndarray) -> None:
    """Unit L2 norm, non-negative, and dot products equal the Hellinger kernel of the L1-normalised inputs."""
    r = rootsift(x)
    assert np.all(r >= 0)
    for row, src in zip(r, x, strict=True):
        if src.sum() > 0:
            assert abs(np.linalg.norm(row) - 1.0) < 1e-5
    if x[0].sum() > 0 and x[1].sum() > 0:
        a, b = x[0] / x[0].sum(), x[1] / x[1].sum()
        assert abs(float(r[0] @ r[1]) - float(np.sum(np.sqrt(a * b)))) < 1e-5


def test_rootsift_holds_one_copy_of_its_input_and_leaves_the_input_alone() -> None:
    """A vocabulary's training set goes through rootsift whole: it allocates the float32 result
    and little else (it once held three float32 arrays of that size), gives exactly the values of
    the formula, and never writes into a float32 input."""
    import tracemalloc

    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(20_000, 128), dtype=np.uint8)
    expected = np.sqrt(raw.astype(np.float32) / raw.astype(np.float32).sum(axis=1, keepdims=True))
    tracemalloc.start()
    try:
        out = rootsift(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * out.nbytes
    np.testing.assert_array_equal(out, expected)
    f32 = raw.astype(np.float32)
    before = f32.copy()
    np.testing.assert_array_equal(rootsift(f32), expected)
    np.testing.assert_array_equal(f32, before)


def test_rootsift_refuses_negative_input() -> None:
    with pytest.raises(InputError):
        rootsift(np.array([[-1.0, 2.0]]))


# ---------------------------------------------------------------------- extraction


def test_raw_sift_is_integer_valued_and_rootsift_is_unit_norm() -> None:
    img = textured_image(0)
    kp, raw = extract_raw_sift(img, SiftConfig(n_features=0))
    assert kp.shape[1] == 4 and raw.shape == (len(kp), 128) and raw.dtype == np.uint8
    assert len(kp) > 100
    feats = extract_features(img, SiftConfig())
    np.testing.assert_allclose(np.linalg.norm(feats.descriptors, axis=1), 1.0, atol=1e-5)
    assert feats.image_size == (320, 240)
    sift = extract_features(img, SiftConfig(descriptor="sift", n_features=0))
    # stored uint8 is exact: OpenCV's float descriptors are integers in [0, 255]
    sift_cv = cv2.SIFT_create().detectAndCompute(cv2.cvtColor(img, cv2.COLOR_RGB2GRAY), None)[1]
    np.testing.assert_array_equal(sift.descriptors, sift_cv)


def test_n_features_caps_keypoints() -> None:
    feats = extract_features(textured_image(1), SiftConfig(n_features=50))
    assert len(feats) == 50


def _nn_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = np.linalg.norm(a[:, None, :2] - b[None, :, :2], axis=2)
    return d.min(axis=1)


def test_downscaling_maps_keypoints_back_to_original_pixels() -> None:
    small = textured_image(2, 200, 150)
    big = cv2.resize(small, (400, 300), interpolation=cv2.INTER_LINEAR)
    f_small = extract_features(small, SiftConfig(max_side=0, n_features=0))
    f_big = extract_features(big, SiftConfig(max_side=200, n_features=0))  # described at 200x150
    assert f_big.image_size == (400, 300)
    # the big image's keypoints, halved, land on the small image's keypoints (pixel-centre mapping)
    expected = f_small.keypoints.copy()
    expected[:, :2] = (expected[:, :2] + 0.5) * 2 - 0.5
    d = _nn_distance(expected, f_big.keypoints)
    assert np.median(d) < 1.5
    assert f_big.keypoints[:, 0].max() < 400 and f_big.keypoints[:, 0].min() > -1


def test_sift_matches_a_warped_copy() -> None:
    """Mutual nearest-neighbour RootSIFT matches between an image and its rotated, scaled copy follow the warp."""
    img = textured_image(3, 400, 300)
    a = cv2.getRotationMatrix2D((200, 150), 20, 0.8)
    warped = cv2.warpAffine(img, a, (400, 300), borderValue=(128, 128, 128))
    f1 = extract_features(img, SiftConfig(n_features=0))
    f2 = extract_features(warped, SiftConfig(n_features=0))
    sim = f1.descriptors @ f2.descriptors.T
    j = sim.argmax(axis=1)
    mutual = sim.argmax(axis=0)[j] == np.arange(len(f1))
    p1 = f1.keypoints[mutual, :2]
    p2 = f2.keypoints[j[mutual], :2]
    proj = p1 @ a[:, :2].T + a[:, 2]
    err = np.linalg.norm(proj - p2, axis=1)
    assert (err < 3.0).sum() >= 30
    assert (err < 3.0).mean() > 0.5


def test_local_features_validation() -> None:
    with pytest.raises(InputError):
        LocalFeatures(np.zeros((3, 3), np.float32), np.zeros((3, 128), np.float32), (10, 10))
    with pytest.raises(InputError):
        LocalFeatures(np.zeros((3, 4), np.float32), np.zeros((2, 128), np.float32), (10, 10))
    with pytest.raises(InputError):
        LocalFeatures(np.zeros((3, 4), np.float64), np.zeros((3, 128), np.float32), (10, 10))
    f = LocalFeatures.empty((5, 6))
    assert len(f) == 0 and f.dim == 128


# ---------------------------------------------------------------------- query crops


def _tiny_benchmark(tmp_path: Path, bbox: tuple[float, float, float, float]) -> Benchmark:
    from PIL import Image

    img = textured_image(4, 320, 240)
    p = tmp_path / "q.png"
    Image.fromarray(img).save(p)
    images = FileImages(("q",), (p,))
    gt = GroundTruth("tiny", "revisited", ("q",), (make_query("q", bbox, easy=[0]),))
    return Benchmark("tiny", gt, images, images, ("revisited",))


def test_query_is_described_from_its_crop_in_full_image_coordinates(tmp_path: Path) -> None:
    bbox = (60.2, 40.0, 250.0, 200.7)
    bench = _tiny_benchmark(tmp_path, bbox)
    cfg = SiftConfig(n_features=0)
    query = DescribeQueries(bench, cfg)(0)
    kp, raw = query.keypoints, query.descriptors
    assert query.name == "q" and query.image_size == (320, 240)
    crop = bench.query_crop(0)
    kp_crop, raw_crop = extract_raw_sift(crop, cfg)
    np.testing.assert_array_equal(raw, raw_crop)  # the crop only, nothing from outside
    np.testing.assert_allclose(kp[:, 0], kp_crop[:, 0] + 60)  # python rounding: left = round(60.2)
    np.testing.assert_allclose(kp[:, 1], kp_crop[:, 1] + 40)
    assert kp[:, 0].min() >= 59 and kp[:, 0].max() <= 251 and kp[:, 1].max() <= 202


# ---------------------------------------------------------------------- store


def _all(store: FeatureStore, names: list[str]) -> list[RawFeatures]:
    return [store.get_raw(n) for n in names]


def test_store_resumes_to_the_same_result(tmp_path: Path) -> None:
    src = ArrayImages([textured_image(10 + i, 160, 120) for i in range(7)])
    cfg = SiftConfig(n_features=100)
    full = FeatureStore.open(tmp_path / "full", cfg)
    extract_to_store(DescribeImages(src, cfg), len(src), full, shard_size=3, progress=False)
    part = FeatureStore.open(tmp_path / "part", cfg)
    extract_to_store(
        DescribeImages(src, cfg), len(src), part, shard_size=3, progress=False, stop_after=1
    )
    assert len(part) == 3
    # a leftover temporary file (crash mid-write) does not count as a shard
    (tmp_path / "part" / "shard-000001.kp.npy.tmp").write_bytes(b"garbage")
    reopened = FeatureStore.open(tmp_path / "part", cfg)
    assert len(reopened) == 3
    extract_to_store(DescribeImages(src, cfg), len(src), reopened, shard_size=3, progress=False)
    names = src.names
    for a, b in zip(
        _all(full, names), _all(FeatureStore.open(tmp_path / "part", cfg), names), strict=True
    ):
        assert a.name == b.name and a.image_size == b.image_size
        np.testing.assert_array_equal(a.keypoints, b.keypoints)
        np.testing.assert_array_equal(a.descriptors, b.descriptors)
    f = full.get("img002")
    assert isinstance(f, LocalFeatures)
    np.testing.assert_allclose(np.linalg.norm(f.descriptors, axis=1), 1.0, atol=1e-5)


def test_store_with_process_pool_equals_serial(tmp_path: Path) -> None:
    src = ArrayImages([textured_image(20 + i, 160, 120) for i in range(4)])
    cfg = SiftConfig(n_features=80)
    serial = FeatureStore.open(tmp_path / "s", cfg)
    extract_to_store(DescribeImages(src, cfg), len(src), serial, progress=False)
    pooled = FeatureStore.open(tmp_path / "p", cfg)
    extract_to_store(
        DescribeImages(src, cfg),
        len(src),
        pooled,
        executor=ProcessExecutor(2),
        shard_size=2,
        progress=False,
    )
    for a, b in zip(_all(serial, src.names), _all(pooled, src.names), strict=True):
        np.testing.assert_array_equal(a.descriptors, b.descriptors)


def test_store_refuses_another_config(tmp_path: Path) -> None:
    FeatureStore.open(tmp_path / "s", SiftConfig(max_side=512))
    with pytest.raises(InputError, match="another config.*max_side"):
        FeatureStore.open(tmp_path / "s", SiftConfig(max_side=1024))
    with pytest.raises(InputError, match="another config"):
        FeatureStore.open(tmp_path / "s", SiftConfig(max_side=512, descriptor="sift"))
    with pytest.raises(InputError, match="another config"):
        FeatureStore.open(tmp_path / "s", SiftConfig(max_side=512), extra={"role": "queries"})


def test_store_missing_features_and_unreadable_image(tmp_path: Path) -> None:
    src = ArrayImages([textured_image(30 + i, 120, 100) for i in range(4)], bad=2)
    cfg = SiftConfig(n_features=50)
    store = FeatureStore.open(tmp_path / "s", cfg)
    with pytest.raises(InputError, match="cannot decode"):
        extract_to_store(DescribeImages(src, cfg), len(src), store, shard_size=2, progress=False)
    # the first shard completed; the one with the bad image left nothing that looks complete
    reopened = FeatureStore.open(tmp_path / "s", cfg)
    assert sorted(reopened.names) == ["img000", "img001"]
    with pytest.raises(InputError, match="no features for image 'img002'"):
        reopened.get("img002")
    with pytest.raises(InputError, match="have no features"):
        reopened.require_all(src.names)
    with pytest.raises(InputError, match="no feature store"):
        FeatureStore.open(tmp_path / "absent", cfg, create=False)


def test_store_refuses_duplicate_names(tmp_path: Path) -> None:
    src = ArrayImages([textured_image(1, 80, 80)] * 2, names=["a", "a"])
    cfg = SiftConfig(n_features=10)
    with pytest.raises(InputError, match="appears twice"):
        extract_to_store(
            DescribeImages(src, cfg), 2, FeatureStore.open(tmp_path / "s", cfg), progress=False
        )


def test_a_store_of_flat_shard_files_stays_warm(tmp_path: Path) -> None:
    """Stores written before shard folders (``shard-000000.{kp.npy,raw.npy,index.npz}``) are read
    as they are: nothing is described again, and the features are the same."""
    src = ArrayImages([textured_image(50 + i, 160, 120) for i in range(5)])
    cfg = SiftConfig(n_features=60)
    store = FeatureStore.open(tmp_path / "s", cfg)
    extract_to_store(DescribeImages(src, cfg), len(src), store, shard_size=2, progress=False)
    before = _all(FeatureStore.open(tmp_path / "s", cfg), src.names)
    for number, folder in enumerate(sorted((tmp_path / "s").glob("shard-*"))):
        for name in ("kp.npy", "raw.npy", "index.npz"):
            (folder / name).rename(tmp_path / "s" / f"shard-{number:06d}.{name}")
        folder.rmdir()
    flat = FeatureStore.open(tmp_path / "s", cfg)
    assert len(flat) == 5 and flat.bad_shards == []
    assert (
        extract_to_store(DescribeImages(src, cfg), len(src), flat, shard_size=2, progress=False)
        == 0
    )
    for a, b in zip(before, _all(FeatureStore.open(tmp_path / "s", cfg), src.names), strict=True):
        assert a.name == b.name and a.image_size == b.image_size
        np.testing.assert_array_equal(a.descriptors, b.descriptors)
    assert not list((tmp_path / "s").glob("shard-*/"))  # no shard was written again
