"""Settings shared by every family that quantises local features and verifies short lists.

:class:`LocalQuantisation` is a settings mixin (keyword-only fields) that a family's config
inherits beside :class:`~oxbench.pipelines.method.MethodConfig`: the local features, the vocabulary
(``vocab_*``) and the spatial verification of the short list (``spatial_*``), with the steps they
configure (:meth:`~LocalQuantisation.vocabulary`, :meth:`~LocalQuantisation.verification`). The
verification defaults are :mod:`oxbench.rerank.spatial`'s, stated there once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from oxbench.errors import InputError
from oxbench.features.local import LocalExtractor
from oxbench.features.sift import SiftConfig
from oxbench.pipelines.steps.verify import VerifySettings
from oxbench.pipelines.steps.vocabulary import VocabularySpec

#: The verification defaults (:mod:`oxbench.rerank.spatial`'s, through :class:`VerifySettings`).
_VERIFY = VerifySettings()

#: Features of the classic presets: RootSIFT at up to 1024 px, at most 4,000 per image (the published
#: systems used thousands per image at full resolution; bench/README.md compares smaller settings).
CLASSIC_FEATURES = SiftConfig(max_side=1024, n_features=4000)


@dataclass(frozen=True, kw_only=True)
class LocalQuantisation:
    """Local features, their vocabulary, and short-list verification.

    Attributes:
        features: local-feature extraction settings (any
            :class:`~oxbench.features.local.LocalExtractor`; RootSIFT by default).
        vocab_size: number of visual words.
        vocab_structure: ``auto`` / ``flat`` / ``two-level`` (see :class:`~oxbench.index.vocabulary.Vocabulary`).
        vocab_iter: k-means iterations.
        vocab_max_points_per_centroid: training-sample limit (descriptors per word).
        vocab_n_probe: coarse cells searched in two-level assignment.
        vocab_seed: seed of sampling and k-means.
        spatial: spatially re-rank the top ``spatial_top_r``.
        spatial_matching: tentative correspondences of a short-listed pair: ``descriptors``
            (mutual nearest neighbours with Lowe's ``spatial_ratio``,
            :func:`oxbench.rerank.spatial.descriptor_matches`) or ``words`` (shared visual words,
            at most ``spatial_max_per_word`` pairs per word, each query feature through its
            ``spatial_query_ma`` nearest words).
        spatial_model, spatial_method, spatial_min_inliers, spatial_threshold_px: verification
            settings (:func:`oxbench.rerank.spatial.spatial_rerank`, whose defaults they are);
            ``fsm`` is Philbin et al.'s fast spatial matching from single correspondences with
            scale and orientation.
    """

    features: LocalExtractor = field(default_factory=lambda: CLASSIC_FEATURES)
    vocab_size: int = 65536
    vocab_structure: Literal["auto", "flat", "two-level"] = "auto"
    vocab_iter: int = 10
    vocab_max_points_per_centroid: int = 32
    vocab_n_probe: int = 4
    vocab_seed: int = 0
    spatial: bool = False
    spatial_top_r: int = 100
    spatial_matching: Literal["words", "descriptors"] = "descriptors"
    spatial_ratio: float = _VERIFY.ratio
    spatial_max_per_word: int = _VERIFY.max_per_word
    spatial_query_ma: int = _VERIFY.query_ma
    spatial_model: Literal["affine", "homography", "similarity"] = _VERIFY.model
    spatial_method: Literal["magsac", "accurate", "ransac", "fsm"] = _VERIFY.method
    spatial_min_inliers: int = _VERIFY.min_inliers
    spatial_threshold_px: float = _VERIFY.threshold_px

    def check_local_settings(self, name: str) -> None:
        """Refuse settings that cannot work (one line naming the method)."""
        if not isinstance(self.features, LocalExtractor):
            raise InputError(f"method {name}: features must be a local-feature extractor config")
        if self.vocab_size < 2:
            raise InputError(f"method {name}: vocab_size must be >= 2")
        if self.spatial_top_r < 1:
            raise InputError(f"method {name}: spatial_top_r (the short list) must be >= 1")
        if self.spatial_matching not in ("words", "descriptors"):
            raise InputError(f"method {name}: unknown spatial_matching {self.spatial_matching!r}")
        if not 0 < self.spatial_ratio <= 1:
            raise InputError(f"method {name}: spatial_ratio must be in (0, 1]")
        if self.spatial_query_ma < 1 or self.spatial_max_per_word < 1:
            raise InputError(f"method {name}: spatial_query_ma and spatial_max_per_word must be >= 1")

    def vocabulary(self) -> VocabularySpec:
        """The vocabulary the method trains (on its features, with its ``vocab_*`` settings)."""
        return VocabularySpec(
            self.features, self.vocab_size, self.vocab_structure, self.vocab_iter,
            self.vocab_max_points_per_centroid, self.vocab_n_probe, self.vocab_seed,
        )  # fmt: skip

    @property
    def resolved_vocab_structure(self) -> Literal["flat", "two-level"]:
        """``flat`` or ``two-level``: what ``vocab_structure="auto"`` means at this size."""
        return self.vocabulary().resolved_structure

    def verification(self) -> VerifySettings:
        """How the short list is verified."""
        return VerifySettings(
            self.spatial_model, self.spatial_method, self.spatial_min_inliers, self.spatial_threshold_px,
            self.spatial_max_per_word, self.spatial_matching, self.spatial_ratio, self.spatial_query_ma,
        )  # fmt: skip
