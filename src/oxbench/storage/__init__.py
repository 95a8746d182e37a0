"""Cache folders oxbench can tell from anyone else's: one folder type for every store.

:class:`StoreFolder` (:mod:`oxbench.storage.folder`) is the one kind of cache folder the feature
and descriptor stores and the memory-mapped inverted files (HE, ASMK, BoW) are: a ``meta.json``
with its format, what the folder stands for and a digest; created or rebuilt whole, by one rename;
a symlinked or foreign folder refused, never written through; temporaries removed only where the
folder and their names say they are oxbench's. :func:`open_or_build` opens a folder written for
the same inputs and settings and rebuilds it, with a warning, only when a check fails.
"""

from oxbench.storage.folder import (
    BUILDING_NAME,
    META_NAME,
    StoreFolder,
    known_files,
    meta_digest,
    open_or_build,
)

__all__ = [
    "BUILDING_NAME",
    "META_NAME",
    "StoreFolder",
    "known_files",
    "meta_digest",
    "open_or_build",
]
