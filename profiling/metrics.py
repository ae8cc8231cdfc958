"""The one list of stage metrics, and the StageProfile they are computed from.

METRICS is the single source for the EMF emitter, the CloudWatch dashboard (infra/dashboard.py),
the console table and the HTML report: a metric added here appears in all of them.

Everything here is pure: no /proc, no files, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from profiling.qualifyio import EXPECTED_KEY, MIBPS_KEY, RATIO_KEY, VERDICT_KEY

PROFILE_SCHEMA = 1
STAGES: tuple[str, ...] = ("download", "process", "upload")
OUTCOMES: tuple[str, ...] = ("ok", "failed", "interrupted")
DEFAULT_NAMESPACE = "IoBatch"
# Dimensions stay low-cardinality: every distinct value set is billed as a custom metric.
DIMENSIONS: tuple[str, ...] = ("Pipeline", "Stage")
# Per-job and per-instance values travel as EMF properties, never as dimensions. VolumeId (the scratch volume's EBS
# id, when it is one) is how a profile finds its volume's AWS/EBS metrics; the host's qualification at boot is its
# scratch's measured figure against the model (profiling/qualifyio.py).
PROPERTY_KEYS: tuple[str, ...] = ("JobId", "ArrayIndex", "InstanceId", "InstanceType", "VolumeType", "VolumeId",
                                  VERDICT_KEY, MIBPS_KEY, EXPECTED_KEY, RATIO_KEY)
# Every key of an EMF document's body besides its metrics (profiling/emf.py writes them): no metric may be
# named like one, or its value would overwrite it.
EMF_BODY_KEYS: frozenset[str] = frozenset(
    {*DIMENSIONS, *PROPERTY_KEYS, "Outcome", "Contract", "Device", "Error", "Scopes", "Notices", "_aws"})

MIB = 1024 * 1024


class Aggregate(StrEnum):
    """How a metric's values of several children of one stage become the stage's one value."""

    SUM = "sum"  # totals over the run: bytes, calls, operations, images
    MAX = "max"  # the peak any child saw: host-wide page-cache levels and limits
    MEDIAN = "median"  # durations, rates, latencies: one slow child should not hide behind the mean

    def of(self, values: Sequence[float]) -> float:
        """The aggregate of `values` (at least one)."""
        if self is Aggregate.SUM:
            return float(sum(values))
        if self is Aggregate.MAX:
            return max(values)
        return median(values)


SUM, MAX, MEDIAN = Aggregate.SUM, Aggregate.MAX, Aggregate.MEDIAN


class Scope(StrEnum):
    """What a figure measures: whose I/O it is. A figure that is not the child's own says so wherever it is
    shown (`MetricSpec.scope_note`), and is never summed across the children that share it."""

    TREE = "process tree"  # the child's processes, /proc/<pid>/io or a per-call probe: exact
    CONTAINER = "container"  # the child's cgroup v2 (io.stat, io.pressure, memory.stat) or network namespace
    DEVICE = "device"  # the block device behind scratch: shared by every child on it
    HOST = "host"  # the whole host: /proc/vmstat, /proc/pressure/io, the host's network interfaces

    @property
    def shared(self) -> bool:
        return self in (Scope.DEVICE, Scope.HOST)


TREE, CONTAINER, DEVICE, HOST = Scope.TREE, Scope.CONTAINER, Scope.DEVICE, Scope.HOST


class Better(StrEnum):
    """Which way a figure gets better: what "the slowest child" means for it (the dashboard's second line, the
    comparison's colours). A count, a volume or a limit is neither: no child is slow by it."""

    LOWER = "lower"  # durations, latencies, stalls: the slowest child has the largest
    HIGHER = "higher"  # rates: the slowest child has the smallest
    NEITHER = "neither"

    @property
    def slowest_statistic(self) -> str | None:
        """The CloudWatch statistic of the slowest child's value, or None."""
        return {"lower": "Maximum", "higher": "Minimum"}.get(self.value)


LOWER, HIGHER, NEITHER = Better.LOWER, Better.HIGHER, Better.NEITHER


@dataclass(frozen=True)
class MetricSpec:
    """One CloudWatch metric: its name, unit, the StageProfile field it reads, how its values across
    children aggregate, and how people see it."""

    name: str
    unit: str  # a CloudWatch unit name, as aws_embedded_metrics.unit.Unit accepts it
    field: str
    label: str  # column heading in the console table and the report: says its unit, and of what
    aggregate: Aggregate  # across the children of a stage (summarize, the report's summary, comparisons)
    scale: float = 1.0  # divide the raw value by this for display
    display_unit: str = ""
    description: str = ""
    on_dashboard: bool = False
    scope: Scope = TREE
    better: Better = NEITHER

    def __post_init__(self) -> None:
        # Two children on one device each see the device's whole traffic: a sum counts it twice.
        if self.scope.shared and self.aggregate is SUM:
            raise ValueError(f"{self.name} is {self.scope.value}-wide: it cannot be summed across children")

    @property
    def scope_note(self) -> str:
        """'' for the child's own figures; else what the figure is of, e.g. "device", shown beside it."""
        return self.scope.value if self.scope.shared else ""

    @property
    def scoped_label(self) -> str:
        """The label with its scope when the figure is not the child's own, e.g. 'dev write MiB [device]'."""
        return f"{self.label} [{self.scope_note}]" if self.scope_note else self.label

    def display(self, value: float | None) -> str:
        if value is None:
            return "-"
        shown = value / self.scale
        if abs(shown) >= 100 or shown == int(shown):
            return f"{shown:,.0f}"
        return f"{shown:,.2f}" if abs(shown) >= 1 else f"{shown:.3f}"


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("StageDuration", "Seconds", "duration_s", "duration s", MEDIAN, display_unit="s",
               description="Wall time of the stage", on_dashboard=True, better=LOWER),
    MetricSpec("ReadBytes", "Bytes", "read_bytes", "read MiB, net incl.", SUM, MIB, "MiB",
               "Bytes read by the job's process tree (rchar: files, pipes and sockets)"),
    MetricSpec("WriteBytes", "Bytes", "write_bytes", "written MiB, net incl.", SUM, MIB, "MiB",
               "Bytes written by the job's process tree (wchar)"),
    MetricSpec("ReadCalls", "Count", "read_calls", "read calls", SUM, description="read-type system calls (syscr)"),
    MetricSpec("WriteCalls", "Count", "write_calls", "write calls", SUM,
               description="write-type system calls (syscw)"),
    MetricSpec("WriteCallLatency", "Microseconds", "write_call_latency_us", "write µs/call", MEDIAN,
               display_unit="µs",
               description="Mean latency of the job tree's write calls (per-call probe: eBPF or interposer)",
               better=LOWER),
    MetricSpec("StorageReadBytes", "Bytes", "storage_read_bytes", "storage read MiB", SUM, MIB, "MiB",
               "Bytes the process tree caused to be fetched from storage (read_bytes)"),
    MetricSpec("StorageWriteBytes", "Bytes", "storage_write_bytes", "storage write MiB", SUM, MIB, "MiB",
               "Bytes the process tree caused to be sent to storage (write_bytes)"),
    MetricSpec("Throughput", "Bytes/Second", "throughput_bps", "MiB/s moved", MEDIAN, MIB, "MiB/s",
               "Bytes moved per second: max(read, written) over the stage's wall time", on_dashboard=True,
               better=HIGHER),
    MetricSpec("Items", "Count", "items", "images", SUM, description="Images the stage handled"),
    MetricSpec("DeviceReadOps", "Count", "device_read_ops", "dev reads", MAX,
               description="Reads completed by the scratch device", scope=DEVICE),
    MetricSpec("DeviceWriteOps", "Count", "device_write_ops", "dev writes", MAX,
               description="Writes completed by the scratch device", scope=DEVICE),
    MetricSpec("DeviceReadBytes", "Bytes", "device_read_bytes", "dev read MiB", MAX, MIB, "MiB",
               "Bytes read from the scratch device", scope=DEVICE),
    MetricSpec("DeviceWriteBytes", "Bytes", "device_write_bytes", "dev write MiB", MAX, MIB, "MiB",
               "Bytes written to the scratch device", scope=DEVICE),
    MetricSpec("DeviceReadLatency", "Milliseconds", "device_read_latency_ms", "dev ms/read", MEDIAN,
               display_unit="ms", description="Mean time per completed device read", scope=DEVICE, better=LOWER),
    MetricSpec("DeviceWriteLatency", "Milliseconds", "device_write_latency_ms", "dev ms/write", MEDIAN,
               display_unit="ms", description="Mean time per completed device write", on_dashboard=True,
               scope=DEVICE, better=LOWER),
    MetricSpec("DeviceQueueDepth", "Count", "device_queue_depth", "dev queue", MEDIAN,
               description="Average requests in flight on the scratch device", on_dashboard=True, scope=DEVICE),
    MetricSpec("DeviceUtilization", "Percent", "device_utilization_pct", "util %", MEDIAN, display_unit="%",
               description="Share of the stage the device was busy", scope=DEVICE),
    MetricSpec("PeakDirtyBytes", "Bytes", "peak_dirty_bytes", "peak dirty MiB", MAX, MIB, "MiB",
               "Most dirty page-cache bytes seen during the stage (host-wide)", on_dashboard=True, scope=HOST),
    MetricSpec("PeakWritebackBytes", "Bytes", "peak_writeback_bytes", "peak writeback MiB", MAX, MIB, "MiB",
               "Most bytes under writeback seen during the stage (host-wide)", scope=HOST),
    MetricSpec("DirtyThresholdBytes", "Bytes", "dirty_threshold_bytes", "dirty limit MiB", MAX, MIB, "MiB",
               "The kernel's dirty threshold: writers block above it", scope=HOST),
    MetricSpec("IoStallSome", "Milliseconds", "io_stall_some_ms", "io stall ms", MEDIAN, display_unit="ms",
               description="PSI io 'some': time at least one task waited on I/O (host-wide)", on_dashboard=True,
               scope=HOST, better=LOWER),
    MetricSpec("IoStallFull", "Milliseconds", "io_stall_full_ms", "io stall full ms", MEDIAN, display_unit="ms",
               description="PSI io 'full': time all non-idle tasks waited on I/O (host-wide)", scope=HOST,
               better=LOWER),
    MetricSpec("DirtyThrottle", "Milliseconds", "dirty_throttle_ms", "dirty throttle ms", MEDIAN, display_unit="ms",
               description="Wall time during which at least one of the job's writers was paused in "
               "balance_dirty_pages (eBPF only)", scope=CONTAINER, better=LOWER),
    MetricSpec("DirtyThrottleThreadSum", "Milliseconds", "dirty_throttle_thread_sum_ms", "dirty pause ms, all threads",
               MEDIAN, display_unit="ms", scope=CONTAINER,
               description="balance_dirty_pages pauses summed over the job's threads: can exceed the stage's wall "
               "time when several threads wait at once (eBPF only)", better=LOWER),
    MetricSpec("DeviceRandomShare", "Percent", "device_random_pct", "dev random %", MEDIAN,
               display_unit="%", scope=DEVICE,
               description="Share of the bytes the scratch disk's requests moved that did not start where the "
               "previous request ended: random I/O in AWS's HDD accounting (eBPF only; the whole disk when scratch "
               "is a partition)"),
    MetricSpec("DeviceSharers", "Count", "device_sharers", "children on dev", MAX, scope=DEVICE,
               description="Children profiled on the scratch device during the stage, this one included: the "
               "device figures are shared by them"),
    MetricSpec("OwnDeviceReadBytes", "Bytes", "own_device_read_bytes", "own dev read MiB", SUM, MIB, "MiB",
               "Bytes the child's cgroup read from the scratch device (cgroup v2 io.stat)", scope=CONTAINER),
    MetricSpec("OwnDeviceWriteBytes", "Bytes", "own_device_write_bytes", "own dev write MiB", SUM, MIB, "MiB",
               "Bytes the child's cgroup wrote to the scratch device, writeback of the pages it dirtied included "
               "(cgroup v2 io.stat)", scope=CONTAINER),
    MetricSpec("OwnIoStall", "Milliseconds", "own_io_stall_ms", "own io stall ms", MEDIAN, display_unit="ms",
               description="Time at least one of the child's tasks waited on I/O (cgroup v2 io.pressure 'some')",
               scope=CONTAINER, better=LOWER),
    MetricSpec("OwnPeakDirtyBytes", "Bytes", "own_peak_dirty_bytes", "own peak dirty MiB", MAX, MIB, "MiB",
               "Most dirty page-cache bytes of the child's cgroup seen during the stage (memory.stat file_dirty)",
               scope=CONTAINER),
    MetricSpec("OwnPeakWritebackBytes", "Bytes", "own_peak_writeback_bytes", "own peak writeback MiB", MAX, MIB,
               "MiB", "Most bytes of the child's cgroup under writeback during the stage (memory.stat "
               "file_writeback)", scope=CONTAINER),
    MetricSpec("OwnDirtyThresholdBytes", "Bytes", "own_dirty_threshold_bytes", "own dirty limit MiB", MEDIAN, MIB,
               "MiB", "The child's own dirty threshold (its memory cgroup's writeback domain, computed as the kernel "
               "does from memory.max/high, memory.current and file pages, vm.dirty_*): the lowest it was in the "
               "stage. Writers are paused by this domain or the host's, whichever is nearer its limit",
               scope=CONTAINER),
    MetricSpec("NetworkSentBytes", "Bytes", "net_sent_bytes", "net sent MiB", SUM, MIB, "MiB",
               "Bytes the child sent over the network: its sockets (eBPF) or its own network namespace's "
               "interfaces", scope=CONTAINER),
    MetricSpec("NetworkReceivedBytes", "Bytes", "net_received_bytes", "net received MiB", SUM, MIB, "MiB",
               "Bytes the child received over the network: its sockets (eBPF) or its own network namespace's "
               "interfaces", scope=CONTAINER),
    MetricSpec("HostNetworkSentBytes", "Bytes", "host_net_sent_bytes", "net sent MiB", MAX, MIB, "MiB",
               "Bytes sent by every interface of the network namespace the job shares with the host "
               "(loopback included): when the child's own are not measured", scope=HOST),
    MetricSpec("HostNetworkReceivedBytes", "Bytes", "host_net_received_bytes", "net received MiB", MAX, MIB, "MiB",
               "Bytes received by every interface of the network namespace the job shares with the host "
               "(loopback included): when the child's own are not measured", scope=HOST),
)

METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
# The columns of the per-stage console table, in order.
TABLE_METRICS: tuple[str, ...] = (
    "StageDuration", "ReadBytes", "WriteBytes", "ReadCalls", "WriteCalls", "WriteCallLatency", "Throughput",
    "DeviceWriteLatency", "DeviceQueueDepth", "PeakDirtyBytes", "IoStallSome", "NetworkReceivedBytes",
    "HostNetworkReceivedBytes", "NetworkSentBytes", "HostNetworkSentBytes",
)


#: Where a per-call probe's result (StageProfile.calls, see profiling/probes/callstats.py) keeps its figures
#: per call type, {CALL: STATS}; the key is part of profile schema 1. Read them with `by_call`.
BY_CALL = "calls"


def by_call(calls: Mapping[str, Any] | None) -> dict[str, Any]:
    """The figures per call type ({CALL: STATS}) of a per-call probe's result or of StageProfile.calls."""
    return (calls or {}).get(BY_CALL) or {}


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    """One sampling interval of a stage: rates and levels over [t - interval, t]."""

    t: float  # seconds since the stage started
    # The job tree's rates; None for an interval whose process counters could not be read at either end.
    read_bps: float | None
    write_bps: float | None
    device_write_bps: float | None
    device_queue_depth: float | None
    # The host's page cache at the interval's end; None when /proc/meminfo could not be read.
    dirty_bytes: int | None
    writeback_bytes: int | None
    io_stall_some_ms: float | None


@dataclass(frozen=True, slots=True)
class StageProfile:
    """What one stage of one child did, measured from outside the job. Serialised as profile JSON."""

    stage: str
    outcome: str
    started_at: float  # unix seconds
    duration_s: float
    # Logical I/O of the job's process tree, from /proc/<pid>/io (exact for any binary); None when the
    # profiler could not read the counters (a notice says why).
    read_bytes: int | None = 0
    write_bytes: int | None = 0
    read_calls: int | None = 0
    write_calls: int | None = 0
    storage_read_bytes: int | None = 0
    storage_write_bytes: int | None = 0
    cancelled_write_bytes: int | None = 0
    items: int | None = None
    # The scratch device, from /proc/diskstats; None when no block device backs scratch.
    device: str | None = None
    device_read_ops: int | None = None
    device_write_ops: int | None = None
    device_read_bytes: int | None = None
    device_write_bytes: int | None = None
    device_read_latency_ms: float | None = None
    device_write_latency_ms: float | None = None
    device_queue_depth: float | None = None
    device_utilization_pct: float | None = None
    device_sharers: int | None = None  # children profiled on the device during the stage, this one included
    # Share of the bytes the device's requests moved that did not start where the previous request ended (eBPF
    # block_rq_issue): what AWS's HDD accounting charges as random I/O. Device-wide, like the figures above.
    device_random_pct: float | None = None
    # The child's own share, from its cgroup v2 (profiling/probes/cgroupfs.py); None where it has none (v1).
    own_device_read_bytes: int | None = None
    own_device_write_bytes: int | None = None
    own_io_stall_ms: float | None = None
    own_peak_dirty_bytes: int | None = None
    own_peak_writeback_bytes: int | None = None
    own_dirty_threshold_bytes: int | None = None
    own_dirty_background_threshold_bytes: int | None = None
    # Bytes over the network: the child's own (eBPF sockets, or its own network namespace), else host-wide.
    net_sent_bytes: int | None = None
    net_received_bytes: int | None = None
    host_net_sent_bytes: int | None = None
    host_net_received_bytes: int | None = None
    # The page cache, host-wide, from /proc/vmstat.
    peak_dirty_bytes: int | None = None
    peak_writeback_bytes: int | None = None
    dirty_threshold_bytes: int | None = None
    dirty_background_threshold_bytes: int | None = None
    # Pressure stall information, /proc/pressure/io; None where PSI is off.
    io_stall_some_ms: float | None = None
    io_stall_full_ms: float | None = None
    # From the eBPF probe when it ran: wall time with a writer paused, and the pauses summed over threads.
    dirty_throttle_ms: float | None = None
    dirty_throttle_thread_sum_ms: float | None = None
    # Mean write-call latency; derived from `calls` when a per-call probe ran (see __post_init__).
    write_call_latency_us: float | None = None
    # Per-call figures by probe (see profiling/probes/callstats.py): {"probe": ..., "calls": {CALL: STATS}, ...}.
    calls: dict[str, Any] | None = None
    # Which probe produced each group of figures, e.g. {"io": "procfs", "latency": "ebpf"}.
    sources: dict[str, str] = field(default_factory=dict)
    # Contract rule results (profiling/contract.py), if a contract was given.
    contract: list[dict[str, Any]] = field(default_factory=list)
    # Per-job values: JobId, ArrayIndex, InstanceId, InstanceType, VolumeType, Pipeline.
    properties: dict[str, str] = field(default_factory=dict)
    timeline: list[TimelinePoint] = field(default_factory=list)
    error: str | None = None
    # Why a figure is absent, one line each (an unreadable counter, a probe that could not run).
    notices: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.write_call_latency_us is None and self.calls:
            write = by_call(self.calls).get("write") or {}
            if write.get("count") and write.get("mean_us") is not None:
                object.__setattr__(self, "write_call_latency_us", float(write["mean_us"]))

    @property
    def throughput_bps(self) -> float | None:
        """Bytes moved per second: the larger of bytes read and written, over wall time."""
        if self.duration_s <= 0 or self.read_bytes is None or self.write_bytes is None:
            return None
        return max(self.read_bytes, self.write_bytes) / self.duration_s

    def value(self, spec: MetricSpec) -> float | None:
        raw = getattr(self, spec.field)
        return None if raw is None else float(raw)

    def to_dict(self) -> dict[str, Any]:
        """The profile as JSON-ready values, to be serialized at once: its own dicts and lists, not copies
        (dataclasses.asdict deep-copies them: ~0.1 s for a stage with a few hundred files' records)."""
        body = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        body["timeline"] = [dataclasses.asdict(p) for p in self.timeline]
        return {"schema": PROFILE_SCHEMA, **body}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StageProfile:
        schema = data.get("schema")
        if schema != PROFILE_SCHEMA:
            raise ValueError(f"profile schema {schema!r} is not {PROFILE_SCHEMA}")
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["timeline"] = [TimelinePoint(**p) for p in data.get("timeline", [])]
        return cls(**kwargs)


def to_metrics(profile: StageProfile) -> list[tuple[str, float, str]]:
    """(name, value, unit) for every metric the profile has a value for, in METRICS order."""
    out: list[tuple[str, float, str]] = []
    for spec in METRICS:
        value = profile.value(spec)
        if value is not None:
            out.append((spec.name, value, spec.unit))
    return out


def summarize(profiles: Sequence[StageProfile]) -> dict[str, dict[str, float | None]]:
    """Per stage: the children's count and each metric aggregated across them as its spec says.

    Durations and rates are medians (one slow child should not hide behind the mean); bytes,
    calls and items are totals over the run; page-cache peaks and limits are the largest seen.
    """
    result: dict[str, dict[str, float | None]] = {}
    for stage in stage_order({p.stage for p in profiles}):
        of_stage = [p for p in profiles if p.stage == stage]
        row: dict[str, float | None] = {"children": float(len(of_stage))}
        for spec in METRICS:
            values = [v for v in (p.value(spec) for p in of_stage) if v is not None]
            row[spec.name] = spec.aggregate.of(values) if values else None
        result[stage] = row
    return result


def stage_order(names: Iterable[str]) -> list[str]:
    """Stage names in pipeline order, each stage's sub-stages ("process/features", profiling/protocol.py)
    right after it, then any other names sorted."""

    def key(name: str) -> tuple[int, str, str]:
        parent, _, sub = name.partition("/")
        return (STAGES.index(parent) if parent in STAGES else len(STAGES), parent, sub)

    return sorted(set(names), key=key)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def figure_problem(value: Any) -> str | None:
    """Why `value` cannot be a figure of a stage profile (times, durations, bytes, counts, rates: a finite number
    of 0 or more), or None when it can: the one value check of the profile and EMF readers (profiling.runfiles,
    profiling.emf), so a damaged figure is refused alike wherever it is read."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not a number"
    if not (math.isfinite(value) and value >= 0):
        return "a profile holds finite figures of 0 or more"
    return None
