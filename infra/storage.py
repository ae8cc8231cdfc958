"""Input, output and access-log buckets: encrypted, private, TLS only, multipart leftovers expired."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

# Uploads s5cmd started but never completed (a killed child) cost storage until expired.
_ABORT_INCOMPLETE = Duration.days(7)


def _bucket(
    scope: Construct,
    construct_id: str,
    *,
    lifecycle_rules: list[s3.LifecycleRule],
    access_logs: s3.IBucket | None = None,
    access_logs_prefix: str | None = None,
) -> s3.Bucket:
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
        # Training data outlives the stack: `cdk destroy` leaves the buckets (see the README).
        removal_policy=RemovalPolicy.RETAIN,
        lifecycle_rules=lifecycle_rules,
        server_access_logs_bucket=access_logs,
        server_access_logs_prefix=access_logs_prefix,
    )


class Storage(Construct):
    """`input_bucket` holds the images, `output_bucket` the training shards and batch manifests."""

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.access_log_bucket = _bucket(
            self,
            "AccessLogs",
            lifecycle_rules=[
                s3.LifecycleRule(
                    expiration=Duration.days(90), abort_incomplete_multipart_upload_after=_ABORT_INCOMPLETE
                )
            ],
        )
        self.input_bucket = _bucket(
            self,
            "Input",
            access_logs=self.access_log_bucket,
            access_logs_prefix="input/",
            lifecycle_rules=[s3.LifecycleRule(abort_incomplete_multipart_upload_after=_ABORT_INCOMPLETE)],
        )
        self.output_bucket = _bucket(
            self,
            "Output",
            access_logs=self.access_log_bucket,
            access_logs_prefix="output/",
            lifecycle_rules=[s3.LifecycleRule(abort_incomplete_multipart_upload_after=_ABORT_INCOMPLETE)],
        )
