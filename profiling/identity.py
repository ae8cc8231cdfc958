"""Who the profiled job is: the properties every profile and EMF document carries, and where it works.

The profiler reads the job's own environment, but the names of its variables and its scratch layout
belong to the job's interface, which profiling never imports: the caller passes them in as a `JobEnv`.
The profiler does not need the job's S3 settings, so nothing here fails for a variable that is
missing or malformed: it falls back to a default.

The job and its profiler meet at a socket in the attempt's scratch directory, named by a task id both
containers of one task share (`resolve_task_id`): the launcher's variable when it sets one (the local
executor does), else the ECS task id from the task metadata endpoint, which the ECS agent offers to
every container of a task. The array index is not used for this: AWS Batch documents
AWS_BATCH_JOB_ARRAY_INDEX for the container of a single-container job, and a sidecar that does not see
it would wait at another socket while the job ran unprofiled.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from profiling.numbers import whole_number
from profiling.protocol import SOCKET_NAME

#: The host's instance id and type, as JSON {"InstanceId": ..., "InstanceType": ...}, at the root of the scratch
#: volume: the host's user data writes it (tuning/host.py renders it), the profiler reads it (`instance_identity`).
INSTANCE_FILE = ".iobatch-instance"
INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,32}$")
INSTANCE_TYPE = re.compile(r"^[a-z0-9-]+\.[a-z0-9-]+$")
METADATA_TIMEOUT_S = 1.0
METADATA_ATTEMPTS = 5
#: A task id as it may appear in a path: an ECS task id is 32 hex digits; launchers may use these characters.
TASK_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,79}$")


@dataclass(frozen=True)
class JobEnv:
    """The job's environment variable names the profiler reads, and how its scratch is laid out."""

    pipeline: str  # the Pipeline dimension
    job_id: str
    array_index: str
    array_offset: str  # added to the array index when a batch spans several array jobs
    volume_type: str
    scratch: str  # root of the scratch volume
    profiler_socket: str  # the sidecar's socket; `profiler_off` there: no profiler
    default_scratch: str
    profiler_off: str
    task_id: str  # the attempt's id, set by a launcher; else the ECS task id (`resolve_task_id`)
    attempt: str  # the Batch attempt number (the last fallback names the attempt by job id and attempt)
    ecs_metadata: str  # the ECS task metadata endpoint (v4)
    task_dir: Callable[[str], str]  # an attempt's scratch subdirectory, from its task id


@dataclass(frozen=True)
class JobIdentity:
    """One array child as the profiler sees it."""

    pipeline: str
    job_id: str
    array_index: int
    volume_type: str
    work_dir: Path  # the child's scratch subdirectory
    socket_path: Path | None  # None when the profiler is off
    instance_id: str = "unknown"
    instance_type: str = "unknown"
    volume_id: str | None = None  # the scratch volume's EBS id (profiling.probes.disk.ebs_volume_id); None: not EBS

    @classmethod
    def from_env(cls, environ: Mapping[str, str], names: JobEnv, task_id: str) -> JobIdentity:
        """The identity in `environ` of the attempt `task_id` (pure: the instance is left unknown, see
        `job_identity`)."""
        index = _whole(array_index_text(environ, names))
        offset = _whole(environ.get(names.array_offset))
        array_index = index + offset if index is not None and offset is not None else 0
        work_dir = Path(environ.get(names.scratch) or names.default_scratch) / names.task_dir(task_id)
        raw_socket = environ.get(names.profiler_socket, "").strip()
        socket_path = None if raw_socket == names.profiler_off else Path(raw_socket or work_dir / SOCKET_NAME)
        return cls(
            pipeline=environ.get(names.pipeline) or "iobatch",
            job_id=environ.get(names.job_id) or "local",
            array_index=array_index,
            volume_type=environ.get(names.volume_type) or "unknown",
            work_dir=work_dir,
            socket_path=socket_path,
        )

    @property
    def properties(self) -> dict[str, str]:
        """The properties of every profile and EMF document of this job."""
        found = {"Pipeline": self.pipeline, "JobId": self.job_id, "ArrayIndex": str(self.array_index),
                 "InstanceId": self.instance_id, "InstanceType": self.instance_type, "VolumeType": self.volume_type}
        return found if self.volume_id is None else {**found, "VolumeId": self.volume_id}


def array_index_text(environ: Mapping[str, str], names: JobEnv) -> str | None:
    """The array index's text, one rule for the job (pipeline.settings, strict) and its profiler (lenient): the
    variable, else, where it was not handed to this container, the ":<index>" an array child's job id ends in
    ("Array jobs", AWS Batch User Guide); None for neither. Where the profiler's container has neither, the job's
    own stage_start names them (protocol.IDENTITY_KEYS) and the profiles carry the job's."""
    raw = environ.get(names.array_index)
    if raw is not None:
        return raw
    head, _, tail = (environ.get(names.job_id) or "").rpartition(":")
    return tail if head and whole_number(tail) is not None else None


def _whole(raw: str | None) -> int | None:
    """A whole number >= 0 (unset or empty: 0), or None when `raw` is not one."""
    if raw is None or raw == "":
        return 0
    value = whole_number(raw)  # ASCII digits of a bounded length: '²' or 5,000 digits are not one
    return value if value is not None and value >= 0 else None


def safe_task_id(text: str) -> str:
    """`text` as a task id that is safe in a path (runs of other characters become one '-')."""
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-._")[:80]
    return cleaned or "local"


def ecs_task_id(metadata_uri: str, *, attempts: int = METADATA_ATTEMPTS, timeout_s: float = METADATA_TIMEOUT_S,
                sleep: Callable[[float], None] = time.sleep) -> str | None:
    """The task id from the ECS task metadata endpoint v4, or None when it does not answer.

    GET ${ECS_CONTAINER_METADATA_URI_V4}/task answers JSON whose "TaskARN" is
    arn:aws:ecs:REGION:ACCOUNT:task/CLUSTER/TASK_ID ("Amazon ECS task metadata v4 JSON response",
    Amazon ECS Developer Guide). The agent may not answer in a container's first moments: a few tries.
    """
    import urllib.request  # here: every `iobatch` command line imports this module, few ask ECS (issue 43)

    url = metadata_uri.rstrip("/") + "/task"
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                arn = json.loads(response.read().decode()).get("TaskARN")
            task_id = str(arn or "").rsplit("/", 1)[-1]
            return task_id if TASK_ID.match(task_id) else None
        except (OSError, ValueError, AttributeError):
            if attempt < attempts - 1:
                sleep(0.2 * (attempt + 1))
    return None


def resolve_task_id(environ: Mapping[str, str], names: JobEnv,
                    fetch: Callable[[str], str | None] = ecs_task_id) -> str:
    """The attempt's task id, the same in the job and in its sidecar: the launcher's variable, else the
    ECS task id, else (neither: a job run by hand) the job id and attempt number."""
    explicit = environ.get(names.task_id, "").strip()
    if explicit:
        return safe_task_id(explicit)
    uri = environ.get(names.ecs_metadata, "").strip()
    found = fetch(uri) if uri else None
    if found:
        return found
    return safe_task_id(f"{environ.get(names.job_id) or 'local'}-{environ.get(names.attempt) or '1'}")


def job_identity(environ: Mapping[str, str], names: JobEnv, *,
                 fetch: Callable[[str], str | None] = ecs_task_id) -> JobIdentity:
    """The job's identity, with its task id and the instance it runs on (`instance_identity`)."""
    from profiling.probes.disk import ebs_volume_id  # here: the probes package only a profiler needs (issue 43)

    identity = JobIdentity.from_env(environ, names, resolve_task_id(environ, names, fetch))
    scratch_root = Path(environ.get(names.scratch) or names.default_scratch)
    instance_id, instance_type = instance_identity(environ, scratch_root)
    return dataclasses.replace(identity, instance_id=instance_id, instance_type=instance_type,
                               volume_id=ebs_volume_id(scratch_root))


def instance_identity(environ: Mapping[str, str], scratch_root: Path) -> tuple[str, str]:
    """(InstanceId, InstanceType). On a Batch host, from INSTANCE_FILE at the root of the scratch volume, which the
    host's user data writes from IMDS (tuning/host.py): containers cannot reach IMDS themselves, the launch template's
    hop limit being 1 so that no job container gets the instance role's credentials. Elsewhere the host name and
    "local"; "unknown" in a container whose host wrote no file."""
    if not (environ.get("ECS_CONTAINER_METADATA_URI_V4") or environ.get("ECS_CONTAINER_METADATA_URI")):
        return socket.gethostname(), "local"
    try:
        data = json.loads((scratch_root / INSTANCE_FILE).read_text(encoding="utf-8")[:4096])
        instance_id, instance_type = str(data["InstanceId"]), str(data["InstanceType"])
    except (OSError, ValueError, TypeError, KeyError, UnicodeDecodeError):
        return "unknown", "unknown"
    if not (INSTANCE_ID.match(instance_id) and INSTANCE_TYPE.match(instance_type)):
        return "unknown", "unknown"
    return instance_id, instance_type
