"""The compressed, memory-mapped inverted file (oxbench.index.postings) against the in-RAM one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.index.inverted import InvertedFile, bow_matrix
from oxbench.index.postings import CompressedPostings, vbyte_decode, vbyte_encode


def _slow_vbyte(values: list[int]) -> list[int]:
    """The byte code by its definition: 7-bit groups, low first, high bit on all but the last."""
    out = []
    for v in values:
        while True:
            group, v = v & 0x7F, v >> 7
            out.append(group | (0x80 if v else 0))
            if not v:
                break
    return out


@given(st.lists(st.integers(0, 2**62), max_size=50))
@settings(max_examples=200, deadline=None)
def test_vbyte_is_the_definition_and_decodes_back(values: list[int]) -> None:
    code = vbyte_encode(np.array(values, np.uint64))
    assert code.tolist() == _slow_vbyte(values)
    assert vbyte_decode(code).tolist() == values


def test_a_code_cut_inside_a_value_is_refused() -> None:
    with pytest.raises(InputError, match="ends inside a value"):
        vbyte_decode(vbyte_encode(np.array([300]))[:1])


def _index(seed: int, n_db: int = 300, n_words: int = 500) -> tuple[InvertedFile, sp.csr_matrix]:
    rng = np.random.default_rng(seed)
    words = [rng.integers(0, n_words, rng.integers(0, 60)) for _ in range(n_db)]
    ivf = InvertedFile(n_words).fit(bow_matrix(words, n_words))
    queries = bow_matrix([rng.integers(0, n_words, 40) for _ in range(6)], n_words)
    return ivf, ivf.transform(queries)


@pytest.mark.parametrize("seed", [0, 1])
def test_float32_postings_give_the_in_ram_files_scores_exactly(tmp_path: Path, seed: int) -> None:
    ivf, q = _index(seed)
    cp = CompressedPostings.write(ivf.postings_, tmp_path / "ivf")
    again = CompressedPostings.open(tmp_path / "ivf")  # a new process maps the files
    assert np.array_equal(again.scores_of_vectors(q), ivf.scores_of_vectors(q))
    assert np.array_equal(again.search(q, 50), ranks_of(ivf, q, 50))
    for word in (0, 7, 499):
        ids, w = cp.posting(word)
        row = ivf.postings_[word]
        assert ids.tolist() == row.indices.tolist() and np.array_equal(w, row.data)
    # one copy of the posting lists, ids in about 1-2 bytes: smaller than the two CSR copies in RAM
    csr = ivf.postings_.data.nbytes + ivf.postings_.indices.nbytes + ivf.postings_.indptr.nbytes
    assert cp.nbytes < 2 * csr * 0.5


def ranks_of(ivf: InvertedFile, q: sp.csr_matrix, k: int) -> np.ndarray:
    from oxbench.evaluation.ranking import ranks_from_scores

    return ranks_from_scores(ivf.scores_of_vectors(q).T, k)


def test_float16_postings_are_within_half_precision(tmp_path: Path) -> None:
    ivf, q = _index(2)
    cp = CompressedPostings.write(ivf.postings_, tmp_path / "ivf", weights="float16")
    np.testing.assert_allclose(cp.scores_of_vectors(q), ivf.scores_of_vectors(q), atol=2e-3)


def test_damaged_files_are_refused_in_one_line(tmp_path: Path) -> None:
    ivf, q = _index(3)
    CompressedPostings.write(ivf.postings_, tmp_path / "ivf")
    ids = tmp_path / "ivf" / "ids.bin"
    ids.write_bytes(ids.read_bytes()[:-3])
    with pytest.raises(InputError, match="does not agree with its meta.json"):
        CompressedPostings.open(tmp_path / "ivf")
    with pytest.raises(InputError, match="float32 or float16"):
        CompressedPostings.write(ivf.postings_, tmp_path / "x", weights="int8")  # type: ignore[arg-type]


def test_empty_lists_an_empty_index_and_a_query_of_another_vocabulary(tmp_path: Path) -> None:
    cp = CompressedPostings.write(sp.csr_matrix((3, 5), dtype=np.float32), tmp_path / "empty")
    assert cp.posting(1)[0].size == 0
    assert cp.scores_of_vectors(sp.csr_matrix(np.ones((1, 3), np.float32))).tolist() == [[0.0] * 5]
    with pytest.raises(InputError, match="query vectors have 2 words, the index 3"):
        cp.scores_of_vectors(sp.csr_matrix(np.ones((1, 2), np.float32)))
    none = CompressedPostings.write(sp.csr_matrix((4, 0), dtype=np.float32), tmp_path / "none")
    assert none.scores_of_vectors(sp.csr_matrix((2, 4), dtype=np.float32)).shape == (2, 0)


@pytest.mark.slow
def test_the_compact_preset_ranks_exactly_as_the_in_ram_one_and_says_where_its_bytes_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("faiss")
    import oxbench.pipelines.families.bow as bow
    from oxbench.pipelines import RunContext, resolve_method
    from test_pipeline import TINY, load_tiny, make_tiny_root

    monkeypatch.setattr(bow, "BUILD_CHUNK_IMAGES", 7)  # the streamed build in several chunks

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")
    ctx = RunContext(tmp_path / "cache", progress=False)
    out, prints = {}, {}
    for name in ("rootsift-bow-sv", "rootsift-bow-sv-compact"):
        m = resolve_method(name, **{"vocabulary.size": 100}, **TINY)
        impl = m.build().fit(train, ctx).index(bench, ctx)
        out[name] = impl.search(bench, ctx)
        prints[name] = (impl.footprint(), m.ram_bytes_per_image())
    assert np.array_equal(out["rootsift-bow-sv"].ranks, out["rootsift-bow-sv-compact"].ranks)
    (ram_fp, ram_bound), (cp_fp, cp_bound) = (
        prints["rootsift-bow-sv"],
        prints["rootsift-bow-sv-compact"],
    )
    assert "postings" in ram_fp.ram and "postings" not in cp_fp.ram and cp_fp.disk["postings"] > 0
    # what the index holds is smaller, and so is the build's peak (the bound checked before a run)
    assert cp_fp.ram_bytes_per_image < ram_fp.ram_bytes_per_image and cp_bound < ram_bound
    assert cp_fp.ram_bytes_per_image < 16  # the words' offsets; the lists and the words are mapped
    assert np.array_equal(out["rootsift-bow-sv"].scores, out["rootsift-bow-sv-compact"].scores)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 40),
    n_words=st.integers(1, 30),
    density=st.floats(0.0, 0.6),
    block=st.integers(1, 20),
    cuts=st.lists(st.integers(0, 40), max_size=4),
    seed=st.integers(0, 2**16),
)
def test_the_streamed_build_writes_the_files_of_the_whole_matrix(
    tmp_path_factory: pytest.TempPathFactory,
    n: int,
    n_words: int,
    density: float,
    block: int,
    cuts: list[int],
    seed: int,
) -> None:
    """Chunks of database rows merged through temporary runs give byte for byte the files that
    :meth:`CompressedPostings.write` gives for the whole matrix, whatever the chunks and blocks."""
    import oxbench.index.postings as P

    d = tmp_path_factory.mktemp("streamed")
    m = sp.random(n, n_words, density=density, format="csr", dtype=np.float32, random_state=seed)
    bounds = [0, *sorted(min(c, n) for c in cuts), n]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(P, "BLOCK_POSTINGS", block)
        whole = CompressedPostings.write(m.T.tocsr(), d / "whole")
        streamed = CompressedPostings.build(
            (m[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)), n_words, d / "streamed"
        )
    for name in ("ids.bin", "weights.npy", "offsets.npy", "meta.json"):
        assert (d / "whole" / name).read_bytes() == (d / "streamed" / name).read_bytes(), name
    assert sorted(p.name for p in (d / "streamed").iterdir()) == [
        "ids.bin",
        "ids.bin.written.json",  # the mapped files' write-time identity (oxbench.cache)
        "meta.json",
        "offsets.npy",
        "weights.npy",
        "weights.npy.written.json",
    ]
    q = sp.random(3, n_words, density=0.5, format="csr", dtype=np.float32, random_state=seed + 1)
    assert np.array_equal(streamed.scores_of_vectors(q), whole.scores_of_vectors(q))
    with pytest.raises(InputError, match="words"):
        CompressedPostings.build(
            [sp.csr_matrix((2, n_words + 1), dtype=np.float32)], n_words, d / "bad"
        )


def test_the_streamed_build_removes_what_a_killed_build_left(tmp_path: Path) -> None:
    """A build runs in a temporary folder beside the lists: one a build killed over an hour ago
    left (it says it builds this folder) goes; a fresh one (a build still running) stays."""
    import json
    import os
    import time

    from oxbench.fileio import TEMP_PREFIX
    from oxbench.storage import BUILDING_NAME

    folder = tmp_path / "lists"
    stale, live = tmp_path / f"{TEMP_PREFIX}lists.dead", tmp_path / f"{TEMP_PREFIX}lists.live"
    for t in (stale, live):
        (t / f"{TEMP_PREFIX}runs.x").mkdir(parents=True)
        (t / BUILDING_NAME).write_text(json.dumps({"builds": "lists"}))
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    m = sp.random(20, 9, density=0.3, format="csr", dtype=np.float32, random_state=0)
    CompressedPostings.build([m[:10], m[10:]], 9, folder)
    assert not stale.exists() and live.exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(TEMP_PREFIX)]


def test_a_postings_cache_folder_replaced_by_a_link_is_refused_not_written_through(tmp_path):
    """Issue 43 case 5: the mapped lists' cache folder replaced by a symlink to a foreign folder:
    the run is refused in one line and nothing is written into, or deleted from, the target."""
    import os
    import shutil

    pytest.importorskip("cv2")
    from oxbench.errors import InputError
    from oxbench.pipelines import RunContext, resolve_method
    from test_pipeline import load_tiny, make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")

    def run():
        ctx = RunContext(tmp_path / "cache", progress=False)
        method = resolve_method(
            "rootsift-bow",
            **{"vocabulary.size": 200},
            inverted_file="mapped",
            **tiny("rootsift-bow"),
        ).build()
        return method.fit(train, ctx).index(bench, ctx)

    run()
    [kind] = list((tmp_path / "cache").glob("*/postings"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    stale = foreign / ".oxbench-tmp-not-ours"
    stale.write_bytes(b"theirs")
    os.utime(stale, (0, 0))
    shutil.rmtree(kind)
    kind.symlink_to(foreign, target_is_directory=True)
    with pytest.raises(InputError, match="symbolic link") as info:
        run()
    assert "\n" not in str(info.value)
    assert sorted(p.name for p in foreign.iterdir()) == [stale.name]
