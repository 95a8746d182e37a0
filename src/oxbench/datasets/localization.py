"""Localisation ground truth of a dataset on disk (:mod:`oxbench.evaluation.localization`).

- the synthetic sets: the box of each query's region in every positive database image (Easy or
  Hard for that query), known by construction from the generation plan
  (:func:`oxbench.datasets.synthetic.plan.query_region_boxes`); nothing is rendered;
- every other set: Tolias et al. 2016's protocol, the boxes of the other queries of the same
  landmark in their images (:func:`oxbench.evaluation.localization.truth_from_queries`), checked
  against the sizes of those images -- Oxford 5K / Paris 6K; sets whose query images are not in
  the database (ROxford / RParis) or whose queries have no box (Holidays, UKBench) are refused.

Nothing is generated: a synthetic set that is not on disk is an error saying how to make it.
"""

from __future__ import annotations

from pathlib import Path

from oxbench.datasets.catalog import get_spec
from oxbench.datasets.paths import data_root
from oxbench.errors import InputError
from oxbench.evaluation.localization import Box, LocalizationTruth, check_box, truth_from_queries


def localization_truth(
    dataset_id: str, root: str | Path | None = None, *, strict: bool = True
) -> LocalizationTruth:
    """Where each query's object lies in the database images that count (module docstring).

    Raises:
        InputError: an unknown or missing dataset, a query without a box, no pair, a box outside
            its image.
    """
    from oxbench.datasets.loaders import load, load_ground_truth

    spec = get_spec(dataset_id)
    ddir = data_root(root) / spec.id
    if spec.synthetic:
        from oxbench.datasets.synthetic.config import SynthConfig
        from oxbench.datasets.synthetic.generate import read_manifest
        from oxbench.datasets.synthetic.plan import query_region_boxes

        manifest = read_manifest(ddir) if ddir.is_dir() else None
        if manifest is None:
            raise InputError(
                f"no complete synthetic set {spec.id} here; make it with `oxbench data synth`", ddir
            )
        config = SynthConfig.from_dict(manifest["config"])
        gt = load_ground_truth(dataset_id, root)
        for q in gt.queries:
            if q.bbox is None:
                raise InputError(
                    f"query {q.name} has no box; localisation needs a box for every query",
                    gt.source,
                )
        size = (int(config.image_size[0]), int(config.image_size[1]))
        qindex = {n: i for i, n in enumerate(gt.query_names)}
        positives: dict[int, set[int]] = {}
        for qi, q in enumerate(gt.queries):
            for d in q.positives.tolist():
                positives.setdefault(int(d), set()).add(qi)
        boxes: dict[tuple[int, int], tuple[Box, ...]] = {}
        for d in sorted(positives):
            for name, box in query_region_boxes(config, d).items():
                qi = qindex.get(name, -1)
                if qi in positives[d]:
                    boxes[(qi, d)] = (
                        check_box(box, size, f"image {gt.db_names[d]}: box of {name}", gt.source),
                    )
        return LocalizationTruth(
            gt.dataset, gt.query_names, boxes, {d: size for _, d in boxes}, kind="generated"
        )
    bench = load(dataset_id, root, strict=strict, progress=False)
    gt = bench.gt
    first = truth_from_queries(gt)  # the pairs (and every query's box); then the images' sizes
    from oxbench.imaging import open_image

    sizes: dict[int, tuple[int, int]] = {}
    for _, d in first.boxes:
        path = bench.database.path(d)
        if d not in sizes and path is not None:
            with open_image(path) as im:
                sizes[d] = (int(im.size[0]), int(im.size[1]))
    return truth_from_queries(gt, sizes)
