"""The contiguous, memory-mapped ASMK inverted file against the kernel written from the paper and
against the ``asmk`` package's inverted file (today's path of the ASMK family)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oxbench.errors import InputError
from oxbench.evaluation.kernels import ACCELERATED, _accel
from oxbench.index.asmk_file import (
    AsmkEntries,
    AsmkInvertedFile,
    binarize_residuals,
    selectivity_table,
)
from oxbench.index.word_lists import scatter_hamming


def random_images(rng: np.random.Generator, n_images: int, n_words: int, dim: int):
    """Per image: distinct words and real-valued aggregated residuals (some images empty)."""
    out = []
    for _ in range(n_images):
        k = int(rng.integers(0, min(n_words, 6) + 1))
        words = np.sort(rng.choice(n_words, size=k, replace=False)).astype(np.int64)
        out.append((words, rng.standard_normal((k, dim)).astype(np.float32)))
    return out


def entries(images, chunk: int) -> list[AsmkEntries]:
    chunks = []
    for a in range(0, len(images), chunk):
        part = images[a : a + chunk]
        owners = np.concatenate([np.full(len(w), i, np.int64) for i, (w, _) in enumerate(part)])
        words = np.concatenate([w for w, _ in part])
        dim = part[0][1].shape[1]
        res = np.concatenate([r for _, r in part]).reshape(-1, dim)
        chunks.append(AsmkEntries(len(part), owners, words, binarize_residuals(res)))
    return chunks


def reference_scores(images, q_words, q_res, *, alpha, tau, use_idf):
    """The ASMK similarity written from Tolias et al. (ICCV 2013), one image pair at a time:
    sign vectors, u = 1 - 2 h / d, sigma(u) = u^alpha for u >= tau, idf-weighted, normalised by
    sqrt of each side's (idf-weighted) number of words."""
    n = len(images)
    df: dict[int, int] = {}
    for words, _ in images:
        for w in words.tolist():
            df[w] = df.get(w, 0) + 1
    idf = {w: (math.log(n / c) ** 2 if use_idf else 1.0) for w, c in df.items()}
    q_sign = {int(w): r > 0 for w, r in zip(q_words, q_res, strict=True)}
    q_norm = sum(idf.get(w, 1.0) for w in q_sign)
    out = np.zeros(n)
    for i, (words, res) in enumerate(images):
        norm = sum(idf[w] for w in words.tolist())
        total = 0.0
        for w, r in zip(words.tolist(), res, strict=True):
            if w not in q_sign:
                continue
            d = len(r)
            u = 1 - 2 * int(np.sum(q_sign[w] != (r > 0))) / d
            if u >= tau:
                total += idf[w] * u**alpha
        out[i] = total / math.sqrt(norm * q_norm) if norm * q_norm else 0.0
    return out


def test_selectivity_table_is_the_papers_function():
    t = selectivity_table(128, 3.0, 0.0)
    assert t[0] == 1.0 and t[64] == 0.0 and (t[65:] == 0).all()
    assert t[32] == pytest.approx(0.5**3)
    # a negative threshold keeps negative similarities with their sign (sign(u)|u|^alpha)
    assert selectivity_table(128, 3.0, -0.5)[96] == pytest.approx(-(0.5**3))
    assert selectivity_table(128, 3.0, -0.5)[97] == 0.0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_images=st.integers(1, 30),
    n_words=st.integers(1, 12),
    dim=st.sampled_from([64, 128]),
    chunk=st.integers(1, 8),
    alpha=st.sampled_from([1.0, 3.0]),
    tau=st.sampled_from([-0.25, 0.0, 0.1]),
    use_idf=st.booleans(),
)
def test_scores_equal_the_paper_kernel(
    tmp_path_factory, seed, n_images, n_words, dim, chunk, alpha, tau, use_idf
):
    rng = np.random.default_rng(seed)
    images = random_images(rng, n_images, n_words, dim)
    if not any(len(w) for w, _ in images):
        images[0] = (np.array([0], np.int64), rng.standard_normal((1, dim)).astype(np.float32))
    ivf = AsmkInvertedFile.build(
        entries(images, chunk), n_words, dim, tmp_path_factory.mktemp("ivf"), use_idf=use_idf
    )
    q_words = rng.choice(n_words, size=min(n_words, 4), replace=False)
    q_res = rng.standard_normal((len(q_words), dim)).astype(np.float32)
    got = ivf.scores(binarize_residuals(q_res), q_words, alpha=alpha, tau=tau)
    want = reference_scores(images, q_words, q_res, alpha=alpha, tau=tau, use_idf=use_idf)
    assert got.dtype == np.float32 and got.shape == (n_images,)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_chunking_does_not_change_the_file(tmp_path):
    rng = np.random.default_rng(3)
    images = random_images(rng, 40, 9, 128)
    AsmkInvertedFile.build(entries(images, 40), 9, 128, tmp_path / "a")
    many = AsmkInvertedFile.build(entries(images, 3), 9, 128, tmp_path / "b")
    for name in ("codes.npy", "ids.npy", "offsets.npy", "norms.npy"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    ids, codes = many.posting(2)
    assert (np.diff(ids.astype(np.int64)) > 0).all() and codes.shape[1] == 2
    assert many.n_postings == sum(len(w) for w, _ in images)


@pytest.mark.parametrize("use_idf", [False, True])
def test_scores_equal_the_asmk_packages_inverted_file(tmp_path, use_idf):
    """Today's ASMK family path (the package's IVF with its Hamming kernel) on the same codes."""
    pytest.importorskip("asmk")
    from asmk import functional, hamming
    from asmk.inverted_file import IVF

    rng = np.random.default_rng(11)
    n_words, dim = 50, 128
    images = random_images(rng, 200, n_words, dim)
    images[-1] = (np.array([1, 7]), rng.standard_normal((2, dim)).astype(np.float32))
    pkg = IVF.initialize_empty(codebook_size=n_words, use_idf=use_idf)
    owners = np.concatenate([np.full(len(w), i, np.int64) for i, (w, _) in enumerate(images)])
    res = np.concatenate([r for _, r in images])
    pkg.add(
        hamming.binarize_and_pack_2D(res), np.concatenate([w for w, _ in images]), owners.copy()
    )
    ours = AsmkInvertedFile.build(entries(images, 64), n_words, dim, tmp_path, use_idf=use_idf)

    def similarity(qvec, vecs, image_ids):  # the family's (families/asmk.py)
        sim = 1.0 - 2.0 * hamming.hamming_cdist_packed(qvec.reshape(1, -1), vecs).squeeze(0)
        return functional.asmk_kernel(sim, image_ids, alpha=3.0, similarity_threshold=0.0)

    for _ in range(5):
        q_words = rng.choice(n_words, size=20, replace=False)
        q_res = rng.standard_normal((20, dim)).astype(np.float32)
        ranked, values = pkg.search(
            hamming.binarize_and_pack_2D(q_res), q_words, similarity_func=similarity, topk=None
        )
        want = np.zeros(len(images), np.float32)
        want[np.asarray(ranked)] = values
        got = ours.scores(binarize_residuals(q_res), q_words)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        assert np.count_nonzero(got) > 0


def test_bad_input_is_one_line(tmp_path):
    codes = np.zeros((2, 2), np.uint64)
    twice = AsmkEntries(1, np.array([0, 0]), np.array([3, 3]), codes)
    with pytest.raises(InputError, match="holds a word twice"):
        AsmkInvertedFile.build([twice], 5, 128, tmp_path / "a")
    outside = AsmkEntries(1, np.array([0, 0]), np.array([3, 5]), codes)
    with pytest.raises(InputError, match="word outside"):
        AsmkInvertedFile.build([outside], 5, 128, tmp_path / "b")
    with pytest.raises(InputError, match="expected"):
        AsmkInvertedFile.build(
            [AsmkEntries(1, np.array([0]), np.array([1]), codes)], 5, 128, tmp_path / "c"
        )
    with pytest.raises(InputError, match="multiple of 64"):
        binarize_residuals(np.zeros((1, 100)))
    ok = AsmkInvertedFile.build(
        [AsmkEntries(2, np.array([0, 1]), np.array([1, 1]), codes)], 5, 128, tmp_path / "d"
    )
    with pytest.raises(InputError, match="distinct"):
        ok.scores(np.zeros((2, 2), np.uint64), np.array([1, 1]))
    with pytest.raises(InputError, match="uint64"):
        ok.scores(np.zeros((1, 3), np.uint64), np.array([1]))


def test_a_replaced_mapped_file_is_refused(tmp_path):
    from oxbench.cache import CorruptCache

    codes = np.zeros((2, 2), np.uint64)
    AsmkInvertedFile.build(
        [AsmkEntries(2, np.array([0, 1]), np.array([1, 1]), codes)], 5, 128, tmp_path
    )
    ids = np.load(tmp_path / "ids.npy")
    np.save(tmp_path / "ids.npy", ids[::-1].copy())  # same shape, other file
    with pytest.raises(CorruptCache):
        AsmkInvertedFile.open(tmp_path)


# --- the family's run path: inverted_file=mapped against the package's ---------------------------


@pytest.mark.slow
def test_the_asmk_family_ranks_the_same_with_the_mapped_inverted_file(tmp_path, monkeypatch):
    pytest.importorskip("asmk")
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    from oxbench.pipelines import RunContext, resolve_method
    from test_pipeline import load_tiny, make_tiny_root, tiny

    root = make_tiny_root(tmp_path / "data")
    bench, train = load_tiny(root), load_tiny(root, "synthetic-train")
    out = {}
    for lists in ("memory", "mapped"):
        ctx = RunContext(tmp_path / "cache", progress=False)
        method = (
            resolve_method(
                "rootsift-asmk",
                **{"vocabulary.size": 200},
                inverted_file=lists,
                **tiny("rootsift-asmk"),
            )
            .build()
            .fit(train, ctx)
            .index(bench, ctx)
        )
        out[lists] = (method.search(bench, ctx), method.footprint())
        if lists == "mapped":  # batches of 3 queries (3 rows of 40 scores): the same scores
            from oxbench.pipelines.families import asmk

            monkeypatch.setattr(asmk, "SCORE_ROWS_BYTES", 3 * 8 * 40)
            assert asmk.query_batch(40) == 3
            again = method.search(bench, ctx)
            np.testing.assert_array_equal(again.scores, out[lists][0].scores)
    (pkg, _), (mapped, fp) = out["memory"], out["mapped"]
    np.testing.assert_allclose(mapped.scores, pkg.scores, rtol=1e-5, atol=1e-7)
    assert (mapped.scores[:, 0] > 0).all()
    # equal scores rank alike (ties, at equal scores, by index in both)
    np.testing.assert_array_equal(mapped.ranks, pkg.ranks)
    assert fp is not None and fp.disk["asmk_lists"] > 0 and fp.ram["norms"] == 8 * 40
    with pytest.raises(InputError, match="inverted_file"):
        resolve_method("rootsift-asmk", inverted_file="compressed")


def test_queries_scored_together_score_as_each_alone(tmp_path):
    rng = np.random.default_rng(5)
    images = random_images(rng, 60, 10, 128)
    ivf = AsmkInvertedFile.build(entries(images, 16), 10, 128, tmp_path, use_idf=True)
    queries = []
    for k in (4, 0, 7, 10):  # an empty query too
        w = rng.choice(10, size=k, replace=False)
        queries.append((binarize_residuals(rng.standard_normal((k, 128))), w))
    together = ivf.scores_of_queries(queries, alpha=3.0, tau=0.1)
    assert together.shape == (4, 60) and together.dtype == np.float32
    for row, (c, w) in zip(together, queries, strict=True):
        np.testing.assert_array_equal(row, ivf.scores(c, w, alpha=3.0, tau=0.1))
    assert not together[1].any() and together[3].any()
    assert ivf.scores_of_queries([]).shape == (0, 60)


needs_accel = pytest.mark.skipif(
    not ACCELERATED or not hasattr(_accel, "asmk_scatter"),
    reason="compiled extension oxbench.evaluation._accel (with asmk_scatter) not built: setup.py",
)


def scores_both_ways(monkeypatch, ivf, queries, **kw):
    """``scores_of_queries`` through the compiled kernel and through numpy."""
    monkeypatch.delenv("OXBENCH_NO_ACCEL", raising=False)
    compiled = ivf.scores_of_queries(queries, **kw)
    monkeypatch.setenv("OXBENCH_NO_ACCEL", "1")
    plain = ivf.scores_of_queries(queries, **kw)
    monkeypatch.delenv("OXBENCH_NO_ACCEL")
    return compiled, plain


@needs_accel
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    n_images=st.integers(1, 80),
    n_words=st.integers(1, 10),
    dim=st.sampled_from([64, 128, 192, 256]),
    alpha=st.sampled_from([1.0, 3.0]),
    tau=st.sampled_from([-1.0, -0.25, 0.0, 0.1]),
    use_idf=st.booleans(),
    n_queries=st.integers(1, 4),
)
def test_the_compiled_kernel_scores_as_numpy_to_the_bit(
    tmp_path_factory, seed, n_images, n_words, dim, alpha, tau, use_idf, n_queries
):
    rng = np.random.default_rng(seed)
    images = random_images(rng, n_images, n_words, dim)
    ivf = AsmkInvertedFile.build(
        entries(images, 7), n_words, dim, tmp_path_factory.mktemp("ivf"), use_idf=use_idf
    )
    queries = []
    for _ in range(n_queries):
        w = rng.choice(n_words, size=int(rng.integers(0, n_words + 1)), replace=False)
        codes = binarize_residuals(rng.standard_normal((len(w), dim)))
        if len(w):  # every Hamming distance: a copy of a posting and its complement
            i, j = int(rng.integers(ivf.n_postings or 1)), int(rng.integers(len(w)))
            if ivf.n_postings:
                codes[j] = ivf._codes[i] ^ (np.uint64(2**64 - 1) if rng.random() < 0.5 else 0)
        queries.append((codes, w))
    with pytest.MonkeyPatch.context() as m:
        compiled, plain = scores_both_ways(m, ivf, queries, alpha=alpha, tau=tau)
    np.testing.assert_array_equal(compiled.view(np.uint32), plain.view(np.uint32))


@needs_accel
def test_the_kernel_adds_exactly_what_numpy_adds_before_rounding():
    """The float64 sums themselves (before the float32 scores) are equal, on a list long enough to
    take the unrolled paths, for each code width."""
    rng = np.random.default_rng(11)
    for k in (1, 2, 3, 4):
        m, n = 5000, 7000
        ids = rng.choice(n, size=m, replace=False).astype(np.uint32)
        codes = rng.integers(0, 2**64, size=(m, k), dtype=np.uint64)
        q = codes[17] ^ np.uint64(0xFF)  # h = 8 for one posting, the rest near 32 k
        weights = rng.standard_normal(64 * k + 1)
        start = rng.standard_normal(n)
        got = start.copy()
        assert _accel.asmk_scatter(got, ids, codes, q, weights) == 0
        h = sum(np.bitwise_count(codes[:, j] ^ q[j]).astype(np.int64) for j in range(k))
        want = start.copy()
        np.add.at(want, ids, weights[h])
        np.testing.assert_array_equal(got.view(np.uint64), want.view(np.uint64))


@needs_accel
def test_the_kernel_refuses_what_it_cannot_handle_and_writes_nothing():
    """An anomaly is a non-zero status with the scores untouched (the numpy path then runs)."""
    rng = np.random.default_rng(2)
    ids = np.array([0, 3, 5], np.uint32)
    codes = rng.integers(0, 2**64, size=(3, 2), dtype=np.uint64)
    q, w = codes[0].copy(), np.linspace(1, 0, 129)
    cases = {
        "id out of range": (np.zeros(5), ids, codes, q, w),
        "non-contiguous codes": (np.zeros(6), ids, np.asfortranarray(codes), q, w),
        "strided ids": (np.zeros(6), np.array([0, 9, 3, 9, 5, 9], np.uint32)[::2], codes, q, w),
        "int32 ids": (np.zeros(6), ids.astype(np.int32), codes, q, w),
        "float32 scores": (np.zeros(6, np.float32), ids, codes, q, w),
        "read-only scores": (np.zeros(6), ids, codes, q, w),
        "short weights": (np.zeros(6), ids, codes, q, w[:128]),
        "query of another width": (np.zeros(6), ids, codes, codes[0, :1].copy(), w),
        "ids and codes differ in length": (np.zeros(6), ids[:2], codes, q, w),
        "big-endian weights": (np.zeros(6), ids, codes, q, w.astype(">f8")),
    }
    cases["read-only scores"][0].flags.writeable = False
    for name, args in cases.items():
        before = np.array(args[0], copy=True)
        assert _accel.asmk_scatter(*args) != 0, name
        np.testing.assert_array_equal(args[0], before, err_msg=name)
    good = np.zeros(6)
    assert _accel.asmk_scatter(good, ids, codes, q, w) == 0 and good[0] == 1.0


def test_a_refused_list_is_scored_by_numpy(tmp_path, monkeypatch):
    """Lists the kernel does not take (here: codes not C-contiguous) give numpy's scores."""
    rng = np.random.default_rng(8)
    images = random_images(rng, 50, 6, 128)
    ivf = AsmkInvertedFile.build(entries(images, 50), 6, 128, tmp_path, use_idf=True)
    queries = [(binarize_residuals(rng.standard_normal((4, 128))), np.array([0, 2, 3, 5]))]
    want = ivf.scores_of_queries(queries, alpha=3.0, tau=0.0)
    ivf._codes = np.asfortranarray(ivf._codes)  # every slice of it is strided
    np.testing.assert_array_equal(ivf.scores_of_queries(queries, alpha=3.0, tau=0.0), want)
    monkeypatch.setenv("OXBENCH_NO_ACCEL", "1")
    np.testing.assert_array_equal(ivf.scores_of_queries(queries, alpha=3.0, tau=0.0), want)


def test_a_complement_code_at_256_bits_scores_minus_one():
    """h = d = 256 does not wrap in numpy's uint8 popcounts: u = -1 keeps its weight."""
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 2**64, size=(1, 4), dtype=np.uint64)
    ivf_codes = np.concatenate([codes, ~codes])
    w = selectivity_table(256, 1.0, -1.0)
    with pytest.MonkeyPatch.context() as m:
        for env in ("1", "0"):
            m.setenv("OXBENCH_NO_ACCEL", env)
            s = np.zeros(2)
            scatter_hamming(s, np.array([0, 1], np.uint32), ivf_codes, codes[0], w)
            assert s.tolist() == [1.0, -1.0]
