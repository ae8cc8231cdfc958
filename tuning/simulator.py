"""The burst-bucket simulator: rounds of jobs replayed on one volume. Pure: no clock, no files.

The write cache between the jobs and the volume is tuning.writecache.WriteCache; `simulate()`
steps the jobs' stages through that cache and the volume's credit bucket (tuning.ebs.Volume) and reports
each round's stage times, when its writes were durable and when the credits ran out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuning.ebs import MIB, Volume
from tuning.writecache import FRESH, INIT_BW_BPS, RATELIMIT_TAU_S, WriteCache, through_cache

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
    discarded: float = 0.0  # cumulative bytes dropped dirty: removed with the child's scratch, never written
    last_wb_t: float = 0.0  # when writeback last moved bytes
    wb_rates: _Rates | None = None  # writeback's figures: those of the last stage that wrote
    # (t, accepted) whenever writers added bytes: how old the dirty data is (WriteCache.expire_s). Entries before
    # `first` are written or dropped (forgotten); the lists are cut once that prefix is long.
    history_t: list[float] = field(default_factory=list)
    history_accepted: list[float] = field(default_factory=list)
    first: int = 0
    # Each writer's dirty_ratelimit under FRESH pacing (WriteCache): each round's children are new containers.
    ratelimit_bps: float = INIT_BW_BPS

    def record(self, t: float) -> None:
        """Writers have accepted `self.accepted` bytes by `t`."""
        self.history_t.append(t)
        self.history_accepted.append(self.accepted)
        if self.first > 4096:  # a day of a busy plan is ~650,000 steps
            del self.history_t[:self.first], self.history_accepted[:self.first]
            self.first = 0

    def _unwritten(self) -> int:
        """The index of the oldest entry whose bytes are not all written or dropped (len when none)."""
        gone = self.written_back + self.discarded + 0.5
        while self.first < len(self.history_t) and self.history_accepted[self.first] <= gone:
            self.first += 1
        return self.first

    def expired(self, cache: WriteCache) -> float:
        """Dirty bytes accepted more than cache.expire_s ago (oldest written first): the flusher's to write."""
        cutoff = self.t - cache.expire_s
        first = self._unwritten()
        if first == len(self.history_t) or self.history_t[first] > cutoff:
            return 0.0
        i = bisect.bisect_right(self.history_t, cutoff, lo=first)
        return min(self.dirty, max(0.0, self.history_accepted[i - 1] - self.written_back - self.discarded))

    def next_expiry(self, cache: WriteCache) -> float | None:
        """When the oldest dirty byte not yet expired expires; None when there is none."""
        first = self._unwritten()
        return self.history_t[first] + cache.expire_s if first < len(self.history_t) else None


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
    sample_every_s: float | None = 10.0,
    baseline_only: bool = False,
    removes_scratch: bool = True,
    replay_every_wave: bool = False,
) -> SimResult:
    """Replay `waves` rounds of `concurrency` jobs on one volume, back to back with `gap_s` between.

    All jobs of a round run the same stage at the same time (the worst case, and what happens when an
    instance starts a batch of children together). Each step the volume serves reads first, then
    writeback of dirty data; writers fill the cache at their own speed until it reaches the freerun
    point, then as the kernel paces them (WriteCache): about the rate writeback frees it. Credits are
    spent in the volume's accounting (HDD: sequential I/O merged into 1 MiB units, a random I/O < 1 MiB
    costs 1 MiB) and refill at baseline, also between rounds. A stage steps in `dt`
    (default: 1/40 of its floor time, 0.05-2 s); idle time is solved in closed form. `baseline_only`
    holds the volume at baseline throughout (a bucket kept empty, as the lab's --after-cliff does). `sample_every_s`
    None: no samples (what reads only the rounds' times: a sample's phase would keep rounds from repeating, below).

    With `removes_scratch` (what the job does: pipeline.scratch.Scratch.release, on every exit path), what a
    round leaves dirty when its children end is dropped, never written: the kernel discards the dirty pages
    of a deleted file (truncate_inode_pages). Measured in the lab: children of 6 images each, two at once,
    the second round's peak dirty pages stayed at the first round's alone (244 MiB), where a model that kept
    the first round's dirty pages paused the second round 1.7 s and the children were not paused at all
    (BENCHMARKS.md). A round's durable time is then when its writes were on the volume or dropped.

    A round that starts from the state the previous one started from (the same credits, dirty bytes and writeback
    figures, nothing pending: a bucket that refills to full, or stays empty, between rounds) runs as that one did,
    later: the rounds from there to the last but one are that round shifted in time, not replayed (a day of a small
    plan is ~2,000 rounds); the last is replayed, so the day ends as it would. `replay_every_wave` replays them all
    (the tests' reference).
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
    if sample_every_s is None:
        state.next_sample = sample_every_s = math.inf
    results: list[WaveResult] = []
    last_start: tuple[float, float, int, float] | None = None  # the previous round's start, when one could repeat it
    first_sample = 0
    wave = 0
    while wave < waves:
        start = _start(state)
        if not replay_every_wave and start is not None and start == last_start and wave < waves - 1:
            wave = _repeat(results, state, first_sample, waves - 1)
            last_start = None
            continue
        last_start, first_sample = start, len(state.samples)
        started, credits_at_start = state.t, state.credits
        state.ratelimit_bps = INIT_BW_BPS
        stage_s: dict[str, float] = {}
        for stage in stages:
            step = dt if dt is not None else max(0.05, min(2.0, (stage.floor_s or 2.0) / 40))
            stage_s[stage.name] = _run_stage(stage, rates[stage.pattern], concurrency, cache, step, state,
                                             sample_every_s)
        state.pending_durable.append((wave, state.accepted))
        _check_durable(state, state.last_wb_t)
        if removes_scratch and state.dirty > 0:
            # Every byte still dirty is this round's: the rounds before dropped theirs when they ended.
            state.discarded += state.dirty
            state.dirty = 0.0
            _check_durable(state, state.t)
        results.append(WaveResult(wave, started, stage_s, None, credits_at_start))
        if wave < waves - 1:
            _idle(gap_s, cache, state, sample_every_s)
        wave += 1
    # Let the last wave's writes reach the volume.
    _idle(math.inf, cache, state, sample_every_s)
    final = [WaveResult(w.index, w.started_at, w.stage_s, state.durable.get(w.index), w.credits_at_start)
             for w in results]
    return SimResult(volume, final, state.samples, state.empty_at, state.t)


def _start(state: _State) -> tuple[float, float, int, float] | None:
    """What a round's course depends on at its start, its time aside (the next sample's is taken relative to it, to
    the nanosecond); None while a round's writes are pending."""
    if state.pending_durable:
        return None
    return (state.credits, state.dirty, id(state.wb_rates), round(max(0.0, state.next_sample - state.t), 9))


def _repeat(results: list[WaveResult], state: _State, first_sample: int, until: int) -> int:
    """The rounds from len(results) to `until` (excluded) as copies of the last one, shifted by its period (it
    started from the state they would start from: simulate's docstring); returns `until`."""
    last = results[-1]
    period = state.t - last.started_at
    durable = state.durable.get(last.index)
    samples = state.samples[first_sample:]
    for shift_waves, index in enumerate(range(len(results), until), start=1):
        shift = period * shift_waves
        results.append(WaveResult(index, last.started_at + shift, dict(last.stage_s), None, last.credits_at_start))
        if durable is not None:
            state.durable[index] = durable + shift
        state.samples.extend(Sample(x.t + shift, x.throughput_bps, x.credits, x.dirty_bytes) for x in samples)
    skipped = period * (until - last.index - 1)
    state.t += skipped
    state.next_sample += skipped
    state.last_wb_t += skipped
    return until


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
          cache: WriteCache, sample_every_s: float, writers: int) -> tuple[float, float]:
    """Advance one step of a running stage (`writers` jobs at once); returns (bytes read, bytes accepted into the
    cache)."""
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
        # What has expired counts only below the background limit (above it all dirty data is written): not looked up
        # on the steps above it, most of a paced download's.
        below = state.dirty + cache.other_dirty_bytes <= cache.background_bytes
        ratelimit = state.ratelimit_bps * writers * dt if cache.pacing == FRESH else 0.0
        moved, accepted = through_cache(cache, state.dirty, left, write_want, state.expired(cache) if below else 0.0,
                                        ratelimit)
        if ratelimit:
            # The controller moves dirty_ratelimit towards each writer's share of the drain: only down above the
            # setpoint, only up between freerun and the setpoint (wb_update_dirty_ratelimit).
            share, level = moved / dt / writers, state.dirty + cache.other_dirty_bytes
            if (share < state.ratelimit_bps and level > cache.setpoint_bytes) or \
                    (share > state.ratelimit_bps and cache.freerun_bytes < level < cache.setpoint_bytes):
                state.ratelimit_bps += (share - state.ratelimit_bps) * -math.expm1(-dt / RATELIMIT_TAU_S)
        state.dirty = max(0.0, state.dirty + accepted - moved)
    state.accepted += accepted
    if accepted > 0:
        state.record(state.t + dt)
    state.written_back += moved
    _spend(state, r, dt, read + moved)
    state.t += dt
    if moved > 0:
        state.last_wb_t = state.t
    _check_durable(state, state.t)
    _sample(state, (read + moved) / dt, sample_every_s)
    return read, accepted


def _check_durable(state: _State, when: float) -> None:
    while state.pending_durable and state.written_back + state.discarded >= state.pending_durable[0][1] - 1:
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
                               sample_every_s=sample_every_s, writers=concurrency)
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

    With flush, all dirty data drains (the gap between rounds, or the end); without (a stage's floor time
    after its bytes are in), what lies above the background threshold and what expires meanwhile.
    """
    r = state.wb_rates
    assert r is not None
    end = state.t + seconds
    background = float(max(0, cache.background_bytes - cache.other_dirty_bytes))
    while state.t < end and state.dirty > 0.5:
        drainable = state.dirty if flush else max(state.dirty - background, state.expired(cache))
        if drainable <= 0.5:
            # Below the background limit with nothing expired yet: wait for the oldest bytes to expire.
            wake = state.next_expiry(cache)
            if wake is None or wake >= end:
                break
            _wait(state, r, max(wake, state.t + 1e-6) - state.t, sample_every_s)
            continue
        bursting = r.bursts and state.credits > 0
        rate = r.burst_bps if bursting else r.base_bps
        span = min(end - state.t, drainable / rate)
        if bursting:
            drain = rate * r.cost_per_byte - r.earn  # credit units per second, net
            if drain > 0:
                span = min(span, state.credits / drain)
        span = max(span, 1e-6)
        moved = min(rate * span, drainable)
        state.dirty -= moved
        state.written_back += moved
        _spend(state, r, span, moved)
        state.t += span
        state.last_wb_t = state.t
        _check_durable(state, state.t)
        _sample(state, rate, sample_every_s)
    if state.t < end and not math.isinf(end):
        _wait(state, r, end - state.t, sample_every_s)


def _wait(state: _State, r: _Rates, seconds: float, sample_every_s: float) -> None:
    """Nothing moves for `seconds`: credits refill."""
    if r.bursts:
        state.credits = min(r.capacity, state.credits + r.earn * seconds)
    state.t += seconds
    _sample(state, 0.0, sample_every_s)
