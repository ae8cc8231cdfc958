"""The profiled job's identity from its environment, with the names the caller passes in."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling.identity import JobEnv, JobIdentity, ecs_task_id, job_identity, resolve_task_id, safe_task_id
from tests.support.loopback import Quiet, serving

NAMES = JobEnv(pipeline="P", job_id="J", array_index="I", array_offset="O", volume_type="V", scratch="S",
               profiler_socket="SOCK", default_scratch="/scratch", profiler_off="off", task_id="T", attempt="A",
               ecs_metadata="ECS", task_dir=lambda task: f"task-{task}")
# The task metadata v4 answer's field the rendezvous uses, as the ECS Developer Guide's example shows it.
TASK_ARN = "arn:aws:ecs:us-west-2:111122223333:task/default/158d1c8083dd49d6b527399fd6414f5c"


def test_everything_from_the_environment() -> None:
    identity = JobIdentity.from_env({"P": "demo", "J": "job-1", "I": "3", "O": "100", "V": "gp3", "S": "/mnt/s"},
                                    NAMES, "abc")
    assert identity == JobIdentity(pipeline="demo", job_id="job-1", array_index=103, volume_type="gp3",
                                   work_dir=Path("/mnt/s/task-abc"), socket_path=Path("/mnt/s/task-abc/profiler.sock"))
    assert identity.properties == {"Pipeline": "demo", "JobId": "job-1", "ArrayIndex": "103",
                                   "InstanceId": "unknown", "InstanceType": "unknown", "VolumeType": "gp3"}


def test_defaults_when_unset_or_malformed() -> None:
    identity = JobIdentity.from_env({"I": "x", "O": "2"}, NAMES, "t1")
    assert (identity.pipeline, identity.job_id, identity.array_index, identity.volume_type) == \
        ("iobatch", "local", 0, "unknown")
    assert identity.work_dir == Path("/scratch/task-t1")
    assert JobIdentity.from_env({"I": "-1"}, NAMES, "t1").array_index == 0


def test_without_the_array_index_variable_the_index_comes_from_the_array_childs_job_id() -> None:
    assert JobIdentity.from_env({"J": "4f6e-11:7", "O": "100"}, NAMES, "t").array_index == 107
    assert JobIdentity.from_env({"J": "4f6e-11"}, NAMES, "t").array_index == 0  # a plain job


def test_the_socket_is_given_or_off() -> None:
    assert JobIdentity.from_env({"SOCK": " /tmp/p.sock "}, NAMES, "t").socket_path == Path("/tmp/p.sock")
    assert JobIdentity.from_env({"SOCK": "off"}, NAMES, "t").socket_path is None


def test_the_task_id_is_the_launchers_else_the_ecs_tasks_else_job_and_attempt() -> None:
    def never(uri: str) -> str | None:
        raise AssertionError("the metadata endpoint is not asked when the launcher names the task")

    assert resolve_task_id({"T": "00005-a1b2c3", "ECS": "http://x"}, NAMES, never) == "00005-a1b2c3"
    assert resolve_task_id({"ECS": "http://x", "J": "j:1"}, NAMES, lambda uri: "158d1c") == "158d1c"
    # The endpoint did not answer: job id and attempt, made safe for a path.
    assert resolve_task_id({"ECS": "http://x", "J": "4f6e:7", "A": "2"}, NAMES, lambda uri: None) == "4f6e-7-2"
    assert resolve_task_id({}, NAMES, never) == "local-1"
    assert safe_task_id("../..//x y") == "x-y" and safe_task_id("///") == "local"


@pytest.fixture
def metadata_endpoint() -> Iterator[str]:
    """A stand-in for the ECS agent's task metadata endpoint v4 (GET <uri>/task)."""

    class Handler(Quiet):
        def do_GET(self) -> None:
            if self.path != "/v4/container-1/task":
                self.send_error(404)
                return
            body = json.dumps({"Cluster": "default", "TaskARN": TASK_ARN, "Containers": []}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serving(Handler) as url:
        yield f"{url}/v4/container-1"


def test_the_ecs_task_id_is_the_last_part_of_the_task_arn(metadata_endpoint: str) -> None:
    assert ecs_task_id(metadata_endpoint) == "158d1c8083dd49d6b527399fd6414f5c"
    assert ecs_task_id(metadata_endpoint + "/nothing", attempts=2, sleep=lambda s: None) is None
    identity = job_identity({"ECS": metadata_endpoint, "S": "/scratch"}, NAMES)
    assert identity.work_dir == Path("/scratch/task-158d1c8083dd49d6b527399fd6414f5c")


def test_outside_a_container_the_instance_is_this_host() -> None:
    identity = job_identity({"P": "demo"}, NAMES)
    assert identity.instance_type == "local" and identity.properties["InstanceId"] == identity.instance_id
