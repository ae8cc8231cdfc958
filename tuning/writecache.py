"""The write cache: the page cache between the jobs and the volume, its dirty limits and how the kernel paces
writers against them (balance_dirty_pages). Pure: tuning.simulator steps jobs through it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

# The share of an instance's memory the kernel counts as "dirtyable" (free + reclaimable page cache);
# vm.dirty_ratio is a percentage of that, not of MemTotal. An approximation: it depends on what runs.
DIRTYABLE_FRACTION = 0.9
# WriteCache.pacing: how the kernel's controller paces writers past the freerun point.
SETTLED, UNSETTLED, HELD = "settled", "unsettled", "held"


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
    towards the setpoint and stays there. A controller in another state does otherwise, and two bounds say how
    far (mm/page-writeback.c, wb_update_dirty_ratelimit; mm/backing-dev.c, wb_init):

    - UNSETTLED, the optimistic one: dirty_ratelimit starts at INIT_BW (100 MiB/s per writer) on a new
      writeback context (a device's, and on cgroup v2 each container's own: a new child starts afresh) and
      moves down only while the count is above the setpoint (below it, only up), by about an eighth of the gap
      each 200 ms. So below the setpoint such writers are paced at 100-200 MiB/s each, hardly a pause on an
      HDD volume. The cache runs writers free up to the setpoint, then as the settled one.
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
                  expired: float = 0.0) -> tuple[float, float]:
    """One step of the write cache (WriteCache): (bytes written back, bytes accepted from writers).

    Writeback moves what the volume allows once the global count is above the background limit; below it, only
    the `expired` bytes (older than the cache's expire_s). Writers fill the room below freerun at their own
    speed; past it they are paced at the drained bytes times pos_ratio, never past the setpoint in one step
    (held: at the drained bytes, so the count stays at freerun).
    """
    others = cache.other_dirty_bytes
    moved = min(dirty, room) if dirty + others > cache.background_bytes else min(expired, room)
    free = max(0.0, cache.freerun_bytes - others - dirty)
    if want <= free:
        return moved, want
    if cache.pacing == HELD:
        return moved, min(want, free + moved)
    level = dirty + free + others  # the global count once the free room is used
    paced = moved * cache.pos_ratio(level)
    if level < cache.setpoint_bytes:
        paced = min(paced, moved + cache.setpoint_bytes - level)
    return moved, min(want, free + paced)
