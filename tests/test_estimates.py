"""Estimates before the work (issue 33 item 5): RAM from measured per-feature costs and the
dataset's actual feature counts, the disk and CPU time of the new images, refusals with the remedies
the family accepts, the record's disk per image of the indexed images only, words per names list,
and the in-RAM bag-of-words build in chunks."""

from __future__ import annotations

import logging
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.index.inverted import InvertedFile, bow_matrix, soft_assignment_weights
from oxbench.pipelines import RecordOptions, Session, estimates
from oxbench.pipelines.estimates import (
    DESCRIBE_CPU_S,
    KEYPOINT_BYTES,
    WORD_BYTES,
    WORDS_OFFSET_BYTES,
    FeatureCounts,
    estimate_run,
    preflight,
    ram_remedies,
)
from oxbench.pipelines.presets import list_methods, resolve_method

GIB = 1 << 30


# --- the in-RAM build in chunks -------------------------------------------------------------------


def _random_bags(n: int, n_words: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, n_words, size=int(rng.integers(0, 300))) for _ in range(n)]


@pytest.mark.parametrize("burst", ["sqrt", "none"])
def test_the_chunked_build_is_the_whole_build_exactly(burst: str) -> None:
    bags = _random_bags(700, 5000)
    rng = np.random.default_rng(1)
    weights = [soft_assignment_weights(rng.random((len(b), 1)), 0.01)[:, 0] for b in bags]
    tf = bow_matrix(bags, 5000, weights)
    whole = InvertedFile(5000, burst=burst).fit(tf)  # type: ignore[arg-type]

    def chunks():  # noqa: ANN202
        return (
            bow_matrix(bags[a : a + 128], 5000, weights[a : a + 128]) for a in range(0, 700, 128)
        )

    chunked = InvertedFile(5000, burst=burst).fit_chunks(chunks)  # type: ignore[arg-type]
    for a, b in ((whole.db_vectors_, chunked.db_vectors_), (whole.postings_, chunked.postings_)):
        assert a is not None and b is not None and a.shape == b.shape
        assert (abs(a - b)).nnz == 0 and a.nnz == b.nnz  # the same entries, bit for bit
        assert np.array_equal(a.indptr, b.indptr) and a.dtype == b.dtype == np.float32
    np.testing.assert_array_equal(whole.idf_, chunked.idf_)
    q = bow_matrix(bags[:5], 5000)
    np.testing.assert_array_equal(whole.scores(q), chunked.scores(q))
    with pytest.raises(InputError, match="at least one chunk"):
        InvertedFile(5000).fit_chunks(lambda: iter(()))


def test_the_chunked_build_peaks_under_the_pre_flight_bound_per_posting() -> None:
    """The bound the pre-flight uses (3 eight-byte copies a posting) holds as measured by
    tracemalloc, a chunk's term frequencies apart; the whole-matrix build exceeds it."""
    from oxbench.pipelines.families.bow import BowConfig

    n_words, n, chunk = 65536, 3000, 256
    bags = _random_bags(n, n_words, seed=2)
    bags = [
        np.concatenate([b, np.random.default_rng(i).integers(0, n_words, 700)])
        for i, b in enumerate(bags)
    ]
    postings = sum(len(np.unique(b)) for b in bags)
    per_posting = resolve_method("rootsift-bow").ram_bytes_per_feature()
    assert isinstance(resolve_method("rootsift-bow"), BowConfig) and per_posting == 24

    def chunks():  # noqa: ANN202
        return (bow_matrix(bags[a : a + chunk], n_words) for a in range(0, n, chunk))

    tracemalloc.start()
    try:
        InvertedFile(n_words).fit_chunks(chunks)
        _, chunked_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        InvertedFile(n_words).fit(bow_matrix(bags, n_words))
        _, whole_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    one_chunk = 3 * 16 * (postings / n) * chunk  # a chunk's triplets and tf, at most
    assert chunked_peak <= per_posting * postings + one_chunk, chunked_peak / postings
    assert whole_peak > per_posting * postings  # what the chunks saved


# --- feature counts and the RAM estimate ----------------------------------------------------------


def test_feature_counts_bound_uses_the_cap_only_for_the_undescribed() -> None:
    c = FeatureCounts(n_images=10, described=7, features=700, cap=4000)
    assert c.undescribed == 3 and c.bound == 700 + 3 * 4000
    assert FeatureCounts(5, 5, 123, 0).bound == 123  # all described: no cap needed
    assert FeatureCounts(5, 4, 123, 0).bound is None  # one image unbounded


cv2 = pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_pipeline import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


def _overrides(method: str) -> dict[str, object]:
    from test_pipeline import tiny

    return {**tiny(method), "vocabulary.size": 256}


def _run(root: Path, tmp: Path, method: str, distractors: int | None):  # noqa: ANN202
    import oxbench

    return oxbench.run(
        "synthetic",
        method,
        overrides=_overrides(method),
        distractors=distractors,
        session=Session(root=root, cache=tmp / "cache", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp / "runs"),
    )


def _bench(root: Path, distractors: int | None):  # noqa: ANN202
    from oxbench.datasets import load

    return load("synthetic", root, distractors=distractors, progress=False, images=False)


def test_ram_and_disk_estimates_read_the_actual_counts_after_a_run(
    tiny_root: Path, tmp_path: Path
) -> None:
    from oxbench.pipelines.steps.keys import part_names
    from oxbench.pipelines.steps.local import open_store

    out = _run(tiny_root, tmp_path, "rootsift-bow", 6)
    m = resolve_method("rootsift-bow", **_overrides("rootsift-bow"))
    cache = tmp_path / "cache"
    bench = _bench(tiny_root, 9)  # 3 distractors more than were described
    est = estimate_run(m, bench, cache)
    # the actual counts, read independently from the stores
    actual = 0
    for part in ("database", "distractors"):
        store = open_store(cache, bench, m.features, part)
        actual += sum(store.count(n) for n in part_names(bench, part) if n in store)
    cap = m.features.n_features
    assert est.counts == FeatureCounts(49, 46, actual, cap)
    assert est.ram_bytes == 24 * (actual + 3 * cap) + WORDS_OFFSET_BYTES * 49
    assert "3 not yet described" in est.ram_basis
    # the disk of the 3 new images: keypoints, uint8 descriptors and words, at the cap
    assert est.new_disk_bytes == 3 * cap * (KEYPOINT_BYTES + 128 + WORD_BYTES)
    assert est.cpu_s == pytest.approx(3 * DESCRIBE_CPU_S)
    # with nothing new, no disk and no CPU, and the RAM of the actual features alone
    again = estimate_run(m, _bench(tiny_root, 6), cache)
    assert again.new_disk_bytes == 0 and again.cpu_s == 0 and again.counts is not None
    assert again.ram_bytes == 24 * again.counts.features + 8 * 46
    assert out.record["footprint"]["n_index"] == 46


def test_the_must_reach_points_100k_accepted_1m_refused_with_a_remedy_the_family_takes(
    tiny_root: Path, tmp_path: Path
) -> None:
    """On a machine like this one (24 GiB of RAM, 72 GB free): +100K with the in-RAM preset fits
    at the cap of 4,000 features; +1M does not, and the remedy named is the compressed lists,
    which the preset accepts and which fit; the compact preset at +1M is then refused for the disk
    (~570 GiB of features at the cap), before anything is made."""
    m = resolve_method("rootsift-bow-sv")
    cache = tmp_path / "empty-cache"
    est = preflight(m, _bench(tiny_root, 100_000), cache, available=24 * GIB, free_disk=72 * 10**9)
    assert est.ram_bytes == 100_040 * (4000 * 24 + 8) and est.ram_bytes < 24 * GIB
    big = _bench(tiny_root, 1_000_000)
    with pytest.raises(InputError) as exc:
        preflight(m, big, cache, available=24 * GIB, free_disk=72 * 10**9)
    text = str(exc.value)
    assert "\n" not in text and "1,000,040 images" in text
    assert "--set inverted_file=mapped (the preset rootsift-bow-sv-compact)" in text
    assert "faiss" not in text  # no bag-of-words preset takes search=faiss-ivfpq
    compact = resolve_method("rootsift-bow-sv-compact")
    assert compact.inverted_file == "mapped"  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"would add about .* for 1,000,040 new images .* free"):
        preflight(compact, big, cache, available=24 * GIB, free_disk=72 * 10**9)
    assert not cache.exists()  # nothing made


def test_asmk_at_1m_is_refused_in_ram_with_the_mapped_lists_as_remedy(
    tiny_root: Path, tmp_path: Path
) -> None:
    """ASMK's package inverted file at +1M: 24 B a feature at the cap (~89 GiB), refused; the
    mapped lists hold nothing per feature (8 B a norm per image) and are the remedy named."""
    m = resolve_method("rootsift-asmk")
    big = _bench(tiny_root, 1_000_000)
    with pytest.raises(InputError) as exc:
        preflight(m, big, tmp_path / "c", available=24 * GIB, free_disk=10**15)
    assert "--set inverted_file=mapped" in str(exc.value) and "\n" not in str(exc.value)
    mapped = resolve_method("rootsift-asmk", inverted_file="mapped")
    est = preflight(mapped, big, tmp_path / "c", available=24 * GIB, free_disk=10**15)
    assert est.ram_bytes < 24 * GIB


def test_he_is_refused_in_ram_past_what_fits_with_the_mapped_lists_as_remedy(
    tiny_root: Path, tmp_path: Path
) -> None:
    """HE's in-RAM build at 120 B a feature: +100K at the cap (~45 GiB) is refused on a 24 GiB
    machine naming the mapped lists, which hold nothing per feature; with query expansion the
    tf-idf file's 24 B a feature remain, so +1M is refused even mapped (~89 GiB) and no remedy is
    named that would not fit."""
    m = resolve_method("rootsift-he-wgc")
    est = preflight(m, _bench(tiny_root, 10_000), tmp_path / "c", available=24 * GIB,
                    free_disk=10**15)  # fmt: skip
    assert est.ram_bytes == 10_040 * (4000 * 120 + 8)
    big = _bench(tiny_root, 100_000)
    with pytest.raises(InputError) as exc:
        preflight(m, big, tmp_path / "c", available=24 * GIB, free_disk=10**15)
    assert "--set inverted_file=mapped" in str(exc.value) and "\n" not in str(exc.value)
    mapped = resolve_method("rootsift-he-wgc", inverted_file="mapped")
    est = preflight(mapped, _bench(tiny_root, 1_000_000), tmp_path / "c", available=24 * GIB,
                    free_disk=10**15)  # fmt: skip
    assert est.ram_bytes == 1_000_040 * 8  # the words offsets only
    qe = resolve_method("rootsift-he-wgc-sv-qe", inverted_file="mapped")
    with pytest.raises(InputError) as exc:
        preflight(qe, _bench(tiny_root, 1_000_000), tmp_path / "c", available=24 * GIB,
                  free_disk=10**15)  # fmt: skip
    assert "inverted_file=mapped" not in str(exc.value)


def test_every_named_remedy_is_accepted_by_its_preset(tiny_root: Path, tmp_path: Path) -> None:
    big = _bench(tiny_root, 100_000)
    named = 0
    for name in list_methods():
        m = resolve_method(name)
        for remedy in ram_remedies(m, big, tmp_path / "c", available=64 << 20):
            key, _, value = remedy.removeprefix("--set ").split(" ")[0].partition("=")
            fixed = resolve_method(name, **{key: value})  # accepted, and it fits
            counts = estimates.feature_counts(fixed, big, tmp_path / "c")
            ram = estimates._ram(fixed, big.n_index, counts)[0]
            assert ram is not None and ram <= 64 << 20  # and with it the index fits
            named += 1
    assert named >= 3  # rootsift-bow, rootsift-bow-sv, rootsift-asmk at least


def test_a_disk_short_run_is_refused_before_any_work(
    tiny_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from oxbench.cli import main

    calls: list[Path] = []

    def tiny_disk(path: str | Path) -> int:
        calls.append(Path(path))
        return 1000  # bytes free

    monkeypatch.setattr(estimates, "free_disk_bytes", tiny_disk)
    cache, out = tmp_path / "cache", tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        main(
            ["run", "--root", str(tiny_root), "--method", "rootsift-bow", "--distractors", "3",
             "--no-progress", "--cache", str(cache), "--out", str(out)]
        )  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "free for the cache" in err and "--cache" in err
    assert calls == [cache] and not cache.exists() and not out.exists()


def test_a_long_run_is_announced_with_its_cpu_and_disk(
    tiny_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    m = resolve_method("rootsift-bow-sv-compact")
    with caplog.at_level(logging.WARNING, logger="oxbench.pipelines.estimates"):
        preflight(m, _bench(tiny_root, 20_000), tmp_path / "c", available=GIB, free_disk=10**13)
        short = preflight(m, _bench(tiny_root, 10), tmp_path / "c", available=GIB, free_disk=10**13)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "20,040 new images" in lines[0] and "CPU-hours" in lines[0]
    assert f"{20_040 * DESCRIBE_CPU_S / 3600:.1f} CPU-hours" in lines[0]
    assert short.cpu_s < estimates.ANNOUNCE_CPU_S


# --- the record's disk per image, and words per names list ----------------------------------------


def test_disk_per_image_counts_the_indexed_images_and_smaller_sizes_reuse_the_words(
    tiny_root: Path, tmp_path: Path
) -> None:
    from oxbench.pipelines.steps import Words

    large = _run(tiny_root, tmp_path, "rootsift-bow", 12)
    small = _run(tiny_root, tmp_path, "rootsift-bow", 4)  # after the larger: no reassignment
    assert small.record["cache"]["words.distractors"] == "hit"
    fl, fs = large.record["footprint"], small.record["footprint"]
    # per image, the features of 44 images are not the store of 52 images divided by 44
    assert fs["disk"]["features"] < fl["disk"]["features"]
    assert fs["disk_bytes_per_image"] == pytest.approx(fl["disk_bytes_per_image"], rel=0.2)
    files = sorted((tmp_path / "cache").rglob("words/*/distractors-*.npz"))
    assert sorted(int(p.name.split("-")[1]) for p in files) == [4, 12]
    by_count = {int(p.name.split("-")[1]): Words.load(p) for p in files}
    w4, w12 = by_count[4], by_count[12]
    assert w12.names[:4] == w4.names
    n = int(w4.offsets[-1])
    np.testing.assert_array_equal(w4.offsets, w12.offsets[:5])
    np.testing.assert_array_equal(w4.words, w12.words[:n])
    np.testing.assert_array_equal(w4.sq_dists, w12.sq_dists[:n])
    db_words = list((tmp_path / "cache").rglob("words/*/database.npz"))
    assert len(db_words) == 1
    four = next(p for p in files if p.name.startswith("distractors-4-"))
    assert fs["disk"]["words"] == db_words[0].stat().st_size + four.stat().st_size
    # the same mAP as a fresh run of +4 in another cache: the cut words are the words
    import oxbench

    fresh = oxbench.run(
        "synthetic",
        "rootsift-bow",
        overrides=_overrides("rootsift-bow"),
        distractors=4,
        session=Session(root=tiny_root, cache=tmp_path / "cache2", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs2"),
    )
    assert fresh.result.setups["medium"].map == small.result.setups["medium"].map
