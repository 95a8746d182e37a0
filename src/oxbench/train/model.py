"""A minimal retrieval network for training: a torchvision ResNet trunk + GeM, L2-normalised output.

Interface the training loop needs (and nothing more): a ``torch.nn.Module`` mapping a batch of
normalised images ``[B, 3, H, W]`` to L2-normalised descriptors ``[B, D]``. State-dict keys follow
cirtorch's ``ImageRetrievalNet`` (``features.<i>.*`` for the trunk's children, ``pool.p`` for GeM),
so a checkpoint written here has the cirtorch layout every loader of published GeM models reads.

Checkpoint format (agreed with the deep-descriptor pipeline): ``torch.save`` of
``{"state_dict": ..., "meta": {"architecture", "pooling", "p", "mean", "std", "outputdim",
"whitening": None | {...}, "training": {...}}}``, written through a temporary file and renamed.

TEMPORARY duplication: the backbone/pooling modules of the deep pipeline are written in parallel;
when they are on main, :func:`build_model` should build theirs (same keys) and this file keeps only
:func:`save_checkpoint` / :func:`load_checkpoint` if those are not provided there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oxbench.errors import InputError, require

#: ImageNet normalisation (torchvision / cirtorch).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

#: Trunk output channels of the supported backbones.
ARCHITECTURES = {"resnet18": 512, "resnet34": 512, "resnet50": 2048, "resnet101": 2048}


def _torch():  # noqa: ANN202 - the torch module
    return require("torch", "deep")


def build_model(architecture: str = "resnet18", *, p: float = 3.0, init: str = "random", seed: int = 0) -> Any:
    """A ResNet trunk + GeM (learnable ``p``) returning L2-normalised descriptors.

    Args:
        architecture: ``resnet18`` / ``resnet34`` / ``resnet50`` / ``resnet101``.
        p: initial GeM exponent.
        init: ``"random"`` (seeded), ``"imagenet"`` (torchvision's weights from its local cache
            only: nothing is downloaded here), or a checkpoint path in the format above.
        seed: seed of the random initialisation.

    Raises:
        InputError: unknown architecture, ImageNet weights not in the local cache, a checkpoint of
            another architecture.
    """
    torch = _torch()
    nn = torch.nn
    module: Any = nn.Module  # a runtime base class (torch is imported lazily)
    tv = require("torchvision.models", "deep")
    if architecture not in ARCHITECTURES:
        raise InputError(f"unknown backbone {architecture!r} (known: {', '.join(ARCHITECTURES)})")

    class GeM(module):
        """Generalized-mean pooling (Radenovic et al. 2018): ``(mean x^p)^(1/p)`` per channel."""

        def __init__(self, p: float, eps: float = 1e-6) -> None:
            super().__init__()
            self.p = nn.Parameter(torch.ones(1) * p)
            self.eps = eps

        def forward(self, x):  # noqa: ANN001, ANN202
            pooled = x.clamp(min=self.eps).pow(self.p).mean(dim=(-2, -1))
            return pooled.pow(1.0 / self.p)

    class RetrievalNet(module):
        def __init__(self, trunk: Any, pool: Any) -> None:
            super().__init__()
            self.features = trunk
            self.pool = pool

        def forward(self, x):  # noqa: ANN001, ANN202
            return torch.nn.functional.normalize(self.pool(self.features(x)), dim=-1)

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = getattr(tv, architecture)(weights=None)
    if init == "imagenet":
        net.load_state_dict(_cached_imagenet_weights(tv, architecture))
    model = RetrievalNet(nn.Sequential(*list(net.children())[:-2]), GeM(p))
    if init not in ("random", "imagenet"):
        state, meta = load_checkpoint(init)
        if meta.get("architecture") != architecture:
            raise InputError(f"checkpoint is a {meta.get('architecture')!r}, not {architecture!r}", init)
        _load_state(model, state, init)
    return model


def _cached_imagenet_weights(tv: Any, architecture: str) -> Any:
    torch = _torch()
    enum = tv.get_model_weights(architecture).DEFAULT
    cache = Path(torch.hub.get_dir()) / "checkpoints" / Path(enum.url).name
    if not cache.is_file():
        raise InputError(f"ImageNet weights of {architecture} are not in the local torch cache ({cache}); "
                         "download them first or use --init random / a checkpoint path")  # fmt: skip
    return torch.load(cache, map_location="cpu", weights_only=True)


def _load_state(model: Any, state: dict[str, Any], source: str | Path) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise InputError(f"checkpoint does not fit the network: missing keys {missing[:5]}, "
                         f"unexpected keys {unexpected[:5]}", source)  # fmt: skip
    model.load_state_dict(state)


def model_meta(model: Any, architecture: str, **extra: Any) -> dict[str, Any]:
    """The checkpoint ``meta`` of a model built by :func:`build_model`."""
    return {
        "architecture": architecture, "pooling": "gem", "p": float(model.pool.p.detach().item()),
        "mean": list(MEAN), "std": list(STD), "outputdim": ARCHITECTURES[architecture], "whitening": None,
        **extra,
    }  # fmt: skip


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """``torch.save`` of ``state`` through a temporary file renamed into place."""
    from oxbench.fileio import atomic_open

    torch = _torch()
    with atomic_open(path) as fh:
        torch.save(state, fh)
    return Path(path)


def load_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state_dict, meta)`` of a checkpoint in the format above (tensors only; no code runs).

    Raises:
        InputError: missing, unreadable, or not of this format (names the file).
    """
    import io

    from oxbench.fileio import read_input_bytes

    torch = _torch()
    data = read_input_bytes(path, limit=1 << 34)
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds for a bad file  # noqa: BLE001
        raise InputError(f"not a readable torch checkpoint ({str(exc).splitlines()[0][:200]})", path) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("state_dict"), dict) or not isinstance(obj.get("meta"), dict):
        raise InputError("not a checkpoint of the {'state_dict': ..., 'meta': {...}} format", path)
    return obj["state_dict"], obj["meta"]
