"""A Batch host in the cgroup v2 guest that qualifies its scratch at boot: the template's user data on a virtio disk
throttled from tuning.ebs.Volume, IMDS and CloudWatch Logs stood in for on this machine (tests/support/hoststandin.py),
then one Batch child (a job container and the real sidecar, tests/support/guest.py) whose profile carries the host's
qualification. With `fence`, the user data of a stack deployed with hostQualification=fence runs once more after the
child, with systemctl and shutdown recorded (the guest has no systemd and no ECS agent): a slow host fails its setup
with the reason, as a Batch host would, and the guest then powers off.

The guest reaches this machine at 10.0.2.2 (QEMU's user network): IMDS is asked there; the poster sends to Logs only
on a loopback address (tuning/hostpost.py), so a relay in the guest forwards its 127.0.0.1:PORT to 10.0.2.2:PORT.
Booted by the guest tier (tests/guest/test_qualification.py) and by `make bench` (bench/qualify_cost.py).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.interface import JOB_CONTAINER, PROFILER_CONTAINER
from profiling.qualification import QUALIFICATION_FILE
from tests.support.guest import Wave, children_script, job_memory, template_user_data
from tests.support.hoststandin import HostWorld, host_stand_in
from tests.support.packedhost import scratch_image
from tests.support.synth import synthesize
from tuning.ebs import MIB, Volume
from tuning.guest.machine import Guest, GuestResult
from tuning.guest.qemu import HOST_ADDRESS, ScratchDisk, Throttle, scratch_throttle

ST1 = Volume("st1", 500)
SLOW_FACTOR = 30
CHILD_MIB = 16
GUEST_MEMORY_MIB = 2048
BOOT_TIMEOUT = 480  # a boot, mkfs, ten seconds of qualification, a child in containers, once more with fence
RELAY = """
import socket, sys, threading
port = int(sys.argv[1])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(16)
def pipe(a, b):
    try:
        while True:
            data = a.recv(65536)
            if not data:
                break
            b.sendall(data)
    except OSError:
        pass
    for s in (a, b):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
def serve(client):
    upstream = socket.create_connection((sys.argv[2], port))
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    pipe(upstream, client)
while True:
    client, _ = server.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
"""
RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> {log}
exit 0
"""


def nominal_throttle() -> Throttle:
    """st1 500 GiB with a new volume's full bucket: its burst (122 MiB/s) for over an hour, bytes only (a 1 MiB
    sequential I/O is one unit at EBS, and virtio may split it; tests/support/packedhost.sequential_st1 says why)."""
    return dataclasses.replace(scratch_throttle(ST1), io_unit=None)


def slow_throttle() -> Throttle:
    """The same at 1/SLOW_FACTOR of its rates: a bad apple of the kind the study found (30x slower)."""
    nominal = nominal_throttle()
    return Throttle(nominal.baseline_bps // SLOW_FACTOR, nominal.burst_bps // SLOW_FACTOR, nominal.burst_seconds,
                    None)


@dataclass(frozen=True)
class QualifiedHost:
    result: GuestResult
    work: Path
    world: HostWorld  # what IMDS served and what Logs received
    throttle_mibps: float  # the disk's rate while its bucket lasts
    record: dict[str, Any]  # the qualification file the flag run wrote
    child: str  # the child's profile (WORK/<child>.jsonl)
    fence_rc: int | None = None  # the fence run's user data exit code (None: not run)
    fence_record: dict[str, Any] | None = None
    fence_calls: tuple[str, ...] = ()  # systemctl and shutdown as the fence run called them


def _read_json(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def boot_qualified_host(work: Path, throttle: Throttle, instance_id: str, *, fence: bool = False,
                        on_output: Callable[[str, str], None] | None = None) -> QualifiedHost:
    """Boot the guest as one host (see the module); what it left is in `work`. `on_output`: Guest.run's."""
    template = synthesize().template
    (work / "user-data.sh").write_text(template_user_data(template))
    if fence:
        (work / "user-data-fence.sh").write_text(template_user_data(synthesize(hostQualification="fence").template))
    (work / "relay.py").write_text(RELAY)
    stubs = work / "stubs"
    stubs.mkdir(exist_ok=True)
    for tool in ("systemctl", "shutdown"):
        (stubs / tool).write_text(RECORDER.format(log=work / "fence-calls.log"))
        (stubs / tool).chmod(0o755)
    world = HostWorld(instance_id=instance_id)
    memory = job_memory(template)
    child = "child"
    q = shlex.quote
    with host_stand_in(world) as base:
        port = urllib.parse.urlsplit(base).port
        imds = f"http://{HOST_ADDRESS}:{port}"
        host_env = f"IOBATCH_IMDS={imds} IOBATCH_LOGS_ENDPOINT=http://127.0.0.1:{port}/"
        script = children_script(
            work=work, user_data=work / "user-data.sh", python=sys.executable,
            iobatch=str(Path(sys.executable).with_name("iobatch")),
            waves=[Wave({child: CHILD_MIB}, min(memory[JOB_CONTAINER], 768))],
            profiler_memory_mib=memory[PROFILER_CONTAINER], host_env=host_env,
            # The profiler reads the instance file as in ECS (profiling.identity), its task id given.
            profiler_env={"ECS_CONTAINER_METADATA_URI_V4": "http://127.0.0.1:9/v4", "IOBATCH_TASK_ID": child})
        relay = f"{q(sys.executable)} {q(str(work / 'relay.py'))} {port} {HOST_ADDRESS} &"
        after = [f"cp {QUALIFICATION_FILE} {q(str(work / 'qualification.json'))}"]
        if fence:
            after += [f"PATH={q(str(stubs))}:$PATH {host_env} bash {q(str(work / 'user-data-fence.sh'))} "
                      f"> {q(str(work / 'fence.out'))} 2>&1; echo $? > {q(str(work / 'fence.rc'))}",
                      f"cp {QUALIFICATION_FILE} {q(str(work / 'qualification-fence.json'))}"]
        with Guest(vcpus=2, memory_mib=GUEST_MEMORY_MIB, share=work,
                   scratch=ScratchDisk(scratch_image(work, gib=2), throttle)) as guest:
            result = guest.run("\n".join([relay, script, *after]), timeout=BOOT_TIMEOUT, on_output=on_output)
    rc = (work / "fence.rc").read_text().strip() if (work / "fence.rc").exists() else ""
    calls = (work / "fence-calls.log").read_text().splitlines() if (work / "fence-calls.log").exists() else []
    return QualifiedHost(result, work, world, throttle.burst_bps / MIB, _read_json(work / "qualification.json"),
                         child, int(rc) if rc.isdigit() else None,
                         _read_json(work / "qualification-fence.json") if fence else None, tuple(calls))


def child_profile(host: QualifiedHost) -> Path:
    return host.work / f"{host.child}.jsonl"
