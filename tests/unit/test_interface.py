"""pipeline.interface: the exit-code rule of a batch, and the names the job and the stack share."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import typer.main

from pipeline import errors, interface
from pipeline.cli import app
from pipeline.interface import (
    AWS_ENV,
    CONTAINER_COMMANDS,
    CONTAINERS,
    ENV,
    EXIT_OK,
    EXIT_PERMANENT,
    EXIT_RETRYABLE,
    EXIT_USAGE,
    OPTIONAL_OUTPUT_KEYS,
    OUTPUT_KEYS,
    STACK_OUTPUT_KEYS,
    batch_exit_code,
)


@pytest.mark.parametrize(("codes", "expected"), [
    ([], EXIT_OK),
    ([EXIT_RETRYABLE], EXIT_RETRYABLE),
    ([EXIT_PERMANENT], EXIT_PERMANENT),
    # A rerun cannot complete a batch with a permanently failed child: 65 wins over 75, in either order.
    ([EXIT_RETRYABLE, EXIT_PERMANENT], EXIT_PERMANENT),
    ([EXIT_PERMANENT, EXIT_RETRYABLE, EXIT_RETRYABLE], EXIT_PERMANENT),
    # A bad variable in a child (in AWS: the stack's or the image's settings) fails every rerun alike.
    ([EXIT_RETRYABLE, EXIT_USAGE], EXIT_PERMANENT),
    # A killed child (-9) or a bug (1) leaves no marker; a rerun redoes it.
    ([-9], EXIT_RETRYABLE),
    ([1, EXIT_RETRYABLE], EXIT_RETRYABLE),
])
def test_a_batch_exits_65_if_any_child_failed_permanently_else_75(codes: list[int], expected: int) -> None:
    assert batch_exit_code(codes) == expected
    assert batch_exit_code(iter(codes)) == expected


def test_errors_carry_the_interface_exit_codes() -> None:
    assert (errors.EXIT_USAGE, errors.EXIT_PERMANENT, errors.EXIT_RETRYABLE) == (64, 65, 75)
    assert errors.UsageError("x").exit_code == EXIT_USAGE
    assert errors.PermanentError("x").exit_code == EXIT_PERMANENT
    assert errors.RetryableError("x").exit_code == EXIT_RETRYABLE


def test_env_names_are_unique_and_list_every_variable() -> None:
    names = [value for cls in (ENV, AWS_ENV) for key, value in vars(cls).items() if key.isupper()]
    assert len(names) == len(set(names)) == len(ENV.names() | AWS_ENV.names())
    assert {ENV.INPUT, ENV.SCRATCH, ENV.ARRAY_INDEX} <= ENV.names()
    assert {AWS_ENV.REGION, AWS_ENV.EMF_NAMESPACE} <= AWS_ENV.names()


def test_every_container_runs_an_iobatch_command() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    assert set(CONTAINER_COMMANDS) == set(CONTAINERS)
    for program, command in CONTAINER_COMMANDS.values():
        assert program == "iobatch" and command in commands


def test_stack_outputs_are_the_required_then_the_optional_keys() -> None:
    assert STACK_OUTPUT_KEYS == {**OUTPUT_KEYS, **OPTIONAL_OUTPUT_KEYS}
    assert len(set(STACK_OUTPUT_KEYS.values())) == len(STACK_OUTPUT_KEYS)


def test_the_interface_is_a_leaf() -> None:
    tree = ast.parse(Path(interface.__file__).read_text(encoding="utf-8"))
    modules = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    modules |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in modules if m.split(".")[0] in ("pipeline", "profiling", "tuning", "infra")}
