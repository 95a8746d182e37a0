"""Named methods of the classic pipeline, as data.

Each preset is a :class:`BowMethod`: every setting that changes the result, nothing executable. The
method registry maps names (``rootsift-bow``, ``rootsift-bow-sv``, ``rootsift-bow-sv-qe`` and the
soft-assignment variants ``...-sa...``) to these entries; :func:`resolve_method` applies overrides
(``--vocab-size``) and returns the frozen config a run records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from oxbench.errors import InputError
from oxbench.features.sift import SiftConfig
from oxbench.registry import Registry


@dataclass(frozen=True)
class BowMethod:
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

    def to_dict(self) -> dict[str, object]:
        """All settings as JSON-able data (features nested)."""
        d = asdict(self)
        d["features"] = self.features.to_dict()
        return d

    def digest(self) -> str:
        """Short stable hash of :meth:`to_dict`."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

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


METHODS: Registry[BowMethod] = Registry("method")


def _register(method: BowMethod) -> None:
    METHODS.register(method.name, method)


_register(BowMethod("rootsift-bow"))
_register(BowMethod("rootsift-bow-sv", spatial=True))
_register(BowMethod("rootsift-bow-sv-qe", spatial=True, qe="aqe"))
_register(BowMethod("rootsift-bow-sa", assignment="soft"))
_register(BowMethod("rootsift-bow-sa-sv", assignment="soft", spatial=True))
_register(BowMethod("rootsift-bow-sa-sv-qe", assignment="soft", spatial=True, qe="aqe"))
_register(BowMethod("sift-bow-sv", features=SiftConfig(descriptor="sift"), spatial=True))

DEFAULT_METHOD = "rootsift-bow-sv-qe"


def resolve_method(name: str, **overrides: object) -> BowMethod:
    """The preset ``name`` with ``overrides`` applied (``None`` values ignored).

    ``features.<field>`` keys override the extraction settings (``features.max_side=1024``).

    Raises:
        InputError: unknown preset or setting.
    """
    method = METHODS.get(name)
    # field name -> the caller's untyped value (from the CLI); __post_init__ checks the key ones
    top: dict[str, Any] = {}
    feat: dict[str, Any] = {}
    valid = {f.name for f in dataclasses.fields(BowMethod)}
    valid_feat = {f.name for f in dataclasses.fields(SiftConfig)}
    for key, value in overrides.items():
        if value is None:
            continue
        if key.startswith("features."):
            sub = key.split(".", 1)[1]
            if sub not in valid_feat:
                raise InputError(f"unknown feature setting {sub!r}")
            feat[sub] = value
        elif key in valid and key not in ("name", "features"):
            top[key] = value
        else:
            raise InputError(f"unknown method setting {key!r}")
    if feat:
        top["features"] = dataclasses.replace(method.features, **feat)
    return dataclasses.replace(method, **top) if top else method
