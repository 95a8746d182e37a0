"""The registry mechanism: named entries (datasets, methods) kept apart from their content.

Each dataset or method is a short declarative entry registered under a name; this module holds only
the machinery. Registration happens at import of the module that declares the entries, never with I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from oxbench.errors import InputError, close_matches

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> entry mapping with a clear error for unknown names.

    Args:
        kind: what the entries are ("dataset", "method"), used in error messages.
        loader: called once before the first lookup to import the modules that declare entries
            (keeps ``import oxbench`` light).
    """

    def __init__(self, kind: str, loader: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._loader = loader
        self._loaded = loader is None

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._loader is not None
            self._loader()

    def register(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:
        self._ensure_loaded()
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            near = close_matches(name, self._entries)
            hint = f"; did you mean {' or '.join(near)}?" if near else ""
            raise InputError(f"unknown {self.kind} {name!r}; known: {known}{hint}") from None

    def names(self) -> list[str]:
        self._ensure_loaded()
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        self._ensure_loaded()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
