"""The credit controller: a thread that follows the volume's credit bucket (tuning.ebs) and sets the lab
device's throughput limit to burst while credits last, then to baseline.

It reads the device's completed I/O from /proc/diskstats, charges it in the volume's accounting and samples
the host's page cache and io pressure at every tick; /proc is read
through profiling.probes.procfs. `time_scale` shrinks the bucket so that hours of credits fit in minutes;
throughputs stay real.

This is the blkio (cgroup v1) throttle's controller. /proc/diskstats counts requests, not where they land,
so it cannot tell sequential from random: it charges the device's I/O as `random_share` says (default 0,
sequential, merged into 1 MiB units as st1 does). The FUSE device (tuning.lab.fusedev) sees each request's
offset and applies the whole accounting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from profiling.probes.procfs import SECTOR_BYTES, DiskStats, read_diskstats, read_page_cache, read_pressure
from tuning.ebs import HDD_IO_UNIT, MIB, Volume
from tuning.lab.config import LabError


@dataclass(frozen=True)
class DiskCounters:
    """The completed I/O of one block device that the credit accounting charges."""

    read_ops: int
    read_bytes: int
    write_ops: int
    write_bytes: int

    @classmethod
    def of(cls, stats: DiskStats) -> DiskCounters:
        return cls(stats.reads, stats.sectors_read * SECTOR_BYTES, stats.writes, stats.sectors_written * SECTOR_BYTES)


def read_device_counters(name: str) -> DiskCounters:
    """Completed I/O of one block device (a name such as 'loop3'); LabError if the device is not listed."""
    stats = read_diskstats(name)
    if stats is None:
        raise LabError(f"{name} is not in /proc/diskstats: was the loop device detached?")
    return DiskCounters.of(stats)


@dataclass(frozen=True)
class HostSample:
    """Host-wide page-cache and pressure figures at one moment."""

    t: float
    dirty_bytes: int
    writeback_bytes: int
    dirty_threshold_bytes: int
    background_threshold_bytes: int
    io_some_us: int


def read_host_sample(t: float) -> HostSample:
    """The page cache (/proc/vmstat) and io pressure (/proc/pressure/io) now; zeros where they are unreadable."""
    cache = read_page_cache()
    pressure = read_pressure()
    if cache is None:
        return HostSample(t, 0, 0, 0, 0, pressure.some_us if pressure else 0)
    return HostSample(t, cache.dirty_bytes, cache.writeback_bytes, cache.dirty_threshold_bytes,
                      cache.dirty_background_threshold_bytes, pressure.some_us if pressure else 0)


@dataclass(frozen=True)
class ControlPoint:
    """One controller tick: lab seconds, credits (at the real volume's scale), the limit and the traffic."""

    t: float
    credits_mib: float
    limit_bps: int
    device_bps: float
    host: HostSample


class CreditController(threading.Thread):
    """Follows the volume's credit bucket and sets the throughput limit (`set_limit`) to burst or baseline."""

    def __init__(self, *, volume: Volume, device_name: str, set_limit: Callable[[int], None],
                 time_scale: float, initial_credits_mib: float, tick_s: float, hold_empty: bool = False,
                 random_share: float = 0.0) -> None:
        super().__init__(name="iobatch-lab-credits", daemon=True)
        self.volume = volume
        self.device_name = device_name
        self.set_limit = set_limit
        self.time_scale = time_scale
        self.tick_s = tick_s
        self.hold_empty = hold_empty
        self.random_share = random_share
        # The lab's bucket: the real one divided by the time scale.
        self.capacity = volume.credit_capacity / time_scale
        self.credits = initial_credits_mib / time_scale
        self.burst_bps = int(volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=True))
        self.base_bps = int(volume.throughput_bps(io_size=HDD_IO_UNIT, bursting=False))
        self.points: list[ControlPoint] = []
        self._dry = self.credits <= 0
        # One second of burst above baseline (at least two ticks).
        self.resume_credits = (volume.spend_limit(True) - volume.earn_rate()) * max(1.0, 2 * tick_s)
        self.empty_at: float | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()
        self.started_at = time.monotonic()
        self.error: BaseException | None = None

    @property
    def bursting(self) -> bool:
        """Whether the limit in force is the burst throughput."""
        if not self.volume.bursts or self.hold_empty:
            return False
        if self._dry:
            # Once empty, burst again only with enough credits for a while at burst: a bucket that
            # flips between burst and baseline every tick would average the two instead of baseline.
            return self.credits >= self.resume_credits
        return self.credits > 0

    def current_limit(self) -> int:
        """The throughput limit (bytes per second) the bucket allows now."""
        return self.burst_bps if self.bursting else self.base_bps

    @property
    def credits_gib(self) -> float:
        """Credits left, at the real volume's scale (GiB of 1 MiB I/O)."""
        return self.credits * self.time_scale / 1024

    def charge(self, before: DiskCounters, after: DiskCounters) -> float:
        """Credit units (MiB) the I/O between two readings costs, at the controller's random share."""
        cost = 0.0
        for ops, nbytes in ((after.read_ops - before.read_ops, after.read_bytes - before.read_bytes),
                            (after.write_ops - before.write_ops, after.write_bytes - before.write_bytes)):
            if nbytes <= 0:
                continue  # flushes and other zero-byte requests move no data
            per_byte = (self.volume.cost_per_byte(nbytes / ops, random_share=self.random_share) if ops > 0
                        else 1 / MIB)
            cost += nbytes * per_byte
        return cost

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # reported by the owner; the lab still restores on exit
            self.error = exc

    def _loop(self) -> None:
        applied = self.current_limit()
        self.set_limit(applied)
        last = read_device_counters(self.device_name)
        last_t = time.monotonic()
        while not self._halt.wait(self.tick_s):
            now = time.monotonic()
            counters = read_device_counters(self.device_name)
            dt = now - last_t
            moved = (counters.read_bytes - last.read_bytes) + (counters.write_bytes - last.write_bytes)
            with self._lock:
                if self.volume.bursts and not self.hold_empty:
                    self.credits += self.volume.earn_rate() * dt - self.charge(last, counters)
                    self.credits = min(max(self.credits, 0.0), self.capacity)
                    if self.credits <= 0:
                        self._dry = True
                        if self.empty_at is None:
                            self.empty_at = now - self.started_at
                    elif self.credits >= self.resume_credits:
                        self._dry = False
                limit = self.current_limit()
                self.points.append(ControlPoint(now - self.started_at, self.credits * self.time_scale, limit,
                                                moved / dt if dt > 0 else 0.0, read_host_sample(now)))
            if limit != applied:
                # Only on change: every write to the throttle file restarts blk-throttle's time slice.
                self.set_limit(limit)
                applied = limit
            last, last_t = counters, now

    def stop(self) -> None:
        """End the thread (within five seconds)."""
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def window(self, start: float, end: float) -> list[ControlPoint]:
        """Points between two time.monotonic() readings."""
        a, b = start - self.started_at, end - self.started_at
        with self._lock:
            return [p for p in self.points if a <= p.t <= b]
