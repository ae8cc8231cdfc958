"""PipelineStack: the one stack. It composes the constructs and owns every grant and output."""

from __future__ import annotations

import json
from pathlib import Path

from aws_cdk import Acknowledgment, Aws, CfnOutput, IgnoreMode, RemovalPolicy, Stack, Validations
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from constructs import Construct

from infra.compute import Compute
from infra.dashboard import Dashboard
from infra.emfalarms import EmfAlarms
from infra.jobs import Jobs
from infra.network import Network
from infra.notify import Notifications
from infra.settings import ECR_IMAGE, StackSettings
from infra.storage import Storage
from pipeline.interface import STACK_OUTPUT_KEYS

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = "containers/job/Dockerfile"


def job_image_asset(scope: Construct, construct_id: str, *, directory: Path = REPO_ROOT) -> ecr_assets.DockerImageAsset:
    """The job image, built from containers/job/Dockerfile for the hosts' platform.

    The build context is what the repository's .dockerignore lets in: only the folders the image copies. The asset
    reads that file itself ("the .dockerignore file in the build context directory is used", DockerImageAsset,
    aws-cdk-lib aws_ecr_assets), with Docker's pattern syntax (IgnoreMode.DOCKER), so its hash, and with it a new
    image push, changes only when something the image holds changes, never for README, docs/ or bench/ edits."""
    return ecr_assets.DockerImageAsset(
        scope,
        construct_id,
        directory=str(directory),
        file=DOCKERFILE,
        platform=ecr_assets.Platform.LINUX_AMD64,
        ignore_mode=IgnoreMode.DOCKER,
    )


# Acknowledgement ids carry the plugin name in front of the rule id.
NAG = "AwsSolutions::"


def prefix_arn(bucket: s3.IBucket, prefix: str) -> str:
    return bucket.arn_for_objects(f"{prefix}*")


class PipelineStack(Stack):
    """Network, storage, hosts, jobs and the dashboard for one pipeline."""

    def __init__(self, scope: Construct, construct_id: str, *, settings: StackSettings, **kwargs: object) -> None:
        super().__init__(scope, construct_id, **kwargs)  # type: ignore[arg-type]
        self.settings = settings
        name = settings.pipeline_name
        self.network = Network(self, "Network", vpc_id=settings.vpc_id, s3_endpoint=settings.s3_gateway_endpoint)
        self.storage = Storage(self, "Storage")
        # The jobs' containers and the hosts that fail their setup write here (infra/compute.py).
        # Removed with the stack, as the README's Deploy section says (CDK's default for a LogGroup is to retain it).
        self.log_group = logs.LogGroup(self, "Logs", retention=logs.RetentionDays.ONE_MONTH,
                                       removal_policy=RemovalPolicy.DESTROY)
        self.compute = Compute(self, "Compute", settings=settings, vpc=self.network.vpc, subnets=self.network.subnets,
                               log_group=self.log_group)
        # jobImage: the user's image, built FROM the project's (README "Your own processing"); else ours.
        self.image = None if settings.job_image else job_image_asset(self, "Image")
        self.jobs = Jobs(
            self,
            "Jobs",
            settings=settings,
            compute_environment=self.compute.compute_environment,
            image_uri=settings.job_image or self.image.image_uri,  # type: ignore[union-attr]
            environment={},
            log_group=self.log_group,
        )
        self.emf_alarms = EmfAlarms(self, "EmfAlarms", log_group=self.log_group, pipeline=name)
        self.notifications = Notifications(self, "Alarms", topic_arn=settings.alarm_topic_arn,
                                           email=settings.alarm_email)
        self.notifications.watch(self.compute.setup_failure_alarm, *self.emf_alarms.alarms)
        self.dashboard = Dashboard(
            self,
            "Dashboard",
            pipeline=name,
            log_group=self.jobs.log_group,
            dashboard_name=f"{name}-io-{Aws.REGION}",
            host_alarm=self.compute.setup_failure_alarm,
        )
        self._grant()
        self._acknowledge()
        # By the StackOutputs field each fills; the job's interface names the CloudFormation output keys
        # that `iobatch submit --stack` reads.
        outputs = {
            "input_bucket": self.storage.input_bucket.bucket_name,
            "output_bucket": self.storage.output_bucket.bucket_name,
            "job_queue": self.jobs.job_queue.job_queue_arn,
            "job_definition": self.jobs.job_definition.ref,
            "log_group": self.jobs.log_group.log_group_name,
            "pipeline": name,
            "dashboard": self.dashboard.dashboard.dashboard_name,
            "volume_type": settings.volume.kind,
            "input_prefix": settings.input_prefix,
            "output_prefix": settings.output_prefix,
            # Every setting as the context that rebuilds it (one owner: StackSettings.to_context), for `iobatch
            # advise --stack` to read the plan from and to print the deploy that applies its advice; less the alarm
            # keys, which anyone allowed DescribeStacks would read there (infra.settings.UNPUBLISHED_KEYS).
            "deploy_context": json.dumps(settings.published_context(), separators=(",", ":")),
        }
        for field, key in STACK_OUTPUT_KEYS.items():
            CfnOutput(self, key, value=outputs[field])

    def _grant(self) -> None:
        """The job reads the input prefix and writes the output prefix (shards and the frozen manifest
        under its _batch/); it reads the output prefix too, to find children already done."""
        settings, role = self.settings, self.jobs.job_role
        inputs, outputs = self.storage.input_bucket, self.storage.output_bucket
        role.add_to_policy(iam.PolicyStatement(
            sid="ReadInputPrefix", actions=["s3:GetObject"],
            resources=[prefix_arn(inputs, settings.input_prefix)],
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="ListInputPrefix", actions=["s3:ListBucket"], resources=[inputs.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{settings.input_prefix}*"]}},
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="WriteOutputPrefix",
            actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
            resources=[prefix_arn(outputs, settings.output_prefix)],
        ))
        role.add_to_policy(iam.PolicyStatement(
            sid="ListOutputPrefix", actions=["s3:ListBucket"], resources=[outputs.bucket_arn],
            conditions={"StringLike": {"s3:prefix": [f"{settings.output_prefix}*"]}},
        ))
        # A rerun aborts the multipart uploads a killed child left under its own output prefix. This
        # action has no s3:prefix condition key, so it is granted on the bucket; it lists upload keys
        # and ids, never object contents, and the job asks only for its own prefix.
        role.add_to_policy(iam.PolicyStatement(
            sid="ListOutputUploads", actions=["s3:ListBucketMultipartUploads"], resources=[outputs.bucket_arn],
        ))
        if self.image is not None:
            self.image.repository.grant_pull(self.jobs.execution_role)
        elif match := ECR_IMAGE.match(self.settings.job_image or ""):
            arn = (f"arn:{Aws.PARTITION}:ecr:{match['region']}:{match['account']}:repository/"
                   f"{match['repository']}")
            repository = ecr.Repository.from_repository_attributes(
                self, "JobImageRepository", repository_arn=arn, repository_name=match["repository"])
            repository.grant_pull(self.jobs.execution_role)

    def _acknowledge(self) -> None:
        """cdk-nag findings that are deliberate, each with the reason it is right here."""
        job_role = self.jobs.job_role
        Validations.of(job_role).acknowledge(
            Acknowledgment(
                id=f"{NAG}AwsSolutions-IAM5[Resource::<{self._logical(self.storage.input_bucket)}.Arn>/"
                f"{self.settings.input_prefix}*]",
                reason="the job reads every image under the input prefix; the keys are chosen per batch "
                "at submit time, so the grant is the prefix, not single objects",
            ),
            Acknowledgment(
                id=f"{NAG}AwsSolutions-IAM5[Resource::<{self._logical(self.storage.output_bucket)}.Arn>/"
                f"{self.settings.output_prefix}*]",
                reason="each child writes its shards and reads the frozen manifest under the output prefix; "
                "the keys are per batch, so the grant is the prefix",
            ),
        )

        Validations.of(self.compute.compute_environment).acknowledge(
            Acknowledgment(
                id=f"{NAG}AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/"
                "AmazonEC2ContainerServiceforEC2Role]",
                reason="the Batch host instance role: AWS maintains this policy for the ECS agent (register "
                "the instance, pull task images, ship logs); a copy would fall behind new agent versions",
            )
        )
        Validations.of(self.jobs.execution_role).acknowledge(
            Acknowledgment(
                id=f"{NAG}AwsSolutions-IAM5[Resource::*]",
                reason="ecr:GetAuthorizationToken has no resource-level permissions; the image pull itself "
                "is scoped to the asset repository",
            )
        )

    def _logical(self, bucket: s3.IBucket) -> str:
        cfn = bucket.node.default_child
        assert isinstance(cfn, s3.CfnBucket)
        return self.get_logical_id(cfn)
