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
    build_simulated_compact,
    check_simulated_size,
    simulated_bags,
)


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
        root=root,
        cache=cache,
        runs_dir=tmp_path / "runs",
        overrides={"vocab_size": 256, "features.max_side": 320, "features.n_features": 300},
        workers=1,
        progress=False,
    )
    out = tmp_path / "sim.json"
    assert script.main(["--cache", str(cache), "--sizes", "300", "--json", str(out)]) == 0
    (p,) = json.loads(out.read_text())["points"]
    assert p["n_index"] == 340 and p["postings"] > 300 and p["query_cpu_s"] > 0
    assert p["disk_bytes"] > 0 and p["build_peak_traced_bytes"] > 0
    assert not (cache / "simulated-300").exists()  # the lists are removed after measuring
    capsys.readouterr()
    assert script.main(["--cache", str(cache), "--sizes", "0"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "1 to 10,000,000" in err
