"""Loading a dataset from its canonical layout: :func:`load` and :func:`load_ground_truth`.

Both resolve the catalog entry and hand over to its family (:mod:`oxbench.datasets.families`),
which knows the files, the ground truth and the database order of its kind of benchmark; a
distractor set asked for is attached here, after the database. Loading reads the ground truth with
the shared parsers of :mod:`oxbench.formats` and checks that every image file it refers to is
present; it does not decode images (``verify`` does).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from oxbench.datasets.base import Benchmark, CropConvention, UnreadImages
from oxbench.datasets.catalog import DATASETS, get_spec
from oxbench.datasets.paths import data_root
from oxbench.datasets.spec import DatasetSpec
from oxbench.errors import InputError
from oxbench.groundtruth import GroundTruth

T = TypeVar("T")


def load(
    dataset_id: str,
    root: str | Path | None = None,
    *,
    distractors: str | int | None = None,
    crop: CropConvention = "python",
    strict: bool = True,
    progress: bool = True,
    images: bool = True,
    **options: str,
) -> Benchmark:
    """Load a benchmark from ``<root>/<dataset_id>/``.

    The synthetic sets (``synthetic``, ``synthetic-train``) are generated on first use: both the
    test and the training city, resuming an interrupted generation.

    Args:
        dataset_id: a catalog id (``oxbench data list``).
        root: data root (``--root``; default ``$OXBENCH_DATA`` or the per-user default).
        distractors: a distractor set id (``"revisitop1m"``, ``"oxford100k"``) attached after the
            database -- distractor ``j`` has ranking index ``n_db + j``, as in
            ``oxbench evaluate --distractors`` -- or an int: the first N images of the dataset's
            default distractor set (for ``synthetic``: N generated distractors).
        crop: query-crop convention, ``"python"`` (default) or ``"matlab"``; recorded.
        strict: refuse counts that differ from the official ones (False: warn; for subsets).
        progress: progress bars (shown while a synthetic set is generated).
        images: ``False`` for a run that reads no pixels (descriptors from the user's files): the
            benchmark is built from the ground truth alone, its images named but not looked for
            (reading one is an error), and ``options["images"] = "not used"`` records it. A
            generated set not yet generated (synthetic) is generated first; runs with
            distractors load as usual.
        options: dataset options, e.g. ``orientation="original"|"rotated"`` for Holidays;
            recorded in ``Benchmark.options``.

    Raises:
        InputError: unknown id or option, missing files (with the fetch/import remedy),
            malformed ground truth, counts that differ (``strict``).
    """
    spec = get_spec(dataset_id)
    if crop not in ("python", "matlab"):
        raise InputError(f"unknown crop convention {crop!r}; use 'python' or 'matlab'")
    for key, value in options.items():
        allowed = spec.options.get(key)
        if allowed is None:
            known = ", ".join(sorted(spec.options)) or "none"
            raise InputError(f"{spec.id} has no option {key!r} (options: {known})")
        if str(value) not in allowed:
            raise InputError(
                f"{spec.id} option {key}={value!r} must be one of {', '.join(allowed)}"
            )
    ddir = data_root(root) / spec.id
    identity = (
        None if images or distractors is not None else spec.family.image_free_options(spec, ddir)
    )
    if identity is not None:
        gt = _made(
            spec, "ground_truth", GroundTruth, spec.family.ground_truth(spec, ddir, strict=strict)
        )
        recorded = {**identity, **{k: str(v) for k, v in options.items()}}
        recorded["images"] = "not used"
        if not strict:
            recorded["strict"] = "false"
        return Benchmark(
            id=spec.id,
            gt=gt,
            database=UnreadImages(gt.db_names, spec.id),
            queries=UnreadImages(gt.query_names, spec.id),
            protocols=spec.protocols,
            root=ddir,
            crop=crop,
            options=recorded,
        )
    own = spec.family.own_distractors
    bench = spec.family.load(
        spec,
        ddir,
        distractors=distractors if own else None,
        crop=crop,
        strict=strict,
        options={k: str(v) for k, v in options.items()},
        progress=progress,
    )
    bench = _made(spec, "load", Benchmark, bench)
    if distractors is None or own:
        return bench
    return _attach_distractors(spec, bench, ddir, distractors, strict=strict)


def _attach_distractors(
    spec: DatasetSpec, bench: Benchmark, ddir: Path, distractors: str | int, *, strict: bool
) -> Benchmark:
    """``bench`` with a distractor set after its database: a set id, or an int (the first N of
    the dataset's default set)."""
    from oxbench.datasets.families.distractors import Distractors

    limit = None
    if isinstance(distractors, int) and not isinstance(distractors, bool):
        limit, distractors = distractors, _default_distractors(spec)
    dspec = get_spec(str(distractors))
    if not isinstance(dspec.family, Distractors):
        raise not_a_distractor_set(dspec)
    if (
        spec.id not in dspec.distractors_for
    ):  # another benchmark's distractors give numbers no paper has
        try:
            right = f"; {spec.id}'s is {_default_distractors(spec)}"
        except InputError:
            right = ""
        raise InputError(
            f"{dspec.id} holds the distractors of {', '.join(dspec.distractors_for)}, not of {spec.id}{right}"
        )
    dimgs = dspec.family.images(dspec, ddir.parent / dspec.id, strict=strict, limit=limit)
    recorded = dict(bench.options)
    recorded["distractors"] = dspec.id if limit is None else f"{dspec.id}[:{limit}]"
    return replace(bench, distractors=dimgs, options=recorded)


def not_a_distractor_set(spec: DatasetSpec) -> InputError:
    """The error for a distractor set id that names another kind of dataset."""
    from oxbench.datasets.families.distractors import Distractors

    sets = ", ".join(i for i in DATASETS if isinstance(get_spec(i).family, Distractors))
    return InputError(f"{spec.id} is not a distractor set (distractor sets: {sets})")


def _default_distractors(spec: DatasetSpec) -> str:
    for other in DATASETS:
        if spec.id in get_spec(other).distractors_for:
            return other
    raise InputError(f"{spec.id} has no distractor set; pass a distractor set id")


def load_ground_truth(
    dataset_id: str, root: str | Path | None = None, *, strict: bool = True
) -> GroundTruth:
    """Only the ground truth of a dataset -- what scoring needs (``oxbench evaluate --dataset``).

    Image files are not read, except that Oxford 5K / Paris 6K need their ``jpg/`` listing (their
    database order is the sorted image names, as in :func:`load`) and UKBench with
    ``strict=False`` counts its images. Nothing is generated: a synthetic set that is not on disk
    is an error saying how to make it.

    Raises:
        InputError: unknown id, a distractor set, missing ground-truth files (with the remedy).
    """
    spec = get_spec(dataset_id)
    gt = spec.family.ground_truth(spec, data_root(root) / spec.id, strict=strict)
    return _made(spec, "ground_truth", GroundTruth, gt)


def _made(spec: DatasetSpec, method: str, kind: type[T], value: object) -> T:
    """``value``, what ``spec``'s family's ``method`` returned, if it is a ``kind`` (a plugin's
    family that returns something else is one line naming it, not an error deep in a step)."""
    if not isinstance(value, kind):
        raise InputError(
            f"dataset {spec.id}: its family's {method}() gave a {type(value).__name__}, not a "
            f"{kind.__name__} (family {type(spec.family).__module__}.{type(spec.family).__name__})"
        )
    return value


def distractor_count(dataset_id: str, root: str | Path | None = None) -> int:
    """Number of images of a distractor set on disk (``len(revisitop1m.txt)`` for R1M)."""
    from oxbench.datasets.families.distractors import Distractors

    spec = get_spec(dataset_id)
    if not isinstance(spec.family, Distractors):
        raise not_a_distractor_set(spec)
    return len(spec.family.files(spec, data_root(root) / spec.id))
