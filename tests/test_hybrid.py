"""Hybrid pipelines: a stage that needs another representation gets it from a named source.

- a global short list verified with local features (``local_source``: GeM + SV, VLAD + SV);
- local verification, then diffusion over a global method's vectors started from the verified
  images (``global_source`` + ``diffusion-verified``: the 2018 revisit's "ASMK* + SP -> GeM + DFS").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.pipelines import RecordOptions, Session, resolve_method
from oxbench.refinement.diffusion import Diffusion, DiffusionSettings


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_verified_images_start_the_diffusion_with_the_weight_of_the_query_itself() -> None:
    """Online diffusion over the whole list solves (I - alpha W) f = y with y_i = max(q.x_i, 0)^gamma
    on the query's query_k nearest and y_j = 1 on every seed (Iscen et al. 2017's y, plus the
    verified images of Radenovic et al. 2018's hybrid rows)."""
    rng = np.random.default_rng(0)
    x, q = _unit(rng, 40, 8), _unit(rng, 2, 8)
    s = DiffusionSettings(k=6, query_k=3, truncation=40, iterations=500, tol=1e-12)
    d = Diffusion(s).fit(x)
    ranks = np.argsort(-(q @ x.T), axis=1, kind="stable")
    seeds = [np.array([ranks[0, 30], ranks[0, 35]]), np.array([], np.int64)]
    out_r, out_s = d.rerank(q, ranks, seeds=seeds)
    # the same from the definition: the normalised mutual k-NN graph, a dense solve
    from test_diffusion import ref_affinity, ref_normalise, ref_query_vector

    w = ref_normalise(ref_affinity(x, s.k))
    for qi in range(2):
        top = ranks[qi]
        y = ref_query_vector(x, q[qi], top, s.query_k)
        y[np.isin(top, seeds[qi])] = 1.0
        f = np.linalg.solve(np.eye(40) - s.alpha * w[np.ix_(top, top)], y)
        by_image = dict(zip(out_r[qi].tolist(), out_s[qi].tolist(), strict=True))
        np.testing.assert_allclose(
            [by_image[i] for i in top.tolist()], np.clip(f, 0, None), rtol=1e-4, atol=1e-6
        )
    # without seeds, nothing changes: the plain diffusion's ranks exactly
    plain = d.rerank(q, ranks)
    again = d.rerank(q, ranks, seeds=[np.array([], np.int64)] * 2)
    assert np.array_equal(plain[0], again[0]) and np.array_equal(plain[1], again[1])
    # a seed lifts its image (and its graph neighbours) against the plain run
    pos = {int(v): i for i, v in enumerate(out_r[0])}
    pos_plain = {int(v): i for i, v in enumerate(plain[0][0])}
    assert pos[int(seeds[0][0])] < pos_plain[int(seeds[0][0])]


def test_a_source_a_family_cannot_use_or_a_stage_it_cannot_serve_is_one_line() -> None:
    with pytest.raises(InputError, match="local_source gives local features to a family without"):
        resolve_method("rootsift-bow-sv", local_source="rootsift")
    with pytest.raises(InputError, match="global_source gives dense vectors to a family without"):
        resolve_method("rootsift-vlad-w", global_source="rootsift-vlad")
    with pytest.raises(
        InputError, match="'diffusion-verified' needs dense vectors .its own, or a "
    ):
        resolve_method("rootsift-asmk-sv", rerank="spatial,diffusion-verified")
    with pytest.raises(InputError, match="'diffusion-verified' needs a 'spatial' stage before it"):
        resolve_method("rootsift-asmk-sv+vlad-dfs", rerank="diffusion-verified")
    with pytest.raises(
        InputError,
        match="'spatial' needs local features .a global method's from its local_source., which the global family",
    ):
        resolve_method("rootsift-vlad-w", rerank="spatial")
    from oxbench.pipelines.sources import check_sources

    for name, words in (
        ("rootsift-bow-sv", "is not a global-descriptor method"),
        ("rootsift-vlad-w-aqe", "has stages of its own"),
        ("no-such-preset", "unknown method"),
    ):
        with pytest.raises(InputError, match=words):
            check_sources(resolve_method("rootsift-asmk-sv+vlad-dfs", global_source=name))
    # a local source is any local feature by name, recorded as its settings
    m = resolve_method("rootsift-vlad-w", local_source="sift", rerank="spatial")
    assert m.to_dict()["local_source"]["descriptor"] == "sift"


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("cv2")
    pytest.importorskip("faiss")
    pytest.importorskip("asmk")
    from oxbench.testing import make_tiny_root

    return make_tiny_root(tmp_path_factory.mktemp("data"))


SMALL = {"features.max_side": 320, "features.n_features": 300}
#: The same local features of VLAD (its descriptor kind's).
VLAD_SMALL = {f"descriptor.{k}": v for k, v in SMALL.items()}


def _run(root: Path, tmp: Path, method: object, **overrides: object):  # noqa: ANN202
    import oxbench

    return oxbench.run(
        "synthetic",
        method,
        overrides=overrides,
        session=Session(root=root, cache=tmp / "cache", engine="serial", workers=1, progress=False),
        record=RecordOptions(runs_dir=tmp / "runs"),
    )


@pytest.mark.slow
def test_hybrid_rows_run_beside_their_parts(tiny_root: Path, tmp_path: Path) -> None:
    """VLAD + SV verifies the global short list with RootSIFT; ASMK + SV -> VLAD diffusion seeds the
    diffusion with the verified images: each runs end to end beside its parts, records its source
    and its stages' facts, and differs from its first stage where the stage acts."""
    from oxbench.pipelines import register_method
    from oxbench.pipelines.presets import METHODS
    from oxbench.pipelines.steps.settings import CLASSIC_FEATURES

    local = dataclasses.replace(CLASSIC_FEATURES, max_side=320, n_features=300)
    vlad = METHODS.get("rootsift-vlad-w")
    tiny_vlad = dataclasses.replace(vlad.descriptor, features=local)  # type: ignore[attr-defined]
    register_method(dataclasses.replace(vlad, name="test-tiny-vlad-w", descriptor=tiny_vlad))
    try:
        plain = _run(tiny_root, tmp_path, "rootsift-vlad-w", **VLAD_SMALL)
        sv = _run(
            tiny_root,
            tmp_path,
            "rootsift-vlad-w+sv",
            local_source=local,
            **VLAD_SMALL,
            **{"spatial.top_r": 20},
        )
        assert sv.record["cache"]["local_source_queries"] in ("hit", "computed")
        assert sv.info["local_source"]["max_side"] == 320
        n_verified = sv.info["verified_per_query"]
        assert sum(n_verified) > 0 and max(n_verified) <= 20
        before = np.load(plain.run_dir / "ranks.npy").T
        after = np.load(sv.run_dir / "ranks.npy").T
        assert not np.array_equal(before, after)
        # below the short list, the global order stands
        assert np.array_equal(np.sort(after[:, :20], axis=1), np.sort(before[:, :20], axis=1))
        assert np.array_equal(after[:, 20:], before[:, 20:])

        asmk = {"vocabulary.size": 64, **SMALL, "spatial.top_r": 20}
        part = _run(tiny_root, tmp_path, "rootsift-asmk-sv", **asmk)
        dfs = _run(
            tiny_root,
            tmp_path,
            "rootsift-asmk-sv+vlad-dfs",
            global_source="test-tiny-vlad-w",
            **asmk,
            **{"diffusion-verified.k": 10, "diffusion-verified.truncation": 200},
        )
        assert dfs.info["global_source"]["method"] == "test-tiny-vlad-w"
        verified, seeded = part.info["verified_per_query"], dfs.info["diffusion_seeded_by_verified"]
        # seeds: the verified images strong enough to expand the query (diffusion-verified.min_inliers)
        assert all(0 <= s <= v for s, v in zip(seeded, verified, strict=True)) and sum(seeded) > 0
        first, hybrid = np.load(part.run_dir / "ranks.npy").T, np.load(dfs.run_dir / "ranks.npy").T
        # what the verification proved keeps the head, in its order; diffusion orders the rest
        for qi, v in enumerate(verified):
            assert np.array_equal(hybrid[qi, :v], first[qi, :v])
        assert not np.array_equal(first, hybrid)
    finally:
        METHODS.unregister("test-tiny-vlad-w")


def test_a_global_source_takes_settings_of_its_own() -> None:
    """The published GeM needs its model file: the source names the preset and its settings."""
    from oxbench.pipelines.sources import GlobalSource, check_sources

    source = GlobalSource("gem-r101+w descriptor.weights=models/gem.pt descriptor.batch_size=4")
    kind = source.config.descriptor
    assert kind.weights == "models/gem.pt" and kind.batch_size == 4
    with pytest.raises(InputError, match="global_source: 'weights' is not KEY=VALUE"):
        GlobalSource("gem-r101+w weights")
    with pytest.raises(InputError, match="setting descriptor.batch_size"):
        check_sources(
            resolve_method(
                "rootsift-asmk-sv+gem-r101-dfs",
                global_source="gem-r101+w descriptor.batch_size=nan",
            )
        )
