"""profilerEbpf: the profiler container root and privileged (so it can load the eBPF probe) only when asked, with
the host's bpffs mounted where the probe shares its programs, and the stack still passes cdk-nag; by default the
profiler is the image's unprivileged user and sees no bpffs."""

from __future__ import annotations

from typing import Any

from aws_cdk import assertions

from infra.app import build_app
from infra.jobs import BPFFS_PATH, BPFFS_VOLUME
from pipeline.interface import PROFILER_CONTAINER
from profiling.probes.ebpf_host import DEFAULT_PIN
from tests.support.synth import Synthesized, job_containers


def test_by_default_the_profiler_is_unprivileged(synthesized: Synthesized) -> None:
    for container in job_containers(synthesized.template).values():
        assert "Privileged" not in container and "User" not in container
        assert all(m["SourceVolume"] != BPFFS_VOLUME for m in container["MountPoints"])


def test_profiler_ebpf_makes_only_the_profiler_privileged(tmp_path: Any) -> None:
    app, stack = build_app({"profilerEbpf": "true"}, outdir=str(tmp_path))
    app.synth()  # cdk-nag findings would fail here
    containers = job_containers(assertions.Template.from_stack(stack).to_json())
    profiler = containers.pop(PROFILER_CONTAINER)
    assert (profiler["Privileged"], profiler["User"]) == (True, "0")
    assert all("Privileged" not in c and "User" not in c for c in containers.values())
    # One copy of the programs per host: the profiler sees the host's own bpffs, where the probe pins them.
    assert DEFAULT_PIN.parent.as_posix() == BPFFS_PATH
    assert {"ContainerPath": BPFFS_PATH, "ReadOnly": False, "SourceVolume": BPFFS_VOLUME} in profiler["MountPoints"]
    assert all(m["SourceVolume"] != BPFFS_VOLUME for c in containers.values() for m in c["MountPoints"])
    resources = assertions.Template.from_stack(stack).to_json()["Resources"].values()
    (task,) = [r["Properties"]["EcsProperties"]["TaskProperties"][0] for r in resources
               if r["Type"] == "AWS::Batch::JobDefinition"]
    assert {"Host": {"SourcePath": BPFFS_PATH}, "Name": BPFFS_VOLUME} in task["Volumes"]
