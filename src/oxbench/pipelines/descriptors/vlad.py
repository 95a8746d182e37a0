"""VLAD over local features (``descriptor=vlad``): Jegou et al. CVPR 2010, with intra-normalisation
(Arandjelovic & Zisserman CVPR 2013) and signed square-root power normalisation.

The codebook is a flat k-means vocabulary trained on the training set's local features by the
shared vocabulary step (exactly as bag of words trains its vocabulary); each image's VLAD vector is
computed from its stored local features (a query from its crop's) and cached per part. Needs no deep
learning framework.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.features.extractors import LOCAL_FEATURES_SPEC
from oxbench.features.local import LocalExtractor
from oxbench.features.sift import SiftConfig
from oxbench.index.footprint import disk_bytes
from oxbench.index.vocabulary import Codebook
from oxbench.pipelines.descriptors import (
    DescriptorKind,
    FamilySettings,
    StoredDescriber,
    register_descriptor,
)
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.steps import (
    VocabularySpec,
    load_vocabulary,
    open_store,
    reopen_store,
    step_features,
    step_vocabulary,
    store_spec,
)
from oxbench.schema import setting

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.features.store import FeatureStore
    from oxbench.index.vocabulary import Vocabulary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VladDescriptor(DescriptorKind):
    """VLAD over local features.

    Attributes:
        features: the local features VLAD aggregates (a query is described from its crop only);
            from text a registered name (``rootsift``, ``h5:PATH``: :mod:`oxbench.features.extractors`).
        vocabulary: the flat k-means codebook (:class:`~oxbench.index.vocabulary.Codebook`, the
            ``vocabulary`` settings every family shares: ``descriptor.vocabulary.size`` words,
            the descriptor has ``size * features.dim`` dimensions).
        power: signed power normalisation exponent of every component (0.5: signed square root;
            1: none).
        intra_norm: L2-normalise each centroid's residual sum before the final L2 (intra-norm).
    """

    kind: ClassVar[str] = "vlad"
    #: Settings of earlier versions and their names now.
    renamed: ClassVar[dict[str, str]] = {
        "k": "vocabulary.size",
        "iter": "vocabulary.iter",
        "max_points_per_centroid": "vocabulary.sample",
        "seed": "vocabulary.seed",
    }

    features: LocalExtractor = setting(
        spec=LOCAL_FEATURES_SPEC, default_factory=SiftConfig, doc="vlad: local features aggregated"
    )
    vocabulary: Codebook = field(
        default_factory=lambda: Codebook(size=64, iter=20, sample=256, seed=0)
    )
    power: float = setting(
        0.5, S.Float(lo=0, lo_open=True, hi=1), doc="vlad: signed power normalisation"
    )
    intra_norm: bool = setting(True, S.Bool(), doc="vlad: intra-normalisation")

    @property
    def learns(self) -> str:
        return "a codebook"

    @property
    def local_features(self) -> LocalExtractor:
        return self.features

    @property
    def requires(self) -> tuple[tuple[str, str], ...]:
        """OpenCV's SIFT and FAISS's k-means."""
        return (("cv2", "classic"), ("faiss", "classic"))

    @property
    def dim(self) -> int:
        return self.vocabulary.size * self.features.dim

    def shorthand(self, option: str) -> str | None:
        """``max_side``: the local features' (``features.max_side``); ``vocab_size``: the
        codebook's (``vocabulary.size``)."""
        return {"max_side": "features.max_side", "vocab_size": "vocabulary.size"}.get(option)

    def codebook(self) -> VocabularySpec:
        """The flat k-means vocabulary VLAD uses (the shared vocabulary step trains it)."""
        v = self.vocabulary
        return VocabularySpec(self.features, v.size, "flat", v.iter, v.sample, seed=v.seed)

    def cache_key(self) -> dict[str, Any]:
        return {
            "descriptor": "vlad",
            "features": self.features.to_dict(),
            "vlad_k": self.vocabulary.size,
            "power": self.power,
            "intra_norm": self.intra_norm,
        }

    def build(self, m: FamilySettings) -> VladDescriber:
        return VladDescriber(self, m)


register_descriptor(VladDescriptor)


class VladDescriber(StoredDescriber):
    """Learns the codebook and describes each image by its VLAD vector."""

    shard_size: ClassVar[int] = 2048
    kind: VladDescriptor

    def __init__(self, kind: VladDescriptor, m: FamilySettings) -> None:
        super().__init__(kind, m)
        self.codebook_path_: Path | None = None

    def fit(self, train: Benchmark, ctx: RunContext) -> None:
        with ctx.timed("codebook"):
            res = step_vocabulary(self.kind.codebook(), train, ctx)
        self.codebook_path_ = res.path
        ctx.record_step("codebook", hit=res.hit)

    def store_key(self, ctx: RunContext, part: str) -> dict[str, Any]:
        if self.codebook_path_ is None:
            raise InputError(f"method {self.m.name}: fit before describing images")
        return {**self.kind.cache_key(), "codebook": self.codebook_path_.name}

    def _store(self, bench: Benchmark, part: str, ctx: RunContext) -> FeatureStore:
        step_features(bench, self.kind.features, ctx, parts=[part])
        return open_store(ctx.cache, bench, self.kind.features, part)

    def compute(self, bench: Benchmark, part: str, names: list[str], ctx: RunContext) -> VladShard:
        assert self.codebook_path_ is not None
        store = self._store(bench, part, ctx)
        return VladShard(
            VladImage(
                self.kind,
                store_spec(store),
                load_vocabulary(self.codebook_path_, self.kind.features),
                names,
                f"{bench.id} {part}",
            )
        )

    def stores_on_disk(
        self, bench: Benchmark, parts: list[str], ctx: RunContext
    ) -> dict[str, list[Path]]:
        """The descriptor stores, and the local features VLAD was aggregated from (they stay in
        the cache)."""
        return {
            **super().stores_on_disk(bench, parts, ctx),
            "local_features": [
                open_store(ctx.cache, bench, self.kind.features, p).directory for p in parts
            ],
        }

    def fixed_disk(self) -> dict[str, int]:
        return {"codebook": disk_bytes(self.codebook_path_)} if self.codebook_path_ else {}

    def provenance(self) -> dict[str, Any]:
        out = super().provenance()
        if self.codebook_path_ is not None:
            out["codebook_path"] = str(self.codebook_path_)
        return out


def vlad(
    descriptors: NDArray[np.float32],
    words: NDArray[np.integer],
    centroids: NDArray[np.float32],
    *,
    power: float = 0.5,
    intra_norm: bool = True,
) -> NDArray[np.float32]:
    """The VLAD vector of one image.

    ``V[c] = sum_{i: words[i] == c} (x_i - mu_c)`` for every centroid ``c``; then each component is
    power-normalised (``sign(v) |v| ** power``), each centroid block L2-normalised when
    ``intra_norm``, and the whole ``k * d`` vector L2-normalised. No features give the zero vector.

    Args:
        descriptors: ``[n, d]`` local descriptors.
        words: ``[n]`` nearest centroid of each.
        centroids: ``[k, d]``.

    Example:
        >>> c = np.array([[0.0, 0.0], [1.0, 1.0]], np.float32)
        >>> vlad(np.array([[1.0, 0.0]], np.float32), np.array([0]), c, power=1.0).tolist()
        [1.0, 0.0, 0.0, 0.0]
    """
    k, d = centroids.shape
    x = np.asarray(descriptors, np.float64)
    w = np.asarray(words, np.int64)
    if x.shape[0] != w.shape[0] or (x.size and x.shape[1] != d):
        raise ValueError(f"{x.shape} descriptors, {w.shape} words, {centroids.shape} centroids")
    v = np.zeros((k, d), np.float64)
    if len(x):
        np.add.at(v, w, x - centroids[w])
    if power != 1.0:
        v = np.sign(v) * np.abs(v) ** power
    if intra_norm:
        norms = np.linalg.norm(v, axis=1, keepdims=True)
        v = np.divide(v, norms, out=np.zeros_like(v), where=norms > 0)
    flat = v.ravel()
    n = np.linalg.norm(flat)
    return (flat / n if n > 0 else flat).astype(np.float32)


class VladImage:
    """Picklable job: the VLAD vector of image ``i`` of a part (its features reopened where it runs)."""

    def __init__(
        self,
        kind: VladDescriptor,
        store: tuple[Path, Any, dict[str, object]],
        voc: Vocabulary,
        names: list[str],
        what: str,
    ) -> None:
        self.kind, self.store_spec, self.voc, self.names, self.what = kind, store, voc, names, what
        self.dim = kind.dim
        self._store: FeatureStore | None = None

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_store": None}

    def __call__(self, i: int) -> NDArray[np.float32]:
        if self._store is None:
            self._store = reopen_store(self.store_spec)
        kind, centroids = self.kind, self.voc.centroids_
        assert centroids is not None
        x = kind.features.finish(self._store.get_raw(self.names[i]).descriptors)
        if not len(x):
            log.warning(
                "%s: image %s has no features; its descriptor is zero (ranks last)",
                self.what,
                self.names[i],
            )
            return np.zeros(self.dim, np.float32)
        words = self.voc.kneighbors(x, 1)[1][:, 0]
        return vlad(x, words, centroids, power=kind.power, intra_norm=kind.intra_norm)


class VladShard:
    """Picklable :data:`~oxbench.features.descstore.Compute`: the VLAD vectors of some images."""

    def __init__(self, image: VladImage) -> None:
        self.image = image

    def __call__(self, positions: list[int]) -> tuple[list[int], NDArray[np.float32]]:
        rows = [self.image(i) for i in positions]
        return positions, np.stack(rows) if rows else np.zeros((0, self.image.dim), np.float32)
