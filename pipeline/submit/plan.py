"""Planning a submission (pure): the request checked against the flags and the stack, the array jobs, and
every SubmitJob request, built before any of them is sent.

1. `SubmitRequest.build` checks the flags (K >= 1, URIs, one source, output not inside the input, and
   with a stack the only prefixes its job role may read and write).
2. `plan_array_jobs` shards the children into array jobs of at most 10,000 (Batch's limit).
3. `plan_requests` builds each SubmitJob request: the batch rides in environment overrides for both
   containers of the multi-container job definition (the job and the profiler sidecar): input, output,
   frozen manifest, images per child, the array offset of this array job, and force. No key ever rides
   in job parameters.

Nothing here calls AWS; `SubmitResult` renders what a submission did (or, with dry_run, would do).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import PermanentError, UsageError
from pipeline.interface import CONTAINERS, ENV
from pipeline.manifest import MAX_ARRAY_SIZE, array_jobs
from pipeline.settings import S3Uri, check_output_outside_input, parse_manifest_uri, parse_process_command

# Tags on each submitted job: `iobatch status` reads them back to count images without the manifest.
TAG_BATCH = "iobatch:batch"
TAG_OFFSET = "iobatch:offset"
TAG_PER_CHILD = "iobatch:images-per-child"
TAG_IMAGES = "iobatch:images"
TAG_OUTPUT = "iobatch:output"
# The job definition propagates its job's tags to the ECS task, and ECS takes a tag value only of letters, spaces,
# digits and `_.:/=+-@`, at most 256 characters (botocore's ECS model, shape TagValue: pattern
# ([\p{L}\p{Z}\p{N}_.:/=+\-@]*), max 256): any other character (an S3 key's `( ) ' !`) would fail every child's
# task at start, so `tag_value` writes it as TAG_VALUE_JUNK.
TAG_VALUE_MAX = 256
TAG_VALUE_PUNCTUATION = frozenset("_.:/=+-@")
TAG_VALUE_JUNK = "_"

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
    process_command: str | None = None  # None: the job definition's (pipeline.interface: {input} {output})

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
        process_command: str | None = None,
    ) -> SubmitRequest:
        """Validate the flags.

        `input_bucket`/`output_bucket` come from the stack (None: --local), and so do `input_prefix` and
        `output_prefix`, the only places the job role may read and write.
        """
        if images_per_child < 1:
            raise UsageError(f"--images-per-job is {images_per_child}: give 1 or more")
        command = None if process_command is None else parse_process_command(process_command,
                                                                             what="--process-command")
        if (manifest is None) == (prefix is None):
            raise UsageError("give exactly one of --manifest s3://bucket/key.jsonl or --prefix s3://bucket/images/")
        manifest_uri: S3Uri | None = None
        if manifest is not None:
            manifest_uri = parse_manifest_uri(manifest, what="--manifest")
            # The manifest's keys must lie under the stack's input prefix, the only one the job may read.
            input_uri = S3Uri(input_bucket or manifest_uri.bucket, input_prefix)
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
        check_output_outside_input(input_uri, output_uri, listed=manifest_uri is None)
        return cls(input_uri, manifest_uri, output_uri, images_per_child, name, force, command)

    @property
    def source(self) -> S3Uri:
        return self.manifest or self.input


def check_flags(*, manifest: str | None, prefix: str | None, images_per_child: int) -> None:
    """The checks that need nothing but the flags; run before any client is made."""
    if images_per_child < 1:
        raise UsageError(f"--images-per-job is {images_per_child}: give 1 or more")
    if (manifest is None) == (prefix is None):
        raise UsageError("give exactly one of --manifest s3://bucket/key.jsonl or --prefix s3://bucket/images/")
    if manifest is not None:
        parse_manifest_uri(manifest, what="--manifest")
    if prefix is not None:
        S3Uri.parse(prefix, what="--prefix")


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
        **({ENV.PROCESS_COMMAND: request.process_command} if request.process_command else {}),
    }


@dataclass(frozen=True)
class BatchTarget:
    """Where the jobs go: queue, job definition, and the containers of that definition to override.

    `containers` is the multi-container (ecsProperties) job definition's container names; None means a
    single-container definition (containerProperties), overridden with containerOverrides instead.
    `pipeline.submit.stack.resolve_target` reads them from the deployed definition.
    """

    job_queue: str
    job_definition: str
    containers: tuple[str, ...] | None = CONTAINERS


def tag_value(text: str) -> str:
    """`text` as a tag value ECS accepts (TAG_VALUE_MAX characters of letters (L), separators (Z), numbers (N) and
    TAG_VALUE_PUNCTUATION; TAG_VALUE_JUNK for anything else)."""
    return "".join(c if unicodedata.category(c)[0] in "LZN" or c in TAG_VALUE_PUNCTUATION else TAG_VALUE_JUNK
                   for c in text[:TAG_VALUE_MAX])


def submit_kwargs(plan: ArrayJobPlan, target: BatchTarget, environment: Mapping[str, str],
                  tags: Mapping[str, str]) -> dict[str, Any]:
    """The SubmitJob request for one array job (pure)."""
    env = [{"name": k, "value": v} for k, v in environment.items()]
    kwargs: dict[str, Any] = {
        "jobName": plan.name,
        "jobQueue": target.job_queue,
        "jobDefinition": target.job_definition,
        "tags": {key: tag_value(value) for key, value in tags.items()},
    }
    if plan.size > 1:
        kwargs["arrayProperties"] = {"size": plan.size}
    if target.containers is None:
        kwargs["containerOverrides"] = {"environment": env}
    else:
        # Only the job and the profiler read IOBATCH_*; any other container is left as defined.
        kwargs["ecsPropertiesOverride"] = {"taskProperties": [{"containers": [
            {"name": name, "environment": env} for name in target.containers if name in CONTAINERS
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
                TAG_OUTPUT: str(request.output)}
        out.append((plan, submit_kwargs(plan, target, batch_environment(request, manifest, plan.offset), tags)))
    return out


@dataclass(frozen=True)
class SubmittedJob:
    """One job SubmitJob accepted (or the one local run of `submit --local`): its children and images."""

    job_id: str
    name: str
    offset: int
    size: int
    images: int


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
            "processCommand": self.request.process_command,
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


def status_command(job_ids: Iterable[str]) -> str:
    """The command that follows the submitted jobs."""
    return "iobatch status " + " ".join(job_ids)
