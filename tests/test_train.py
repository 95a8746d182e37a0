"""Training: pairs from labels, hard-negative mining, the contrastive loss, SfM-120k tuples, a tiny
resumable training run whose checkpoint loads back, and ``oxbench train`` end to end."""

from __future__ import annotations

import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth, Query
from oxbench.pipelines import RecordOptions, Session
from oxbench.train.loop import TrainConfig, TrainingSet, mine_negatives
from oxbench.train.pairs import image_clusters, landmark_of_queries, matching_pairs


def small_gt() -> GroundTruth:
    a = np.array
    queries = (
        Query("q_a1", easy=a([0, 1]), hard=a([2]), junk=a([3])),
        Query("q_a2", easy=a([1]), junk=a([4])),
        Query("q_b1", easy=a([5, 6])),
    )
    return GroundTruth("toy", "revisited", tuple(f"im{i}" for i in range(9)), queries)


def test_pairs_landmarks_and_clusters() -> None:
    gt = small_gt()
    assert matching_pairs(gt).tolist() == [[9, 0], [9, 1], [9, 2], [10, 1], [11, 5], [11, 6]]
    assert landmark_of_queries(gt).tolist() == [0, 0, 1]  # a1 and a2 share image 1
    cluster, maybe = image_clusters(gt)
    assert cluster.tolist() == [0, 0, 0, -4, -5, 1, 1, -8, -9, 0, 0, 1]
    assert maybe[0].tolist() == [0, 1, 2, 3, 4, 9, 10] and maybe[1].tolist() == [5, 6, 11]
    with pytest.raises(InputError, match="no query has a positive"):
        matching_pairs(GroundTruth("e", "revisited", ("x",), (Query("q"),)))


def test_hard_negatives_skip_the_landmark_and_take_one_per_cluster() -> None:
    gt = small_gt()
    cluster, maybe = image_clusters(gt)
    ts = TrainingSet(
        lambda i: np.zeros((1, 1, 3), np.uint8), 12, matching_pairs(gt), cluster, maybe
    )
    pool = np.arange(12)
    # similarity to the anchor (query 9) decreases with the index, except image 7 is the most similar
    anchor = np.array([[1.0, 0.0]], np.float32)
    sims = np.linspace(1.0, 0.0, 12)
    sims[7] = 2.0
    pool_desc = np.stack([sims, np.zeros(12)], axis=1).astype(np.float32)
    negs = mine_negatives(anchor, pool_desc, pool, np.array([9]), ts, 3)
    # 7 (hardest), then 5 (landmark b; 6 is the same cluster, skipped), then 8; never 0-4 / 9 / 10
    assert negs.tolist() == [[7, 5, 8]]
    assert mine_negatives(anchor, pool_desc, pool, np.array([9]), ts, 5).tolist() == [
        [7, 5, 8, -1, -1]
    ]


def test_contrastive_loss_formula() -> None:
    torch = pytest.importorskip("torch")
    from oxbench.train.loop import contrastive_loss

    a = torch.tensor([[[1.0, 0.0]]])
    others = torch.tensor([[[0.0, 1.0], [1.0, 0.0], [0.6, 0.8]]])
    labels = torch.tensor([1.0, 0.0, 0.0])
    d = [np.sqrt(2.0), 0.0, np.sqrt(0.16 + 0.64)]
    want = 0.5 * d[0] ** 2 + 0.5 * max(0.0, 0.85 - d[1]) ** 2 + 0.5 * max(0.0, 0.85 - d[2]) ** 2
    assert float(contrastive_loss(a, others, labels, 0.85)) == pytest.approx(want, rel=1e-6)


def write_fake_sfm(folder: Path) -> tuple[Path, Path]:
    from PIL import Image

    cids = [f"{i:08x}abcdef{i:02d}" for i in range(6)]
    rng = np.random.default_rng(0)
    for cid in cids:
        from oxbench.train.sfm import cid_path

        path = cid_path(folder / "ims", cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (30, 40, 3), dtype=np.uint8)).save(path, format="JPEG")
    db = {
        "train": {"cids": cids, "qidxs": [0, 3], "pidxs": [1, 4], "cluster": [0, 0, 0, 1, 1, 2]},
        "val": {"cids": [], "qidxs": [], "pidxs": [], "cluster": []},
    }
    pkl = folder / "retrieval-SfM-120k.pkl"
    pkl.write_bytes(pickle.dumps(db))
    return pkl, folder / "ims"


def test_sfm120k_pickle(tmp_path: Path) -> None:
    pytest.importorskip("PIL.Image")
    from oxbench.train.sfm import cid_path, sfm_training_set

    assert cid_path("ims", "abcdef123456") == Path("ims/56/34/12/abcdef123456")
    pkl, ims = write_fake_sfm(tmp_path)
    ts = sfm_training_set(pkl, ims, 20)
    assert (
        ts.n == 6
        and ts.pairs.tolist() == [[0, 1], [3, 4]]
        and ts.cluster.tolist() == [0, 0, 0, 1, 1, 2]
    )
    assert ts.read(2).shape == (15, 20, 3) and [e.tolist() for e in ts.exclude] == [
        [0, 1, 2],
        [3, 4],
        [5],
    ]
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(
        pickle.dumps({"train": {"cids": ["a"], "qidxs": [0], "pidxs": [3], "cluster": [0]}})
    )
    with pytest.raises(InputError, match="indices outside 0..0"):
        sfm_training_set(bad, ims, 20)
    bad.write_bytes(pickle.dumps({"train": {"cids": ["a"]}}))
    with pytest.raises(InputError, match="lacks qidxs, pidxs, cluster"):
        sfm_training_set(bad, ims, 20)
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"train": np.zeros(2)}))
    with pytest.raises(InputError, match="refusing to load"):
        sfm_training_set(evil, ims, 20)


def toy_training_set(n_clusters: int = 4, per: int = 4) -> TrainingSet:
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, (n_clusters, 32, 32, 3))
    images = [
        np.clip(base[c] + rng.integers(-20, 20, (32, 32, 3)), 0, 255).astype(np.uint8)
        for c in range(n_clusters)
        for _ in range(per)
    ]
    cluster = np.repeat(np.arange(n_clusters), per)
    pairs = np.array([(c * per, c * per + j) for c in range(n_clusters) for j in range(1, per)])
    exclude = [np.nonzero(cluster == c)[0] for c in range(n_clusters)]
    return TrainingSet(images.__getitem__, len(images), pairs, cluster, exclude, source="toy")


def test_tiny_training_resumes_and_writes_the_model_file_run_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    from oxbench.features.deep.model import build_net
    from oxbench.train import loop
    from oxbench.train.loop import describe, train

    torch.set_num_threads(1)
    cfg = TrainConfig(
        epochs=2,
        tuples=4,
        neg_num=2,
        batch_size=2,
        image_size=32,
        random_negative_epochs=1,
        lr_decay=0.5,
    )
    ts = toy_training_set()
    out = tmp_path / "m.pt"
    saved = loop._save_partial

    def crash_after_first_epoch(path, state):  # noqa: ANN001, ANN202
        saved(path, state)
        if state.get("epoch") == 0:
            raise KeyboardInterrupt

    monkeypatch.setattr(loop, "_save_partial", crash_after_first_epoch)
    caplog.set_level(logging.INFO, logger="oxbench.train.loop")
    with pytest.raises(KeyboardInterrupt):
        train(cfg, ts, out, progress=False)
    assert not out.exists() and (tmp_path / "m.pt.partial").is_file()
    # Ctrl-C names the checkpoint a rerun starts from (a warning: shown without -v)
    (stop,) = [r for r in caplog.records if "interrupted" in r.getMessage()]
    assert stop.levelno == logging.WARNING and stop.getMessage() == (
        f"training interrupted: the checkpoint of epoch 1 is kept at {tmp_path / 'm.pt.partial'}; "
        "a rerun resumes from it"
    )
    # the time left of the whole training after epoch 1: one more epoch of about epoch 1's time
    (first,) = [r for r in caplog.records if r.getMessage().startswith("epoch 1/2")]
    assert re.search(r"; ~\d+ s left in all$", first.getMessage()), first.getMessage()
    caplog.clear()
    monkeypatch.setattr(loop, "_save_partial", saved)
    with pytest.raises(InputError, match="partial training of another configuration"):
        train(
            TrainConfig(epochs=3, tuples=4, neg_num=2, batch_size=2, image_size=32),
            ts,
            out,
            progress=False,
        )
    caplog.clear()
    record = train(cfg, ts, out, progress=False)
    assert [h["epoch"] for h in record["history"]] == [1, 2]  # epoch 1 kept from before the crash
    (resume,) = [r for r in caplog.records if r.getMessage().startswith("resuming")]
    assert resume.levelno == logging.WARNING and resume.getMessage().startswith(
        f"resuming the training of {out} after epoch 1 of 2 (checkpoint {tmp_path / 'm.pt.partial'}"
    )
    assert [h["negatives"] for h in record["history"]] == ["random", "hard"]
    # the learning-rate schedule follows the epoch, also across the resume
    assert [h["lr"] for h in record["history"]] == pytest.approx(
        [1e-3, 1e-3 * np.exp(-0.5)], rel=1e-9
    )
    assert not (tmp_path / "m.pt.partial").exists()
    # one model format: the deep pipeline's model file, which build_net loads as the run does
    loaded = build_net("resnet18", "gem", weights=out)
    assert (
        loaded.source["format"] == "oxbench train"
        and loaded.source["training"]["config"]["epochs"] == 2
    )
    assert loaded.net.describe()["p"] == pytest.approx(record["history"][-1]["p"], abs=1e-6)
    assert record["lw"].startswith(
        "not learned: learned whitening of 512-dimensional descriptors needs more"
    )
    assert loaded.lw == {}
    images = [ts.read(i) for i in range(3)]
    a = describe(loaded.net, images)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(
        a, describe(build_net("resnet18", "gem", weights="random").net, images), atol=1e-3
    )
    assert (
        train(cfg, ts, out, progress=False)["history"] == record["history"]
    )  # done: nothing to do
    with pytest.raises(InputError, match="model file is resnet18 with gem pooling"):
        build_net("resnet34", "gem", weights=out)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="not a readable torch checkpoint"):
        train(
            TrainConfig(
                epochs=1,
                tuples=2,
                neg_num=1,
                batch_size=2,
                image_size=32,
                init=str(tmp_path / "junk.pt"),
            ),
            ts,
            tmp_path / "n.pt",
            progress=False,
        )


def test_training_from_scratch_learns_the_toy_clusters() -> None:
    """Random initialisation, batch norm in training mode, random negatives: positives end up closer
    than negatives on images of the training set described alone (eval mode)."""
    torch = pytest.importorskip("torch")
    from oxbench.train.loop import describe, train

    torch.set_num_threads(1)
    ts = toy_training_set(n_clusters=4, per=4)

    def margin_of(net) -> float:  # noqa: ANN001
        d = describe(net, [ts.read(i) for i in range(ts.n)])
        s = d @ d.T
        same = ts.cluster[:, None] == ts.cluster[None, :]
        np.fill_diagonal(same, False)
        other = ts.cluster[:, None] != ts.cluster[None, :]
        return float(s[same].mean() - s[other].mean())

    from oxbench.features.deep.model import build_net

    before = margin_of(build_net("resnet18", "gem", weights="random").net)
    cfg = TrainConfig(
        epochs=3, tuples=12, neg_num=2, batch_size=4, image_size=32, random_negative_epochs=3
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        train(cfg, ts, Path(tmp) / "m.pt", progress=False)
        after = margin_of(build_net("resnet18", "gem", weights=Path(tmp) / "m.pt").net)
    assert after > before + 0.1, (before, after)


def test_random_negatives_by_default_only_from_a_random_initialisation() -> None:
    assert TrainConfig().random_epochs == TrainConfig().epochs == 40
    assert (
        TrainConfig(init="model.pt").random_epochs == 0
        and TrainConfig(init="imagenet").random_epochs == 0
    )
    assert TrainConfig(random_negative_epochs=2).random_epochs == 2
    with pytest.raises(InputError, match=r"option --random-negative-epochs: must be in \[0, "):
        TrainConfig(random_negative_epochs=-1)
    with pytest.raises(InputError, match=r"option --lr-decay: must be in \[0, 100\], got -0.01"):
        TrainConfig(lr_decay=-0.01)


def test_random_negatives_and_augmentation() -> None:
    from oxbench.train.loop import augment_image, random_negatives

    gt = small_gt()
    cluster, maybe = image_clusters(gt)
    ts = TrainingSet(
        lambda i: np.zeros((1, 1, 3), np.uint8), 12, matching_pairs(gt), cluster, maybe
    )
    negs = random_negatives(np.arange(12), np.array([9, 11]), ts, 3, np.random.default_rng(0))
    assert not set(negs[0].tolist()) & set(maybe[0].tolist())  # never an image landmark a may show
    assert not set(negs[1].tolist()) & {5, 6, 11}
    assert len({int(cluster[i]) for i in negs[0]}) == 3  # one per landmark / cluster
    # anchor 9 (landmark a) has 5, 6 (b, one cluster), 7, 8: three clusters, so no -1; a fourth is -1
    assert (
        random_negatives(np.arange(12), np.array([9]), ts, 4, np.random.default_rng(1))[0] == -1
    ).sum() == 1
    im = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
    a, b = augment_image(im, np.random.default_rng(5)), augment_image(im, np.random.default_rng(5))
    assert a.shape == im.shape and a.dtype == np.uint8 and np.array_equal(a, b)
    assert not np.array_equal(a, augment_image(im, np.random.default_rng(6)))


def test_easy_positives_from_the_labels(tmp_path: Path) -> None:
    pytest.importorskip("PIL.Image")
    from oxbench.datasets import load
    from oxbench.train.loop import _training_pairs, benchmark_training_set
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    bench = load("synthetic-train", root, progress=False)
    ts = benchmark_training_set(bench, 32, progress=False)
    assert (
        ts.easy is not None
        and len(ts.easy) == len(ts.pairs)
        and ts.n == bench.gt.n_db + bench.gt.n_queries
    )
    for (a, p), e in zip(ts.pairs.tolist(), ts.easy.tolist(), strict=True):
        q = bench.gt.queries[a - bench.gt.n_db]
        assert e == (p in q.easy.tolist()) and (e or p in q.hard.tolist())
    easy = _training_pairs(TrainConfig(positives="easy"), ts)
    assert len(easy) == int(ts.easy.sum()) and len(
        _training_pairs(TrainConfig(positives="all"), ts)
    ) == len(ts.pairs)
    assert ts.read(0).shape == (24, 32, 3)


def test_oxbench_train_cli_on_the_tiny_training_city(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from oxbench.cli import main
    from test_pipeline import make_tiny_root

    root = make_tiny_root(tmp_path / "data")
    args = [
        "train",
        "--root",
        str(root),
        "--epochs",
        "1",
        "--tuples",
        "2",
        "--neg-num",
        "1",
        "--batch-size",
        "2",
        "--image-size",
        "32",
        "--threads",
        "1",
        "--no-progress",
    ]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code in (0, None), capsys.readouterr().err
    assert (root / "_models" / "gem-r18-synthetic.pt").is_file()
    assert "trained on synthetic-train" in capsys.readouterr().out
    import oxbench

    # the file oxbench train writes is exactly what the gem-r18-synthetic preset loads
    res = oxbench.run(
        "synthetic",
        "gem-r18-synthetic",
        overrides={"descriptor.max_side": 64, "descriptor.scales": [1.0]},
        session=Session(root=root, cache=tmp_path / "c", progress=False),
        record=RecordOptions(runs_dir=tmp_path / "runs"),
    )
    assert (
        res.info["model"]["weights"].startswith("file:sha256=")
        and res.info["model"]["architecture"] == "resnet18"
    )
    assert 0.0 <= res.result.setups["medium"].map <= 1.0
    with pytest.raises(SystemExit) as exc:
        main([*args, "--pooling", "mac"])
    assert (
        exc.value.code == 2
        and "option --pooling: expected one of gem, got 'mac'" in capsys.readouterr().err
    )


def test_synthetic_presets_describe_at_the_default_training_size() -> None:
    from oxbench.pipelines.presets import METHODS

    # a network trained from scratch has learned the features of its training size only
    for name in ("gem-r18-synthetic", "gem-r18-synthetic+lw", "gem-r18-synthetic+w+alpha-qe"):
        kind = METHODS.get(name).descriptor  # type: ignore[attr-defined]
        assert kind.max_side == TrainConfig().image_size and kind.scales == (1.0,), name


def test_import_oxbench_loads_neither_torch_nor_faiss() -> None:
    code = (
        "import sys, oxbench, oxbench.pipelines, oxbench.train.pairs, oxbench.index.search, "
        "oxbench.refinement.diffusion, oxbench.cli.train; "
        "print(sorted(m for m in ('torch', 'faiss', 'torchvision') if m in sys.modules))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")},
    )
    assert res.stdout.strip() == "[]"


def test_batchnorm_calibration_estimates_the_statistics_of_the_images() -> None:
    torch = pytest.importorskip("torch")
    from oxbench.features.deep.model import build_net
    from oxbench.train.loop import _to_tensor, calibrate_batchnorm

    net = build_net("resnet18", "gem", weights="random").net
    images = [toy_training_set().read(i) for i in range(10)]
    calibrate_batchnorm(
        net, images, batch=5
    )  # two batches: their average, not the last batch alone
    with torch.no_grad():
        z = net.features[0](_to_tensor(net, images))  # conv1: the input of the first batch norm
    bn = net.features[1]
    np.testing.assert_allclose(
        bn.running_mean.numpy(), z.mean(dim=(0, 2, 3)).numpy(), rtol=1e-4, atol=1e-5
    )
    assert not net.training and bn.momentum == 0.1


def test_pretrained_init_keeps_batchnorm_frozen(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from oxbench.features.deep.model import build_net, load_model, save_model
    from oxbench.train.loop import train

    torch.set_num_threads(1)
    start = tmp_path / "start.pt"
    save_model(start, build_net("resnet18", "gem", weights="random", seed=3).net)
    cfg = TrainConfig(epochs=1, tuples=4, neg_num=2, batch_size=2, image_size=32, init=str(start))
    record = train(cfg, toy_training_set(), tmp_path / "tuned.pt", progress=False)
    assert [h["negatives"] for h in record["history"]] == ["hard"]  # the published recipe
    before, after = (
        load_model(start).net.state_dict(),
        load_model(tmp_path / "tuned.pt").net.state_dict(),
    )
    stats = [k for k in before if k.endswith(("running_mean", "running_var"))]
    assert stats and all(torch.equal(before[k], after[k]) for k in stats)  # frozen, as published
    assert not torch.equal(
        before["features.0.weight"], after["features.0.weight"]
    )  # the weights trained


def test_time_left_is_the_mean_epoch_times_the_epochs_to_go() -> None:
    from oxbench.train.loop import _time_left

    assert _time_left([], 10) == ""
    assert _time_left([{"seconds": 70.0}], 39) == "~46 min left in all"  # the 70 s epochs
    assert _time_left([{"seconds": 10.0}, {"seconds": 20.0}], 3) == "~45 s left in all"


def test_train_help_shows_number_types(capsys: pytest.CaptureFixture[str]) -> None:
    from oxbench.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for opt in ("--epochs", "--tuples", "--neg-num", "--batch-size", "--image-size", "--seed"):
        assert re.search(rf"{opt} INTEGER\b", text), opt
    for opt in ("--lr", "--lr-decay", "--weight-decay", "--margin"):
        assert re.search(rf"{opt} FLOAT\b", text), opt
    assert "--threads INTEGER" in text and "--random-negative-epochs INTEGER" in text
