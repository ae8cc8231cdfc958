"""The EC2 instance types the stack can launch, with AWS's published figures, and how many children Batch packs onto
one. Pure; imports nothing of the project, so the stack (infra) and the advisor share one table and one rule.

Owns a job's memory (task_memory_mib, job_memory_mib), the vCPUs it reserves (reserved_vcpus), children per host
(children_per_host: limited by vCPUs and by the memory the ECS agent registers), the instance memory the advisor takes
(MIN_MEMORY_GIB, MAX_MEMORY_GIB) and the stack's context keys for its hosts. Each table cites its source beside it;
`lookup` and `types_of` read it, None or [] for a type it does not know.

    children_per_host(INSTANCE_TYPES["m6i.2xlarge"], vcpus_per_job=2)   # 4
"""

from __future__ import annotations

from dataclasses import dataclass

# A job's memory: 3.5 GiB per vCPU of vcpusPerJob (the whole job: the job container and the profiler sidecar), so a
# 2-vCPU job fits four to an m6i.2xlarge (8 vCPUs, 32 GiB) with room left for the ECS agent and the page cache.
MEMORY_PER_VCPU_MIB = 3584
# The stack's default vcpusPerJob, and the most children its default scratch volume is sized for (four 2-vCPU jobs on
# an m6i.2xlarge: st1 500 GiB gives each 125 GiB and 5 MiB/s of baseline).
DEFAULT_VCPUS_PER_JOB = 2
DEFAULT_CHILDREN_PER_HOST = 4
# The stack's context keys for its hosts: infra.settings reads them, the advisor writes them and reads them back from a
# deployed stack (tuning.deployed).
INSTANCE_TYPES_KEY = "instanceTypes"
CHILDREN_PER_HOST_KEY = "childrenPerHost"
VCPUS_PER_JOB_KEY = "vcpusPerJob"
# The vCPUs a job reserves at the least: its two containers, a whole vCPU each (reserved_vcpus).
MIN_RESERVED_VCPUS = 2
# The profiler sidecar's share of a job's memory; the job container's MEMORY (its cgroup's memory.max) is the rest.
PROFILER_MEMORY_MIB = 256
# Batch places a job on a host whose registered memory holds the job's MEMORY ("Compute resource memory management",
# AWS Batch User Guide): the ECS agent registers what the OS reports, about this share of the installed memory (7985 /
# 8192 MiB on that page's m4.large; an approximation: it varies a little with the kernel and the instance), and the
# Batch AMI reserves ECS_RESERVED_MEMORY on top.
REGISTERED_SHARE = 7985 / 8192
ECS_RESERVED_MEMORY_MIB = 32
# An instance's memory the advisor takes (`advise --memory-gib`, and a local run's run.json memory_gib): from the
# smallest EC2 instance to the largest (u-* hosts hold up to 24 TiB).
MIN_MEMORY_GIB = 0.5
MAX_MEMORY_GIB = 32768.0

# The tables below are AWS's, from the "Amazon EC2 Instance Types" guide as published in 2024 (Specifications: general
# purpose, compute optimized, memory optimized, storage optimized). vCPUs: its "Performance specifications" tables.
# Memory is derived: within a family memory per vCPU is fixed (_FAMILIES), so a row is its vCPUs x that ratio; the
# tables agree for every size listed here.
SIZES = ("large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge", "16xlarge", "24xlarge", "32xlarge", "metal")
_VCPUS = (2, 4, 8, 16, 32, 48, 64, 96, 128, 128)
# EBS baseline / maximum bandwidth per size, Mbps as AWS gives it (the same for m6i, c6i, r6i and their d variants;
# i4i.large 625): the guide's "Amazon EBS specifications" tables, which the EC2 User Guide's "Amazon EBS-optimized
# instance types" page repeats. Sizes up to 4xlarge burst to the maximum "for 30 minutes at least once every 24 hours"
# and otherwise hold the baseline; larger sizes have one figure.
_EBS_BASELINE_MBPS = (650, 1250, 2500, 5000, 10000, 15000, 20000, 30000, 40000, 40000)
_EBS_MAX_MBPS = (10000, 10000, 10000, 10000, 10000, 15000, 20000, 30000, 40000, 40000)
# Instance store per size: (volumes, GB each; GB = 10^9 bytes), NVMe SSD: the guide's "Instance store specifications"
# tables, which "Instance store volume limits for EC2 instances" repeats. m6i, c6i and r6i have none.
_STORE_6ID = ((1, 118), (1, 237), (1, 474), (1, 950), (1, 1900), (2, 1425), (2, 1900), (4, 1425), (4, 1900),
              (4, 1900))
_STORE_I4I = ((1, 468), (1, 937), (1, 1875), (1, 3750), (2, 3750), (3, 3750), (4, 3750), (6, 3750), (8, 3750),
              (8, 3750))
# Instance store 4 KiB IOPS per size: (100 % random read, write), per instance (all its volumes together): the
# "Instance store specifications" tables' "100% Random Read IOPS" and "Write IOPS", measured by AWS at a 4 KiB block
# size; m6id, c6id and r6id share one column. Read from the copy of those tables in
# Netflix-Skunkworks/service-capacity-modeling (service_capacity_modeling/hardware/profiles/shapes/aws/auto_m6id.json,
# auto_c6id.json, auto_r6id.json, auto_i4i.json: read_io_per_s / write_io_per_s); .metal is taken as its 32xlarge
# (the copy has no .metal row). The tables give no sequential throughput: tuning.instancestore says what is assumed.
_IOPS_6ID = ((33_542, 16_771), (67_083, 33_542), (134_166, 67_084), (268_332, 134_168), (536_664, 268_336),
             (804_996, 402_504), (1_073_328, 536_672), (1_609_992, 805_008), (2_146_656, 1_073_344),
             (2_146_656, 1_073_344))
_IOPS_I4I = ((50_000, 27_500), (100_000, 55_000), (200_000, 110_000), (400_000, 220_000), (800_000, 440_000),
             (1_200_000, 660_000), (1_600_000, 880_000), (2_400_000, 1_320_000), (3_200_000, 1_760_000),
             (3_200_000, 1_760_000))
_STORE_IOPS = {"m6id": _IOPS_6ID, "c6id": _IOPS_6ID, "r6id": _IOPS_6ID, "i4i": _IOPS_I4I}
# Family -> (memory GiB per vCPU, instance store per size or None).
_FAMILIES: dict[str, tuple[int, tuple[tuple[int, int], ...] | None]] = {
    "m6i": (4, None), "c6i": (2, None), "r6i": (8, None),
    "m6id": (4, _STORE_6ID), "c6id": (2, _STORE_6ID), "r6id": (8, _STORE_6ID), "i4i": (8, _STORE_I4I),
}


@dataclass(frozen=True)
class InstanceType:
    """One instance type's figures (their sources: beside the tables above)."""

    name: str
    vcpus: int
    memory_gib: int
    ebs_baseline_mbps: int
    ebs_max_mbps: int
    store_volumes: int = 0  # instance store NVMe volumes
    store_volume_gb: int = 0  # GB (10^9 bytes) each
    store_read_iops: int = 0  # the instance store's 100 % random read IOPS at 4 KiB, all volumes together
    store_write_iops: int = 0  # its write IOPS at 4 KiB

    @property
    def family(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def ebs_baseline_mibps(self) -> float:
        """The sustained EBS bandwidth in MiB/s (derived from AWS's Mbps)."""
        return self.ebs_baseline_mbps * 1e6 / 8 / 2**20

    @property
    def ebs_max_mibps(self) -> float:
        """The EBS bandwidth in MiB/s while the instance bursts (sizes up to 4xlarge, at least 30 minutes a day, so a
        host in its first minutes has it); the baseline for larger sizes."""
        return self.ebs_max_mbps * 1e6 / 8 / 2**20

    @property
    def store_gb(self) -> int:
        """The instance store's size in all, GB; 0 when the type has none."""
        return self.store_volumes * self.store_volume_gb

    @property
    def registered_memory_mib(self) -> int:
        """The memory the ECS agent offers to jobs (an approximation: REGISTERED_SHARE)."""
        return int(self.memory_gib * 1024 * REGISTERED_SHARE) - ECS_RESERVED_MEMORY_MIB

    def describe(self) -> str:
        store = f", instance store {self.store_volumes} x {self.store_volume_gb} GB" if self.store_volumes else ""
        return (f"{self.name}: {self.vcpus} vCPUs, {self.memory_gib} GiB, EBS {self.ebs_baseline_mibps:,.0f} MiB/s "
                f"baseline{store}")


def _table() -> dict[str, InstanceType]:
    table = {}
    for family, (gib_per_vcpu, store) in _FAMILIES.items():
        for i, size in enumerate(SIZES):
            baseline = 625 if (family, size) == ("i4i", "large") else _EBS_BASELINE_MBPS[i]
            volumes, each = store[i] if store else (0, 0)
            read, write = _STORE_IOPS[family][i] if family in _STORE_IOPS else (0, 0)
            name = f"{family}.{size}"
            table[name] = InstanceType(name, _VCPUS[i], _VCPUS[i] * gib_per_vcpu, baseline, _EBS_MAX_MBPS[i],
                                       volumes, each, read, write)
    return table


INSTANCE_TYPES: dict[str, InstanceType] = _table()
FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def lookup(name: str) -> InstanceType | None:
    """An instance type of the table by its name (m6i.2xlarge), or None."""
    return INSTANCE_TYPES.get(name.strip().lower())


def types_of(entry: str) -> list[InstanceType]:
    """The table's types an instanceTypes entry lets Batch launch: a family's every size, or the one type; [] when
    the table does not know it."""
    entry = entry.strip().lower()
    if "." in entry:
        found = lookup(entry)
        return [found] if found else []
    return [t for t in INSTANCE_TYPES.values() if t.family == entry]


def task_memory_mib(vcpus_per_job: int) -> int:
    """A job's MEMORY in all (the job container and the profiler), what Batch places by."""
    return vcpus_per_job * MEMORY_PER_VCPU_MIB


def job_memory_mib(vcpus_per_job: int) -> int:
    """The job container's MEMORY: its memory cgroup's limit, which sizes its own write cache."""
    return task_memory_mib(vcpus_per_job) - PROFILER_MEMORY_MIB


def reserved_vcpus(vcpus_per_job: int) -> int:
    """The vCPUs Batch reserves on a host for one job: vcpusPerJob, and at least one for each of its containers (the
    job's and the profiler's): on EC2 every container of a job has a whole vCPU or more (AWS Batch API Reference,
    ResourceRequirement: VCPU), so vcpusPerJob 1 reserves 2."""
    return max(vcpus_per_job, MIN_RESERVED_VCPUS)


def children_per_host(instance: InstanceType, vcpus_per_job: int) -> int:
    """How many jobs Batch runs at once on `instance`: its vCPUs // the vCPUs a job reserves (reserved_vcpus), limited
    by its registered memory // the job's MEMORY (0: the job does not fit)."""
    by_cpu = instance.vcpus // reserved_vcpus(vcpus_per_job)
    by_memory = instance.registered_memory_mib // task_memory_mib(vcpus_per_job)
    return max(0, min(by_cpu, by_memory))


def known_types_text() -> str:
    """The families the table knows, for an error message."""
    return ", ".join(f"{f}.{{{SIZES[0]}..{SIZES[-2]},{SIZES[-1]}}}" for f in FAMILIES)
