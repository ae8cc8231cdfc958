"""The EBS volume model: the volume kinds and what the EBS API accepts of each (LIMITS, checked by Volume), their
rates for an I/O size and random share, their credit buckets, and the CDK context keys that carry a volume to the
stack. Pure: no clock, no files.

The one source of what a scratch volume may be: the stack builds its volume with `Volume.from_context()`,
`iobatch advise` prints `to_context()`, and the simulator (tuning.simulator) replays jobs on a Volume. Every figure
is AWS's published one, cited beside its constant. Credits are in credit units: MiB of accounted throughput for
st1/sc1, I/Os for gp2; a volume without a bucket (gp3, io1, io2) has a capacity of 0 and always runs at its
provisioned rate. The instance's own EBS cap is the caller's to give (`instance_cap_bps`).

    Volume("gp3", 200, iops=6000).throughput_bps(io_size=MIB, bursting=False)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB
TIB = 1024 * GIB

# The figures' sources, AWS's pages as read in 2025-09 (the gp3 limits were raised on 2025-09-26):
# [HDD] https://docs.aws.amazon.com/ebs/latest/userguide/hdd-vols.html
# [GP] https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html
# [PIOPS] https://docs.aws.amazon.com/ebs/latest/userguide/provisioned-iops.html
# [API] https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVolume.html (what CreateVolume accepts:
#   Size, Iops, Throughput per volume type)
# [IO] https://docs.aws.amazon.com/ebs/latest/userguide/ebs-io-characteristics.html (I/O size and merging)


@dataclass(frozen=True)
class VolumeLimits:
    """What the EBS API accepts for one volume kind. A None range means the kind takes no such value."""

    size_gib: tuple[int, int]
    iops: tuple[int, int] | None = None  # provisionable IOPS
    iops_per_gib: int | None = None  # at most this many provisioned IOPS per GiB of size
    iops_required: bool = False
    throughput_mibps: tuple[float, float] | None = None  # provisionable throughput
    max_mibps: float | None = None  # io1/io2: throughput follows the IOPS up to this


# The one list of volume kinds and their limits; the stack accepts exactly these. [API], [GP], [PIOPS], [HDD]
# as of 2025-09.
LIMITS: dict[str, VolumeLimits] = {
    "st1": VolumeLimits(size_gib=(125, 16 * 1024)),  # [HDD]
    "sc1": VolumeLimits(size_gib=(125, 16 * 1024)),  # [HDD]
    "gp2": VolumeLimits(size_gib=(1, 16 * 1024)),  # [GP]
    # [API] 2025-09: gp3 Size 1-65,536 GiB, Iops 3,000-80,000 (at most 500 per GiB), Throughput 125-2,000 MiB/s.
    "gp3": VolumeLimits(size_gib=(1, 64 * 1024), iops=(3_000, 80_000), iops_per_gib=500,
                        throughput_mibps=(125.0, 2_000.0)),
    # [PIOPS, API] io1: 100-64,000 IOPS, at most 50 per GiB, up to 1,000 MiB/s.
    "io1": VolumeLimits(size_gib=(4, 16 * 1024), iops=(100, 64_000), iops_per_gib=50, iops_required=True,
                        max_mibps=1_000.0),
    # [PIOPS, API] io2 Block Express: 100-256,000 IOPS, at most 1,000 per GiB, up to 4,000 MiB/s.
    "io2": VolumeLimits(size_gib=(4, 64 * 1024), iops=(100, 256_000), iops_per_gib=1_000, iops_required=True,
                        max_mibps=4_000.0),
}
VOLUME_TYPES: tuple[str, ...] = tuple(LIMITS)
HDD_TYPES: tuple[str, ...] = ("st1", "sc1")
IOPS_TYPES: tuple[str, ...] = tuple(kind for kind, limits in LIMITS.items() if limits.iops is not None)
THROUGHPUT_TYPES: tuple[str, ...] = tuple(k for k, limits in LIMITS.items() if limits.throughput_mibps is not None)
# HDD volumes count throughput in I/O units of this size [HDD "Inefficiency of small read/writes on HDD", IO]:
# sequential I/O is merged into whole units (eight sequential 128 KiB I/Os cost one), a random I/O smaller than a
# unit costs a whole one. tuning.accounting.HddAccountant applies it by offset; cost_per_byte takes a random share.
HDD_IO_UNIT = MIB
# SSD volumes count an I/O of up to this size as one I/O, a larger one as one per this size [IO].
SSD_IO_UNIT = 256 * KIB

# HDD: (baseline MiB/s per TiB, burst MiB/s per TiB, cap MiB/s for both) [HDD] as of 2025-09. The bucket holds
# 1 TiB of credits per TiB of size and fills at the baseline rate.
_HDD_RATES: dict[str, tuple[float, float, float]] = {
    "st1": (40.0, 250.0, 500.0),
    "sc1": (12.0, 80.0, 250.0),
}
# gp2 [GP] as of 2025-09: 3 IOPS per GiB (100-16,000), bursting to 3,000 IOPS from a 5.4 million I/O-credit bucket
# (so 1,000 GiB and more never burst); 128 MiB/s up to 170 GiB, 250 MiB/s from 334 GiB, and between the two
# 250 MiB/s only while burst credits last.
GP2_IOPS_PER_GIB = 3
GP2_MIN_IOPS = 100
GP2_MAX_IOPS = 16_000
GP2_BURST_IOPS = 3_000
GP2_BUCKET_CREDITS = 5_400_000
GP2_SMALL_MIBPS = 128.0  # up to 170 GiB; and 170-334 GiB once the burst credits are gone
GP2_LARGE_MIBPS = 250.0  # from 334 GiB; and 170-334 GiB while burst credits last
GP2_SMALL_MAX_GIB = 170
GP2_ALWAYS_LARGE_GIB = 334
# gp3 without provisioned figures runs at these at any size (and they are free); no bursting [GP] as of 2025-09.
GP3_BASE_IOPS = 3_000
GP3_BASE_MIBPS = 125.0
GP3_MAX_MIBPS_PER_IOPS = 0.25  # provisioned throughput per provisioned IOPS, at most [GP, API]

# CDK context keys (camelCase) and the Volume fields they set; the README's "Deploy to AWS" table lists them.
CONTEXT_KEYS: dict[str, str] = {
    "volumeType": "kind",
    "volumeSizeGiB": "size_gib",
    "volumeIops": "iops",
    "volumeThroughput": "throughput_mibps",
}


class VolumeError(ValueError):
    """A volume the EBS API would refuse; the message names the value and the allowed range."""


@dataclass(frozen=True)
class _Words:
    """How messages name each field: the model's words, or the context keys a deployer typed."""

    kind: str
    size: str
    iops: str
    throughput: str
    iops_example: str  # formatted with the kind


_MODEL_WORDS = _Words("volume type", "size (GiB)", "provisioned iops", "throughput", "{kind}:100:iops=3000")
_CONTEXT_WORDS = _Words("volumeType", "volumeSizeGiB", "volumeIops", "volumeThroughput", "-c volumeIops=4000")


def _either(kinds: tuple[str, ...]) -> str:
    return kinds[0] if len(kinds) == 1 else f"{', '.join(kinds[:-1])} and {kinds[-1]}"


def _check(kind: str, size_gib: int, iops: int | None, mibps: float | None, words: _Words) -> None:
    """The one validator: raise VolumeError for anything the EBS API refuses, in `words`."""
    limits = LIMITS.get(kind)
    if limits is None:
        raise VolumeError(f"{words.kind} {kind!r} is not one of {', '.join(VOLUME_TYPES)}")
    low, high = limits.size_gib
    if not low <= size_gib <= high:
        raise VolumeError(f"{words.size} {size_gib} is outside {low}-{high} for {kind}")
    if iops is not None and limits.iops is None:
        raise VolumeError(f"{words.iops} applies to {_either(IOPS_TYPES)}, not {kind}: {kind} takes no "
                          "provisioned IOPS, drop it")
    if mibps is not None and limits.throughput_mibps is None:
        why = "follows its IOPS" if limits.max_mibps else "is not provisioned"
        raise VolumeError(f"{words.throughput} applies to {_either(THROUGHPUT_TYPES)} only, not {kind}: "
                          f"{kind} takes no provisioned throughput (it {why}), drop it")
    if limits.iops_required and iops is None:
        raise VolumeError(f"{kind} needs {words.iops}, e.g. {words.iops_example.format(kind=kind)}")
    if limits.iops is not None:
        # gp3 without IOPS runs at (and is checked at) its free baseline.
        provisioned = iops if iops is not None else GP3_BASE_IOPS
        low_iops, high_iops = limits.iops
        if not low_iops <= provisioned <= high_iops:
            raise VolumeError(f"{words.iops} {provisioned} is outside {low_iops}-{high_iops} for {kind}")
        per_gib = limits.iops_per_gib
        if per_gib is not None and provisioned > per_gib * size_gib:
            raise VolumeError(f"{words.iops} {provisioned} exceeds {per_gib} per GiB of a {size_gib} GiB "
                              f"{kind}: grow the volume or lower the IOPS")
    if limits.throughput_mibps is not None:
        provisioned_mibps = mibps if mibps is not None else GP3_BASE_MIBPS
        low_mibps, high_mibps = limits.throughput_mibps
        if not low_mibps <= provisioned_mibps <= high_mibps:
            raise VolumeError(f"{words.throughput} {provisioned_mibps:g} is outside {low_mibps:g}-{high_mibps:g} "
                              f"MiB/s for {kind}")
        if provisioned_mibps != int(provisioned_mibps):
            raise VolumeError(f"{words.throughput} {provisioned_mibps:g} is not a whole number of MiB/s")
        iops_now = iops if iops is not None else GP3_BASE_IOPS
        if provisioned_mibps > GP3_MAX_MIBPS_PER_IOPS * iops_now and provisioned_mibps > GP3_BASE_MIBPS:
            raise VolumeError(
                f"{words.throughput} {provisioned_mibps:g} MiB/s exceeds {GP3_MAX_MIBPS_PER_IOPS} MiB/s per IOPS "
                f"of {iops_now} IOPS for {kind}: provision at least "
                f"{math.ceil(provisioned_mibps / GP3_MAX_MIBPS_PER_IOPS)} IOPS"
            )


@dataclass(frozen=True)
class Volume:
    """One EBS volume: its type, size and (gp3, io1, io2) provisioned performance.

    `iops` is required for io1 and io2 and optional for gp3 (default 3,000); `throughput_mibps` is gp3 only
    (default 125). Both are refused for the other types, as the EBS API refuses them. `Volume()` is the
    stack's default scratch volume.
    """

    kind: str = "st1"
    size_gib: int = 500
    iops: int | None = None
    throughput_mibps: float | None = None

    def __post_init__(self) -> None:
        _check(self.kind, self.size_gib, self.iops, self.throughput_mibps, _MODEL_WORDS)

    # ---- CDK context ---------------------------------------------------------------------------------

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any]) -> Volume:
        """Build from CDK context values (numbers or strings, as `cdk -c key=value` gives them).

        A missing or empty key keeps the default (`Volume()`); errors name the context key and the fix.
        """
        base = cls()
        kind = _context_text(ctx, "volumeType") or base.kind
        size = _context_int(ctx, "volumeSizeGiB", example=base.size_gib)
        iops = _context_int(ctx, "volumeIops", example=4000)
        mibps = _context_int(ctx, "volumeThroughput", example=250)
        size_gib = base.size_gib if size is None else size
        throughput = None if mibps is None else float(mibps)
        _check(kind, size_gib, iops, throughput, _CONTEXT_WORDS)
        return cls(kind, size_gib, iops=iops, throughput_mibps=throughput)

    def to_context(self) -> dict[str, str]:
        """The CDK context keys that rebuild this volume through from_context.

        gp3's IOPS and throughput and io1/io2's IOPS are always written, defaults included, so the deploy
        command shows what the volume gets; the rebuilt volume performs the same.
        """
        ctx = {"volumeType": self.kind, "volumeSizeGiB": str(self.size_gib)}
        if self.kind in IOPS_TYPES:
            ctx["volumeIops"] = str(self.provisioned_iops)
        if self.kind in THROUGHPUT_TYPES:
            ctx["volumeThroughput"] = str(int(self.provisioned_mibps))
        return ctx

    # ---- identity -----------------------------------------------------------------------------------

    @property
    def limits(self) -> VolumeLimits:
        return LIMITS[self.kind]

    @property
    def label(self) -> str:
        """A short name such as 'st1 500 GiB' or 'gp3 200 GiB 3000 IOPS 250 MiB/s'."""
        text = f"{self.kind} {self.size_gib} GiB"
        if self.kind == "gp3" and (self.iops is not None or self.throughput_mibps is not None):
            text += f" {self.provisioned_iops} IOPS {self.provisioned_mibps:g} MiB/s"
        elif self.limits.iops_required:
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
        """gp3/io1/io2 provisioned IOPS (gp3 defaults to 3,000); gp2's baseline; 0 for HDD."""
        if self.kind == "gp3":
            return self.iops if self.iops is not None else GP3_BASE_IOPS
        if self.kind in IOPS_TYPES:
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
        """The volume's throughput ceiling regardless of I/O size and credits (gp2: while bursting)."""
        return self.ceiling_mibps(bursting=True)

    def ceiling_mibps(self, *, bursting: bool) -> float:
        """The volume's throughput ceiling, bursting or not (only gp2 of 170-334 GiB differs) [GP]."""
        if self.is_hdd:
            return _HDD_RATES[self.kind][2]
        if self.kind == "gp2":
            if self.size_gib <= GP2_SMALL_MAX_GIB:
                return GP2_SMALL_MIBPS
            if self.size_gib >= GP2_ALWAYS_LARGE_GIB or bursting:
                return GP2_LARGE_MIBPS
            return GP2_SMALL_MIBPS
        if self.kind == "gp3":
            return self.provisioned_mibps
        # io1/io2: one I/O of up to 256 KiB per provisioned IOPS, up to the kind's ceiling.
        return min(self.limits.max_mibps or 0.0, self.provisioned_iops * SSD_IO_UNIT / MIB)

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
            return self.size_tib * (TIB / MIB)  # 1 TiB of credits per TiB of size [HDD]
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

    def cost_per_byte(self, io_size: float, *, random_share: float = 0.0) -> float:
        """Credit units one byte costs at this I/O size.

        HDD [HDD, IO]: sequential I/O is merged into 1 MiB units, so it costs its bytes in MiB whatever the
        request size; a random I/O smaller than 1 MiB costs a whole MiB. `random_share` is the share of the
        bytes moved by random requests (0: all sequential, 1: all random). SSD: one I/O per 256 KiB or part.
        """
        if io_size <= 0:
            raise VolumeError(f"I/O size {io_size} must be positive")
        if not 0.0 <= random_share <= 1.0:
            raise VolumeError(f"random share {random_share} is outside 0-1")
        if self.is_hdd:
            random_cost = max(io_size, HDD_IO_UNIT) / io_size / MIB
            return (1.0 - random_share) / MIB + random_share * random_cost
        return math.ceil(io_size / SSD_IO_UNIT) / io_size

    def throughput_bps(self, *, io_size: float, bursting: bool, instance_cap_bps: float | None = None,
                       random_share: float = 0.0) -> float:
        """Bytes per second the volume serves at this I/O size and random share, bursting or at baseline."""
        rate = self.spend_limit(bursting) / self.cost_per_byte(io_size, random_share=random_share)
        rate = min(rate, self.ceiling_mibps(bursting=bursting and self.bursts) * MIB)
        if instance_cap_bps is not None:
            rate = min(rate, instance_cap_bps)
        return rate

    def refill_mib(self, seconds: float) -> float:
        """Credit units the bucket earns in `seconds` (at baseline), before the bucket's cap."""
        return self.earn_rate() * seconds

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


def _context_text(ctx: Mapping[str, Any], key: str) -> str | None:
    value = ctx.get(key)
    return None if value is None or str(value).strip() == "" else str(value).strip()


def _context_int(ctx: Mapping[str, Any], key: str, *, example: int) -> int | None:
    """A whole number, or None when the key is missing, empty, 'none' or 'null'."""
    value = ctx.get(key)
    if value is None or str(value).strip().lower() in ("", "none", "null"):
        return None
    if isinstance(value, bool):
        raise VolumeError(f"context {key}={value!r} is not a whole number: e.g. -c {key}={example}")
    try:
        return int(str(value).strip())
    except ValueError:
        raise VolumeError(f"context {key}={value!r} is not a whole number: e.g. -c {key}={example}") from None
