"""Alarms on the EMF documents CloudWatch refuses: a profile that never became metrics says so here."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_logs as logs
from constructs import Construct

# CloudWatch Logs counts the EMF documents of a log group it cannot parse as JSON or whose directive it rejects (a
# truncated line, a metric over the limits), under these names in AWS/Logs with dimension LogGroupName (aws-cdk-lib
# LogsMetrics.emfParsingErrorsSum and emfValidationErrorsSum; "Monitoring with CloudWatch metrics", CloudWatch Logs
# User Guide). Their documents stay in the log group but never become metrics, so the dashboard misses them.
LOGS_NAMESPACE = "AWS/Logs"
EMF_ERROR_METRICS = ("EMFParsingErrors", "EMFValidationErrors")


class EmfAlarms(Construct):
    """`alarms`: one per metric of EMF_ERROR_METRICS on `log_group`, at one refused document in five minutes."""

    def __init__(self, scope: Construct, construct_id: str, *, log_group: logs.ILogGroup, pipeline: str) -> None:
        super().__init__(scope, construct_id)
        self.alarms = [
            cw.Alarm(
                self, name,
                alarm_description=f"{pipeline}: CloudWatch refused EMF documents in the pipeline's log group ({name}):"
                " those profiles are in the log group but not in the metrics or the dashboard",
                metric=cw.Metric(namespace=LOGS_NAMESPACE, metric_name=name, statistic="Sum",
                                 period=Duration.minutes(5),
                                 dimensions_map={"LogGroupName": log_group.log_group_name}),
                threshold=1, evaluation_periods=1,
                comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
            for name in EMF_ERROR_METRICS
        ]
