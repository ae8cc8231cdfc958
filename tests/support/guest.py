"""What the guest tier runs inside the cgroup v2 guest (tuning/guest): a host prepared by the template's user data,
and Batch children as ECS starts them, a job container and the profiler container beside it.

In the guest each child is two crun containers (podman 4.3, cgroupfs manager): the job with the job definition's
memory limit and vCPUs, and the real `iobatch sidecar` sharing its pid namespace (pidMode task) with the host's
cgroup tree mounted read-only where the job definition mounts it. The containers' root is the guest's own (the
host's `/` with the project's virtualenv) rather than the job image, so no image has to be copied into the guest:
what is checked here is the kernel's side, a container's own cgroup, which the image does not change. podman masks
/sys/dev/block by default where Docker (the ECS agent's runtime) does not: it is unmasked, as on a Batch host.
"""

from __future__ import annotations

import json
import re
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.interface import HOST_CGROUP_MOUNT, PROFILER_CONTAINER, SCRATCH_MOUNT
from profiling.qualification import QUALIFICATION_DIR
from tests.support.synth import cfn_text

REPO = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = """[engine]
runtime = "crun"
cgroup_manager = "cgroupfs"
events_logger = "file"
[containers]
default_ulimits = ["nofile=20000:20000"]
"""

# A job that announces one stage to its profiler and writes MiB inside it: with fsync every byte reaches the device
# within the stage, so the child's own device bytes are known exactly; without, the stage ends once its data is in
# the write cache, as a download's does. It leaves dd's CPU time (user + system, s: the kernel's pacing of its
# writes runs in its context) in WORK/NAME.cpu.
CHILD_JOB = """
import resource, subprocess, sys
from pathlib import Path
from profiling.protocol import StageReporter
sock, target, mib, sync, cpu = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "fsync", Path(sys.argv[5])
reporter = StageReporter(Path(sock), connect_timeout_s=120, ack_timeout_s=120)
with reporter.stage("download"):
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={mib}"] + (["conv=fsync"] if sync else []),
                   check=True, capture_output=True)
used = resource.getrusage(resource.RUSAGE_CHILDREN)
cpu.write_text(f"{used.ru_utime + used.ru_stime:.3f}\\n")
reporter.close()
"""


def template_user_data(template: dict[str, Any]) -> str:
    """The shell script of the launch template's user data (the MIME part CDK base64-encodes)."""
    [launch] = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]

    def scripts(node: Any) -> list[str]:
        if isinstance(node, dict):
            inner = node.get("Fn::Base64")
            # The script names the pipeline's log group and region: a join with references (shown as <Name>).
            try:
                text = cfn_text(inner) if inner is not None else None
            except AssertionError:  # the MIME document around it, which holds more than text and references
                text = None
            if text is not None and text.startswith("#!"):
                return [text]
            if text is not None and (found := re.search(r'boundary="([^"]+)"', text)):
                # The MIME document of text parts (infra/compute.py host_user_data): the shell script's part.
                parts = [p.split("\n\n", 1)[-1] for p in text.split(f"--{found[1]}")]
                return [p.rstrip("\n") + "\n" for p in parts if p.startswith("#!")]
            return [s for v in node.values() for s in scripts(v)]
        if isinstance(node, list):
            return [s for v in node for s in scripts(v)]
        return []

    [script] = scripts(launch["Properties"]["LaunchTemplateData"]["UserData"])
    return script


def job_memory(template: dict[str, Any]) -> dict[str, int]:
    """MEMORY (MiB) of each container of the job definition."""
    [definition] = [r["Properties"] for r in template["Resources"].values()
                    if r["Type"] == "AWS::Batch::JobDefinition"]
    [task] = definition["EcsProperties"]["TaskProperties"]
    return {c["Name"]: int(next(r["Value"] for r in c["ResourceRequirements"] if r["Type"] == "MEMORY"))
            for c in task["Containers"]}


TRACE = "/sys/kernel/tracing"


@dataclass(frozen=True)
class Wave:
    """Children started at once (name -> MiB each writes, with fsync or not), each job container with
    `job_memory_mib`, after the shell lines `before`. With `trace`, the kernel's balance_dirty_pages tracepoint
    (each pause of a writer, with the limit of the domain that paced it) is kept for this wave in WORK/`trace`."""

    children: dict[str, int]
    job_memory_mib: int
    trace: str | None = None
    fsync: bool = True
    before: str = ""


def uptime(what: str) -> str:
    """A line that prints when the guest got to `what` (its uptime, s), for where a slow run spent its time."""
    return f"echo \"== {what} at $(cut -d' ' -f1 /proc/uptime) s\""


def first_wave_started(stream: str, text: str) -> bool:
    """Whether a guest's output (Guest.run's on_output) says children_script's user data are done: its first wave
    started."""
    return stream == "stdout" and "== wave 1 at " in text


def children_script(*, work: Path, user_data: Path, python: str, iobatch: str, waves: Sequence[Wave],
                    profiler_memory_mib: int, host_env: str = "IOBATCH_IMDS=",
                    profiler_env: Mapping[str, str] | None = None) -> str:
    """A bash script for the guest: prepare scratch with the user data (run with the assignments `host_env`: by
    default no IMDS, so the instance file is left out), then each wave in turn: its children (a job container plus
    its profiler each, the profiler with `profiler_env` besides) at once, waited for, with what podman said
    printed. The profiler reads the host's qualification folder read-only, as the job definition binds it (made
    when missing, as Docker makes a bind's missing source)."""
    q = shlex.quote
    conf = work / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    (work / "child_job.py").write_text(CHILD_JOB)
    lines = ["set -u", f"export CONTAINERS_CONF={q(str(conf))}",
             f"{host_env} bash {q(str(user_data))} || {{ echo 'user data failed' >&2; exit 1; }}",
             "mkdir -p /run/rootfs && mount --bind / /run/rootfs", f"mkdir -p {QUALIFICATION_DIR}"]
    extra = [arg for key, value in (profiler_env or {}).items() for arg in ("--env", f"{key}={value}")]
    common = ["--network", "host", "--security-opt", "unmask=/sys/dev/block",
              "--volume", f"{SCRATCH_MOUNT}:{SCRATCH_MOUNT}", "--volume", f"{work}:{work}"]
    for number, wave in enumerate(waves, 1):
        lines += [uptime(f"wave {number}")] + ([wave.before] if wave.before else [])
        if wave.trace:
            lines += [f"echo 8192 > {TRACE}/buffer_size_kb", f"echo > {TRACE}/trace",
                      f"echo 1 > {TRACE}/events/writeback/balance_dirty_pages/enable"]
        for name, mib in wave.children.items():
            task = f"{SCRATCH_MOUNT}/task-{name}"
            sock = f"{task}/profiler.sock"
            job = ["podman", "run", "--detach", "--name", f"{name}-job", "--memory", f"{wave.job_memory_mib}m",
                   "--cpus", "1", *common, "--env", f"PYTHONPATH={REPO}", "--rootfs", "/run/rootfs",
                   python, str(work / "child_job.py"), sock, f"{task}/data", str(mib), "fsync" if wave.fsync else "-",
                   str(work / f"{name}.cpu")]
            profiler = ["podman", "run", "--detach", "--name", f"{name}-{PROFILER_CONTAINER}",
                        "--memory", f"{profiler_memory_mib}m", "--pid", f"container:{name}-job", *common,
                        "--volume", f"/sys/fs/cgroup:{HOST_CGROUP_MOUNT}:ro",
                        "--volume", f"{QUALIFICATION_DIR}:{QUALIFICATION_DIR}:ro", *extra, "--rootfs", "/run/rootfs",
                        iobatch, "sidecar", "--socket", sock, "--scratch-dir", task, "--interval", "0.2",
                        "--no-call-probes", "--emf", str(work / f"{name}.emf"), "--profile-out",
                        str(work / f"{name}.jsonl")]
            lines += [f"mkdir -p {task}", " ".join(map(q, job)), " ".join(map(q, profiler))]
        names = [f"{n}-job" for n in wave.children] + [f"{n}-{PROFILER_CONTAINER}" for n in wave.children]
        lines += [f"podman wait {' '.join(names)}", uptime(f"wave {number} done")]
        lines += [f"echo '== {n}'; podman logs {n} 2>&1" for n in names]
        if wave.trace:
            lines += [f"echo 0 > {TRACE}/events/writeback/balance_dirty_pages/enable",
                      f"grep balance_dirty_pages {TRACE}/trace > {q(str(work / wave.trace))}"]
    return "\n".join(lines) + "\n"


def dirty_events(trace: Path, comm: str = "dd") -> list[dict[str, int]]:
    """The balance_dirty_pages events of a task named `comm` in a trace, in order, each its `name=number` fields
    (include/trace/events/writeback.h: limit, setpoint, dirty, dirty_ratelimit, pause, ...)."""
    events = []
    for line in trace.read_text().splitlines():
        fields = {k: int(v) for k, v in re.findall(r" (\w+)=(-?\d+)", line)}
        if line.strip().split(" ", 1)[0].rsplit("-", 1)[0] == comm and "pause" in fields:
            events.append(fields)
    return events


def pause_freeruns(trace: Path, comm: str = "dd") -> list[int]:
    """The freerun point (pages) of the domain that paced each balance_dirty_pages pause of a task named `comm`.

    The tracepoint (include/trace/events/writeback.h, Linux 6.1) prints `limit` as the host domain's dirty limit
    whichever domain paced the writer, and `setpoint` as (that limit + freerun) / 2 with freerun = (thresh +
    bg_thresh) / 2 of the pacing domain: so 2 x setpoint - limit is the pacing domain's freerun point."""
    return [2 * e["setpoint"] - e["limit"] for e in dirty_events(trace, comm)]


def pause_seconds(trace: Path, comm: str = "dd") -> float:
    """The time a task named `comm` slept in balance_dirty_pages: the sum of the tracepoint's `pause` (ms; 6.1
    prints it with jiffies_to_msecs) over its events that paused (a pause <= 0 does not sleep)."""
    return sum(e["pause"] for e in dirty_events(trace, comm) if e["pause"] > 0) / 1000


@dataclass(frozen=True)
class Pacing:
    """What a writer's balance_dirty_pages events say from its first pause on: the pacing domain's dirty count
    (`dirty`, pages: its dirty and writeback pages) and the writeback context's dirty_ratelimit (KiB/s)."""

    dirty_mib: tuple[float, float]  # median, highest
    ratelimit_mibps: tuple[float, float]  # first, last


def pacing(trace: Path, comm: str = "dd") -> Pacing | None:
    """The writer's Pacing from a balance_dirty_pages trace; None when it was never paused."""
    events = dirty_events(trace, comm)
    first = next((i for i, e in enumerate(events) if e["pause"] > 0), None)
    if first is None:
        return None
    dirty = [e["dirty"] * 4096 / (1 << 20) for e in events[first:]]
    return Pacing((statistics.median(dirty), max(dirty)), (events[first]["dirty_ratelimit"] / 1024,
                                             events[-1]["dirty_ratelimit"] / 1024))


def stage_profiles(path: Path) -> list[dict[str, Any]]:
    """The profiles a sidecar wrote (one JSON object per line)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
