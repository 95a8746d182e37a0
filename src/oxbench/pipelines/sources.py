"""Named sources: the representation a stage needs when the family's first stage has another one.

The hybrid rows of the field combine two representations of the same images:

- a **global short list verified with local features** (GeM + SV): the global family ranks by its
  vectors, and the ``spatial`` stage verifies the short list with the local features of a named
  extractor (``--set local_source=rootsift``) -- :class:`LocalSource`: the extractor's feature
  stores of every part, and verification by descriptor matching (mutual nearest neighbours with
  Lowe's ratio; no vocabulary is needed);
- **local verification, then diffusion over global descriptors** (the 2018 revisit's best rows:
  "HesAff-rSIFT-ASMK* + SP -> R-GeM + DFS"): bag of words or ASMK ranks and verifies, and the
  ``diffusion-verified`` stage diffuses over the database graph of a named global method's vectors
  (``--set global_source=gem-r50-imagenet``), seeded by the query's nearest images in that space
  and by the images the verification accepted -- :class:`GlobalSource`: that method fitted on the
  run's training set, its whitened database and query vectors.

A source adds to a family's :class:`~oxbench.pipelines.rerankers.RerankSpace` what the family
lacks (``local`` or ``dense``); a stage whose needs neither the family nor its sources offer is
refused in one line when the config is made (:func:`offered`). Each source caches its work
through the same steps as the families (feature stores, descriptor stores), so a source is
computed once per dataset and reused by every pipeline that names it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError
from oxbench.pipelines.method import RunContext
from oxbench.pipelines.presets import resolve_method
from oxbench.pipelines.steps.keys import dataset_key, part_names, parts_of
from oxbench.pipelines.steps.local import open_store, step_features
from oxbench.pipelines.steps.verify import (
    ShortListVerifier,
    VerifiedList,
    verify_ranked,
)
from oxbench.pipelines.steps.words import store_spec
from oxbench.refinement.spatial import Verification

if TYPE_CHECKING:  # pragma: no cover
    from oxbench.datasets.base import Benchmark
    from oxbench.features.local import LocalExtractor


def check_sources(config: Any) -> None:
    """Refuse, before any data is loaded, a ``global_source`` that names no global preset without
    stages (one line)."""
    name = getattr(config, "global_source", None)
    if name is not None:
        GlobalSource(name)


class LocalSource:
    """Local features of a named extractor for a family that has none, and short-list verification.

    Args:
        extractor: the local feature (``rootsift``, ``h5:PATH`` ...).
    """

    def __init__(self, extractor: LocalExtractor) -> None:
        self.extractor = extractor
        self._stores: dict[str, Any] = {}
        self._names: dict[str, list[str]] = {}
        self._key: str | None = None
        self.facts: dict[str, Any] = {}

    def prepare(self, bench: Benchmark, ctx: RunContext) -> dict[str, Any]:
        """Describe every part of ``bench`` (cached, resumable); the facts to record."""
        with ctx.timed("local_source"):
            done = step_features(bench, self.extractor, ctx)
        for part, res in done.items():
            ctx.record_step(f"local_source_{part}", hit=res.hit)
        self._stores = {p: open_store(ctx.cache, bench, self.extractor, p) for p in done}
        self._names = {p: part_names(bench, p) for p in done}
        self._key = dataset_key(bench)
        self.facts = {"local_source": self.extractor.to_dict()}
        return self.facts

    @property
    def index_parts(self) -> list[tuple[str, str]]:
        """``(part, image name)`` of every index position: the database, then the distractors."""
        return [
            (p, n) for p in ("database", "distractors") if p in self._names for n in self._names[p]
        ]

    def verify(
        self,
        ranks: NDArray[np.int64],
        r: int,
        ctx: RunContext,
        settings: Verification,
        *,
        rows: dict[int, NDArray[np.int64]] | None = None,
        stage: str = "spatial",
        query_part: str = "queries",
    ) -> list[VerifiedList]:
        """Spatially verify each query's top ``r`` (or the lists in ``rows``) as ``settings`` say;
        matching is by descriptors, whatever ``settings.matching`` says, since the source has no
        vocabulary."""
        if self._key is None:
            raise InputError("local source: prepare it for the benchmark before verifying")
        job = ShortListVerifier(
            stores={p: store_spec(s) for p, s in self._stores.items()},
            words={},
            index_parts=self.index_parts,
            settings=dataclasses.replace(settings, matching="descriptors"),
            query_part=query_part,
            store_digests={p: s.content_digest() for p, s in self._stores.items()},
        )
        return verify_ranked(job, self._names[query_part], ranks, r, ctx, rows=rows, stage=stage)


class GlobalSource:
    """The whitened, L2-normalised vectors of a named global method, for a family without them.

    Args:
        method: a global-descriptor preset by name, with settings of its own after it
            (``"gem-r101+w descriptor.weights=models/gem-r101.pt"``), or its config.
    """

    def __init__(self, method: Any) -> None:
        overrides: dict[str, object] = {}
        if isinstance(method, str):
            method, *pairs = method.split()
            for pair in pairs:
                key, sep, value = pair.partition("=")
                if not sep or not key:
                    raise InputError(
                        f"global_source: {pair!r} is not KEY=VALUE (e.g. "
                        f"'gem-r101+w descriptor.weights=MODEL.pt')"
                    )
                overrides[key] = value
        config: Any = resolve_method(method, **overrides)
        if getattr(config, "family", None) != "global":
            raise InputError(
                f"global_source {getattr(config, 'name', method)!r} is not a global-descriptor "
                f"method (family {getattr(config, 'family', '?')})"
            )
        if getattr(config, "rerank", ()):
            raise InputError(
                f"global_source {config.name!r} has stages of its own ({', '.join(config.rerank)}); "
                "name a preset without them: the source gives vectors, the pipeline its stages"
            )
        self.config = config
        self.database: NDArray[np.float32] | None = None
        self.queries: NDArray[np.float32] | None = None

    def prepare(self, train: Benchmark | None, bench: Benchmark, ctx: RunContext) -> dict[str, Any]:
        """Fit the method on ``train`` (a whitening, a codebook) and describe ``bench``."""
        method: Any = self.config.build()
        with ctx.timed("global_source"):
            method.fit(train if self.config.needs_training else None, ctx)
            parts = parts_of(bench, queries=False)
            raw = [method.describe(bench, p, ctx) for p in parts]
            self.database = method.finish(np.concatenate(raw) if len(raw) > 1 else raw[0])
            self.queries = method.finish(method.describe(bench, "queries", ctx))
        return {"global_source": {"method": self.config.name, "dim": int(self.database.shape[1])}}
