"""Every command's --help in plain words: each value names what it is and its unit (N, MIB, SECONDS, DIR, URL),
never a type placeholder such as `<int range>` or `<list[str]>`, and the usage line has no braces."""

from __future__ import annotations

import re

import pytest
import typer

from pipeline.cli import app
from tests.support.cli import CliRunner

COMMANDS = sorted(command.name or command.callback.__name__  # type: ignore[union-attr]
                  for command in app.registered_commands)
METAVAR = re.compile(r"^(s3://[A-Z/._a-z]+|[A-Z][A-Z_]*(?: [A-Z][A-Z_]*)*|WxH)$")


@pytest.mark.parametrize("name", COMMANDS)
def test_help_names_each_value_without_type_placeholders(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.stderr
    usage = next(line for line in result.stdout.splitlines() if line.startswith("Usage:"))
    assert "{" not in usage and "}" not in usage, usage
    assert not re.search(r"<(int|float|str|path|list|Path|bool|tuple)", result.stdout), result.stdout


@pytest.mark.parametrize("name", COMMANDS)
def test_every_value_taking_flag_and_argument_has_a_plain_metavar(name: str) -> None:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    for param in command.params:
        if getattr(param, "is_flag", False) or param.name == "help":
            continue
        assert param.metavar and METAVAR.match(param.metavar), (name, param.name, param.metavar)
