"""SIFT and RootSIFT with OpenCV, by name: ``rootsift`` and ``sift``
(:class:`oxbench.features.sift.SiftConfig`, its defaults; ``features.max_side`` ... change them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oxbench.features.extractors import ExtractorEntry, register_local_extractor
from oxbench.features.sift import SIFT_KIND, SiftConfig


def _from_dict(settings: Mapping[str, Any]) -> SiftConfig:
    """``SiftConfig.to_dict()`` back to the config (``kind`` and the derived ``dim`` dropped)."""
    return SiftConfig(**{k: v for k, v in settings.items() if k not in ("kind", "dim")})


def _rootsift(argument: str) -> SiftConfig:
    return SiftConfig(descriptor="rootsift")


def _sift(argument: str) -> SiftConfig:
    return SiftConfig(descriptor="sift")


register_local_extractor(
    ExtractorEntry(
        "rootsift",
        "RootSIFT (Arandjelovic & Zisserman 2012) with OpenCV",
        SIFT_KIND,
        _rootsift,
        _from_dict,
    )
)
register_local_extractor(
    ExtractorEntry("sift", "SIFT (Lowe 2004) with OpenCV", SIFT_KIND, _sift, _from_dict)
)
