"""The stack is least-privilege and loud when a host fails: IMDS out of the containers' reach (hop limit 1), the ECS
task roles trusted only for this account's tasks, a host's failed setup counted and alarmed, the dashboard's slowest
child as each metric defines it, and bad mount option values refused at synth in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.app import build_app
from infra.dashboard import dashboard_metrics, scratch_volumes_query
from infra.settings import SettingsError
from profiling.metrics import DEFAULT_NAMESPACE, METRICS_BY_NAME, PROPERTY_KEYS, STAGES
from tests.support.synth import Synthesized, cfn_text

ROOT = Path(__file__).resolve().parents[2]


def test_imds_is_out_of_the_containers_reach(synthesized: Synthesized) -> None:
    options = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]["MetadataOptions"]
    assert options["HttpTokens"] == "required"
    assert options["HttpPutResponseHopLimit"] == 1


def test_ecs_task_roles_trust_only_this_accounts_tasks(synthesized: Synthesized) -> None:
    roles = {k: v for k, v in synthesized.resources("AWS::IAM::Role").items()
             if k.startswith(("JobsJobRole", "JobsExecutionRole"))}
    assert len(roles) == 2
    for name, role in roles.items():
        [statement] = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
        assert statement["Principal"] == {"Service": "ecs-tasks.amazonaws.com"}, name
        conditions = statement["Condition"]
        assert conditions["StringEquals"] == {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}, name
        assert cfn_text(conditions["ArnLike"]["aws:SourceArn"]) == "arn:<AWS::Partition>:ecs:<AWS::Region>:" \
                                                                  "<AWS::AccountId>:*", name


def test_a_hosts_failed_setup_is_counted_and_alarms(synthesized: Synthesized) -> None:
    [log_group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    script = json.dumps(synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]["UserData"])
    assert f'FAILURE_LOG_GROUP=\'", {{"Ref": "{log_group}"}}' in script
    metric_filter = synthesized.only("AWS::Logs::MetricFilter")["Properties"]
    assert metric_filter["LogGroupName"] == {"Ref": log_group}
    assert metric_filter["FilterPattern"] == '{ $.HostSetup = "failed" }'
    [transform] = metric_filter["MetricTransformations"]
    assert (transform["MetricNamespace"], transform["MetricName"], transform["MetricValue"]) == (
        DEFAULT_NAMESPACE, "HostSetupFailures", "1")
    assert transform["Dimensions"] == [{"Key": "Pipeline", "Value": "$.Pipeline"}]
    [alarm] = [a["Properties"] for a in synthesized.resources("AWS::CloudWatch::Alarm").values()
               if a["Properties"]["Namespace"] == DEFAULT_NAMESPACE]
    assert (alarm["MetricName"], alarm["Namespace"], alarm["Statistic"], alarm["Threshold"]) == (
        "HostSetupFailures", DEFAULT_NAMESPACE, "Sum", 1)
    assert alarm["Dimensions"] == [{"Name": "Pipeline", "Value": "iobatch"}]
    # The hosts' role may write to that group, and only that group is named.
    writes = [s for p in synthesized.resources("AWS::IAM::Policy").values()
              for s in p["Properties"]["PolicyDocument"]["Statement"]
              if any(r.get("Ref", "").startswith("ComputeComputeEnvironmentInstanceProfileRole")
                     for r in p["Properties"]["Roles"]) and "logs:PutLogEvents" in s["Action"]]
    assert writes and all(s["Resource"] == {"Fn::GetAtt": [log_group, "Arn"]} for s in writes)


def _dashboard(synthesized: Synthesized) -> dict[str, Any]:
    body = synthesized.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"]
    return dict(json.loads(cfn_text(body)))


def test_the_slowest_child_is_each_metrics_own(synthesized: Synthesized) -> None:
    shown: dict[tuple[str, str], set[str]] = {}
    for widget in _dashboard(synthesized)["widgets"]:
        for line in widget["properties"].get("metrics", []):
            if line[0] == DEFAULT_NAMESPACE:
                shown.setdefault((line[5], line[1]), set()).add(line[6]["stat"])
    for stage in STAGES:
        for spec in dashboard_metrics():
            assert (stage, spec.name) in shown
    # Throughput's slowest child is its smallest value; a duration's, latency's or stall's its largest.
    assert shown[("download", "Throughput")] == {"p50", "Minimum"}
    assert shown[("download", "StageDuration")] == {"p50", "Maximum"}
    assert shown[("upload", "DeviceWriteLatency")] == {"p50", "Maximum"}
    assert shown[("process", "IoStallSome")] == {"p50", "Maximum"}
    # A host-wide peak has no slowest child: the largest any child saw, as the metric aggregates it.
    assert shown[("download", "PeakDirtyBytes")] == {"Maximum"}
    assert METRICS_BY_NAME["Throughput"].better.slowest_statistic == "Minimum"


def test_the_ebs_row_says_it_is_every_volume_of_the_region(synthesized: Synthesized) -> None:
    titles = [w["properties"].get("title", "") for w in _dashboard(synthesized)["widgets"]]
    ebs = [t for t in titles if "BurstBalance" in t or "VolumeQueueLength" in t]
    assert len(ebs) == 2 and all(t.startswith("every EBS volume in the region (up to 500)") for t in ebs)


def test_the_pipelines_own_scratch_volume_ids_are_reachable(synthesized: Synthesized) -> None:
    """The scratch volumes carry the pipeline's tag, and the dashboard lists their ids from the profiles (each
    profile's VolumeId property: the NVMe serial of the disk behind scratch)."""
    data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]
    [volume_tags] = [t["Tags"] for t in data["TagSpecifications"] if t["ResourceType"] == "volume"]
    assert {"Key": "iobatch:pipeline", "Value": "iobatch"} in volume_tags
    [log_group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    [volumes] = [w for w in _dashboard(synthesized)["widgets"]
                 if w["type"] == "log" and w["properties"]["title"].startswith("this pipeline's scratch volumes")]
    query = volumes["properties"]["query"]
    assert query.startswith(f"SOURCE '<{log_group}>'")
    for line in scratch_volumes_query("iobatch").splitlines():
        assert line in query
    assert "VolumeId" in PROPERTY_KEYS


@pytest.mark.parametrize(("options", "message"), [
    ("noatime,logbufs=10,nofail", "mount option 'logbufs=10' is out of range: XFS takes logbufs 2-8; e.g. logbufs=8"),
    ("logbsize=512k,nofail", "mount option 'logbsize=512k' is out of range: XFS takes logbsize 16k, 32k, 64k, 128k or "
                             "256k; e.g. logbsize=256k"),
    ("allocsize=3m,nofail", "mount option 'allocsize=3m' is out of range: XFS takes allocsize a power of two from 4k "
                            "to 1g; e.g. allocsize=64m"),
    ("allocsize=2g,nofail", "mount option 'allocsize=2g' is out of range: XFS takes allocsize a power of two from 4k "
                            "to 1g; e.g. allocsize=64m"),
    ("delaylog,nofail", "mount option 'delaylog' makes the mount fail: it was removed from XFS in Linux 4.0; drop it "
                        "(delayed logging is always on)"),
])
def test_synth_refuses_bad_mount_option_values(options: str, message: str) -> None:
    with pytest.raises(SettingsError) as raised:
        build_app({"mountOptions": options})
    assert str(raised.value) == message


def test_the_app_says_a_bad_value_in_one_line_and_exits_64() -> None:
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps({"mountOptions": "noatime,logbufs=10,nofail"}),
           "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1"}
    done = subprocess.run([sys.executable, "-m", "infra.app"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 64
    assert done.stderr.strip().splitlines()[-1] == (
        "error: mount option 'logbufs=10' is out of range: XFS takes logbufs 2-8; e.g. logbufs=8")
    assert done.stdout == ""
