"""``oxbench train``: train a backbone + GeM with the contrastive loss and mined negatives.

The recipe of Radenovic, Tolias & Chum, "Fine-tuning CNN Image Retrieval with No Human Annotation"
(TPAMI 2018; cirtorch), made to learn from a random initialisation on two CPU cores:

- **network**: :class:`~oxbench.features.deep.model.RetrievalNet` built by
  :func:`~oxbench.features.deep.model.build_net` -- the very network ``oxbench run`` describes images
  with -- and written with :func:`~oxbench.features.deep.model.save_model` as a model file that the
  ``gem-r18-synthetic`` preset (``weights="models:gem-r18-synthetic.pt"``) loads as it is.
- **tuples**: an anchor, one positive, ``neg_num`` negatives. Positive pairs come from the labels:
  on a benchmark used for training (``synthetic-train``, or the other real city) each query crop with
  each of its positives (:func:`oxbench.train.pairs.matching_pairs`; ``positives="easy"``: its Easy
  positives only); on SfM-120k the pickle's ``qidxs``/``pidxs``. Every epoch ``tuples`` pairs are
  drawn (seeded by the epoch).
- **negatives**: images that cannot show the anchor's landmark (never an image labelled positive or
  junk for any query of that landmark; on SfM-120k never its own cluster), at most one per
  landmark/cluster. For the first ``random_negative_epochs`` epochs (by default: all of them from a
  random initialisation, none from pretrained weights) they are drawn at random; after that they are
  the *hardest* ones, mined every epoch as in cirtorch: the network (eval mode)
  describes a pool of training images (``pool_size``, all by default) and each anchor, and the most
  similar pool images are taken.
- **loss**: contrastive, ``0.5 d^2`` for the positive and ``0.5 max(0, margin - d)^2`` for each
  negative, ``d`` the Euclidean distance of L2-normalised descriptors, summed over the batch.
- **optimiser**: Adam, GeM's ``p`` with a 10x learning rate and no weight decay (as cirtorch); the
  learning rate decays exponentially per epoch (``lr_decay``; cirtorch: ``exp(-0.01 epoch)``).
- **augmentation** (``augment``): every training image is a random crop (60-100 % of its area,
  aspect ratio 3:4..4:3) resized back to the training shape, mirrored with probability 1/2, with a
  random brightness and contrast change (x0.7..1.3) -- the changes the labels say a match survives.

Why these choices (see ``docs/deep.md``, "Training"): the published recipe fine-tunes an ImageNet
network, whose descriptors already rank images sensibly, so hardest negatives and frozen batch norm
are right there. From a random initialisation neither is: the hardest negatives of a random network
are images that merely share colours and brightness with the anchor, and training on them alone does
not learn at all; frozen batch norm with statistics of random weights trains an unnormalised
network. So with ``init="random"`` batch norm runs in training mode (statistics of the whole batch:
``batch_size`` tuples of ``neg_num + 2`` images) and is re-estimated on the training images
(:func:`calibrate_batchnorm`) before every mining pass and before the model is written; with
pretrained weights (``imagenet`` or a model file) it stays frozen, as published.

Training images are resized so that their longer side is ``image_size`` and then all to one shape
(that of the first image: 4:3 on the synthetic city; query crops are stretched to it), so each batch
is one tensor.

After the last epoch a learned whitening (Radenovic et al.: from the matching pairs) is fitted on the
training images' descriptors at the training size and stored in the model file (``lw``, applied by
presets with ``model_whitening``).

Resumable per epoch: after every epoch the model, the optimiser and the epoch are written to
``<out>.partial`` (temporary file + rename); a rerun of the same configuration continues from there,
one of another configuration is refused unless ``restart``. The finished model file is written to
``out`` and the partial state is removed.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from oxbench.errors import InputError, require
from oxbench.fileio import atomic_write_bytes, progress_bar
from oxbench.schema import (
    Bool,
    Choice,
    Float,
    Int,
    Optional,
    PathSetting,
    Size,
    Str,
    setting,
    validate,
)

log = logging.getLogger(__name__)

#: Most negatives per tuple, and most images in one optimiser step (tuples x (2 + negatives)): bounds
#: that keep a typo like ``--neg-num 1000000000`` a one-line refusal instead of a MemoryError.
MAX_NEGATIVES = 1000
MAX_BATCH_IMAGES = 4096


def _option(name: str) -> str:
    """The command-line option of a :class:`TrainConfig` field (``neg_num`` -> ``--neg-num``)."""
    return "--" + name.replace("_", "-")


#: Default training-city model file, relative to the data root (the ``gem-r18-synthetic`` preset's weights).
DEFAULT_MODEL = Path("_models") / "gem-r18-synthetic.pt"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model (recorded in its model file).

    The defaults train ResNet-18 + GeM from a random initialisation on the synthetic training city
    in a few minutes on two CPU cores (``docs/deep.md``).

    Attributes:
        backbone: a torchvision ResNet / VGG or ``timm:<name>`` (:mod:`oxbench.features.deep.backbones`).
        pooling: ``gem`` (the only one trained here).
        dataset: training benchmark id (ignored with ``sfm_pickle``).
        epochs: passes, each with fresh tuples (and, after ``random_negative_epochs``, fresh hard negatives).
        tuples: anchor-positive pairs per epoch.
        neg_num: negatives per tuple.
        pool_size: images the hard negatives are mined from each epoch (0: all).
        batch_size: tuples per optimiser step.
        image_size: longer side of training images (px).
        lr, weight_decay: Adam settings.
        lr_decay: exponential learning-rate decay: epoch ``e`` (from 0) trains at ``lr * exp(-lr_decay * e)``
            (cirtorch: 0.01 over its 100 epochs; 0: a constant rate).
        margin: contrastive-loss margin.
        p: initial GeM exponent.
        positives: ``all`` (every labelled positive of a query) or ``easy`` (its Easy ones only; on
            SfM-120k, where pairs carry no difficulty, the same as ``all``).
        random_negative_epochs: epochs with random instead of hardest negatives (``None``: every
            epoch from a random initialisation, none from pretrained weights as published).
        augment: random crops, mirroring and brightness/contrast changes of training images.
        init: ``random``, ``imagenet`` (the library's weights) or a model file path.
        seed: seed of initialisation, sampling, augmentation and mining order.
        sfm_pickle, sfm_images: SfM-120k tuples (``retrieval-SfM-120k.pkl``) and its image folder.
    """

    backbone: str = setting(
        "resnet18", Str(min_len=1, max_len=256), doc="torchvision ResNet / VGG or timm:<name>"
    )
    pooling: str = setting("gem", Choice("gem"), doc="pooling head (gem only)")
    dataset: str = setting(
        "synthetic-train", Str(min_len=1, max_len=256), doc="training benchmark id"
    )
    epochs: int = setting(40, Int(lo=1, hi=100_000), doc="passes over fresh tuples")
    tuples: int = setting(100, Size(lo=1, hi=1_000_000), doc="anchor-positive pairs per epoch")
    neg_num: int = setting(5, Size(lo=1, hi=MAX_NEGATIVES), doc="negatives per tuple")
    pool_size: int = setting(
        0, Size(lo=0, hi=10_000_000), doc="images negatives are mined from (0: all)"
    )
    batch_size: int = setting(5, Size(lo=1, hi=MAX_BATCH_IMAGES), doc="tuples per optimiser step")
    image_size: int = setting(160, Int(lo=32, hi=2048), doc="longer side of training images (px)")
    lr: float = setting(1e-3, Float(lo=0, lo_open=True, hi=10), doc="Adam learning rate")
    lr_decay: float = setting(0.0, Float(lo=0, hi=100), doc="exponential decay per epoch")
    weight_decay: float = setting(1e-6, Float(lo=0, hi=10), doc="Adam weight decay")
    margin: float = setting(
        0.85, Float(lo=0, lo_open=True, hi=2), doc="contrastive margin (unit vectors: at most 2)"
    )
    p: float = setting(3.0, Float(lo=1, hi=100), doc="initial GeM exponent")
    positives: Literal["all", "easy"] = setting("easy", Choice("all", "easy"), doc="positive pairs")
    random_negative_epochs: int | None = setting(
        None, Optional(Int(lo=0, hi=100_000)), doc="epochs with random negatives"
    )
    augment: bool = setting(False, Bool(), doc="random crops, mirroring, photometric changes")
    init: str = setting("random", PathSetting(), doc="random, imagenet or a model file")
    seed: int = setting(0, Int(lo=0, hi=2**63 - 1), doc="seed of everything random")
    sfm_pickle: str | None = setting(None, Optional(PathSetting()), doc="SfM-120k tuples (.pkl)")
    sfm_images: str | None = setting(None, Optional(PathSetting()), doc="SfM-120k image folder")

    def __post_init__(self) -> None:
        validate(self, what="option", label=_option)
        if self.batch_size * (self.neg_num + 2) > MAX_BATCH_IMAGES:
            raise InputError(
                f"--batch-size {self.batch_size} x (--neg-num {self.neg_num} + 2) is "
                f"{self.batch_size * (self.neg_num + 2):,} images per step; at most {MAX_BATCH_IMAGES:,} "
                "(a bound that keeps memory in reach)"
            )
        if (self.sfm_pickle is None) != (self.sfm_images is None):
            raise InputError("SfM-120k training needs both --sfm-pickle and --sfm-images")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def random_epochs(self) -> int:
        """Epochs with random negatives (:attr:`random_negative_epochs` resolved)."""
        if self.random_negative_epochs is not None:
            return self.random_negative_epochs
        return self.epochs if self.init == "random" else 0


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
        easy: ``[m]`` whether each pair is an Easy one (``None``: no difficulty labels).
    """

    read: Callable[[int], NDArray[np.uint8]]
    n: int
    pairs: NDArray[np.int64]
    cluster: NDArray[np.int64]
    exclude: list[NDArray[np.int64]] = field(default_factory=list)
    source: str = ""
    easy: NDArray[np.bool_] | None = None


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
    bar = progress_bar(
        range(gt.n_db + gt.n_queries), enabled=progress, desc=f"load {bench.id}", unit="img"
    )
    for i in bar:
        im = bench.database.read(i) if i < gt.n_db else bench.query_crop(i - gt.n_db)
        images.append(_resize(im, size))
    cluster, maybe = image_clusters(gt)
    pairs = matching_pairs(gt)
    easy_sets = [set(q.easy.tolist()) for q in gt.queries]
    easy = np.array([int(p) in easy_sets[int(a) - gt.n_db] for a, p in pairs], dtype=bool)
    return TrainingSet(
        images.__getitem__,
        len(images),
        pairs,
        cluster,
        maybe,
        source=f"{bench.id} ({gt.n_db} images + {gt.n_queries} query crops)",
        easy=easy,
    )


def _batchnorms(model: Any) -> list[Any]:
    torch = require("torch", "deep")
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def _to_tensor(net: Any, images: Sequence[NDArray[np.uint8]]) -> Any:
    """``[B, 3, H, W]`` normalised with the network's mean / std, from equal-size uint8 images."""
    torch = require("torch", "deep")
    x = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float().div_(255.0)
    return (x - torch.tensor(net.mean).view(1, 3, 1, 1)) / torch.tensor(net.std).view(1, 3, 1, 1)


def calibrate_batchnorm(
    model: Any, images: Sequence[NDArray[np.uint8]], *, batch: int = 32
) -> None:
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
                model(_to_tensor(model, [images[i] for i in chunk]))
    for m, mom in zip(layers, saved, strict=True):
        m.momentum = mom
    model.eval()


def describe(net: Any, images: Sequence[NDArray[np.uint8]]) -> NDArray[np.float32]:
    """Single-scale descriptors ``float32 [n, D]`` of training-size images, by the extractor
    ``oxbench run`` uses (eval mode, batches of equal-size images)."""
    from oxbench.features.deep.extract import ExtractOptions, Extractor

    return Extractor(net, ExtractOptions(scales=(1.0,), batch_size=32, device="cpu")).describe(
        images
    )


def mine_negatives(
    anchor_desc: NDArray[np.float32],
    pool_desc: NDArray[np.float32],
    pool: NDArray[np.int64],
    anchors: NDArray[np.int64],
    ts: TrainingSet,
    neg_num: int,
) -> NDArray[np.int64]:
    """``[n_anchors, neg_num]`` hardest negatives: most similar pool images of other landmarks,
    one per landmark/cluster (``-1`` where the pool has too few)."""
    sims = anchor_desc @ pool_desc.T
    return _pick_negatives(
        [np.argsort(-sims[r], kind="stable") for r in range(len(anchors))],
        pool,
        anchors,
        ts,
        neg_num,
    )


def random_negatives(
    pool: NDArray[np.int64],
    anchors: NDArray[np.int64],
    ts: TrainingSet,
    neg_num: int,
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """``[n_anchors, neg_num]`` random pool images of other landmarks, one per landmark/cluster
    (``-1`` where the pool has too few)."""
    return _pick_negatives(
        [rng.permutation(len(pool)) for _ in range(len(anchors))], pool, anchors, ts, neg_num
    )


def _pick_negatives(
    orders: list[NDArray[np.int64]],
    pool: NDArray[np.int64],
    anchors: NDArray[np.int64],
    ts: TrainingSet,
    neg_num: int,
) -> NDArray[np.int64]:
    """The first ``neg_num`` images of each anchor's pool order that may be its negatives."""
    out = np.full((len(anchors), neg_num), -1, np.int64)
    for r, a in enumerate(anchors.tolist()):
        lm = int(ts.cluster[a])
        banned = set(ts.exclude[lm].tolist()) if 0 <= lm < len(ts.exclude) else set()
        used: set[int] = set()
        got = 0
        for j in orders[r].tolist():
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


def augment_image(image: NDArray[np.uint8], rng: np.random.Generator) -> NDArray[np.uint8]:
    """A random crop (60-100 % of the area, aspect 3:4..4:3 of the original's) resized back to the
    image's shape, mirrored with probability 1/2, brightness and contrast each scaled by 0.7..1.3."""
    h, w = image.shape[:2]
    area = rng.uniform(0.6, 1.0)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
    ch = min(h, max(2, round(h * np.sqrt(area / ratio))))
    cw = min(w, max(2, round(w * np.sqrt(area * ratio))))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    out = _resize(np.ascontiguousarray(image[y : y + ch, x : x + cw]), (w, h)).astype(np.float32)
    if rng.random() < 0.5:
        out = out[:, ::-1]
    mean = out.mean()
    out = (out - mean) * rng.uniform(0.7, 1.3) + mean * rng.uniform(0.7, 1.3)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def contrastive_loss(anchor: Any, others: Any, labels: Any, margin: float) -> Any:
    """Sum of ``0.5 d^2`` (label 1) and ``0.5 max(0, margin - d)^2`` (label 0) over the pairs."""
    torch = require("torch", "deep")
    d = torch.linalg.vector_norm(anchor - others, dim=-1)
    return torch.sum(
        0.5 * labels * d.pow(2) + 0.5 * (1 - labels) * torch.clamp(margin - d, min=0).pow(2)
    )


def _partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def _save_partial(path: Path, state: dict[str, Any]) -> Path:
    torch = require("torch", "deep")
    buf = io.BytesIO()
    torch.save(state, buf)
    return atomic_write_bytes(path, buf.getvalue())


def _training_pairs(config: TrainConfig, ts: TrainingSet) -> NDArray[np.int64]:
    if config.positives == "easy" and ts.easy is not None:
        pairs = ts.pairs[ts.easy]
        if not len(pairs):
            raise InputError(f"{ts.source}: no Easy positive pairs; train with --positives all")
        return pairs
    return ts.pairs


def _build(config: TrainConfig) -> Any:
    from oxbench.features.deep.model import build_net

    weights: str | Path = config.init
    if config.init not in ("random", "imagenet"):
        weights = Path(config.init).expanduser()
    return build_net(
        config.backbone, config.pooling, weights=weights, p=config.p, seed=config.seed
    ).net


def _calibration_images(
    ts: TrainingSet, rng: np.random.Generator, limit: int = 256
) -> list[NDArray[np.uint8]]:
    return [ts.read(int(i)) for i in np.sort(rng.choice(ts.n, min(limit, ts.n), replace=False))]


def _epochs(
    config: TrainConfig,
    ts: TrainingSet,
    net: Any,
    optimizer: Any,
    pairs: NDArray[np.int64],
    start: int,
    history: list[dict[str, Any]],
    partial: Path,
    cfg: dict[str, Any],
    *,
    progress: bool,
) -> list[dict[str, Any]]:
    """Train epochs ``start`` .. ``config.epochs - 1``, saving the checkpoint after each; returns
    the history. The progress bar of an epoch shows the whole training's time left (the mean of the
    epochs done so far, times the epochs to go) beside the epoch's own."""
    torch = require("torch", "deep")
    scratch = config.init == "random"
    labels = torch.tensor([1.0] + [0.0] * config.neg_num)
    for epoch in range(start, config.epochs):
        t0 = time.perf_counter()
        # set from the epoch, not stepped, so that a resumed training continues on the same schedule
        for group, base in zip(optimizer.param_groups, (config.lr, config.lr * 10), strict=True):
            group["lr"] = base * math.exp(-config.lr_decay * epoch)
        rng = np.random.default_rng([config.seed, epoch])
        chosen = pairs[rng.choice(len(pairs), min(config.tuples, len(pairs)), replace=False)]
        anchors = chosen[:, 0]
        pool = (
            np.arange(ts.n)
            if not config.pool_size or config.pool_size >= ts.n
            else np.sort(rng.choice(ts.n, config.pool_size, replace=False))
        )
        hard = epoch >= config.random_epochs
        if hard:
            if scratch:
                calibrate_batchnorm(net, _calibration_images(ts, rng))
            need = np.unique(np.concatenate((anchors, pool)))
            desc = describe(net, [ts.read(int(i)) for i in need])
            where = {int(v): k for k, v in enumerate(need.tolist())}
            negs = mine_negatives(
                desc[[where[int(a)] for a in anchors]],
                desc[[where[int(p)] for p in pool]],
                pool,
                anchors,
                ts,
                config.neg_num,
            )
        else:
            negs = random_negatives(pool, anchors, ts, config.neg_num, rng)
        keep = (negs >= 0).all(axis=1)
        if not keep.any():
            raise InputError(
                f"{ts.source}: no anchor has {config.neg_num} negatives of other landmarks"
            )
        chosen, negs = chosen[keep], negs[keep]
        net.train()
        if not scratch:
            for layer in _batchnorms(net):
                layer.eval()  # pretrained statistics stay frozen (affine weights still train), as published
        losses = []
        order = rng.permutation(len(chosen))
        bar = progress_bar(
            range(0, len(order), config.batch_size),
            enabled=progress,
            desc=f"epoch {epoch + 1}/{config.epochs}"
            + (f" ({left})" if (left := _time_left(history, config.epochs - epoch)) else ""),
            unit="batch",
        )
        for s in bar:
            rows = order[s : s + config.batch_size]
            ids = np.concatenate(
                [np.concatenate(([chosen[r, 0], chosen[r, 1]], negs[r])) for r in rows]
            )
            images = [ts.read(int(i)) for i in ids]
            if config.augment:
                images = [augment_image(im, rng) for im in images]
            y = net(_to_tensor(net, images)).view(len(rows), config.neg_num + 2, -1)
            loss = contrastive_loss(y[:, :1], y[:, 1:], labels, config.margin)
            if not math.isfinite(float(loss.item())):
                raise _diverged(
                    epoch,
                    f"the loss is {float(loss.item())} at batch {s // config.batch_size + 1}",
                    partial,
                    history,
                )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.item()) / len(rows))
            bar.set_postfix(loss=f"{np.mean(losses):.4f}")
        net.eval()
        bad = next(
            (n for n, q in net.named_parameters() if not bool(torch.isfinite(q).all())), None
        )
        if bad is not None:
            raise _diverged(epoch, f"weight {bad} became NaN or infinite", partial, history)
        history.append(
            {
                "epoch": epoch + 1,
                "loss": float(np.mean(losses)),
                "seconds": time.perf_counter() - t0,
                "p": float(net.pool.p.item()),
                "negatives": "hard" if hard else "random",
                "lr": optimizer.param_groups[0]["lr"],
            }
        )
        log.info(
            "epoch %d/%d: loss %.4f (%s negatives), GeM p %.3f, %.1f s%s",
            epoch + 1,
            config.epochs,
            history[-1]["loss"],
            history[-1]["negatives"],
            history[-1]["p"],
            history[-1]["seconds"],
            f"; {left}" if (left := _time_left(history, config.epochs - epoch - 1)) else "",
        )
        _save_partial(
            partial,
            {
                "config": cfg,
                "epoch": epoch,
                "model": net.state_dict(),
                "optimizer": optimizer.state_dict(),
                "history": history,
            },
        )
    return history


def _checkpoint_epoch(partial: Path, history: list[dict[str, Any]]) -> int:
    """The last epoch (1-based) the checkpoint ``partial`` holds: the history's last, else 0."""
    return int(history[-1]["epoch"]) if history and partial.exists() else 0


def _time_left(history: list[dict[str, Any]], epochs_to_go: int) -> str:
    """``"~11 min left in all"`` from the epochs timed in this process (or ``""`` before one is)."""
    timed = [h["seconds"] for h in history if h.get("seconds")]
    if not timed:
        return ""
    left = sum(timed[-5:]) / len(timed[-5:]) * epochs_to_go
    text = f"{left / 60:.0f} min" if left >= 90 else f"{left:.0f} s"
    return f"~{text} left in all"


def train(
    config: TrainConfig,
    ts: TrainingSet,
    out: str | Path,
    *,
    restart: bool = False,
    progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train and write the model file ``out``; returns the training record (losses, times).

    Raises:
        InputError: a partial training of another configuration at ``<out>.partial`` (without
            ``restart``), or a training set without pairs or negatives.
    """
    from oxbench.features.deep.model import _torch_load, load_model, save_model

    torch = require("torch", "deep")
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    partial = _partial_path(out)
    cfg = config.to_dict()
    if not len(ts.pairs):
        raise InputError(f"{ts.source}: no positive pairs to train on")
    pairs = _training_pairs(config, ts)
    if out.exists() and not restart:
        done = dict(load_model(out).source.get("training") or {})
        if done.get("config") == cfg:
            log.info("%s is already trained with this configuration", out)
            return done
    net = _build(config)
    scratch = config.init == "random"
    trunk_params = [q for n, q in net.named_parameters() if not n.startswith("pool.")]
    # cirtorch trains GeM's p with a 10x learning rate and no weight decay
    optimizer = torch.optim.Adam(
        [
            {"params": trunk_params, "lr": config.lr, "weight_decay": config.weight_decay},
            {"params": list(net.pool.parameters()), "lr": config.lr * 10, "weight_decay": 0.0},
        ]
    )
    history: list[dict[str, Any]] = []
    start = 0
    if partial.exists() and not restart:
        try:
            state = _torch_load(partial)
        except InputError as exc:
            raise InputError(
                f"the partial training here is unreadable ({exc.problem}); rerun with --restart "
                "to discard it and train from the start",
                partial,
            ) from None
        if not isinstance(state, dict) or state.get("config") != cfg:
            raise InputError(
                "a partial training of another configuration is here; rerun with --restart "
                "to discard it, or choose another --out",
                partial,
            )
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start, history = int(state["epoch"]) + 1, list(state["history"])
        # shown without -v: a rerun that does not start from epoch 1 must say so
        log.warning(
            "resuming the training of %s after epoch %d of %d (checkpoint %s; --restart, or "
            "deleting it, begins again)",
            out,
            start,
            config.epochs,
            partial,
        )
    try:
        history = _epochs(
            config, ts, net, optimizer, pairs, start, history, partial, cfg, progress=progress
        )
    except BaseException as exc:
        if not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: say what a rerun starts from
            log.warning(
                "training interrupted: %s",
                f"the checkpoint of epoch {_checkpoint_epoch(partial, history)} is kept at {partial}; a "
                "rerun resumes from it"
                if partial.exists()
                else "no epoch had finished, nothing of it is saved",
            )
        raise
    if scratch:  # the running statistics of training batches (augmented, in training mode): estimate them on the images
        calibrate_batchnorm(
            net, _calibration_images(ts, np.random.default_rng([config.seed, config.epochs]))
        )
    record = {"config": cfg, "history": history, "trained_on": ts.source}
    lw, lw_note = _learned_whitening(net, ts, ts.pairs)
    if lw_note:
        record["lw"] = lw_note
    save_model(out, net.eval(), lw=lw, source={"format": "oxbench train", "training": record})
    partial.unlink(missing_ok=True)
    return record


def _diverged(epoch: int, what: str, partial: Path, history: list[dict[str, Any]]) -> InputError:
    """The one-line error of a training that diverged in ``epoch`` (0-based); nothing of it is saved."""
    kept = (
        f"the checkpoint of epoch {history[-1]['epoch']} ({partial}) is kept and a rerun resumes from it"
        if history and partial.exists()
        else "nothing was saved"
    )
    return InputError(
        f"training diverged in epoch {epoch + 1}: {what}; {kept}; lower --lr or --margin and rerun "
        "(with --restart to begin again)"
    )


def _learned_whitening(
    net: Any, ts: TrainingSet, pairs: NDArray[np.int64]
) -> tuple[dict[str, dict[str, tuple[NDArray[np.float64], NDArray[np.float64]]]], str]:
    """The learned whitening of the trained network's training-size descriptors, from the pairs.

    Returns ``({name: {"ss": (m, P)}}, "")`` or ``({}, why not)`` when the training set is too small
    to learn one (fewer images or pairs than dimensions).
    """
    from oxbench.index.whitening import LearnedWhitening

    x = describe(net, [ts.read(i) for i in range(ts.n)])
    try:
        # a few hundred pairs of one city rarely span every dimension: shrink the intra-class covariance
        w = LearnedWhitening(shrinkage=0.1).fit(x, pairs, fitted_on=ts.source)
    except InputError as exc:
        log.warning("no learned whitening stored in the model file: %s", exc)
        return {}, f"not learned: {exc}"
    assert w.mean_ is not None and w.components_ is not None and w.scale_ is not None
    return {"train": {"ss": (w.mean_, w.components_ / w.scale_[:, None])}}, ""
