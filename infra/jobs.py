"""The job queue and the multi-container job definition: container `job` and its `profiler` sidecar."""

from __future__ import annotations

import math

from aws_cdk import Aws
from aws_cdk import aws_batch as batch
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.settings import StackSettings
from pipeline.interface import (
    AWS_ENV,
    CONTAINER_COMMANDS,
    ENV,
    EXIT_RETRYABLE,
    HOST_CGROUP_MOUNT,
    JOB_CONTAINER,
    PROFILER_CONTAINER,
    SCRATCH_MOUNT,
    contract_in_image,
)
from profiling.emf import MAX_EVENT_BYTES
from profiling.metrics import DEFAULT_NAMESPACE, STAGES
from profiling.protocol import MAX_SUBSTAGES
from profiling.qualification import QUALIFICATION_DIR

SCRATCH_VOLUME = "scratch"  # the task's name for the host's scratch mount
# The host's cgroup v2 hierarchy, read-only in the profiler container: the job's io.stat, io.pressure and
# memory.stat give its own device bytes, io stall and dirty pages (profiling/probes/cgroupfs.py, which
# is handed HOST_CGROUP_MOUNT); the container's own /sys/fs/cgroup shows only its own cgroup.
CGROUP_VOLUME = "host-cgroup"
HOST_CGROUP_PATH = "/sys/fs/cgroup"
# profilerEbpf: the host's bpffs, where the host's profilers share one copy of the eBPF programs
# (profiling/probes/ebpf_host.py pins them under it; tests/synth/test_profiler_ebpf.py holds the two paths
# equal). Amazon Linux 2023's systemd mounts it at boot (sys-fs-bpf.mount); a bind mount shares that instance,
# where a container's own `mount -t bpf` would make a private one.
BPFFS_VOLUME = "host-bpffs"
BPFFS_PATH = "/sys/fs/bpf"
# The host's qualification of its scratch (profiling/qualification.py), written by the user data before the host took
# jobs: read-only in the profiler container at the same path, where the sidecar reads it once. The folder, not the
# file: Docker makes a missing bind source a directory, and a host that did not qualify has no file.
QUALIFICATION_VOLUME = "host-qualification"


# awslogs delivery, pinned rather than left to the account: ECS's default became non-blocking on 2025-06-25 unless the
# account setting defaultLogDriverMode says blocking ("Amazon ECS account settings", Default log driver mode).
# Non-blocking: with blocking, a CloudWatch Logs hiccup blocks the containers' stdout, stalling the job's stages and
# the profiler's acks (the very timings measured). Its ring buffer (Docker's default 1 MB) drops whole lines when full
# (API LogConfiguration, max-buffer-size), so it holds twice every EMF document a child emits, each at the largest an
# event may be (its stages and sub-stages x profiling.emf.MAX_EVENT_BYTES).
AWSLOGS_MODE = "non-blocking"
AWSLOGS_BUFFER_MIB = math.ceil(2 * (len(STAGES) + MAX_SUBSTAGES) * MAX_EVENT_BYTES / 2**20)


def ecs_tasks_principal() -> iam.ServicePrincipal:
    """ECS tasks of this account and region only: the trust policy's confused-deputy conditions ("Task IAM role",
    Amazon ECS Developer Guide: aws:SourceArn arn:aws:ecs:REGION:ACCOUNT:* and aws:SourceAccount ACCOUNT)."""
    return iam.ServicePrincipal("ecs-tasks.amazonaws.com", conditions={
        "ArnLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:ecs:{Aws.REGION}:{Aws.ACCOUNT_ID}:*"},
        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID},
    })


def retry_conditions() -> list[batch.CfnJobDefinition.EvaluateOnExitProperty]:
    """Batch's five rules, the first that matches deciding; a job that matches none is retried ("Automated job
    retries", AWS Batch User Guide: onStatusReason, onReason and onExitCode are globs that may end in `*`).

    Start failures carry no exit code (nextflow-io/nextflow#4096): a failed image pull, a container that could not
    start (its log stream among them: CreateLogStream is throttled at 50 TPS, two streams a child) and Docker's
    timeouts are retried by their reason ("Stopped tasks error codes", Amazon ECS Developer Guide:
    CannotPullContainerError, CannotStartContainerError, CannotCreateContainerError, DockerTimeoutError), and so,
    falling through every rule, is any other failure without an exit code. Every exit code but the retryable one
    ends the child: 64 and 65 are permanent, 1 is a bug, 137 is out of memory.

    Which container's code onExitCode matches in a multi-container job is not documented (EvaluateOnExit matches
    "the ExitCode returned for a job", and JobDetail's `container` is empty for one), so the profiler exits with
    the code the job tells it at its end (`iobatch sidecar`, pipeline/cli/profiler.py): the rules mean the same
    whichever container Batch reads."""
    job = batch.CfnJobDefinition.EvaluateOnExitProperty
    return [
        # Spot reclaim and host failures: "Host EC2 (instance i-...) terminated."
        job(action="RETRY", on_status_reason="Host EC2*"),
        job(action="RETRY", on_reason="Cannot*"),
        job(action="RETRY", on_reason="DockerTimeoutError*"),
        job(action="RETRY", on_exit_code=str(EXIT_RETRYABLE)),
        job(action="EXIT", on_exit_code="*"),
    ]


class Jobs(Construct):
    """`job_queue`, `job_definition` (CfnJobDefinition), `job_role`, `execution_role`, `log_group`.

    The job role starts with no permissions: the stack grants it the input and output prefixes.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StackSettings,
        compute_environment: batch.IComputeEnvironment,
        image_uri: str,
        environment: dict[str, str],
        log_group: logs.ILogGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        self.job_queue = batch.JobQueue(
            self,
            "Queue",
            priority=1,
            compute_environments=[batch.OrderedComputeEnvironment(compute_environment=compute_environment, order=1)],
        )
        self.log_group = log_group
        self.job_role = iam.Role(
            self, "JobRole", assumed_by=ecs_tasks_principal(),
            description="iobatch job and profiler: read the input prefix, write the output prefix",
        )
        self.execution_role = iam.Role(
            self, "ExecutionRole", assumed_by=ecs_tasks_principal(),
            description="ECS agent for iobatch jobs: pull the image, write the container logs",
        )
        self.log_group.grant_write(self.execution_role)

        env = {
            **environment,
            ENV.PIPELINE: settings.pipeline_name,
            ENV.SCRATCH: SCRATCH_MOUNT,
            ENV.VOLUME_TYPE: settings.volume.kind,
            # The job stops itself at a soft deadline before this timeout (Batch does not retry a timed-out
            # attempt), and runs only on the volume the user data prepared (else exit 75: another host).
            ENV.TIMEOUT_S: str(settings.job_timeout_minutes * 60),
            ENV.REQUIRE_PREPARED_SCRATCH: "1",
            # s5cmd and boto3 find the buckets' region without a lookup.
            AWS_ENV.REGION: Aws.REGION,
            # EMF goes to stdout, which awslogs ships and CloudWatch turns into metrics (no agent).
            AWS_ENV.EMF_ENVIRONMENT: "Local",
            AWS_ENV.EMF_NAMESPACE: DEFAULT_NAMESPACE,
            AWS_ENV.EMF_SERVICE_NAME: settings.pipeline_name,
        }
        if settings.process_command:  # else the image's own, or the built-in resizer
            env[ENV.PROCESS_COMMAND] = settings.process_command
        if settings.profiler_contract:  # the profiler evaluates it at every stage end
            env[ENV.CONTRACT] = contract_in_image(settings.profiler_contract)
        if settings.profiler_interpose:
            # One switch: the job preloads the image's library (IOBATCH_INTERPOSE_LIB, containers/job/Dockerfile)
            # into itself and its programs, recording into its attempt's scratch directory, which the profiler
            # derives from the same task id (pipeline.job.record_calls); the profiler reads it there.
            env[ENV.INTERPOSE] = "1"
        environment_list = [
            batch.CfnJobDefinition.EnvironmentProperty(name=k, value=v) for k, v in sorted(env.items())
        ]
        scratch_mount = batch.CfnJobDefinition.MountPointProperty(
            container_path=SCRATCH_MOUNT, source_volume=SCRATCH_VOLUME, read_only=False
        )

        def log_configuration(stream_prefix: str) -> batch.CfnJobDefinition.LogConfigurationProperty:
            return batch.CfnJobDefinition.LogConfigurationProperty(
                log_driver="awslogs",
                options={
                    "awslogs-group": self.log_group.log_group_name,
                    "awslogs-region": Aws.REGION,
                    "awslogs-stream-prefix": stream_prefix,
                    "mode": AWSLOGS_MODE,
                    "max-buffer-size": f"{AWSLOGS_BUFFER_MIB}m",
                },
            )

        profiler_memory = settings.profiler_memory_mib
        job_container = batch.CfnJobDefinition.TaskContainerPropertiesProperty(
            name=JOB_CONTAINER,
            image=image_uri,
            command=list(CONTAINER_COMMANDS[JOB_CONTAINER]),
            essential=True,
            environment=environment_list,
            mount_points=[scratch_mount],
            log_configuration=log_configuration(JOB_CONTAINER),
            resource_requirements=[
                batch.CfnJobDefinition.ResourceRequirementProperty(type="VCPU", value=str(settings.job_vcpus)),
                batch.CfnJobDefinition.ResourceRequirementProperty(
                    type="MEMORY", value=str(settings.memory_per_job_mib - profiler_memory)
                ),
            ],
            # The profiler must be listening before the first stage starts.
            depends_on=[
                batch.CfnJobDefinition.TaskContainerDependencyProperty(
                    container_name=PROFILER_CONTAINER, condition="START"
                )
            ],
        )
        profiler_container = batch.CfnJobDefinition.TaskContainerPropertiesProperty(
            name=PROFILER_CONTAINER,
            image=image_uri,
            command=list(CONTAINER_COMMANDS[PROFILER_CONTAINER]),
            # A profiler that fails never fails the job.
            essential=False,
            environment=environment_list,
            mount_points=[scratch_mount, batch.CfnJobDefinition.MountPointProperty(
                container_path=HOST_CGROUP_MOUNT, source_volume=CGROUP_VOLUME, read_only=True),
                batch.CfnJobDefinition.MountPointProperty(
                container_path=QUALIFICATION_DIR, source_volume=QUALIFICATION_VOLUME, read_only=True)] + ([
                batch.CfnJobDefinition.MountPointProperty(
                    container_path=BPFFS_PATH, source_volume=BPFFS_VOLUME, read_only=False)]
                if settings.profiler_ebpf else []),
            log_configuration=log_configuration(PROFILER_CONTAINER),
            resource_requirements=[
                batch.CfnJobDefinition.ResourceRequirementProperty(type="VCPU", value=str(settings.profiler_vcpus)),
                batch.CfnJobDefinition.ResourceRequirementProperty(type="MEMORY", value=str(profiler_memory)),
            ],
            # profilerEbpf: loading eBPF needs CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN) in the effective set, so
            # root; Batch job definitions cannot add single capabilities (LinuxParameters has no capabilities
            # field, unlike ECS's), so privileged is the narrowest grant that works. Otherwise the profiler is
            # the image's unprivileged user and says once that per-call figures are off.
            privileged=True if settings.profiler_ebpf else None,
            user="0" if settings.profiler_ebpf else None,
        )
        self.job_definition = batch.CfnJobDefinition(
            self,
            "Definition",
            type="container",
            platform_capabilities=["EC2"],
            propagate_tags=True,
            ecs_properties=batch.CfnJobDefinition.EcsPropertiesProperty(
                task_properties=[
                    batch.CfnJobDefinition.EcsTaskPropertiesProperty(
                        containers=[job_container, profiler_container],
                        # The sidecar reads /proc/<pid>/io of the job's processes.
                        pid_mode="task",
                        task_role_arn=self.job_role.role_arn,
                        execution_role_arn=self.execution_role.role_arn,
                        volumes=[
                            batch.CfnJobDefinition.VolumesProperty(
                                name=SCRATCH_VOLUME,
                                # The host path the launch template's user data mounts the volume at.
                                host=batch.CfnJobDefinition.VolumesHostProperty(
                                    source_path=settings.host.mount_point
                                ),
                            ),
                            batch.CfnJobDefinition.VolumesProperty(
                                name=CGROUP_VOLUME,
                                host=batch.CfnJobDefinition.VolumesHostProperty(source_path=HOST_CGROUP_PATH),
                            ),
                            batch.CfnJobDefinition.VolumesProperty(
                                name=QUALIFICATION_VOLUME,
                                host=batch.CfnJobDefinition.VolumesHostProperty(source_path=QUALIFICATION_DIR),
                            ),
                        ] + ([batch.CfnJobDefinition.VolumesProperty(
                            name=BPFFS_VOLUME, host=batch.CfnJobDefinition.VolumesHostProperty(source_path=BPFFS_PATH),
                        )] if settings.profiler_ebpf else []),
                    )
                ]
            ),
            retry_strategy=batch.CfnJobDefinition.RetryStrategyProperty(
                attempts=settings.retry_attempts, evaluate_on_exit=retry_conditions()
            ),
            timeout=batch.CfnJobDefinition.TimeoutProperty(
                attempt_duration_seconds=settings.job_timeout_minutes * 60
            ),
        )
