"""The ``foreshock`` command. The roof: the only place that wires every part together.

Each subcommand lives in its own module under ``foreshock.cli`` and exposes ``command``
(a click command); add a module name to ``COMMANDS`` to register it.
"""

from __future__ import annotations

import importlib
import logging

import click

COMMANDS: list[str] = [
    "simulate",
    "replay",
    "demo",
    "import_cmd",
]


class _Group(click.Group):
    """Loads subcommand modules lazily, so `foreshock --help` stays fast."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._commands())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return self._commands().get(name)

    def _commands(self) -> dict[str, click.Command]:
        if not hasattr(self, "_loaded"):
            loaded = {}
            for mod in COMMANDS:
                cmd = importlib.import_module(f"foreshock.cli.{mod}").command
                loaded[cmd.name] = cmd
            self._loaded = loaded
        return self._loaded


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """foreshock — predict GPU throttling, link failures and failure cascades before they happen."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
