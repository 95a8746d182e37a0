"""Bytes per database image, measured: the helpers against hand-made answers, every family's record,
and the pre-flight refusal of a run whose index would not fit in RAM."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.index.footprint import (
    RAM_ENV,
    Footprint,
    array_bytes,
    available_ram,
    check_ram,
    disk_bytes,
)
from oxbench.pipelines import RecordOptions, Session
from oxbench.records import RunRecord


def test_array_bytes_counts_arrays_and_the_three_arrays_of_a_sparse_matrix() -> None:
    m = sp.csr_matrix(np.array([[0, 1.5, 0], [2, 0, 3]], np.float32))
    # 3 stored values (float32) + 3 column indices + 3 row pointers (int32 for a small matrix)
    assert array_bytes(m) == 3 * 4 + 3 * m.indices.itemsize + 3 * m.indptr.itemsize == 36
    assert array_bytes([np.zeros(10, np.int64), (np.zeros(3, np.uint8), {"x": m})]) == 80 + 3 + 36
    assert array_bytes(None) == 0 and array_bytes("text") == 0 and array_bytes([None, None]) == 0


def test_disk_bytes_sums_regular_files_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.bin").write_bytes(b"1" * 1000)
    (tmp_path / "a" / "sub").mkdir()
    (tmp_path / "a" / "sub" / "y.bin").write_bytes(b"2" * 24)
    (tmp_path / "big").write_bytes(b"3" * 5000)
    os.symlink(
        tmp_path / "big", tmp_path / "a" / "link"
    )  # a link into elsewhere is not the store's
    assert disk_bytes(tmp_path / "a") == 1024
    assert disk_bytes(tmp_path / "big") == 5000 and disk_bytes(tmp_path / "missing") == 0


@settings(max_examples=50, deadline=None)
@given(
    n=st.integers(1, 10_000),
    ram=st.dictionaries(st.sampled_from(["postings", "words", "codes"]), st.integers(0, 1 << 40)),
    fixed=st.integers(0, 1 << 30),
    scale=st.integers(1, 100),
)
def test_projection_is_fixed_plus_linear_and_reproduces_the_measured_size(
    n, ram, fixed, scale
) -> None:
    fp = Footprint(n, ram=ram, fixed_ram={"vocabulary": fixed})
    assert fp.projected_ram(n) == pytest.approx(fp.ram_bytes, abs=1)
    grown = fp.projected_ram(n * scale) - fixed
    assert grown == pytest.approx(sum(ram.values()) * scale, rel=1e-9, abs=1)
    d = fp.to_dict()
    assert d["ram_bytes"] == sum(ram.values()) + fixed and d[
        "ram_bytes_per_image"
    ] == pytest.approx(sum(ram.values()) / n)


def test_footprint_refuses_negative_sizes() -> None:
    with pytest.raises(ValueError, match="bytes must be >= 0"):
        Footprint(3, ram={"x": -1})
    assert Footprint(0).ram_bytes_per_image == 0.0


def test_check_ram_refuses_in_one_line_and_the_override_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check_ram(100, 10, basis="b", available=100)  # exactly what is there fits
    with pytest.raises(InputError) as exc:
        check_ram(3 << 30, 1000, basis="at most 3 MiB per image", available=1 << 30)
    text = str(exc.value)
    assert (
        "3.00 GiB" in text
        and "1.00 GiB available" in text
        and "1,000 images" in text
        and "\n" not in text
    )
    monkeypatch.setenv(RAM_ENV, "12345")
    assert available_ram() == 12345
    for bad in ("lots", "0", "-5"):
        monkeypatch.setenv(RAM_ENV, bad)
        with pytest.raises(InputError, match=RAM_ENV):
            available_ram()
    monkeypatch.delenv(RAM_ENV)
    assert available_ram() > 1 << 20  # this machine has more than a megabyte


# --- every family: measured in its run record --------------------------------------------------

cv2 = pytest.importorskip("cv2")
pytest.importorskip("faiss")
pytest.importorskip("PIL.Image")


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from test_pipeline import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


def _run(root: Path, tmp: Path, method: str, distractors: int | None, **more: object):  # noqa: ANN202
    import oxbench
    from test_pipeline import tiny

    if "vlad" in method:
        overrides = tiny(method) | more
    else:
        overrides = {**tiny(method), "vocabulary.size": 256, **more}
    return oxbench.run(
        "synthetic",
        method,
        overrides=overrides,
        distractors=distractors,
        session=Session(root=root, cache=tmp / "cache", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp / "runs"),
    )


def _stored_bytes(folder: Path) -> int:
    """Sizes of the files below ``folder`` by another walk than the module's (pathlib, lstat)."""
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_bow_footprint_is_the_size_of_its_postings_words_and_stores(
    tiny_root: Path, tmp_path: Path
) -> None:
    from oxbench.pipelines.steps import Words

    out = _run(tiny_root, tmp_path, "rootsift-bow", 7)
    fp = out.record["footprint"]
    assert fp["n_index"] == 40 + 7
    rec = RunRecord.load(out.run_dir)
    assert rec.footprint == fp  # the checked reader keeps it
    # independent count: one posting per distinct (image, word) pair of the database and distractors
    cache = tmp_path / "cache"
    word_files = sorted(
        p
        for p in cache.rglob("words/*/*.npz")
        if p.stem.split("-")[0] in ("database", "distractors")
    )
    assert len(word_files) == 2, word_files
    pairs, words_ram = 0, 0
    for wf in word_files:
        w = Words.load(wf)
        assert isinstance(w.words, np.memmap) and isinstance(
            w.sq_dists, np.memmap
        )  # on disk, paged in on demand
        words_ram += w.offsets.nbytes
        for i in range(len(w.names)):
            pairs += len(set(w.words[w.offsets[i] : w.offsets[i + 1], 0].tolist()))
    n_words = 256
    # CSR of [n_words, n_index]: float32 value + int32 index per posting, n_words + 1 pointers
    assert fp["ram"]["postings"] == pairs * 8 + (n_words + 1) * 4
    assert fp["ram"]["db_vectors"] == pairs * 8 + (fp["n_index"] + 1) * 4
    assert fp["ram"]["words"] == words_ram
    assert fp["ram_bytes_per_image"] == pytest.approx(
        (2 * pairs * 8 + (n_words + 1 + 48) * 4 + words_ram) / 47
    )
    test_set = word_files[0].parents[2]  # <cache>/<the test set's key>/words/<vocabulary>/
    stores = [
        d for d in test_set.rglob("meta.json") if d.parent.name in ("database", "distractors")
    ]
    assert len(stores) == 2 and fp["disk"]["features"] == sum(
        _stored_bytes(s.parent) for s in stores
    )
    assert fp["disk"]["words"] == sum(p.stat().st_size for p in word_files)
    assert fp["fixed_ram"]["vocabulary"] == n_words * 128 * 4


def test_every_family_records_a_footprint_that_grows_with_distractors(
    tiny_root: Path, tmp_path: Path
) -> None:
    methods = ["rootsift-bow-sv", "rootsift-vlad"]
    try:
        import asmk  # noqa: F401

        methods.append("rootsift-asmk")
    except ImportError:
        pass
    for method in methods:
        small = _run(tiny_root, tmp_path, method, None).record["footprint"]
        large = _run(tiny_root, tmp_path, method, 12).record["footprint"]
        assert (small["n_index"], large["n_index"]) == (40, 52), method
        assert (
            large["disk_bytes"] > small["disk_bytes"] and large["ram_bytes"] > small["ram_bytes"]
        ), method
        assert small["fixed_disk"] == large["fixed_disk"], (
            method
        )  # the vocabulary / codebook does not grow
    vlad = _run(tiny_root, tmp_path, "rootsift-vlad", 12).record["footprint"]
    assert (
        vlad["ram"]["vectors"] == 52 * 64 * 128 * 4 and vlad["ram_bytes_per_image"] == 64 * 128 * 4
    )


def test_ivfpq_footprint_is_codes_and_ids_with_the_quantisers_fixed(
    tiny_root: Path, tmp_path: Path
) -> None:
    out = _run(
        tiny_root,
        tmp_path,
        "rootsift-vlad",
        30,
        search="faiss-ivfpq",
        **{"search.nlist": 4, "search.m": 8, "search.nbits": 4, "search.nprobe": 4},
    )
    fp = out.record["footprint"]
    # an IVF-PQ list entry: m * nbits / 8 bytes of code + an int64 id; serialised lists add a size per list
    per_entry = 8 * 4 // 8 + 8
    assert (
        fp["ram"]["faiss_index"] >= 70 * per_entry
        and fp["ram"]["faiss_index"] <= 70 * per_entry + 4 * 64
    )
    assert fp["fixed_ram"]["faiss_trained"] > 4 * 8192 * 4  # the coarse centroids at least
    assert fp["disk"]["faiss_index"] > fp["ram"]["faiss_index"]
    # the float vectors are memory-mapped from the cache, not held: on disk, not in RAM
    assert fp["ram"]["vectors"] == 0 and fp["disk"]["vectors"] == 70 * 64 * 128 * 4 + 128


def test_a_run_that_would_not_fit_is_refused_before_anything_is_made(
    tiny_root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from oxbench.cli import main

    # 45 images not yet described, at the cap of 300 features each (24 bytes of the build's
    # postings a feature, 8 bytes of words offset an image) do not fit
    monkeypatch.setenv(RAM_ENV, str(45 * (300 * 24 + 8) - 1))
    with pytest.raises(InputError, match="projected to need .* of RAM .*rootsift-bow's build") as e:
        _run(tiny_root, tmp_path, "rootsift-bow", 5)
    # the remedy named is one the bag-of-words family accepts (the compressed lists fit)
    assert "or --set inverted_file=mapped," in str(e.value) and "faiss" not in str(e.value)
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit) as exc:
        main(
            [
                "run",
                "--root",
                str(tiny_root),
                "--method",
                "rootsift-bow",
                "--distractors",
                "5",
                "--no-progress",
                "--cache",
                str(tmp_path / "c2"),
                "--out",
                str(tmp_path / "o2"),
            ]
        )
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and RAM_ENV in err, err
    assert not (tmp_path / "o2").exists()
    monkeypatch.setenv(RAM_ENV, str(1 << 40))
    assert (
        json.loads(json.dumps(_run(tiny_root, tmp_path, "rootsift-bow", 5).record["footprint"]))[
            "n_index"
        ]
        == 45
    )
