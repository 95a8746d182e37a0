"""The memory-mapped Hamming-embedding inverted file (issue 33): the scores of Jegou et al.'s
matching written pair by pair, the in-RAM :class:`HammingIndex`'s to the bit, whatever the chunks
and merge blocks; compiled and numpy paths equal; bad input and damaged files refused."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.cache import CorruptCache
from oxbench.errors import InputError
from oxbench.index import word_lists
from oxbench.index.hamming import HammingIndex, wgc_bins
from oxbench.index.he_file import POSTING_BYTES, HammingInvertedFile, HeEntries


def random_features(rng: np.random.Generator, n_images: int, n_words: int):
    """Per image: words (repeats allowed: bursts), signatures near a few centres (so some pairs
    match within a small threshold), orientations and log-scales (some images empty)."""
    centres = rng.integers(0, 2**64 - 1, 4, dtype=np.uint64, endpoint=True)
    out = []
    for _ in range(n_images):
        k = int(rng.integers(0, 7))
        words = rng.integers(0, n_words, k).astype(np.int64)
        flips = rng.integers(0, 2**64 - 1, k, dtype=np.uint64, endpoint=True)
        flips &= rng.integers(0, 2**64 - 1, k, dtype=np.uint64, endpoint=True)
        flips &= rng.integers(0, 2**64 - 1, k, dtype=np.uint64, endpoint=True)  # ~8 bits set
        sig = centres[rng.integers(0, 4, k)] ^ flips
        angles = rng.uniform(0, 360, k).astype(np.float32)
        scales = rng.uniform(-3, 3, k).astype(np.float32)
        out.append((words, sig, angles, scales))
    return out


def chunked(images, chunk: int) -> list[HeEntries]:
    chunks = []
    for a in range(0, len(images), chunk):
        part = images[a : a + chunk]
        owners = np.repeat(np.arange(len(part)), [len(f[0]) for f in part]).astype(np.int64)
        cols = [np.concatenate([f[j] for f in part]) for j in range(4)]
        chunks.append(HeEntries(len(part), owners, cols[0].astype(np.int64), *cols[1:]))
    return chunks


def in_ram(images, n_words: int, idf: bool) -> HammingIndex:
    owners = np.repeat(np.arange(len(images)), [len(f[0]) for f in images])
    cols = [np.concatenate([f[j] for f in images]) for j in range(4)]
    return HammingIndex(n_words, idf=idf).fit(
        cols[0].astype(np.int64), owners, cols[1], cols[2], cols[3], len(images)
    )


def pairwise_scores(images, query, *, ht, sigma, idf):
    """Jegou, Douze & Schmid's HE similarity written one image pair at a time (no geometry):
    every pair of features sharing a word within ``ht`` bits adds ``idf_w^2 exp(-h^2/sigma^2)``;
    the sum is divided by the tf-idf L2 norms of both images (``idf_w = log(N / df_w)``)."""
    n = len(images)
    df: dict[int, int] = {}
    for words, *_ in images:
        for w in set(words.tolist()):
            df[w] = df.get(w, 0) + 1
    weight = {w: (math.log(n / c) if idf else 1.0) for w, c in df.items()}

    def norm(words: np.ndarray) -> float:
        tf: dict[int, int] = {}
        for w in words.tolist():
            tf[w] = tf.get(w, 0) + 1
        return math.sqrt(sum((c * weight.get(w, 0.0 if idf else 1.0)) ** 2 for w, c in tf.items()))

    q_words, q_sig = query[0], query[1]
    q_norm = norm(q_words)
    out = np.zeros(n)
    for i, (words, sig, *_) in enumerate(images):
        total = 0.0
        for wq, sq in zip(q_words.tolist(), q_sig.tolist(), strict=True):
            for wx, sx in zip(words.tolist(), sig.tolist(), strict=True):
                h = bin(sq ^ sx).count("1")
                if wq == wx and h <= ht:
                    g = math.exp(-(h * h) / sigma**2) if sigma is not None else 1.0
                    total += weight[wx] ** 2 * g
        d = norm(words) * q_norm
        out[i] = total / d if d > 0 else 0.0
    return out


def a_query(rng: np.random.Generator, images, n_words: int):
    """Features near the database's: some copied from it (exact matches), some fresh."""
    pool = [f for f in images if len(f[0])]
    feats = random_features(rng, 3, n_words)
    if pool:
        src = pool[int(rng.integers(0, len(pool)))]
        k = int(rng.integers(1, len(src[0]) + 1))
        feats.append(tuple(a[:k] for a in src))
    return tuple(np.concatenate([f[j] for f in feats]) for j in range(4))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_images=st.integers(1, 25),
    n_words=st.integers(1, 9),
    chunk=st.integers(1, 7),
    ht=st.sampled_from([0, 8, 12, 24, 64]),
    sigma=st.sampled_from([None, 16.0, 4.0]),
    idf=st.booleans(),
)
def test_scores_equal_the_pairwise_formula_and_the_in_ram_index(
    tmp_path_factory, seed, n_images, n_words, chunk, ht, sigma, idf
):
    rng = np.random.default_rng(seed)
    images = random_features(rng, n_images, n_words)
    ivf = HammingInvertedFile.build(
        chunked(images, chunk), n_words, tmp_path_factory.mktemp("he"), idf=idf
    )
    ram = in_ram(images, n_words, idf)
    q = a_query(rng, images, n_words)
    got = ivf.scores(*q, ht=ht, sigma=sigma)
    want = pairwise_scores(images, q, ht=ht, sigma=sigma, idf=idf)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got, ram.scores(*q, ht=ht, sigma=sigma), rtol=1e-14, atol=0)
    for bins in ((8, 8, 4.0), (3, 5, 1.5)):
        kw = dict(ht=ht, sigma=sigma, wgc=True, angle_bins=bins[0], scale_bins=bins[1])
        np.testing.assert_allclose(
            ivf.scores(*q, **kw, scale_range=bins[2]),
            ram.scores(*q, **kw, scale_range=bins[2]),
            rtol=1e-14,
            atol=0,
        )
    np.testing.assert_array_equal(ivf.idf_, ram.idf_)
    np.testing.assert_allclose(ivf.norms_, ram.norms_, rtol=1e-15)


def test_wgc_keeps_the_matches_of_one_rotation_and_scale(tmp_path):
    """Known answer: three matches of one image, two agreeing on rotation and scale change and
    one that does not; with idf off and no Gaussian each counts 1, so WGC keeps 2 of 3."""
    sig = np.array([5, 5, 5], np.uint64)
    db = [(np.array([0, 1, 2]), sig, np.float32([10, 20, 200]), np.float32([0, 0, 2]))]
    ivf = HammingInvertedFile.build(chunked(db, 1), 3, tmp_path, idf=False)
    q = (np.array([0, 1, 2]), sig, np.float32([0, 10, 10]), np.float32([1, 1, 1]))
    plain = ivf.scores(*q, ht=0, sigma=None)
    wgc = ivf.scores(*q, ht=0, sigma=None, wgc=True)
    assert plain[0] == pytest.approx(3 / 3)  # 3 matches over norms sqrt(3) * sqrt(3)
    assert wgc[0] == pytest.approx(2 / 3)
    ab, sb = wgc_bins(np.array([10.0, 10, 190]), np.array([-1.0, -1, 1]), angle_bins=8,
                      scale_bins=8, scale_range=4.0)  # fmt: skip
    assert ab.tolist() == [0, 0, 4] and sb[0] == sb[1] != sb[2]


def test_chunks_and_merge_blocks_do_not_change_the_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    images = random_features(rng, 60, 11)
    HammingInvertedFile.build(chunked(images, 60), 11, tmp_path / "a")
    monkeypatch.setattr(word_lists, "MERGE_POSTINGS", 7)  # many merge blocks
    many = HammingInvertedFile.build(chunked(images, 4), 11, tmp_path / "b")
    for name in ("ids", "signatures", "angles", "log_scales", "offsets"):
        a = (tmp_path / "a" / f"{name}.npy").read_bytes()
        assert a == (tmp_path / "b" / f"{name}.npy").read_bytes(), name
    assert many.n_postings == sum(len(f[0]) for f in images)
    for w in range(11):  # each word's list in image order
        a, b = many.offsets_[w], many.offsets_[w + 1]
        assert (np.diff(many.images_[a:b].astype(np.int64)) >= 0).all()
    assert many.disk_bytes == POSTING_BYTES * many.n_postings + 8 * 12 + 8 * 11 + 8 * 60
    assert many.ram_bytes < many.disk_bytes


def test_compiled_and_numpy_paths_give_the_same_bits(tmp_path, monkeypatch):
    rng = np.random.default_rng(11)
    images = random_features(rng, 200, 5)
    ivf = HammingInvertedFile.build(chunked(images, 50), 5, tmp_path)
    for _ in range(5):
        q = a_query(rng, images, 5)
        monkeypatch.delenv("OXBENCH_NO_ACCEL", raising=False)
        compiled = ivf.scores(*q, ht=24, sigma=16.0)
        monkeypatch.setenv("OXBENCH_NO_ACCEL", "1")
        numpy = ivf.scores(*q, ht=24, sigma=16.0)
        assert np.array_equal(compiled.view(np.uint64), numpy.view(np.uint64))
        assert (compiled > 0).any()


def test_an_empty_query_and_an_empty_index_score_zero(tmp_path):
    ivf = HammingInvertedFile.build(
        [HeEntries(3, *(np.zeros(0, t) for t in (np.int64, np.int64, np.uint64)),
                   np.zeros(0, np.float32), np.zeros(0, np.float32))],
        4,
        tmp_path,
    )  # fmt: skip
    z = np.zeros(0)
    assert ivf.n_images == 3 and ivf.n_postings == 0
    assert not ivf.scores(z.astype(np.int64), z.astype(np.uint64), z, z, ht=24, sigma=16).any()
    one = (np.array([2]), np.array([7], np.uint64), np.zeros(1), np.zeros(1))
    assert not ivf.scores(*one, ht=24, sigma=16, wgc=True).any()


def good_entries(n: int = 2) -> dict[str, object]:
    return {
        "n_images": n,
        "owners": np.array([0, 1]),
        "words": np.array([1, 2]),
        "signatures": np.array([1, 2], np.uint64),
        "angles": np.zeros(2, np.float32),
        "log_scales": np.zeros(2, np.float32),
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"words": np.array([1, 9])}, "word outside"),
        ({"words": np.array([-1, 0])}, "word outside"),
        ({"owners": np.array([1, 0])}, "non-decreasing"),
        ({"owners": np.array([0, 2])}, "non-decreasing"),
        ({"angles": np.zeros(3, np.float32)}, "angles of shape"),
        ({"signatures": np.zeros((2, 1), np.uint64)}, "signatures of shape"),
    ],
)
def test_bad_entries_are_one_line_and_leave_no_file(tmp_path, change, message):
    def chunks():
        yield HeEntries(**good_entries())
        yield HeEntries(**{**good_entries(), **change})

    with pytest.raises(InputError, match=message):
        HammingInvertedFile.build(chunks(), 4, tmp_path)
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_bad_queries_are_one_line(tmp_path):
    ivf = HammingInvertedFile.build([HeEntries(**good_entries())], 4, tmp_path)
    ok = (np.array([1]), np.array([3], np.uint64), np.zeros(1), np.zeros(1))
    assert ivf.scores(*ok, ht=24, sigma=16.0).shape == (2,)
    with pytest.raises(InputError, match="outside 0..64"):
        ivf.scores(*ok, ht=65, sigma=16.0)
    with pytest.raises(InputError, match="0 .. 3"):
        ivf.scores(np.array([4]), *ok[1:], ht=24, sigma=16.0)
    with pytest.raises(InputError, match="angles of shape"):
        ivf.scores(ok[0], ok[1], np.zeros(2), ok[3], ht=24, sigma=16.0)


def test_a_damaged_or_replaced_file_is_refused(tmp_path):
    from oxbench.storage import meta_digest

    folder = tmp_path / "he"
    HammingInvertedFile.build([HeEntries(**good_entries())], 4, folder)
    text = (folder / "meta.json").read_text()
    fields = {k: v for k, v in json.loads(text).items() if k != "digest"}

    def rewrite(**change: object) -> None:  # edited, its digest recomputed
        meta = {**fields, **change}
        (folder / "meta.json").write_text(json.dumps({**meta, "digest": meta_digest(meta)}))

    (folder / "meta.json").write_text(json.dumps({**fields, "nnz": 3, "digest": "x"}))
    with pytest.raises(CorruptCache, match="does not match its recorded digest"):
        HammingInvertedFile.open(folder)
    rewrite(nnz=3)
    with pytest.raises(InputError, match="does not agree"):
        HammingInvertedFile.open(folder)
    rewrite(n_images="two")
    with pytest.raises(InputError, match="unreadable Hamming inverted file"):
        HammingInvertedFile.open(folder)
    (folder / "meta.json").write_text(text)
    assert HammingInvertedFile.open(folder).n_postings == 2
    # an array read on open, replaced by one of the same shape: fails its digest
    norms = np.load(folder / "norms.npy")
    np.save(folder / "norms.npy", norms * 2)
    with pytest.raises(CorruptCache, match="does not match its digest"):
        HammingInvertedFile.open(folder)
    np.save(folder / "norms.npy", norms)
    # a column of the right shape written by something else: not the file the build recorded
    np.save(folder / "signatures.npy", np.array([9, 9], np.uint64))
    with pytest.raises(CorruptCache, match="Hamming inverted file"):
        HammingInvertedFile.open(folder)
    HammingInvertedFile.build([HeEntries(**good_entries())], 4, folder)
    np.save(folder / "angles.npy", np.zeros(5, np.float32))
    with pytest.raises(InputError, match="angles.npy is float32 \\(5,\\)"):
        HammingInvertedFile.open(folder)


def test_a_changed_build_rewrites_the_binding(tmp_path: Path):
    folder = tmp_path / "he"
    HammingInvertedFile.build([HeEntries(**good_entries())], 4, folder)
    e = {**good_entries(), "signatures": np.array([7, 7], np.uint64)}
    again = HammingInvertedFile.build([HeEntries(**e)], 4, folder)
    assert again.signatures_.tolist() == [7, 7]
    assert HammingInvertedFile.open(folder).signatures_.tolist() == [7, 7]


def test_the_merge_holds_the_runs_and_one_column_more(tmp_path, monkeypatch):
    """Disk during the build: the runs (20 B a posting) plus the column being written, each
    column's runs deleted once it is written -- not the runs and a whole second copy (40 B)."""
    rng = np.random.default_rng(5)
    images = random_features(rng, 400, 13)
    n = sum(len(f[0]) for f in images)
    seen = []
    read = word_lists.WordRuns._read_block

    def measured(self, c, w0, w1):
        seen.append(sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file()))
        return read(self, c, w0, w1)

    monkeypatch.setattr(word_lists.WordRuns, "_read_block", measured)
    monkeypatch.setattr(word_lists, "MERGE_POSTINGS", 50)
    ivf = HammingInvertedFile.build(chunked(images, 30), 13, tmp_path / "he")
    assert ivf.n_postings == n and len(seen) > 4 * 5
    assert max(seen) >= POSTING_BYTES * n  # the runs were there
    assert max(seen) <= (POSTING_BYTES + 8) * n + 4096  # and one column (8 B signatures) more
    assert not list((tmp_path / "he").glob("*runs*"))


def test_what_a_killed_build_left_is_removed_and_a_running_one_left_alone(tmp_path):
    """kill -9 during a build leaves its temporary build folder (runs, half-written columns)
    beside the lists; the next build of the folder removes those older than an hour whose name
    and ``.building.json`` say they build this folder (a 20 GB leak at 1M images otherwise), not
    the fresh one of a build still running, nor another folder's, nor a temporary-looking folder
    that does not say it is a build (issue 43 case 5)."""
    import os
    import time

    from oxbench.fileio import TEMP_PREFIX
    from oxbench.storage import BUILDING_NAME

    folder = tmp_path / "he"
    old = time.time() - 2 * 3600

    def temp(tag: str, builds: str | None, when: float) -> Path:
        t = tmp_path / f"{TEMP_PREFIX}{tag}"
        (t / f"{TEMP_PREFIX}runs.x").mkdir(parents=True)
        (t / f"{TEMP_PREFIX}runs.x" / "0.ids.bin").write_bytes(b"x" * 100)
        if builds is not None:
            (t / BUILDING_NAME).write_text(json.dumps({"builds": builds}))
        os.utime(t, (when, when))
        return t

    stale = temp("he.dead", "he", old)
    running = temp("he.live", "he", time.time())
    other = temp("hx.dead", "hx", old)
    unmarked = temp("he.theirs", None, old)
    HammingInvertedFile.build([HeEntries(**good_entries())], 4, folder)
    assert not stale.exists()
    assert running.exists() and other.exists() and unmarked.exists()
    assert HammingInvertedFile.open(folder).n_postings == 2
    assert not [p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]
