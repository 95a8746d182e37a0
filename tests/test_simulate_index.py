"""The simulated bag-of-words index (issue 33 item 3): bags drawn from measured statistics, and the
compact index over them the same as the in-RAM one over the same bags."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.index.inverted import InvertedFile, bow_matrix
from oxbench.index.postings import CompressedPostings
from oxbench.index.simulate import (
    MAX_SIMULATED,
    BagStatistics,
    SignaturePool,
    build_simulated_compact,
    check_simulated_size,
    simulated_asmk_entries,
    simulated_bags,
    simulated_he_entries,
    simulated_vectors,
)
from oxbench.pipelines import RecordOptions, Session


def _measured(n: int = 60, n_words: int = 300, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, n_words + 1)  # a skewed vocabulary, as real word counts are
    p = zipf / zipf.sum()
    return [rng.choice(n_words, size=int(rng.integers(20, 200)), p=p) for _ in range(n)]


def test_statistics_are_the_measured_sizes_and_frequencies() -> None:
    bags = [np.array([0, 0, 2]), np.array([1]), np.array([], np.int64)]
    s = BagStatistics.from_bags(bags, 4)
    assert s.bag_sizes.tolist() == [3, 1, 0]
    np.testing.assert_allclose(s.word_probabilities, [0.5, 0.25, 0.25, 0.0])
    with pytest.raises(InputError, match="outside 0 .. 3"):
        BagStatistics.from_bags([np.array([4])], 4)
    with pytest.raises(InputError, match="no features"):
        BagStatistics.from_bags([np.array([], np.int64)], 4)
    with pytest.raises(InputError, match="no images"):
        BagStatistics.from_bags([], 4)


def test_simulated_bags_follow_the_statistics_and_are_seeded_per_chunk() -> None:
    stats = BagStatistics.from_bags(_measured(), 300)
    chunks = list(simulated_bags(stats, 5000, seed=3, chunk=1000))
    assert [len(c) for c in chunks] == [1000] * 5
    bags = [b for c in chunks for b in c]
    sizes = np.array([len(b) for b in bags])
    assert set(sizes.tolist()) <= set(stats.bag_sizes.tolist())
    assert sizes.mean() == pytest.approx(stats.bag_sizes.mean(), rel=0.05)
    words = np.concatenate(bags)
    freq = np.bincount(words, minlength=300) / len(words)
    # the frequent words within a few standard errors of the measured probabilities
    top = np.argsort(-stats.word_probabilities)[:20]
    se = np.sqrt(stats.word_probabilities[top] * (1 - stats.word_probabilities[top]) / len(words))
    assert np.all(np.abs(freq[top] - stats.word_probabilities[top]) < 5 * se)
    assert freq[stats.word_probabilities == 0].sum() == 0  # never a word that was never seen
    again = list(simulated_bags(stats, 5000, seed=3, chunk=1000))
    assert all(
        np.array_equal(a, b) for a, b in zip(bags, [b for c in again for b in c], strict=True)
    )
    other = next(simulated_bags(stats, 5000, seed=4, chunk=1000))
    assert not all(np.array_equal(a, b) for a, b in zip(chunks[0], other, strict=True))


def _pool(n_words: int, per_word: int = 8, seed: int = 0) -> SignaturePool:
    """Measured 128-bit codes whose bit ``b`` is set with probability ``b / 128``."""
    rng = np.random.default_rng(seed)
    words = np.repeat(np.arange(0, n_words, 2), per_word)  # odd words have no measured code
    p = np.arange(128) / 128
    bits = rng.random((len(words), 128)) < p
    codes = np.packbits(bits, axis=1, bitorder="little").view("<u8").astype(np.uint64)
    return SignaturePool.from_entries(words, codes, n_words)


def test_simulated_asmk_entries_are_the_bags_distinct_words_with_measured_codes() -> None:
    stats = BagStatistics.from_bags(_measured(), 300)
    pool = _pool(300)
    chunks = list(simulated_asmk_entries(stats, pool, 900, seed=2, chunk=400))
    bags = [b for c in simulated_bags(stats, 900, seed=2, chunk=400) for b in c]
    assert [c.n_images for c in chunks] == [400, 400, 100]
    base = 0
    for c in chunks:
        assert c.owners.dtype == c.words.dtype == np.int64 and c.codes.dtype == np.uint64
        assert c.codes.shape == (len(c.words), 2)
        assert (np.diff(c.owners) >= 0).all()
        for i in range(c.n_images):  # one entry per distinct word of the image's bag
            np.testing.assert_array_equal(c.words[c.owners == i], np.unique(bags[base + i]))
        base += c.n_images
        # a word with measured codes gets one of its own; one without, some measured code
        for w, code in zip(c.words[:200].tolist(), c.codes[:200], strict=True):
            a, b = pool.offsets[w], pool.offsets[w + 1]
            own = pool.signatures[a:b] if b > a else pool.signatures
            assert (own == code).all(axis=1).any()
    again = list(simulated_asmk_entries(stats, pool, 900, seed=2, chunk=400))
    assert all(np.array_equal(x.codes, y.codes) for x, y in zip(chunks, again, strict=True))
    other = next(simulated_asmk_entries(stats, pool, 900, seed=3, chunk=400))
    assert not np.array_equal(other.words, chunks[0].words)
    with pytest.raises(InputError, match="signatures of 300 words, statistics of 10"):
        next(simulated_asmk_entries(BagStatistics.from_bags([np.arange(10)], 10), pool, 5))


def test_resampled_codes_keep_the_measured_bit_frequencies() -> None:
    pool = _pool(2, per_word=4000, seed=1)
    drawn = pool.draw(np.zeros(20000, np.int64), np.random.default_rng(0))
    bits = np.unpackbits(drawn.view(np.uint8), axis=1, bitorder="little").mean(axis=0)
    measured = np.unpackbits(pool.signatures[:4000].view(np.uint8), axis=1, bitorder="little")
    # within 5 standard errors of the measured frequencies (which follow b / 128)
    se = np.sqrt(0.25 / 20000)
    assert np.all(np.abs(bits - measured.mean(axis=0)) < 5 * se + 1e-12)
    assert np.corrcoef(bits, np.arange(128) / 128)[0, 1] > 0.99
    with pytest.raises(InputError, match="uint64"):
        SignaturePool.from_entries(np.array([0]), np.array([[1.0]]), 2)
    with pytest.raises(InputError, match="outside"):
        SignaturePool.from_entries(np.array([5]), np.zeros((1, 2), np.uint64), 2)


def test_simulated_he_entries_are_one_uniform_signature_per_feature() -> None:
    stats = BagStatistics.from_bags(_measured(), 300)
    measured = np.array([-1.0, 0.5, 2.0], np.float32)
    e, *_ = simulated_he_entries(stats, 3000, log_scales=measured, seed=4, chunk=3000)
    bags = next(simulated_bags(stats, 3000, seed=4, chunk=3000))
    assert e.n_images == 3000 and e.signatures.dtype == np.uint64 and e.owners.dtype == np.int64
    np.testing.assert_array_equal(e.words, np.concatenate(bags))
    np.testing.assert_array_equal(np.bincount(e.owners, minlength=3000), [len(b) for b in bags])
    # each of the 64 bits set half of the time (popcount mean 32, sd 4 / sqrt(n))
    bits = np.bitwise_count(e.signatures).astype(np.float64)
    assert abs(bits.mean() - 32) < 5 * 4 / np.sqrt(len(bits))
    assert abs(bits.var() - 16) < 1.5
    # orientations uniform over the circle (mean 180, sd 360 / sqrt(12) / sqrt(n)), scales measured
    assert e.angles.min() >= 0 and e.angles.max() < 360
    assert abs(e.angles.mean() - 180) < 5 * 360 / np.sqrt(12 * len(bits))
    assert set(np.unique(e.log_scales).tolist()) == set(measured.tolist())
    again, *_ = simulated_he_entries(stats, 3000, log_scales=measured, seed=4, chunk=3000)
    np.testing.assert_array_equal(e.signatures, again.signatures)
    np.testing.assert_array_equal(e.angles, again.angles)
    plain, *_ = simulated_he_entries(stats, 3000, seed=4, chunk=3000)
    assert not plain.log_scales.any()
    for bad in (np.zeros(0), np.array([np.nan])):
        with pytest.raises(InputError, match="log-scales"):
            next(simulated_he_entries(stats, 10, log_scales=bad))


def test_simulated_vectors_are_unit_resampled_and_reject_bad_input() -> None:
    rng = np.random.default_rng(0)
    measured = rng.standard_normal((50, 16)).astype(np.float32) + 3.0
    chunks = list(simulated_vectors(measured, 1000, noise=0.0, seed=1, chunk=300))
    assert [len(c) for c in chunks] == [300, 300, 300, 100]
    v = np.concatenate(chunks)
    assert v.dtype == np.float32 and v.shape == (1000, 16)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1, rtol=1e-5)
    unit = measured / np.linalg.norm(measured, axis=1, keepdims=True)
    # without noise every vector is a measured one, normalised
    assert np.abs(v @ unit.T).max(axis=1).min() > 1 - 1e-5
    noisy = np.concatenate(list(simulated_vectors(measured, 1000, noise=0.5, seed=1)))
    assert (noisy @ unit.T).max(axis=1).max() < 1 - 1e-4
    np.testing.assert_array_equal(
        noisy, np.concatenate(list(simulated_vectors(measured, 1000, noise=0.5, seed=1)))
    )
    with pytest.raises(InputError, match="noise"):
        next(simulated_vectors(measured, 10, noise=float("nan")))
    bad = measured.copy()
    bad[3, 2] = np.nan
    with pytest.raises(InputError, match="finite"):
        next(simulated_vectors(bad, 10))
    with pytest.raises(InputError, match="1 to 10,000,000"):
        next(simulated_vectors(measured, MAX_SIMULATED + 1))
    with pytest.raises(InputError, match="chunk"):
        next(simulated_vectors(measured, 10, chunk=0))


@pytest.mark.parametrize("bad", [0, -1, MAX_SIMULATED + 1, 2.5, True, "100"])
def test_a_simulated_size_past_the_bounds_is_one_line(bad: object) -> None:
    with pytest.raises(InputError, match="1 to 10,000,000") as exc:
        check_simulated_size(bad)  # type: ignore[arg-type]
    assert "\n" not in str(exc.value)


def test_the_simulated_compact_index_scores_as_the_in_ram_one(tmp_path: Path) -> None:
    db = _measured(40, 300, seed=1)
    stats = BagStatistics.from_bags(db, 300)
    built, ivf = build_simulated_compact(db, stats, 700, tmp_path / "lists", seed=5, chunk=128)
    simulated = [b for c in simulated_bags(stats, 700, seed=5, chunk=128) for b in c]
    reference = InvertedFile(300).fit(bow_matrix(db + simulated, 300))
    assert built.n_index == 740 and built.postings == reference.postings_.nnz
    lists = CompressedPostings.open(tmp_path / "lists")
    assert built.disk_bytes == lists.nbytes and built.build_cpu_s > 0
    queries = reference.transform(bow_matrix(db[:5], 300))
    np.testing.assert_array_equal(ivf.idf_, reference.idf_)  # type: ignore[attr-defined]
    np.testing.assert_allclose(
        lists.scores_of_vectors(queries), reference.scores_of_vectors(queries), rtol=1e-6
    )


# --- bench/simulated_index.py on a tiny run's words -----------------------------------------------

pytest.importorskip("cv2")
pytest.importorskip("faiss")


def test_the_bench_script_measures_a_simulated_size_and_refuses_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util
    import json
    import sys

    import oxbench
    from test_pipeline import make_tiny_root

    bench_dir = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench_dir))
    try:
        spec = importlib.util.spec_from_file_location(
            "simulated_index", bench_dir / "simulated_index.py"
        )
        assert spec is not None and spec.loader is not None
        script = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(script)
    finally:
        sys.path.remove(str(bench_dir))
    root, cache = make_tiny_root(tmp_path / "data"), tmp_path / "cache"
    oxbench.run(
        "synthetic",
        "rootsift-bow",
        overrides={"vocabulary.size": 256, "features.max_side": 320, "features.n_features": 300},
        session=Session(root=root, cache=cache, workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    out = tmp_path / "sim.json"
    assert script.main(["--cache", str(cache), "--sizes", "300", "--json", str(out)]) == 0
    (p,) = json.loads(out.read_text())["points"]
    assert p["n_index"] == 340 and p["postings"] > 300 and p["query_cpu_s"] > 0
    assert p["single_query_cpu_s"] > 0 and p["postings_visited_per_query"] > 0
    # with the compiled kernel, numpy's time in the same run (its scores checked equal there)
    assert (p["single_query_cpu_numpy_s"] is not None) == p["compiled_kernel"]
    assert p["disk_bytes"] > 0 and p["build_peak_traced_bytes"] > 0
    assert not (cache / "simulated-bow-300").exists()  # the lists are removed after measuring
    capsys.readouterr()
    assert script.main(["--cache", str(cache), "--sizes", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "1 to 10,000,000" in err
    assert script.main(["--cache", str(cache), "--sizes", "10", "--methods", "bow,pq"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "'pq'" in err
    he = tmp_path / "he.json"
    methods = "he,he-memory"
    argv = ["--cache", str(cache), "--sizes", "300", "--methods", methods, "--json", str(he)]
    assert script.main(argv) == 0
    mapped, memory = json.loads(he.read_text())["points"]
    for p in (mapped, memory):
        assert p["n_index"] == 340 and p["postings"] > 300
        assert p["query_cpu_s"] > 0 and p["query_cpu_wgc_s"] > 0 and p["query_cpu_first_s"] > 0
    assert (mapped["method"], memory["method"]) == ("he", "he-memory")
    assert mapped["postings"] == memory["postings"]  # the same drawn postings in both
    # the mapped file: 20 bytes a posting on disk, its offsets, idf and norms in RAM
    assert mapped["disk_bytes"] > 20 * mapped["postings"] and memory["disk_bytes"] == 0
    assert mapped["steady_ram_bytes"] < 20 * mapped["postings"] < memory["steady_ram_bytes"]
    assert not (cache / "simulated-he-300").exists()
