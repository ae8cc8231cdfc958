"""What the advisor is told: the plan (jobs per instance, memory, jobs per day), the measured workload and
the candidate volumes; and AdviseError for input it cannot use. Pure.

The workload is the median child's load per stage: its bytes to and from the volume, its block I/O size and
the time the stage needs when the volume is not what it waits on (its duration minus PSI io stall).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from profiling.metrics import STAGES, StageProfile, median
from profiling.numbers import number, whole_number
from tuning.ebs import GIB, MIB, Volume, VolumeError
from tuning.host import HostTuning
from tuning.instances import CHILDREN_PER_HOST_KEY, INSTANCE_TYPES_KEY, children_per_host, lookup
from tuning.instancestore import parse_store
from tuning.simulator import StageLoad

# Default share of instance memory the write cache may hold (the jobs need the rest).
DEFAULT_CACHE_BUDGET_PCT = 40.0
# A stage's floor (time not spent waiting on the volume) is never taken below this share of its duration
# when the wait comes from the host's io stall (host-wide, so it may include other tenants' waits): _floor.
MIN_FLOOR_SHARE = 0.1
# A measured random share counts only from a stage that moved this much on the device: the share is the
# device's (other children's requests included), and a few requests say nothing of a stage's pattern.
MIN_SHARE_DEVICE_BYTES = 16 * MIB
SECONDS_PER_DAY = 86_400
# A candidate naming instance store: nvme:INSTANCE_TYPE (or instance-store:INSTANCE_TYPE).
STORE_WORDS = ("nvme", "instance-store")


class AdviseError(ValueError):
    """Input the advisor cannot use; the message names the input and the fix."""


@dataclass(frozen=True)
class Plan:
    """What the user intends to run on each instance."""

    jobs_per_instance: int
    memory_gib: float
    jobs_per_day: int  # per instance: each instance has its own scratch volume
    # Each child's memory limit (the job container's MEMORY, tuning.instances.job_memory_mib): its own write cache is
    # the dirty ratio of it (tuning.cachedomain). None: the children have no memory limit (the host's cache only).
    job_memory_gib: float | None = None
    instance_type: str | None = None  # the instance type the plan's figures came from, when one
    # The stack's vcpusPerJob, when known: with instance_type, how many jobs its host runs at once (validate).
    vcpus_per_job: int | None = None
    instance_ebs_mibps: float | None = None
    kernel_release: str | None = None
    cache_budget_pct: float = DEFAULT_CACHE_BUDGET_PCT
    io_size_kib: int | None = None  # overrides the measured block I/O size
    # The share of device bytes in random requests (HDD accounting); None: the profiles' (workload_from_profiles).
    random_pct: float | None = None
    instance_usd_per_hour: float = 0.384  # prices a child's lost seconds (m6i.2xlarge us-east-1 on demand)
    instance_network_mibps: float | None = None  # the instance's network bandwidth, when known
    # The S3 endpoint was on this host (loopback): the transfer stages crossed no network, so no network finding.
    network_loopback: bool = False
    # Where the plan came from, in words, when it was not all given (e.g. "this machine, back to back all day").
    assumed: str = ""
    # What the stack runs now (its defaults unless told): the findings judge these.
    current_volume: Volume = field(default_factory=Volume)
    current_tuning: HostTuning = field(default_factory=HostTuning)

    def validate(self) -> None:
        if self.jobs_per_instance < 1:
            raise AdviseError(f"jobs per instance {self.jobs_per_instance} must be at least 1")
        if not self.memory_gib > 0:
            raise AdviseError(f"instance memory {self.memory_gib} GiB must be positive, e.g. --memory-gib 16")
        if self.job_memory_gib is not None and not 0 < self.job_memory_gib <= self.memory_gib:
            # A fix within the instance: its memory shared by its jobs (never the value refused).
            share = max(0.25, math.floor(self.memory_gib / max(1, self.jobs_per_instance) * 4) / 4)
            whose = f"its memory shared by its {self.jobs_per_instance} jobs" if self.jobs_per_instance > 1 else \
                "its memory, for its one job"
            raise AdviseError(f"job memory {self.job_memory_gib:g} GiB is not within the instance's "
                              f"{self.memory_gib:g} GiB: give at most that, e.g. --job-memory-gib {share:g} ({whose})")
        if problem := self._host_problem():
            raise AdviseError(problem)
        if self.jobs_per_day < 1:
            raise AdviseError(f"jobs per day {self.jobs_per_day} must be at least 1")
        if self.instance_ebs_mibps is not None and not self.instance_ebs_mibps > 0:
            raise AdviseError(f"instance EBS bandwidth {self.instance_ebs_mibps} MiB/s must be positive")
        if not 1 <= self.cache_budget_pct <= 90:
            raise AdviseError(f"cache budget {self.cache_budget_pct}% is outside 1-90% of memory")
        if self.io_size_kib is not None and self.io_size_kib < 1:
            raise AdviseError(f"I/O size {self.io_size_kib} KiB must be at least 1")
        if self.random_pct is not None and not 0 <= self.random_pct <= 100:
            raise AdviseError(f"random share {self.random_pct}% is outside 0-100%, e.g. --random-pct 0")
        if self.instance_network_mibps is not None and not self.instance_network_mibps > 0:
            raise AdviseError(f"instance network bandwidth {self.instance_network_mibps} MiB/s must be positive")
        if not self.instance_usd_per_hour > 0:
            raise AdviseError(f"instance price {self.instance_usd_per_hour} USD/h must be positive, "
                              "e.g. --instance-usd-per-hour 0.384")

    def _host_problem(self) -> str | None:
        """Why the plan's instance type cannot run its jobs per instance at once (None when it can, or names no
        known type): Batch places a job by its vCPUs (vcpus_per_job, else one) and its MEMORY
        (tuning.instances.children_per_host); a plan beyond it would write childrenPerHost the hosts never reach."""
        kind = lookup(self.instance_type) if self.instance_type else None
        if kind is None:
            return None
        most = kind.vcpus if self.vcpus_per_job is None else children_per_host(kind, self.vcpus_per_job)
        if self.jobs_per_instance <= most:
            return None
        each = "one vCPU each" if self.vcpus_per_job is None else \
            f"{self.vcpus_per_job} vCPU{'s' if self.vcpus_per_job > 1 else ''} each, --vcpus-per-job"
        return (f"jobs per instance {self.jobs_per_instance} are more than {kind.name} runs at once: its {kind.vcpus} "
                f"vCPUs and {kind.memory_gib:g} GiB hold {most} jobs ({each}): give --jobs-per-instance {most} or "
                f"fewer{'' if self.vcpus_per_job is None else ', a smaller --vcpus-per-job'} or a larger "
                "--instance-type")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def host_context(self) -> dict[str, str]:
        """The stack's context keys for the host the plan names (none when it names no instance type)."""
        if self.instance_type is None:
            return {}
        return {INSTANCE_TYPES_KEY: self.instance_type, CHILDREN_PER_HOST_KEY: str(self.jobs_per_instance)}

    @property
    def job_memory_bytes(self) -> int | None:
        return None if self.job_memory_gib is None else int(self.job_memory_gib * GIB)

    @property
    def waves_per_day(self) -> int:
        return math.ceil(self.jobs_per_day / self.jobs_per_instance)

    def describe(self) -> str:
        """The plan in one line, with what it assumes: what every price of the advice depends on."""
        return ((f"{self.instance_type}: " if self.instance_type else "")
                + f"{self.jobs_per_instance} jobs per instance, {self.memory_gib:g} GiB memory"
                + (f" ({self.job_memory_gib:g} GiB per job)" if self.job_memory_gib is not None else "") + ", "
                f"{self.jobs_per_day:,} jobs per instance per day, instance ${self.instance_usd_per_hour:g}/h"
                + (f" ({self.assumed})" if self.assumed else ""))


def back_to_back(profiles: Sequence[StageProfile], jobs_per_instance: int) -> tuple[int, float]:
    """(jobs per instance per day, the median child's seconds): `jobs_per_instance` children at once, back to back all
    day, the heaviest use of a volume's burst credits; the plan a run implies when no --jobs-per-day is given. A child
    is its JobId and ArrayIndex (Batch's child ids are unique across array jobs; a local run's too), its time the sum
    of its stages (sub-stages, named stage/part, are within them), at least a second."""
    per_child: dict[tuple[str, str], float] = {}
    for profile in profiles:
        if "/" in profile.stage:
            continue
        key = (profile.properties.get("JobId", ""), profile.properties.get("ArrayIndex", ""))
        per_child[key] = per_child.get(key, 0.0) + profile.duration_s
    child_s = max(1.0, median(list(per_child.values()))) if per_child else 1.0
    return max(1, int(jobs_per_instance * SECONDS_PER_DAY / child_s)), child_s


@dataclass(frozen=True)
class Workload:
    """One job as the volume sees it, and where the figures came from."""

    stages: tuple[StageLoad, ...]
    children: int
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StageLoad | None:
        return next((s for s in self.stages if s.name == name), None)


def workload_from_profiles(profiles: Sequence[StageProfile], *, io_size_kib: int | None = None,
                           random_pct: float | None = None) -> Workload:
    """The median child's load per stage, from successful stage profiles.

    The share of a stage's device I/O that is random (AWS's HDD accounting charges a random request under
    1 MiB as a whole MiB) is `random_pct` when given, else the median of the profiles' device_random_pct (the
    eBPF probe's sector continuity on the scratch disk) over those whose stage moved at least
    MIN_SHARE_DEVICE_BYTES on the device, else taken as 0 (all sequential: merged into 1 MiB units on HDD)
    with one note saying so.
    """
    # A profile whose process-tree figures could not be read (absent, with a notice) says nothing of bytes.
    ok = [p for p in profiles if p.outcome == "ok" and p.read_bytes is not None]
    if not ok:
        raise AdviseError("no successful stage profiles in the input: give the profiles/ or emf/ files of "
                          "a run whose children finished")
    notes: list[str] = []
    unmeasured: list[str] = []
    loads: list[StageLoad] = []
    children = 0
    for stage in STAGES:
        of_stage = [p for p in ok if p.stage == stage]
        if not of_stage:
            continue
        children = max(children, len(of_stage))
        writes = [float(_volume_writes(p)) for p in of_stage]
        reads = [float(p.storage_read_bytes or 0) for p in of_stage]
        floors = [_floor(p) for p in of_stage]
        io = _io_size(of_stage)
        if io_size_kib is not None:
            io = io_size_kib * 1024
        elif io is None:
            io = MIB
            notes.append(f"{stage}: no block-device figures in the profiles; assuming 1 MiB I/O")
        measured = [p.device_random_pct for p in of_stage if p.device_random_pct is not None
                    and (p.device_read_bytes or 0) + (p.device_write_bytes or 0) >= MIN_SHARE_DEVICE_BYTES]
        if random_pct is not None:
            share = random_pct / 100
        elif measured:
            share = median(measured) / 100
        else:
            share = 0.0
            unmeasured.append(stage)
        loads.append(StageLoad(stage, int(median(writes)), int(median(reads)), int(io), median(floors), share))
    if unmeasured:
        notes.append(f"{', '.join(unmeasured)}: the profiles do not say how much device I/O is random (the eBPF "
                     f"probe measures it on stages that move {MIN_SHARE_DEVICE_BYTES // MIB} MiB or more on the "
                     "device): taken as sequential (HDD merges it into 1 MiB units); give --random-pct to model "
                     "random I/O")
    if not any(s.write_bytes or s.read_bytes for s in loads):
        raise AdviseError("the profiles show no bytes written to or read from scratch: was the run empty?")
    return Workload(tuple(loads), children, tuple(notes))


def _volume_writes(p: StageProfile) -> int:
    # Bytes the stage sends to storage; wchar stands in when the scratch filesystem does not count them
    # (tmpfs). The upload stage's wchar is network traffic, never scratch.
    if p.storage_write_bytes:
        return p.storage_write_bytes
    return 0 if p.stage == "upload" else p.write_bytes or 0


def _floor(p: StageProfile) -> float:
    """The stage's time minus what it waited on the volume, from the most specific measure there is: the
    larger of the child's own io stall (its cgroup v2 io.pressure) and the wall time its writers were paused by
    the dirty limit (the eBPF probe), else the host's io stall (PSI). The larger, since each misses waits the
    other sees: a lab download paused 6.5 and 8.7 s by the dirty limit had 5.8 and 7.9 s of io stall, and its
    floor from the stall (1.2 s) was more than twice the 0.5 s the same download took unpaused (BENCHMARKS.md).
    The host's stall is host-wide, so other tenants' stalls come off too and the floor comes out low (measured
    on a shared machine: 0.4 s predicted for 1.2 s stages): from it the floor is never taken below
    MIN_FLOOR_SHARE of the duration. The child's own measures are
    taken as they are: a child paused for 90 % of its download has a floor of 10 % (the lab's default runs:
    about 1 s of 25 s, as its runs under a larger cache show)."""
    own = [ms for ms in (p.own_io_stall_ms, p.dirty_throttle_ms) if ms is not None]
    if own:
        return max(p.duration_s - max(own) / 1000, 0.0)
    host_ms = p.io_stall_some_ms or 0.0
    return max(p.duration_s - host_ms / 1000, p.duration_s * MIN_FLOOR_SHARE, 0.0)


def _io_size(of_stage: Sequence[StageProfile]) -> float | None:
    nbytes = sum((p.device_write_bytes or 0) + (p.device_read_bytes or 0) for p in of_stage)
    ops = sum((p.device_write_ops or 0) + (p.device_read_ops or 0) for p in of_stage)
    return nbytes / ops if ops > 0 and nbytes > 0 else None



def parse_candidate(text: str, *, instance_store: bool = False, what: str = "candidate") -> Volume:
    """'st1:500', 'gp3:200:iops=4000:throughput=250' or 'io2:100:iops=3000' -> Volume; with `instance_store`,
    also 'nvme:m6id.2xlarge[:usd_per_hour=0.09]' -> InstanceStore (tuning.instancestore). An error names the text as
    `what` ("candidate" for advise --candidate; the flag, --volume, where it is the volume the stack or lab runs)."""
    parts = [p.strip() for p in text.split(":")]
    store = parts[0].lower() in STORE_WORDS
    if len(parts) < 2:
        raise AdviseError(f"{what} {text[:80]!r} is not TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS], e.g. st1:500"
                          + (", or nvme:INSTANCE_TYPE" if instance_store else ""))
    if store and not instance_store:
        raise AdviseError(f"{what} {text[:80]!r}: instance store is a candidate to compare (advise --candidate), not "
                          "a volume the stack or the lab runs: give an EBS volume, e.g. st1:500")
    size = None if store else whole_number(parts[1])
    if size is None and not store:
        raise AdviseError(f"{what} {text[:80]!r}: size {parts[1][:24]!r} is not a whole number of GiB")
    keys = ("usd_per_hour",) if store else ("iops", "throughput")
    extra: dict[str, float] = {}
    for part in parts[2:]:
        key, _, value = part.partition("=")
        if key not in keys or not value:
            raise AdviseError(f"{what} {text[:80]!r}: {part[:40]!r} is not "
                              + ("usd_per_hour=USD" if store else "iops=N or throughput=MIBPS"))
        if key in extra:  # which one would count? neither: say so
            raise AdviseError(f"{what} {text[:80]!r} gives {key} twice: give it once")
        amount = number(value)
        if amount is None or not math.isfinite(amount):
            raise AdviseError(f"{what} {text[:80]!r}: {part[:40]!r} is not a number")
        extra[key] = amount
    try:
        if store:
            return parse_store(text, parts[1], extra)
        return Volume(parts[0], size or 0,
                      iops=int(extra["iops"]) if "iops" in extra else None,
                      throughput_mibps=extra.get("throughput"))
    except VolumeError as exc:
        raise AdviseError(f"{what} {text[:80]!r}: {exc}") from None
