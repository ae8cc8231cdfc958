"""The write cache: the page cache between the jobs and the volume, its dirty limits and how the kernel paces
writers against them (balance_dirty_pages). Pure: tuning.simulator steps jobs through it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

# The share of an instance's memory the kernel counts as "dirtyable" (free + reclaimable page cache);
# vm.dirty_ratio is a percentage of that, not of MemTotal. An approximation: it depends on what runs.
DIRTYABLE_FRACTION = 0.9
# WriteCache.pacing: how the kernel's controller paces writers past the freerun point.
SETTLED, UNSETTLED, HELD, FRESH = "settled", "unsettled", "held", "fresh"
# A new writeback context's dirty_ratelimit, per writer (mm/backing-dev.c, wb_init: INIT_BW, 100 MB/s in pages).
INIT_BW_BPS = 100 * 1024 * 1024
# How fast a FRESH context's dirty_ratelimit comes down to the rate its writers drain, while the count is above the
# setpoint (time constant, s; the kernel's steps shrink as the gap does: wb_update_dirty_ratelimit). Measured in the
# cgroup v2 guest's container-paced child (bench.guest_packed, the balance_dirty_pages tracepoint; BENCHMARKS.md),
# against a 19.5 MiB/s drain: 100 -> 68-75 MiB/s in ~9 s of pacing (17-24 s), 100 -> 87-94 in ~3.5 s (20-50 s).
RATELIMIT_TAU_S = 20.0


@dataclass(frozen=True)
class WriteCache:
    """The page cache between the job and the volume: the kernel's dirty limits, in bytes, and how
    balance_dirty_pages() throttles writers against them (mm/page-writeback.c, Linux 5.x-6.x).

    What the kernel does:

    - The limits are global: the dirty count is every device's dirty plus writeback pages, so another
      device's dirty data (`other_dirty_bytes`) uses up the same room.
    - Writers run free while that count is at most the freerun ceiling, halfway between the background
      and the hard limit (dirty_freerun_ceiling); background writeback runs above the background limit.
    - Above it, each writer is paused so that it dirties at task_ratelimit = dirty_ratelimit x pos_ratio
      (wb_position_ratio). dirty_ratelimit converges on the device's write bandwidth shared among its
      writers (wb_update_dirty_ratelimit); pos_ratio is a cubic of the dirty count around the setpoint,
      (freerun + limit) / 2: 2 at freerun, 1 at the setpoint, 0 at the limit, times a linear factor for
      the device's distance from its share of the setpoint (wb_setpoint = setpoint x the device's share
      of recent writeout, __wb_calc_thresh).

    The model keeps the converged controller (pacing SETTLED): above freerun, writers together dirty at the
    rate writeback drains the device times the global pos_ratio, so the dirty count climbs from freerun
    towards the setpoint and stays there. A controller in another state does otherwise, and three bounds say
    how far (mm/page-writeback.c, wb_update_dirty_ratelimit; mm/backing-dev.c, wb_init):

    - UNSETTLED, the optimistic one on the host's domain: dirty_ratelimit starts at INIT_BW (100 MiB/s per
      writer) on a new writeback context and moves down only while the count is above the setpoint (below it,
      only up). So below the setpoint such writers are paced at 100-200 MiB/s each, hardly a pause on an HDD
      volume. The cache runs writers free up to the setpoint, then as the settled one.
    - FRESH, the optimistic one for a child in its own container (cgroup v2): its container's writeback
      context is new (wb_init: dirty_ratelimit = INIT_BW), and since the count is above the setpoint only once
      the child is paced, dirty_ratelimit comes down slowly (RATELIMIT_TAU_S). So the child is paced at
      INIT_BW x pos_ratio, and the count settles where that equals the drain rate: past the setpoint, towards
      the limit (pos_ratio 0.2 for a 19.5 MiB/s volume). Measured in the guest (BENCHMARKS.md), a 256 MiB
      container writing 240 MiB under 1.26 GiB of vm.dirty_bytes: its count at a median of 165-168 MiB while
      paced, up to 181 (modelled setpoint 157, limit 179), dirty_ratelimit 100 -> 87-94 MiB/s. It is
      optimistic: until the new context has written some back, the kernel paced the child at a quarter of that
      (the device's own factor with no share of recent writeout yet, wb_position_ratio: the tracepoint's
      bdi_setpoint 0, task_ratelimit / dirty_ratelimit 0.25), and the count swung below the balance rather
      than sitting on it: the pauses came out between this bound and the settled one.
    - HELD, the pessimistic one: writers paced at the rate the device drains, so the count stays at the
      freerun point. Measured, not derived: in some lab runs the kernel held the count there for the whole
      burst. Which state does it is not pinned down (a dirty_ratelimit that earlier writers left low climbs
      back only by steps, and the device's own factor, below, lowers pos_ratio); the bound takes it as it is.

    Measured in the lab (BENCHMARKS.md), 2 x 240 MiB into a cache whose freerun point is 414 MiB and setpoint
    483: downloads of 0.6-0.8 s (unsettled: 0.6), 2.5-2.8 s (settled: 2.7-3.0) and, in the three runs of one
    loop, 3.8-4.2 s with the count held at 396-409 MiB (held: 3.9). Where the three differ the advice and the
    lab give the range. The model leaves out the device's own factor (1 when the volume is the host's only busy
    writer, as scratch on a Batch host is); the lab keeps its device's data in memory because of it: with the
    data on a disk, a second device wrote back as much as the volume and the writers were held near freerun.
    """

    limit_bytes: int
    background_bytes: int
    other_dirty_bytes: int = 0  # dirty + writeback pages of other devices, counted against the same limits
    pacing: str = SETTLED  # or UNSETTLED, HELD: the two bounds (see the class)
    # Dirty data older than this is written back even below the background limit (vm.dirty_expire_centisecs,
    # 3000 by default; the flusher looks every vm.dirty_writeback_centisecs, 500: Documentation/admin-guide/
    # sysctl/vm.rst). The model writes back what was accepted more than expire_s ago, oldest first.
    expire_s: float = 30.0

    # Cached: the simulator asks for them at every step (a day of a busy plan is ~650,000 steps).
    @functools.cached_property
    def freerun_bytes(self) -> int:
        """Where writers start to be paced: the kernel's freerun ceiling, or the setpoint when unsettled."""
        return self.setpoint_bytes if self.pacing == UNSETTLED else self.kernel_freerun_bytes

    @functools.cached_property
    def kernel_freerun_bytes(self) -> int:
        """dirty_freerun_ceiling: halfway between the background and the hard limit."""
        return (self.limit_bytes + self.background_bytes) // 2

    @functools.cached_property
    def setpoint_bytes(self) -> int:
        """Where the kernel holds the dirty count under sustained writing."""
        return (self.kernel_freerun_bytes + self.limit_bytes) // 2

    def fresh(self) -> WriteCache:
        """The same limits in a new writeback context, a new container's (see the class): the optimistic bound for
        children in their own containers."""
        return dataclasses.replace(self, pacing=FRESH)

    def balance_bytes(self, ratio: float) -> float:
        """The count at which pos_ratio is `ratio`: where writers paced at 1 / `ratio` times the drain rate stay
        (the setpoint for 1; the freerun point for 2 or more, the limit for 0 or less)."""
        if ratio >= 2.0:
            return float(self.kernel_freerun_bytes)
        if ratio <= 0.0:
            return float(self.limit_bytes)
        span = max(self.limit_bytes - self.setpoint_bytes, 1)
        return self.setpoint_bytes - span * math.copysign(abs(ratio - 1.0) ** (1 / 3), ratio - 1.0)

    def unsettled(self) -> WriteCache:
        """The same limits with a controller that has not settled (see the class): the optimistic bound."""
        return dataclasses.replace(self, pacing=UNSETTLED)

    def held(self) -> WriteCache:
        """The same limits with writers held at the freerun point (see the class): the pessimistic bound."""
        return dataclasses.replace(self, pacing=HELD)

    def pos_ratio(self, dirty: float) -> float:
        """The kernel's global position ratio at a dirty count (all devices): 2 at freerun, 1 at the
        setpoint, 0 at the limit (pos_ratio_polynom, clamped to [0, 2] as the kernel does)."""
        span = max(self.limit_bytes - self.setpoint_bytes, 1)
        x = (self.setpoint_bytes - dirty) / span
        return min(2.0, max(0.0, 1.0 + x**3))

    @classmethod
    def from_ratios(cls, memory_bytes: int, dirty_ratio: int, background_ratio: int) -> WriteCache:
        """Limits as the kernel derives them from vm.dirty_ratio / vm.dirty_background_ratio."""
        dirtyable = memory_bytes * DIRTYABLE_FRACTION
        return cls(int(dirtyable * dirty_ratio / 100), int(dirtyable * background_ratio / 100))


def through_cache(cache: WriteCache, dirty: float, room: float, want: float,
                  expired: float = 0.0, ratelimit: float = 0.0) -> tuple[float, float]:
    """One step of the write cache (WriteCache): (bytes written back, bytes accepted from writers).

    Writeback moves what the volume allows once the global count is above the background limit; below it, only
    the `expired` bytes (older than the cache's expire_s). Writers fill the room below freerun at their own
    speed; past it they are paced at the drained bytes times pos_ratio, never past the setpoint in one step
    (held: at the drained bytes, so the count stays at freerun; fresh: at `ratelimit`, the writers' dirty_ratelimit
    over the step, times pos_ratio, never past the count where that equals the drained bytes).
    """
    others = cache.other_dirty_bytes
    moved = min(dirty, room) if dirty + others > cache.background_bytes else min(expired, room)
    free = max(0.0, cache.freerun_bytes - others - dirty)
    if want <= free:
        return moved, want
    if cache.pacing == HELD:
        return moved, min(want, free + moved)
    level = dirty + free + others  # the global count once the free room is used
    if cache.pacing == FRESH:
        if ratelimit <= 0:
            raise ValueError("fresh pacing needs the writers' dirty_ratelimit over the step")
        rate, balance = ratelimit, cache.balance_bytes(moved / ratelimit)
    else:
        rate, balance = moved, cache.setpoint_bytes
    paced = rate * cache.pos_ratio(level)
    if level < balance:
        paced = min(paced, moved + balance - level)
    return moved, min(want, free + paced)
