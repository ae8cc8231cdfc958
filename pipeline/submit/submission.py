"""Submitting a batch to AWS Batch (I/O): validate, freeze the manifest once, then one SubmitJob per array job.

Each step checks before the next acts:

1. `check_flags` and `SubmitRequest.build` check the flags (pipeline.submit.plan; pure).
2. `StackOutputs.from_stack` reads the stack's CloudFormation outputs (the first API call), and
   `resolve_target` reads the job definition's containers (pipeline.submit.stack).
3. `pipeline.s3.freeze_batch` streams and validates every manifest line (or the prefix listing), then
   writes the frozen manifest and its index to S3 once.
4. `plan_requests` builds every SubmitJob request; only then does `submit_planned` call SubmitJob,
   exactly once per array job.

`submit --local` runs the same plan on this machine: pipeline/local/submit.py; nothing here imports the
local executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.aws import Backoff
from pipeline.errors import ManifestError, UsageError
from pipeline.submit.plan import (
    ArrayJobPlan,
    SubmitRequest,
    SubmitResult,
    SubmittedJob,
    check_flags,
    plan_requests,
)
from pipeline.submit.stack import StackOutputs, resolve_target


def aws_clients(session: Any) -> tuple[Any, Any]:
    """CloudFormation and Batch clients whose only retry layer is `Backoff` (so calls are counted once)."""
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 1}, connect_timeout=5, read_timeout=60)
    return session.client("cloudformation", config=config), session.client("batch", config=config)


def require_credentials(session: Any) -> None:
    """Fail before the first call when no credentials are configured at all."""
    if session.get_credentials() is None:
        raise UsageError("no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), "
                         "or use --local")


def scan_source(s3: Any, request: SubmitRequest) -> int:
    """Validate every line (or list every key) without writing anything; return the image count."""
    from pipeline import s3 as s3io

    entries = (s3io.read_manifest(s3, request.manifest, bucket=request.input.bucket, prefix=request.input.key)
               if request.manifest
               else s3io.list_images(s3, request.input))
    images = sum(1 for _ in entries)
    if images == 0:
        raise ManifestError(f"{request.source} holds no images: check the prefix or manifest")
    return images


def submit_planned(batch_client: Any, requests: Sequence[tuple[ArrayJobPlan, dict[str, Any]]],
                   backoff: Backoff | None = None) -> list[SubmittedJob]:
    """One SubmitJob per array job. Retries throttling only: a 5xx may already have created the job."""
    backoff = backoff or Backoff(retry_server_errors=False)
    submitted = []
    for plan, kwargs in requests:
        answer = backoff.call(batch_client.submit_job, doing=f"submitting {plan.name}", **kwargs)
        submitted.append(SubmittedJob(str(answer["jobId"]), plan.name, plan.offset, plan.size, plan.images))
    return submitted


def submit_to_stack(
    *,
    stack: str,
    manifest: str | None,
    prefix: str | None,
    images_per_child: int,
    output: str | None = None,
    force: bool = False,
    s3_endpoint: str | None = None,
    dry_run: bool = False,
    session: Any = None,
    process_command: str | None = None,
) -> SubmitResult:
    """Validate, freeze the manifest once, and submit one array job per 10,000 children."""
    import boto3

    from pipeline import s3 as s3io
    from pipeline.manifest import children_for

    check_flags(manifest=manifest, prefix=prefix, images_per_child=images_per_child)
    session = session or boto3.session.Session()
    require_credentials(session)
    cfn, batch = aws_clients(session)
    outputs = StackOutputs.from_stack(cfn, stack)
    request = SubmitRequest.build(manifest=manifest, prefix=prefix, images_per_child=images_per_child,
                                  output=output, input_bucket=outputs.input_bucket,
                                  output_bucket=outputs.output_bucket, force=force,
                                  input_prefix=outputs.input_prefix, output_prefix=outputs.output_prefix,
                                  process_command=process_command)
    target = resolve_target(batch, outputs.job_queue, outputs.job_definition)
    s3 = s3io.client(s3_endpoint)
    if dry_run:
        images = scan_source(s3, request)
        children = children_for(images, images_per_child)
        frozen_manifest = s3io.frozen_paths(request.output)[0]
    else:
        frozen = s3io.freeze_batch(s3, input=request.input, manifest=request.manifest, output=request.output,
                                   per_child=images_per_child)
        images, children, frozen_manifest = frozen.images, frozen.children, frozen.manifest
    planned = plan_requests(request, target, manifest=frozen_manifest, children=children, images=images)
    jobs = () if dry_run else tuple(submit_planned(batch, planned))
    return SubmitResult(request, frozen_manifest, children, images, jobs,
                        tuple(kwargs for _, kwargs in planned), dry_run)
