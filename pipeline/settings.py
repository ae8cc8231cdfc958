"""JobSettings: what one array child needs, read from its environment.

The same variables are set by AWS Batch (through the job definition and `iobatch submit`) and by the
local executor, so the job cannot tell them apart. Every variable name lives in pipeline.interface.ENV.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.endpoints import chosen_endpoint
from pipeline.errors import ManifestError, UsageError
from pipeline.interface import (
    DEFAULT_PROCESS_COMMAND,
    ENV,
    PROFILER_OFF,
    SCRATCH_MOUNT,
    process_command_problem,
    task_dir_name,
)
from pipeline.manifest import MAX_KEY_BYTES
from profiling.identity import TASK_ID, JobEnv, array_index_text, resolve_task_id, safe_task_id
from profiling.numbers import MAX_DIGITS, shown, whole_number
from profiling.protocol import SOCKET_NAME

if TYPE_CHECKING:
    from profiling.identity import JobIdentity

# ENV and PROFILER_OFF belong to the job's interface; the settings' readers may import them from here too.
DEFAULT_SCRATCH = SCRATCH_MOUNT
DEFAULT_TRAIN_SIZE = (512, 384)
DEFAULT_S5CMD_WORKERS = 16
# Bounds of what one child can be asked to do. Beyond them a child runs out of memory or time instead of
# failing with a clear line; the CLI shows them in --help and the job checks its variables against them.
MIN_TRAIN_SIDE = 8
MAX_TRAIN_SIDE = 4096  # pixels; the process stage holds a 4096x4096 image as float32 (192 MiB) at a time
MAX_IMAGES_PER_CHILD = 100_000
MAX_S5CMD_WORKERS = 1024
# s5cmd backs off exponentially between retries (its default is 10): past 100 a child waits for hours on an
# endpoint that is down instead of failing for Batch to retry it.
MAX_S5CMD_RETRIES = 100
MAX_WORKERS = 256  # children at once on one machine
# The demo's synthetic batch: generating one image holds about 30 bytes a pixel (pipeline/local/dataset.py),
# so 256 MiB images (~117 Mpixel) need about 3.5 GiB per generating process.
MAX_DEMO_IMAGES = 100_000
MAX_IMAGE_MIB = 256.0
# The executor sets a child's global index as its array index (no offset); the batch's own size is checked
# against the frozen manifest (pipeline/job.py), this bound only stops a typo from naming a child.
MAX_CHILD_INDEX = 10**9
MAX_TIMEOUT_S = 14 * 24 * 3600  # the stack's longest jobTimeoutMinutes; beyond it a typo, not a timeout
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$", re.DOTALL)


@dataclass(frozen=True)
class S3Uri:
    bucket: str
    key: str  # a prefix ends with "/", or is empty for the whole bucket

    @classmethod
    def parse(cls, text: str, *, what: str) -> S3Uri:
        match = _S3_URI.match(text.strip())
        if not match:
            if text.strip().startswith("s3://"):
                bucket = text.strip()[len("s3://"):].split("/", 1)[0]
                raise UsageError(f"{what} {text!r}: bucket name {bucket!r} is not valid (3-63 lowercase letters, "
                                 "digits, dots and hyphens)")
            raise UsageError(f"{what} {text!r} is not an S3 URI: write it as s3://bucket/prefix/")
        key = match["key"] or ""
        if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
            raise UsageError(f"{what} {shown(text, 60)}: the key is over {MAX_KEY_BYTES:,} bytes, S3's limit: "
                             "give a shorter prefix")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
            raise UsageError(f"{what} {text!r} has a control character (a newline?) in its key: give the plain URI")
        return cls(match["bucket"], key)

    def as_prefix(self) -> S3Uri:
        """The same location as a folder: key empty or ending in '/'."""
        if self.key and not self.key.endswith("/"):
            return S3Uri(self.bucket, self.key + "/")
        return self

    def join(self, *parts: str) -> S3Uri:
        return S3Uri(self.bucket, self.as_prefix().key + "/".join(parts))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def parse_manifest_uri(text: str, *, what: str) -> S3Uri:
    """The S3 URI of a manifest object: a key is needed (s3://bucket alone names no object, and would reach
    S3 as a request botocore refuses)."""
    uri = S3Uri.parse(text, what=what)
    if not uri.key or uri.key.endswith("/"):
        raise UsageError(f"{what} {text} names a folder, not a manifest: give the manifest object, "
                         "e.g. s3://bucket/batches/2026-11-22.jsonl")
    return uri


def check_output_outside_input(input: S3Uri, output: S3Uri, *, listed: bool, what: str = "--output") -> None:
    """The one rule for where a batch may write: never inside (or at) the input prefix. Its frozen manifest,
    index and shards would land among the user's images, and a listing of the input would take them for
    images. With a manifest (`listed` False) whose input is a whole bucket (`submit --local --manifest`:
    the bucket its keys live in), the rest of that bucket is free."""
    inside = output.bucket == input.bucket and output.as_prefix().key.startswith(input.as_prefix().key)
    if inside and (listed or input.key):
        raise UsageError(f"output {output} is inside the input prefix {input}: the batch's files would land among "
                         f"the images (and be listed as images next time); give {what} elsewhere")


def default_workers() -> int:
    """One worker per core this process may run on: one task per core, as on Batch."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def counted(count: int, one: str, many: str) -> str:
    """`count` with its noun in the right number: "1 child", "2 children"."""
    return f"{count:,} {one if count == 1 else many}"


def child_name(index: int) -> str:
    """The name of a child's output folder and scratch subdirectory."""
    return f"part-{index:05d}"


def parse_train_size(text: str, *, what: str = ENV.TRAIN_SIZE) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*", text)
    if not match:
        raise UsageError(f"{what} {text!r} is not a size: write WIDTHxHEIGHT, e.g. 512x384")
    width, height = int(match[1]), int(match[2])
    if not (MIN_TRAIN_SIDE <= width <= MAX_TRAIN_SIDE and MIN_TRAIN_SIDE <= height <= MAX_TRAIN_SIDE):
        raise UsageError(f"{what} {text!r} is out of range: each side {MIN_TRAIN_SIDE} to {MAX_TRAIN_SIDE} pixels")
    return width, height


def parse_process_command(text: str, *, what: str = ENV.PROCESS_COMMAND) -> str:
    """A process command line with {input} and {output} (pipeline.interface); a usage error otherwise."""
    if problem := process_command_problem(text):
        raise UsageError(f"{what} {text[:80]!r} {problem}")
    return text.strip()


def parse_int(raw: str, *, what: str, minimum: int, maximum: int) -> int:
    """A whole number from a variable or flag (profiling.numbers.whole_number: ASCII digits, bounded length)
    within [minimum, maximum]; anything else is a usage error naming `what`."""
    value = whole_number(raw)
    if value is None:
        body = raw.strip()
        if body.lstrip("+-").isascii() and body.lstrip("+-").isdigit():
            raise UsageError(f"{what}={shown(body)} is out of range: give {minimum} to {maximum}")
        raise UsageError(f"{what}={shown(raw)} is not a whole number: give one from {minimum} to {maximum} "
                         "(ASCII digits)")
    if not minimum <= value <= maximum:
        raise UsageError(f"{what}={value} is out of range: give {minimum} to {maximum}")
    return value


def _int(environ: Mapping[str, str], name: str, default: int | None, minimum: int, maximum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UsageError(f"{name} is not set: the job needs it (see `iobatch job --help`)")
        return default
    return parse_int(raw, what=name, minimum=minimum, maximum=maximum)


def _optional_int(environ: Mapping[str, str], name: str, minimum: int, maximum: int) -> int | None:
    raw = environ.get(name, "")
    return None if raw.strip() == "" else parse_int(raw, what=name, minimum=minimum, maximum=maximum)


def _child_index(environ: Mapping[str, str]) -> int:
    """The global child index (the array index plus the offset of its array job). Text or a negative number
    is a usage error (64, like any variable); a whole number past any batch names a child that cannot exist:
    bad input, like an index past this batch (65, pipeline/job.py). Read after every other variable, so a bad
    variable beside it is still a 64."""
    # The index as the profiler reads it too (profiling.identity.array_index_text): else the job id's ":<index>".
    given = {ENV.ARRAY_INDEX: array_index_text(environ, _job_env()) or "", ENV.ARRAY_OFFSET:
             environ.get(ENV.ARRAY_OFFSET, "")}
    total = 0
    for name in (ENV.ARRAY_INDEX, ENV.ARRAY_OFFSET):
        raw = given[name].strip()
        digits = raw.removeprefix("+")
        if digits.isascii() and digits.isdigit() and (len(digits) > MAX_DIGITS or int(digits) > MAX_CHILD_INDEX):
            cut = "..." if len(raw) > 24 else ""
            raise ManifestError(f"{name}={raw[:24]}{cut} is beyond any batch: an index is 0 to {MAX_CHILD_INDEX:,}")
        total += _int(given, name, 0, 0, MAX_CHILD_INDEX)
    if total > MAX_CHILD_INDEX:
        raise ManifestError(f"{ENV.ARRAY_INDEX} + {ENV.ARRAY_OFFSET} = {total:,} is beyond any batch: an index is "
                            f"0 to {MAX_CHILD_INDEX:,}")
    return total


def _yes(environ: Mapping[str, str], name: str) -> bool:
    """A yes/no variable: 1, true or yes; 0, false, no or unset. Anything else is a usage error, not a no."""
    raw = environ.get(name, "").strip().lower()
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("", "0", "false", "no"):
        return False
    raise UsageError(f"{name}={raw[:40]!r} is not yes or no: set it to 1 or 0 (or leave it unset)")


def env_yes(environ: Mapping[str, str], name: str) -> bool:
    """A yes/no variable (1, true, yes; 0, false, no or unset); anything else is a usage error naming it."""
    return _yes(environ, name)


def _pipeline_name(environ: Mapping[str, str]) -> str:
    """The Pipeline dimension of every metric: checked here, at the start, since CloudWatch would drop every
    document of a value it cannot take (profiling.emf.dimension_value_problem)."""
    from profiling.emf import dimension_value_problem

    value = environ.get(ENV.PIPELINE) or "iobatch"
    if problem := dimension_value_problem(value):
        raise UsageError(f"{ENV.PIPELINE}={shown(value, 40)} {problem}: set it to the stack's pipeline name")
    return value


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise UsageError(f"{name} is not set: the job needs it (see `iobatch job --help`)")
    return value


@dataclass(frozen=True)
class JobSettings:
    """Everything one array child needs. Build it with `from_env`."""

    input: S3Uri
    output: S3Uri
    manifest: S3Uri | None
    scratch_root: Path
    images_per_child: int
    array_index: int  # the global child index: AWS_BATCH_JOB_ARRAY_INDEX + IOBATCH_ARRAY_OFFSET
    job_id: str
    s3_endpoint: str | None = None
    train_size: tuple[int, int] = DEFAULT_TRAIN_SIZE
    skip_bad_images: bool = False
    s5cmd_workers: int = DEFAULT_S5CMD_WORKERS
    s5cmd_retries: int | None = None  # s5cmd --retry-count; None: s5cmd's own default
    pipeline: str = "iobatch"
    profiler_socket: Path | None = None
    profiler_enabled: bool = True  # False when IOBATCH_PROFILER_SOCKET=off: stages are not announced
    volume_type: str = "unknown"
    force: bool = False  # redo a child even when its _SUCCESS marker exists
    task_id: str = ""  # names this attempt's scratch directory (`attempt`); empty: from the job id
    timeout_s: int | None = None  # the attempt's hard timeout: the job stops itself before it
    require_prepared_scratch: bool = False  # the scratch root must carry the host's marker (AWS hosts)
    process_command: str = DEFAULT_PROCESS_COMMAND  # the process stage: a command line with {input} {output}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobSettings:
        env = os.environ if environ is None else environ
        manifest_raw = env.get(ENV.MANIFEST, "").strip()
        socket_raw = env.get(ENV.PROFILER_SOCKET, "").strip()
        input_uri = S3Uri.parse(_required(env, ENV.INPUT), what=ENV.INPUT).as_prefix()
        output_uri = S3Uri.parse(_required(env, ENV.OUTPUT), what=ENV.OUTPUT).as_prefix()
        manifest = parse_manifest_uri(manifest_raw, what=ENV.MANIFEST) if manifest_raw else None
        check_output_outside_input(input_uri, output_uri, listed=manifest is None, what=ENV.OUTPUT)
        return cls(
            input=input_uri,
            output=output_uri,
            manifest=manifest,
            scratch_root=Path(env.get(ENV.SCRATCH) or DEFAULT_SCRATCH),
            images_per_child=_int(env, ENV.IMAGES_PER_CHILD, None, 1, MAX_IMAGES_PER_CHILD),
            job_id=env.get(ENV.JOB_ID) or "local",
            # Else AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL, as boto3 reads them: given to s5cmd too, which does not.
            s3_endpoint=chosen_endpoint(env.get(ENV.S3_ENDPOINT), ENV.S3_ENDPOINT, "s3", env),
            train_size=parse_train_size(env[ENV.TRAIN_SIZE]) if env.get(ENV.TRAIN_SIZE) else DEFAULT_TRAIN_SIZE,
            skip_bad_images=_yes(env, ENV.SKIP_BAD_IMAGES),
            s5cmd_workers=_int(env, ENV.S5CMD_WORKERS, DEFAULT_S5CMD_WORKERS, 1, MAX_S5CMD_WORKERS),
            s5cmd_retries=_optional_int(env, ENV.S5CMD_RETRIES, 0, MAX_S5CMD_RETRIES),
            pipeline=_pipeline_name(env),
            profiler_socket=Path(socket_raw) if socket_raw and socket_raw != PROFILER_OFF else None,
            profiler_enabled=socket_raw != PROFILER_OFF,
            volume_type=env.get(ENV.VOLUME_TYPE) or "unknown",
            force=_yes(env, ENV.FORCE),
            task_id=_task_id(env),
            timeout_s=_int(env, ENV.TIMEOUT_S, 0, 0, MAX_TIMEOUT_S) or None,
            require_prepared_scratch=_yes(env, ENV.REQUIRE_PREPARED_SCRATCH),
            process_command=parse_process_command(env.get(ENV.PROCESS_COMMAND) or DEFAULT_PROCESS_COMMAND),
            array_index=_child_index(env),  # last: its 65 only when every other variable is good
        )

    @property
    def child(self) -> str:
        return child_name(self.array_index)

    @property
    def attempt(self) -> str:
        """The task id of this attempt: children of several batches share one host's scratch volume."""
        return self.task_id or safe_task_id(self.job_id)

    @property
    def work_dir(self) -> Path:
        """This attempt's own scratch subdirectory, named by the attempt, never by the index alone."""
        return self.scratch_root / task_dir_name(self.attempt)

    @property
    def socket_path(self) -> Path | None:
        """The sidecar's socket, or None when the profiler is off."""
        if not self.profiler_enabled:
            return None
        return self.profiler_socket or (self.work_dir / SOCKET_NAME)

    @property
    def child_output(self) -> S3Uri:
        return self.output.join(self.child).as_prefix()

    def to_env(self) -> dict[str, str]:
        """The inverse of from_env: what the executor or the job definition sets."""
        env = {
            ENV.INPUT: str(self.input),
            ENV.OUTPUT: str(self.output),
            ENV.SCRATCH: str(self.scratch_root),
            ENV.IMAGES_PER_CHILD: str(self.images_per_child),
            ENV.ARRAY_INDEX: str(self.array_index),
            ENV.JOB_ID: self.job_id,
            ENV.TRAIN_SIZE: f"{self.train_size[0]}x{self.train_size[1]}",
            ENV.S5CMD_WORKERS: str(self.s5cmd_workers),
            ENV.PIPELINE: self.pipeline,
            ENV.VOLUME_TYPE: self.volume_type,
            ENV.TASK_ID: self.attempt,
        }
        if self.s5cmd_retries is not None:
            env[ENV.S5CMD_RETRIES] = str(self.s5cmd_retries)
        if self.timeout_s:
            env[ENV.TIMEOUT_S] = str(self.timeout_s)
        if self.require_prepared_scratch:
            env[ENV.REQUIRE_PREPARED_SCRATCH] = "1"
        if self.manifest:
            env[ENV.MANIFEST] = str(self.manifest)
        if self.s3_endpoint:
            env[ENV.S3_ENDPOINT] = self.s3_endpoint
        if self.skip_bad_images:
            env[ENV.SKIP_BAD_IMAGES] = "1"
        if not self.profiler_enabled:
            env[ENV.PROFILER_SOCKET] = PROFILER_OFF
        elif self.profiler_socket:
            env[ENV.PROFILER_SOCKET] = str(self.profiler_socket)
        if self.force:
            env[ENV.FORCE] = "1"
        if self.process_command != DEFAULT_PROCESS_COMMAND:
            env[ENV.PROCESS_COMMAND] = self.process_command
        return env


def _job_env() -> JobEnv:
    """The job's variable names and scratch layout, as the profiler's identity reader takes them."""
    return JobEnv(pipeline=ENV.PIPELINE, job_id=ENV.JOB_ID, array_index=ENV.ARRAY_INDEX,
                  array_offset=ENV.ARRAY_OFFSET, volume_type=ENV.VOLUME_TYPE, scratch=ENV.SCRATCH,
                  profiler_socket=ENV.PROFILER_SOCKET, default_scratch=SCRATCH_MOUNT, profiler_off=PROFILER_OFF,
                  task_id=ENV.TASK_ID, attempt=ENV.ATTEMPT, ecs_metadata=ENV.ECS_METADATA, task_dir=task_dir_name)


def _task_id(environ: Mapping[str, str]) -> str:
    """This attempt's task id, by the rule the sidecar follows too (profiling.identity.resolve_task_id)."""
    raw = environ.get(ENV.TASK_ID, "").strip()
    if raw and not TASK_ID.match(raw):
        raise UsageError(f"{ENV.TASK_ID}={raw[:40]!r} is not a task id: use 1-80 letters, digits, '.', '_' "
                         "or '-', starting with a letter or digit (or leave it unset in AWS)")
    return resolve_task_id(environ, _job_env())


def new_task_id(index: int) -> str:
    """A fresh task id for one local attempt of child `index`: unique across runs sharing a scratch root."""
    return f"{index:05d}-{uuid.uuid4().hex[:6]}"


def job_identity(environ: Mapping[str, str]) -> JobIdentity:
    """The profiled job's identity (profiling.identity.JobIdentity), read from `environ` with the job's own
    variable names and scratch layout: the profiler never imports them, so they are handed over here."""
    from profiling.identity import job_identity as read_identity

    return read_identity(environ, _job_env())
