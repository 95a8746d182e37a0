"""The ``oxbench`` command: a thin layer over the library.

Subcommands live in their own modules and are imported only when invoked, so that
``oxbench --help`` needs nothing but the core dependencies. Every user-input problem
(:class:`oxbench.errors.InputError`) becomes one line on stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import click

from oxbench.errors import InputError, MissingExtraError
from oxbench.version import __version__

# name -> (module, attribute, short help). Each module defines one click command or group.
_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "evaluate": ("oxbench.cli.evaluate", "evaluate", "Score a ranking with an official protocol."),
    "simulate": (
        "oxbench.cli.simulate",
        "simulate",
        "Run the synthetic protocol-sensitivity study.",
    ),
    "data": ("oxbench.cli.data", "data", "List, fetch, import, verify and generate datasets."),
    "run": ("oxbench.cli.run", "run", "Run a method end to end, evaluate it, keep a run record."),
    "runs": ("oxbench.cli.run", "runs", "List run records with their headline numbers."),
    "milestones": (
        "oxbench.cli.milestones",
        "milestones",
        "The field's milestone presets, n seeds each, beside the published figures and trends.",
    ),
    "methods": (
        "oxbench.cli.run",
        "methods",
        "The method families and presets; a preset's settings (type, default, range, meaning).",
    ),
    "compare": (
        "oxbench.cli.report",
        "compare",
        "Compare runs query by query: CI and p-value per setup.",
    ),
    "report": ("oxbench.cli.report", "report", "The paper table of runs (md, latex, csv, html)."),
    "plot": (
        "oxbench.cli.report",
        "plot",
        "Per-query AP, precision-recall and A-vs-B figures of runs.",
    ),
    "view": ("oxbench.cli.report", "view", "A static HTML viewer of a run's ranked lists."),
    "export": (
        "oxbench.cli.report",
        "export",
        "Export ranked lists: Oxford lists, revisitop ranks, hloc pairs.",
    ),
    "extract": (
        "oxbench.cli.deep",
        "extract",
        "Write a dataset's global descriptors to .npy files.",
    ),
    "import-checkpoint": (
        "oxbench.cli.deep",
        "import_checkpoint",
        "Convert a cirtorch checkpoint into a model file.",
    ),
    "train": (
        "oxbench.cli.train",
        "train",
        "Fine-tune a backbone + GeM on a training city (contrastive, hard negatives).",
    ),
}


#: Earlier names of commands, still accepted but not listed: ``oxbench settings NAME`` is ``oxbench methods NAME``.
_ALIASES = {"settings": "methods"}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        name = _ALIASES.get(name, name)
        if name not in _SUBCOMMANDS:
            return None
        module, attr, _ = _SUBCOMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # not written yet in this build
                return None
            raise

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help without importing every subcommand module.
        rows = [(name, _SUBCOMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="oxbench")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
def cli(verbose: int) -> None:
    """oxbench: instance-level image retrieval benchmarks, evaluated exactly."""
    level = logging.WARNING - 10 * min(verbose, 2)
    # The console shows what -v asks for; the loggers pass INFO on so that a run's log file
    # (run.log in its record) holds the stages and cache hits whatever the console shows.
    handler = logging.StreamHandler()
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_oxbench_cli", False)]:
        root.removeHandler(old)  # one console handler, however often the group is invoked
    handler._oxbench_cli = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(min(level, logging.INFO))


class Interrupted(BaseException):
    """SIGTERM or SIGINT asked the command to stop (exit code 130).

    Not a ``KeyboardInterrupt``: click would turn that into ``Abort`` (exit 1) on its way out.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


#: Seconds a SIGTERM / SIGINT waits for the main thread to run its handler. Python runs signal
#: handlers only between bytecodes, so a long call into compiled code (LAPACK, FAISS, OpenCV) would
#: hold the signal until it returns (minutes); past this the process ends at once instead.
FORCED_EXIT_SECONDS = 3.0
#: Seconds the unwinding after a signal (worker pools stopped, temporaries removed) may take.
UNWIND_SECONDS = 20.0


class _SignalWatch:
    """A thread told of every SIGTERM / SIGINT by the interpreter's wake-up descriptor (written by
    the C-level handler even while the main thread is inside compiled code). When the main thread
    has not run the Python handler within :data:`FORCED_EXIT_SECONDS` (or not finished unwinding
    within :data:`UNWIND_SECONDS`), it removes this process's temporary files and folders
    (:func:`oxbench.fileio.remove_own_temporaries`: only ever-unfinished writes, so nothing
    half-written stays and nothing complete is touched) and ends the process with exit code 130.
    Worker processes end with their parent (:mod:`oxbench.execution.workers`)."""

    def __init__(self) -> None:
        import socket

        self.handled = threading.Event()
        self.finished = threading.Event()
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="oxbench-signals", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            try:
                data = self._read.recv(1)
            except OSError:
                return
            if not data or self.finished.is_set():
                return
            if data[0] in (signal.SIGTERM, signal.SIGINT):
                break
        for limit, event in ((FORCED_EXIT_SECONDS, self.handled), (UNWIND_SECONDS, self.finished)):
            deadline = time.monotonic() + limit
            while not (event.is_set() or self.finished.is_set()):
                if time.monotonic() > deadline:
                    self._force_exit(data[0])
                time.sleep(0.05)

    @staticmethod
    def _force_exit(signum: int) -> None:
        import os

        from oxbench.fileio import remove_own_temporaries

        remove_own_temporaries()
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            os.write(2, f"oxbench: interrupted by {name} (stopped inside a computation)\n".encode())
        os._exit(130)

    def close(self) -> None:
        self.finished.set()
        signal.set_wakeup_fd(self._previous_fd)
        self._write.close()  # the thread's recv returns b"" and it ends
        self._thread.join(timeout=1.0)
        self._read.close()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` in the main thread, for the block.

    The exception unwinds the command like Ctrl-C does: worker pools stop their workers
    (:mod:`oxbench.execution.workers`), temporary files are removed. Later signals are ignored while the
    stack unwinds, so that cleanup is not itself interrupted. Previous handlers are restored. A
    signal the main thread cannot take within a few seconds (it is inside compiled code) ends the
    process at once, its temporaries removed (:class:`_SignalWatch`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    watch = _SignalWatch()

    def handler(signum: int, frame: Any) -> None:
        watch.handled.set()
        for s in previous:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        watch.close()


@contextlib.contextmanager
def warnings_as_log_lines() -> Iterator[None]:
    """Show Python warnings of the block as one log line each (``WARNING <module>: <message>``), not
    the two-line ``file:line: Category: message`` + source form; Pillow's warning about an image over
    its own pixel limit is dropped, since oxbench checks its own budget first (:mod:`oxbench.imaging`).
    """
    import warnings

    previous = warnings.showwarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        text = " ".join(str(message).split())
        logging.getLogger(getattr(category, "__module__", "py.warnings")).warning(
            "%s: %s", category.__name__, text
        )

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Image size \(\d+ pixels\) exceeds limit")
        warnings.showwarning = show
        try:
            yield
        finally:
            warnings.showwarning = previous


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: user errors -> one line, exit 2; SIGTERM/SIGINT -> 130."""
    from oxbench.execution import keep_freed_memory

    keep_freed_memory()
    try:
        with stop_on_signals(), warnings_as_log_lines():
            rv = cli.main(args=argv, prog_name="oxbench", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (InputError, MissingExtraError) as exc:
        # One line, whatever the message quotes (a parser's multi-line reason, a name with a CR).
        click.echo("oxbench: error: " + " ".join(str(exc).splitlines()), err=True)
        sys.exit(2)
    except Interrupted as exc:
        click.echo(f"oxbench: interrupted by {exc.args[0]}", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("oxbench: interrupted by SIGINT", err=True)
        sys.exit(130)
    except Exception as exc:
        _plugin_failure(exc)  # a plugin's own code raised: one line naming it
        raise  # oxbench's own error: its traceback is the report
    sys.exit(rv if isinstance(rv, int) else 0)


def _plugin_failure(exc: Exception) -> None:
    """Exit with one line (code 2) naming the plugin when ``exc`` was raised in a plugin's code
    (a dataset family, a method, a stage of an installed distribution); its traceback is logged at
    debug level (``-vv``). Return when no plugin code is on the traceback."""
    from oxbench.registry import plugin_frame

    found = plugin_frame(exc.__traceback__)
    if found is None:
        return
    origin, module, line, function = found
    logging.getLogger("oxbench.registry").debug("the plugin's traceback", exc_info=exc)
    text = " ".join(f"{type(exc).__name__}: {exc}".split()).rstrip(":")
    click.echo(
        f"oxbench: error: plugin {origin} failed: {text} ({module}, line {line}, in "
        f"{function}; -vv shows the traceback)",
        err=True,
    )
    sys.exit(2)
