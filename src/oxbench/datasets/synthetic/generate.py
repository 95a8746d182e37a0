"""Write a synthetic benchmark to disk: images, revisitop ground truth, text files, manifest.

Layout of ``out_dir`` (the revisited layout, docs/protocols.md "File formats")::

    jpg/<name>.jpg                 database and query images (queries are not in the database)
    gnd_<name>.pkl                 revisitop ground truth: imlist, qimlist, gnd (bbx/easy/hard/junk)
    gt_files/<lm>_<n>_{good,ok,junk,query}.txt   the same labels in the original text format
                                   (good = Easy, ok = Hard, junk = Unclear)
    manifest.json                  config, counts, thresholds, per-image parameters; written last

Generation is resumable and atomic: images are written one by one through a temp file, progress is
logged in ``.partial/``, and ``manifest.json`` -- the mark of a complete set -- is written last.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import shutil
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from oxbench.datasets.fetch import check_free_space
from oxbench.datasets.synthetic.config import GENERATOR_VERSION, SynthConfig
from oxbench.datasets.synthetic.plan import (
    db_name,
    query_specs,
    render_db_image,
    render_query_image,
)
from oxbench.errors import InputError, require_installed
from oxbench.execution import Executor, ProcessExecutor, SerialExecutor, available_cores
from oxbench.fileio import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    file_sha256,
    make_folder,
    os_reason,
    progress_bar,
    read_input_bytes,
    remove_stale_temps,
    text_digest,
)
from oxbench.formats.revisitop import write_gnd
from oxbench.groundtruth import GroundTruth, make_query
from oxbench.protocol import get_protocol

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "oxbench-synthetic"
_PARTIAL = ".partial"


def _task(args: tuple[SynthConfig, str, int, str]) -> dict[str, Any]:
    """Render one image and write it atomically (runs in a worker process)."""
    config, what, index, jpg_dir = args
    data, record = (render_db_image if what == "db" else render_query_image)(config, index)
    atomic_write_bytes(Path(jpg_dir) / f"{record['name']}.jpg", data)
    record["_task"] = [what, index]
    return record


def _run_tasks(
    tasks: list[tuple[SynthConfig, str, int, str]], workers: int, executor: Executor | None
) -> Iterator[dict[str, Any]]:
    if executor is not None:  # the run's own engine (its owner closes it)
        yield from executor.map(_task, tasks)
        return
    # a daemonic process (e.g. a multiprocessing.Pool worker) may not start children
    serial = multiprocessing.current_process().daemon
    with SerialExecutor() if serial else ProcessExecutor(workers) as own:
        yield from own.map(_task, tasks)


def _read_records(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Records of finished images; a torn last line (interrupted run) is ignored."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
            out[(rec["_task"][0], int(rec["_task"][1]))] = rec
        except (json.JSONDecodeError, KeyError, TypeError, IndexError):
            continue
    return out


def _sha256(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def read_manifest(dataset_dir: Path) -> dict[str, Any] | None:
    """The manifest of a complete synthetic set, or ``None`` when absent (incomplete)."""
    path = Path(dataset_dir) / MANIFEST
    if not path.exists():
        return None
    data = read_input_bytes(path, limit=1 << 28)  # a FIFO or a device there: refused, not read
    try:
        manifest = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"unreadable synthetic manifest ({exc})", path) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InputError(f"not an oxbench synthetic manifest (format != {FORMAT!r})", path)
    return manifest


def clear(out_dir: Path) -> None:
    """Remove what :func:`generate` writes in ``out_dir`` (the manifest first), nothing else."""
    out_dir = Path(out_dir)
    (out_dir / MANIFEST).unlink(missing_ok=True)
    for sub in (_PARTIAL, "gt_files", "jpg"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    for p in out_dir.glob("gnd_*.pkl"):
        p.unlink()


def generate(
    out_dir: str | Path,
    config: SynthConfig,
    *,
    workers: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    on_image: Callable[[int, int], None] | None = None,
    executor: Executor | None = None,
) -> Path:
    """Generate the benchmark described by ``config`` into ``out_dir`` (resumable).

    A complete set with the same config is left as it is. An interrupted run with the same config
    is resumed (finished images are kept after their checksum is verified); leftovers of an
    interrupted run with another config are cleared. A complete set with another config is
    refused unless ``overwrite``.

    Args:
        out_dir: the dataset folder (e.g. ``<root>/synthetic``).
        config: what to generate.
        workers: processes (default: one per available core; 1 = in this process), through
            :class:`oxbench.execution.ProcessExecutor`.
        progress: show a tqdm progress bar.
        overwrite: replace a complete set made with another config.
        on_image: called with ``(done, total)`` after each image.
        executor: render through this executor instead (a run's engine: its local processes or
            its Dask cluster, whose workers write into ``out_dir`` on the shared file system);
            ``workers`` is then ignored and the executor is not closed here.

    Returns:
        ``out_dir``.

    Raises:
        InputError: ``out_dir`` holds a different complete set and ``overwrite`` is false.
    """
    out = Path(out_dir)
    wanted = {"generator_version": GENERATOR_VERSION, "config": config.to_dict()}
    existing = read_manifest(out) if out.exists() else None
    if existing is not None:
        if {k: existing.get(k) for k in wanted} == wanted:
            log.info("%s is complete; nothing to do", out)
            return out
        if not overwrite:
            raise InputError(
                "holds a synthetic set made with another config; pass overwrite=True (--overwrite) "
                "or choose another folder",
                out,
            )
        clear(out)
    # cheap checks before anything is written: the renderer's extras, room for the JPEGs (at most
    # about half a byte per pixel at the qualities used)
    require_installed([("cv2", "classic"), ("PIL", "images")])
    w, h = config.image_size
    check_free_space(
        out, (config.db_size + len(query_specs(config))) * w * h // 2, margin=10_000_000
    )
    partial = out / _PARTIAL
    state_path = partial / "config.json"
    if state_path.exists():
        try:
            state = json.loads(state_path.read_text())
        except (OSError, json.JSONDecodeError):
            state = None
        if state != wanted:
            log.warning("%s: clearing an interrupted run made with another config", out)
            clear(out)
    make_folder(partial)
    if not state_path.exists():
        atomic_write_json(state_path, wanted, indent=None)
    jpg = make_folder(out / "jpg")
    for folder in (out, jpg, out / "gt_files"):  # temporary files of a killed run
        remove_stale_temps(folder)

    specs = query_specs(config)
    all_tasks = [(config, "query", q, str(jpg)) for q in range(len(specs))]
    all_tasks += [(config, "db", i, str(jpg)) for i in range(config.db_size)]
    records_path = partial / "records.jsonl"
    done = {
        key: rec
        for key, rec in _read_records(records_path).items()
        if _sha256(jpg / f"{rec['name']}.jpg") == rec.get("sha256")
    }
    todo = [t for t in all_tasks if (t[1], t[2]) not in done]
    if done:
        log.info("%s: resuming, %d of %d images already done", out, len(done), len(all_tasks))
    n_workers = workers if workers is not None else available_cores()
    bar = progress_bar(
        total=len(all_tasks),
        initial=len(done),
        enabled=progress,
        desc=f"synth {config.name}",
        unit="img",
    )
    # An append-only log, not an output: a torn last line (killed run) is ignored when resuming.
    try:
        with open(records_path, "a", encoding="utf-8") as fh:
            for rec in _run_tasks(todo, n_workers, executor):
                fh.write(json.dumps(rec, sort_keys=True) + "\n")
                fh.flush()
                done[(rec["_task"][0], int(rec["_task"][1]))] = rec
                bar.update(1)
                if on_image is not None:
                    on_image(len(done), len(all_tasks))
    except OSError as exc:
        raise InputError(f"cannot write: {os_reason(exc)}", records_path) from None
    finally:
        bar.close()
    _finish(out, config, done)
    return out


def ground_truth(config: SynthConfig, db_records: list[dict[str, Any]]) -> GroundTruth:
    """The revisited ground truth from the per-image records (labels decided at render time)."""
    specs = query_specs(config)
    names = tuple(rec["name"] for rec in db_records)
    queries = []
    for spec in specs:
        lab: dict[str, list[int]] = {"easy": [], "hard": [], "junk": []}
        for i, rec in enumerate(db_records):
            entry = rec.get("labels", {}).get(spec.name)
            if entry is not None and entry["label"] in lab:
                lab[entry["label"]].append(i)
        if not lab["easy"] and not lab["hard"]:
            raise RuntimeError(f"synthetic query {spec.name} has no positives (generator bug)")
        queries.append(
            make_query(spec.name, spec.bbox, easy=lab["easy"], hard=lab["hard"], junk=lab["junk"])
        )
    return GroundTruth(
        config.name, get_protocol("revisited"), names, tuple(queries), source=config.name
    ).validate()


def write_gt_files(gt: GroundTruth, out_dir: Path, landmark_of: Iterable[tuple[str, int]]) -> None:
    """The original-protocol text files: good = Easy, ok = Hard, junk = Unclear, query box."""
    gt_dir = make_folder(out_dir)
    for q, (label, number) in zip(gt.queries, landmark_of, strict=True):
        stem = f"{label}_{number}"
        for suffix, arr in (("good", q.easy), ("ok", q.hard), ("junk", q.junk)):
            text = "".join(f"{gt.db_names[i]}\n" for i in arr.tolist())
            atomic_write_text(gt_dir / f"{stem}_{suffix}.txt", text)
        assert q.bbox is not None
        x1, y1, x2, y2 = q.bbox
        atomic_write_text(
            gt_dir / f"{stem}_query.txt", f"{q.name} {x1:.6f} {y1:.6f} {x2:.6f} {y2:.6f}\n"
        )


def _finish(out: Path, config: SynthConfig, done: dict[tuple[str, int], dict[str, Any]]) -> None:
    specs = query_specs(config)
    missing = [i for i in range(config.db_size) if ("db", i) not in done]
    missing_q = [q for q in range(len(specs)) if ("query", q) not in done]
    if missing or missing_q:
        raise RuntimeError(f"{out}: {len(missing) + len(missing_q)} images were not generated")
    db_records = [_strip(done[("db", i)]) for i in range(config.db_size)]
    q_records = [_strip(done[("query", q)]) for q in range(len(specs))]
    for i, rec in enumerate(db_records):
        if rec["name"] != db_name(config, i):
            raise RuntimeError(f"{out}: record {i} is for {rec['name']}")
    gt = ground_truth(config, db_records)
    gnd_path = write_gnd(gt, out / f"gnd_{config.name}.pkl")
    write_gt_files(gt, out / "gt_files", [(s.label, s.number) for s in specs])
    counts = label_counts(gt)
    kinds: dict[str, int] = {}
    for rec in db_records:
        kinds[rec["kind"]] = kinds.get(rec["kind"], 0) + 1
    images_hash = text_digest("".join(r["sha256"] for r in q_records + db_records))
    from oxbench.version import __version__

    manifest = {
        "format": FORMAT,
        "generator_version": GENERATOR_VERSION,
        "oxbench_version": __version__,
        "dataset": config.name,
        "config": config.to_dict(),
        "city_seed": config.city_seed,
        "gnd": gnd_path.name,
        "counts": {"db": config.db_size, "queries": len(specs), "kinds": kinds, "labels": counts},
        "label_thresholds": config.to_dict()["labels"],
        "checksums": {"gnd_sha256": _sha256(gnd_path), "images_sha256": images_hash},
        "queries": q_records,
        "images": db_records,
    }
    atomic_write_json(out / MANIFEST, manifest)
    shutil.rmtree(out / _PARTIAL, ignore_errors=True)
    log.info("%s: wrote %d database images and %d queries", out, config.db_size, len(specs))


def _strip(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in rec.items() if k != "_task"}


def label_counts(gt: GroundTruth) -> dict[str, Any]:
    """Label totals over queries and per-query minimum / mean / maximum of each label."""
    out: dict[str, Any] = {}
    for field in ("easy", "hard", "junk"):
        sizes = [getattr(q, field).size for q in gt.queries]
        out[field] = {
            "total": int(sum(sizes)),
            "min": int(min(sizes)) if sizes else 0,
            "mean": round(sum(sizes) / len(sizes), 2) if sizes else 0.0,
            "max": int(max(sizes)) if sizes else 0,
        }
    pos = [q.easy.size + q.hard.size for q in gt.queries]
    out["positive_rate_medium"] = round(sum(pos) / max(1, len(pos)) / max(1, gt.n_db), 5)
    return out


def make_tiny_cities(root: str | Path) -> Path:
    """A tiny synthetic test city (40 database images, 4 queries) and training city (30 images)
    under ``root``, 320 x 240 pixels (about 2 s; needs opencv and Pillow; a complete set already
    there is kept). Returns ``root``."""
    root = Path(root)
    common: dict[str, Any] = {"landmarks": 2, "image_size": (320, 240), "generic_buildings": 4}
    generate(
        root / "synthetic",
        SynthConfig(db_size=40, queries_per_landmark=2, **common),
        workers=1,
        progress=False,
    )
    train = SynthConfig(
        name="synthetic-train",
        city="southbridge",
        seed=1,
        db_size=30,
        queries_per_landmark=1,
        **common,
    )
    generate(root / "synthetic-train", train, workers=1, progress=False)
    return root
