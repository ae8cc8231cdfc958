"""EBS volume models and the burst-bucket simulator, against AWS's documented figures."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tuning.ebs import (
    GIB,
    KIB,
    MIB,
    StageLoad,
    Volume,
    VolumeError,
    WriteCache,
    simulate,
)

pytestmark = pytest.mark.unit


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


def test_hdd_accounting_small_io_costs_a_full_mib() -> None:
    volume = Volume("st1", 500)
    assert volume.cost_per_byte(MIB) == pytest.approx(1 / MIB)
    assert volume.cost_per_byte(64 * KIB) == pytest.approx(16 / MIB)  # 64 KiB costs 1 MiB
    assert volume.cost_per_byte(4 * MIB) == pytest.approx(1 / MIB)
    # 64 KiB random I/O: throughput drops 16x, and credits drain 16x faster per byte.
    assert volume.throughput_bps(io_size=64 * KIB, bursting=True) == pytest.approx(122.0703125 * MIB / 16)


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


def test_write_cache_freerun_is_halfway() -> None:
    cache = WriteCache.from_ratios(10 * GIB, 30, 20)
    assert cache.limit_bytes == int(10 * GIB * 0.9 * 0.3)
    assert cache.freerun_bytes == (cache.limit_bytes + cache.background_bytes) // 2


def test_simulator_without_cache_runs_at_burst_then_baseline() -> None:
    volume = Volume("st1", 500)
    # 1 GiB per round, no cache, no floor: each round is disk-bound.
    stage = StageLoad("download", write_bytes=GIB, io_size=MIB)
    credits = 10 * 1024.0  # MiB: ~100 s of burst
    result = simulate(volume, [stage], waves=20, initial_credits=credits, dt=0.05)
    times = result.stage_times("download")
    assert times[0] == pytest.approx(1024 / 122.0703125, rel=0.02)
    assert times[-1] == pytest.approx(1024 / 19.53125, rel=0.02)
    assert result.credits_empty_at is not None
    # Credits drain at burst - baseline while bursting.
    assert result.credits_empty_at == pytest.approx(credits / (122.0703125 - 19.53125), rel=0.03)


def test_simulator_cache_absorbs_a_burst_but_not_durability() -> None:
    volume = Volume("st1", 500)
    stage = StageLoad("download", write_bytes=512 * MIB, io_size=MIB, floor_s=2.0)
    small = WriteCache(limit_bytes=128 * MIB, background_bytes=64 * MIB)
    large = WriteCache(limit_bytes=1024 * MIB, background_bytes=512 * MIB)
    slow = simulate(volume, [stage], cache=small, dt=0.05).waves[0]
    fast = simulate(volume, [stage], cache=large, dt=0.05).waves[0]
    assert fast.stage_s["download"] == pytest.approx(2.0, abs=0.1)  # memory speed: the floor
    assert slow.stage_s["download"] > 3.0  # past 96 MiB writers wait for the disk
    # Time to durable is the disk's: 512 MiB at burst, give or take the background threshold wait.
    assert slow.time_to_durable_s == pytest.approx(512 / 122.07, rel=0.1)
    assert fast.time_to_durable_s is not None and fast.time_to_durable_s >= 512 / 122.07 * 0.95


def test_simulator_credit_cliff_over_hours() -> None:
    volume = Volume("st1", 500)
    stages = [StageLoad("download", 2 * GIB, floor_s=10), StageLoad("process", 0, floor_s=20)]
    result = simulate(volume, stages, concurrency=2, waves=300, cache=WriteCache(0, 0))
    assert result.credits_empty_at is not None and result.credits_empty_at > 3600
    burst, base = 122.0703125, 19.53125
    before = result.waves[0].stage_s["download"]
    assert before == pytest.approx(4096 / burst, rel=0.02)
    # After the cliff each round starts with the credits earned during the 20 s process stage: a short
    # burst, then the rest at baseline.
    earned = 20 * base
    burst_s = earned / (burst - base)
    expected = burst_s + (4096 - burst * burst_s) / base
    assert result.waves[-1].stage_s["download"] == pytest.approx(expected, rel=0.02)
    assert any(s.credits == 0 for s in result.samples)
