"""The registry mechanism: named entries (datasets, methods, stages) kept apart from their content.

Each dataset or method is a short declarative entry registered under a name; this module holds only
the machinery. Registration happens at import of the module that declares the entries, never with I/O.

Plugins arrive as pytest's do: a registry with an entry-point ``group`` (:data:`GROUPS`) loads, on
its first lookup, every entry point of that group that installed distributions declare::

    [project.entry-points."oxbench.families"]
    mypkg = "mypkg.family"             # a module: importing it registers its presets
    [project.entry-points."oxbench.executors"]
    slurm = "mypkg.slurm:SlurmExecutor"   # an object: registered under the entry point's name

A plugin that fails to import -- any exception, ``SystemExit`` and ``KeyboardInterrupt`` included
(only a real SIGINT / SIGTERM the user sent while it imported stops the command) -- is named in one
:class:`PluginWarning` (with its distribution) and the rest stay usable; what it prints while it
imports goes to stderr (``--json`` output stays JSON), and one still importing after
:data:`SLOW_IMPORT_SECONDS` is named in a log line while oxbench waits; two entries under one name (two plugins, or a plugin and a built-in) are one
:class:`~oxbench.errors.InputError` line naming both origins, raised at every lookup of that
registry until one of them is removed. Every entry knows its :class:`Origin`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from oxbench.errors import InputError, close_matches

T = TypeVar("T")
log = logging.getLogger(__name__)

#: Seconds a plugin may import before a log line names it (the command would look hung).
SLOW_IMPORT_SECONDS = 2.0

#: The entry-point group of each kind of plugin (``[project.entry-points."<group>"]``).
GROUPS = {
    "families": "oxbench.families",
    "rerankers": "oxbench.rerankers",
    "local_features": "oxbench.local_features",
    "descriptors": "oxbench.descriptors",
    "executors": "oxbench.executors",
    "datasets": "oxbench.datasets",
    "protocols": "oxbench.protocols",
}


class DuplicateEntryError(InputError):
    """A name is registered twice (the message names both origins)."""


class PluginWarning(UserWarning):
    """A plugin (an entry point of an oxbench group) could not be loaded; the rest still are."""


@dataclass(frozen=True)
class Origin:
    """Where a registry entry comes from.

    Attributes:
        module: the module that defines the entry (``oxbench.pipelines.families.bow``).
        distribution: the installed distribution whose entry point brought it (``None``: not
            through an entry point: a built-in, or a module the user imported).
        version: that distribution's version.
    """

    module: str
    distribution: str | None = None
    version: str | None = None

    @property
    def builtin(self) -> bool:
        """Whether the entry is part of oxbench itself."""
        return self.distribution is None and self.module.split(".", 1)[0] == "oxbench"

    def __str__(self) -> str:
        if self.distribution is not None:
            return f"{self.distribution} {self.version}" if self.version else self.distribution
        return self.module


#: The distributions whose entry points are being loaded (innermost last): what registers now
#: comes from there, into whichever registry (a family module may also register a re-ranker).
_LOADING: list[Origin] = []
#: Distribution -> version of every plugin loaded in this process, by any registry.
_LOADED: dict[str, str | None] = {}


#: Top-level package of every plugin entry point loaded -> its origin (:func:`plugin_frame`).
_PACKAGES: dict[str, Origin] = {}


def plugin_frame(tb: Any) -> tuple[Origin, str, int, str] | None:
    """The innermost frame of traceback ``tb`` that runs a loaded plugin's code, as
    ``(origin, module, line, function)``; ``None`` when no plugin code is on it (an error of
    oxbench's own keeps its traceback)."""
    found = None
    while tb is not None:
        module = str(tb.tb_frame.f_globals.get("__name__", ""))
        origin = _PACKAGES.get(module.split(".", 1)[0])
        if origin is not None:
            found = (origin, module, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return found


def loaded_plugins() -> dict[str, str | None]:
    """``{distribution: version}`` of the plugins loaded so far (what a run record names: they
    change the numbers as a library does)."""
    return dict(sorted(_LOADED.items()))


def _origin_of(entry: object) -> Origin:
    """The module defining ``entry`` (its class's, for an instance), with the distribution whose
    entry point is being loaded."""
    module = str(getattr(entry, "__module__", None) or type(entry).__module__)
    if _LOADING:
        return Origin(module, _LOADING[-1].distribution, _LOADING[-1].version)
    return Origin(module)


def _entry_points(group: str) -> list[Any]:
    from importlib.metadata import entry_points

    seen, out = set(), []
    for ep in entry_points(group=group):
        key = (ep.name, ep.value, getattr(ep.dist, "name", None))
        if key not in seen:  # a distribution found twice on sys.path (a --target folder and site)
            seen.add(key)
            out.append(ep)
    return sorted(out, key=lambda ep: (getattr(ep.dist, "name", "") or "", ep.name))


@contextlib.contextmanager
def _plugin_import(where: str) -> Iterator[list[int]]:
    """The block a plugin imports in: its prints go to stderr, a log line names it when it is still
    importing after :data:`SLOW_IMPORT_SECONDS`, and the list yielded receives the SIGINT / SIGTERM
    the process gets meanwhile (so that a ``KeyboardInterrupt`` the plugin raises itself is told
    from the user's own Ctrl-C)."""
    signals: list[int] = []
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGINT, signal.SIGTERM):
            handler = signal.getsignal(s)
            if callable(handler):  # Python's, or the command's: note the signal, then run it

                def noted(signum: int, frame: Any, _handler: Any = handler) -> None:
                    signals.append(signum)
                    _handler(signum, frame)

                previous[s] = handler
                signal.signal(s, noted)
    timer = threading.Timer(
        SLOW_IMPORT_SECONDS,
        lambda: log.warning(
            "still importing %s after %.0f s (oxbench waits for it)", where, SLOW_IMPORT_SECONDS
        ),
    )
    timer.daemon = True
    timer.start()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield signals
    finally:
        timer.cancel()
        for signum, old in previous.items():
            signal.signal(signum, old)


class Registry(Generic[T]):
    """A name -> entry mapping with a clear error for unknown and duplicate names.

    Args:
        kind: what the entries are ("dataset", "method"), used in error messages.
        loader: called once before the first lookup to import the modules that declare the
            built-in entries (keeps ``import oxbench`` light).
        group: the entry-point group whose plugins are loaded after the built-ins
            (:data:`GROUPS`); ``None``: built-ins only.
        adopt: registers an object an entry point names (default: under the entry point's name).
    """

    def __init__(
        self,
        kind: str,
        loader: Callable[[], None] | None = None,
        *,
        group: str | None = None,
        adopt: Callable[[str, Any], object] | None = None,
    ) -> None:
        self.kind = kind
        self.group = group
        self._entries: dict[str, T] = {}
        self._origins: dict[str, Origin] = {}
        self._loader = loader
        self._adopt = adopt
        self._loaded = loader is None and group is None
        self._conflict: str | None = None

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            if self._loader is not None:
                self._loader()
            if self.group is not None:
                self._load_plugins(self.group)
        if self._conflict is not None:
            raise InputError(self._conflict)

    def _load_plugins(self, group: str) -> None:
        for ep in _entry_points(group):
            dist = ep.dist
            origin = Origin(ep.value, getattr(dist, "name", None), getattr(dist, "version", None))
            where = f"plugin {ep.name!r} ({ep.value}) of {origin.distribution or 'an unknown distribution'}"
            if origin.version:
                where += f" {origin.version}"
            _LOADING.append(origin)
            package = str(getattr(ep, "module", "") or ep.value).split(":")[0].split(".")[0]
            if package and package != "oxbench":
                _PACKAGES[package] = origin
            failed: BaseException | None = None
            try:
                with _plugin_import(where) as signals:
                    try:
                        obj = ep.load()
                        if not inspect.ismodule(obj):  # an object to register; a module did
                            (self._adopt or self.register)(ep.name, obj)
                    except DuplicateEntryError:
                        raise
                    except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt too
                        if signals:  # the user's own Ctrl-C (or SIGTERM) while it imported: stop
                            raise
                        failed = exc  # a broken plugin must not break the others
                if failed is None and origin.distribution is not None:
                    _LOADED[origin.distribution] = origin.version
            except DuplicateEntryError as exc:  # the registry is unusable until one is removed
                self._conflict = f"{exc} (entry point {group}: {where})"
                return
            finally:
                _LOADING.pop()
            if failed is not None:
                text = " ".join(f"{type(failed).__name__}: {failed}".split()).rstrip(":")
                warnings.warn(
                    f"{where}, group {group}, failed to load and is left out: {text}",
                    PluginWarning,
                    stacklevel=4,
                )

    def register(self, name: str, entry: T) -> T:
        """Register ``entry`` under ``name``.

        Raises:
            DuplicateEntryError: ``name`` is taken (an :class:`InputError` line naming both origins).
        """
        origin = _origin_of(entry)
        if name in self._entries and self._entries[name] is entry:
            return entry  # a module that registers what its entry point also names
        if name in self._entries:
            raise DuplicateEntryError(
                f"{self.kind} {name!r} is registered twice: by {self._origins[name]} and by {origin}"
            )
        self._entries[name] = entry
        self._origins[name] = origin
        return entry

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a test's or a notebook's temporary entry); unknown names are ignored."""
        self._entries.pop(name, None)
        self._origins.pop(name, None)

    def origin(self, name: str) -> Origin:
        """Where the entry ``name`` comes from."""
        self.get(name)
        return self._origins[name]

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
