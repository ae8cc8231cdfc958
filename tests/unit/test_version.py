"""`iobatch --version`: the package's version, and git's description in a checkout."""

from __future__ import annotations

import re
from importlib import metadata

from typer.testing import CliRunner

from pipeline.cli import app


def test_version_names_the_package_and_the_commit() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    package = metadata.version("iobatch")
    assert re.fullmatch(rf"iobatch {re.escape(package)}( \([0-9a-zA-Z.\-]+\))?\n", result.stdout), result.stdout


def test_version_runs_nothing_else() -> None:
    result = CliRunner().invoke(app, ["--version", "demo", "--images", "nope"])
    assert result.exit_code == 0 and result.stdout.startswith("iobatch "), result.output
