"""``oxbench train``: fine-tune a backbone + GeM with the contrastive loss and hard-negative mining.

The recipe of Radenovic, Tolias & Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation"
(TPAMI 2018; cirtorch), at a size two CPU cores can run:

- **tuples**: an anchor, one positive, ``neg_num`` negatives. Positive pairs come from the labels:
  on a benchmark used for training (``synthetic-train``, built from its generation parameters, or the
  other real city) each query crop with each of its easy/hard positives
  (:func:`oxbench.train.pairs.matching_pairs`); on SfM-120k the pickle's ``qidxs``/``pidxs``. Every
  epoch ``tuples`` pairs are drawn (seeded by the epoch).
- **hard negatives, mined each epoch**: the network (eval mode) describes a pool of training images
  (``pool_size``, all by default) and each anchor; its negatives are the most similar pool images
  that cannot show its landmark (never an image labelled positive or junk for any query of the
  anchor's landmark; on SfM-120k, never its own cluster), at most one per landmark/cluster, as in
  cirtorch.
- **loss**: contrastive, ``0.5 d^2`` for the positive and ``0.5 max(0, margin - d)^2`` for each
  negative, ``d`` the Euclidean distance of L2-normalised descriptors, summed over the batch. The
  margin defaults to 0.85, the published value for ResNet (0.75 for VGG; cirtorch's README trains
  the TPAMI ResNet-101 GeM with ``--loss-margin 0.85``; 0.7 is only cirtorch's class default).
- **optimiser**: Adam. The published fine-tuning starts from ImageNet weights with ``lr`` 5e-7 to
  1e-6 at 362 px; from a random initialisation on CPU at 128-224 px a much larger ``lr`` (1e-4 by
  default) is what trains in minutes.

Training images are resized so that their longer side is ``image_size`` and then all to one shape
(that of the database images, 4:3 on the synthetic city; query crops are stretched to it), so each
batch is one tensor.

Batch norm is frozen while training, as in cirtorch, so that a descriptor does not depend on the
other images of its batch (in training mode a tuple's batch statistics let the loss fall to zero
while the same images described one by one stay apart). A randomly initialised network has no
useful running statistics, so at the start of every epoch they are re-estimated on (up to 256 of)
the mining pool (:func:`calibrate_batchnorm`), before the pool is described, and once more on the
training images after the last epoch, before the checkpoint is written.

Resumable per epoch: after every epoch the model, the optimiser and the epoch are written to
``<out>.partial`` (temporary file + rename); a rerun of the same configuration continues from there,
one of another configuration is refused unless ``restart``. The finished checkpoint is written to
``out`` in the format of :mod:`oxbench.train.model` and the partial state is removed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.fileio import progress_bar

log = logging.getLogger(__name__)

#: Default training-city checkpoint, relative to the data root (the ``gem-r18-synthetic`` preset's weights).
DEFAULT_MODEL = Path("_models") / "gem-r18-synthetic.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model (recorded in its checkpoint).

    Attributes:
        backbone: ``resnet18`` / ``resnet34`` / ``resnet50`` / ``resnet101``.
        pooling: ``gem`` (the only one trained here).
        dataset: training benchmark id (ignored with ``sfm_pickle``).
        epochs: passes, each with fresh hard negatives.
        tuples: anchor-positive pairs per epoch.
        neg_num: negatives per tuple.
        pool_size: images the negatives are mined from each epoch (0: all).
        batch_size: tuples per optimiser step.
        image_size: longer side of training images (px).
        lr, weight_decay: Adam settings.
        margin: contrastive-loss margin.
        p: initial GeM exponent.
        init: ``random``, ``imagenet`` (local torch cache only) or a checkpoint path.
        seed: seed of initialisation, sampling and mining order.
        sfm_pickle, sfm_images: SfM-120k tuples (``retrieval-SfM-120k.pkl``) and its image folder.
    """

    backbone: str = "resnet18"
    pooling: str = "gem"
    dataset: str = "synthetic-train"
    epochs: int = 6
    tuples: int = 60
    neg_num: int = 5
    pool_size: int = 0
    batch_size: int = 5
    image_size: int = 128
    lr: float = 1e-4
    weight_decay: float = 1e-6
    margin: float = 0.85
    p: float = 3.0
    init: str = "random"
    seed: int = 0
    sfm_pickle: str | None = None
    sfm_images: str | None = None

    def __post_init__(self) -> None:
        if self.pooling != "gem":
            raise InputError(f"training supports --pooling gem only, got {self.pooling!r}")
        for name in ("epochs", "tuples", "neg_num", "batch_size"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be >= 1")
        if not 32 <= self.image_size <= 2048:
            raise InputError(f"--image-size must be in 32..2048, got {self.image_size}")
        if self.pool_size < 0 or self.lr <= 0 or self.weight_decay < 0 or self.margin <= 0 or self.p < 1:
            raise InputError("pool size and weight decay must be >= 0, lr and margin > 0, p >= 1")
        if (self.sfm_pickle is None) != (self.sfm_images is None):
            raise InputError("SfM-120k training needs both --sfm-pickle and --sfm-images")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TrainingSet:
    """Training images and their labels.

    Attributes:
        read: ``read(i)`` -> ``uint8 [H, W, 3]`` image ``i``, already at training size.
        n: number of images.
        pairs: ``[m, 2]`` anchor-positive pairs.
        cluster: ``[n]`` landmark/cluster of each image (negative ids: a cluster of one).
        exclude: per anchor landmark, images never used as its negatives.
        source: what it is (recorded).
    """

    read: Callable[[int], NDArray[np.uint8]]
    n: int
    pairs: NDArray[np.int64]
    cluster: NDArray[np.int64]
    exclude: list[NDArray[np.int64]] = field(default_factory=list)
    source: str = ""


def _resize(image: NDArray[np.uint8], size: tuple[int, int]) -> NDArray[np.uint8]:
    pil = require("PIL.Image", "images")
    w, h = size
    if image.shape[1] == w and image.shape[0] == h:
        return image
    return np.asarray(pil.fromarray(image).resize((w, h), pil.BILINEAR))


def fit_size(shape: Sequence[int], max_side: int) -> tuple[int, int]:
    """``(w, h)`` of an ``H x W`` image scaled so that its longer side is ``max_side``."""
    h, w = shape[0], shape[1]
    s = max_side / max(h, w)
    return max(1, round(w * s)), max(1, round(h * s))


def benchmark_training_set(bench: Any, image_size: int, *, progress: bool = True) -> TrainingSet:
    """A benchmark's database images and query crops (``n_db + q``) with pairs from its labels."""
    from oxbench.train.pairs import image_clusters, matching_pairs

    gt = bench.gt
    first = bench.database.read(0) if gt.n_db else bench.query_crop(0)
    size = fit_size(first.shape, image_size)
    images: list[NDArray[np.uint8]] = []
    bar = progress_bar(range(gt.n_db + gt.n_queries), enabled=progress, desc=f"load {bench.id}", unit="img")
    for i in bar:
        im = bench.database.read(i) if i < gt.n_db else bench.query_crop(i - gt.n_db)
        images.append(_resize(im, size))
    cluster, maybe = image_clusters(gt)
    return TrainingSet(images.__getitem__, len(images), matching_pairs(gt), cluster, maybe,
                       source=f"{bench.id} ({gt.n_db} images + {gt.n_queries} query crops)")  # fmt: skip


def _to_tensor(images: list[NDArray[np.uint8]]) -> Any:
    from oxbench.train.model import MEAN, STD

    torch = require("torch", "deep")
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    return (x - mean) / std


def describe(model: Any, images: Sequence[NDArray[np.uint8]], *, batch: int = 32, progress: bool = False,
             desc: str = "describe") -> NDArray[np.float32]:  # fmt: skip
    """L2-normalised descriptors ``float32 [n, D]`` of ``images`` (eval mode, batched by shape)."""
    torch = require("torch", "deep")
    model.eval()
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, im in enumerate(images):
        groups.setdefault(im.shape, []).append(i)
    out: NDArray[np.float32] | None = None
    bar = progress_bar(total=len(images), enabled=progress, desc=desc, unit="img")
    with torch.no_grad():
        for idx in groups.values():
            for s in range(0, len(idx), batch):
                chunk = idx[s : s + batch]
                y = model(_to_tensor([images[i] for i in chunk])).numpy()
                if out is None:
                    out = np.zeros((len(images), y.shape[1]), np.float32)
                out[chunk] = y
                bar.update(len(chunk))
    bar.close()
    return out if out is not None else np.zeros((0, 0), np.float32)


def _batchnorms(model: Any) -> list[Any]:
    torch = require("torch", "deep")
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def calibrate_batchnorm(model: Any, images: Sequence[NDArray[np.uint8]], *, batch: int = 32) -> None:
    """Re-estimate every batch-norm layer's running mean/variance on ``images`` (cumulative average)."""
    torch = require("torch", "deep")
    layers = _batchnorms(model)
    saved = [m.momentum for m in layers]
    for m in layers:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over all calibration batches
    model.train()
    with torch.no_grad():
        # near-equal batches: never a last batch of one image (batch norm needs two values per channel)
        for chunk in np.array_split(np.arange(len(images)), max(1, -(-len(images) // batch))):
            if len(chunk):
                model(_to_tensor([images[i] for i in chunk]))
    for m, mom in zip(layers, saved, strict=True):
        m.momentum = mom
    model.eval()


def mine_negatives(
    anchor_desc: NDArray[np.float32], pool_desc: NDArray[np.float32], pool: NDArray[np.int64],
    anchors: NDArray[np.int64], ts: TrainingSet, neg_num: int,
) -> NDArray[np.int64]:  # fmt: skip
    """``[n_anchors, neg_num]`` hardest negatives: most similar pool images of other landmarks,
    one per landmark/cluster (``-1`` where the pool has too few)."""
    sims = anchor_desc @ pool_desc.T
    out = np.full((len(anchors), neg_num), -1, np.int64)
    for r, a in enumerate(anchors.tolist()):
        lm = int(ts.cluster[a])
        banned = set(ts.exclude[lm].tolist()) if 0 <= lm < len(ts.exclude) else set()
        used: set[int] = set()
        got = 0
        for j in np.argsort(-sims[r], kind="stable").tolist():
            img = int(pool[j])
            c = int(ts.cluster[img])
            if img == a or img in banned or c == lm or c in used:
                continue
            used.add(c)
            out[r, got] = img
            got += 1
            if got == neg_num:
                break
    return out


def contrastive_loss(anchor: Any, others: Any, labels: Any, margin: float) -> Any:
    """Sum of ``0.5 d^2`` (label 1) and ``0.5 max(0, margin - d)^2`` (label 0) over the pairs."""
    torch = require("torch", "deep")
    d = torch.linalg.vector_norm(anchor - others, dim=-1)
    return torch.sum(0.5 * labels * d.pow(2) + 0.5 * (1 - labels) * torch.clamp(margin - d, min=0).pow(2))


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def train(
    config: TrainConfig, ts: TrainingSet, out: str | Path, *, restart: bool = False, progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train and write the checkpoint ``out``; returns the training record (losses, times).

    Raises:
        InputError: a partial training of another configuration at ``<out>.partial`` (without
            ``restart``), or a training set without pairs or negatives.
    """
    from oxbench.train.model import build_model, load_checkpoint, model_meta, save_checkpoint

    torch = require("torch", "deep")
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    partial = _partial_path(out)
    cfg = config.to_dict()
    if not len(ts.pairs):
        raise InputError(f"{ts.source}: no positive pairs to train on")
    if out.exists() and not restart:
        _, meta = load_checkpoint(out)
        done = meta.get("training", {})
        if done.get("config") == cfg:
            log.info("%s is already trained with this configuration", out)
            return dict(done)
    model = build_model(config.backbone, p=config.p, init=config.init, seed=config.seed)
    pool_params = [model.pool.p]
    trunk_params = [q for n, q in model.named_parameters() if not n.startswith("pool.")]
    # cirtorch trains GeM's p with a 10x learning rate and no weight decay
    optimizer = torch.optim.Adam([
        {"params": trunk_params, "lr": config.lr, "weight_decay": config.weight_decay},
        {"params": pool_params, "lr": config.lr * 10, "weight_decay": 0.0},
    ])  # fmt: skip
    history: list[dict[str, float]] = []
    start = 0
    if partial.exists() and not restart:
        state = torch.load(partial, map_location="cpu", weights_only=True)
        if state.get("config") != cfg:
            raise InputError("a partial training of another configuration is here; rerun with --restart "
                             "to discard it, or choose another --out", partial)  # fmt: skip
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, history = int(state["epoch"]) + 1, list(state["history"])
        log.info("resuming %s after epoch %d", out, start)
    for epoch in range(start, config.epochs):
        t0 = time.perf_counter()
        rng = np.random.default_rng([config.seed, epoch])
        chosen = ts.pairs[rng.choice(len(ts.pairs), min(config.tuples, len(ts.pairs)), replace=False)]
        anchors = chosen[:, 0]
        pool = np.arange(ts.n) if not config.pool_size or config.pool_size >= ts.n else \
            np.sort(rng.choice(ts.n, config.pool_size, replace=False))
        need = np.unique(np.concatenate((anchors, pool)))
        calib = np.sort(rng.choice(pool, min(256, len(pool)), replace=False))
        calibrate_batchnorm(model, [ts.read(int(i)) for i in calib])
        desc = describe(model, [ts.read(int(i)) for i in need], progress=progress, desc=f"mine {epoch + 1}")
        where = {int(v): k for k, v in enumerate(need.tolist())}
        negs = mine_negatives(desc[[where[int(a)] for a in anchors]], desc[[where[int(p)] for p in pool]],
                              pool, anchors, ts, config.neg_num)  # fmt: skip
        keep = (negs >= 0).all(axis=1)
        if not keep.any():
            raise InputError(f"{ts.source}: no anchor has {config.neg_num} negatives of other landmarks")
        chosen, negs = chosen[keep], negs[keep]
        model.train()
        for layer in _batchnorms(model):
            layer.eval()  # frozen statistics (affine weights still train)
        losses = []
        order = rng.permutation(len(chosen))
        bar = progress_bar(range(0, len(order), config.batch_size), enabled=progress,
                           desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch")  # fmt: skip
        labels = torch.tensor([1.0] + [0.0] * config.neg_num)
        for s in bar:
            rows = order[s : s + config.batch_size]
            ids = np.concatenate([np.concatenate(([chosen[r, 0], chosen[r, 1]], negs[r])) for r in rows])
            y = model(_to_tensor([ts.read(int(i)) for i in ids])).view(len(rows), config.neg_num + 2, -1)
            loss = contrastive_loss(y[:, :1], y[:, 1:], labels, config.margin)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()) / len(rows))
            bar.set_postfix(loss=f"{np.mean(losses):.4f}")
        history.append({"epoch": epoch + 1, "loss": float(np.mean(losses)), "seconds": time.perf_counter() - t0,
                        "p": float(model.pool.p.item())})  # fmt: skip
        log.info("epoch %d/%d: loss %.4f, GeM p %.3f, %.1f s", epoch + 1, config.epochs, history[-1]["loss"],
                 history[-1]["p"], history[-1]["seconds"])  # fmt: skip
        save_checkpoint(partial, {"config": cfg, "epoch": epoch, "model": model.state_dict(),
                                  "optimizer": optimizer.state_dict(), "history": history})  # fmt: skip
    # the statistics were estimated before the last epoch changed the weights: estimate them again
    calib = np.sort(np.random.default_rng([config.seed, config.epochs]).choice(ts.n, min(256, ts.n), replace=False))
    calibrate_batchnorm(model, [ts.read(int(i)) for i in calib])
    record = {"config": cfg, "history": history, "trained_on": ts.source}
    save_checkpoint(out, {"state_dict": model.state_dict(), "meta": model_meta(model, config.backbone, training=record)})
    partial.unlink(missing_ok=True)
    return record
