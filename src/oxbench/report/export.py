"""Exports of a run's ranked lists in the formats other tools read.

=============  =====================================================================================
format         what is written
=============  =====================================================================================
``oxford``     a folder of ``<query>.txt`` files, one database image name per line, best first: the
               input of the official ``compute_ap`` and of ``oxbench evaluate oxford --ranked-dir``
``revisitop``  ``ranks.npy``: int64 ``(k, n_queries)``, column ``q`` = query ``q``'s list (revisitop)
``hloc``       a retrieval-pairs text file: ``<query>.jpg <db image>.jpg`` per line, top k per query
               (hloc's ``pairs-query-netvlad*.txt`` layout; the suffix is an option)
=============  =====================================================================================

The name-based formats take the names stored in ``retrieved.json``: the top ``k`` of each list (the
run's ``k``, 100 by default). When the run kept longer lists in ``ranks.npy``, the exported lists are
the top ``k`` and scoring them gives the run's numbers only if no positive sits below rank ``k``;
:func:`export_run` logs a warning then. ``revisitop`` exports every kept rank.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from oxbench.errors import InputError
from oxbench.fileio import (
    TEMP_PREFIX,
    atomic_write_npy,
    atomic_write_text,
    check_output_path,
    make_folder,
    os_reason,
)
from oxbench.report.runs import RunRecord

log = logging.getLogger(__name__)

FORMATS = ("oxford", "revisitop", "hloc")


def _check_name(name: str, what: str, run: RunRecord) -> str:
    if not name or any(ch.isspace() for ch in name):
        raise InputError(
            f"{what} {name!r} is empty or contains whitespace: cannot be written one per line",
            run.path,
        )
    return name


def _depth(run: RunRecord, top: int | None, available: int) -> int:
    if top is not None and top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if top is not None and top > available:
        raise InputError(
            f"the run stores image names for its top {available} only (retrieved.json k); asked for {top}",
            run.path,
        )
    return available if top is None else top


def oxford_lists(run: RunRecord, top: int | None = None) -> dict[str, str]:
    """``{file name: text}`` of the Oxford-style ranked lists (one per query, names best first).

    Raises:
        InputError: ``top`` beyond the stored names; a name that cannot be a line or a file name.
    """
    k = _depth(run, top, run.k)
    files: dict[str, str] = {}
    for q in run.queries:
        # Oxford/Paris lists are named by the query id (all_souls_1.txt), else by the query name
        name = _check_name(q.id or q.name, "query name", run)
        if "/" in name or name.startswith("."):
            raise InputError(f"query name {name!r} cannot be a file name", run.path)
        lines = [_check_name(str(t["name"]), f"query {name}: image name", run) for t in q.top[:k]]
        files[f"{name}.txt"] = "".join(n + "\n" for n in lines)
    return files


def hloc_pairs(run: RunRecord, top: int | None = None, *, suffix: str = ".jpg") -> str:
    """hloc retrieval pairs: ``<query><suffix> <db image><suffix>`` per line, top k per query."""
    k = _depth(run, top, run.k)
    lines = []
    for q in run.queries:
        qn = _check_name(q.name, "query name", run)
        for t in q.top[:k]:
            lines.append(
                f"{qn}{suffix} {_check_name(str(t['name']), f'query {qn}: image name', run)}{suffix}\n"
            )
    return "".join(lines)


def export_run(
    run: RunRecord, fmt: str, out: str | Path, *, top: int | None = None, suffix: str = ".jpg"
) -> list[Path]:
    """Write ``run``'s ranked lists as ``fmt`` to ``out`` (a folder for ``oxford``, else a file).

    Args:
        run: the run.
        fmt: ``oxford``, ``revisitop`` or ``hloc``.
        out: output folder (``oxford``) or file.
        top: keep the top this many of each list (default: all stored).
        suffix: file suffix added to the names in ``hloc`` pairs.

    Returns:
        The files written.

    Raises:
        InputError: unknown format, ``top`` beyond what the run stores, names that cannot be
            written, an output path that is not writable (nothing is written then).
    """
    out = Path(out)
    if fmt == "revisitop":
        ranks = run.ranks()
        k = _depth(run, top, ranks.shape[0])
        return [atomic_write_npy(out, ranks[:k].astype("int64"))]
    if fmt not in FORMATS:
        raise InputError(f"unknown export format {fmt!r} (one of {', '.join(FORMATS)})")
    if fmt == "oxford" and out.exists() and not out.is_dir():  # refused before anything is said
        raise InputError("the oxford export writes a folder; this path is a file", out)
    if fmt == "hloc":
        check_output_path(out)
    kept = run.ranks().shape[0]
    if kept > run.k and (top is None or top == run.k):  # the user did not ask for a truncation
        log.warning(
            "%s: the run kept %d results per query; names are stored for the top %d, which is what is "
            "exported (scores of the exported lists miss positives ranked below %d)",
            run.path,
            kept,
            run.k,
            run.k,
        )
    if fmt == "hloc":
        return [atomic_write_text(out, hloc_pairs(run, top, suffix=suffix))]
    return _write_folder(out, oxford_lists(run, top))


def _write_folder(out: Path, files: dict[str, str]) -> list[Path]:
    """Write ``files`` into the folder ``out`` all or nothing: assembled in a temporary folder beside
    it, then renamed into place (a new folder) or each file renamed over its name (an existing one,
    after every target was checked), so a failure never leaves part of an export."""
    for name in files:
        check_output_path(
            out / name
        )  # a link or a folder at a target is refused before anything is written
    parent = out.parent
    make_folder(parent)
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{out.name}.", dir=parent))
    except OSError as exc:
        raise InputError(f"cannot write the export: {os_reason(exc)}", parent) from None
    try:
        for name, text in files.items():
            atomic_write_text(tmp / name, text)
        if not out.exists():
            try:
                os.rename(tmp, out)
                return [out / name for name in files]
            except (
                OSError
            ):  # another process created it meanwhile: fall through to the file renames
                pass
        for name in files:
            check_output_path(out / name)
        for name in files:
            os.replace(tmp / name, out / name)
        return [out / name for name in files]
    except OSError as exc:
        raise InputError(f"cannot write the export: {os_reason(exc)}", out) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
