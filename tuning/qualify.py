"""What qualification expects of a host's scratch, what measuring it costs, and what a pipeline does with a slow host.
Pure.

The expected figure comes from the one model, with the numbers the advisor uses: tuning.ebs.Volume's throughput at
the I/O size while bursting (a new volume starts with a full bucket: st1, sc1 and gp2 burst in a host's first
minutes), capped by the instance's EBS bandwidth (tuning.instances: its burst figure, which sizes up to 4xlarge have
for at least 30 minutes a day); an instance store's (tuning.instancestore) from its rated 4 KiB IOPS: write IOPS for
writes, as the advisor models it, and read IOPS for reads. A host whose lower of write and read falls below
`min_ratio` of its expectation is slow: flagged (its children's profiles carry the ratio) or fenced (shut down as a
failed setup is, at most `fences_per_hour` a pipeline: tuning/hostqualify.py).

The measurement itself is profiling/qualifyio.py (standard library only: the user data runs it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from profiling.qualifyio import MAX_BYTES, PHASE_SHARES, SECONDS
from tuning.ebs import KIB, MIB, SSD_IO_UNIT, Volume
from tuning.instances import InstanceType, lookup, types_of
from tuning.instancestore import STORE_IO_BYTES, InstanceStore

MODES = ("flag", "fence", "off")
# CDK context keys (camelCase) and the QualifyPolicy fields they set; the README's deploy table lists them.
CONTEXT_KEYS: dict[str, str] = {
    "hostQualification": "mode",
    "qualifyMinRatio": "min_ratio",
    "fencesPerHour": "fences_per_hour",
    "qualifyIoSizeKiB": "io_kib",
}
MAX_FENCES_PER_HOUR = 50  # one DescribeLogStreams page: a host counts the hour's fences in one call a bucket
IO_KIB_RANGE = (4, 16384)


class QualifyPolicyError(ValueError):
    """A qualification setting the host cannot use; the message names the context key and the fix."""


@dataclass(frozen=True)
class QualifyPolicy:
    """What a host measures and what it does when slow (see the module)."""

    mode: str = "flag"
    # EBS gives st1/sc1 "within 10 percent of the expected throughput 99 percent of the time" (hdd-vols.html): a
    # host at half its expectation is not EBS's own variation.
    min_ratio: float = 0.5
    fences_per_hour: int = 2
    io_kib: int = 1024  # st1/sc1's I/O unit (tuning.ebs.HDD_IO_UNIT); the plan's I/O size when the advisor knows it

    def validate(self) -> None:
        if self.mode not in MODES:
            raise QualifyPolicyError(f"hostQualification {self.mode!r} is not one of {', '.join(MODES)}: e.g. "
                                     "-c hostQualification=flag")
        if not (math.isfinite(self.min_ratio) and 0 < self.min_ratio < 1):
            raise QualifyPolicyError(f"qualifyMinRatio {self.min_ratio} is not between 0 and 1: e.g. "
                                     "-c qualifyMinRatio=0.5")
        if not 1 <= self.fences_per_hour <= MAX_FENCES_PER_HOUR:
            raise QualifyPolicyError(f"fencesPerHour {self.fences_per_hour} is outside 1-{MAX_FENCES_PER_HOUR}: "
                                     "e.g. -c fencesPerHour=2")
        low, high = IO_KIB_RANGE
        if not low <= self.io_kib <= high or self.io_kib % 4:
            raise QualifyPolicyError(f"qualifyIoSizeKiB {self.io_kib} is not a multiple of 4 in {low}-{high}: "
                                     "e.g. -c qualifyIoSizeKiB=1024")

    @property
    def io_bytes(self) -> int:
        return self.io_kib * KIB

    @classmethod
    def from_context(cls, ctx: Mapping[str, Any]) -> QualifyPolicy:
        base = cls()
        mode = str(ctx.get("hostQualification") or base.mode).strip().lower()
        policy = cls(mode, _number(ctx, "qualifyMinRatio", base.min_ratio, float, "0.5"),
                     _number(ctx, "fencesPerHour", base.fences_per_hour, int, "2"),
                     _number(ctx, "qualifyIoSizeKiB", base.io_kib, int, "1024"))
        policy.validate()
        return policy

    def to_context(self) -> dict[str, str]:
        """The keys that differ from the defaults (the defaults stay out of the advice's context)."""
        base = QualifyPolicy()
        return {key: str(getattr(self, name)) for key, name in CONTEXT_KEYS.items()
                if getattr(self, name) != getattr(base, name)}


def _number(ctx: Mapping[str, Any], key: str, default: Any, kind: type, example: str) -> Any:
    value = ctx.get(key)
    if value is None or str(value).strip() == "":
        return default
    try:
        if isinstance(value, bool):
            raise ValueError
        return kind(str(value).strip())
    except ValueError:
        raise QualifyPolicyError(f"context {key}={value!r} is not a number: e.g. -c {key}={example}") from None


@dataclass(frozen=True)
class Expectation:
    """What a new host's scratch should do at the qualification's I/O size, and why."""

    volume: str  # the volume's label
    instance_type: str | None
    write_mibps: float
    read_mibps: float
    baseline_mibps: float  # what it sustains once its credits are gone (the same as the others without a bucket)
    random_read_iops: float | None  # an instance store's rated 4 KiB random read IOPS (measured by AWS at depth)
    basis: str

    def to_json(self) -> dict[str, Any]:
        return {"volume": self.volume, "instance_type": self.instance_type, "write_mibps": round(self.write_mibps, 2),
                "read_mibps": round(self.read_mibps, 2), "baseline_mibps": round(self.baseline_mibps, 2),
                "random_read_iops": self.random_read_iops, "basis": self.basis}


def expect(volume: Volume, instance: InstanceType | None = None, io_size: int = MIB) -> Expectation:
    """The expected figures of `volume` on `instance` (None: no instance cap) at `io_size` (see the module)."""
    if isinstance(volume, InstanceStore):
        store = volume.instance
        write = volume.throughput_bps(io_size=io_size, bursting=True) / MIB
        read = store.store_read_iops * STORE_IO_BYTES / MIB
        basis = (f"{volume.label}: rated {store.store_write_iops:,} write and {store.store_read_iops:,} read IOPS "
                 "x 4 KiB (a lower bound for larger I/O: tuning/instancestore.py)")
        return Expectation(volume.label, store.name, write, read, write, float(store.store_read_iops), basis)
    burst_cap = instance.ebs_max_mibps * MIB if instance else None
    base_cap = instance.ebs_baseline_mibps * MIB if instance else None
    alone = volume.throughput_bps(io_size=io_size, bursting=True) / MIB
    rate = volume.throughput_bps(io_size=io_size, bursting=True, instance_cap_bps=burst_cap) / MIB
    baseline = volume.throughput_bps(io_size=io_size, bursting=False, instance_cap_bps=base_cap) / MIB
    state = "a full bucket" if volume.bursts else "no bucket"
    basis = f"{volume.label} at {io_size // KIB} KiB I/O with {state}: {alone:,.1f} MiB/s"
    if instance is not None and rate < alone:
        basis += f", capped by {instance.name}'s EBS bandwidth ({instance.ebs_max_mibps:,.0f} MiB/s)"
    return Expectation(volume.label, instance.name if instance else None, rate, rate, baseline, None, basis)


def expected_table(volume: Volume, instance_types: Iterable[str], io_size: int,
                   store: bool = False) -> dict[str, list[float]]:
    """The user data's expectations by instance type, as the host looks its own up from IMDS: '*' for a type not
    listed (the volume alone; 0 for instance-store scratch: not judged), and the types (families expanded) whose
    figures differ from it. Each entry is [write MiB/s, read MiB/s]."""
    table: dict[str, list[float]] = {"*": [0.0, 0.0]}
    if not store:
        alone = expect(volume, None, io_size)
        table["*"] = [round(alone.write_mibps, 2), round(alone.read_mibps, 2)]
    for entry in instance_types:
        for kind in types_of(entry):
            if store and not kind.store_volumes:
                continue
            found = expect(InstanceStore.of(kind) if store else volume, kind, io_size)
            row = [round(found.write_mibps, 2), round(found.read_mibps, 2)]
            if row != table["*"]:
                table[kind.name] = row
    return table


def instance_of(name: str | None) -> InstanceType | None:
    return lookup(name) if name else None


@dataclass(frozen=True)
class Cost:
    """What one qualification costs a host, as the model predicts it."""

    seconds: float
    bytes: int
    credits: float  # credit units (tuning.ebs.Volume.credit_unit); 0 without a bucket
    bucket_share: float  # of a full bucket; 0 without one

    def describe(self, volume: Volume) -> str:
        text = f"{self.seconds:.0f} s, {self.bytes / 2**30:.2f} GiB"
        if self.credits:
            text += (f", {self.credits:,.0f} {volume.credit_unit} of credits ({self.bucket_share:.2%} of a new "
                     f"{volume.label}'s bucket)")
        return text


def cost(volume: Volume, expectation: Expectation, *, seconds: float = SECONDS, max_bytes: int = MAX_BYTES,
         io_size: int = MIB, small: bool = False) -> Cost:
    """The time, bytes and credits of a qualification at the expected rates (profiling.qualifyio's bounds): each
    phase moves its share of the time at its rate, writes at most half of `max_bytes`, reads what was written.
    Sequential I/O costs HDD volumes its bytes (merged into 1 MiB units), SSD volumes one I/O per 256 KiB."""
    write_share, read_share, small_share = PHASE_SHARES["file+small" if small else "file"]
    write_bps, read_bps = expectation.write_mibps * MIB, expectation.read_mibps * MIB
    sequential = max_bytes - (max_bytes // 16 if small else 0)  # the random reads' reserve (profiling.qualifyio)
    written = int(min(sequential // 2, write_bps * seconds * write_share)) // io_size * io_size
    read = int(min(written, read_bps * seconds * read_share)) // io_size * io_size
    taken = written / write_bps + read / read_bps + seconds * small_share
    if isinstance(volume, InstanceStore) or not volume.bursts:
        return Cost(taken, written + read, 0.0, 0.0)
    # HDD: MiB of sequential bytes; gp2: I/Os of up to 256 KiB each.
    ios = (written + read) / io_size
    credits = (written + read) / MIB if volume.is_hdd else ios * math.ceil(io_size / SSD_IO_UNIT)
    return Cost(taken, written + read, credits, credits / volume.credit_capacity)


def render(record: Mapping[str, Any], expectation: Expectation, volume: Volume, spent: Cost) -> str:
    """`iobatch qualify`'s text: the figures, the expectation, the ratio and what the same run costs `volume`."""
    lines = [f"qualify {record['target']} ({record['mode']}, {record['io_bytes'] // KIB} KiB I/O, "
             f"{record['seconds']:.1f} s, {record['bytes'] / 2**30:.2f} GiB moved)"]
    labels = (("write", "sequential write"), ("read", "sequential read"), ("random_read", "4 KiB random read"))
    for key, label in labels:
        phase = record.get(key)
        if not phase or not phase.get("ios"):
            continue
        rate = (f"{phase['ios'] / phase['seconds']:,.0f} IOPS" if key == "random_read"
                else f"{phase['mibps']:,.1f} MiB/s")
        lines.append(f"  {label:<18} {rate:>14}  latency p50 {phase['p50_ms']} ms, p90 {phase['p90_ms']} ms, "
                     f"p99 {phase['p99_ms']} ms, max {phase['max_ms']} ms")
    lines.append(f"expected: {expectation.basis}; write {expectation.write_mibps:,.1f}, read "
                 f"{expectation.read_mibps:,.1f} MiB/s (baseline {expectation.baseline_mibps:,.1f} MiB/s once credits "
                 "are gone)")
    if expectation.random_read_iops:
        lines.append(f"  rated random reads: {expectation.random_read_iops:,.0f} IOPS at AWS's queue depth (this "
                     "measures one at a time)")
    if record.get("ratio") is not None:
        lines.append(f"ratio {record['ratio']:.2f}x: {record['verdict']} (a host below {record['min_ratio']:g}x is "
                     "slow)")
    lines.append(f"what it costs a new host with {volume.label}: {spent.describe(volume)}")
    return "\n".join(lines)
