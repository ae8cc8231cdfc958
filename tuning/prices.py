"""What a scratch volume costs per month: AWS EBS list prices, dated. Pure.

The prices are those of https://aws.amazon.com/ebs/pricing/ for PRICES_REGION, unchanged from 2021 through
PRICES_AS_OF. Storage is billed per GB-month of provisioned size; prices differ by region. Still current in early
2026: gp3 0.08 vs gp2 0.10 USD per GB-month in us-east-1 (AWS's agent toolkit, "EBS Volume Optimization" reference,
aws/agent-toolkit-for-aws skills/core-skills/aws-billing-and-cost-management/references/ebs-optimization.md).

gp3 against st1/sc1: gp3 has no credits (3,000 IOPS and 125 MiB/s free at any size, provisionable to 80,000 IOPS
and 2,000 MiB/s since the 2025 raise: tuning.ebs [API], and AWS re:Invent 2025 STG320 "Optimizing price performance
with enhanced Amazon EBS gp3 volumes"), st1 costs 0.045 a GB-month against gp3's 0.08 and pays for that with its
credit bucket. Instance store has no price here: it is billed inside the instance's hourly price
(tuning.instancestore: priced only when told what it adds per hour).
"""

from __future__ import annotations

import math

from tuning.ebs import GP3_BASE_IOPS, GP3_BASE_MIBPS, Volume
from tuning.instancestore import InstanceStore

PRICES_REGION = "us-east-1"
PRICES_AS_OF = "2025-06-01"
PRICE_PER_GB_MONTH: dict[str, float] = {
    "st1": 0.045, "sc1": 0.015, "gp2": 0.10, "gp3": 0.08, "io1": 0.125, "io2": 0.125,
}
GP3_PRICE_PER_IOPS_MONTH = 0.005  # above the free 3,000
GP3_PRICE_PER_MIBPS_MONTH = 0.040  # above the free 125 MiB/s
IO1_PRICE_PER_IOPS_MONTH = 0.065
# io2 provisioned IOPS are billed in tiers: (up to this many IOPS, price per IOPS-month).
IO2_IOPS_TIERS: tuple[tuple[float, float], ...] = ((32_000, 0.065), (64_000, 0.0455), (math.inf, 0.032))


def monthly_cost(volume: Volume) -> float | None:
    """USD per month for the volume in PRICES_REGION, at the PRICES_AS_OF list prices; an instance store: what it adds
    to the instance's price for a month, None when not told (tuning.instancestore)."""
    if isinstance(volume, InstanceStore):
        return volume.monthly_usd()
    cost = volume.size_gib * PRICE_PER_GB_MONTH[volume.kind]
    if volume.kind == "gp3":
        cost += max(0, volume.provisioned_iops - GP3_BASE_IOPS) * GP3_PRICE_PER_IOPS_MONTH
        cost += max(0.0, volume.provisioned_mibps - GP3_BASE_MIBPS) * GP3_PRICE_PER_MIBPS_MONTH
    elif volume.kind == "io1":
        cost += volume.provisioned_iops * IO1_PRICE_PER_IOPS_MONTH
    elif volume.kind == "io2":
        left, low = float(volume.provisioned_iops), 0.0
        for upto, price in IO2_IOPS_TIERS:
            take = min(left, upto - low)
            cost += take * price
            left -= take
            low = upto
            if left <= 0:
                break
    return round(cost, 2)
