"""Who the profiled job is: the properties every profile and EMF document carries, and where it works.

The profiler reads the job's own environment, but the names of its variables and its scratch layout
belong to the job's interface, which profiling never imports: the caller passes them in as a `JobEnv`.
The profiler does not need the job's S3 settings, so nothing here fails for a variable that is
missing or malformed: it falls back to a default.
"""

from __future__ import annotations

import dataclasses
import socket
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from profiling.protocol import SOCKET_NAME

IMDS_URL = "http://169.254.169.254/latest"
IMDS_TIMEOUT_S = 0.5


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
    child_dir: Callable[[int], str]  # a child's scratch subdirectory, from its global index


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

    @classmethod
    def from_env(cls, environ: Mapping[str, str], names: JobEnv) -> JobIdentity:
        """The identity in `environ` (pure: the instance is left unknown, see `job_identity`)."""
        index = _whole(environ.get(names.array_index))
        offset = _whole(environ.get(names.array_offset))
        array_index = index + offset if index is not None and offset is not None else 0
        work_dir = Path(environ.get(names.scratch) or names.default_scratch) / names.child_dir(array_index)
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
        return {"Pipeline": self.pipeline, "JobId": self.job_id, "ArrayIndex": str(self.array_index),
                "InstanceId": self.instance_id, "InstanceType": self.instance_type, "VolumeType": self.volume_type}


def _whole(raw: str | None) -> int | None:
    """A whole number >= 0 (unset or empty: 0), or None when `raw` is not one."""
    if raw is None or raw == "":
        return 0
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value >= 0 else None


def job_identity(environ: Mapping[str, str], names: JobEnv, *, base_url: str = IMDS_URL) -> JobIdentity:
    """The job's identity, with the instance it runs on (`instance_identity`)."""
    instance_id, instance_type = instance_identity(environ, base_url=base_url)
    return dataclasses.replace(JobIdentity.from_env(environ, names), instance_id=instance_id,
                               instance_type=instance_type)


def _imds_get(base_url: str, path: str, token: str) -> str:
    request = urllib.request.Request(f"{base_url}/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
        return str(response.read().decode())


def instance_identity(environ: Mapping[str, str], *, base_url: str = IMDS_URL) -> tuple[str, str]:
    """(InstanceId, InstanceType). In an ECS/Batch container, from IMDSv2 with a short timeout (the
    launch template must allow a hop limit of 2 for bridge-mode containers); elsewhere the host name
    and "local"."""
    if not (environ.get("ECS_CONTAINER_METADATA_URI_V4") or environ.get("ECS_CONTAINER_METADATA_URI")):
        return socket.gethostname(), "local"
    try:
        request = urllib.request.Request(f"{base_url}/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
            token = response.read().decode()
        return (_imds_get(base_url, "meta-data/instance-id", token),
                _imds_get(base_url, "meta-data/instance-type", token))
    except (OSError, ValueError):
        return "unknown", "unknown"
