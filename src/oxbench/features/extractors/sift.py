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


for _descriptor, _about in (
    ("rootsift", "RootSIFT (Arandjelovic & Zisserman 2012) with OpenCV"),
    ("sift", "SIFT (Lowe 2004) with OpenCV"),
):
    register_local_extractor(
        ExtractorEntry(
            _descriptor,
            _about,
            SIFT_KIND,
            lambda _argument, d=_descriptor: SiftConfig(descriptor=d),
            _from_dict,
        )
    )
