"""`iobatch advise --stack` and `--from-cloudwatch`: a batch in AWS as the advisor reads it.

Its EMF documents come back from CloudWatch Logs through the report's reader (profiling.report.cloudwatch: paged,
slices read at once, progress on stderr), from the stack's own log group with --stack; the plan the stack was
deployed with from its DeployContext output (tuning.deployed); with --job-id, the batch's time from AWS Batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.cli import checks
from pipeline.errors import PermanentError, UsageError

# The awslogs driver stamps a line with its host's clock as it reads it, Batch its jobs' times with the service's:
# a job's window is read this much wider on each side (documents of other jobs in it are left out by their JobId).
JOB_WINDOW_MARGIN_S = 300.0
# DescribeJobs takes at most 100 job ids a call (AWS Batch API Reference, DescribeJobs: jobs).
MAX_JOB_IDS = 100


@dataclass(frozen=True)
class CloudBatch:
    """What was read: the stage profiles, where from (one line), and the stack's deployed context (None without
    --stack)."""

    profiles: list[Any]
    source: str
    deployed: Any  # tuning.deployed.Deployed | None
    stack: str | None


def _of_jobs(job_ids: Sequence[str]) -> Callable[[Any], bool] | None:
    """Keeps a profile of the given jobs: an array job's id keeps its children ('<id>:<index>', the JobId Batch
    gives each), a child's id that child."""
    from profiling.report.fleet import parent_job

    wanted = set(job_ids)
    if not wanted:
        return None
    return lambda p: p.properties.get("JobId") in wanted or parent_job(p.properties) in wanted


def _job_window(session: Any, log_group: str, job_ids: Sequence[str]) -> Any:
    """The window the jobs ran in, from their DescribeJobs times (createdAt, stoppedAt: milliseconds since the
    epoch; a job still running is read until now), JOB_WINDOW_MARGIN_S wider on each side."""
    from pipeline.aws import Backoff
    from pipeline.submit import aws_clients
    from profiling.report import LogWindow

    _, batch = aws_clients(session)
    found = Backoff().call(batch.describe_jobs, doing=f"reading job {job_ids[0]}", jobs=list(job_ids))["jobs"]
    known = {str(job.get("jobId")) for job in found}
    missing = [job_id for job_id in job_ids if job_id not in known]
    if missing:
        raise UsageError(f"--job-id {missing[0]} is not a job AWS Batch knows in this account and region: check the "
                         "id and --region, or give --since DURATION instead")
    now_ms = time.time() * 1000
    start = min(float(job.get("createdAt") or now_ms) for job in found) / 1000 - JOB_WINDOW_MARGIN_S
    end = max(float(job.get("stoppedAt") or now_ms) for job in found) / 1000 + JOB_WINDOW_MARGIN_S
    a, b = (datetime.fromtimestamp(t, tz=UTC) for t in (start, end))
    jobs = f"job {job_ids[0]}" if len(job_ids) == 1 else f"{len(job_ids)} jobs"
    return LogWindow(log_group, start, end, f"the run of {jobs} ({a:%Y-%m-%d %H:%M} to {b:%Y-%m-%d %H:%M} UTC)",
                     "give --since DURATION to read another window")


def read_batch(*, stack: str | None, from_cloudwatch: str | None, job_ids: Sequence[str], since: str | None,
               namespace: str, region: str | None, logs_endpoint: str | None) -> CloudBatch:
    """The documents of a batch in AWS and, with `stack`, the plan it was deployed with; every error one line with
    its exit code (pipeline.errors)."""
    from pipeline.cli.batch import _session, read_stack
    from pipeline.cli.report import DEFAULT_SINCE, Progress, _from_logs, _logs_client
    from profiling.report import (
        DamagedInputError,
        LogWindow,
        ReportInputError,
        check_log_group,
        cloudwatch_profiles,
        no_documents,
        parse_since,
    )
    from tuning.deployed import Deployed, DeployedError

    if len(job_ids) > MAX_JOB_IDS:
        raise UsageError(f"--job-id is given {len(job_ids)} times: give at most {MAX_JOB_IDS} (the array jobs of one "
                         "batch), or --since DURATION")
    try:
        since_s = None if since is None else parse_since(since)
        group = None if from_cloudwatch is None else check_log_group(from_cloudwatch)
    except ReportInputError as exc:
        raise UsageError(str(exc)) from None
    region = checks.region(region)
    deployed, session = None, None
    if stack is not None:
        outputs, session = read_stack(stack, region)
        group = outputs.log_group
        try:
            deployed = Deployed.from_output(outputs.deploy_context, stack)
        except DeployedError as exc:
            raise UsageError(str(exc)) from None
    assert group is not None
    if since_s is None and job_ids:
        window = _job_window(session or _session(region), group, job_ids)
    else:
        window = LogWindow.last(group, since_s if since_s is not None else parse_since(DEFAULT_SINCE))
    client = _from_logs(group, lambda: _logs_client(region, logs_endpoint))
    progress = Progress(lambda pages, events: f"read {pages:,} pages of {group}, {events:,} log events", "advise")
    try:
        profiles = _from_logs(group, lambda: list(cloudwatch_profiles(client, window, namespace=namespace,
                                                                      progress=progress, keep=_of_jobs(job_ids))))
    except DamagedInputError as exc:
        raise PermanentError(str(exc)) from None
    if not profiles:
        raise UsageError(str(no_documents(window, namespace)) + (" (and --job-id)" if job_ids else ""))
    source = f"log group {group}: {len(profiles):,} stage documents from {window.text}"
    return CloudBatch(profiles, source, deployed, stack)
