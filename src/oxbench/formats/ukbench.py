"""UKBench (Nister & Stewenius 2006): ground truth from the naming alone.

The images are ``ukbench00000.jpg`` ... ``ukbench10199.jpg``: 2,550 objects x 4 images, object =
index // 4. Every image queries the whole set, itself included; the score is the mean number of
the object's 4 images among the top 4 (0..4). No official list file exists or is needed.
"""

from __future__ import annotations

import numpy as np

from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth, Query
from oxbench.protocol import get_protocol

N_IMAGES = 10200
IMAGES_PER_OBJECT = 4


def ukbench_name(index: int) -> str:
    """``ukbench%05d``: the name (without ``.jpg``) of image ``index``.

    Example:
        >>> ukbench_name(42)
        'ukbench00042'
    """
    return f"ukbench{index:05d}"


def ukbench_ground_truth(n_images: int = N_IMAGES) -> GroundTruth:
    """The UKBench ground truth (protocol ``ukbench``) for the first ``n_images`` images.

    Query i is image i (no box); its ``good`` are the 4 images of object i // 4, itself included;
    nothing is ignored.

    Args:
        n_images: number of images, a positive multiple of 4 (10,200 for the full set).

    Raises:
        InputError: ``n_images`` is not a positive multiple of 4.

    Example:
        >>> gt = ukbench_ground_truth(8)
        >>> gt.n_queries, gt.queries[5].good.tolist()  # image 5 is object 1: images 4..7
        (8, [4, 5, 6, 7])
    """
    if isinstance(n_images, bool) or not isinstance(n_images, int | np.integer):
        raise InputError(f"UKBench image count must be an integer, got {n_images!r}")
    n = int(n_images)
    if n <= 0 or n % IMAGES_PER_OBJECT:
        raise InputError(f"UKBench image count must be a positive multiple of 4, got {n}")
    names = tuple(ukbench_name(i) for i in range(n))
    groups = np.arange(n, dtype=np.int64).reshape(-1, IMAGES_PER_OBJECT)
    queries = tuple(
        Query(name=names[i], bbox=None, good=groups[i // IMAGES_PER_OBJECT]) for i in range(n)
    )
    return GroundTruth("ukbench", get_protocol("ukbench"), names, queries, "ukbench")
