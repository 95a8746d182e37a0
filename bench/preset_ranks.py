"""Every built-in preset's ranks at small sizes, as digests: run before and after a refactor that
must not change a number, and compare.

    python bench/preset_ranks.py --out before.json            # run every preset once
    python bench/preset_ranks.py --out after.json --check before.json

Each preset runs on the tiny synthetic cities of :func:`oxbench.testing.make_tiny_root` (40
database images, 4 queries, 320 x 240 px) with small settings: few local features, a small
vocabulary, R = 20, random-init networks (no weights can be downloaded here; a foundation model at
56 px), and random descriptor files for the ``features`` presets. The digests (SHA-256 of the int64 ranks and of the float32
scores) are what must stay bit-identical; they differ between CPUs (SIMD paths), so compare two
runs on one machine. ``--check`` exits 1 naming every preset whose ranks changed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import oxbench
from oxbench.pipelines import METHODS, RecordOptions, Session, resolve_method
from oxbench.pipelines.presets import settings_rows
from oxbench.testing import make_tiny_root

#: Variants beside the presets: settings whose names a refactor may change, with the same meaning
#: (the row's name stays, its overrides follow the names of the day).
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "rootsift-he-wgc [mapped]": ("rootsift-he-wgc", {"inverted_file": "mapped"}),
    "rootsift-asmk [mapped]": ("rootsift-asmk", {"inverted_file": "mapped"}),
    "features [faiss-flat]": ("features", {"search": "faiss-flat"}),
    "rootsift-vlad-w-aqe [qe.k=3]": ("rootsift-vlad-w-aqe", {"aqe.k": 3}),
}

#: Small but real settings of local features, vocabularies and short lists.
LOCAL = {"features.max_side": 320, "features.n_features": 300}


def descriptor_files(folder: Path) -> dict[str, Path]:
    """Random unit descriptors for the ``features`` presets (40 db, 4 queries, 30 training)."""
    rng = np.random.default_rng(0)
    out = {}
    for name, n in (("db", 40), ("q", 4), ("train", 30)):
        x = rng.standard_normal((n, 32)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[name] = folder / f"{name}.npy"
        np.save(out[name], x)
    return out


def small_settings(name: str, files: dict[str, Path]) -> dict[str, object]:
    """The overrides that make preset ``name`` small (only the settings it has)."""
    config: Any = METHODS.get(name)
    rows = {r.name for r in settings_rows(config)}
    out: dict[str, object] = {}
    kind = getattr(getattr(config, "descriptor", None), "kind", None)
    for key, value in LOCAL.items():
        for prefix in ("", "descriptor.", "local_source."):
            if prefix + key in rows:
                out[prefix + key] = value
    for instance in getattr(config, "stage_instances", []):
        if f"{instance}.top_r" in rows:
            out[f"{instance}.top_r"] = 20  # the short lists of every verifying stage
        if instance.startswith("diffusion"):
            out[f"{instance}.k"] = 10
    for key, value in (
        ("vocabulary.size", 200),
        ("descriptor.vocabulary.size", 16),
        ("descriptor.weights", "random"),
        ("descriptor.max_side", 160),
        ("descriptor.scales", "1.0"),
        ("search.nlist", 4),
        ("search.m", 4),
        ("search.nprobe", 2),
        ("search.nbits", 4),
    ):
        if key in rows:
            out[key] = value
    if kind == "vit":
        out["descriptor.max_side"] = 56  # a foundation model's random-init weights, 4 x 3 patches
    if getattr(getattr(config, "descriptor", None), "model_whitening", False):
        out["descriptor.model_whitening"] = False  # random weights carry no whitening
    if getattr(config, "whitening_dim", None):
        out["whitening_dim"] = 16  # fewer than the 30 training images
    if kind == "files" or name.startswith("features"):
        out["descriptor.db_features"] = str(files["db"])
        out["descriptor.query_features"] = str(files["q"])
        out["descriptor.train_features"] = str(files["train"])
    if getattr(config, "global_source", None):
        source = config.global_source.split()[0]
        extra = small_settings(source, files)
        out["global_source"] = " ".join([source, *(f"{k}={v}" for k, v in extra.items())])
    return out


def run_preset(name: str, root: Path, cache: Path, runs: Path, files: dict[str, Path]) -> dict:
    preset, extra = VARIANTS.get(name, (name, {}))
    overrides = {**small_settings(preset, files), **extra}
    name = preset
    resolve_method(name, **overrides)  # a wrong small setting is one line here, before a run
    t0 = time.perf_counter()
    out = oxbench.run(
        "synthetic",
        name,
        overrides=overrides,
        session=Session(root=root, cache=cache, workers=1, progress=False),
        record=RecordOptions(runs_dir=runs),
    )
    ranks = np.load(out.run_dir / "ranks.npy")
    scores_path = out.run_dir / "scores.npy"
    scores = np.load(scores_path) if scores_path.exists() else None
    return {
        "ranks_sha256": hashlib.sha256(np.ascontiguousarray(ranks, np.int64).tobytes()).hexdigest(),
        "scores_sha256": None
        if scores is None
        else hashlib.sha256(np.ascontiguousarray(scores, np.float32).tobytes()).hexdigest(),
        "map_medium": round(float(out.result.setups["medium"].map), 6)
        if "medium" in out.result.setups
        else None,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file of the digests")
    ap.add_argument("--check", type=Path, help="digests of an earlier run to compare with")
    ap.add_argument("--work", type=Path, help="folder for data, cache and runs (default: temp)")
    ap.add_argument("--only", help="comma-separated presets (default: every built-in one)")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else [*oxbench.list_methods(), *VARIANTS]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        root = make_tiny_root(work / "data")
        files = descriptor_files(work)
        results: dict[str, Any] = {}
        for name in names:
            try:
                results[name] = run_preset(name, root, work / "cache", work / "runs", files)
            except Exception as exc:  # a preset that cannot run small is recorded, not hidden
                results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(name, json.dumps(results[name]), flush=True)
    args.out.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.check is None:
        return 0
    before = json.loads(args.check.read_text())
    changed = [
        n
        for n in names
        if n in before
        and (
            before[n].get("ranks_sha256") != results[n].get("ranks_sha256")
            or before[n].get("error") != results[n].get("error")
        )
    ]
    missing = sorted(set(before) - set(results)) if not args.only else []
    for n in changed:
        print(f"CHANGED {n}: {before[n]} -> {results[n]}")
    for n in missing:
        print(f"MISSING {n}")
    compared = [n for n in names if n in before]
    new = len(names) - len(compared)
    print(
        f"{len(compared) - len(changed)} of {len(compared)} presets have the same ranks"
        + (f" ({new} new, not in the earlier digests)" if new else "")
    )
    return 1 if changed or missing else 0


if __name__ == "__main__":
    from interrupt import run_script

    run_script(main)
