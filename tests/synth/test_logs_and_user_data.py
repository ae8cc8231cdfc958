"""The pipeline's log groups (alarms on the EMF documents CloudWatch refuses, removed with the stack) and the size of
the hosts' user data, on the one session-wide synth."""

from __future__ import annotations

from typing import Any

from infra.emfalarms import EMF_ERROR_METRICS, LOGS_NAMESPACE
from tests.support.synth import Synthesized

# EC2 takes at most 16 KB of user data ("User data is limited to 16 KB, in raw form, before it is base64-encoded",
# EC2 User Guide); Batch merges its own MIME part (ECS agent settings) into the launch template's: what it adds is
# not documented, so a margin of 2 KiB stays free for it.
USER_DATA_LIMIT = 16 * 1024
BATCH_PART_ALLOWANCE = 2 * 1024
# A deployed name in place of each Ref and GetAtt: generated names run to tens of characters; this allows more.
TOKEN_STAND_IN = "x" * 128


def resolved(node: Any) -> str:
    """A CloudFormation value as text, with every Ref and GetAtt as TOKEN_STAND_IN."""
    if isinstance(node, str):
        return node
    if isinstance(node, dict) and "Fn::Join" in node:
        sep, parts = node["Fn::Join"]
        return str(sep).join(resolved(p) for p in parts)
    if isinstance(node, dict) and ("Ref" in node or "Fn::GetAtt" in node):
        return TOKEN_STAND_IN
    raise AssertionError(f"cannot resolve {node!r}")


def test_user_data_leaves_room_for_batchs_part_under_ec2s_limit(synthesized: Synthesized) -> None:
    user_data = synthesized.only("AWS::EC2::LaunchTemplate")["Properties"]["LaunchTemplateData"]["UserData"]
    size = len(resolved(user_data["Fn::Base64"]).encode())
    assert size <= USER_DATA_LIMIT - BATCH_PART_ALLOWANCE, f"{size} bytes of user data"


def test_a_refused_emf_document_alarms_on_the_pipelines_log_group(synthesized: Synthesized) -> None:
    [log_group] = [k for k in synthesized.resources("AWS::Logs::LogGroup") if k.startswith("Logs")]
    alarms = {a["Properties"]["MetricName"]: a["Properties"] for a in synthesized.resources(
        "AWS::CloudWatch::Alarm").values() if a["Properties"]["Namespace"] == LOGS_NAMESPACE}
    assert sorted(alarms) == sorted(EMF_ERROR_METRICS) == ["EMFParsingErrors", "EMFValidationErrors"]
    for alarm in alarms.values():
        assert alarm["Dimensions"] == [{"Name": "LogGroupName", "Value": {"Ref": log_group}}]
        assert (alarm["Statistic"], alarm["Period"], alarm["Threshold"], alarm["EvaluationPeriods"]) == (
            "Sum", 300, 1, 1)
        assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        assert alarm["TreatMissingData"] == "notBreaching"


def test_both_log_groups_go_with_the_stack(synthesized: Synthesized) -> None:
    groups = synthesized.resources("AWS::Logs::LogGroup")
    assert len(groups) == 2  # the jobs' and hosts' group, and the VPC's flow logs
    assert {(g["DeletionPolicy"], g["UpdateReplacePolicy"]) for g in groups.values()} == {("Delete", "Delete")}
