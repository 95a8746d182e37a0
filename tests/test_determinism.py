"""Deterministic mode: the default vocabulary step gives the same bits whatever the BLAS thread
count and the number of workers, and the run records the mode."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from oxbench.cache import load_npz
from oxbench.execution import determinism
from oxbench.pipelines import RecordOptions, Session, run
from test_pipeline import make_tiny_root

pytest.importorskip("faiss")
pytest.importorskip("cv2")

#: The default method with a tiny vocabulary (the step is the default one; only its size is small).
METHOD = "rootsift-bow-sv-qe"
TINY = {"vocabulary.size": 64}


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_root(tmp_path_factory.mktemp("data"))


def test_single_threaded_sets_and_restores_the_thread_pools() -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    from oxbench.index.faiss_setup import load_faiss

    faiss = load_faiss(2)
    with threadpool_limits(limits=2):
        assert not determinism.active() and determinism.cache_key() == {}
        with determinism.single_threaded():
            assert determinism.active() and determinism.cache_key() == {"deterministic": True}
            assert all(p["num_threads"] == 1 for p in threadpool_info())
            assert faiss.omp_get_max_threads() == 1
            load_faiss(8)  # an explicit count does not undo the mode
            assert faiss.omp_get_max_threads() == 1
        assert not determinism.active() and faiss.omp_get_max_threads() == 2
        with determinism.single_threaded(False):
            assert not determinism.active()


def _vocabulary_run(root: Path, tmp: Path, tag: str, *, workers: int, blas: int) -> dict:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=blas):
        out = run(
            "synthetic",
            METHOD,
            overrides=TINY,
            session=Session(
                root=root,
                cache=tmp / f"cache-{tag}",
                workers=workers,
                progress=False,
                deterministic=True,
            ),
            record=RecordOptions(out=tmp / f"runs-{tag}"),
        )
    (voc,) = (tmp / f"cache-{tag}" / "vocabularies").glob("*.npz")
    record = json.loads((out.run_dir / "record.json").read_text())
    return {"voc": load_npz(voc, what="vocabulary"), "record": record, "ranks": out.run_dir}


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="process workers are measured on Linux")
def test_default_vocabulary_is_bit_identical_across_blas_threads_and_workers(
    tiny_root: Path, tmp_path: Path
) -> None:
    runs = {
        (workers, blas): _vocabulary_run(
            tiny_root, tmp_path, f"w{workers}b{blas}", workers=workers, blas=blas
        )
        for workers, blas in ((1, 1), (1, 2), (2, 1), (2, 2))
    }
    first = runs[(1, 1)]
    assert first["voc"]["centroids"].shape[0] == TINY["vocabulary.size"]
    for key, other in runs.items():
        assert other["record"]["deterministic"] is True, key
        assert other["record"]["cache"]["vocabulary"] == "computed", key  # each trained its own
        assert other["voc"]["centroids"].tobytes() == first["voc"]["centroids"].tobytes(), key
        # the words assigned in the workers, and so the rankings, follow
        np.testing.assert_array_equal(
            np.load(other["ranks"] / "ranks.npy"), np.load(first["ranks"] / "ranks.npy")
        )
    # the mode has its own vocabulary cache entry: a run without it does not reuse one
    plain = run(
        "synthetic",
        METHOD,
        overrides=TINY,
        session=Session(root=tiny_root, cache=tmp_path / "cache-w1b1", progress=False),
        record=RecordOptions(out=tmp_path / "runs-plain"),
    )
    record = json.loads((plain.run_dir / "record.json").read_text())
    assert record["deterministic"] is False and record["cache"]["vocabulary"] == "computed"
    assert len(list((tmp_path / "cache-w1b1" / "vocabularies").glob("*.npz"))) == 2
