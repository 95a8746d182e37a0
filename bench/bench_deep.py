"""CPU speed of the deep extractor at 1024 px: batched fp32 vs batched bf16 vs one image per forward.

ResNet-18 GeM (random initialisation: speed does not depend on the weights), 3 scales
(1, 1/sqrt(2), 1/2), a handful of random 1024 x 768 images (one size: what a size bucket holds).
The three modes run in the same process on the same images, interleaved over ``--rounds`` rounds
(after one warm-up pass each), and the best round of each is printed as images/s and as a ratio to
the one-image-per-forward loop (cirtorch's ``extract_vectors``). Per-core numbers: one torch thread
and CPU time (robust to other jobs on a shared machine); ``--threads`` and ``--wall`` change that.

Usage: ``PYTHONPATH=src python bench/bench_deep.py [--images 4] [--batch 4] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="resnet18")
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    ap.add_argument("--size", type=int, nargs=2, default=(1024, 768), metavar=("W", "H"))
    args = ap.parse_args(argv)

    import torch

    from oxbench.features.deep.extract import ExtractOptions, Extractor
    from oxbench.features.deep.model import build_net

    torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.wall else time.process_time
    net = build_net(args.arch, "gem", weights="random", seed=0).net
    w, h = args.size
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for _ in range(args.images)]
    print(
        f"{args.arch} GeM, {args.images} images {w}x{h}, 3 scales, torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s), {'wall' if args.wall else 'CPU'} time"
    )
    modes = {
        mode: Extractor(
            net,
            ExtractOptions(max_side=max(w, h), batch_size=batch, precision=precision, device="cpu"),
        )  # type: ignore[arg-type]
        for mode, batch, precision in (
            ("loop", 1, "fp32"),
            ("batched-fp32", args.batch, "fp32"),
            ("batched-bf16", args.batch, "bf16"),
        )
    }
    for ext in modes.values():
        ext.describe(images[: ext.batch_size])  # warm-up (oneDNN primitives for these shapes)
    best: dict[str, float] = {}
    out: dict[str, np.ndarray] = {}
    for _ in range(args.rounds):
        for mode, ext in modes.items():
            t0 = clock()
            out[mode] = ext.describe(images)
            best[mode] = max(best.get(mode, 0.0), len(images) / (clock() - t0))
    for mode, ips in best.items():
        cos = float((out["loop"] * out[mode]).sum(axis=1).min())
        print(
            f"{mode:>13}: {ips:6.2f} images/s  ({ips / best['loop']:.2f}x the loop; min cosine to it {cos:.5f})"
        )
    return best


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
