"""The profiler container sees the host's cgroup v2 hierarchy read-only (the job's own device bytes, io stall
and dirty pages); the job container does not."""

from __future__ import annotations

from typing import Any

from pipeline.interface import HOST_CGROUP_MOUNT, JOB_CONTAINER, PROFILER_CONTAINER
from tests.support.synth import Synthesized


def test_only_the_profiler_mounts_the_hosts_cgroup_hierarchy_read_only(synthesized: Synthesized) -> None:
    template: dict[str, Any] = synthesized.template
    (definition,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::Batch::JobDefinition"]
    (task,) = definition["Properties"]["EcsProperties"]["TaskProperties"]
    volumes = {v["Name"]: v["Host"]["SourcePath"] for v in task["Volumes"]}
    containers = {c["Name"]: c for c in task["Containers"]}
    (mount,) = [m for m in containers[PROFILER_CONTAINER]["MountPoints"] if m["ContainerPath"] == HOST_CGROUP_MOUNT]
    assert mount["ReadOnly"] is True and volumes[mount["SourceVolume"]] == "/sys/fs/cgroup"
    assert all(m["ContainerPath"] != HOST_CGROUP_MOUNT for m in containers[JOB_CONTAINER]["MountPoints"])
