"""tuning.instances: the instance table (AWS's figures) and children per host, the one rule the stack and the
advisor share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.settings import StackSettings
from pipeline.cli import app
from tests.support.cli import CliRunner
from tests.support.profiles import batch
from tuning.instances import (
    INSTANCE_TYPES,
    children_per_host,
    job_memory_mib,
    lookup,
    reserved_vcpus,
    task_memory_mib,
    types_of,
)


def test_figures_match_the_aws_tables_for_a_row_of_each_kind() -> None:
    m6i = lookup("m6i.2xlarge")
    assert m6i is not None and (m6i.vcpus, m6i.memory_gib, m6i.ebs_baseline_mbps, m6i.ebs_max_mbps) == (8, 32, 2500,
                                                                                                          10000)
    assert round(m6i.ebs_baseline_mibps, 1) == 298.0 and m6i.store_gb == 0  # 312.5 MB/s
    c6i, r6i = lookup("c6i.large"), lookup("r6i.32xlarge")
    assert c6i is not None and (c6i.vcpus, c6i.memory_gib, c6i.ebs_baseline_mbps) == (2, 4, 650)
    assert r6i is not None and (r6i.vcpus, r6i.memory_gib, r6i.ebs_baseline_mbps) == (128, 1024, 40000)
    m6id, i4i = lookup("m6id.12xlarge"), lookup("i4i.large")
    assert m6id is not None and (m6id.store_volumes, m6id.store_volume_gb, m6id.memory_gib) == (2, 1425, 192)
    assert i4i is not None and (i4i.store_gb, i4i.ebs_baseline_mbps, i4i.memory_gib) == (468, 625, 16)
    assert lookup(" M6I.XLARGE ") == lookup("m6i.xlarge") and lookup("m7i.large") is None


def test_a_family_is_every_size_and_an_unknown_entry_none() -> None:
    assert [t.name for t in types_of("c6id")][:3] == ["c6id.large", "c6id.xlarge", "c6id.2xlarge"]
    assert len(types_of("i4i")) == 10 and types_of("m6i.4xlarge") == [INSTANCE_TYPES["m6i.4xlarge"]]
    assert types_of("m7i") == [] and types_of("m7i.large") == []


def test_job_memory_is_the_stacks() -> None:
    assert task_memory_mib(2) == 7168 and job_memory_mib(2) == 6912  # 6.75 GiB for the job container


@pytest.mark.parametrize(("name", "vcpus_per_job", "children"), [
    ("m6i.2xlarge", 2, 4),  # by vCPU; 4 x 7 GiB fit in 32 GiB less what the agent does not register
    ("m6i.large", 2, 1),  # 7,953 MiB registered hold one 7,168 MiB job
    ("c6i.2xlarge", 2, 2),  # by memory: 16 GiB hold two 7 GiB jobs, 4 vCPUs idle
    ("c6i.large", 2, 0),  # 4 GiB: the job does not fit
    ("r6i.32xlarge", 2, 64),
    ("m6i.32xlarge", 1, 64),  # vcpusPerJob 1 reserves 2: the job's container and the profiler's, a vCPU each
    ("m6i.large", 4, 0),  # fewer vCPUs than the job needs
])
def test_children_per_host_is_the_lesser_of_vcpus_and_memory(name: str, vcpus_per_job: int, children: int) -> None:
    kind = lookup(name)
    assert kind is not None and children_per_host(kind, vcpus_per_job) == children


def test_advise_for_an_instance_type_plans_what_the_stack_runs(tmp_path: Path) -> None:
    profiles = tmp_path / "part-00000.jsonl"
    profiles.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in batch(images=80)))
    result = CliRunner().invoke(app, ["advise", str(profiles), "--instance-type", "r6i.xlarge", "--jobs-per-day",
                                      "500", "--json"])
    assert result.exit_code == 0, result.output
    advice = json.loads(result.output)
    plan, context = advice["plan"], advice["cdk_context"]
    assert (plan["instance_type"], plan["jobs_per_instance"], plan["memory_gib"]) == ("r6i.xlarge", 2, 32)
    assert plan["job_memory_gib"] == 6.75 and round(plan["instance_ebs_mibps"], 1) == 149.0  # 1,250 Mbps
    # The advice deploys as it planned: the stack runs the same children per host on that type.
    settings = StackSettings.from_context(context)
    assert settings.instance_types == ("r6i.xlarge",) and settings.children_per_host == 2
    kind = lookup("r6i.xlarge")
    assert kind is not None and children_per_host(kind, settings.vcpus_per_job) == settings.children_per_host
    # The stack's job does not fit a 4 GiB host: no limit per child is assumed (one given is checked instead).
    local = CliRunner().invoke(app, ["advise", str(profiles), "--jobs-per-instance", "2", "--memory-gib", "4",
                                     "--jobs-per-day", "10", "--json"])
    assert local.exit_code == 0 and json.loads(local.output)["plan"]["job_memory_gib"] is None


@pytest.mark.parametrize("vcpus_per_job", [1, 2, 3, 4])
def test_the_stack_the_hosts_checks_and_the_advisor_count_the_vcpus_a_job_reserves(vcpus_per_job: int) -> None:
    """The job definition gives the job container and the profiler a whole vCPU each at least, so vcpusPerJob 1
    reserves 2: synth's host checks and the advisor count children per host by what the definition reserves."""
    settings = StackSettings.from_context({"vcpusPerJob": vcpus_per_job, "instanceTypes": "m6i.2xlarge"})
    reserved = settings.job_vcpus + settings.profiler_vcpus
    assert reserved == reserved_vcpus(vcpus_per_job) == max(vcpus_per_job, 2)
    m6i = lookup("m6i.2xlarge")
    assert m6i is not None and children_per_host(m6i, vcpus_per_job) == min(8 // reserved, 4)
