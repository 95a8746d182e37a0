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
    from oxbench.pipelines.asmk import Asmk
    from oxbench.pipelines.bow import BagOfWords

__all__ = ["DEFAULT_METHOD", "METHODS", "AsmkMethod", "BowMethod", "GlobalMethod", "resolve_method"]


#: Features of the classic presets: RootSIFT at up to 1024 px, at most 4,000 per image (the published
#: systems used thousands per image at full resolution; see bench/README.md for what 512 px and
#: 1,000 features lost on real photos).
CLASSIC_FEATURES = SiftConfig(max_side=1024, n_features=4000)


@dataclass(frozen=True)
class BowMethod(MethodConfig):
    """A RootSIFT bag-of-words method (Philbin et al. 2007/2008, Arandjelovic & Zisserman 2012).

    Attributes:
        name: preset name.
        features: local-feature extraction settings.
        vocab_size: number of visual words.
        vocab_structure: ``auto`` / ``flat`` / ``two-level`` (see :class:`~oxbench.index.vocabulary.Vocabulary`).
        vocab_iter: k-means iterations.
        vocab_max_points_per_centroid: training-sample limit (descriptors per word; ``None``: every
            training descriptor).
        vocab_n_probe: coarse cells searched in two-level assignment.
        vocab_seed: seed of sampling and k-means.
        assignment: ``hard`` or ``soft`` (k nearest words with Gaussian weights, both sides).
        soft_k, soft_sigma2: soft-assignment neighbours and ``sigma^2`` (unit-norm RootSIFT units;
            Philbin et al. 2008 used ``k = 3`` and ``sigma^2 = 6250`` for SIFT vectors of norm ~512,
            i.e. about 0.024 of the squared norm; 0.02 here).
        burst: ``sqrt`` (damp repeated words) or ``none``.
        idf: tf-idf weighting.
        spatial: spatially re-rank the top ``spatial_top_r``.
        spatial_matching: tentative correspondences of a short-listed pair: ``descriptors``
            (mutual nearest RootSIFT neighbours with Lowe's ``spatial_ratio``,
            :func:`oxbench.rerank.spatial.descriptor_matches`) or ``words`` (shared visual words,
            at most ``spatial_max_per_word`` pairs per word, each query feature through its
            ``spatial_query_ma`` nearest words).
        spatial_model, spatial_method, spatial_min_inliers, spatial_threshold_px: verification
            settings (:func:`oxbench.rerank.spatial.spatial_rerank`); ``fsm`` is Philbin et al.'s
            fast spatial matching from single correspondences with scale and orientation.
        qe: ``none`` or ``aqe`` (average query expansion over the spatially verified images).
        qe_max_verified: at most this many verified images are averaged.
        qe_min_inliers: only verified images with at least this many inliers expand the query
            (a stricter test than re-ranking's ``spatial_min_inliers``, as in Chum et al. 2007:
            averaging in a false positive drifts the query, while ranking it high costs one
            place; unrelated pairs reach 5-7 chance inliers, see :mod:`oxbench.rerank.spatial`).
        qe_verify_top: the expanded query's results are spatially verified too, as in Chum et
            al. 2007: the images of its top ``qe_verify_top`` that the first short list did not
            hold are verified against the query, and those that pass join the verified images
            (ordered by inliers) above the expanded query's order. 0 keeps the expanded query's
            order below the first verified images, unverified.
    """

    family: ClassVar[str] = "bow"

    name: str
    features: SiftConfig = field(default_factory=lambda: CLASSIC_FEATURES)
    vocab_size: int = 65536
    vocab_structure: Literal["auto", "flat", "two-level"] = "auto"
    vocab_iter: int = 10
    vocab_max_points_per_centroid: int | None = 32
    vocab_n_probe: int = 4
    vocab_seed: int = 0
    assignment: Literal["hard", "soft"] = "hard"
    soft_k: int = 3
    soft_sigma2: float = 0.02
    burst: Literal["none", "sqrt"] = "sqrt"
    idf: bool = True
    spatial: bool = False
    spatial_top_r: int = 100
    spatial_matching: Literal["words", "descriptors"] = "descriptors"
    spatial_ratio: float = 0.8
    spatial_max_per_word: int = 8
    spatial_query_ma: int = 1
    spatial_model: Literal["affine", "homography", "similarity"] = "similarity"
    spatial_method: Literal["magsac", "accurate", "ransac", "fsm"] = "fsm"
    spatial_min_inliers: int = 4
    spatial_threshold_px: float = 8.0
    qe: Literal["none", "aqe"] = "none"
    qe_max_verified: int = 50
    qe_min_inliers: int = 8
    qe_verify_top: int = 100

    def __post_init__(self) -> None:
        if self.qe != "none" and not self.spatial:
            raise InputError(f"method {self.name}: query expansion needs spatial verification")
        if self.assignment not in ("hard", "soft"):
            raise InputError(f"method {self.name}: unknown assignment {self.assignment!r}")
        if self.vocab_size < 2:
            raise InputError(f"method {self.name}: vocab_size must be >= 2")
        from oxbench.index.vocabulary import check_sample_limit

        check_sample_limit(self.vocab_max_points_per_centroid, f"method {self.name}: vocab_max_points_per_centroid")
        if self.qe_verify_top < 0:
            raise InputError(f"method {self.name}: qe_verify_top must be >= 0")
        if self.spatial_top_r < 1:
            raise InputError(f"method {self.name}: spatial_top_r (the short list) must be >= 1")
        if self.spatial_matching not in ("words", "descriptors"):
            raise InputError(f"method {self.name}: unknown spatial_matching {self.spatial_matching!r}")
        if not 0 < self.spatial_ratio <= 1:
            raise InputError(f"method {self.name}: spatial_ratio must be in (0, 1]")
        if self.spatial_query_ma < 1 or self.spatial_max_per_word < 1:
            raise InputError(f"method {self.name}: spatial_query_ma and spatial_max_per_word must be >= 1")

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


@dataclass(frozen=True)
class AsmkMethod(BowMethod):
    """ASMK over RootSIFT (:mod:`oxbench.pipelines.asmk`); features, codebook (``vocab_*``) and
    spatial settings as :class:`BowMethod`.

    Attributes:
        asmk_alpha: exponent of the selectivity function.
        asmk_tau: its threshold on the normalised Hamming similarity (``-1 .. 1``).
        asmk_query_ma: words per query feature (multiple assignment; the database uses 1).
        asmk_idf: weight words by ``log(N / df)^2`` as the package does (HOW + ASMK: off).
        vocab_max_points_per_centroid: ``None`` (default): the codebook is trained on every
            training descriptor, as the ``asmk`` package trains it; a number: a seeded sample of
            that many per word (bag-of-words' default is 32).
    """

    family: ClassVar[str] = "asmk"

    asmk_alpha: float = 3.0
    asmk_tau: float = 0.0
    asmk_query_ma: int = 5
    asmk_idf: bool = False
    vocab_max_points_per_centroid: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.qe != "none":
            raise InputError(f"method {self.name}: ASMK has no query expansion here")
        if self.assignment != "hard":
            raise InputError(f"method {self.name}: ASMK uses asmk_query_ma, not soft assignment")
        if self.asmk_query_ma < 1 or not -1.0 <= self.asmk_tau < 1.0 or self.asmk_alpha <= 0:
            raise InputError(f"method {self.name}: asmk_query_ma >= 1, -1 <= asmk_tau < 1, asmk_alpha > 0")

    def build(self) -> Asmk:
        from oxbench.pipelines.asmk import Asmk

        return Asmk(self)


# --- bag of words -------------------------------------------------------------------------------

register_method(BowMethod("rootsift-bow"))
register_method(BowMethod("rootsift-bow-sv", spatial=True))
register_method(BowMethod("rootsift-bow-sv-qe", spatial=True, qe="aqe"))
register_method(BowMethod("rootsift-bow-sa", assignment="soft"))
register_method(BowMethod("rootsift-bow-sa-sv", assignment="soft", spatial=True))
register_method(BowMethod("rootsift-bow-sa-sv-qe", assignment="soft", spatial=True, qe="aqe"))
register_method(BowMethod("sift-bow-sv", features=SiftConfig(descriptor="sift", max_side=1024, n_features=4000),
                          spatial=True))

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
# size it was trained at (160 px, one scale: a network trained from scratch on small images has not
# learned the features of large ones). "+lw": the learned whitening stored in the model file.
_R18 = "models:gem-r18-synthetic.pt"
_R18_SIZE: dict[str, Any] = {"max_side": 160, "scales": (1.0,)}
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

# --- ASMK (aggregated selective match kernels) over RootSIFT -------------------------------------

register_method(AsmkMethod("rootsift-asmk"))
register_method(AsmkMethod("rootsift-asmk-sv", spatial=True))
