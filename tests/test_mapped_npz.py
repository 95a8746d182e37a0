"""Cache ``.npz`` files written in pieces and memory-mapped on read: the same bytes and digest as the
whole-array writer, damage refused in one line, and a file another process checked opened without
hashing it again only while it is still that file.

Why: at a million images the visual words are gigabytes. The driver assembles them from shards
without holding them whole, and every process (the driver, each verification worker) maps them
instead of reading them into RAM.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import oxbench.cache as cache
from oxbench.cache import (
    DIGEST_KEY,
    CorruptCache,
    FileIdentity,
    load_npz,
    save_npz,
    save_npz_pieces,
)
from oxbench.pipelines.steps.words import Words


def _pieces(rng: np.random.Generator, rows: list[int], k: int, dtype: type) -> list[np.ndarray]:
    return [(rng.random((n, k)) * 1000).astype(dtype) for n in rows]


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_pieces_write_the_file_the_whole_arrays_write(
    tmp_path_factory: pytest.TempPathFactory, rows: list[int], k: int, seed: int
) -> None:
    d = tmp_path_factory.mktemp("pieces")
    rng = np.random.default_rng(seed)
    words, dists = _pieces(rng, rows, k, np.int32), _pieces(rng, rows, k, np.float32)
    small = {
        "names": np.array([f"im{i}" for i in range(len(rows))]),
        "tag": np.array("vocab"),
        "n": np.int64(7),
    }
    whole = save_npz(
        d / "whole.npz",
        {**small, "words": np.concatenate(words), "sq_dists": np.concatenate(dists)},
    )
    piecewise = save_npz_pieces(d / "pieces.npz", {**small, "words": words, "sq_dists": dists})
    a = load_npz(whole, what="t")
    b = load_npz(piecewise, what="t", mapped=("words", "sq_dists"))
    assert str(a[DIGEST_KEY]) == str(b[DIGEST_KEY])  # one digest for one content, whoever wrote it
    assert set(a) == set(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key
    if b["words"].size:
        assert isinstance(b["words"], np.memmap) and not b["words"].flags.writeable
    # and the whole-array file maps the same way
    c = load_npz(whole, what="t", mapped=("words", "names"))
    assert np.array_equal(c["words"], a["words"]) and list(c["names"]) == list(a["names"])


def test_pieces_that_do_not_stack_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="differ"):
        save_npz_pieces(
            tmp_path / "x.npz", {"w": [np.zeros((2, 3), np.int32), np.zeros((2, 4), np.int32)]}
        )
    with pytest.raises(ValueError, match="differ"):
        save_npz_pieces(
            tmp_path / "x.npz", {"w": [np.zeros((2, 3), np.int32), np.zeros((2, 3), np.int64)]}
        )
    with pytest.raises(ValueError, match="Python objects"):
        save_npz(tmp_path / "x.npz", {"o": np.array([{"a": 1}], dtype=object)})
    assert not list(tmp_path.iterdir())  # nothing half-written


def _words_file(path: Path, n_images: int = 3, k: int = 2) -> Path:
    counts = np.array([2, 0, 3][:n_images], np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    n = int(offsets[-1])
    return save_npz_pieces(
        path,
        {
            "names": np.array([f"im{i}" for i in range(n_images)]),
            "offsets": offsets,
            "words": np.arange(n * k, dtype=np.int32).reshape(n, k),
            "sq_dists": np.ones((n, k), np.float32),
            "vocabulary": np.array("v"),
        },
    )


def test_flipped_byte_in_a_mapped_member_fails_the_digest(tmp_path: Path) -> None:
    path = _words_file(tmp_path / "w.npz")
    words = Words.load(path)
    raw = bytearray(path.read_bytes())
    member = bytes(np.asarray(words.words).tobytes())
    at = raw.find(member)
    assert at > 0
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptCache, match="does not match its recorded digest"):
        Words.load(path)


def test_members_that_cannot_be_mapped_are_refused(tmp_path: Path) -> None:
    arrays = {"words": np.arange(12, dtype=np.int32).reshape(6, 2)}
    comp = tmp_path / "c.npz"
    np.savez_compressed(comp, **arrays, **{DIGEST_KEY: np.array(cache.arrays_digest(arrays))})
    with pytest.raises(CorruptCache, match="compressed"):
        load_npz(comp, what="t", mapped=("words",))
    assert load_npz(comp, what="t")["words"].shape == (6, 2)  # read whole it is fine
    with pytest.raises(CorruptCache, match="without 'absent'"):
        load_npz(comp, what="t", mapped=("absent",))
    trunc = tmp_path / "t.npz"
    save_npz(trunc, arrays)
    trunc.write_bytes(trunc.read_bytes()[:-200])
    with pytest.raises(CorruptCache):
        load_npz(trunc, what="t", mapped=("words",))
    fortran = tmp_path / "f.npz"
    f_arr = {"words": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))}
    np.savez(
        fortran, **f_arr, **{DIGEST_KEY: np.array(cache.arrays_digest(f_arr))}
    )  # save_npz writes C order
    with pytest.raises(CorruptCache, match="Fortran"):
        load_npz(fortran, what="t", mapped=("words",))


def test_offsets_that_do_not_partition_the_features_are_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    save_npz(
        path,
        {
            "names": np.array(["a", "b"]),
            "offsets": np.array([0, 3, 2]),
            "words": np.zeros((2, 1), np.int32),
            "sq_dists": np.zeros((2, 1), np.float32),
            "vocabulary": np.array("v"),
        },
    )
    with pytest.raises(CorruptCache, match="offsets do not partition"):
        Words.load(path)


def test_a_checked_file_is_trusted_only_while_it_is_the_same_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _words_file(tmp_path / "w.npz")
    checked = Words.load(path)  # what the driver does: a full check
    ident = checked.source
    assert isinstance(ident, FileIdentity) and ident.size == path.stat().st_size
    hashed: list[int] = []
    real = cache.arrays_digest

    def counting(arrays: object) -> str:
        hashed.append(1)
        return real(arrays)  # type: ignore[arg-type]

    monkeypatch.setattr(cache, "arrays_digest", counting)
    again = Words.load(path, trusted=ident)  # what a worker does
    assert not hashed and np.array_equal(again.words, checked.words)
    _words_file(path, n_images=2)  # replaced (a new file by rename): hashed again
    Words.load(path, trusted=ident)
    assert hashed
    hashed.clear()
    forged = FileIdentity(
        ident.inode, ident.size, ident.mtime_ns, "0" * 64
    )  # a digest the file does not record
    Words.load(path, trusted=forged)
    assert hashed


def test_a_words_file_is_mapped_not_read(tmp_path: Path) -> None:
    path = _words_file(tmp_path / "w.npz")
    w = Words.load(path)
    assert isinstance(w.words, np.memmap) and isinstance(w.sq_dists, np.memmap)
    assert not isinstance(w.offsets, np.memmap)  # small, and checked at once
    assert w.of("im2")[0].tolist() == [[4, 5], [6, 7], [8, 9]] and w.of("im1")[0].shape == (0, 2)
    with zipfile.ZipFile(path) as zf:
        assert all(i.compress_type == zipfile.ZIP_STORED for i in zf.infolist())
    assert os.stat(path).st_size > w.words.nbytes
