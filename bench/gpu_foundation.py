"""Foundation-model extraction speed: oxbench's batched extractor against plain torch at the same
batch and precision. Prepared for a GPU machine (issue 40 item 5); runs on CPU in ``--tiny`` mode.

One run, random images of one size (``--side`` square, a multiple of the patch size), a random-init
DINOv2-shaped ViT (timm ``vit_base_patch14_dinov2``, ``pretrained=False``: nothing downloaded) as the
``vit`` descriptor kind builds it (:class:`oxbench.pipelines.descriptors.vit.VitSpec`), its tokens
pooled by ``--pooling`` (GeM over the patch tokens by default), single scale, bf16 autocast:

- ``oxbench``: :class:`oxbench.features.deep.extract.Extractor` (``describe``: normalisation,
  batching, autocast, L2);
- ``plain-torch``: the same network called on pre-normalised device tensors in a loop of
  ``--batch`` images under ``torch.autocast`` (no decoding, no copies: the ceiling).

Writes ``$OUT/gpu_foundation.json`` (or ``--out DIR``): device, torch and timm versions, images/s of
each, and the ratio oxbench / plain torch (issue 40's bar on a GPU: >= 0.85).

Usage (from the repository root)::

    PYTHONPATH=src python bench/gpu_foundation.py                  # ViT-B/14, 518 px, batch 32, bf16
    PYTHONPATH=src python bench/gpu_foundation.py --tiny --out /tmp/x   # seconds, any machine
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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    ap.add_argument("--arch", default="vit_base_patch14_dinov2", help="timm model name")
    ap.add_argument("--pooling", choices=("cls", "gem", "cls+gem"), default="gem")
    ap.add_argument("--side", type=int, default=518, help="image side (px)")
    ap.add_argument("--images", type=int, default=128, help="images per timed pass")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--min-seconds", type=float, default=5.0)
    ap.add_argument(
        "--tiny", action="store_true", help="ViT-S/14 at 56 px, 4 images: seconds on any machine"
    )
    args = ap.parse_args(argv)
    if args.tiny:
        args.arch, args.side, args.images, args.batch, args.min_seconds = (
            "vit_small_patch14_dinov2",
            56,
            4,
            2,
            0.0,
        )

    import timm
    import torch

    from oxbench.features.deep.extract import ExtractOptions, Extractor
    from oxbench.pipelines.descriptors.vit import VitSpec

    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = VitSpec(args.arch.removeprefix("timm:"), "random", args.pooling, 3.0, 0).build().net
    rng = np.random.default_rng(0)
    images = [
        rng.integers(0, 256, (args.side, args.side, 3), dtype=np.uint8) for _ in range(args.images)
    ]
    opts = ExtractOptions(
        max_side=args.side,
        scales=(1.0,),
        batch_size=args.batch,
        precision=args.precision,
        device=device,
    )
    extractor = Extractor(net, opts)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def timed(run) -> float:  # noqa: ANN001
        run()  # warm-up
        sync()
        done, t0 = 0, time.perf_counter()
        while True:
            run()
            sync()
            done += len(images)
            elapsed = time.perf_counter() - t0
            if elapsed >= args.min_seconds:
                return done / elapsed

    ours = timed(lambda: extractor.describe(images))
    batches = [
        extractor.to_tensor(images[i : i + args.batch]) for i in range(0, len(images), args.batch)
    ]

    def plain() -> None:
        with (
            torch.inference_mode(),
            torch.autocast(
                device_type=extractor.device.type,
                dtype=torch.bfloat16,
                enabled=args.precision == "bf16",
            ),
        ):
            for x in batches:
                extractor.net(x)

    theirs = timed(plain)
    result = {
        "device": torch.cuda.get_device_name(0)
        if device == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "timm": timm.__version__,
        "python": sys.version.split()[0],
        "arch": args.arch,
        "pooling": args.pooling,
        "side": args.side,
        "batch": args.batch,
        "precision": args.precision,
        "images_per_pass": args.images,
        "images_per_second": {"oxbench": ours, "plain-torch": theirs},
        "ratio_oxbench_over_plain": ours / theirs,
        "tiny": bool(args.tiny),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_foundation.json").write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: result[k] for k in ("device", "images_per_second", "ratio_oxbench_over_plain")}
        )
    )
    return result


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
