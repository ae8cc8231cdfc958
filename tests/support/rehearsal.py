"""A Batch task of the synthesized job definition, run on this machine with podman: one pod per task.

What is taken from the template: the containers (name, image where it names one, command, environment, mount
points, essential, dependsOn, privileged, user), the task's pidMode (`task`: the pod shares one pid namespace)
and its host volume (the host path becomes a directory given per "host"). What Batch and ECS add is added as
they do: the Batch variables (AWS_BATCH_JOB_ID "<array job id>:<index>", AWS_BATCH_JOB_ATTEMPT,
AWS_BATCH_JQ_NAME; the array index only in the job container, the one Batch documents it for), the submit
override of both containers, and ECS_CONTAINER_METADATA_URI_V4, served by a stand-in for the ECS agent's task
metadata endpoint that answers each task's own TaskARN. The AWS credentials and S3 endpoint stand in for the
task role. When the essential container exits, the others are stopped with SIGTERM, as ECS stops a task.

podman runs with runc and explicit ulimits (crun fails on this machine's hybrid cgroups), from a containers.conf
of our own passed as CONTAINERS_CONF, never the machine's; images are never pulled.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pipeline.interface import ENV, JOB_CONTAINER, SCRATCH_MOUNT
from profiling.qualification import QUALIFICATION_DIR

REGION = "us-east-1"
CONTAINERS_CONF = """[engine]
runtime = "runc"
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
"""


def _value(node: Any) -> str:
    """An environment value of the template: a string, or the region where CloudFormation puts its own."""
    if isinstance(node, str):
        return node
    if node == {"Ref": "AWS::Region"}:
        return REGION
    raise AssertionError(f"an environment value the rehearsal cannot resolve: {node!r}")


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str | None  # the template's image when it names one (jobImage), None for the stack's own asset
    command: tuple[str, ...]
    environment: dict[str, str]
    mounts: dict[str, tuple[str, bool]]  # container path -> (the task's volume name, read-only)
    essential: bool
    depends_on: tuple[tuple[str, str], ...]  # (container, condition)
    privileged: bool = False
    user: str | None = None  # the image's own user when None


@dataclass(frozen=True)
class TaskSpec:
    """The job definition's task, as the template says it."""

    containers: tuple[ContainerSpec, ...]
    pid_mode: str
    volumes: dict[str, str]  # volume name -> host path
    timeout_s: int

    @classmethod
    def from_template(cls, template: Mapping[str, Any]) -> TaskSpec:
        [definition] = [r["Properties"] for r in template["Resources"].values()
                        if r["Type"] == "AWS::Batch::JobDefinition"]
        [task] = definition["EcsProperties"]["TaskProperties"]
        containers = tuple(ContainerSpec(
            name=c["Name"], image=c["Image"] if isinstance(c["Image"], str) else None, command=tuple(c["Command"]),
            environment={e["Name"]: _value(e["Value"]) for e in c.get("Environment", [])},
            mounts={m["ContainerPath"]: (m["SourceVolume"], bool(m.get("ReadOnly", False)))
                    for m in c.get("MountPoints", [])},
            essential=c.get("Essential", True),
            depends_on=tuple((d["ContainerName"], d["Condition"]) for d in c.get("DependsOn", [])),
            privileged=bool(c.get("Privileged", False)), user=c.get("User"),
        ) for c in task["Containers"])
        volumes = {v["Name"]: v["Host"]["SourcePath"] for v in task.get("Volumes", [])}
        return cls(containers, task.get("PidMode", ""), volumes, int(definition["Timeout"]["AttemptDurationSeconds"]))

    def start_order(self) -> list[ContainerSpec]:
        """Containers in dependsOn order (a container after those it depends on)."""
        done: list[ContainerSpec] = []
        pending = list(self.containers)
        while pending:
            ready = [c for c in pending if all(d in {x.name for x in done} for d, _ in c.depends_on)]
            assert ready, f"a dependsOn cycle among {[c.name for c in pending]}"
            done.append(ready[0])
            pending.remove(ready[0])
        return done


class MetadataEndpoint:
    """The ECS agent's task metadata endpoint v4, for many tasks: GET /v4/<task>/<container>/task."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                parts = self.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "v4" or parts[3] != "task":
                    self.send_error(404)
                    return
                body = json.dumps({"Cluster": "iobatch", "TaskARN":
                                   f"arn:aws:ecs:{REGION}:123456789012:task/iobatch/{parts[1]}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def uri(self, task: str, container: str) -> str:
        return f"http://127.0.0.1:{self._server.server_port}/v4/{task}/{container}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Task:
    """One running task: its pod, containers, and what came of it."""

    task_id: str
    pod: str
    names: dict[str, str]  # container name -> podman container name
    env: dict[str, str]  # podman's environment (CONTAINERS_CONF)
    exit_codes: dict[str, int] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=self.env,
                              check=False)

    def log(self, container: str) -> str:
        return self.podman("logs", self.names[container]).stdout

    def wait_for_log(self, container: str, text: str, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log(container):
                return True
            time.sleep(0.2)
        return False

    def signal(self, container: str, sig: str) -> None:
        self.podman("kill", "--signal", sig, self.names[container])

    def finish(self, spec: TaskSpec, timeout: float = 300) -> dict[str, int]:
        """Wait for the essential container, stop the others as ECS does, keep exit codes and logs, remove."""
        try:
            for container in spec.containers:
                if container.essential:
                    waited = self.podman("wait", self.names[container.name], timeout=timeout)
                    self.exit_codes[container.name] = int(waited.stdout.strip().splitlines()[-1])
            for container in spec.containers:
                if not container.essential:
                    self.podman("stop", "--time", "10", self.names[container.name])
                    waited = self.podman("wait", self.names[container.name])
                    self.exit_codes[container.name] = int(waited.stdout.strip().splitlines()[-1])
            for name in self.names:
                self.logs[name] = self.podman("logs", self.names[name]).stdout + \
                    self.podman("logs", self.names[name]).stderr
        finally:
            self.podman("pod", "rm", "--force", self.pod)
        return self.exit_codes


def qualification_dir(scratch: Path) -> Path:
    """A rehearsal host's stand-in for QUALIFICATION_DIR, beside its scratch directory (made when missing)."""
    folder = scratch.parent / f"{scratch.name}-qualification"
    folder.mkdir(exist_ok=True)
    return folder


class Host:
    """A Batch host on this machine: its scratch directory and the tasks it runs. `image` is the stack's own
    image (the asset `cdk deploy` builds), run where the template does not name one (jobImage)."""

    def __init__(self, spec: TaskSpec, image: str, scratch: Path, metadata: MetadataEndpoint, conf: Path,
                 credentials: Mapping[str, str]) -> None:
        self.spec, self.image, self.scratch, self.metadata = spec, image, scratch, metadata
        self.podman_env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        self.credentials = dict(credentials)

    def start(self, *, array_job: str, index: int, attempt: int, override: Mapping[str, str],
              s3_endpoint: str) -> Task:
        """Start one array child's task: the containers in dependsOn order, with Batch's environment."""
        task_id = uuid.uuid4().hex
        pod = f"iobatch-rehearsal-{task_id[:12]}"
        task = Task(task_id, pod, {}, self.podman_env)
        # pidMode "task": the containers of the task share one pid namespace, as a pod's do.
        assert self.spec.pid_mode == "task", self.spec.pid_mode
        made = task.podman("pod", "create", "--share", "pid", "--name", pod)
        assert made.returncode == 0, made.stderr
        for container in self.spec.start_order():
            env = {**container.environment, **override, **self.credentials,
                   ENV.S3_ENDPOINT: s3_endpoint, ENV.JOB_ID: f"{array_job}:{index}", ENV.ATTEMPT: str(attempt),
                   ENV.QUEUE: "iobatch-queue", ENV.ECS_METADATA: self.metadata.uri(task_id, container.name)}
            if container.name == JOB_CONTAINER:
                env[ENV.ARRAY_INDEX] = str(index)
            name = f"{pod}-{container.name}"
            args = ["run", "--detach", "--pull=never", "--pod", pod, "--name", name, "--network", "host",
                    *(["--privileged"] if container.privileged else []),
                    *(["--user", container.user] if container.user is not None else [])]
            for path, (volume, read_only) in container.mounts.items():
                # The host's scratch and its qualification's folder are this rehearsal host's directories; any other
                # host path (the cgroup tree the profiler reads) is this machine's own, as a Batch host would give it.
                source = self.spec.volumes[volume]
                host_path = self.scratch if source == SCRATCH_MOUNT else qualification_dir(self.scratch) \
                    if source == QUALIFICATION_DIR else Path(source)
                args += ["--volume", f"{host_path}:{path}{':ro' if read_only else ''}"]
            for key, value in env.items():
                args += ["--env", f"{key}={value}"]
            started = task.podman(*args, container.image or self.image, *container.command)
            assert started.returncode == 0, started.stderr
            task.names[container.name] = name
        return task


@contextmanager
def rehearsal_podman(tmp_path: Path) -> Iterator[Path]:
    """Our containers.conf (runc, explicit ulimits); every pod the rehearsal made is removed on the way out."""
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    try:
        yield conf
    finally:
        env = {**os.environ, "CONTAINERS_CONF": str(conf)}
        listed = subprocess.run(["podman", "pod", "ps", "--format", "{{.Name}}"], capture_output=True, text=True,
                                env=env, check=False).stdout.split()
        for pod in (p for p in listed if p.startswith("iobatch-rehearsal-")):
            subprocess.run(["podman", "pod", "rm", "--force", pod], capture_output=True, env=env, check=False)


def emf_documents(log: str) -> list[dict[str, Any]]:
    """The EMF documents the profiler printed (stdout lines with an `_aws` key)."""
    docs = []
    for line in log.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            docs.append(json.loads(line))
    return docs
