"""A packed Batch host in the cgroup v2 guest, and the advisor's closed loop on a child its container paces: booted
once by the guest tier (tests/guest/test_v2_host.py), and once a round by `python -m bench.guest_packed`.

One boot, one throttled scratch volume (st1 500 GiB at its baseline, `sequential_st1`) prepared by the template's
user data, three waves of Batch children (tests/support/guest.py), each a job container with a memory limit and the
real sidecar:

1. two children at once with the job definition's memory (at most 768 MiB: the guest has 2 GiB), writing with fsync;
2. one child downloading 240 MiB (no fsync: its stage ends once its data is in the write cache) in a 256 MiB
   container under the stack's settings: its own domain (dirty_ratio 30 of its memory, ~70 MiB) is far tighter
   than the host's (~530 MiB);
3. the same child under the host sysctls `iobatch advise --json` gave for wave 2's profile, run on this machine
   while the guest waits (the guest touches WORK/default-done, applies WORK/advised.sh once it is there).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.interface import JOB_CONTAINER, PROFILER_CONTAINER, SCRATCH_MOUNT
from profiling import runfiles
from tests.support.guest import Wave, children_script, job_memory, pause_seconds, template_user_data
from tests.support.synth import synthesize
from tuning.advise import range_ends
from tuning.cachedomain import Domains, domains
from tuning.ebs import MIB, Volume
from tuning.guest.machine import Guest, GuestResult
from tuning.guest.qemu import ScratchDisk, Throttle, scratch_throttle
from tuning.host import HostTuning, sysctl_path
from tuning.plan import Workload, workload_from_profiles
from tuning.simulator import simulate
from tuning.writecache import WriteCache

ST1 = Volume("st1", 500)
GUEST_MEMORY_MIB = 2048
BOOT_TIMEOUT = 420  # a boot and three waves on two busy cores under TCG (measured: 126 s on two idle ones)
WRITTEN = {"child-a": 24, "child-b": 72}  # wave 1: MiB, with fsync inside the stage
SMALL_MIB, SMALL_MEMORY_MIB = 240, 256  # waves 2 and 3
# The advisor's plan for that child: the guest's memory, one child at a time, the st1 volume the guest emulates,
# and a write-cache budget of 70 % of memory (the default's 40 % would give a 256 MiB child only 1.4x its room now).
ADVISE = ["--memory-gib", str(GUEST_MEMORY_MIB / 1024), "--jobs-per-instance", "1", "--job-memory-gib",
          str(SMALL_MEMORY_MIB / 1024), "--volume", f"{ST1.kind}:{ST1.size_gib}", "--jobs-per-day", "100",
          "--cache-budget-pct", "70", "--json"]
ADVISE_WAIT_S = 180
# The two runs of the small child: its profile and its writer's balance_dirty_pages trace (WORK/...).
RUNS = {"default": ("small.jsonl", "pauses.trace"), "advised": ("advised.jsonl", "advised.trace")}


@dataclass(frozen=True)
class PackedHost:
    result: GuestResult
    work: Path
    advice: dict[str, Any] | None  # `iobatch advise --json` on the small child's default run, as applied


def scratch_image(folder: Path, gib: int = 1) -> Path:
    image = folder / "scratch.img"
    with image.open("wb") as stream:
        stream.truncate(gib << 30)  # sparse
    return image


def sequential_st1() -> Throttle:
    """st1 at its baseline for sequential writeback, as the advisor models these children (no random I/O): bytes
    only. EBS merges sequential I/O into 1 MiB units; QEMU's `iops-size` cannot tell sequential from random and
    would charge every writeback bio under 1 MiB as a whole one, and its whole-number IOPS limit is 19 a second for
    st1 500 GiB's 19.5 MiB/s. The guest tier checks that charge for small random I/O on a disk of its own, in its
    first boot (tests/support/firstboot.py).
    """
    return dataclasses.replace(scratch_throttle(ST1, credits_mib=0), io_unit=None)


def _advise_when_asked(work: Path, iobatch: str, stop: threading.Event) -> None:
    """Once the guest's default wave is done: `iobatch advise` its child's profile and hand the guest the host
    sysctls of the advice (WORK/advised.sh, whole or not there; on a failure, a script that says why)."""
    while not (work / "default-done").exists():
        if stop.wait(0.5):
            return
    try:
        done = subprocess.run([iobatch, "advise", str(work / RUNS["default"][0]), *ADVISE], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "iobatch advise did not finish within 120 s")
    (work / "advice.json").write_text(done.stdout)
    if done.returncode != 0:
        lines = [f"echo {shlex.quote('advise failed: ' + done.stderr[-300:])} >&2", "exit 1"]
    else:
        tuning = HostTuning.from_context(json.loads(done.stdout)["cdk_context"])
        lines = [f"echo {value} > {sysctl_path(key)}" for key, value in tuning.sysctls().items()]
    (work / "advised.tmp").write_text("\n".join(lines) + "\n")
    (work / "advised.tmp").rename(work / "advised.sh")


def boot_packed_host(work: Path) -> PackedHost:
    """Boot the guest and run the three waves (see the module); what they left is in `work`."""
    template = synthesize().template
    user_data = work / "user-data.sh"
    user_data.write_text(template_user_data(template))
    memory = job_memory(template)
    iobatch = str(Path(sys.executable).with_name("iobatch"))
    wait = (f"touch {work}/default-done; for i in $(seq {ADVISE_WAIT_S * 2}); do [ -e {work}/advised.sh ] && break; "
            f"sleep 0.5; done; . {work}/advised.sh || exit 1; rm -f {SCRATCH_MOUNT}/task-small/data; sync")
    waves = [Wave(WRITTEN, min(memory[JOB_CONTAINER], 768)),
             Wave({"small": SMALL_MIB}, SMALL_MEMORY_MIB, trace=RUNS["default"][1], fsync=False),
             Wave({"advised": SMALL_MIB}, SMALL_MEMORY_MIB, trace=RUNS["advised"][1], fsync=False, before=wait)]
    script = children_script(work=work, user_data=user_data, python=sys.executable, iobatch=iobatch, waves=waves,
                             profiler_memory_mib=memory[PROFILER_CONTAINER])
    disk = ScratchDisk(scratch_image(work), sequential_st1())
    stop = threading.Event()
    adviser = threading.Thread(target=_advise_when_asked, args=(work, iobatch, stop), daemon=True)
    adviser.start()
    try:
        with Guest(vcpus=2, memory_mib=GUEST_MEMORY_MIB, share=work, scratch=disk) as guest:
            result = guest.run(script, timeout=BOOT_TIMEOUT)
    finally:
        stop.set()
        adviser.join(timeout=130)
    advice = work / "advice.json"
    return PackedHost(result, work, json.loads(advice.read_text()) if advice.is_file() and advice.stat().st_size
                      else None)


@dataclass(frozen=True)
class LoopRun:
    """One run of the small child: what the advisor's model predicted before it ran, and what it measured."""

    run: str  # "default" or "advised"
    model: Domains  # the write caches the advisor models for the child under the run's settings
    floor_s: float  # the workload's floor (the default run's time not waiting on the volume), as the advisor takes it
    pause_s: float  # predicted time paused in the download stage (the settled controller's)
    slept_s: float  # the kernel's: the sum of the writer's balance_dirty_pages pauses (the tracepoint's)
    stage_s: float  # predicted download stage
    measured_s: float  # the profile's
    own_limit_bytes: int | None  # the child's own dirty threshold, as the profiler read it
    # The predicted range, (optimistic, pessimistic), as the advice and the lab give it: the child's new writeback
    # context (Domains.optimistic) to writers held at the freerun point (tuning.writecache).
    pause_range: tuple[float, float] = (0.0, 0.0)
    stage_range: tuple[float, float] = (0.0, 0.0)
    cpu_s: float | None = None  # the writer's CPU time in the stage (tests.support.guest.CHILD_JOB); None: not left

    @property
    def modelled_limit_bytes(self) -> int:
        return self.model.child_limit_bytes

    @property
    def unpaused_s(self) -> float:
        """The run's own time not paused (its stage less the kernel's pauses): the floor it had."""
        return self.measured_s - self.slept_s


def predicted(workload: Workload, cache: WriteCache) -> tuple[float, float]:
    """The simulator's pause and download stage for one child under `cache` (at st1's baseline, as the guest)."""
    [load] = workload.stages
    [wave] = simulate(ST1, workload.stages, cache=cache, baseline_only=True).waves
    return wave.stage_s[load.name] - load.floor_s, wave.stage_s[load.name]


def closed_loop(host: PackedHost) -> list[LoopRun]:
    """The advisor's workload from the default run's profile (tuning.plan: its bytes, and its floor, the stage less
    its own io stall: in-sample for the default run, as the lab loop's first run), replayed against the write cache
    the advisor models for the child before each run (tuning.cachedomain: its container's domain under the stack's
    settings, then under the advice's host sysctls, which reach it in proportion to its memory), under the settled
    controller and the two ends of the range the advice gives."""
    assert host.advice is not None, "the advisor gave no advice: " + host.result.stderr[-2000:]
    profiles = {run: next(runfiles.read_profiles(host.work / name)) for run, (name, _) in RUNS.items()}
    workload = workload_from_profiles([profiles["default"]])
    [load] = workload.stages
    tunings = {"default": HostTuning(), "advised": HostTuning.from_context(host.advice["cdk_context"])}
    out = []
    for run, (name, trace) in RUNS.items():
        model = domains(tunings[run], GUEST_MEMORY_MIB * MIB, SMALL_MEMORY_MIB * MIB, 1)
        (pause, stage), low, high = (predicted(workload, c) for c in (model.effective, model.optimistic,
                                                                      model.effective.held()))
        profile, cpu = profiles[run], _cpu_seconds(host.work / Path(name).with_suffix(".cpu"))
        out.append(LoopRun(run, model, load.floor_s, pause, pause_seconds(host.work / trace), stage,
                           profile.duration_s, profile.own_dirty_threshold_bytes, range_ends(low[0], pause, high[0]),
                           range_ends(low[1], stage, high[1]), cpu))
    return out


def _cpu_seconds(path: Path) -> float | None:
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None
