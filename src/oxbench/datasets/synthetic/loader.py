"""Load a generated synthetic benchmark, and make the default test and training cities."""

from __future__ import annotations

import logging
from pathlib import Path

from oxbench.datasets.base import Benchmark, CropConvention, FileImages
from oxbench.datasets.synthetic.config import (
    DEFAULT_TEST,
    DEFAULT_TRAIN,
    GENERATOR_VERSION,
    SynthConfig,
)
from oxbench.datasets.synthetic.distractor_kinds import parse_kind_spec
from oxbench.datasets.synthetic.generate import generate, read_manifest
from oxbench.datasets.synthetic.stream import SyntheticDistractors
from oxbench.errors import InputError
from oxbench.execution import Executor
from oxbench.formats.revisitop import read_gnd
from oxbench.formats.safe_pickle import load_plain_pickle
from oxbench.groundtruth import GroundTruth
from oxbench.protocol import get_protocol

log = logging.getLogger(__name__)


def load_synthetic(
    dataset_dir: str | Path,
    *,
    distractors: int | str | None = None,
    crop: CropConvention = "python",
) -> Benchmark:
    """Load a synthetic benchmark written by :func:`~oxbench.datasets.synthetic.generate`.

    Args:
        dataset_dir: the folder holding ``manifest.json``, ``gnd_<name>.pkl`` and ``jpg/``.
        distractors: number of on-demand distractors of the city to append (index
            ``n_db + j``), or ``synthetic-<kind>:N`` / ``synthetic-mined-<kind>:N`` for other
            kinds (:mod:`~oxbench.datasets.synthetic.distractor_kinds`); default: the count
            recorded at generation (``--distractors``), none when 0.
        crop: query-crop convention.

    Returns:
        A :class:`~oxbench.datasets.base.Benchmark` with protocol ``revisited``.

    Raises:
        InputError: the folder is not a complete synthetic set (run ``oxbench data synth``).
    """
    root = Path(dataset_dir)
    manifest = read_manifest(root) if root.is_dir() else None
    if manifest is None:
        raise InputError(
            "no complete synthetic benchmark here (manifest.json missing); generate it with `oxbench data synth --out DIR`",
            root,
        )
    config = SynthConfig.from_dict(manifest["config"])
    gt = _read_ground_truth(root / manifest["gnd"], manifest["dataset"])
    jpg = root / "jpg"
    db = FileImages(gt.db_names, tuple(jpg / f"{n}.jpg" for n in gt.db_names))
    queries = FileImages(gt.query_names, tuple(jpg / f"{n}.jpg" for n in gt.query_names))
    missing = next((p for p in db.paths + queries.paths if not p.exists()), None)
    if missing is not None:
        raise InputError("image listed in the ground truth is missing; regenerate the set", missing)
    if isinstance(distractors, str):
        source: SyntheticDistractors | None = kind_distractors(root, config, distractors)
    else:
        n_distr = config.distractors if distractors is None else int(distractors)
        if n_distr < 0:
            raise InputError(f"distractors must be >= 0, got {n_distr}")
        source = SyntheticDistractors(config, n_distr) if n_distr else None
    return Benchmark(
        id=manifest["dataset"],
        gt=gt,
        database=db,
        queries=queries,
        protocols=("revisited",),
        root=root,
        distractors=source,
        crop=crop,
        options={
            "city": config.city,
            "seed": str(config.seed),
            "images_sha256": manifest["checksums"]["images_sha256"],
        },
    )


def kind_distractors(root: Path, config: SynthConfig, text: str) -> SyntheticDistractors:
    """The distractors ``synthetic-<kind>:N`` asks for, or the mined selection
    ``synthetic-mined-<kind>:N`` names (``<root>/mined/<kind>-<N>.json``, written by
    :func:`oxbench.pipelines.mining.mine_distractors`).

    Raises:
        InputError: one line: a malformed spec, an unknown kind, a mined selection not made.
    """
    from oxbench.datasets.mining import read_selection

    spec = parse_kind_spec(text)
    if not spec.mined:
        return SyntheticDistractors(config, spec.count, kind=spec.kind)
    indices = read_selection(root, spec.kind, spec.count)
    return SyntheticDistractors(config, spec.count, kind=spec.kind, pool=indices)


def _read_ground_truth(path: Path, dataset: str) -> GroundTruth:
    """The gnd pickle; a set generated without queries (a training city) has an empty ``gnd``."""
    obj = load_plain_pickle(path)
    if isinstance(obj, dict) and obj.get("qimlist") == [] and obj.get("gnd") == []:
        names = obj.get("imlist")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InputError("'imlist' must be a list of image names", path)
        return GroundTruth(dataset, get_protocol("revisited"), tuple(names), (), source=str(path))
    return read_gnd(path, dataset=dataset)


def ensure_default(
    root: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    executor: Executor | None = None,
) -> tuple[Path, Path]:
    """Make sure ``<root>/synthetic`` (test city) and ``<root>/synthetic-train`` (training city) exist.

    Each is generated if missing or incomplete (resuming an interrupted run); a complete set is
    kept as it is, whatever config made it, unless an older version of the renderer made it (then
    it is regenerated with its own config). The training city shares no building with the test
    city (the other-city rule for vocabularies and whitening). ``executor``: render through it (a
    run's engine) instead of a local process pool of ``workers``.

    Returns:
        ``(test_dir, train_dir)``.
    """
    root = Path(root).expanduser()
    dirs = []
    for config in (DEFAULT_TEST, DEFAULT_TRAIN):
        out = root / config.name
        manifest = read_manifest(out) if out.is_dir() else None
        if manifest is not None:
            if manifest.get("generator_version") == GENERATOR_VERSION:
                dirs.append(out)
                continue
            # made by another version of the renderer: remake it with the same config so that
            # results stay comparable with this version's
            log.warning(
                "%s was made by synthetic generator version %s; regenerating with version %s",
                out,
                manifest.get("generator_version"),
                GENERATOR_VERSION,
            )
            config = SynthConfig.from_dict(manifest["config"])
            dirs.append(
                generate(
                    out,
                    config,
                    workers=workers,
                    progress=progress,
                    overwrite=True,
                    executor=executor,
                )
            )
            continue
        log.info("generating the default synthetic set %s in %s", config.name, out)
        dirs.append(generate(out, config, workers=workers, progress=progress, executor=executor))
    return dirs[0], dirs[1]
