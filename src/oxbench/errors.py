"""Errors a user can act on.

Every problem with user input (a file, a query, an array) is raised as :class:`InputError`, a
``ValueError`` whose message names the source and the problem in one line. The CLI turns it into
exit code 2 with that line and no traceback.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


class OxbenchError(Exception):
    """Base class of oxbench's own errors."""


class InputError(OxbenchError, ValueError):
    """Bad user input: a malformed file, an inconsistent array, an unknown name.

    Args:
        message: what is wrong and, where possible, what to do about it.
        source: the file (or other named input) the problem is in; prefixed to the message.
    """

    def __init__(self, message: str, source: str | Path | None = None) -> None:
        self.source = None if source is None else str(source)
        self.problem = message
        super().__init__(f"{self.source}: {message}" if self.source else message)


class MissingExtraError(OxbenchError, ImportError):
    """An optional dependency is not installed; the message names the pip command."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(
            f'this needs the optional dependency {module!r}: pip install "oxbench[{extra}]" '
            f'(from a clone of oxbench: pip install -e ".[{extra}]")'
        )


def close_matches(name: str, known: Iterable[str], *, n: int = 3) -> list[str]:
    """The known names closest to a mistyped ``name`` (``difflib``), best first; empty when none is close.

    ``close_matches("qe_alfa", ["qe_alpha", "qe_k", "dba"]) == ["qe_alpha"]``
    """
    import difflib

    return difflib.get_close_matches(name, list(known), n=n, cutoff=0.6)


def require(module: str, extra: str):  # noqa: ANN201 - returns a module
    """Import an optional dependency or raise :class:`MissingExtraError` naming the extra."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtraError(module, extra) from exc


def require_installed(requirements: Iterable[tuple[str, str]]) -> None:
    """Check that every ``(module, extra)`` is installed, without importing it: the cheap first check of
    a command, before it generates data or starts a long step.

    Raises:
        MissingExtraError: the first module that is missing, naming ``pip install "oxbench[extra]"``.
    """
    import importlib.util

    for module, extra in requirements:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing, or a module set to None
            found = False
        if not found:
            raise MissingExtraError(module, extra)
