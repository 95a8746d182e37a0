"""The compressed inverted file answers exactly as the sparse one: the variable-byte code against a
byte-by-byte reference, scores and rankings identical, memory-mapped from disk, smaller."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.index.compressed import CompressedInvertedFile, varbyte_decode, varbyte_encode
from oxbench.index.inverted import InvertedFile, bow_matrix


def reference_encode(values: list[int]) -> list[int]:
    """Variable-byte code written from its definition, one value and one byte at a time."""
    out = []
    for v in values:
        while True:
            low, v = v & 0x7F, v >> 7
            out.append(low | (0x80 if v else 0))
            if not v:
                break
    return out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**40), max_size=50))
def test_varbyte_matches_the_reference_and_round_trips(values: list[int]) -> None:
    code = varbyte_encode(np.array(values, np.int64))
    assert code.tolist() == reference_encode(values)
    assert varbyte_decode(code).tolist() == values


def test_varbyte_known_answers_and_a_truncated_code() -> None:
    assert varbyte_encode(np.array([0, 127, 128, 16384])).tolist() == [0, 127, 128, 1, 128, 128, 1]
    with pytest.raises(InputError, match="ends inside a value"):
        varbyte_decode(np.array([5, 172], np.uint8))


def _random_index(seed: int, n_images: int, n_words: int, per_image: int) -> tuple[InvertedFile, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    words = [rng.zipf(1.3, rng.integers(0, per_image + 1)) % n_words for _ in range(n_images)]
    ivf = InvertedFile(n_words).fit(bow_matrix(words, n_words))
    queries = bow_matrix([rng.zipf(1.3, per_image) % n_words for _ in range(7)], n_words)
    return ivf, ivf.transform(queries)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_images=st.integers(1, 400), n_words=st.integers(1, 300))
def test_scores_and_ranks_are_identical_to_the_sparse_inverted_file(seed: int, n_images: int, n_words: int) -> None:
    ivf, q = _random_index(seed, n_images, n_words, 40)
    cif = CompressedInvertedFile.from_postings(ivf.postings_)
    np.testing.assert_array_equal(cif.scores_of_vectors(q), ivf.scores_of_vectors(q))
    np.testing.assert_array_equal(cif.search(q), ranks_of(ivf, q))
    for w in range(n_words):  # every list decodes to the sparse row: ids ascending, same weights
        ids, wts = cif.postings(w)
        row = ivf.postings_[w]
        np.testing.assert_array_equal(ids, np.sort(row.indices))
        np.testing.assert_array_equal(wts, row.toarray()[0, ids])


def ranks_of(ivf: InvertedFile, q: sp.csr_matrix) -> np.ndarray:
    from oxbench.evaluation.ranking import ranks_from_scores

    return ranks_from_scores(ivf.scores_of_vectors(q).T)


def test_memory_mapped_from_disk_and_smaller_than_the_two_sparse_copies(tmp_path: Path) -> None:
    ivf, q = _random_index(3, 20_000, 4096, 300)
    cif = CompressedInvertedFile.from_postings(ivf.postings_)
    cif.save(tmp_path / "ivf")
    mapped = CompressedInvertedFile.load(tmp_path / "ivf")
    assert isinstance(mapped.codes, np.memmap) and isinstance(mapped.weights, np.memmap)
    np.testing.assert_array_equal(mapped.scores_of_vectors(q), ivf.scores_of_vectors(q))
    sparse_bytes = sum(a.nbytes for m in (ivf.postings_, ivf.db_vectors_) for a in (m.data, m.indices, m.indptr))
    nnz = ivf.postings_.nnz
    # the ids: under 2 bytes a posting at this density (gaps of ~20000 / df), against 4 per copy
    assert mapped.codes.nbytes < 2 * nnz and mapped.nbytes < sparse_bytes / 2
    (tmp_path / "ivf" / "meta.json").write_text('{"format": 99}')
    with pytest.raises(InputError, match="not a compressed inverted file"):
        CompressedInvertedFile.load(tmp_path / "ivf")
    (tmp_path / "ivf" / "codes.npy").unlink()
    with pytest.raises(InputError, match="unreadable compressed inverted file"):
        CompressedInvertedFile.load(tmp_path / "ivf")


def test_empty_lists_and_an_empty_index() -> None:
    post = sp.csr_matrix((3, 5), dtype=np.float32)
    cif = CompressedInvertedFile.from_postings(post)
    assert cif.postings(1)[0].size == 0 and cif.nbytes == 2 * 4 * 8
    assert cif.scores_of_vectors(sp.csr_matrix(np.ones((1, 3), np.float32))).tolist() == [[0.0] * 5]
    with pytest.raises(InputError, match="query vectors have 2 words, the index 3"):
        cif.scores_of_vectors(sp.csr_matrix(np.ones((1, 2), np.float32)))
