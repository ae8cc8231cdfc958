"""pipeline.submit.stack: the deployed stack's outputs and its job definition's containers (fake clients)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import NoCredentialsError

from pipeline import submit as sub
from pipeline.errors import EXIT_PERMANENT, EXIT_USAGE, IobatchError, UsageError
from pipeline.interface import CONTAINERS, OUTPUT_KEYS, STACK_OUTPUT_KEYS
from tests.support.aws import client_error, no_sleep

# ---- stack outputs ---------------------------------------------------------------------------------

FULL_OUTPUTS = [{"OutputKey": key, "OutputValue": f"v-{key}"} for key in OUTPUT_KEYS.values()]


def test_stack_outputs_map_every_key() -> None:
    outputs = sub.StackOutputs.from_outputs("s", FULL_OUTPUTS)
    assert outputs.input_bucket == "v-InputBucketName" and outputs.job_definition == "v-JobDefinitionArn"


def test_stack_outputs_name_every_missing_key_in_one_line() -> None:
    partial = [o for o in FULL_OUTPUTS if o["OutputKey"] not in ("JobQueueArn", "VolumeType")]
    with pytest.raises(UsageError) as caught:
        sub.StackOutputs.from_outputs("mine", partial)
    assert caught.value.headline.startswith("stack mine has no output JobQueueArn, VolumeType: deploy")
    assert "\n" not in caught.value.headline


def test_stack_outputs_fields_are_the_interface_output_keys() -> None:
    assert [f.name for f in dataclasses.fields(sub.StackOutputs)] == list(STACK_OUTPUT_KEYS)


def test_stack_outputs_read_the_optional_prefixes() -> None:
    extra = [{"OutputKey": "InputPrefix", "OutputValue": "images/"}, {"OutputKey": "OutputPrefix",
                                                                      "OutputValue": "shards/"}]
    outputs = sub.StackOutputs.from_outputs("s", FULL_OUTPUTS + extra)
    assert (outputs.input_prefix, outputs.output_prefix) == ("images/", "shards/")
    assert sub.StackOutputs.from_outputs("s", FULL_OUTPUTS).output_prefix == ""


class FakeCfn:
    def __init__(self, answer: Callable[[], Any]) -> None:
        self.answer = answer
        self.calls = 0

    def describe_stacks(self, StackName: str) -> Any:
        self.calls += 1
        return self.answer()


def _raise(exc: Exception) -> Callable[[], Any]:
    def answer() -> Any:
        raise exc
    return answer


@pytest.mark.parametrize(("exc", "code", "message"), [
    (client_error("ValidationError", 400, "Stack with id x does not exist"), EXIT_USAGE, "stack x does not exist"),
    (client_error("ExpiredToken", 403, "The security token included in the request is expired"), EXIT_USAGE,
     "AWS refused the credentials while reading stack x (ExpiredToken): they are expired"),
    (NoCredentialsError(), EXIT_USAGE, "no AWS credentials found while reading stack x"),
    (client_error("AccessDenied", 403, "no"), EXIT_PERMANENT, "AWS answered AccessDenied while reading stack x"),
])
def test_stack_errors_are_one_line(exc: Exception, code: int, message: str) -> None:
    cfn = FakeCfn(_raise(exc))
    with pytest.raises(IobatchError) as caught:
        sub.StackOutputs.from_stack(cfn, "x", no_sleep())
    assert caught.value.exit_code == code and message in caught.value.headline
    assert "\n" not in caught.value.headline and cfn.calls == 1


# ---- job definition --------------------------------------------------------------------------------


class FakeBatchDefs:
    def __init__(self, definitions: list[dict[str, Any]]) -> None:
        self.definitions = definitions

    def describe_job_definitions(self, jobDefinitions: list[str]) -> Any:
        return {"jobDefinitions": self.definitions}


def _ecs(*names: str) -> dict[str, Any]:
    return {"status": "ACTIVE", "ecsProperties": {"taskProperties": [{"containers": [{"name": n} for n in names]}]}}


def test_target_reads_the_containers_of_a_multi_container_definition() -> None:
    target = sub.resolve_target(FakeBatchDefs([_ecs("job", "profiler", "log-router")]), "q", "d")
    assert target.containers == ("job", "profiler", "log-router")
    single = sub.resolve_target(FakeBatchDefs([{"status": "ACTIVE", "containerProperties": {}}]), "q", "d")
    assert single.containers is None


@pytest.mark.parametrize(("definitions", "message"), [
    ([_ecs("job")], "has no container profiler (has job)"),
    ([], "does not exist or is inactive"),
    ([{**_ecs("job", "profiler"), "status": "INACTIVE"}], "does not exist or is inactive"),
])
def test_target_rejects_a_foreign_definition(definitions: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        sub.resolve_target(FakeBatchDefs(definitions), "q", "d")


def test_target_requires_every_interface_container() -> None:
    for missing in CONTAINERS:
        others = [name for name in CONTAINERS if name != missing]
        with pytest.raises(UsageError, match=f"has no container {missing} "):
            sub.resolve_target(FakeBatchDefs([_ecs(*others)]), "q", "d")
