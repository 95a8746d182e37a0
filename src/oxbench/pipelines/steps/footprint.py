"""The measured footprint a quantising family shares: words files and feature stores on disk.

A family over local features and a vocabulary (bag of words, ASMK) keeps, besides its own index,
the visual words of every indexed image (``int32`` words and ``float32`` distances) in words files
that it memory-maps (:class:`~oxbench.pipelines.steps.words.Words`: only the per-image offsets are
held in RAM; verification reads the pages of its short lists) and the feature stores of the
database and distractors (what spatial verification reads); the vocabulary is a fixed cost.
:func:`local_footprint` measures those parts; a family adds its own index structures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from oxbench.index.footprint import Footprint, array_bytes, disk_bytes
from oxbench.index.vocabulary import Vocabulary
from oxbench.pipelines.steps.words import WordedParts

#: The parts of a benchmark that an index holds (the queries are not part of it).
INDEX_PARTS = ("database", "distractors")


def local_footprint(
    parts: WordedParts,
    vocab_path: Path | None,
    *,
    ram: dict[str, int],
    fixed_ram: dict[str, int] | None = None,
) -> Footprint:
    """The footprint of an index over ``parts``'s database and distractors.

    Args:
        parts: the benchmark's features and words (after ``index_parts``).
        vocab_path: the vocabulary file (a fixed disk cost).
        ram: the family's own index structures, ``{name: bytes}``.
        fixed_ram: the family's own fixed structures.

    Returns:
        ``ram`` plus the words held in RAM (their offsets; the words and distances too where
        they are not memory-mapped); on disk the feature stores and words files of the index
        parts; the vocabulary's centroids (RAM) and file (disk) as fixed costs.
    """
    indexed = [p for p in INDEX_PARTS if p in parts.names]
    words = {p: parts.words[p] for p in indexed if p in parts.words}
    words_ram = sum(
        array_bytes([a for a in (w.offsets, w.words, w.sq_dists) if not isinstance(a, np.memmap)])
        for w in words.values()
    )
    disk = {
        # only the indexed images' share: a distractor store also holds a larger run's images
        "features": sum(
            parts.stores[p].disk_bytes_of(parts.names[p]) for p in indexed if p in parts.stores
        ),
        "words": sum(disk_bytes(parts.words_paths[p]) for p in indexed if p in parts.words_paths),
    }
    return Footprint(
        len(parts.index_parts),
        ram={**ram, "words": words_ram},
        disk=disk,
        fixed_ram={"vocabulary": vocabulary_bytes(parts.vocabulary), **(fixed_ram or {})},
        fixed_disk={"vocabulary": disk_bytes(vocab_path) if vocab_path is not None else 0},
    )


def vocabulary_bytes(voc: Vocabulary) -> int:
    """RAM of a vocabulary's arrays (centroids, and a two-level vocabulary's coarse level)."""
    return array_bytes([voc.centroids_, voc.coarse_, voc.cell_offsets_])


def local_ram_per_image(n_features: int, index_bytes_per_feature: float) -> int:
    """An upper bound of a quantising index's RAM per image from its settings: every image with
    ``n_features`` features (the extractor's cap), each holding ``index_bytes_per_feature`` bytes of
    the family's own index, plus the image's words offset (the words are memory-mapped)."""
    return int(n_features * index_bytes_per_feature) + 8
