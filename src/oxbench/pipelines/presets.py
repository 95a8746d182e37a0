"""Named methods of every family, as data.

Each preset is a frozen config (:class:`~oxbench.pipelines.method.MethodConfig`): every setting
that changes the result, nothing executable. Bag-of-words presets are :class:`BowMethod` entries
(``rootsift-bow``, ``rootsift-bow-sv``, ``rootsift-bow-sv-qe``, the soft-assignment variants
``...-sa...``); global-descriptor presets are
:class:`~oxbench.pipelines.globaldesc.GlobalMethod` entries (``rootsift-vlad`` and its whitened /
query-expanded variants). :data:`METHODS` maps names to them; :func:`resolve_method` applies
overrides (``vocab_size=...``, ``features.max_side=...``) and returns the frozen config a run
records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from oxbench.errors import InputError
from oxbench.features.sift import SiftConfig
from oxbench.pipelines.globaldesc import GlobalMethod
from oxbench.pipelines.method import METHODS, MethodConfig, register_method, resolve_method

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.pipelines.bow import BagOfWords

__all__ = ["DEFAULT_METHOD", "METHODS", "BowMethod", "GlobalMethod", "resolve_method"]


@dataclass(frozen=True)
class BowMethod(MethodConfig):
    """A RootSIFT bag-of-words method (Philbin et al. 2007/2008, Arandjelovic & Zisserman 2012).

    Attributes:
        name: preset name.
        features: local-feature extraction settings.
        vocab_size: number of visual words.
        vocab_structure: ``auto`` / ``flat`` / ``two-level`` (see :class:`~oxbench.index.vocabulary.Vocabulary`).
        vocab_iter: k-means iterations.
        vocab_max_points_per_centroid: training-sample limit (descriptors per word).
        vocab_n_probe: coarse cells searched in two-level assignment.
        vocab_seed: seed of sampling and k-means.
        assignment: ``hard`` or ``soft`` (k nearest words with Gaussian weights, both sides).
        soft_k, soft_sigma2: soft-assignment neighbours and ``sigma^2`` (unit-norm RootSIFT units;
            Philbin et al. 2008 used ``k = 3`` and ``sigma^2 = 6250`` for SIFT vectors of norm ~512,
            i.e. about 0.024 of the squared norm; 0.02 here).
        burst: ``sqrt`` (damp repeated words) or ``none``.
        idf: tf-idf weighting.
        spatial: spatially re-rank the top ``spatial_top_r``.
        spatial_model, spatial_min_inliers, spatial_threshold_px: verification settings
            (:func:`oxbench.rerank.spatial.spatial_rerank`).
        qe: ``none`` or ``aqe`` (average query expansion over the spatially verified images).
        qe_max_verified: at most this many verified images are averaged.
    """

    family: ClassVar[str] = "bow"

    name: str
    features: SiftConfig = field(default_factory=SiftConfig)
    vocab_size: int = 16384
    vocab_structure: Literal["auto", "flat", "two-level"] = "auto"
    vocab_iter: int = 10
    vocab_max_points_per_centroid: int = 32
    vocab_n_probe: int = 4
    vocab_seed: int = 0
    assignment: Literal["hard", "soft"] = "hard"
    soft_k: int = 3
    soft_sigma2: float = 0.02
    burst: Literal["none", "sqrt"] = "sqrt"
    idf: bool = True
    spatial: bool = False
    spatial_top_r: int = 200
    spatial_model: Literal["affine", "homography", "similarity"] = "affine"
    spatial_min_inliers: int = 8
    spatial_threshold_px: float = 8.0
    qe: Literal["none", "aqe"] = "none"
    qe_max_verified: int = 50

    def __post_init__(self) -> None:
        if self.qe != "none" and not self.spatial:
            raise InputError(f"method {self.name}: query expansion needs spatial verification")
        if self.assignment not in ("hard", "soft"):
            raise InputError(f"method {self.name}: unknown assignment {self.assignment!r}")
        if self.vocab_size < 2:
            raise InputError(f"method {self.name}: vocab_size must be >= 2")

    def build(self) -> BagOfWords:
        from oxbench.pipelines.bow import BagOfWords

        return BagOfWords(self)

    @property
    def resolved_vocab_structure(self) -> Literal["flat", "two-level"]:
        """``flat`` or ``two-level``: what ``vocab_structure="auto"`` means at this size."""
        if self.vocab_structure != "auto":
            return self.vocab_structure
        from oxbench.index.vocabulary import AUTO_FLAT_MAX

        return "flat" if self.vocab_size <= AUTO_FLAT_MAX else "two-level"

    def vocabulary_settings(self) -> dict[str, object]:
        """The settings that determine the vocabulary (with the features and training set)."""
        return {
            "features": self.features.to_dict(),
            "n_words": self.vocab_size,
            "structure": self.resolved_vocab_structure,
            "n_iter": self.vocab_iter,
            "max_points_per_centroid": self.vocab_max_points_per_centroid,
            "n_probe": self.vocab_n_probe,
            "seed": self.vocab_seed,
        }


# --- bag of words -------------------------------------------------------------------------------

register_method(BowMethod("rootsift-bow"))
register_method(BowMethod("rootsift-bow-sv", spatial=True))
register_method(BowMethod("rootsift-bow-sv-qe", spatial=True, qe="aqe"))
register_method(BowMethod("rootsift-bow-sa", assignment="soft"))
register_method(BowMethod("rootsift-bow-sa-sv", assignment="soft", spatial=True))
register_method(BowMethod("rootsift-bow-sa-sv-qe", assignment="soft", spatial=True, qe="aqe"))
register_method(BowMethod("sift-bow-sv", features=SiftConfig(descriptor="sift"), spatial=True))

DEFAULT_METHOD = "rootsift-bow-sv-qe"

# --- global descriptors --------------------------------------------------------------------------

# VLAD over RootSIFT (64 words x 128 = 8,192 dimensions), as a framework-free global descriptor.
register_method(GlobalMethod("rootsift-vlad"))
register_method(GlobalMethod("rootsift-vlad-w", whitening="pca"))
register_method(GlobalMethod("rootsift-vlad-w-aqe", whitening="pca", qe="aqe"))
register_method(GlobalMethod("rootsift-vlad-w-alpha-qe", whitening="pca", qe="alpha-qe"))

# --- deep global descriptors (descriptor="cnn"; needs oxbench[deep]) -------------------------------
# Multi-scale (1, 1/sqrt(2), 1/2) at 1024 px, as the published GeM models are evaluated. "+w" is the
# PCA-whitening learned on the training set (the other city), or for gem-r101 the learned whitening
# that came with the published model; "+aqe" / "+alpha-qe" re-rank by query expansion.

# The published ResNet-101 GeM (Radenovic et al. 2018, cirtorch retrievalSfM120k-resnet101-gem): the
# user supplies the weights, converted once with `oxbench import-checkpoint CHECKPOINT --out MODEL.pt`,
# and runs `oxbench run --dataset roxford5k --method gem-r101+w --set weights=MODEL.pt`.


def _cnn(name: str, backbone: str, pooling: str, weights: str | None, **more: Any) -> GlobalMethod:
    return register_method(
        GlobalMethod(name, descriptor="cnn", backbone=backbone, pooling=pooling, weights=weights, **more)  # type: ignore[arg-type]
    )  # type: ignore[return-value]


_cnn("gem-r101", "resnet101", "gem", None)
_cnn("gem-r101+w", "resnet101", "gem", None, model_whitening=True)
_cnn("gem-r101+w+alpha-qe", "resnet101", "gem", None, model_whitening=True, qe="alpha-qe")

# Off-the-shelf ImageNet trunks (torchvision's weights, from its cache) with each pooling head.
_cnn("gem-r50-imagenet", "resnet50", "gem", "imagenet")
_cnn("gem-r50-imagenet+w", "resnet50", "gem", "imagenet", whitening="pca")
_cnn("gem-r50-imagenet+w+aqe", "resnet50", "gem", "imagenet", whitening="pca", qe="aqe")
_cnn("gem-r50-imagenet+w+alpha-qe", "resnet50", "gem", "imagenet", whitening="pca", qe="alpha-qe")
_cnn("mac-r50-imagenet", "resnet50", "mac", "imagenet")
_cnn("spoc-r50-imagenet", "resnet50", "spoc", "imagenet")
_cnn("rmac-r50-imagenet", "resnet50", "rmac", "imagenet")
_cnn("rmac-r50-imagenet+w", "resnet50", "rmac", "imagenet", whitening="pca")

# ResNet-18 GeM trained from scratch on the synthetic training city by `oxbench train`, which writes
# <data root>/_models/gem-r18-synthetic.pt ($OXBENCH_MODELS overrides the folder). Described at the
# size it was trained at (128 px, one scale: a network trained from scratch on small images has not
# learned the features of large ones). "+lw": the learned whitening stored in the model file.
_R18 = "models:gem-r18-synthetic.pt"
_R18_SIZE: dict[str, Any] = {"max_side": 128, "scales": (1.0,)}
_cnn("gem-r18-synthetic", "resnet18", "gem", _R18, **_R18_SIZE)
_cnn("gem-r18-synthetic+w", "resnet18", "gem", _R18, whitening="pca", **_R18_SIZE)
_cnn("gem-r18-synthetic+lw", "resnet18", "gem", _R18, model_whitening=True, **_R18_SIZE)
_cnn("gem-r18-synthetic+w+alpha-qe", "resnet18", "gem", _R18, whitening="pca", qe="alpha-qe", **_R18_SIZE)

# --- your own descriptors ------------------------------------------------------------------------

# The user's database / query descriptor files (--set db_features=PATH --set query_features=PATH),
# through the same whitening, search, QE, DBA and diffusion (oxbench.pipelines.featurefiles).
register_method(GlobalMethod("features", descriptor="features"))
register_method(GlobalMethod("features-aqe", descriptor="features", qe="aqe"))
register_method(GlobalMethod("features-alpha-qe", descriptor="features", qe="alpha-qe"))
register_method(GlobalMethod("features-dba", descriptor="features", dba=5))
register_method(GlobalMethod("features-diffusion", descriptor="features", rerank="diffusion"))
register_method(GlobalMethod("features-ivfpq", descriptor="features", search="faiss-ivfpq"))
