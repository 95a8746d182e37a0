"""The measured footprint a quantising family shares: words in RAM, feature stores and words on disk.

A family over local features and a vocabulary (bag of words, ASMK) holds, besides its own index,
the visual words of every indexed image in RAM (``int32`` words and ``float32`` distances, read
from the words files) and keeps on disk the feature stores of the database and distractors (what
spatial verification reads) and their words files; the vocabulary is a fixed cost.
:func:`local_footprint` measures those parts; a family adds its own index structures.
"""

from __future__ import annotations

from pathlib import Path

from oxbench.index.footprint import Footprint, array_bytes, disk_bytes
from oxbench.index.vocabulary import Vocabulary
from oxbench.pipelines.steps.words import WordedParts

#: The parts of a benchmark that an index holds (the queries are not part of it).
INDEX_PARTS = ("database", "distractors")


def local_footprint(
    parts: WordedParts, vocab_path: Path | None, *, ram: dict[str, int], fixed_ram: dict[str, int] | None = None
) -> Footprint:
    """The footprint of an index over ``parts``'s database and distractors.

    Args:
        parts: the benchmark's features and words (after ``index_parts``).
        vocab_path: the vocabulary file (a fixed disk cost).
        ram: the family's own index structures, ``{name: bytes}``.
        fixed_ram: the family's own fixed structures.

    Returns:
        ``ram`` plus the words in RAM; on disk the feature stores and words files of the index
        parts; the vocabulary's centroids (RAM) and file (disk) as fixed costs.
    """
    indexed = [p for p in INDEX_PARTS if p in parts.names]
    words = {p: parts.words[p] for p in indexed if p in parts.words}
    words_ram = sum(array_bytes([w.offsets, w.words, w.sq_dists]) for w in words.values())
    disk = {
        "features": sum(disk_bytes(parts.stores[p].directory) for p in indexed if p in parts.stores),
        "words": sum(disk_bytes(parts.words_paths[p]) for p in indexed if p in parts.words_paths),
    }
    return Footprint(
        len(parts.index_parts), ram={**ram, "words": words_ram}, disk=disk,
        fixed_ram={"vocabulary": vocabulary_bytes(parts.vocabulary), **(fixed_ram or {})},
        fixed_disk={"vocabulary": disk_bytes(vocab_path) if vocab_path is not None else 0},
    )  # fmt: skip


def vocabulary_bytes(voc: Vocabulary) -> int:
    """RAM of a vocabulary's arrays (centroids, and a two-level vocabulary's coarse level)."""
    return array_bytes([voc.centroids_, voc.coarse_, voc.cell_offsets_])


def local_ram_per_image(n_features: int, words_per_feature: int, index_bytes_per_feature: float) -> int:
    """An upper bound of a quantising index's RAM per image from its settings: every image with
    ``n_features`` features (the extractor's cap), each holding ``words_per_feature`` words and
    distances (8 bytes each) and ``index_bytes_per_feature`` bytes of the family's own index."""
    return int(n_features * (8 * words_per_feature + index_bytes_per_feature))
