"""The ``oxbench`` command: a thin layer over the library.

Subcommands live in their own modules and are imported only when invoked, so that
``oxbench --help`` needs nothing but the core dependencies. Every user-input problem
(:class:`oxbench.errors.InputError`) becomes one line on stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys

import click

from oxbench import __version__
from oxbench.errors import InputError, MissingExtraError

# name -> (module, attribute, short help). Each module defines one click command or group.
_SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "evaluate": ("oxbench.cli.evaluate", "evaluate", "Score a ranking with an official protocol."),
    "simulate": ("oxbench.cli.simulate", "simulate", "Run the synthetic protocol-sensitivity study."),
    "data": ("oxbench.cli.data", "data", "List, fetch, import, verify and generate datasets."),
    "run": ("oxbench.cli.run", "run", "Run a method end to end, evaluate it, keep a run record."),
    "runs": ("oxbench.cli.run", "runs", "List run records with their headline numbers."),
    "train": ("oxbench.cli.train", "train", "Fine-tune a backbone + GeM on a training city (contrastive, hard negatives)."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
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
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: user errors -> one line, exit 2."""
    try:
        rv = cli.main(args=argv, prog_name="oxbench", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except (InputError, MissingExtraError) as exc:
        click.echo(f"oxbench: error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)
