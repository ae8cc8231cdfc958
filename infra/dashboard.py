"""The CloudWatch dashboard: one row per stage, built from profiling.metrics.METRICS.

A metric marked `on_dashboard` in METRICS gets a graph in every stage row; nothing here names a
metric by hand except the AWS/EBS ones and the slow-instance query.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_logs as logs
from constructs import Construct

from profiling.metrics import DEFAULT_NAMESPACE, DIMENSIONS, METRICS, STAGES, Aggregate, MetricSpec
from tuning.host import QUALIFICATION_STREAM_PREFIX

GRID_WIDTH = 24
EBS_SEARCH_LIMIT = 500
PIPELINE_DIMENSION, STAGE_DIMENSION = DIMENSIONS
# A stage's figure across its children as the metric aggregates them (profiling.metrics.Aggregate): the median child,
# the largest any child saw, or the total.
_TYPICAL = {Aggregate.MEDIAN: "p50", Aggregate.MAX: "Maximum", Aggregate.SUM: "Sum"}


def statistics(spec: MetricSpec) -> list[str]:
    """The statistics a stage's graph of this metric shows: the typical child as the metric aggregates, and the
    slowest child where the metric says which way is slow (the largest duration, the smallest throughput)."""
    shown = [_TYPICAL[spec.aggregate]]
    slowest = spec.better.slowest_statistic
    if slowest is not None and slowest not in shown:
        shown.append(slowest)
    return shown


def dashboard_metrics() -> tuple[MetricSpec, ...]:
    """The METRICS entries shown in every stage row, in METRICS order."""
    return tuple(spec for spec in METRICS if spec.on_dashboard)


def slowest_download_query(pipeline: str) -> str:
    """Logs Insights over the EMF lines: the instances whose children downloaded slowest.

    The MiB/s figure is made per line with `fields` and then averaged: the query syntax applies arithmetic
    to fields ("CloudWatch Logs Insights language query syntax": fields, "Arithmetic operations"), and
    stats aggregates a field, e.g. `stats avg(field) by group`; an aggregate is not divided after the fact.
    """
    return "\n".join(
        [
            "fields InstanceId, InstanceType, Throughput / 1048576 as mibps",
            f'| filter {PIPELINE_DIMENSION} = "{pipeline}" and {STAGE_DIMENSION} = "download" '
            "and ispresent(Throughput)",
            "| stats avg(mibps) as MiBps, count(*) as children by InstanceId, InstanceType",
            "| sort MiBps asc",
            "| limit 20",
        ]
    )


def scratch_volumes_query(pipeline: str) -> str:
    """Logs Insights over the EMF lines: this pipeline's own scratch volumes, by the EBS id each profile carries
    (VolumeId, from the NVMe serial: profiling.probes.disk.ebs_volume_id), with their hosts and when last seen."""
    return "\n".join(
        [
            "fields VolumeId, InstanceId, InstanceType",
            f'| filter {PIPELINE_DIMENSION} = "{pipeline}" and ispresent(VolumeId)',
            "| stats count(*) as stages, max(@timestamp) as last_seen by VolumeId, InstanceId, InstanceType",
            "| sort last_seen desc",
            "| limit 100",
        ]
    )


def host_qualification_query(pipeline: str, stream_prefix: str) -> str:
    """Logs Insights over the event each host posts of its scratch's qualification at boot (stream `stream_prefix`
    <instance id>, tuning/hostqualify.py): this pipeline's hosts, the lowest ratio to the model first."""
    return "\n".join(
        [
            "fields @timestamp, InstanceId, InstanceType, HostQualification, QualifiedRatio, QualifiedMiBps, "
            "QualifiedExpectedMiBps",
            f'| filter {PIPELINE_DIMENSION} = "{pipeline}" and @logStream like "{stream_prefix}"',
            "| sort QualifiedRatio asc",
            "| limit 50",
        ]
    )


def _ebs_search(metric: str, statistic: str) -> cw.MathExpression:
    # Volume ids appear only when hosts launch, so the graph searches; hosts tag their volumes iobatch:pipeline, but
    # SEARCH cannot filter on tags and returns at most 500 series ("CloudWatch search expression syntax": "a maximum of
    # 500 time series"), so the graph is every EBS volume of the region, and its title says so.
    return cw.MathExpression(
        expression=f"SEARCH('{{AWS/EBS,VolumeId}} MetricName=\"{metric}\"', '{statistic}', 300)",
        using_metrics={},
        label=metric,
        period=Duration.minutes(5),
    )


class Dashboard(Construct):
    """`dashboard`: a title row, one row per stage, the EBS row and the slow-instance table."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        pipeline: str,
        log_group: logs.ILogGroup,
        dashboard_name: str,
        namespace: str = DEFAULT_NAMESPACE,
        host_alarm: cw.IAlarm | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        specs = dashboard_metrics()
        width = max(GRID_WIDTH // len(specs), 3)
        self.dashboard = cw.Dashboard(
            self, "Dashboard", dashboard_name=dashboard_name, default_interval=Duration.hours(3)
        )
        self.dashboard.add_widgets(
            cw.TextWidget(
                markdown=f"# {pipeline}: I/O per stage\nEach row is one stage of every array child "
                f"(namespace `{namespace}`, dimensions {PIPELINE_DIMENSION} and {STAGE_DIMENSION}). Lines are "
                "the median child (p50) and the slowest child: the largest duration, latency or stall, the smallest "
                "throughput; host-wide peaks are the largest any child saw.",
                width=GRID_WIDTH,
                height=2,
            )
        )
        for stage in STAGES:
            row: list[cw.IWidget] = []
            for spec in specs:
                def metric(statistic: str, spec: MetricSpec = spec, stage: str = stage) -> cw.Metric:
                    return cw.Metric(
                        namespace=namespace,
                        metric_name=spec.name,
                        dimensions_map={PIPELINE_DIMENSION: pipeline, STAGE_DIMENSION: stage},
                        statistic=statistic,
                        period=Duration.minutes(1),
                        label=f"{spec.name} {statistic}",
                    )

                lines = [metric(statistic) for statistic in statistics(spec)]
                row.append(
                    cw.GraphWidget(
                        title=f"{stage}: {spec.scoped_label}",
                        left=lines,
                        width=width,
                        height=6,
                        left_y_axis=cw.YAxisProps(label=spec.unit, show_units=False),
                    )
                )
            self.dashboard.add_widgets(*row)
        self.dashboard.add_widgets(
            cw.GraphWidget(
                title=f"every EBS volume in the region (up to {EBS_SEARCH_LIMIT}): BurstBalance % (st1, sc1, gp2)",
                left=[_ebs_search("BurstBalance", "Minimum")],
                width=GRID_WIDTH // 2,
                height=6,
            ),
            cw.GraphWidget(
                title=f"every EBS volume in the region (up to {EBS_SEARCH_LIMIT}): VolumeQueueLength",
                left=[_ebs_search("VolumeQueueLength", "Average")],
                width=GRID_WIDTH // 2,
                height=6,
            ),
        )
        if host_alarm is not None:
            self.dashboard.add_widgets(cw.AlarmStatusWidget(
                alarms=[host_alarm], title="hosts that failed their scratch setup and shut down", width=GRID_WIDTH,
                height=2))
        self.dashboard.add_widgets(
            cw.LogQueryWidget(
                title="this pipeline's scratch volumes (EBS ids from the profiles; AWS/EBS metrics by VolumeId)",
                log_group_names=[log_group.log_group_name],
                query_string=scratch_volumes_query(pipeline),
                view=cw.LogQueryVisualizationType.TABLE,
                width=GRID_WIDTH,
                height=6,
            )
        )
        self.dashboard.add_widgets(
            cw.LogQueryWidget(
                title="hosts by their scratch's qualification at boot (ratio to the volume model, slow first)",
                log_group_names=[log_group.log_group_name],
                query_string=host_qualification_query(pipeline, QUALIFICATION_STREAM_PREFIX),
                view=cw.LogQueryVisualizationType.TABLE,
                width=GRID_WIDTH,
                height=6,
            )
        )
        self.dashboard.add_widgets(
            cw.LogQueryWidget(
                title="slowest download throughput by instance (MiB/s)",
                log_group_names=[log_group.log_group_name],
                query_string=slowest_download_query(pipeline),
                view=cw.LogQueryVisualizationType.TABLE,
                width=GRID_WIDTH,
                height=8,
            )
        )

