"""The fleet's measured scratch capability, for the advisor. Pure.

In: profiles carrying their hosts' qualifications (profiling.qualification); fleet_capability gives the median over
hosts (each once) of measured / expected, or None when none carries one or the hosts ran on different volume types.
Then at_measured: the candidate volumes and the stack's, with the one the fleet measured (its type, and the figure
tuning.qualify expects of it equal to the hosts' own) replaced by a MeasuredVolume at that share, burst and baseline
alike, and the note that says so; unchanged, with no note, when the share is NOMINAL_SHARE or more. Why the median
and why throughout: docs/advisor.md, "The fleet's measured capability".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from profiling.metrics import StageProfile, median
from profiling.qualification import read_qualification
from tuning.ebs import Volume
from tuning.instancestore import InstanceStore
from tuning.qualify import expect

# EBS gives st1 and sc1 "within 10 percent of the expected throughput 99 percent of the time"
# (https://docs.aws.amazon.com/ebs/latest/userguide/hdd-vols.html): below this share the volume is slower than modelled.
NOMINAL_SHARE = 0.9


@dataclass(frozen=True)
class FleetCapability:
    """What the hosts measured of their scratch: the median share of the model's figure, over `hosts` hosts."""

    volume_type: str
    share: float
    hosts: int
    mibps: float  # the median host's measured figure
    expected_mibps: float  # the model's, as the hosts were told it

    @property
    def below_model(self) -> bool:
        return self.share < NOMINAL_SHARE


def fleet_capability(profiles: Iterable[StageProfile]) -> FleetCapability | None:
    """The fleet's capability from the profiles' qualification properties (None when none carries one with an
    expectation, or the hosts ran on different volume types)."""
    hosts: dict[str, tuple[str, float, float]] = {}
    for profile in profiles:
        props = profile.properties
        quality = read_qualification(props)
        if quality is None or not quality.expected_mibps or quality.ratio is None:
            continue
        hosts[props.get("InstanceId") or f"host {len(hosts)}"] = (props.get("VolumeType") or "unknown",
                                                                   quality.mibps, quality.expected_mibps)
    kinds = {kind for kind, _, _ in hosts.values()}
    if not hosts or len(kinds) != 1:
        return None
    shares = [mibps / expected for _, mibps, expected in hosts.values()]
    return FleetCapability(kinds.pop(), median(shares), len(hosts), median([m for _, m, _ in hosts.values()]),
                           median([e for _, _, e in hosts.values()]))


@dataclass(frozen=True)
class MeasuredVolume(Volume):
    """A volume at the share of its model the fleet measured, burst and baseline alike."""

    share: float = 1.0

    def throughput_bps(self, *, io_size: float, bursting: bool, instance_cap_bps: float | None = None,
                       random_share: float = 0.0) -> float:
        rate = super().throughput_bps(io_size=io_size, bursting=bursting, random_share=random_share) * self.share
        return rate if instance_cap_bps is None else min(rate, instance_cap_bps)

    @property
    def label(self) -> str:
        return f"{super().label} (measured {self.share:.2f}x)"


def is_measured(volume: Volume, fleet: FleetCapability) -> bool:
    """Whether `volume` is the one the fleet measured: its type, and the model's figure the hosts were given."""
    if isinstance(volume, InstanceStore) or volume.kind != fleet.volume_type:
        return False
    return math.isclose(expect(volume).write_mibps, fleet.expected_mibps, rel_tol=0.01)


def at_measured(volumes: Sequence[Volume], current: Volume, fleet: FleetCapability | None
                ) -> tuple[list[Volume], Volume, str | None]:
    """`volumes` and the stack's `current` volume with the measured one at the fleet's share, and the note that says
    so; unchanged (and no note) when the fleet measured at least NOMINAL_SHARE of the model, or nothing."""
    if fleet is None or not fleet.below_model:
        return list(volumes), current, None

    def measured(volume: Volume) -> Volume:
        if not is_measured(volume, fleet) or isinstance(volume, MeasuredVolume):
            return volume
        fields = {name: getattr(volume, name) for name in ("kind", "size_gib", "iops", "throughput_mibps")}
        return MeasuredVolume(**fields, share=fleet.share)

    out = [measured(v) for v in volumes]
    note = (f"measured: {fleet.hosts} host(s) qualified their {fleet.volume_type} scratch at a median "
            f"{fleet.share:.2f}x of the model ({fleet.mibps:.1f} of {fleet.expected_mibps:.1f} MiB/s): below "
            f"{NOMINAL_SHARE:g}x, so that volume is simulated at {fleet.share:.2f}x of its burst and baseline, not "
            "at its nominal figures")
    if not any(isinstance(v, MeasuredVolume) for v in [*out, measured(current)]):
        return list(volumes), current, None
    return out, measured(current), note
