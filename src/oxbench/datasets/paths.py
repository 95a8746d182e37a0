"""Where datasets live on disk: ``--root``, else ``$OXBENCH_DATA``, else a per-user default."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "OXBENCH_DATA"


def default_data_root() -> Path:
    """``$XDG_DATA_HOME/oxbench`` (``~/.local/share/oxbench`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "oxbench"


def data_root(root: str | Path | None = None) -> Path:
    """The data root: ``root`` if given, else ``$OXBENCH_DATA``, else :func:`default_data_root`."""
    if root is not None:
        return Path(root).expanduser()
    env = os.environ.get(ENV_VAR)
    return Path(env).expanduser() if env else default_data_root()


def dataset_dir(dataset_id: str, root: str | Path | None = None) -> Path:
    """The folder of one dataset under the data root: ``<root>/<dataset_id>``."""
    return data_root(root) / dataset_id
