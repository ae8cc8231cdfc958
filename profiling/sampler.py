"""Sampling a stage: kernel counters to a StageProfile.

Two layers, kept apart:

- `Snapshot` / `build_profile` / `timeline_point`: pure arithmetic from kernel counters to a StageProfile.
- `take_snapshot` / `StageSampler`: read every counter (profiling/probes/procfs.py) for a baseline, on a
  thread (faster while the stage is young: `next_interval`), and a final time.

The sidecar (profiling/sidecar.py) and `iobatch profile` (profiling/command.py) both sample through
`StageSampler`, and both hand its profile to profiling/finish.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from profiling.metrics import StageProfile, TimelinePoint
from profiling.probes.cgroupfs import CgroupSample, OwnCgroup
from profiling.probes.netdev import NetCounters, read_net
from profiling.probes.procfs import (
    BlockDevice,
    DiskStats,
    IoUnreadable,
    PageCache,
    Pressure,
    ProcIo,
    device_delta,
    read_diskstats,
    read_page_cache,
    read_pressure,
    read_tree_io,
)

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.1  # 10 Hz at most once a stage is older: 1 s is plenty for a stage of minutes
# While a stage is young the sampler goes faster: the next sample comes after a tenth of the stage's age,
# but no sooner than YOUNG_MIN_INTERVAL_S and no later than the configured interval. A 0.1 s stage gets
# ten samples, a 1 s stage about 35, and the configured rate takes over at an age of ten intervals
# (10 s at 1 s), about 60 samples in. A snapshot costs ~0.3 ms (the tree, diskstats, vmstat, PSI), so
# 100 Hz for the first 0.1 s is 3% of a core for a tenth of a second.
YOUNG_MIN_INTERVAL_S = 0.01
YOUNG_AGE_SHARE = 0.1


def next_interval(age_s: float, interval_s: float) -> float:
    """Seconds to the next sample of a stage `age_s` old, when the configured interval is `interval_s`."""
    return min(interval_s, max(YOUNG_MIN_INTERVAL_S, age_s * YOUNG_AGE_SHARE))


def check_interval(interval_s: float) -> float:
    """Raise ValueError unless the interval is between 0.1 s (10 Hz) and 60 s."""
    if not MIN_INTERVAL_S <= interval_s <= 60:
        raise ValueError(f"interval {interval_s} s is out of range: give 0.1 (10 Hz) to 60 seconds")
    return interval_s


# ---- pure: snapshots to a profile --------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Every counter the sidecar reads, at one instant."""

    mono: float  # time.monotonic()
    tree_io: ProcIo | None  # None when the root process is gone, or its tree unreadable (io_error)
    disk: DiskStats | None
    cache: PageCache | None
    pressure: Pressure | None
    processes: int = 0
    io_error: str | None = None  # why tree_io could not be read, when the tree was there
    own: CgroupSample | None = None  # the child's cgroup v2 (profiling/probes/cgroupfs.py)
    net: NetCounters | None = None  # the job's network namespace (profiling/probes/netdev.py)
    sharers: int | None = None  # profilers registered on the scratch device (profiling/probes/sharing.py)


class Counter(Protocol):
    """The register of profilers on the scratch device (profiling/probes/sharing.py)."""

    def count(self) -> int | None: ...


@dataclass(frozen=True)
class Sources:
    """What a stage samples beside the tree, the device and the host, and why anything is left out."""

    cgroup: OwnCgroup | None = None
    register: Counter | None = None
    net: bool = True
    notices: tuple[str, ...] = ()


def _monotonic_io(snapshots: Sequence[Snapshot], base: ProcIo) -> list[ProcIo]:
    """Cumulative I/O since the baseline at every snapshot, never decreasing.

    The live tree sum can dip between samples (a child reaped by a process outside the tree, a child
    missed in the instant it was being reaped); holding the running maximum keeps the timeline honest
    without ever counting a byte twice (see procfs.read_tree_io).
    """
    out: list[ProcIo] = []
    running = ProcIo()
    for snap in snapshots:
        if snap.tree_io is not None:
            running = running.elementwise_max(snap.tree_io - base)
        out.append(running)
    return out


def timeline_point(t: float, prev: Snapshot, cur: Snapshot, io_prev: ProcIo, io_cur: ProcIo, *,
                   io_known: bool = True) -> TimelinePoint:
    """Rates and levels over one interval [prev, cur]. `io_known`: the tree's counters were read at both
    ends; if not, its rates are absent (a gap in the plot), never a zero."""
    dt = max(cur.mono - prev.mono, 1e-9)
    device_bps = queue = None
    if prev.disk is not None and cur.disk is not None:
        figures = device_delta(prev.disk, cur.disk, dt)
        device_bps, queue = figures.write_bytes / dt, figures.queue_depth
    stall = None
    if prev.pressure is not None and cur.pressure is not None:
        stall = (cur.pressure.some_us - prev.pressure.some_us) / 1000.0
    return TimelinePoint(
        t=round(t, 3),
        read_bps=(io_cur.rchar - io_prev.rchar) / dt if io_known else None,
        write_bps=(io_cur.wchar - io_prev.wchar) / dt if io_known else None,
        device_write_bps=device_bps,
        device_queue_depth=queue,
        dirty_bytes=cur.cache.dirty_bytes if cur.cache else None,
        writeback_bytes=cur.cache.writeback_bytes if cur.cache else None,
        io_stall_some_ms=stall,
    )


def build_profile(
    *,
    stage: str,
    outcome: str,
    started_at: float,
    snapshots: Sequence[Snapshot],
    device: BlockDevice | None,
    base_io: ProcIo | None = None,
    items: int | None = None,
    properties: Mapping[str, str] | None = None,
    notices: Sequence[str] = (),
) -> StageProfile:
    """A StageProfile from the baseline snapshot, the periodic ones and the final one (in that order).

    `base_io` overrides the baseline's process counters: a process the profiler started itself begins
    at exactly zero, whatever it did before the first read. Without a baseline, or with an unreadable
    final reading, the tree's figures are absent (never the job's lifetime, never zero), with a notice.
    """
    if len(snapshots) < 2:
        raise ValueError("a stage needs at least a baseline and a final snapshot")
    first, last = snapshots[0], snapshots[-1]
    notes = list(notices)
    base = base_io if base_io is not None else first.tree_io
    io_missing = None
    if base is None:
        io_missing = first.io_error or "the job's process was gone at the stage's start"
    elif last.io_error is not None:
        io_missing = last.io_error
    if io_missing is not None:
        notes.append(f"process-tree figures are absent: {io_missing}")
    cumulative = _monotonic_io(snapshots, base or ProcIo())
    total = cumulative[-1]
    duration = max(last.mono - first.mono, 0.0)

    dev: dict[str, Any] = {}
    if device is not None and first.disk is not None and last.disk is not None:
        fig = device_delta(first.disk, last.disk, duration)
        dev = {
            "device": device.name,
            "device_read_ops": fig.read_ops,
            "device_write_ops": fig.write_ops,
            "device_read_bytes": fig.read_bytes,
            "device_write_bytes": fig.write_bytes,
            "device_read_latency_ms": fig.read_latency_ms,
            "device_write_latency_ms": fig.write_latency_ms,
            "device_queue_depth": fig.queue_depth,
            "device_utilization_pct": fig.utilization_pct,
        }
    caches = [s.cache for s in snapshots if s.cache is not None]
    cache: dict[str, Any] = {}
    if caches:
        cache = {
            "peak_dirty_bytes": max(c.dirty_bytes for c in caches),
            "peak_writeback_bytes": max(c.writeback_bytes for c in caches),
            "dirty_threshold_bytes": caches[-1].dirty_threshold_bytes,
            "dirty_background_threshold_bytes": caches[-1].dirty_background_threshold_bytes,
        }
    psi: dict[str, Any] = {}
    if first.pressure is not None and last.pressure is not None:
        full = None
        if first.pressure.full_us is not None and last.pressure.full_us is not None:
            full = (last.pressure.full_us - first.pressure.full_us) / 1000.0
        psi = {"io_stall_some_ms": (last.pressure.some_us - first.pressure.some_us) / 1000.0,
               "io_stall_full_ms": full}
    # Whether the tree's counters were read at each snapshot (the baseline also when given as base_io).
    known = [base_io is not None or first.tree_io is not None, *(s.tree_io is not None for s in snapshots[1:])]
    timeline = [
        timeline_point(cur.mono - first.mono, prev, cur, io_prev, io_cur, io_known=known[i] and known[i + 1])
        for i, (prev, cur, io_prev, io_cur) in enumerate(zip(snapshots, snapshots[1:], cumulative, cumulative[1:],
                                                             strict=False))
        if cur.mono > prev.mono
    ]
    sources = {"io": "procfs"}
    if dev:
        sources["device"] = "procfs"
    own = _own_figures(snapshots)
    if own:
        sources["own"] = "cgroup v2"
    net = _net_figures(first.net, last.net)
    if net:
        sources["network"] = "netns" if "net_sent_bytes" in net else "host netns"
    sharers = [s.sharers for s in snapshots if s.sharers is not None]
    io: dict[str, Any] = {
        "read_bytes": total.rchar, "write_bytes": total.wchar, "read_calls": total.syscr,
        "write_calls": total.syscw, "storage_read_bytes": total.storage_read_bytes,
        "storage_write_bytes": total.storage_write_bytes, "cancelled_write_bytes": total.cancelled_write_bytes,
    }
    if io_missing is not None:
        io = dict.fromkeys(io)
        sources.pop("io")
    return StageProfile(
        stage=stage,
        outcome=outcome,
        started_at=started_at,
        duration_s=duration,
        items=items,
        sources=sources,
        properties=dict(properties or {}),
        timeline=timeline,
        device_sharers=max(sharers) if sharers and dev else None,
        notices=notes,
        **io,
        **dev,
        **cache,
        **psi,
        **own,
        **net,
    )


def _own_figures(snapshots: Sequence[Snapshot]) -> dict[str, Any]:
    """The child's own device bytes, io stall and peak dirty pages from its cgroup v2 (absent on v1)."""
    first, last = snapshots[0].own, snapshots[-1].own
    if first is None or last is None:
        return {}
    out: dict[str, Any] = {}
    if first.io is not None and last.io is not None:
        out["own_device_read_bytes"] = last.io.read_bytes - first.io.read_bytes
        out["own_device_write_bytes"] = last.io.write_bytes - first.io.write_bytes
    if first.pressure is not None and last.pressure is not None:
        out["own_io_stall_ms"] = (last.pressure.some_us - first.pressure.some_us) / 1000.0
    samples = [s.own for s in snapshots if s.own is not None]
    dirty = [o.dirty_bytes for o in samples if o.dirty_bytes is not None]
    writeback = [o.writeback_bytes for o in samples if o.writeback_bytes is not None]
    if dirty:
        out["own_peak_dirty_bytes"] = max(dirty)
    if writeback:
        out["own_peak_writeback_bytes"] = max(writeback)
    thresholds = [o.thresholds for o in samples if o.thresholds is not None]
    if thresholds:  # the tightest the child's own limits were during the stage
        out["own_dirty_threshold_bytes"] = min(t.dirty_bytes for t in thresholds)
        out["own_dirty_background_threshold_bytes"] = min(t.background_bytes for t in thresholds)
    return out


def _net_figures(first: NetCounters | None, last: NetCounters | None) -> dict[str, Any]:
    """Bytes over the network in the stage: the child's own when its namespace is, else host-wide."""
    if first is None or last is None or first.own != last.own:
        return {}
    received, sent = last.received - first.received, last.sent - first.sent
    if received < 0 or sent < 0:  # an interface went away: its counters with it
        return {}
    prefix = "net" if last.own else "host_net"
    return {f"{prefix}_sent_bytes": sent, f"{prefix}_received_bytes": received}


# ---- sampling ------------------------------------------------------------------------------------------


def take_snapshot(root: int, device: BlockDevice | None, sources: Sources | None = None) -> Snapshot:
    """Read every counter once. Process counters first: they are the ones that race with the job."""
    error = None
    try:
        tree_io, count = read_tree_io(root)
    except IoUnreadable as exc:
        tree_io, count, error = None, 0, str(exc)
    extra = sources or Sources(net=False)
    return Snapshot(
        mono=time.monotonic(),
        tree_io=tree_io,
        disk=read_diskstats(device.name) if device else None,
        cache=read_page_cache(),
        pressure=read_pressure(),
        processes=count,
        io_error=error,
        own=extra.cgroup.sample() if extra.cgroup else None,
        net=read_net(root) if extra.net else None,
        sharers=extra.register.count() if extra.register else None,
    )


class StageSampler:
    """Samples one stage: `start()` takes the baseline, a thread samples (faster while the stage is young,
    see next_interval, then every `interval_s`), `finish()` takes the end."""

    def __init__(self, *, stage: str, pid: int, device: BlockDevice | None, interval_s: float,
                 base_io: ProcIo | None = None, sources: Sources | None = None) -> None:
        self.stage = stage
        self.pid = pid
        self.device = device
        self.interval_s = interval_s
        self.base_io = base_io
        self.sources = sources or Sources(net=False)
        self.started_at = time.time()
        self._snapshots: list[Snapshot] = []
        self._closing: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{stage}", daemon=True)

    def start(self) -> None:
        self.started_at = time.time()
        self._snapshots.append(self.snapshot())
        self._thread.start()

    def age_s(self) -> float:
        """Seconds since the stage's first snapshot (0 before it)."""
        return time.monotonic() - self._snapshots[0].mono if self._snapshots else 0.0

    def snapshot(self) -> Snapshot:
        """Every counter this stage samples, now."""
        return take_snapshot(self.pid, self.device, self.sources)

    def _run(self) -> None:
        origin = self._snapshots[0].mono
        next_at = origin + next_interval(0.0, self.interval_s)
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            snap = self.snapshot()
            with self._lock:
                if not self._stop.is_set():
                    self._snapshots.append(snap)
            step = next_interval(next_at - origin, self.interval_s)
            next_at += step
            if next_at < time.monotonic():  # fell behind (suspended VM): do not burst to catch up
                next_at = time.monotonic() + step

    def close(self, final: Snapshot | None = None) -> None:
        """Stop sampling and take the closing snapshot (or use `final`: a command the profiler waited
        for is read while still a zombie, before it is reaped). Cheap: the job may go on after this."""
        if self._closing is not None:
            return
        with self._lock:
            self._stop.set()
        self._thread.join(timeout=5)
        self._closing = final or self.snapshot()

    def finish(self, *, outcome: str, items: int | None = None, final: Snapshot | None = None,
               properties: Mapping[str, str] | None = None) -> StageProfile:
        """Close (if not yet closed) and build the profile."""
        self.close(final)
        assert self._closing is not None
        snapshots = [*self._snapshots, self._closing]
        return build_profile(stage=self.stage, outcome=outcome, started_at=self.started_at,
                             snapshots=snapshots, device=self.device, base_io=self.base_io, items=items,
                             properties=properties, notices=self.sources.notices)
