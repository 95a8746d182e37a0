"""Deep global descriptors: CNN / ViT backbones, pooling heads, batched multi-scale extraction.

Modules (each imports torch when imported, so nothing here is loaded by ``import oxbench``):

- :mod:`~oxbench.features.deep.pooling` -- MAC, SPoC, GeM (learnable ``p``) and R-MAC heads, and
  the fully connected fc6 head of VGG / AlexNet (Babenko et al.'s neural codes);
- :mod:`~oxbench.features.deep.backbones` -- convolutional trunks from torchvision (ResNet-18/34/50/
  101/152, VGG-11/13/16/19: the cirtorch layouts; AlexNet) and any timm model by name
  (``timm:<name>``);
- :mod:`~oxbench.features.deep.model` -- :class:`~oxbench.features.deep.model.RetrievalNet`
  (trunk + head + optional whitening layer), weights (random / the libraries' ImageNet weights /
  a model file), the model-file format and the cirtorch checkpoint import;
- :mod:`~oxbench.features.deep.extract` -- images to L2-normalised descriptors: resize to a maximum
  side, multi-scale power mean, batches of equal-size images, bf16 autocast, GPU when present.

This package module itself needs no torch: it holds the model-file location convention.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming the folder of model files (``models:<file>`` weights).
MODELS_ENV_VAR = "OXBENCH_MODELS"

#: Prefix of a ``weights`` value that names a file in the models folder (see :func:`models_dir`).
MODELS_PREFIX = "models:"

#: The backbones whose classifier has a first fully connected layer (``pooling="fc6"``): the
#: trunk's last max pooling ``(kernel, stride)``, the average-pooled grid side the classifier reads,
#: and the map's channels. Kept here, without torch, so that a config can refuse another backbone.
FC6_HEADS: dict[str, tuple[int, int, int, int]] = {
    "alexnet": (3, 2, 6, 256),
    "vgg11": (2, 2, 7, 512),
    "vgg13": (2, 2, 7, 512),
    "vgg16": (2, 2, 7, 512),
    "vgg19": (2, 2, 7, 512),
}

#: Output size of the fc6 layer of every backbone in :data:`FC6_HEADS`.
FC6_DIM = 4096


def check_fc6_backbone(backbone: str) -> None:
    """Refuse ``pooling="fc6"`` on a backbone without a fully connected layer (one line)."""
    from oxbench.errors import InputError

    if backbone not in FC6_HEADS:
        raise InputError(
            f"pooling=fc6 needs a backbone with a fully connected fc6 layer ({', '.join(FC6_HEADS)}); "
            f"{backbone} has none (use mac, spoc, gem or rmac)"
        )


def models_dir(root: str | Path | None = None) -> Path:
    """The folder of model files: ``$OXBENCH_MODELS``, else ``<data root>/_models``.

    ``oxbench train`` writes its models there and the presets that use trained weights
    (``gem-r18-synthetic``: ``weights="models:gem-r18-synthetic.pt"``) read them from there.

    Args:
        root: the data root (default: ``$OXBENCH_DATA`` or the per-user default).
    """
    env = os.environ.get(MODELS_ENV_VAR)
    if env:
        return Path(env).expanduser()
    from oxbench.datasets.paths import data_root

    return data_root(root) / "_models"


def resolve_weights_path(weights: str, root: str | Path | None = None) -> Path:
    """The file a ``weights`` setting names: ``models:<file>`` under :func:`models_dir`, else a path."""
    if weights.startswith(MODELS_PREFIX):
        return models_dir(root) / weights[len(MODELS_PREFIX) :]
    return Path(weights).expanduser()
