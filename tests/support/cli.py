"""The CLI as tests invoke it in process: typer's CliRunner, with the app's click command built once.

typer.testing.CliRunner.invoke builds the click command from the app on every call (~11 ms: typer reads every
command's signature again), which the fuzz tests' hundreds of invocations paid each time. Built once, it is what the
console script builds once per process; the callbacks are the same functions either way."""

from __future__ import annotations

import functools
from typing import Any
from unittest import mock

import typer.main
import typer.testing

_command = functools.cache(typer.main.get_command)


class CliRunner(typer.testing.CliRunner):
    def invoke(self, app: typer.Typer, *args: Any, **kwargs: Any) -> typer.testing.Result:
        with mock.patch.object(typer.testing, "_get_command", _command):
            return super().invoke(app, *args, **kwargs)
