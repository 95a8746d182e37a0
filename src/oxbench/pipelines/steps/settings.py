"""Settings shared by every family that quantises local features and verifies short lists.

:class:`LocalQuantisation` is a settings mixin (keyword-only fields) that a family's config
inherits beside :class:`~oxbench.pipelines.method.MethodConfig`: the local features, the vocabulary
(``vocabulary.*``), with the step they configure (:meth:`~LocalQuantisation.vocabulary_spec`). How short
lists are verified is each verifying stage's own settings
(:class:`oxbench.pipelines.rerankers.spatial.SpatialSettings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from oxbench.errors import InputError
from oxbench.features.extractors import LOCAL_FEATURES_SPEC
from oxbench.features.local import LocalExtractor
from oxbench.features.sift import SiftConfig
from oxbench.index.vocabulary import VocabularySettings
from oxbench.pipelines.steps.vocabulary import VocabularySpec
from oxbench.schema import setting, validate

#: Features of the classic presets: RootSIFT at up to 1024 px, at most 4,000 per image (the published
#: systems used thousands per image at full resolution; bench/README.md compares smaller settings).
CLASSIC_FEATURES = SiftConfig(max_side=1024, n_features=4000)


@dataclass(frozen=True, kw_only=True)
class LocalQuantisation:
    """Local features and their vocabulary.

    Attributes:
        features: the local features (any :class:`~oxbench.features.local.LocalExtractor`;
            RootSIFT by default); from text a registered name (``rootsift``, ``sift``,
            ``h5:PATH``, ``npz:FOLDER``: :mod:`oxbench.features.extractors`), from a record its
            ``to_dict()``.
        vocabulary: how the visual vocabulary is learned
            (:class:`~oxbench.index.vocabulary.VocabularySettings`: ``vocabulary.size``,
            ``vocabulary.seed`` ...).
    """

    features: LocalExtractor = setting(
        spec=LOCAL_FEATURES_SPEC,
        default_factory=lambda: CLASSIC_FEATURES,
        doc="local features, built in or read from files (h5: hloc features.h5)",
    )
    vocabulary: VocabularySettings = field(default_factory=VocabularySettings)

    #: The command-line shorthands of a family over local features and a vocabulary.
    SHORTHANDS: ClassVar[Mapping[str, str]] = {
        "vocab_size": "vocabulary.size",
        "max_side": "features.max_side",
        "top_r": "spatial.top_r",
    }

    #: The vocabulary settings of earlier versions (a family adds its own to :attr:`renamed`).
    RENAMED_VOCABULARY: ClassVar[Mapping[str, str]] = {
        "vocab_size": "vocabulary.size",
        "vocab_structure": "vocabulary.structure",
        "vocab_iter": "vocabulary.iter",
        "vocab_max_points_per_centroid": "vocabulary.sample",
        "vocab_n_probe": "vocabulary.n_probe",
        "vocab_seed": "vocabulary.seed",
    }

    def check_local_settings(self, name: str) -> None:
        """Check every setting against its spec (one line naming it), and the features' kind."""
        validate(self)
        if not isinstance(self.features, LocalExtractor):
            raise InputError(f"method {name}: features must be a local-feature extractor config")

    def vocabulary_spec(self) -> VocabularySpec:
        """The vocabulary the method trains (on its features, with its ``vocabulary`` settings)."""
        v = self.vocabulary
        return VocabularySpec(
            self.features, v.size, v.structure, v.iter, v.sample, v.n_probe, v.seed
        )

    @property
    def resolved_vocab_structure(self) -> Literal["flat", "two-level"]:
        """``flat`` or ``two-level``: what ``vocabulary.structure=auto`` means at this size."""
        return self.vocabulary_spec().resolved_structure
