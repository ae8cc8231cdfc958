"""The EBS volume model: rates and credit buckets against AWS's documented figures, validation, CDK context."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuning.accounting import HddAccountant
from tuning.ebs import (
    CONTEXT_KEYS,
    IOPS_TYPES,
    KIB,
    LIMITS,
    MIB,
    VOLUME_TYPES,
    Volume,
    VolumeError,
)


def test_st1_500_gib_baseline_and_burst() -> None:
    volume = Volume("st1", 500)
    # 40 and 250 MiB/s per TiB: 500/1024 TiB.
    assert volume.baseline_mibps == pytest.approx(19.53, abs=0.01)
    assert volume.burst_mibps == pytest.approx(122.07, abs=0.01)
    assert volume.credit_capacity == pytest.approx(500 * 1024)  # 1 TiB of credits per TiB


@pytest.mark.parametrize("size_gib", [125, 500, 1024, 1500, 2047])
def test_full_st1_bucket_sustains_burst_about_83_minutes_below_2_tib(size_gib: int) -> None:
    # Below 2 TiB all three scale with size: 1 TiB / (250 - 40) MiB/s = 4993 s.
    assert Volume("st1", size_gib).burst_seconds() / 60 == pytest.approx(83.2, abs=0.1)


def test_st1_above_2_tib_burst_is_capped_and_lasts_longer() -> None:
    big = Volume("st1", 4096)
    assert big.burst_mibps == 500.0
    assert big.baseline_mibps == 160.0
    assert big.burst_seconds() == pytest.approx(4 * 1024 * 1024 / (500 - 160))
    # At 12.5 TiB baseline reaches the cap: nothing left to burst to.
    assert math.isinf(Volume("st1", 12800).burst_seconds())


def test_54_gib_of_credits_burst_for_credits_over_burst_minus_baseline() -> None:
    volume = Volume("st1", 500)
    credits = 54 * 1024  # MiB
    real = volume.burst_seconds(credits)
    naive = volume.naive_burst_seconds(credits)
    assert real == pytest.approx(credits / (122.0703125 - 19.53125))
    assert real / 60 == pytest.approx(8.99, abs=0.01)
    assert naive / 60 == pytest.approx(7.55, abs=0.01)  # the case study's "7 minutes" divides by burst
    text = volume.explain_burst(credits)
    assert "9.0 min" in text and "7.5 min" in text
    assert "refilling at baseline" in text


def test_hdd_accounting_random_small_io_costs_a_full_mib() -> None:
    volume = Volume("st1", 500)
    assert volume.cost_per_byte(MIB, random_share=1) == pytest.approx(1 / MIB)
    assert volume.cost_per_byte(64 * KIB, random_share=1) == pytest.approx(16 / MIB)  # 64 KiB costs 1 MiB
    assert volume.cost_per_byte(4 * MIB, random_share=1) == pytest.approx(1 / MIB)
    # 64 KiB random I/O: throughput drops 16x, and credits drain 16x faster per byte.
    assert volume.throughput_bps(io_size=64 * KIB, bursting=True, random_share=1) == pytest.approx(
        122.0703125 * MIB / 16)
    # Half the bytes random: the mean of the two costs.
    assert volume.cost_per_byte(256 * KIB, random_share=0.5) == pytest.approx((1 + 4) / 2 / MIB)


def test_hdd_accounting_sequential_io_is_merged_into_1_mib_units() -> None:
    volume = Volume("st1", 500)
    # 256 KiB writeback requests, sequential: st1 merges them, so the volume runs at its headline rates.
    seq = [volume.throughput_bps(io_size=256 * KIB, bursting=b) / MIB for b in (True, False)]
    assert seq == [pytest.approx(122.07, abs=0.01), pytest.approx(19.53, abs=0.01)]
    # The same requests at random: each costs 1 MiB, a quarter of the rate.
    rnd = [volume.throughput_bps(io_size=256 * KIB, bursting=b, random_share=1) / MIB for b in (True, False)]
    assert rnd == [pytest.approx(30.52, abs=0.01), pytest.approx(4.88, abs=0.01)]
    with pytest.raises(VolumeError, match="random share"):
        volume.cost_per_byte(MIB, random_share=1.5)


def test_accountant_merges_sequential_requests_and_charges_random_ones_a_unit() -> None:
    acc = HddAccountant()
    # Eight sequential 128 KiB requests: one 1 MiB unit.
    assert sum(acc.charge(i * 128 * KIB, 128 * KIB) for i in range(8)) == 1
    # Continuing the run opens the next unit on its first request only.
    assert [acc.charge(MIB + i * 128 * KIB, 128 * KIB) for i in range(8)] == [1, 0, 0, 0, 0, 0, 0, 0]
    assert acc.random_share == pytest.approx(1 / 16)  # only the very first request was not a continuation
    rnd = HddAccountant()
    # Random 4 KiB requests cost a unit each; a random 3 MiB request three.
    assert [rnd.charge(off, 4 * KIB) for off in (10 * MIB, 3 * MIB, 7 * MIB)] == [1, 1, 1]
    assert rnd.charge(100 * MIB, 3 * MIB) == 3
    assert rnd.units == 6 and rnd.random_share == 1.0
    assert rnd.charge(0, 0) == 0 and HddAccountant().random_share is None


# ---- seed figures (the case study's, corrected where it was wrong) -------------------------------------


def test_seed_500_gib_st1_baseline_and_burst_for_merged_sequential_io() -> None:
    volume = Volume("st1", 500)
    assert volume.baseline_mibps == pytest.approx(19.5, abs=0.05)
    assert volume.burst_mibps == pytest.approx(122.0, abs=0.1)


def test_seed_45_minutes_at_baseline_refills_and_lasts_credits_over_burst_minus_baseline() -> None:
    volume = Volume("st1", 500)
    # The case study rounds the baseline to 20 MiB/s: 45 min x 20 MiB/s = 54,000 MiB. At 19.53 MiB/s: 52,734.
    assert 45 * 60 * 20 == 54_000
    refilled = volume.refill_mib(45 * 60)
    assert refilled == pytest.approx(52_734.4, abs=0.1)
    # While it bursts the bucket refills at baseline: it lasts credits / (burst - baseline), not credits / burst.
    assert volume.burst_seconds(54_000) == pytest.approx(54_000 / (122.0703125 - 19.53125))
    assert volume.burst_seconds(54_000) / 60 == pytest.approx(8.78, abs=0.01)
    assert volume.naive_burst_seconds(54_000) / 60 == pytest.approx(7.37, abs=0.01)  # the case study's "7 min"


def test_seed_500_gb_gp2_iops() -> None:
    volume = Volume("gp2", 500)
    assert volume.gp2_baseline_iops == 1_500
    assert volume.spend_limit(bursting=True) == 3_000
    assert volume.spend_limit(bursting=False) == 1_500


# ---- current limits (AWS documentation as of 2025-09) --------------------------------------------------


def test_gp3_takes_the_raised_limits() -> None:
    top = Volume("gp3", 64 * 1024, iops=80_000, throughput_mibps=2_000)
    assert top.max_mibps == 2_000.0 and top.provisioned_iops == 80_000
    with pytest.raises(VolumeError, match="outside 3000-80000"):
        Volume("gp3", 64 * 1024, iops=80_001)
    with pytest.raises(VolumeError, match="outside 125-2000"):
        Volume("gp3", 64 * 1024, iops=80_000, throughput_mibps=2_001)
    with pytest.raises(VolumeError, match="outside 1-65536"):
        Volume("gp3", 64 * 1024 + 1)
    with pytest.raises(VolumeError, match="per IOPS"):
        Volume("gp3", 1000, iops=4_000, throughput_mibps=1_001)  # 0.25 MiB/s per IOPS


def test_gp2_170_to_334_gib_gives_250_mibps_only_while_credits_last() -> None:
    small, middle, large = Volume("gp2", 170), Volume("gp2", 200), Volume("gp2", 334)
    assert small.ceiling_mibps(bursting=True) == small.ceiling_mibps(bursting=False) == 128.0
    assert (middle.ceiling_mibps(bursting=True), middle.ceiling_mibps(bursting=False)) == (250.0, 128.0)
    assert large.ceiling_mibps(bursting=False) == 250.0
    # At 1 MiB I/O the 200 GiB volume's 3,000 burst IOPS would carry 750 MiB/s: the ceiling binds.
    assert middle.throughput_bps(io_size=MIB, bursting=True) == 250 * MIB
    assert middle.throughput_bps(io_size=MIB, bursting=False) == 128 * MIB


def test_sc1_rates() -> None:
    volume = Volume("sc1", 1024)
    assert volume.baseline_mibps == 12.0
    assert volume.burst_mibps == 80.0
    assert Volume("sc1", 16 * 1024).burst_mibps == 250.0


def test_gp2_iops_credits() -> None:
    small = Volume("gp2", 100)
    assert small.gp2_baseline_iops == 300
    assert small.bursts
    assert small.credit_capacity == 5_400_000
    assert small.burst_seconds() == pytest.approx(5_400_000 / (3000 - 300))
    assert small.max_mibps == 128.0  # up to 170 GiB
    assert Volume("gp2", 10).gp2_baseline_iops == 100  # the minimum
    big = Volume("gp2", 1000)
    assert not big.bursts and big.credit_capacity == 0
    assert Volume("gp2", 6000).gp2_baseline_iops == 16_000  # the maximum
    # SSD accounting: 1 MiB I/O counts as four 256 KiB I/Os.
    assert small.cost_per_byte(MIB) == pytest.approx(4 / MIB)
    assert small.throughput_bps(io_size=16 * KIB, bursting=True) == pytest.approx(3000 * 16 * KIB)


def test_gp3_and_io2() -> None:
    base = Volume("gp3", 100)
    assert base.baseline_mibps == base.burst_mibps == 125.0
    assert not base.bursts
    fast = Volume("gp3", 100, iops=4000, throughput_mibps=1000)
    assert fast.max_mibps == 1000.0
    io2 = Volume("io2", 100, iops=3000)
    assert io2.max_mibps == pytest.approx(3000 * 256 / 1024)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("st1", 100), "outside 125-16384"),
        (("st9", 500), "not one of"),
        (("gp3", 10, 6000), "500 per GiB"),
        (("gp3", 100, 3000, 1000.0), "per IOPS"),
        (("io2", 100), "needs provisioned iops"),
        (("st1", 500, 3000), "takes no provisioned"),
    ],
)
def test_invalid_volumes_name_the_problem(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(VolumeError, match=message):
        Volume(*args)


def test_instance_cap_limits_throughput() -> None:
    volume = Volume("st1", 2048)
    assert volume.throughput_bps(io_size=MIB, bursting=True, instance_cap_bps=100 * MIB) == 100 * MIB


def test_io1_is_modelled_with_its_own_limits() -> None:
    io1 = Volume("io1", 100, iops=4000)
    assert io1.label == "io1 100 GiB 4000 IOPS"
    assert io1.max_mibps == 1000.0  # 4000 x 256 KiB, capped at io1's 1,000 MiB/s
    assert Volume("io1", 100, iops=2000).max_mibps == pytest.approx(2000 * 256 / 1024)
    assert not io1.bursts and io1.credit_capacity == 0
    with pytest.raises(VolumeError, match="50 per GiB"):
        Volume("io1", 100, iops=6000)
    with pytest.raises(VolumeError, match="outside 100-64000"):
        Volume("io1", 16384, iops=100_000)
    with pytest.raises(VolumeError, match="needs provisioned iops"):
        Volume("io1", 100)


def smallest(kind: str) -> Volume:
    """The smallest volume of a kind that EBS accepts."""
    limits = LIMITS[kind]
    low = limits.size_gib[0]
    iops = limits.iops[0] if limits.iops is not None and limits.iops_required else None
    # gp3 runs at 3,000 IOPS at least, and 500 IOPS per GiB needs 6 GiB for that.
    return Volume(kind, low if kind != "gp3" else 6, iops=iops)


@pytest.mark.parametrize("kind", VOLUME_TYPES)
def test_context_round_trip_for_every_kind(kind: str) -> None:
    volume = smallest(kind)
    ctx = volume.to_context()
    assert set(ctx) <= set(CONTEXT_KEYS)
    assert ("volumeIops" in ctx) == (kind in IOPS_TYPES)
    back = Volume.from_context(ctx)
    assert back.to_context() == ctx
    assert (back.kind, back.size_gib, back.provisioned_iops, back.max_mibps) == (
        volume.kind, volume.size_gib, volume.provisioned_iops, volume.max_mibps)


def test_context_defaults_and_explicit_round_trip() -> None:
    assert Volume.from_context({}) == Volume() == Volume("st1", 500)
    assert Volume.from_context({"volumeType": " ", "volumeIops": "none"}) == Volume()
    gp3 = Volume("gp3", 300, iops=5000, throughput_mibps=400)
    assert gp3.to_context() == {"volumeType": "gp3", "volumeSizeGiB": "300", "volumeIops": "5000",
                                "volumeThroughput": "400"}
    assert Volume.from_context(gp3.to_context()) == gp3
    assert Volume.from_context({"volumeType": "io2", "volumeSizeGiB": 100, "volumeIops": 3000}) == Volume(
        "io2", 100, iops=3000)
    # gp3's free baseline is written out, so the deploy command shows what the volume gets.
    assert Volume("gp3", 200).to_context()["volumeThroughput"] == "125"


@pytest.mark.parametrize(
    ("ctx", "message"),
    [
        ({"volumeType": "standard"}, "volumeType 'standard' is not one of st1, sc1, gp2, gp3, io1, io2"),
        ({"volumeSizeGiB": "100"}, "volumeSizeGiB 100 is outside 125-16384 for st1"),
        ({"volumeSizeGiB": "lots"}, "volumeSizeGiB='lots' is not a whole number"),
        ({"volumeIops": "3000"}, "volumeIops applies to gp3, io1 and io2, not st1"),
        ({"volumeType": "io1", "volumeSizeGiB": 100}, "io1 needs volumeIops"),
        ({"volumeType": "gp3", "volumeThroughput": "2001"}, "volumeThroughput 2001 is outside 125-2000"),
        ({"volumeType": "gp3", "volumeThroughput": True}, "volumeThroughput=True is not a whole number"),
        ({"volumeType": "io2", "volumeIops": 3000, "volumeThroughput": 500}, "volumeThroughput applies to gp3"),
    ],
)
def test_context_errors_name_the_key(ctx: dict[str, object], message: str) -> None:
    with pytest.raises(VolumeError, match=message):
        Volume.from_context(ctx)


def test_throughput_is_whole_mibps() -> None:
    with pytest.raises(VolumeError, match="whole number"):
        Volume("gp3", 100, iops=3000, throughput_mibps=250.5)
