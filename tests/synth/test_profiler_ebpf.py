"""profilerEbpf: the profiler container root and privileged (so it can load the eBPF probe) only when asked,
and the stack still passes cdk-nag; by default the profiler is the image's unprivileged user."""

from __future__ import annotations

from typing import Any

from aws_cdk import assertions

from infra.app import build_app
from pipeline.interface import PROFILER_CONTAINER
from tests.support.synth import Synthesized, job_containers


def test_by_default_the_profiler_is_unprivileged(synthesized: Synthesized) -> None:
    for container in job_containers(synthesized.template).values():
        assert "Privileged" not in container and "User" not in container


def test_profiler_ebpf_makes_only_the_profiler_privileged(tmp_path: Any) -> None:
    app, stack = build_app({"profilerEbpf": "true"}, outdir=str(tmp_path))
    app.synth()  # cdk-nag findings would fail here
    containers = job_containers(assertions.Template.from_stack(stack).to_json())
    profiler = containers.pop(PROFILER_CONTAINER)
    assert (profiler["Privileged"], profiler["User"]) == (True, "0")
    assert all("Privileged" not in c and "User" not in c for c in containers.values())
