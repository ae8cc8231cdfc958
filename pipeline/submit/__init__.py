"""Submitting a batch to AWS Batch as array jobs, and following it.

- `plan`: the request checked before any call, the array jobs and every SubmitJob request (pure).
- `stack`: the deployed stack's outputs and its job definition's containers.
- `submission`: `submit_to_stack`, which validates, freezes the manifest once and submits.
- `status`: `poll_status` and `follow`, which count children with ListJobs per status.

AWS errors become pipeline errors in pipeline/aws.py, which also holds the one back-off. `submit --local`
lives beside the local executor (pipeline/local/submit.py): this package never imports pipeline.local.
"""

from __future__ import annotations

from pipeline.submit.plan import (
    TAG_BATCH,
    TAG_IMAGES,
    TAG_OFFSET,
    TAG_OUTPUT,
    TAG_PER_CHILD,
    ArrayJobPlan,
    BatchTarget,
    SubmitRequest,
    SubmitResult,
    SubmittedJob,
    batch_environment,
    batch_name,
    check_flags,
    job_name,
    plan_array_jobs,
    plan_requests,
    status_command,
    submit_kwargs,
    tag_value,
)
from pipeline.submit.stack import StackOutputs, resolve_target
from pipeline.submit.status import (
    FINISHED,
    STATUSES,
    BatchStatus,
    FailedChild,
    JobProgress,
    RunningChild,
    follow,
    poll_status,
    progress_view,
)
from pipeline.submit.submission import aws_clients, require_credentials, scan_source, submit_planned, submit_to_stack

__all__ = [
    "FINISHED",
    "STATUSES",
    "TAG_BATCH",
    "TAG_IMAGES",
    "TAG_OFFSET",
    "TAG_OUTPUT",
    "TAG_PER_CHILD",
    "ArrayJobPlan",
    "BatchStatus",
    "BatchTarget",
    "FailedChild",
    "JobProgress",
    "RunningChild",
    "StackOutputs",
    "SubmitRequest",
    "SubmitResult",
    "SubmittedJob",
    "aws_clients",
    "batch_environment",
    "batch_name",
    "check_flags",
    "follow",
    "job_name",
    "plan_array_jobs",
    "plan_requests",
    "poll_status",
    "progress_view",
    "require_credentials",
    "resolve_target",
    "scan_source",
    "status_command",
    "submit_kwargs",
    "submit_planned",
    "submit_to_stack",
    "tag_value",
]
