"""`--help` everywhere: every command and subcommand of `foreshock` explains itself.

The tree is walked from the group itself, so a command added to ``cli/main.py`` is covered
without touching this file.
"""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from foreshock.cli.main import COMMANDS, cli

# The minimum set: a rename or a lost registration fails here, not in a user's shell.
REQUIRED = {"simulate", "replay", "demo", "import"}


def walk(group: click.Group, ctx: click.Context, prefix: list[str]) -> list[tuple[list[str], click.Command]]:
    found = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, f"{' '.join(prefix + [name])} is listed but does not load"
        found.append((prefix + [name], cmd))
        if isinstance(cmd, click.Group):
            found += walk(cmd, click.Context(cmd, parent=ctx, info_name=name), prefix + [name])
    return found


COMMAND_PATHS = walk(cli, click.Context(cli, info_name="foreshock"), [])


def test_every_registered_module_is_a_listed_command() -> None:
    top = {path[0] for path, _ in COMMAND_PATHS if len(path) == 1}
    assert REQUIRED <= top
    assert len(top) == len(COMMANDS), "two modules in COMMANDS register the same command name"


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_top_level_help_lists_every_command(flag: str) -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, [flag], prog_name="foreshock")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: foreshock")
    for path, _ in COMMAND_PATHS:
        if len(path) == 1:
            assert f"  {path[0]} " in result.output, f"{path[0]} missing from `foreshock --help`"


@pytest.mark.parametrize("path", [p for p, _ in COMMAND_PATHS], ids=[" ".join(p) for p, _ in COMMAND_PATHS])
def test_help_of_every_command_describes_it_and_its_options(path: list[str]) -> None:
    cmd = dict((tuple(p), c) for p, c in COMMAND_PATHS)[tuple(path)]
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, [*path, "--help"], prog_name="foreshock")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Usage: foreshock {' '.join(path)}")
    assert (cmd.help or "").strip(), f"`foreshock {' '.join(path)}` has no description"
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.opts[0] in result.output
            assert param.help, f"`foreshock {' '.join(path)}` option {param.opts[0]} has no help text"


def test_replay_help_shows_the_speed_choice() -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(cli, ["replay", "--help"])
    assert "--speed FLOAT" in result.output and "--max" in result.output
