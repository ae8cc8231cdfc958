"""The hosts' user data qualifies scratch before ECS starts (tuning/hostqualify.py), with the expectation of the stack's
own volume and instance types, and stays within EC2's 16 KB with room for Batch's part, in flag mode (the default)
and with fence on instance-store scratch (the largest expectation table); fence alone lets the instance role count
the hour's fences (logs:DescribeLogStreams on the pipeline's log group)."""

from __future__ import annotations

import json
from typing import Any

from profiling.qualification import QUALIFICATION_FILE
from tests.support.guest import template_user_data
from tests.support.synth import BATCH_PART_ALLOWANCE, USER_DATA_LIMIT, Synthesized, synthesize, user_data_size
from tuning.ebs import Volume
from tuning.qualify import expect

STORE_FENCE = {"scratch": "instance-store", "instanceTypes": '["m6id.2xlarge"]', "volumeSizeGiB": "400",
               "hostQualification": "fence", "fencesPerHour": "3"}


def conf_of(script: str) -> dict[str, Any]:
    line = next(x for x in script.splitlines() if x.startswith("QUALIFY_CONF="))
    conf: dict[str, Any] = json.loads(line.removeprefix("QUALIFY_CONF=").strip("'"))
    return conf


def describe_grants(synthesized: Synthesized) -> list[dict[str, Any]]:
    """The statements that let a role list the streams of the pipeline's log group (not the flow logs')."""
    [group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    return [s for p in synthesized.resources("AWS::IAM::Policy").values()
            for s in p["Properties"]["PolicyDocument"]["Statement"]
            if "logs:DescribeLogStreams" in (s["Action"] if isinstance(s["Action"], list) else [s["Action"]])
            and group in json.dumps(s["Resource"])]


def test_the_default_hosts_qualify_their_st1_in_flag_mode(synthesized: Synthesized) -> None:
    script = template_user_data(synthesized.template)
    assert "\nQUALIFY=flag\n" in script and 'hostpy qualify "$QUALIFY_CONF" "$INSTANCE_ID" "$INSTANCE_TYPE"' in script
    assert script.index('hostpy qualify') < script.index('mv -f "$MOUNT_POINT/$READY_MARKER.tmp"')
    conf = conf_of(script)
    assert conf["expected"] == {"*": [round(expect(Volume("st1", 500)).write_mibps, 2)] * 2}
    assert (conf["mode"], conf["min_ratio"], conf["file"], conf["small"]) == ("flag", 0.5, QUALIFICATION_FILE, False)
    assert describe_grants(synthesized) == []
    assert user_data_size(synthesized) <= USER_DATA_LIMIT - BATCH_PART_ALLOWANCE


def test_fenced_instance_store_hosts_fit_and_may_count_the_hours_fences() -> None:
    synthesized = synthesize(**STORE_FENCE)
    size = user_data_size(synthesized)
    assert size <= USER_DATA_LIMIT - BATCH_PART_ALLOWANCE, f"{size} bytes of user data"
    conf = conf_of(template_user_data(synthesized.template))
    assert (conf["mode"], conf["per_hour"], conf["small"]) == ("fence", 3, True)
    assert conf["expected"]["m6id.2xlarge"] == [262.05, 524.09]  # 67,084 write and 134,166 read IOPS x 4 KiB
    [grant] = describe_grants(synthesized)
    assert grant["Effect"] == "Allow" and grant["Action"] == "logs:DescribeLogStreams"


def test_the_dashboard_ranks_the_hosts_by_qualification(synthesized: Synthesized) -> None:
    body = json.dumps(synthesized.only("AWS::CloudWatch::Dashboard")["Properties"]["DashboardBody"])
    assert "hosts by their scratch's qualification at boot" in body
    assert 'like \\\\\\"host-qualification/\\\\\\"' in body and "sort QualifiedRatio asc" in body
