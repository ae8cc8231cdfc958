"""JobSettings: what one array child needs, read from its environment.

The same variables are set by AWS Batch (through the job definition and `iobatch submit`) and by the
local executor, so the job cannot tell them apart. Every variable name lives in pipeline.interface.ENV.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import UsageError
from pipeline.interface import ENV, PROFILER_OFF, SCRATCH_MOUNT
from profiling.protocol import SOCKET_NAME

if TYPE_CHECKING:
    from profiling.identity import JobIdentity

# ENV and PROFILER_OFF belong to the job's interface; the settings' readers may import them from here too.
DEFAULT_SCRATCH = SCRATCH_MOUNT
DEFAULT_TRAIN_SIZE = (512, 384)
DEFAULT_S5CMD_WORKERS = 16
_S3_URI = re.compile(r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(?P<key>.*))?$")


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
        return cls(match["bucket"], match["key"] or "")

    def as_prefix(self) -> S3Uri:
        """The same location as a folder: key empty or ending in '/'."""
        if self.key and not self.key.endswith("/"):
            return S3Uri(self.bucket, self.key + "/")
        return self

    def join(self, *parts: str) -> S3Uri:
        return S3Uri(self.bucket, self.as_prefix().key + "/".join(parts))

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


def default_workers() -> int:
    """One worker per core this process may run on: one task per core, as on Batch."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def child_name(index: int) -> str:
    """The name of a child's output folder and scratch subdirectory."""
    return f"part-{index:05d}"


def parse_train_size(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match[1]) < 8 or int(match[2]) < 8:
        raise UsageError(f"{ENV.TRAIN_SIZE}={text!r} is not a size: write WIDTHxHEIGHT, e.g. 512x384")
    return int(match[1]), int(match[2])


def _int(environ: Mapping[str, str], name: str, default: int | None, minimum: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise UsageError(f"{name} is not set: the job needs it (see `iobatch job --help`)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise UsageError(f"{name}={value} is below {minimum}")
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
    pipeline: str = "iobatch"
    profiler_socket: Path | None = None
    profiler_enabled: bool = True  # False when IOBATCH_PROFILER_SOCKET=off: stages are not announced
    volume_type: str = "unknown"
    force: bool = False  # redo a child even when its _SUCCESS marker exists

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobSettings:
        env = os.environ if environ is None else environ
        manifest_raw = env.get(ENV.MANIFEST, "").strip()
        socket_raw = env.get(ENV.PROFILER_SOCKET, "").strip()
        return cls(
            input=S3Uri.parse(_required(env, ENV.INPUT), what=ENV.INPUT).as_prefix(),
            output=S3Uri.parse(_required(env, ENV.OUTPUT), what=ENV.OUTPUT).as_prefix(),
            manifest=S3Uri.parse(manifest_raw, what=ENV.MANIFEST) if manifest_raw else None,
            scratch_root=Path(env.get(ENV.SCRATCH) or DEFAULT_SCRATCH),
            images_per_child=_int(env, ENV.IMAGES_PER_CHILD, None, 1),
            array_index=_int(env, ENV.ARRAY_INDEX, 0, 0) + _int(env, ENV.ARRAY_OFFSET, 0, 0),
            job_id=env.get(ENV.JOB_ID) or "local",
            s3_endpoint=env.get(ENV.S3_ENDPOINT) or None,
            train_size=parse_train_size(env[ENV.TRAIN_SIZE]) if env.get(ENV.TRAIN_SIZE) else DEFAULT_TRAIN_SIZE,
            skip_bad_images=env.get(ENV.SKIP_BAD_IMAGES, "").lower() in ("1", "true", "yes"),
            s5cmd_workers=_int(env, ENV.S5CMD_WORKERS, DEFAULT_S5CMD_WORKERS, 1),
            pipeline=env.get(ENV.PIPELINE) or "iobatch",
            profiler_socket=Path(socket_raw) if socket_raw and socket_raw != PROFILER_OFF else None,
            profiler_enabled=socket_raw != PROFILER_OFF,
            volume_type=env.get(ENV.VOLUME_TYPE) or "unknown",
            force=env.get(ENV.FORCE, "").lower() in ("1", "true", "yes"),
        )

    @property
    def child(self) -> str:
        return child_name(self.array_index)

    @property
    def work_dir(self) -> Path:
        """This child's own scratch subdirectory: tasks on one host share the scratch volume."""
        return self.scratch_root / self.child

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
        }
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
        return env


def job_identity(environ: Mapping[str, str]) -> JobIdentity:
    """The profiled job's identity (profiling.identity.JobIdentity), read from `environ` with the job's own
    variable names and scratch layout: the profiler never imports them, so they are handed over here."""
    from profiling.identity import JobEnv
    from profiling.identity import job_identity as read_identity

    names = JobEnv(pipeline=ENV.PIPELINE, job_id=ENV.JOB_ID, array_index=ENV.ARRAY_INDEX,
                   array_offset=ENV.ARRAY_OFFSET, volume_type=ENV.VOLUME_TYPE, scratch=ENV.SCRATCH,
                   profiler_socket=ENV.PROFILER_SOCKET, default_scratch=SCRATCH_MOUNT, profiler_off=PROFILER_OFF,
                   child_dir=child_name)
    return read_identity(environ, names)
