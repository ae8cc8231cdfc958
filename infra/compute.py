"""The Batch hosts: a launch template with a tuned scratch volume, and the managed EC2 compute environment."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration, Tags
from aws_cdk import aws_batch as batch
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.settings import SettingsError, StackSettings
from profiling.metrics import DEFAULT_NAMESPACE, DIMENSIONS
from tuning.ebs import Volume
from tuning.host import SCRATCH_DEVICE_NAME, HostReport, HostTuning

# The metric the hosts' setup failures count into (one per failed host, dimension Pipeline), from the JSON event the
# user data writes to the log group before the host shuts down (tuning/hostscript.py, report_failure).
SETUP_FAILURE_METRIC = "HostSetupFailures"
PIPELINE_DIMENSION = DIMENSIONS[0]


def ebs_volume_type(kind: str) -> ec2.EbsDeviceVolumeType:
    """A volume kind of tuning.ebs (validated there) as CDK's enum: the kinds are CDK's names in lowercase."""
    return ec2.EbsDeviceVolumeType[kind.upper()]


def block_device_volume(volume: Volume) -> ec2.BlockDeviceVolume:
    """The scratch volume as the launch template attaches it: encrypted, deleted with the host."""
    return ec2.BlockDeviceVolume.ebs(
        volume.size_gib,
        volume_type=ebs_volume_type(volume.kind),
        encrypted=True,
        delete_on_termination=True,
        iops=volume.iops,
        throughput=None if volume.throughput_mibps is None else int(volume.throughput_mibps),
    )


def _instance_class(family: str) -> ec2.InstanceClass:
    """An instance family from context ("m6i") as CDK's enum."""
    try:
        return ec2.InstanceClass[family.upper().replace("-", "_")]
    except KeyError:
        raise SettingsError(
            f"instanceTypes entry {family!r} is not an EC2 instance family CDK knows: use e.g. m6i, or a "
            "full type such as m6i.2xlarge"
        ) from None


# UpdatePolicy.JobExecutionTimeoutMinutes takes 1-360 ("UpdatePolicy", AWS Batch API Reference: "Specifies
# the job timeout (in minutes) when the compute environment infrastructure is updated. The default value is
# 30"; terminateJobsOnUpdate "Specifies whether jobs are automatically terminated when the compute
# environment infrastructure is updated. The default value is false").
MAX_UPDATE_TIMEOUT_MINUTES = 360


def update_policy_minutes(job_timeout_minutes: int) -> int:
    """How long an infrastructure update waits for running children: a whole attempt, where Batch allows.

    A child can have started just before the deploy, so it may need its whole timeout. Beyond six hours
    Batch allows no longer wait: a deploy can then end an attempt that ran over six hours, which the
    README says."""
    return min(job_timeout_minutes, MAX_UPDATE_TIMEOUT_MINUTES)


def host_user_data(tuning: HostTuning, report: HostReport | None = None, volume: Volume | None = None,
                   instance_types: Sequence[str] = ()) -> ec2.MultipartUserData:
    """User data for a Batch host: Batch merges its own part into the launch template's, so it must be
    MIME multipart; ours is one shell-script part rendered by tuning.host, as text: base64 (CDK's
    from_user_data) would make it a third larger, and EC2 takes 16 KB of user data, Batch's part included.
    `volume` and `instance_types` are what the host's qualification expects its scratch to do on."""
    user_data = ec2.MultipartUserData()
    body = tuning.render_script(report=report, volume=volume, instance_types=instance_types)
    user_data.add_part(ec2.MultipartBody.from_raw_body(content_type=ec2.MultipartBody.SHELL_SCRIPT, body=body))
    return user_data


class Compute(Construct):
    """`launch_template`, `compute_environment` (managed, EC2, ECS AL2023 AMI) and `setup_failure_alarm`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StackSettings,
        vpc: ec2.IVpc,
        subnets: ec2.SubnetSelection,
        log_group: logs.ILogGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        report = HostReport(log_group=log_group.log_group_name, pipeline=settings.pipeline_name)
        self.launch_template = ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            require_imdsv2=True,
            # Hop limit 1: IMDSv2's token answer does not reach a container on the bridge network, one hop further
            # than the host, so no job container gets the instance role's credentials ("How can I prevent containers
            # from accessing Amazon EC2 instance metadata in Amazon ECS?", AWS re:Post). The profiler needs only the
            # instance id and type, which the user data writes on the scratch volume (profiling.identity).
            http_put_response_hop_limit=1,
            # Instance-store scratch needs no mapping: Nitro shows the store by itself (tuning/host.py).
            block_devices=[ec2.BlockDevice(device_name=SCRATCH_DEVICE_NAME,
                                           volume=block_device_volume(settings.volume))]
            if settings.host.scratch == "ebs" else None,
            user_data=host_user_data(settings.host, report, settings.volume, settings.instance_types),
            # A host whose scratch setup failed shuts itself down (tuning/host.py): gone, not stopped and paid for.
            instance_initiated_shutdown_behavior=ec2.InstanceInitiatedShutdownBehavior.TERMINATE,
        )
        Tags.of(self.launch_template).add("iobatch:pipeline", settings.pipeline_name)

        self.compute_environment = batch.ManagedEc2EcsComputeEnvironment(
            self,
            "ComputeEnvironment",
            vpc=vpc,
            vpc_subnets=subnets,
            instance_classes=[_instance_class(name) for name in settings.instance_types if "." not in name],
            instance_types=[ec2.InstanceType(name) for name in settings.instance_types if "." in name],
            use_optimal_instance_classes=False,
            images=[batch.EcsMachineImage(image_type=batch.EcsMachineImageType.ECS_AL2023)],
            launch_template=self.launch_template,
            spot=settings.spot,
            allocation_strategy=(
                batch.AllocationStrategy.SPOT_PRICE_CAPACITY_OPTIMIZED
                if settings.spot
                else batch.AllocationStrategy.BEST_FIT_PROGRESSIVE
            ),
            maxv_cpus=settings.max_vcpus,
            minv_cpus=settings.min_vcpus,
            update_to_latest_image_version=True,
            # A deploy during a batch must not cut children short: an infrastructure update terminates no
            # job and waits for running ones up to the job timeout (`update_policy_minutes`).
            terminate_on_update=False,
            update_timeout=Duration.minutes(update_policy_minutes(settings.job_timeout_minutes)),
        )
        # The L2 leaves the launch template version out, so Batch keeps the version it first saw and
        # user-data changes never reach new hosts: pin the latest version.
        cfn = self.compute_environment.node.default_child
        assert isinstance(cfn, batch.CfnComputeEnvironment)
        cfn.add_property_override(
            "ComputeResources.LaunchTemplate.Version", self.launch_template.latest_version_number
        )
        # The L2 writes "managed"; the API documents MANAGED, and strict validators (moto) want it.
        cfn.add_property_override("Type", "MANAGED")

        # A host whose setup fails writes one event to the log group and shuts down; Batch launches another, which
        # may fail the same way while children stay RUNNABLE. Each such event counts, and one in five minutes alarms.
        log_group.grant_write(self.compute_environment.instance_role)  # type: ignore[arg-type]
        # A slow host with hostQualification=fence counts the hour's fences by their streams (tuning/hostqualify.py).
        if settings.host.qualification.mode == "fence":
            log_group.grant(self.compute_environment.instance_role,  # type: ignore[arg-type]
                            "logs:DescribeLogStreams")
        failures = logs.MetricFilter(
            self, "SetupFailures", log_group=log_group,
            filter_pattern=logs.FilterPattern.string_value("$.HostSetup", "=", "failed"),
            metric_namespace=DEFAULT_NAMESPACE, metric_name=SETUP_FAILURE_METRIC, metric_value="1",
            dimensions={PIPELINE_DIMENSION: f"$.{PIPELINE_DIMENSION}"},
        )
        self.setup_failure_alarm = cw.Alarm(
            self, "SetupFailureAlarm",
            alarm_description=f"{settings.pipeline_name}: a Batch host failed its scratch setup and shut down; the "
            "reason is in the log group's host-setup/<instance id> stream",
            metric=failures.metric(statistic="Sum", period=Duration.minutes(5),
                                   dimensions_map={PIPELINE_DIMENSION: settings.pipeline_name}),
            threshold=1, evaluation_periods=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
