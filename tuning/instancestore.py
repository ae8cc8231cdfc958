"""Instance-store NVMe as a scratch candidate: the SSDs of m6id, c6id, r6id and i4i (tuning.instances), modelled so the
simulator (tuning.simulator) replays a plan on them as on an EBS volume. Pure.

What differs from EBS:
- No credits and no volume price: the store comes with the instance and is billed inside its hourly price. What it
  costs is the difference between the d type and the same size without it (m6id.2xlarge less m6i.2xlarge), which
  the project does not keep (EC2 prices differ by region and change): a candidate is priced only when told that
  difference (`usd_per_hour`), or at 0 when the plan's own instance type already has the store.
- Gone with the instance (stop or terminate erases it: EC2 User Guide, "Instance store temporary block storage"),
  which suits scratch: a child that loses it is retried and downloads again.
- Not behind the instance's EBS bandwidth: the EBS cap of the plan does not apply.
- Size and speed grow with the instance: its size and IOPS are the instance's (tuning.instances, AWS's tables: all
  its volumes together, as one striped file system would see them).

Speed, an assumption: AWS publishes only 4 KiB random IOPS for the store. The model takes its write IOPS x 4 KiB as
the bytes per second it serves at any request size (reads and writes alike): a lower bound, since an SSD moves at
least as many bytes with larger requests; 4 KiB is also the I/O unit it counts. No sequential figure is published,
so the model has no bandwidth ceiling of its own beyond that. The advice's notes say so (ASSUMPTION).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tuning.ebs import GIB, MIB, Volume, VolumeError
from tuning.instances import INSTANCE_TYPES_KEY, InstanceType, known_types_text, lookup

KIND = "instance-store"
# The I/O size AWS measures the store's IOPS at, and the unit the model counts I/Os in.
STORE_IO_BYTES = 4096
# A month of instance hours, as AWS's pricing calculator counts one (730 h).
HOURS_PER_MONTH = 730
# The same size with instance store, by family: the d variant; i4i has the memory per vCPU of r6i.
D_VARIANTS: dict[str, tuple[str, ...]] = {
    "m6i": ("m6id",), "c6i": ("c6id",), "r6i": ("r6id", "i4i"),
    "m6id": ("m6id",), "c6id": ("c6id",), "r6id": ("r6id", "i4i"), "i4i": ("i4i",),
}
ASSUMPTION = ("instance store: AWS publishes only its 4 KiB random IOPS; the model takes write IOPS x 4 KiB as its "
              "speed at any request size (a lower bound: no sequential figure is published)")


@dataclass(frozen=True)
class InstanceStore(Volume):
    """The instance store of one instance type, as a scratch candidate (see the module's assumptions)."""

    kind: str = KIND
    size_gib: int = 0
    instance_type: str = ""
    usd_per_hour: float | None = None  # what the store adds to the instance's hourly price; None: not priced

    def __post_init__(self) -> None:
        found = lookup(self.instance_type)
        if found is None or not found.store_volumes:
            raise VolumeError(f"instance type {self.instance_type[:40]!r} has no instance store in the table: use "
                              f"one of the m6id, c6id, r6id or i4i types ({known_types_text()})")
        if self.usd_per_hour is not None and not (math.isfinite(self.usd_per_hour) and self.usd_per_hour >= 0):
            raise VolumeError(f"usd_per_hour {self.usd_per_hour} must be a price of 0 or more, e.g. usd_per_hour=0.09")

    @classmethod
    def of(cls, instance: InstanceType, usd_per_hour: float | None = None) -> InstanceStore:
        return cls(size_gib=int(instance.store_gb * 10**9 // GIB), instance_type=instance.name,
                   usd_per_hour=usd_per_hour)

    @property
    def instance(self) -> InstanceType:
        found = lookup(self.instance_type)
        assert found is not None  # checked in __post_init__
        return found

    @property
    def label(self) -> str:
        return f"instance store {self.instance_type} ({self.instance.store_gb:,} GB NVMe)"

    @property
    def provisioned_iops(self) -> int:
        """Its write IOPS (4 KiB): the rate it serves I/O units at."""
        return self.instance.store_write_iops

    def ceiling_mibps(self, *, bursting: bool) -> float:
        return self.provisioned_iops * STORE_IO_BYTES / MIB

    def cost_per_byte(self, io_size: float, *, random_share: float = 0.0) -> float:
        """One I/O unit per 4 KiB (or per smaller request), random or not: an SSD has no seek to charge."""
        if io_size <= 0:
            raise VolumeError(f"I/O size {io_size} must be positive")
        return 1.0 / min(io_size, STORE_IO_BYTES)

    def to_context(self) -> dict[str, str]:
        """The stack's keys for scratch on this store (tuning.host: one store device, the type exactly)."""
        return {"scratch": "instance-store", INSTANCE_TYPES_KEY: json.dumps([self.instance_type])}

    def monthly_usd(self) -> float | None:
        return None if self.usd_per_hour is None else round(self.usd_per_hour * HOURS_PER_MONTH, 2)


def parse_store(text: str, type_name: str, extra: dict[str, float]) -> InstanceStore:
    """`nvme:TYPE[:usd_per_hour=X]` (parse_candidate has split it): the store of TYPE."""
    unknown = set(extra) - {"usd_per_hour"}
    if unknown:
        raise VolumeError(f"{sorted(unknown)[0]} does not apply to instance store: give nvme:TYPE[:usd_per_hour=X]")
    found = lookup(type_name)
    if found is None or not found.store_volumes:
        raise VolumeError(f"{type_name[:40]!r} is not an instance type with instance store: use an m6id, c6id, r6id "
                          "or i4i type, e.g. nvme:m6id.2xlarge")
    return InstanceStore.of(found, extra.get("usd_per_hour"))


def same_size_stores(instance_type: str | None) -> list[InstanceStore]:
    """The instance stores of the plan's instance size (its d variants): priced at 0 when the plan's type is one of
    them (the store is already in its price), else not priced. Empty when the plan names no known type."""
    found = lookup(instance_type) if instance_type else None
    if found is None:
        return []
    size = found.name.split(".", 1)[1]
    out = []
    for family in D_VARIANTS.get(found.family, ()):
        other = lookup(f"{family}.{size}")
        if other is not None and other.store_volumes:
            out.append(InstanceStore.of(other, 0.0 if other.name == found.name else None))
    return out


def check_fits_plan(store: InstanceStore, memory_gib: float, instance_type: str | None) -> str | None:
    """Why the store's instance does not run the plan's children as the plan models them (None when it does): the
    plan's memory (and vCPUs, when the plan names a type) must be the store instance's."""
    other = store.instance
    plan_type = lookup(instance_type) if instance_type else None
    if other.memory_gib != memory_gib or (plan_type is not None and plan_type.vcpus != other.vcpus):
        # The plan's own figures: its memory may be a --memory-gib other than its type's.
        given = "" if plan_type is None or plan_type.memory_gib == memory_gib else f" with --memory-gib {memory_gib:g}"
        plan = (f"{plan_type.name}{given}: {plan_type.vcpus} vCPUs, {memory_gib:g} GiB" if plan_type
                else f"{memory_gib:g} GiB")
        return (f"candidate {store.label} ({other.vcpus} vCPUs, {other.memory_gib} GiB) is not the plan's size "
                f"({plan}): compare a store of the same size, or give --instance-type {other.name}")
    return None
