"""Settings shared by every family that quantises local features and verifies short lists.

:class:`LocalQuantisation` is a settings mixin (keyword-only fields) that a family's config
inherits beside :class:`~oxbench.pipelines.method.MethodConfig`: the local features, the vocabulary
(``vocab_*``), with the steps they configure (:meth:`~LocalQuantisation.vocabulary`,
:meth:`~LocalQuantisation.verification`). How short lists are verified is the ``spatial`` stage
settings group's (:class:`oxbench.pipelines.rerankers.spatial.SpatialSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from oxbench import schema as S
from oxbench.errors import InputError
from oxbench.features.extractors import LOCAL_FEATURES_SPEC
from oxbench.features.local import LocalExtractor
from oxbench.features.sift import SiftConfig
from oxbench.pipelines.steps.verify import VerifySettings
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
        vocab_size: number of visual words.
        vocab_structure: ``auto`` / ``flat`` / ``two-level`` (see :class:`~oxbench.index.vocabulary.Vocabulary`).
        vocab_iter: k-means iterations.
        vocab_max_points_per_centroid: training-sample limit (descriptors per word; ``None``: every
            training descriptor).
        vocab_n_probe: coarse cells searched in two-level assignment.
        vocab_seed: seed of sampling and k-means.
    """

    features: LocalExtractor = setting(
        spec=LOCAL_FEATURES_SPEC,
        default_factory=lambda: CLASSIC_FEATURES,
        doc="local features, built in or read from files (h5: hloc features.h5)",
    )
    vocab_size: int = setting(65536, S.Int(lo=2, hi=1 << 24), doc="visual words")
    vocab_structure: Literal["auto", "flat", "two-level"] = setting(
        "auto", S.Choice("auto", "flat", "two-level"), doc="flat k-means or a two-level vocabulary"
    )
    vocab_iter: int = setting(10, S.Int(lo=1, hi=1000), doc="k-means iterations")
    vocab_max_points_per_centroid: int | None = setting(
        32,
        S.Optional(S.Int(lo=1, hi=1 << 20)),
        doc="training descriptors per word (none: every one)",
    )
    vocab_n_probe: int = setting(
        4, S.Int(lo=1, hi=1 << 16), doc="coarse cells searched in two-level assignment"
    )
    vocab_seed: int = setting(0, S.Int(lo=0, hi=2**32 - 1), doc="seed of sampling and k-means")

    def check_local_settings(self, name: str) -> None:
        """Check every setting against its spec (one line naming it), and the features' kind."""
        validate(self)
        if not isinstance(self.features, LocalExtractor):
            raise InputError(f"method {name}: features must be a local-feature extractor config")

    def vocabulary(self) -> VocabularySpec:
        """The vocabulary the method trains (on its features, with its ``vocab_*`` settings)."""
        return VocabularySpec(
            self.features,
            self.vocab_size,
            self.vocab_structure,
            self.vocab_iter,
            self.vocab_max_points_per_centroid,
            self.vocab_n_probe,
            self.vocab_seed,
        )

    @property
    def resolved_vocab_structure(self) -> Literal["flat", "two-level"]:
        """``flat`` or ``two-level``: what ``vocab_structure="auto"`` means at this size."""
        return self.vocabulary().resolved_structure

    def verification(self) -> VerifySettings:
        """How the short list is verified: the pipeline's ``spatial`` stage settings (the family
        config is also a :class:`~oxbench.pipelines.rerankers.Pipeline`)."""
        return self.stage("spatial").verification()  # type: ignore[attr-defined,no-any-return]

    @property
    def verifies(self) -> bool:
        """Whether a stage of the pipeline reads the ``spatial`` settings (verifies short lists)."""
        return "spatial" in self.stage_groups  # type: ignore[attr-defined]
