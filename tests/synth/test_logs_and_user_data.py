"""The pipeline's log groups (alarms on the EMF documents CloudWatch refuses, removed with the stack) and the size of
the hosts' user data, on the one session-wide synth."""

from __future__ import annotations

from infra.emfalarms import EMF_ERROR_METRICS, LOGS_NAMESPACE
from tests.support.synth import BATCH_PART_ALLOWANCE, USER_DATA_LIMIT, Synthesized, user_data_size


def test_user_data_leaves_room_for_batchs_part_under_ec2s_limit(synthesized: Synthesized) -> None:
    size = user_data_size(synthesized)
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
