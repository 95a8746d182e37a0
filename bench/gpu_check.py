"""GPU check of the deep extractor: batched multi-scale vs the one-image-per-scale loop, and
descriptors equal to CPU fp32 within bf16 tolerance. Prepared for a GPU machine; runs on CPU too.

Measured in one run, on random 1024 x 768 images (one size: what a size bucket holds), ResNet-101
GeM (random init) at 3 scales (1, 1/sqrt(2), 1/2):

- ``loop``: one image per forward pass at each scale, fp32 (cirtorch's ``extract_vectors``);
- ``batched-fp32`` and ``batched-bf16``: ``--batch`` images per forward pass;
- agreement: the first ``--check`` images described on the CPU in fp32 against each GPU mode
  (cosine similarity per image; fp32 on the GPU uses TF32 convolutions by default, hence a cosine,
  not an exact comparison).

Writes ``$OUT/gpu_check.json`` (or ``--out DIR``): device, torch version, images/s per mode, the
speed-ups over the loop, the minimum cosines, and whether they pass (> 0.99 for bf16, > 0.999 fp32).

Usage on the GPU machine (from the repository root)::

    PYTHONPATH=src python bench/gpu_check.py                 # about a minute on one GPU
    PYTHONPATH=src python bench/gpu_check.py --tiny --out /tmp/x   # seconds, any machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np


def images_per_second(
    extractor, images: list[np.ndarray], *, min_seconds: float = 0.0
) -> tuple[float, np.ndarray]:  # noqa: ANN001
    """Images/s of ``extractor.describe`` on ``images`` (one warm-up pass first), and the descriptors."""
    import torch

    extractor.describe(
        images[: max(1, extractor.batch_size)]
    )  # warm-up: cudnn autotuning, allocations
    sync = torch.cuda.synchronize if extractor.device.type == "cuda" else (lambda: None)
    done, t0 = 0, time.perf_counter()
    out = None
    while True:
        out = extractor.describe(images)
        sync()
        done += len(images)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return done / elapsed, out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", default=os.environ.get("OUT", "."), help="folder for gpu_check.json (default $OUT)"
    )
    ap.add_argument("--arch", default="resnet101")
    ap.add_argument("--size", type=int, nargs=2, default=(1024, 768), metavar=("W", "H"))
    ap.add_argument("--images", type=int, default=64, help="images per timed pass")
    ap.add_argument("--batch", type=int, default=32, help="images per forward pass (batched modes)")
    ap.add_argument("--check", type=int, default=4, help="images compared with CPU fp32")
    ap.add_argument(
        "--min-seconds", type=float, default=5.0, help="repeat each timing at least this long"
    )
    ap.add_argument(
        "--tiny", action="store_true", help="resnet18, 64x48, 4 images: a quick run on any machine"
    )
    args = ap.parse_args(argv)
    if args.tiny:
        args.arch, args.size, args.images, args.batch, args.check, args.min_seconds = (
            "resnet18",
            (64, 48),
            4,
            4,
            2,
            0.0,
        )

    import torch

    from oxbench.features.deep.extract import ExtractOptions, Extractor
    from oxbench.features.deep.model import build_net

    torch.backends.cudnn.benchmark = True
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = build_net(args.arch, "gem", weights="random", seed=0).net
    w, h = args.size
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(args.images)]

    def extractor(batch: int, precision: str, dev: str) -> Extractor:
        opts = ExtractOptions(max_side=max(w, h), batch_size=batch, precision=precision, device=dev)  # type: ignore[arg-type]
        return Extractor(net, opts)

    modes = {
        "loop": (1, "fp32"),
        "batched-fp32": (args.batch, "fp32"),
        "batched-bf16": (args.batch, "bf16"),
    }
    speed: dict[str, float] = {}
    descriptors: dict[str, np.ndarray] = {}
    for mode, (batch, precision) in modes.items():
        subset = images if mode != "loop" else images[: max(args.batch, min(len(images), 16))]
        speed[mode], descs = images_per_second(
            extractor(batch, precision, device), subset, min_seconds=args.min_seconds
        )
        descriptors[mode] = descs[: args.check]
        print(f"{mode:>13}: {speed[mode]:8.1f} images/s", flush=True)
    reference = extractor(1, "fp32", "cpu").describe(images[: args.check])
    cosines = {mode: float((reference * d).sum(axis=1).min()) for mode, d in descriptors.items()}
    result = {
        "device": torch.cuda.get_device_name(0)
        if device == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "arch": args.arch,
        "image_size": [w, h],
        "scales": [1.0, 2**-0.5, 0.5],
        "batch": args.batch,
        "images_per_pass": args.images,
        "images_per_second": speed,
        "speedup_over_loop": {m: speed[m] / speed["loop"] for m in speed if m != "loop"},
        "min_cosine_to_cpu_fp32": cosines,
        "agree": {m: c > (0.99 if "bf16" in m else 0.999) for m, c in cosines.items()},
        "tiny": bool(args.tiny),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                k: result[k]
                for k in ("device", "speedup_over_loop", "min_cosine_to_cpu_fp32", "agree")
            }
        )
    )
    return result


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
