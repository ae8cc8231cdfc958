"""Submitting a batch to AWS Batch as array jobs, and following it.

Submission is a builder that validates before it acts:

1. `SubmitRequest.build` checks the flags (pure: K >= 1, URIs, one source, output not inside the input).
2. `StackOutputs.from_stack` reads the stack's CloudFormation outputs (the first API call), and
   `BatchTarget.resolve` reads the job definition's containers.
3. `pipeline.s3.freeze_batch` streams and validates every manifest line (or the prefix listing), then
   writes the frozen manifest and its index to S3 once.
4. `plan_array_jobs` shards the children into array jobs of at most 10,000 (Batch's limit);
   `submit_kwargs` builds each SubmitJob request; only then does `submit_planned` call SubmitJob,
   exactly once per array job.

Each array job carries the batch in environment overrides for both containers of the multi-container
job definition (the job and the profiler sidecar): input, output, frozen manifest, images per child,
the array offset of this array job, and force. No key ever rides in job parameters.

`poll_status` follows a batch with ListJobs(arrayJobId, jobStatus) per status, paginated, never one
DescribeJobs per child; `Backoff` retries only throttling (TooManyRequestsException) and 5xx answers.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from pipeline.errors import IobatchError, PermanentError, RetryableError, UsageError
from pipeline.manifest import MAX_ARRAY_SIZE, array_jobs
from pipeline.settings import ENV, S3Uri

# ---- stack outputs ---------------------------------------------------------------------------------

#: CloudFormation output keys of the deployed stack (infra/pipeline_stack.py emits them).
OUTPUT_KEYS = {
    "input_bucket": "InputBucketName",
    "output_bucket": "OutputBucketName",
    "job_queue": "JobQueueArn",
    "job_definition": "JobDefinitionArn",
    "log_group": "LogGroupName",
    "pipeline": "PipelineName",
    "dashboard": "DashboardName",
    "volume_type": "VolumeType",
}
#: Outputs read when present: the only prefixes the job role may read (input) and write (output) under.
OPTIONAL_OUTPUT_KEYS = {"input_prefix": "InputPrefix", "output_prefix": "OutputPrefix"}

#: Container names of the multi-container job definition (infra/jobs.py).
JOB_CONTAINER = "job"
PROFILER_CONTAINER = "profiler"

# Tags on each submitted job: `iobatch status` reads them back to count images without the manifest.
TAG_BATCH = "iobatch:batch"
TAG_OFFSET = "iobatch:offset"
TAG_PER_CHILD = "iobatch:images-per-child"
TAG_IMAGES = "iobatch:images"
TAG_OUTPUT = "iobatch:output"

_THROTTLE_CODES = {"TooManyRequestsException", "ThrottlingException", "Throttling"}
_CREDENTIAL_CODES = {"ExpiredToken", "ExpiredTokenException", "UnrecognizedClientException",
                     "InvalidClientTokenId", "InvalidSignatureException", "RequestExpired"}


def aws_error(exc: Exception, *, doing: str) -> IobatchError:
    """A botocore failure while `doing` something, as one of our errors with a one-line headline."""
    if isinstance(exc, NoCredentialsError):
        return UsageError(f"no AWS credentials found while {doing}: set AWS_PROFILE (or "
                          "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY), or use --local")
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        message = str(error.get("Message", "")).splitlines()[0] if error.get("Message") else ""
        if code in _CREDENTIAL_CODES:
            return UsageError(f"AWS refused the credentials while {doing} ({code}): they are expired or "
                              "invalid; refresh them (e.g. `aws sso login`) and submit again")
        if _is_retryable(exc):
            return RetryableError(f"AWS kept answering {code} while {doing}: wait a minute and retry")
        return PermanentError(f"AWS answered {code} while {doing}: {message}".rstrip(": "))
    if isinstance(exc, BotoCoreError):
        return RetryableError(f"AWS request failed while {doing}: {exc}")
    if isinstance(exc, IobatchError):
        return exc
    raise exc


def _is_retryable(exc: Exception) -> bool:
    """Throttling and 5xx only: anything else would fail the same way again."""
    if not isinstance(exc, ClientError):
        return False
    code = str(exc.response.get("Error", {}).get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in _THROTTLE_CODES or status >= 500 or status == 429


@dataclass
class Backoff:
    """Retry a call on throttling and 5xx with capped exponential back-off and full jitter."""

    attempts: int = 8
    base_s: float = 0.5
    cap_s: float = 20.0
    sleep: Callable[[float], None] = time.sleep
    jitter: Callable[[], float] = random.random
    retry_server_errors: bool = True  # SubmitJob sets False: a 5xx may have created the job already
    waits: list[float] = field(default_factory=list)

    def call(self, fn: Callable[..., Any], *, doing: str, **kwargs: Any) -> Any:
        for attempt in range(self.attempts):
            try:
                return fn(**kwargs)
            except ClientError as exc:
                code = str(exc.response.get("Error", {}).get("Code", ""))
                retry = _is_retryable(exc) and (self.retry_server_errors or code in _THROTTLE_CODES)
                if not retry or attempt == self.attempts - 1:
                    raise aws_error(exc, doing=doing) from None
                wait = min(self.cap_s, self.base_s * (2 ** attempt)) * (0.5 + 0.5 * self.jitter())
                self.waits.append(wait)
                self.sleep(wait)
            except (BotoCoreError, NoCredentialsError) as exc:
                raise aws_error(exc, doing=doing) from None
        raise AssertionError("unreachable")


@dataclass(frozen=True)
class StackOutputs:
    """What `iobatch submit --stack NAME` needs from the deployed stack."""

    input_bucket: str
    output_bucket: str
    job_queue: str
    job_definition: str
    log_group: str
    pipeline: str
    dashboard: str
    volume_type: str
    input_prefix: str = ""
    output_prefix: str = ""

    @classmethod
    def from_outputs(cls, stack_name: str, outputs: Iterable[Mapping[str, Any]]) -> StackOutputs:
        """From DescribeStacks' Outputs list; names every missing key in one line."""
        found = {str(o.get("OutputKey")): str(o.get("OutputValue", "")) for o in outputs}
        missing = [key for key in OUTPUT_KEYS.values() if not found.get(key)]
        if missing:
            raise UsageError(f"stack {stack_name} has no output {', '.join(missing)}: deploy the iobatch stack "
                             "(`cdk deploy`) or name the right one with --stack")
        optional = {attr: found.get(key, "") for attr, key in OPTIONAL_OUTPUT_KEYS.items()}
        return cls(**{attr: found[key] for attr, key in OUTPUT_KEYS.items()}, **optional)

    @classmethod
    def from_stack(cls, cfn_client: Any, stack_name: str, backoff: Backoff | None = None) -> StackOutputs:
        """Read the outputs of `stack_name` with one DescribeStacks call."""
        backoff = backoff or Backoff()
        try:
            stacks = backoff.call(cfn_client.describe_stacks, doing=f"reading stack {stack_name}",
                                  StackName=stack_name)["Stacks"]
        except PermanentError as exc:
            if "does not exist" in exc.headline:
                raise UsageError(f"stack {stack_name} does not exist in this account and region: check --stack "
                                 "and AWS_REGION") from None
            raise
        return cls.from_outputs(stack_name, stacks[0].get("Outputs", []) if stacks else [])


# ---- the request, validated before any call --------------------------------------------------------

_NAME_JUNK = re.compile(r"[^A-Za-z0-9_-]+")


def batch_name(source: S3Uri, images_per_child: int) -> str:
    """A stable name for a batch: the same manifest and K always land in the same output folder.

    Stable is what makes a second submit of the same manifest skip finished children; K is part of
    the name because child i covers different images under a different K.
    """
    key = source.key.rstrip("/")
    stem = key.rsplit("/", 1)[-1] if key else source.bucket
    stem = stem.removesuffix(".jsonl").removesuffix(".json")
    if source.key.endswith("/") or not key:
        stem = key.replace("/", "-") or source.bucket
    stem = _NAME_JUNK.sub("-", stem).strip("-_")[:80] or "batch"
    return f"{stem}-k{images_per_child}"


@dataclass(frozen=True)
class SubmitRequest:
    """What the user asked for, checked for consistency; no AWS call has been made."""

    input: S3Uri  # the input prefix (for a manifest: the bucket its keys live in)
    manifest: S3Uri | None  # a user manifest, or None to list `input`
    output: S3Uri
    images_per_child: int
    name: str
    force: bool = False

    @classmethod
    def build(
        cls,
        *,
        manifest: str | None,
        prefix: str | None,
        images_per_child: int,
        output: str | None,
        input_bucket: str | None = None,
        output_bucket: str | None = None,
        force: bool = False,
        input_prefix: str = "",
        output_prefix: str = "",
    ) -> SubmitRequest:
        """Validate the flags.

        `input_bucket`/`output_bucket` come from the stack (None: --local), and so do `input_prefix` and
        `output_prefix`, the only places the job role may read and write.
        """
        if images_per_child < 1:
            raise UsageError(f"--images-per-job is {images_per_child}: give 1 or more")
        if (manifest is None) == (prefix is None):
            raise UsageError("give exactly one of --manifest s3://bucket/key.jsonl or --prefix s3://bucket/images/")
        manifest_uri: S3Uri | None = None
        if manifest is not None:
            manifest_uri = S3Uri.parse(manifest, what="--manifest")
            if not manifest_uri.key or manifest_uri.key.endswith("/"):
                raise UsageError(f"--manifest {manifest} names a folder: give the manifest object, "
                                 "e.g. s3://bucket/batches/2026-11-22.jsonl")
            input_uri = S3Uri(input_bucket or manifest_uri.bucket, "")
            source = manifest_uri
        else:
            assert prefix is not None
            input_uri = S3Uri.parse(prefix, what="--prefix").as_prefix()
            if input_bucket is not None and input_uri.bucket != input_bucket:
                raise UsageError(f"--prefix {prefix} is outside the stack's input bucket {input_bucket}: copy the "
                                 f"images to s3://{input_bucket}/{input_prefix} or deploy with that bucket")
            if input_bucket is not None and not input_uri.key.startswith(input_prefix):
                raise UsageError(f"--prefix {prefix} is outside s3://{input_bucket}/{input_prefix}, the only prefix "
                                 "the job may read: put the images under it or redeploy with -c inputPrefix=...")
            source = input_uri
        name = batch_name(source, images_per_child)
        if output is not None:
            output_uri = S3Uri.parse(output, what="--output").as_prefix()
        elif output_bucket is not None:
            output_uri = S3Uri(output_bucket, f"{output_prefix}{name}/")
        else:
            output_uri = S3Uri(input_uri.bucket, f"iobatch-output/{name}/")
        if output_bucket is not None and (output_uri.bucket != output_bucket or
                                          not output_uri.key.startswith(output_prefix)):
            raise UsageError(f"--output {output_uri} is outside s3://{output_bucket}/{output_prefix}, the only "
                             "place the job may write: leave --output out or give a folder under it")
        if manifest_uri is None and output_uri.bucket == input_uri.bucket and \
                output_uri.key.startswith(input_uri.key):
            raise UsageError(f"output {output_uri} is inside the input prefix {input_uri}: a later listing would "
                             "take the outputs as images; give --output elsewhere")
        return cls(input_uri, manifest_uri, output_uri, images_per_child, name, force)

    @property
    def source(self) -> S3Uri:
        return self.manifest or self.input


# ---- the plan: array jobs and their requests (pure) ------------------------------------------------


@dataclass(frozen=True)
class ArrayJobPlan:
    """One SubmitJob call: children [offset, offset + size) of the batch."""

    offset: int
    size: int  # 1 means a plain (non-array) job: Batch arrays hold 2..10,000 children
    images: int  # images these children hold
    name: str


def plan_array_jobs(name: str, *, children: int, images: int, images_per_child: int,
                    max_size: int = MAX_ARRAY_SIZE) -> list[ArrayJobPlan]:
    """Shard `children` into array jobs of at most `max_size` (pure; exactly ceil(children/max_size))."""
    if children < 1:
        raise PermanentError(f"batch {name} has no children: the source holds no images")
    shards = array_jobs(children, max_size)
    plans = []
    for number, (offset, size) in enumerate(shards):
        first_image = offset * images_per_child
        held = min(images, first_image + size * images_per_child) - first_image
        suffix = f"-{number:03d}" if len(shards) > 1 else ""
        plans.append(ArrayJobPlan(offset, size, held, job_name(name + suffix)))
    return plans


def job_name(text: str) -> str:
    """A Batch job name: letters, digits, - and _, starting alphanumeric, at most 128."""
    cleaned = _NAME_JUNK.sub("-", f"iobatch-{text}").strip("-_")
    return cleaned[:128]


def batch_environment(request: SubmitRequest, manifest: S3Uri, offset: int) -> dict[str, str]:
    """The environment both containers of every child of one array job get."""
    return {
        ENV.INPUT: str(request.input),
        ENV.OUTPUT: str(request.output),
        ENV.MANIFEST: str(manifest),
        ENV.IMAGES_PER_CHILD: str(request.images_per_child),
        ENV.ARRAY_OFFSET: str(offset),
        ENV.FORCE: "1" if request.force else "0",
    }


@dataclass(frozen=True)
class BatchTarget:
    """Where the jobs go: queue, job definition, and the containers of that definition to override.

    `containers` is the multi-container (ecsProperties) job definition's container names; None means a
    single-container definition (containerProperties), overridden with containerOverrides instead.
    """

    job_queue: str
    job_definition: str
    containers: tuple[str, ...] | None = (JOB_CONTAINER, PROFILER_CONTAINER)

    @classmethod
    def resolve(cls, batch_client: Any, job_queue: str, job_definition: str,
                backoff: Backoff | None = None) -> BatchTarget:
        """Read the job definition once to learn its containers, and check the job and profiler exist."""
        backoff = backoff or Backoff()
        found = backoff.call(batch_client.describe_job_definitions, doing=f"reading job definition "
                             f"{job_definition}", jobDefinitions=[job_definition])["jobDefinitions"]
        active = [d for d in found if d.get("status", "ACTIVE") == "ACTIVE"]
        if not active:
            raise UsageError(f"job definition {job_definition} does not exist or is inactive: redeploy the stack")
        definition = active[-1]
        tasks = (definition.get("ecsProperties") or {}).get("taskProperties") or []
        if not tasks:
            return cls(job_queue, job_definition, None)
        names = tuple(str(c.get("name")) for c in tasks[0].get("containers", []))
        missing = [n for n in (JOB_CONTAINER, PROFILER_CONTAINER) if n not in names]
        if missing:
            raise UsageError(f"job definition {job_definition} has no container {', '.join(missing)} (has "
                             f"{', '.join(names) or 'none'}): deploy the iobatch stack's job definition")
        return cls(job_queue, job_definition, names)


def submit_kwargs(plan: ArrayJobPlan, target: BatchTarget, environment: Mapping[str, str],
                  tags: Mapping[str, str]) -> dict[str, Any]:
    """The SubmitJob request for one array job (pure)."""
    env = [{"name": k, "value": v} for k, v in environment.items()]
    kwargs: dict[str, Any] = {
        "jobName": plan.name,
        "jobQueue": target.job_queue,
        "jobDefinition": target.job_definition,
        "tags": dict(tags),
    }
    if plan.size > 1:
        kwargs["arrayProperties"] = {"size": plan.size}
    if target.containers is None:
        kwargs["containerOverrides"] = {"environment": env}
    else:
        # Only the job and the profiler read IOBATCH_*; any other container is left as defined.
        kwargs["ecsPropertiesOverride"] = {"taskProperties": [{"containers": [
            {"name": name, "environment": env} for name in target.containers
            if name in (JOB_CONTAINER, PROFILER_CONTAINER)
        ]}]}
    return kwargs


def plan_requests(request: SubmitRequest, target: BatchTarget, *, manifest: S3Uri, children: int,
                  images: int) -> list[tuple[ArrayJobPlan, dict[str, Any]]]:
    """Every SubmitJob request of the batch, in order (pure)."""
    plans = plan_array_jobs(request.name, children=children, images=images,
                            images_per_child=request.images_per_child)
    out = []
    for plan in plans:
        tags = {TAG_BATCH: request.name, TAG_OFFSET: str(plan.offset),
                TAG_PER_CHILD: str(request.images_per_child), TAG_IMAGES: str(plan.images),
                TAG_OUTPUT: str(request.output)[:256]}
        out.append((plan, submit_kwargs(plan, target, batch_environment(request, manifest, plan.offset), tags)))
    return out


@dataclass(frozen=True)
class SubmittedJob:
    job_id: str
    name: str
    offset: int
    size: int
    images: int


def submit_planned(batch_client: Any, requests: Sequence[tuple[ArrayJobPlan, dict[str, Any]]],
                   backoff: Backoff | None = None) -> list[SubmittedJob]:
    """One SubmitJob per array job. Retries throttling only: a 5xx may already have created the job."""
    backoff = backoff or Backoff(retry_server_errors=False)
    submitted = []
    for plan, kwargs in requests:
        answer = backoff.call(batch_client.submit_job, doing=f"submitting {plan.name}", **kwargs)
        submitted.append(SubmittedJob(str(answer["jobId"]), plan.name, plan.offset, plan.size, plan.images))
    return submitted


def status_command(job_ids: Iterable[str]) -> str:
    return "iobatch status " + " ".join(job_ids)


# ---- status ----------------------------------------------------------------------------------------

STATUSES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING", "SUCCEEDED", "FAILED")
FINISHED = ("SUCCEEDED", "FAILED")


@dataclass(frozen=True)
class FailedChild:
    """A failed child: its global index, why it failed, and where its log is."""

    job_id: str
    index: int
    reason: str
    exit_code: int | None
    log_stream: str | None


@dataclass(frozen=True)
class JobProgress:
    """Counts of one submitted (array or plain) job."""

    job_id: str
    name: str
    status: str
    size: int
    offset: int
    images: int
    images_per_child: int
    counts: Mapping[str, int]

    @property
    def images_done(self) -> int:
        return min(self.counts.get("SUCCEEDED", 0) * self.images_per_child, self.images)


@dataclass(frozen=True)
class BatchStatus:
    """Progress of a batch made of one or more submitted jobs."""

    jobs: tuple[JobProgress, ...]
    failed: tuple[FailedChild, ...]

    def count(self, *statuses: str) -> int:
        return sum(job.counts.get(s, 0) for job in self.jobs for s in statuses)

    @property
    def children(self) -> int:
        return sum(job.size for job in self.jobs)

    @property
    def images(self) -> int:
        return sum(job.images for job in self.jobs)

    @property
    def images_done(self) -> int:
        return sum(job.images_done for job in self.jobs)

    @property
    def finished(self) -> bool:
        return self.count(*FINISHED) >= self.children

    def summary(self) -> dict[str, int]:
        """The six user-facing counts (SUBMITTED counts as pending)."""
        return {
            "pending": self.count("SUBMITTED", "PENDING"),
            "runnable": self.count("RUNNABLE"),
            "starting": self.count("STARTING"),
            "running": self.count("RUNNING"),
            "succeeded": self.count("SUCCEEDED"),
            "failed": self.count("FAILED"),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [{"jobId": j.job_id, "name": j.name, "status": j.status, "size": j.size,
                      "offset": j.offset, "images": j.images, "imagesDone": j.images_done,
                      "counts": dict(j.counts)} for j in self.jobs],
            "children": self.children,
            **self.summary(),
            "images": self.images,
            "imagesDone": self.images_done,
            "finished": self.finished,
            "failedChildren": [{"jobId": f.job_id, "index": f.index, "reason": f.reason,
                                "exitCode": f.exit_code, "logStream": f.log_stream} for f in self.failed],
        }

    def lines(self) -> list[str]:
        """Plain-text rendering for logs and non-TTY output (pure)."""
        counts = " ".join(f"{k} {v}" for k, v in self.summary().items())
        out = [f"children {self.children}: {counts}; images {self.images_done}/{self.images}"
               + (" (finished)" if self.finished else "")]
        for f in self.failed:
            code = "-" if f.exit_code is None else str(f.exit_code)
            out.append(f"failed child {f.index} ({f.job_id}): exit {code}: {f.reason or 'no reason given'}; "
                       f"log stream {f.log_stream or '-'}")
        hidden = self.count("FAILED") - len(self.failed)
        if hidden > 0:
            out.append(f"... and {hidden} more failed children (see --json or the Batch console)")
        return out


def _int_tag(tags: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(tags.get(key, default))
    except (TypeError, ValueError):
        return default


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _log_stream(job: Mapping[str, Any]) -> str | None:
    """The job container's log stream, wherever this job shape keeps it."""
    for task in (job.get("ecsProperties") or {}).get("taskProperties") or []:
        for container in task.get("containers", []):
            if container.get("name") == JOB_CONTAINER and container.get("logStreamName"):
                return str(container["logStreamName"])
    stream = (job.get("container") or {}).get("logStreamName")
    if not stream:
        attempts = job.get("attempts") or []
        stream = (attempts[-1].get("container") or {}).get("logStreamName") if attempts else None
    return str(stream) if stream else None


def _child_index(job_id: str, offset: int) -> int:
    _, _, index = job_id.rpartition(":")
    return offset + int(index) if index.isdigit() else offset


def poll_status(batch_client: Any, job_ids: Sequence[str], *, backoff: Backoff | None = None,
                max_failed: int = 100) -> BatchStatus:
    """The progress of the given jobs.

    One DescribeJobs for the parents (sizes and tags), then ListJobs(arrayJobId, jobStatus) per status,
    paginated (1,000 a page), and one DescribeJobs per 100 failed children (at most `max_failed`) for
    their log streams.
    """
    if not job_ids:
        raise UsageError("give the job id(s) `iobatch submit` printed")
    backoff = backoff or Backoff()
    parents: dict[str, Mapping[str, Any]] = {}
    for chunk in _chunks(list(job_ids), 100):
        for job in backoff.call(batch_client.describe_jobs, doing="describing jobs", jobs=list(chunk))["jobs"]:
            parents[str(job["jobId"])] = job
    unknown = [j for j in job_ids if j not in parents]
    if unknown:
        raise UsageError(f"no Batch job {', '.join(unknown)} in this account and region: check the id "
                         "`iobatch submit` printed and AWS_REGION")
    progress: list[JobProgress] = []
    failed_summaries: list[tuple[Mapping[str, Any], int]] = []
    for job_id in job_ids:
        parent = parents[job_id]
        tags = parent.get("tags") or {}
        offset = _int_tag(tags, TAG_OFFSET, 0)
        per_child = _int_tag(tags, TAG_PER_CHILD, 1)
        size = int((parent.get("arrayProperties") or {}).get("size") or 0)
        counts: dict[str, int] = dict.fromkeys(STATUSES, 0)
        if size == 0:  # a plain job: its own status is its one child's
            size = 1
            counts[str(parent.get("status"))] = 1
            if parent.get("status") == "FAILED":
                failed_summaries.append((parent, offset))
        else:
            for status in STATUSES:
                for summary in _list_children(batch_client, backoff, job_id, status):
                    counts[status] += 1
                    if status == "FAILED":
                        failed_summaries.append((summary, offset))
        images = _int_tag(tags, TAG_IMAGES, size * per_child)
        progress.append(JobProgress(job_id, str(parent.get("jobName", "")), str(parent.get("status", "")),
                                    size, offset, images, per_child, counts))
    return BatchStatus(tuple(progress), _failed_children(batch_client, backoff, failed_summaries[:max_failed]))


def _list_children(batch_client: Any, backoff: Backoff, job_id: str, status: str) -> Iterable[Mapping[str, Any]]:
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"arrayJobId": job_id, "jobStatus": status, "maxResults": 1000}
        if token:
            kwargs["nextToken"] = token
        page = backoff.call(batch_client.list_jobs, doing=f"listing {status} children of {job_id}", **kwargs)
        yield from page.get("jobSummaryList", [])
        token = page.get("nextToken")
        if not token:
            return


def _failed_children(batch_client: Any, backoff: Backoff,
                     summaries: Sequence[tuple[Mapping[str, Any], int]]) -> tuple[FailedChild, ...]:
    if not summaries:
        return ()
    streams: dict[str, str | None] = {}
    ids = [str(s["jobId"]) for s, _ in summaries]
    for chunk in _chunks(ids, 100):
        for job in backoff.call(batch_client.describe_jobs, doing="describing failed children",
                                jobs=list(chunk))["jobs"]:
            streams[str(job["jobId"])] = _log_stream(job)
    out = []
    for summary, offset in summaries:
        job_id = str(summary["jobId"])
        container = summary.get("container") or {}
        reason = str(summary.get("statusReason") or container.get("reason") or "")
        exit_code = container.get("exitCode")
        out.append(FailedChild(job_id, _child_index(job_id, offset), reason,
                               int(exit_code) if exit_code is not None else None, streams.get(job_id)))
    return tuple(sorted(out, key=lambda f: f.index))


# ---- the whole submission (I/O) --------------------------------------------------------------------


def check_flags(*, manifest: str | None, prefix: str | None, images_per_child: int) -> None:
    """The checks that need nothing but the flags; run before any client is made."""
    if images_per_child < 1:
        raise UsageError(f"--images-per-job is {images_per_child}: give 1 or more")
    if (manifest is None) == (prefix is None):
        raise UsageError("give exactly one of --manifest s3://bucket/key.jsonl or --prefix s3://bucket/images/")
    if manifest is not None:
        S3Uri.parse(manifest, what="--manifest")
    if prefix is not None:
        S3Uri.parse(prefix, what="--prefix")


@dataclass(frozen=True)
class SubmitResult:
    """What a submission did (or, with dry_run, would do)."""

    request: SubmitRequest
    manifest: S3Uri  # the frozen manifest the children read
    children: int
    images: int
    jobs: tuple[SubmittedJob, ...]
    requests: tuple[dict[str, Any], ...]
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "batch": self.request.name,
            "input": str(self.request.input),
            "manifest": str(self.manifest),
            "output": str(self.request.output),
            "imagesPerJob": self.request.images_per_child,
            "children": self.children,
            "images": self.images,
            "force": self.request.force,
            "dryRun": self.dry_run,
            "jobs": [{"jobId": j.job_id, "jobName": j.name, "offset": j.offset, "size": j.size,
                      "images": j.images} for j in self.jobs],
        }
        if self.dry_run:
            body["requests"] = list(self.requests)
        else:
            body["statusCommand"] = status_command(j.job_id for j in self.jobs)
        return body

    def lines(self) -> list[str]:
        what = "would submit" if self.dry_run else "submitted"
        out = [f"batch {self.request.name}: {self.images} images in {self.children} children of "
               f"{self.request.images_per_child} -> {self.request.output}",
               f"manifest {self.manifest}" + (" (not written: dry run)" if self.dry_run else "")]
        if self.dry_run:
            for request in self.requests:
                size = (request.get("arrayProperties") or {}).get("size", 1)
                out.append(f"{what} {request['jobName']}: {size} children")
        else:
            for job in self.jobs:
                kind = "array job" if job.size > 1 else "job"
                out.append(f"{what} {kind} {job.job_id} ({job.name}): children {job.offset}.."
                           f"{job.offset + job.size - 1}, {job.images} images")
            out.append(f"follow it with: {status_command(j.job_id for j in self.jobs)} --watch")
        return out


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
    from pipeline.errors import ManifestError

    entries = (s3io.read_manifest(s3, request.manifest, bucket=request.input.bucket) if request.manifest
               else s3io.list_images(s3, request.input))
    images = sum(1 for _ in entries)
    if images == 0:
        raise ManifestError(f"{request.source} holds no images: check the prefix or manifest")
    return images


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
                                  input_prefix=outputs.input_prefix, output_prefix=outputs.output_prefix)
    target = BatchTarget.resolve(batch, outputs.job_queue, outputs.job_definition)
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


DEFAULT_LOCAL_DIR = ".iobatch/local"  # run directory of `iobatch submit --local`
DEFAULT_LOCAL_S3 = ".iobatch/s3"  # data directory of the embedded S3 server: <bucket>/<key> as plain files


def submit_local(
    *,
    manifest: str | None,
    prefix: str | None,
    images_per_child: int,
    output: str | None = None,
    force: bool = False,
    s3_endpoint: str | None = None,
    dry_run: bool = False,
    run_dir: Path | None = None,
    s3_data_dir: Path | None = None,
    workers: int | None = None,
    progress: bool | None = None,
) -> tuple[SubmitResult, Any]:
    """Freeze the batch and run it on this machine with the local executor, in the foreground.

    Without `s3_endpoint` the embedded S3 server serves `s3_data_dir` (objects as files under
    <dir>/<bucket>/<key>); with it, the credentials come from the environment as for any S3. Returns the
    submission and the executor's BatchResult (None on a dry run).
    """
    import contextlib
    import json
    import os

    from pipeline import s3 as s3io
    from pipeline.local.demo import LocalRun, default_workers, prepare_run_dir, run_local
    from pipeline.local.s3server import EmbeddedS3
    from pipeline.manifest import children_for
    from profiling import runfiles

    check_flags(manifest=manifest, prefix=prefix, images_per_child=images_per_child)
    request = SubmitRequest.build(manifest=manifest, prefix=prefix, images_per_child=images_per_child,
                                  output=output, force=force)
    run_dir = run_dir or Path(DEFAULT_LOCAL_DIR) / request.name
    with contextlib.ExitStack() as stack:
        if s3_endpoint:
            endpoint = s3_endpoint
            env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        else:
            server = stack.enter_context(EmbeddedS3(s3_data_dir or Path(DEFAULT_LOCAL_S3)))
            endpoint, env = server.endpoint, server.env()
        if dry_run:
            images = scan_source(s3io.client(endpoint, env), request)
            result = SubmitResult(request, s3io.frozen_paths(request.output)[0],
                                  children_for(images, images_per_child), images, (), (), dry_run=True)
            return result, None
        prepare_run_dir(run_dir)
        run = LocalRun(input=request.input, output=request.output, endpoint=endpoint, run_dir=run_dir,
                       images_per_child=images_per_child, manifest=request.manifest,
                       workers=workers or default_workers(), env=env, force=force, job_id=f"local-{request.name}")
        outcome = run_local(run, progress=progress, say=lambda _line: None)
    manifest_uri = s3io.frozen_paths(request.output)[0]
    # The run file holds the frozen batch's totals; the outcomes count only what this run processed.
    images = int(json.loads((run_dir / runfiles.RUN_FILE).read_text(encoding="utf-8"))["images"])
    local_job = SubmittedJob(f"local:{run_dir}", job_name(request.name), 0, outcome.children, images)
    return SubmitResult(request, manifest_uri, outcome.children, images, (local_job,), ()), outcome


def follow(batch_client: Any, job_ids: Sequence[str], *, interval_s: float, emit: Callable[[BatchStatus], None],
           sleep: Callable[[float], None] = time.sleep, backoff: Backoff | None = None) -> BatchStatus:
    """Poll until every child has finished, calling `emit` after each poll; return the last status."""
    backoff = backoff or Backoff(sleep=sleep)
    while True:
        status = poll_status(batch_client, job_ids, backoff=backoff)
        emit(status)
        if status.finished:
            return status
        sleep(interval_s)


def progress_view(total: int) -> tuple[Any, Callable[[BatchStatus], None]]:
    """A rich progress bar (children finished of total) and the callback that updates it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]children"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), transient=False)
    task = bar.add_task("", total=total)

    def update(status: BatchStatus) -> None:
        s = status.summary()
        bar.update(task, total=status.children, completed=s["succeeded"] + s["failed"],
                   description=f"running {s['running']} runnable {s['runnable']} pending {s['pending']} "
                               f"failed {s['failed']} | images {status.images_done}/{status.images}")

    return bar, update
