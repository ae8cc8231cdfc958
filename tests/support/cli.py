"""The CLI as tests invoke it in process: typer's CliRunner, with the app's click command built once; and the bad-input
tests' stubbed actions and their one check of a refusal.

typer.testing.CliRunner.invoke builds the click command from the app on every call (~11 ms: typer reads every
command's signature again), which the fuzz tests' hundreds of invocations paid each time. Built once, it is what the
console script builds once per process; the callbacks are the same functions either way.

The bad-input tests replace the commands' actions by a stub that raises Reached (stub_actions): a value that must be
refused and is not reaches the stub, and the case fails without running anything for real."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any
from unittest import mock

import pytest
import typer.main
import typer.testing

from pipeline.cli import app

_command = functools.cache(typer.main.get_command)


class CliRunner(typer.testing.CliRunner):
    def invoke(self, app: typer.Typer, *args: Any, **kwargs: Any) -> typer.testing.Result:
        with mock.patch.object(typer.testing, "_get_command", _command):
            return super().invoke(app, *args, **kwargs)


class Reached(Exception):
    """A command passed its checks and would now act."""


def reached(*_args: Any, **_kwargs: Any) -> Any:
    raise Reached


def stub_actions(monkeypatch: pytest.MonkeyPatch, targets: Iterable[str]) -> None:
    """Each of `targets` (dotted paths, as monkeypatch.setattr takes them) raises Reached until `monkeypatch` undoes."""
    for target in targets:
        monkeypatch.setattr(target, reached)


def refused(args: list[str], code: int, fragment: str, env: dict[str, str]) -> tuple[str, str]:
    """The command refuses with one line holding `fragment` and exits `code`, before acting; `env` over the process's
    own. Returns its whole output and that line."""
    result = CliRunner().invoke(app, args, env=env)
    assert not isinstance(result.exception, Reached), f"{args} reached its action: it should have been refused"
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == code, (result.exit_code, result.stderr)
    assert len(errors) == 1 and fragment in errors[0], result.stderr
    assert "Traceback" not in result.output
    return result.output, errors[0]


def without_provenance(body: dict[str, Any]) -> dict[str, Any]:
    """`advise --json`'s advice, less the words that say where the plan came from and how to deploy it: what two
    sources of the same documents must agree on."""
    plan = {k: v for k, v in body["plan"].items() if k not in ("assumed", "summary")}
    return {**{k: v for k, v in body.items() if k not in ("source", "deploy_context", "make_deploy")}, "plan": plan}
