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
    "dashboards",
    "agent",
    "worker",
    "evaluate",
    "train",
    "nab",
    "incidents",
    "record",
    "watch",
    "topology_cmd",
]


class _Group(click.Group):
    """Loads subcommand modules lazily: running one command imports only its module, and
    `foreshock --help` imports them all to list them. A command named ``x-y`` lives in the module
    ``x_y`` or ``x_y_cmd`` (for names that clash with Python keywords, such as ``import``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self._load(mod).name or mod for mod in COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        base = name.replace("-", "_")
        for mod in (base, f"{base}_cmd"):
            if mod in COMMANDS:
                return self._load(mod)
        return None

    @staticmethod
    def _load(module: str) -> click.Command:
        cmd = importlib.import_module(f"foreshock.cli.{module}").command
        assert isinstance(cmd, click.Command)
        return cmd


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
