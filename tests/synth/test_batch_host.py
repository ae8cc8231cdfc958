"""What a real Batch host needs from the template: children sharing a host, a soft deadline before the
timeout, a host that failed its scratch setup leaving the cluster, deploys that wait for running children,
a Logs Insights query in the documented form, and synth validated as `cdk deploy` validates it."""

from __future__ import annotations

import json
import os
import re

from infra.app import FEATURE_FLAGS
from infra.compute import MAX_UPDATE_TIMEOUT_MINUTES, update_policy_minutes
from infra.dashboard import slowest_download_query
from infra.settings import StackSettings
from pipeline.interface import ENV, JOB_CONTAINER, soft_deadline_s
from tests.support.synth import Synthesized
from tuning.host import SCRATCH_READY_MARKER


def _job_environment(synthesized: Synthesized, name: str = JOB_CONTAINER) -> dict[str, str]:
    [task] = synthesized.only("AWS::Batch::JobDefinition")["Properties"]["EcsProperties"]["TaskProperties"]
    [container] = [c for c in task["Containers"] if c["Name"] == name]
    return {e["Name"]: e["Value"] for e in container["Environment"]}


def test_the_job_knows_its_timeout_and_stops_before_it(synthesized: Synthesized) -> None:
    definition = synthesized.only("AWS::Batch::JobDefinition")["Properties"]
    timeout_s = definition["Timeout"]["AttemptDurationSeconds"]
    env = _job_environment(synthesized)
    assert env[ENV.TIMEOUT_S] == str(timeout_s) == str(StackSettings().job_timeout_minutes * 60)
    assert timeout_s - soft_deadline_s(timeout_s) == 300  # five minutes early for a two-hour attempt
    assert soft_deadline_s(60) == 48  # Batch's shortest timeout: still a fifth early


def test_jobs_need_the_prepared_volume_that_the_user_data_marks(synthesized: Synthesized) -> None:
    assert _job_environment(synthesized)[ENV.REQUIRE_PREPARED_SCRATCH] == "1"
    [task] = synthesized.only("AWS::Batch::JobDefinition")["Properties"]["EcsProperties"]["TaskProperties"]
    [mount_point] = [v["Host"]["SourcePath"] for v in task["Volumes"] if v["Name"] == "scratch"]
    data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]
    user_data = json.dumps(data["UserData"])
    # The marker is written on that host path, and a failed setup shuts the host down, which terminates it.
    assert f"MOUNT_POINT={mount_point}" in user_data and f"READY_MARKER={SCRATCH_READY_MARKER}" in user_data
    assert "systemctl mask --now ecs.service" in user_data and "trap fence_host EXIT" in user_data
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"


def test_a_deploy_during_a_batch_waits_for_running_children(synthesized: Synthesized) -> None:
    policy = synthesized.only("AWS::Batch::ComputeEnvironment")["Properties"]["UpdatePolicy"]
    assert policy == {"TerminateJobsOnUpdate": False,
                      "JobExecutionTimeoutMinutes": StackSettings().job_timeout_minutes}
    # Batch waits at most six hours: longer attempts are capped there (the README says so).
    assert update_policy_minutes(45) == 45 and update_policy_minutes(24 * 60) == MAX_UPDATE_TIMEOUT_MINUTES == 360


def test_the_slowest_instances_query_aggregates_a_field_and_divides_no_aggregate() -> None:
    query = slowest_download_query("iobatch")
    assert not re.search(r"\b(avg|sum|min|max|count|pct|stddev)\([^)]*\)\s*[-+*/]", query), query
    assert "Throughput / 1048576 as mibps" in query.splitlines()[0]
    assert "| stats avg(mibps) as MiBps, count(*) as children by InstanceId, InstanceType" in query


def test_synth_runs_cdks_own_template_validation_as_deploy_does(synthesized: Synthesized) -> None:
    assert os.environ.get("CDK_VALIDATION", "true").lower() != "false"
    assert FEATURE_FLAGS["@aws-cdk/core:validateAgainstDefaultRules"] is True
    report = json.loads((synthesized.outdir / "validation-report.json").read_text())
    # Every plugin that reported found nothing (a finding of the built-in validator would have failed synth).
    assert all(r["conclusion"] == "success" and r["violations"] == [] for r in report["pluginReports"]), report
