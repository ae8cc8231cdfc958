"""Sampling a stage: kernel counters to a StageProfile.

Two layers, kept apart:

- `Snapshot` / `build_profile` / `timeline_point`: pure arithmetic from kernel counters to a StageProfile.
- `take_snapshot` / `StageSampler`: read every counter (profiling/probes/procfs.py) for a baseline, on a
  thread at a fixed interval, and a final time.

The sidecar (profiling/sidecar.py) and `iobatch profile` (profiling/command.py) both sample through
`StageSampler`, and both hand its profile to profiling/finish.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from profiling.metrics import StageProfile, TimelinePoint
from profiling.probes.procfs import (
    BlockDevice,
    DiskStats,
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
MIN_INTERVAL_S = 0.1  # 10 Hz at most: /proc reads cost ~100 us each, and 1 s is plenty for a stage


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
    tree_io: ProcIo | None  # None when the root process is gone
    disk: DiskStats | None
    cache: PageCache | None
    pressure: Pressure | None
    processes: int = 0


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


def timeline_point(t: float, prev: Snapshot, cur: Snapshot, io_prev: ProcIo, io_cur: ProcIo) -> TimelinePoint:
    """Rates and levels over one interval [prev, cur]."""
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
        read_bps=(io_cur.rchar - io_prev.rchar) / dt,
        write_bps=(io_cur.wchar - io_prev.wchar) / dt,
        device_write_bps=device_bps,
        device_queue_depth=queue,
        dirty_bytes=cur.cache.dirty_bytes if cur.cache else 0,
        writeback_bytes=cur.cache.writeback_bytes if cur.cache else 0,
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
) -> StageProfile:
    """A StageProfile from the baseline snapshot, the periodic ones and the final one (in that order).

    `base_io` overrides the baseline's process counters: a process the profiler started itself begins
    at exactly zero, whatever it did before the first read.
    """
    if len(snapshots) < 2:
        raise ValueError("a stage needs at least a baseline and a final snapshot")
    first, last = snapshots[0], snapshots[-1]
    base = base_io if base_io is not None else (first.tree_io or ProcIo())
    cumulative = _monotonic_io(snapshots, base)
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
    timeline = [
        timeline_point(cur.mono - first.mono, prev, cur, io_prev, io_cur)
        for prev, cur, io_prev, io_cur in zip(snapshots, snapshots[1:], cumulative, cumulative[1:], strict=False)
        if cur.mono > prev.mono
    ]
    sources = {"io": "procfs"}
    if dev:
        sources["device"] = "procfs"
    return StageProfile(
        stage=stage,
        outcome=outcome,
        started_at=started_at,
        duration_s=duration,
        read_bytes=total.rchar,
        write_bytes=total.wchar,
        read_calls=total.syscr,
        write_calls=total.syscw,
        storage_read_bytes=total.storage_read_bytes,
        storage_write_bytes=total.storage_write_bytes,
        cancelled_write_bytes=total.cancelled_write_bytes,
        items=items,
        sources=sources,
        properties=dict(properties or {}),
        timeline=timeline,
        **dev,
        **cache,
        **psi,
    )


# ---- sampling ------------------------------------------------------------------------------------------


def take_snapshot(root: int, device: BlockDevice | None) -> Snapshot:
    """Read every counter once. Process counters first: they are the ones that race with the job."""
    tree_io, count = read_tree_io(root)
    return Snapshot(
        mono=time.monotonic(),
        tree_io=tree_io,
        disk=read_diskstats(device.name) if device else None,
        cache=read_page_cache(),
        pressure=read_pressure(),
        processes=count,
    )


class StageSampler:
    """Samples one stage: `start()` takes the baseline, a thread samples every interval, `finish()` the end."""

    def __init__(self, *, stage: str, pid: int, device: BlockDevice | None, interval_s: float,
                 base_io: ProcIo | None = None) -> None:
        self.stage = stage
        self.pid = pid
        self.device = device
        self.interval_s = interval_s
        self.base_io = base_io
        self.started_at = time.time()
        self._snapshots: list[Snapshot] = []
        self._closing: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{stage}", daemon=True)

    def start(self) -> None:
        self.started_at = time.time()
        self._snapshots.append(take_snapshot(self.pid, self.device))
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            snap = take_snapshot(self.pid, self.device)
            with self._lock:
                if not self._stop.is_set():
                    self._snapshots.append(snap)
            next_at += self.interval_s
            if next_at < time.monotonic():  # fell behind (suspended VM): do not burst to catch up
                next_at = time.monotonic() + self.interval_s

    def close(self, final: Snapshot | None = None) -> None:
        """Stop sampling and take the closing snapshot (or use `final`: a command the profiler waited
        for is read while still a zombie, before it is reaped). Cheap: the job may go on after this."""
        if self._closing is not None:
            return
        with self._lock:
            self._stop.set()
        self._thread.join(timeout=5)
        self._closing = final or take_snapshot(self.pid, self.device)

    def finish(self, *, outcome: str, items: int | None = None, final: Snapshot | None = None,
               properties: Mapping[str, str] | None = None) -> StageProfile:
        """Close (if not yet closed) and build the profile."""
        self.close(final)
        assert self._closing is not None
        snapshots = [*self._snapshots, self._closing]
        return build_profile(stage=self.stage, outcome=outcome, started_at=self.started_at,
                             snapshots=snapshots, device=self.device, base_io=self.base_io, items=items,
                             properties=properties)
