"""The catalog: every dataset entry by id (``oxbench data list``).

The built-in entries are declared with their families, one module per family in
:mod:`oxbench.datasets.families` (imported on the first lookup); a package of one's own adds
entries through the ``oxbench.datasets`` entry-point group (:mod:`oxbench.registry`): a module
that calls :func:`register` when imported, or a :class:`~oxbench.datasets.spec.DatasetSpec` (or a
list of them) registered under its id. ``oxbench.testing.check_dataset`` checks an entry.

Canonical layout below the data root (``<root>/<id>/``) of the built-in entries:

- ``oxford5k``: ``jpg/<name>.jpg`` (5,063) and ``gt_files_170407/<landmark>_<n>_{good,ok,junk,query}.txt``;
- ``paris6k``: ``jpg/<name>.jpg`` (6,412 incl. 20 corrupt), ``paris_120310/*.txt``, ``corrupt.txt``;
- ``roxford5k`` / ``rparis6k``: ``jpg/<name>.jpg`` and ``gnd_<id>.pkl`` (as revisitop lays them out);
- ``revisitop1m``: ``jpg/<path from revisitop1m.txt>`` and ``revisitop1m.txt``;
- ``oxford100k``: ``jpg/<name>.jpg``;
- ``holidays``: ``jpg/<nnnnnn>.jpg``, ``holidays_images.dat`` and, optionally, ``jpg_rotated/``
  (the same 1,491 file names, turned upright by hand: used by ``orientation="rotated"``);
- ``ukbench``: ``jpg/ukbench<nnnnn>.jpg``;
- ``gldv2-retrieval``: ``retrieval_solution_v2.1.csv``, ``index.csv`` and, where read,
  ``index/a/b/c/<id>.jpg`` and ``test/a/b/c/<id>.jpg``;
- ``ilias``: ``image_ids/{image_query_ids,text_query_ids,positive_ids}.txt``, optionally
  ``image_ids/distractor_ids.txt[.gz]`` and ``misc/taxonomy.json``, and where read the
  ``ilias_core`` images ``<instance>/{query,pos}/*.jpg``.
"""

from __future__ import annotations

import importlib
import pkgutil

from oxbench.datasets.spec import DatasetSpec
from oxbench.registry import GROUPS, Registry

#: The package whose every module is a dataset family with its entries; imported on first lookup.
FAMILIES_PACKAGE = "oxbench.datasets.families"


def _load_families() -> None:
    package = importlib.import_module(FAMILIES_PACKAGE)
    names = [
        info.name.rsplit(".", 1)[-1]
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    ]
    order = list(getattr(package, "ORDER", ()))
    for name in [n for n in order if n in names] + sorted(n for n in names if n not in order):
        importlib.import_module(f"{FAMILIES_PACKAGE}.{name}")


def _adopt(name: str, obj: object) -> None:
    """An ``oxbench.datasets`` entry point that names an entry, or a list of entries."""
    for spec in obj if isinstance(obj, list | tuple) else [obj]:
        if not isinstance(spec, DatasetSpec):
            raise TypeError(f"entry point {name!r} names {spec!r}, not a module or a DatasetSpec")
        register(spec)


#: All dataset entries, by id.
DATASETS: Registry[DatasetSpec] = Registry(
    "dataset", loader=_load_families, group=GROUPS["datasets"], adopt=_adopt
)


def get_spec(dataset_id: str) -> DatasetSpec:
    """The entry of ``dataset_id``.

    Raises:
        InputError: unknown id (the message lists the known ones).
    """
    return DATASETS.get(dataset_id)


def register(spec: DatasetSpec) -> DatasetSpec:
    """Add an entry to :data:`DATASETS` (what a family module does for each of its entries)."""
    if not isinstance(spec, DatasetSpec):
        raise TypeError(f"{spec!r} is not a DatasetSpec")
    return DATASETS.register(spec.id, spec)
