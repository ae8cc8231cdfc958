"""The profiled job's identity from its environment, with the names the caller passes in."""

from __future__ import annotations

from pathlib import Path

from profiling.identity import JobEnv, JobIdentity, job_identity

NAMES = JobEnv(pipeline="P", job_id="J", array_index="I", array_offset="O", volume_type="V", scratch="S",
               profiler_socket="SOCK", default_scratch="/scratch", profiler_off="off",
               child_dir=lambda index: f"part-{index:05d}")


def test_everything_from_the_environment() -> None:
    identity = JobIdentity.from_env({"P": "demo", "J": "job-1", "I": "3", "O": "100", "V": "gp3", "S": "/mnt/s"},
                                    NAMES)
    assert identity == JobIdentity(pipeline="demo", job_id="job-1", array_index=103, volume_type="gp3",
                                   work_dir=Path("/mnt/s/part-00103"),
                                   socket_path=Path("/mnt/s/part-00103/profiler.sock"))
    assert identity.properties == {"Pipeline": "demo", "JobId": "job-1", "ArrayIndex": "103",
                                   "InstanceId": "unknown", "InstanceType": "unknown", "VolumeType": "gp3"}


def test_defaults_when_unset_or_malformed() -> None:
    identity = JobIdentity.from_env({"I": "x", "O": "2"}, NAMES)
    assert (identity.pipeline, identity.job_id, identity.array_index, identity.volume_type) == \
        ("iobatch", "local", 0, "unknown")
    assert identity.work_dir == Path("/scratch/part-00000")
    assert JobIdentity.from_env({"I": "-1"}, NAMES).array_index == 0


def test_the_socket_is_given_or_off() -> None:
    assert JobIdentity.from_env({"SOCK": " /tmp/p.sock "}, NAMES).socket_path == Path("/tmp/p.sock")
    assert JobIdentity.from_env({"SOCK": "off"}, NAMES).socket_path is None


def test_outside_a_container_the_instance_is_this_host() -> None:
    identity = job_identity({"P": "demo"}, NAMES)
    assert identity.instance_type == "local" and identity.properties["InstanceId"] == identity.instance_id
