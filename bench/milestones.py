"""The field's milestones on the synthetic benchmark, in the order the field reached them.

One row per milestone, each an oxbench preset run end to end (``oxbench.run``, the default
synthetic set and its training city, one shared cache so the RootSIFT features and the vocabulary
are computed once), with the published Oxford 5K number beside it (``PUBLISHED``, from the papers
as quoted in the project's facts; ``None`` where none is quoted). The synthetic benchmark is not
Oxford: what is compared is the *trend* (which step helps, and roughly by how much), not the
numbers. The real-photo rows come from ``real_subset.py --methods`` with the same presets.

Usage::

    python bench/milestones.py [--root DATA] [--workers 2] [--methods rootsift-bow ...]
    python bench/real_subset.py --methods rootsift-bow rootsift-bow-sv ...   # the real subset
"""

from __future__ import annotations

import argparse
from pathlib import Path

#: (milestone, preset, published Oxford 5K mAP %, where it comes from)
MILESTONES: list[tuple[str, str, float | None, str]] = [
    ("BoW, large vocabulary", "rootsift-bow", 61.8, "Philbin et al. 2007 (1M words)"),
    ("+ spatial re-ranking", "rootsift-bow-sv", 64.7, "Philbin et al. 2007"),
    ("+ average query expansion", "rootsift-bow-sv-qe", None, "Chum et al. 2007"),
    (
        "soft assignment + SV + QE",
        "rootsift-bow-sa-sv-qe",
        71.8,
        "Philbin et al. 2008 (Paris vocabulary)",
    ),
    ("Hamming embedding", "rootsift-he", None, "Jegou et al. 2008"),
    ("HE + weak geometric consistency", "rootsift-he-wgc", 54.7, "Jegou et al. 2008 (20K words)"),
    ("RootSIFT + SV + DQE", "rootsift-bow-sv-dqe", None, "Arandjelovic & Zisserman 2012"),
    (
        "RootSIFT + DBA + SV + DQE",
        "rootsift-bow-dba-sv-dqe",
        80.9,
        "Arandjelovic & Zisserman 2012 (independent vocabulary)",
    ),
    ("ASMK", "rootsift-asmk", None, "Tolias et al. 2013"),
    ("ASMK + SV", "rootsift-asmk-sv", None, "Tolias et al. 2013"),
]


def main() -> int:
    import oxbench
    from oxbench.datasets.paths import data_root
    from oxbench.errors import InputError
    from oxbench.pipelines.method import METHODS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--root",
        type=Path,
        default=None,
        help="data root of the synthetic sets (built on first use)",
    )
    ap.add_argument(
        "--cache", type=Path, default=None, help="the shared cache (default: <root>/_cache)"
    )
    ap.add_argument("--runs", type=Path, default=Path("runs") / "milestones")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--methods", nargs="*", default=None, help="only these presets")
    args = ap.parse_args()
    root = data_root(args.root)
    rows = [r for r in MILESTONES if args.methods is None or r[1] in args.methods]
    print(
        "| milestone | preset | synthetic E / M / H | published Oxford 5K | source | CPU-s (cold: features and vocabulary in the first rows) |"
    )
    print("|---|---|---|---|---|---:|")
    for label, preset, published, source in rows:
        if preset not in METHODS.names():
            print(f"| {label} | {preset} | (no such preset here) | | {source} | |", flush=True)
            continue
        try:
            out = oxbench.run(
                "synthetic",
                preset,
                root=root,
                cache=args.cache,
                runs_dir=args.runs,
                workers=args.workers,
                progress=False,
            )
        except InputError as exc:
            print(f"| {label} | {preset} | n/a: {exc} | | {source} | |", flush=True)
            continue
        cpu = float(
            out.timings.get("total_cpu", 0.0)
        )  # this process, its workers and finished children
        s = out.result.setups
        ehm = " / ".join(f"{100 * s[k].map:.2f}" for k in ("easy", "medium", "hard"))
        pub = f"{published:.1f}" if published is not None else "(not quoted)"
        print(f"| {label} | `{preset}` | {ehm} | {pub} | {source} | {cpu:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
