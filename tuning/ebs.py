"""EBS volume models (st1, sc1, gp2, gp3, io2) and a burst-bucket simulator. Pure: no clock, no files.

The formulas are the ones AWS documents for each volume type:

- st1 (throughput-optimised HDD, 125 GiB-16 TiB): baseline 40 MiB/s per TiB, burst 250 MiB/s per TiB,
  both capped at 500 MiB/s. The credit bucket holds 1 TiB of credits per TiB of size and fills at the
  baseline rate.
- sc1 (cold HDD, 125 GiB-16 TiB): baseline 12 MiB/s per TiB, burst 80 MiB/s per TiB, capped at 250 MiB/s.
- HDD accounting: an I/O of up to 1 MiB costs 1 MiB of throughput and credits, so small random I/O
  drains an HDD volume far faster than its byte count suggests.
- gp2 (1 GiB-16 TiB): 3 IOPS per GiB (100-16,000), bursting to 3,000 IOPS from a 5.4 million I/O-credit
  bucket; volumes of 1,000 GiB and more have a baseline of 3,000 IOPS or more and never burst. Throughput
  is at most 128 MiB/s up to 170 GiB and 250 MiB/s above.
- gp3 (1 GiB-16 TiB): 3,000 IOPS and 125 MiB/s at any size, provisionable to 16,000 IOPS and 1,000 MiB/s
  (at most 500 IOPS per GiB and 0.25 MiB/s per IOPS); no bursting.
- io2 (4 GiB-64 TiB): provisioned IOPS (100-256,000, at most 1,000 per GiB), throughput up to 4,000 MiB/s.
- SSD accounting: an I/O of up to 256 KiB counts as one I/O; larger ones count as one per 256 KiB.

Credits are kept in "credit units": MiB of accounted throughput for HDD types, I/Os for gp2. Volumes
without a bucket (gp3, io2) have a capacity of zero and always run at their provisioned rate.

On top of the volume, an instance caps EBS bandwidth per instance type (`instance_cap_bps`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

VOLUME_TYPES: tuple[str, ...] = ("st1", "sc1", "gp2", "gp3", "io2")
HDD_TYPES: tuple[str, ...] = ("st1", "sc1")
# HDD volumes account each I/O as at least this many bytes.
HDD_IO_UNIT = MIB
# SSD volumes count I/Os in units of up to this size.
SSD_IO_UNIT = 256 * KIB

SIZE_RANGE_GIB: dict[str, tuple[int, int]] = {
    "st1": (125, 16 * 1024),
    "sc1": (125, 16 * 1024),
    "gp2": (1, 16 * 1024),
    "gp3": (1, 16 * 1024),
    "io2": (4, 64 * 1024),
}

# HDD: (baseline MiB/s per TiB, burst MiB/s per TiB, cap MiB/s for both)
_HDD_RATES: dict[str, tuple[float, float, float]] = {
    "st1": (40.0, 250.0, 500.0),
    "sc1": (12.0, 80.0, 250.0),
}
GP2_IOPS_PER_GIB = 3
GP2_MIN_IOPS = 100
GP2_MAX_IOPS = 16_000
GP2_BURST_IOPS = 3_000
GP2_BUCKET_CREDITS = 5_400_000
GP3_BASE_IOPS = 3_000
GP3_BASE_MIBPS = 125.0
GP3_MAX_IOPS = 16_000
GP3_MAX_MIBPS = 1_000.0
GP3_MAX_IOPS_PER_GIB = 500
GP3_MAX_MIBPS_PER_IOPS = 0.25
IO2_MIN_IOPS = 100
IO2_MAX_IOPS = 256_000
IO2_MAX_IOPS_PER_GIB = 1_000
IO2_MAX_MIBPS = 4_000.0


class VolumeError(ValueError):
    """A volume the EBS API would refuse; the message names the value and the allowed range."""


@dataclass(frozen=True)
class Volume:
    """One EBS volume: its type, size and (gp3, io2) provisioned performance.

    `iops` is required for io2 and optional for gp3 (default 3,000); `throughput_mibps` is gp3 only
    (default 125). Both are refused for the other types, as the EBS API refuses them.
    """

    kind: str
    size_gib: int
    iops: int | None = None
    throughput_mibps: float | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if self.kind not in VOLUME_TYPES:
            raise VolumeError(f"volume type {self.kind!r} is not one of {', '.join(VOLUME_TYPES)}")
        low, high = SIZE_RANGE_GIB[self.kind]
        if not low <= self.size_gib <= high:
            raise VolumeError(f"{self.kind} size {self.size_gib} GiB is outside {low}-{high} GiB")
        if self.kind in ("st1", "sc1", "gp2"):
            if self.iops is not None or self.throughput_mibps is not None:
                raise VolumeError(f"{self.kind} takes no provisioned IOPS or throughput: drop them")
        elif self.kind == "gp3":
            iops = self.provisioned_iops
            mibps = self.provisioned_mibps
            if not GP3_BASE_IOPS <= iops <= GP3_MAX_IOPS:
                raise VolumeError(f"gp3 iops {iops} is outside {GP3_BASE_IOPS}-{GP3_MAX_IOPS}")
            if iops > GP3_MAX_IOPS_PER_GIB * self.size_gib:
                raise VolumeError(
                    f"gp3 iops {iops} exceeds {GP3_MAX_IOPS_PER_GIB} per GiB of {self.size_gib} GiB: "
                    "grow the volume or lower the IOPS"
                )
            if not GP3_BASE_MIBPS <= mibps <= GP3_MAX_MIBPS:
                raise VolumeError(f"gp3 throughput {mibps} MiB/s is outside {GP3_BASE_MIBPS:.0f}-"
                                  f"{GP3_MAX_MIBPS:.0f}")
            if mibps > GP3_MAX_MIBPS_PER_IOPS * iops and mibps > GP3_BASE_MIBPS:
                raise VolumeError(
                    f"gp3 throughput {mibps} MiB/s exceeds {GP3_MAX_MIBPS_PER_IOPS} MiB/s per IOPS of "
                    f"{iops}: provision at least {math.ceil(mibps / GP3_MAX_MIBPS_PER_IOPS)} IOPS"
                )
        else:  # io2
            if self.iops is None:
                raise VolumeError("io2 needs provisioned iops, e.g. io2:100:iops=3000")
            if self.throughput_mibps is not None:
                raise VolumeError("io2 throughput follows its IOPS: drop the throughput value")
            if not IO2_MIN_IOPS <= self.iops <= IO2_MAX_IOPS:
                raise VolumeError(f"io2 iops {self.iops} is outside {IO2_MIN_IOPS}-{IO2_MAX_IOPS}")
            if self.iops > IO2_MAX_IOPS_PER_GIB * self.size_gib:
                raise VolumeError(
                    f"io2 iops {self.iops} exceeds {IO2_MAX_IOPS_PER_GIB} per GiB of {self.size_gib} GiB"
                )

    # ---- identity -----------------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """A short name such as 'st1 500 GiB' or 'gp3 200 GiB 3000 IOPS 250 MiB/s'."""
        text = f"{self.kind} {self.size_gib} GiB"
        if self.kind == "gp3" and (self.iops is not None or self.throughput_mibps is not None):
            text += f" {self.provisioned_iops} IOPS {self.provisioned_mibps:g} MiB/s"
        elif self.kind == "io2":
            text += f" {self.iops} IOPS"
        return text

    @property
    def is_hdd(self) -> bool:
        return self.kind in HDD_TYPES

    @property
    def size_tib(self) -> float:
        return self.size_gib / 1024

    @property
    def provisioned_iops(self) -> int:
        """gp3/io2 provisioned IOPS (gp3 defaults to 3,000); gp2's baseline; 0 for HDD."""
        if self.kind == "gp3":
            return self.iops if self.iops is not None else GP3_BASE_IOPS
        if self.kind == "io2":
            return self.iops or 0
        if self.kind == "gp2":
            return self.gp2_baseline_iops
        return 0

    @property
    def provisioned_mibps(self) -> float:
        """gp3 provisioned throughput (default 125 MiB/s); 0 for the other types."""
        if self.kind == "gp3":
            return self.throughput_mibps if self.throughput_mibps is not None else GP3_BASE_MIBPS
        return 0.0

    @property
    def gp2_baseline_iops(self) -> int:
        return min(max(GP2_IOPS_PER_GIB * self.size_gib, GP2_MIN_IOPS), GP2_MAX_IOPS)

    # ---- rates in MiB/s for large sequential I/O (the headline figures) ---------------------------------

    @property
    def baseline_mibps(self) -> float:
        """Throughput with an empty bucket, for I/O of 1 MiB (HDD) or 256 KiB (SSD)."""
        return self.throughput_bps(io_size=MIB if self.is_hdd else SSD_IO_UNIT, bursting=False) / MIB

    @property
    def burst_mibps(self) -> float:
        """Throughput while credits last, for I/O of 1 MiB (HDD) or 256 KiB (SSD)."""
        return self.throughput_bps(io_size=MIB if self.is_hdd else SSD_IO_UNIT, bursting=True) / MIB

    @property
    def max_mibps(self) -> float:
        """The volume's throughput ceiling regardless of I/O size and credits."""
        if self.is_hdd:
            return _HDD_RATES[self.kind][2]
        if self.kind == "gp2":
            return 128.0 if self.size_gib <= 170 else 250.0
        if self.kind == "gp3":
            return self.provisioned_mibps
        return min(IO2_MAX_MIBPS, self.provisioned_iops * SSD_IO_UNIT / MIB)

    # ---- credits -------------------------------------------------------------------------------------

    @property
    def bursts(self) -> bool:
        """Whether the volume has a credit bucket that lets it run above baseline."""
        if self.is_hdd:
            return True
        if self.kind == "gp2":
            return self.gp2_baseline_iops < GP2_BURST_IOPS
        return False

    @property
    def credit_capacity(self) -> float:
        """Bucket size in credit units (MiB for HDD, I/Os for gp2); 0 when the volume does not burst."""
        if self.is_hdd:
            return self.size_tib * (TIB / MIB)  # 1 TiB of credits per TiB of size
        if self.kind == "gp2" and self.bursts:
            return float(GP2_BUCKET_CREDITS)
        return 0.0

    @property
    def credit_unit(self) -> str:
        return "MiB" if self.is_hdd else "I/O"

    def earn_rate(self) -> float:
        """Credit units earned per second (the baseline, in credit units)."""
        if self.is_hdd:
            base, _, cap = _HDD_RATES[self.kind]
            return min(base * self.size_tib, cap)
        return float(self.provisioned_iops)

    def spend_limit(self, bursting: bool) -> float:
        """Credit units per second the volume will serve: burst while credits last, else baseline."""
        if not (bursting and self.bursts):
            return self.earn_rate()
        if self.is_hdd:
            _, burst, cap = _HDD_RATES[self.kind]
            return min(burst * self.size_tib, cap)
        return float(GP2_BURST_IOPS)

    def cost_per_byte(self, io_size: float) -> float:
        """Credit units one byte costs at this I/O size (HDD: an I/O <= 1 MiB costs 1 MiB)."""
        if io_size <= 0:
            raise VolumeError(f"I/O size {io_size} must be positive")
        if self.is_hdd:
            return max(io_size, HDD_IO_UNIT) / io_size / MIB
        return math.ceil(io_size / SSD_IO_UNIT) / io_size

    def throughput_bps(self, *, io_size: float, bursting: bool, instance_cap_bps: float | None = None) -> float:
        """Bytes per second the volume serves at this I/O size, bursting or at baseline."""
        rate = self.spend_limit(bursting) / self.cost_per_byte(io_size)
        rate = min(rate, self.max_mibps * MIB)
        if instance_cap_bps is not None:
            rate = min(rate, instance_cap_bps)
        return rate

    def burst_seconds(self, credits: float | None = None, *, io_size: float = MIB) -> float:
        """How long the volume can run at burst from `credits` (default: a full bucket).

        While bursting the bucket still refills at baseline, so it drains at burst - baseline:
        credits / (burst - baseline). Infinite for a volume that does not burst.
        """
        credits = self.credit_capacity if credits is None else credits
        net = self.spend_limit(True) - self.earn_rate()
        if net <= 0:
            return math.inf
        # At small I/O the volume's byte ceiling may not bind, but the credit drain is in units anyway.
        return credits / net

    def naive_burst_seconds(self, credits: float | None = None) -> float:
        """credits / burst: the figure that forgets the bucket refills while it drains."""
        credits = self.credit_capacity if credits is None else credits
        burst = self.spend_limit(True)
        return math.inf if burst <= 0 else credits / burst

    def explain_burst(self, credits: float | None = None) -> str:
        """Both burst-time figures and why they differ, in one paragraph."""
        credits = self.credit_capacity if credits is None else credits
        if not self.bursts:
            return f"{self.label} does not burst: it runs at {self.baseline_mibps:.1f} MiB/s all the time."
        unit = self.credit_unit
        burst, earn = self.spend_limit(True), self.earn_rate()
        real, naive = self.burst_seconds(credits), self.naive_burst_seconds(credits)
        amount = f"{credits / 1024:.1f} GiB of credits" if self.is_hdd else f"{credits:,.0f} I/O credits"
        rate_unit = "MiB/s" if self.is_hdd else "IOPS"
        return (
            f"{self.label}: {amount} sustain burst ({burst:,.1f} {rate_unit}) for "
            f"{real / 60:.1f} min = credits / (burst - baseline) = {credits:,.0f} {unit} / "
            f"({burst:,.1f} - {earn:,.1f}) {rate_unit}. Dividing by burst alone gives {naive / 60:.1f} min, "
            f"which forgets that the bucket keeps refilling at baseline ({earn:,.1f} {rate_unit}) while it "
            f"drains, so it underestimates the burst by a factor of {real / naive:.2f}."
        )


# ---- write cache ---------------------------------------------------------------------------------------

# The share of an instance's memory the kernel counts as "dirtyable" (free + reclaimable page cache);
# vm.dirty_ratio is a percentage of that, not of MemTotal. An approximation: it depends on what runs.
DIRTYABLE_FRACTION = 0.9


@dataclass(frozen=True)
class WriteCache:
    """The page cache between the job and the volume: the kernel's dirty limits, in bytes.

    Writers run at memory speed until dirty data reaches the "freerun" point halfway between the
    background and the hard limit (mm/page-writeback.c, dirty_freerun_ceiling); above it
    balance_dirty_pages pauses them so they write at about the rate the device drains. The model uses
    that midpoint as the point where writers fall to the volume's speed.
    """

    limit_bytes: int
    background_bytes: int

    @property
    def freerun_bytes(self) -> int:
        return (self.limit_bytes + self.background_bytes) // 2

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
    the time the stage takes when the volume is not what it waits on (network, CPU).
    """

    name: str
    write_bytes: int
    read_bytes: int = 0
    io_size: int = MIB
    floor_s: float = 0.0


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
    def of(cls, volume: Volume, io_size: float, instance_cap_bps: float | None) -> _Rates:
        return cls(
            burst_bps=volume.throughput_bps(io_size=io_size, bursting=True, instance_cap_bps=instance_cap_bps),
            base_bps=volume.throughput_bps(io_size=io_size, bursting=False, instance_cap_bps=instance_cap_bps),
            cost_per_byte=volume.cost_per_byte(io_size),
            earn=volume.earn_rate(),
            capacity=volume.credit_capacity,
            bursts=volume.bursts,
        )


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
) -> SimResult:
    """Replay `waves` rounds of `concurrency` jobs on one volume, back to back with `gap_s` between.

    All jobs of a round run the same stage at the same time (the worst case, and what happens when an
    instance starts a batch of children together). Each step the volume serves reads first, then
    writeback of dirty data; writers fill the cache at their own speed until it reaches the freerun
    point, then at the rate writeback frees it. Credits are spent in the volume's accounting (HDD: an
    I/O <= 1 MiB costs 1 MiB) and refill at baseline, also between rounds. A stage steps in `dt`
    (default: 1/40 of its floor time, 0.05-2 s); idle time is solved in closed form.
    """
    if concurrency < 1 or waves < 1:
        raise ValueError("concurrency and waves must be at least 1")
    if not stages:
        raise ValueError("a workload needs at least one stage")
    cache = cache or WriteCache(0, 0)
    rates = {st.io_size: _Rates.of(volume, st.io_size, instance_cap_bps) for st in stages}
    state = _State(credits=volume.credit_capacity if initial_credits is None else initial_credits)
    state.wb_rates = rates[stages[0].io_size]
    results: list[WaveResult] = []
    for wave in range(waves):
        started, credits_at_start = state.t, state.credits
        stage_s: dict[str, float] = {}
        for stage in stages:
            step = dt if dt is not None else max(0.05, min(2.0, (stage.floor_s or 2.0) / 40))
            stage_s[stage.name] = _run_stage(stage, rates[stage.io_size], concurrency, cache, step, state,
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
    freerun = cache.freerun_bytes
    if freerun <= 0:
        # No cache: writes go straight to the volume, sharing what reads left.
        accepted = moved = min(write_want, left)
    else:
        # Writeback starts above the background threshold (below it, the data waits to expire).
        moved = min(state.dirty, left) if state.dirty > cache.background_bytes else 0.0
        accepted = min(write_want, max(0.0, freerun - state.dirty) + moved)
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
    floor_dirty = 0.0 if flush else float(cache.background_bytes)
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
