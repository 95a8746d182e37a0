"""Ground-truth pickles in the revisitop layout (``gnd_<dataset>.pkl``).

Two flavours share one reader:

- revisited (``gnd_roxford5k.pkl``, ``gnd_rparis6k.pkl``): each ``gnd[i]`` has ``bbx``, ``easy``,
  ``hard``, ``junk``;
- old protocol (``gnd_oxford5k.pkl``, ``gnd_paris6k.pkl``): each ``gnd[i]`` has ``bbx``, ``ok``
  (good and ok together) and ``junk``.

The files are read only through :func:`oxbench.formats.safe_pickle.load_plain_pickle`.
"""

from __future__ import annotations

import dataclasses
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oxbench.errors import InputError
from oxbench.fileio import atomic_write_bytes
from oxbench.formats.oxford_gt import original_query_ids
from oxbench.formats.safe_pickle import load_plain_pickle
from oxbench.groundtruth import GroundTruth, Query, make_query, short_repr
from oxbench.protocol import get_protocol


@dataclass(frozen=True)
class _Layout:
    """What a revisitop pickle of one protocol holds.

    Attributes:
        protocol: the protocol of its ground truth.
        keys: the label keys of every ``gnd[i]``.
        announced_by: label keys whose presence says the pickle is of this layout.
        query_ids: whether its queries carry the official ids (``all_souls_1``; old protocol).
        ok_is_positives: ``ok`` holds every positive (good + ok), as the old pickles do.
    """

    protocol: str
    keys: tuple[str, ...]
    announced_by: frozenset[str]
    query_ids: bool = False
    ok_is_positives: bool = False


_LAYOUTS = (
    _Layout("revisited", ("easy", "hard", "junk"), frozenset({"easy", "hard"})),
    _Layout("original", ("ok", "junk"), frozenset({"ok"}), query_ids=True, ok_is_positives=True),
)
#: The layout of each protocol's pickle.
_LAYOUT_OF = {layout.protocol: layout for layout in _LAYOUTS}


def dataset_id_from_path(path: str | Path) -> str:
    """``gnd_roxford5k.pkl`` -> ``roxford5k``; anything else -> the file stem.

    Example:
        >>> dataset_id_from_path("data/gnd_roxford5k.pkl"), dataset_id_from_path("mine.pkl")
        ('roxford5k', 'mine')
    """
    stem = Path(path).stem
    m = re.fullmatch(r"gnd_(.+)", stem)
    return m.group(1) if m else stem


def _names(value: Any, key: str, source: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise InputError(f"'{key}' must be a list of image names", source)
    for v in value:
        if v != v.strip() or v.endswith((".jpg", ".JPG", ".jpeg")):
            raise InputError(
                f"'{key}' has a malformed image name {v!r} (stray whitespace or extension)", source
            )
    if len(set(value)) != len(value):
        raise InputError(f"'{key}' lists an image name twice", source)
    return tuple(value)


def parse_gnd(obj: Any, *, dataset: str, source: str = "<memory>") -> GroundTruth:
    """Turn the unpickled revisitop dict into a validated :class:`GroundTruth`.

    The protocol is detected from the label keys: ``easy``/``hard``/``junk`` -> revisited,
    ``ok``/``junk`` -> original.
    """
    if not isinstance(obj, dict):
        raise InputError(
            f"expected a dict with 'imlist', 'qimlist', 'gnd', got {type(obj).__name__}", source
        )
    for key in ("imlist", "qimlist", "gnd"):
        if key not in obj:
            raise InputError(f"missing key '{key}'", source)
    db_names = _names(obj["imlist"], "imlist", source)
    q_names = _names(obj["qimlist"], "qimlist", source)
    gnd = obj["gnd"]
    if not isinstance(gnd, list | tuple):
        raise InputError("'gnd' must be a list with one dict per query", source)
    if len(gnd) != len(q_names):
        raise InputError(f"'gnd' has {len(gnd)} entries but 'qimlist' has {len(q_names)}", source)
    if not gnd:
        raise InputError("no queries", source)
    seen_keys = {k for entry in gnd if isinstance(entry, dict) for k in entry}
    layout = next((lay for lay in _LAYOUTS if seen_keys & lay.announced_by), None)
    if layout is None:
        raise InputError(
            "labels must be 'easy'/'hard'/'junk' (revisited) or 'ok'/'junk' (old protocol), "
            f"found keys {sorted(seen_keys)}",
            source,
        )
    keys = layout.keys
    queries: list[Query] = []
    for qi, (name, entry) in enumerate(zip(q_names, gnd, strict=True)):
        if not isinstance(entry, dict):
            raise InputError(f"query {qi} ({name}): gnd entry is not a dict", source)
        missing = [k for k in keys if k not in entry]
        if missing:
            raise InputError(f"query {qi} ({name}): missing key(s) {missing}", source)
        bbox = entry.get("bbx")
        if bbox is not None and (not isinstance(bbox, list | tuple) or len(bbox) != 4):
            raise InputError(
                f"query {qi} ({name}): 'bbx' must be 4 numbers, got {short_repr(bbox)}", source
            )
        labels = {}
        for k in keys:
            if not isinstance(entry[k], list | tuple):
                raise InputError(f"query {qi} ({name}): '{k}' must be a list of indices", source)
            labels[k] = entry[k]
        queries.append(make_query(name, bbox, source=source, **labels))
    ids = original_query_ids(q_names) if layout.query_ids else None
    if ids is not None:  # the pickle stores the query images; the ids follow the official order
        queries = [dataclasses.replace(q, query_id=i) for q, i in zip(queries, ids, strict=True)]
    protocol = get_protocol(layout.protocol)
    return GroundTruth(dataset, protocol, db_names, tuple(queries), source).validate()


def read_gnd(path: str | Path, *, dataset: str | None = None) -> GroundTruth:
    """Read a revisitop ground-truth pickle (revisited or old protocol) safely.

    Args:
        path: ``gnd_<dataset>.pkl``.
        dataset: dataset id for printed lines; default from the file name (``gnd_roxford5k.pkl`` ->
            ``roxford5k``).

    Raises:
        InputError: missing file, unsafe or malformed pickle, inconsistent labels.
    """
    path = Path(path)
    obj = load_plain_pickle(path)
    return parse_gnd(obj, dataset=dataset or dataset_id_from_path(path), source=str(path))


def gnd_to_dict(gt: GroundTruth) -> dict[str, Any]:
    """The revisitop dict for ``gt`` (plain lists; revisited or old-protocol keys)."""
    layout = _LAYOUT_OF.get(gt.protocol)
    if layout is None:
        raise ValueError(f"the revisitop pickle cannot hold {str(gt.protocol)!r} ground truth")
    entries = []
    for q in gt.queries:
        entry: dict[str, Any] = {"bbx": None if q.bbox is None else [float(v) for v in q.bbox]}
        for k in layout.keys:
            arr = q.positives if (k == "ok" and layout.ok_is_positives) else getattr(q, k)
            entry[k] = [int(v) for v in arr]
        entries.append(entry)
    return {"imlist": list(gt.db_names), "qimlist": list(gt.query_names), "gnd": entries}


def write_gnd(gt: GroundTruth, path: str | Path) -> Path:
    """Write ``gt`` as a revisitop pickle (protocol 3, plain containers only), atomically."""
    path = Path(path)
    data = pickle.dumps(gnd_to_dict(gt), protocol=3)
    atomic_write_bytes(path, data)
    return path
