"""SIFT's orientation setting: rotation-invariant by default (a quarter-turned photo describes the
same), upright on request; the default keeps the feature digest it had before the setting."""

from __future__ import annotations

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.features.sift import SiftConfig, extract_raw_sift, finish_descriptors
from oxbench.refinement.spatial import descriptor_matches

cv2 = pytest.importorskip("cv2")


def textured(seed: int = 3, size: int = 240) -> np.ndarray:
    """Blobs and bars at random places: corners and blobs SIFT finds at every orientation."""
    rng = np.random.default_rng(seed)
    img = np.full((size, size, 3), 128, np.uint8)
    for _ in range(60):
        x, y = (int(v) for v in rng.integers(10, size - 10, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            cv2.circle(img, (x, y), int(rng.integers(3, 12)), colour, -1)
        else:
            cv2.rectangle(
                img, (x, y), (x + int(rng.integers(4, 20)), y + int(rng.integers(2, 8))), colour, -1
            )
    return cv2.GaussianBlur(img, (3, 3), 0.8)


def consistent_matches(config: SiftConfig) -> int:
    """Matches between an image and its quarter turn that land where the turn puts them."""
    img = textured()
    turned = np.ascontiguousarray(np.rot90(img))  # (x, y) -> (y, W - 1 - x)
    kp_a, raw_a = extract_raw_sift(img, config)
    kp_b, raw_b = extract_raw_sift(turned, config)
    pairs = descriptor_matches(
        finish_descriptors(raw_a, config.descriptor), finish_descriptors(raw_b, config.descriptor)
    )
    w = img.shape[1]
    expected = np.column_stack([kp_a[pairs[:, 0], 1], w - 1 - kp_a[pairs[:, 0], 0]])
    return int((np.linalg.norm(kp_b[pairs[:, 1], :2] - expected, axis=1) < 2.0).sum())


def test_invariant_sift_matches_a_quarter_turn_and_upright_does_not() -> None:
    invariant = consistent_matches(SiftConfig(max_side=0))
    upright = consistent_matches(SiftConfig(max_side=0, orientation="upright"))
    assert invariant >= 20 and invariant > 3 * upright, (invariant, upright)


def test_upright_describes_each_location_once_at_angle_zero() -> None:
    kp, raw = extract_raw_sift(textured(), SiftConfig(max_side=0, orientation="upright"))
    assert len(kp) == len(raw) > 0 and np.all(kp[:, 3] == 0)
    assert len(np.unique(np.round(kp[:, :3], 2), axis=0)) == len(kp)


def test_the_default_keeps_its_digest_and_bad_values_are_refused() -> None:
    assert "orientation" not in SiftConfig().to_dict()
    assert SiftConfig(orientation="upright").to_dict()["orientation"] == "upright"
    assert SiftConfig(orientation="upright").digest() != SiftConfig().digest()
    with pytest.raises(InputError, match="orientation"):
        SiftConfig(orientation="sideways")
