"""The write cache and the burst-bucket simulator: rounds of jobs replayed on one volume. Pure: no clock, no files.

A WriteCache is the page cache between the jobs and the volume (the kernel's dirty limits); `simulate()`
steps the jobs' stages through that cache and the volume's credit bucket (tuning.ebs.Volume) and reports
each round's stage times, when its writes were durable and when the credits ran out.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuning.ebs import MIB, Volume

# The share of an instance's memory the kernel counts as "dirtyable" (free + reclaimable page cache);
# vm.dirty_ratio is a percentage of that, not of MemTotal. An approximation: it depends on what runs.
DIRTYABLE_FRACTION = 0.9


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

    The model keeps the converged controller: above freerun, writers together dirty at the rate
    writeback drains the device times the global pos_ratio, so the dirty count climbs from freerun
    towards the setpoint and stays there. A controller that has not settled does otherwise, and
    `settled=False` is that bound: dirty_ratelimit starts at INIT_BW (100 MiB/s per writer) on a new
    writeback context (a device's, and on cgroup v2 each container's own: a new child starts afresh)
    and wb_update_dirty_ratelimit moves it down only while the count is above the setpoint (below it,
    only up), by about an eighth of the gap each 200 ms. So below the setpoint such writers are paced at
    100-200 MiB/s each, which on an HDD volume is hardly a pause: measured, a burst 16 % past the
    freerun point and short of the setpoint paused one child 0.24-0.31 s where the settled model says
    about 2 s (BENCHMARKS.md). The unsettled cache runs writers free up to the setpoint, then as the
    settled one; the truth lies between the two, nearer the settled one the longer writers are paced
    (mm/page-writeback.c, wb_update_dirty_ratelimit; mm/backing-dev.c, wb_init). The model leaves out the
    device's own factor (1 when the volume is the host's only busy writer, as scratch on a Batch host is).
    The lab checks it against measured runs (BENCHMARKS.md, "The advisor in the lab"); the lab
    keeps its device's data in memory because of that factor: with the data on a disk, a second device wrote back
    as much as the volume, the writers were held near freerun and the model was 14-16 % short.
    """

    limit_bytes: int
    background_bytes: int
    other_dirty_bytes: int = 0  # dirty + writeback pages of other devices, counted against the same limits
    settled: bool = True  # False: writers run free up to the setpoint (a controller not yet settled)

    # Cached: the simulator asks for them at every step (a day of a busy plan is ~650,000 steps).
    @functools.cached_property
    def freerun_bytes(self) -> int:
        """Where writers start to be paced: the kernel's freerun ceiling, or the setpoint when unsettled."""
        return self.kernel_freerun_bytes if self.settled else self.setpoint_bytes

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
        return dataclasses.replace(self, settled=False)

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


# ---- the simulator -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageLoad:
    """One stage of one job as the volume sees it, usually taken from measured profiles.

    write_bytes go through the page cache; read_bytes are cache misses read from the volume; floor_s is
    the time the stage takes when the volume is not what it waits on (network, CPU); random_share is the
    share of its bytes the device sees as random requests (HDD accounting, tuning.ebs.Volume.cost_per_byte).
    """

    name: str
    write_bytes: int
    read_bytes: int = 0
    io_size: int = MIB
    floor_s: float = 0.0
    random_share: float = 0.0

    @property
    def pattern(self) -> tuple[int, float]:
        """What the volume's accounting depends on: the I/O size and the random share."""
        return (self.io_size, self.random_share)


@dataclass(frozen=True)
class Sample:
    """The volume at one moment of a simulation."""

    t: float
    throughput_bps: float
    credits: float
    dirty_bytes: float


@dataclass(frozen=True)
class WaveResult:
    """One round of back-to-back jobs (all jobs of an instance running the same stage together)."""

    index: int
    started_at: float
    stage_s: dict[str, float]
    durable_at: float | None  # when the wave's writes were all on the volume
    credits_at_start: float

    @property
    def time_to_durable_s(self) -> float | None:
        return None if self.durable_at is None else self.durable_at - self.started_at


@dataclass(frozen=True)
class SimResult:
    volume: Volume
    waves: list[WaveResult]
    samples: list[Sample]
    credits_empty_at: float | None  # first time the bucket ran dry, seconds from the start
    ended_at: float

    def stage_times(self, stage: str) -> list[float]:
        return [w.stage_s[stage] for w in self.waves if stage in w.stage_s]


@dataclass(frozen=True)
class _Rates:
    """A volume's figures at one I/O size, computed once: the simulator's inner loop reads only these."""

    burst_bps: float
    base_bps: float
    cost_per_byte: float
    earn: float
    capacity: float
    bursts: bool

    @classmethod
    def of(cls, volume: Volume, pattern: tuple[int, float], instance_cap_bps: float | None,
           baseline_only: bool = False) -> _Rates:
        io_size, random_share = pattern
        rates = cls(
            burst_bps=volume.throughput_bps(io_size=io_size, bursting=True, instance_cap_bps=instance_cap_bps,
                                            random_share=random_share),
            base_bps=volume.throughput_bps(io_size=io_size, bursting=False, instance_cap_bps=instance_cap_bps,
                                           random_share=random_share),
            cost_per_byte=volume.cost_per_byte(io_size, random_share=random_share),
            earn=volume.earn_rate(),
            capacity=volume.credit_capacity,
            bursts=volume.bursts,
        )
        if baseline_only:
            return cls(rates.base_bps, rates.base_bps, rates.cost_per_byte, 0.0, 0.0, False)
        return rates


@dataclass
class _State:
    t: float = 0.0
    credits: float = 0.0
    dirty: float = 0.0
    written_back: float = 0.0  # cumulative bytes moved from cache to volume
    accepted: float = 0.0  # cumulative bytes written into the cache
    empty_at: float | None = None
    samples: list[Sample] = field(default_factory=list)
    next_sample: float = 0.0
    pending_durable: list[tuple[int, float]] = field(default_factory=list)  # (wave, accepted mark)
    durable: dict[int, float] = field(default_factory=dict)
    last_wb_t: float = 0.0  # when writeback last moved bytes
    wb_rates: _Rates | None = None  # writeback's figures: those of the last stage that wrote


def simulate(
    volume: Volume,
    stages: Sequence[StageLoad],
    *,
    concurrency: int = 1,
    waves: int = 1,
    gap_s: float = 0.0,
    cache: WriteCache | None = None,
    instance_cap_bps: float | None = None,
    initial_credits: float | None = None,
    dt: float | None = None,
    sample_every_s: float = 10.0,
    baseline_only: bool = False,
) -> SimResult:
    """Replay `waves` rounds of `concurrency` jobs on one volume, back to back with `gap_s` between.

    All jobs of a round run the same stage at the same time (the worst case, and what happens when an
    instance starts a batch of children together). Each step the volume serves reads first, then
    writeback of dirty data; writers fill the cache at their own speed until it reaches the freerun
    point, then as the kernel paces them (WriteCache): about the rate writeback frees it. Credits are
    spent in the volume's accounting (HDD: sequential I/O merged into 1 MiB units, a random I/O < 1 MiB
    costs 1 MiB) and refill at baseline, also between rounds. A stage steps in `dt`
    (default: 1/40 of its floor time, 0.05-2 s); idle time is solved in closed form. `baseline_only`
    holds the volume at baseline throughout (a bucket kept empty, as the lab's --after-cliff does).
    """
    if concurrency < 1 or waves < 1:
        raise ValueError("concurrency and waves must be at least 1")
    if not stages:
        raise ValueError("a workload needs at least one stage")
    cache = cache or WriteCache(0, 0)
    rates = {st.pattern: _Rates.of(volume, st.pattern, instance_cap_bps, baseline_only) for st in stages}
    state = _State(credits=0.0 if baseline_only else
                   volume.credit_capacity if initial_credits is None else initial_credits)
    state.wb_rates = rates[stages[0].pattern]
    results: list[WaveResult] = []
    for wave in range(waves):
        started, credits_at_start = state.t, state.credits
        stage_s: dict[str, float] = {}
        for stage in stages:
            step = dt if dt is not None else max(0.05, min(2.0, (stage.floor_s or 2.0) / 40))
            stage_s[stage.name] = _run_stage(stage, rates[stage.pattern], concurrency, cache, step, state,
                                             sample_every_s)
        state.pending_durable.append((wave, state.accepted))
        _check_durable(state, state.last_wb_t)
        results.append(WaveResult(wave, started, stage_s, None, credits_at_start))
        if wave < waves - 1:
            _idle(gap_s, cache, state, sample_every_s)
    # Let the last wave's writes reach the volume.
    _idle(math.inf, cache, state, sample_every_s)
    final = [WaveResult(w.index, w.started_at, w.stage_s, state.durable.get(w.index), w.credits_at_start)
             for w in results]
    return SimResult(volume, final, state.samples, state.empty_at, state.t)


def _spend(state: _State, r: _Rates, dt: float, moved: float) -> None:
    """Credits after moving `moved` bytes in `dt` seconds."""
    if not r.bursts:
        return
    state.credits = min(r.capacity, state.credits + r.earn * dt - moved * r.cost_per_byte)
    if state.credits <= 1e-9:
        state.credits = 0.0
        if state.empty_at is None:
            state.empty_at = state.t + dt


def _sample(state: _State, rate: float, sample_every_s: float) -> None:
    if state.t >= state.next_sample:
        state.samples.append(Sample(state.t, rate, state.credits, state.dirty))
        state.next_sample = state.t + sample_every_s


def _tick(state: _State, r: _Rates, *, dt: float, read_want: float, write_want: float,
          cache: WriteCache, sample_every_s: float) -> tuple[float, float]:
    """Advance one step of a running stage; returns (bytes read, bytes accepted into the cache)."""
    if state.credits > 0:
        # Burst, but spend no more credits than the bucket holds plus what this step earns.
        affordable = (state.credits + r.earn * dt) / r.cost_per_byte
        cap = min(r.burst_bps * dt, max(affordable, r.base_bps * dt))
    else:
        cap = r.base_bps * dt
    read = min(read_want, cap)
    left = cap - read
    if cache.freerun_bytes <= 0:
        # No cache: writes go straight to the volume, sharing what reads left.
        accepted = moved = min(write_want, left)
    else:
        moved, accepted = _through_cache(cache, state.dirty, left, write_want)
        state.dirty = max(0.0, state.dirty + accepted - moved)
    state.accepted += accepted
    state.written_back += moved
    _spend(state, r, dt, read + moved)
    state.t += dt
    if moved > 0:
        state.last_wb_t = state.t
    _check_durable(state, state.t)
    _sample(state, (read + moved) / dt, sample_every_s)
    return read, accepted


def _through_cache(cache: WriteCache, dirty: float, room: float, want: float) -> tuple[float, float]:
    """One step of the write cache (WriteCache): (bytes written back, bytes accepted from writers).

    Writeback moves what the volume allows once the global count is above the background limit (below it,
    the data waits to expire). Writers fill the room below freerun at their own speed; past it they are
    paced at the drained bytes times pos_ratio, never past the setpoint in one step.
    """
    others = cache.other_dirty_bytes
    moved = min(dirty, room) if dirty + others > cache.background_bytes else 0.0
    free = max(0.0, cache.freerun_bytes - others - dirty)
    if want <= free:
        return moved, want
    level = dirty + free + others  # the global count once the free room is used
    paced = moved * cache.pos_ratio(level)
    if level < cache.setpoint_bytes:
        paced = min(paced, moved + cache.setpoint_bytes - level)
    return moved, min(want, free + paced)


def _check_durable(state: _State, when: float) -> None:
    while state.pending_durable and state.written_back >= state.pending_durable[0][1] - 1:
        wave, _ = state.pending_durable.pop(0)
        state.durable[wave] = when


def _run_stage(stage: StageLoad, r: _Rates, concurrency: int, cache: WriteCache, dt: float, state: _State,
               sample_every_s: float) -> float:
    total_w = float(stage.write_bytes * concurrency)
    total_r = float(stage.read_bytes * concurrency)
    floor = max(stage.floor_s, 0.0)
    start = state.t
    done_w = done_r = 0.0
    if total_w > 0:
        state.wb_rates = r
    # The job's own speed: all of the stage's bytes over its floor time (no limit if the floor is 0).
    w_rate = total_w / floor if floor > 0 else math.inf
    r_rate = total_r / floor if floor > 0 else math.inf
    limit = start + 30 * 86400
    last_rate = 0.0
    while (done_w < total_w - 0.5 or done_r < total_r - 0.5) and state.t < limit:
        # Long stages take longer steps (1/10 of the time so far), so a day at baseline needs thousands,
        # not millions, of steps; the last step is cut to what the remaining bytes need at the rate the
        # previous step achieved, so a stage does not overshoot its end.
        step = max(dt, (state.t - start) / 10)
        if last_rate > 0:
            need = max(total_w - done_w, total_r - done_r) / last_rate
            step = min(step, max(dt, need))
        read, accepted = _tick(state, r, dt=step, read_want=min(total_r - done_r, r_rate * step),
                               write_want=min(total_w - done_w, w_rate * step), cache=cache,
                               sample_every_s=sample_every_s)
        done_r += read
        done_w += accepted
        last_rate = max(read, accepted) / step
    if state.t - start < floor:
        # All bytes are in; the job still runs (network, CPU) while writeback goes on.
        _idle(floor - (state.t - start), cache, state, sample_every_s, flush=False)
    return state.t - start


def _idle(seconds: float, cache: WriteCache, state: _State, sample_every_s: float, *,
          flush: bool = True) -> None:
    """Nothing reads or writes for `seconds`: writeback drains the cache, credits refill. Closed form.

    With flush, all dirty data drains (the kernel writes it back once it expires); without, only what
    lies above the background threshold.
    """
    r = state.wb_rates
    assert r is not None
    end = state.t + seconds
    floor_dirty = 0.0 if flush else float(max(0, cache.background_bytes - cache.other_dirty_bytes))
    while state.t < end and state.dirty > floor_dirty + 0.5:
        bursting = r.bursts and state.credits > 0
        rate = r.burst_bps if bursting else r.base_bps
        span = min(end - state.t, (state.dirty - floor_dirty) / rate)
        if bursting:
            drain = rate * r.cost_per_byte - r.earn  # credit units per second, net
            if drain > 0:
                span = min(span, state.credits / drain)
        span = max(span, 1e-6)
        moved = min(rate * span, state.dirty - floor_dirty)
        state.dirty -= moved
        state.written_back += moved
        _spend(state, r, span, moved)
        state.t += span
        state.last_wb_t = state.t
        _check_durable(state, state.t)
        _sample(state, rate, sample_every_s)
    if state.t < end and not math.isinf(end):
        if r.bursts:
            state.credits = min(r.capacity, state.credits + r.earn * (end - state.t))
        state.t = end
        _sample(state, 0.0, sample_every_s)
