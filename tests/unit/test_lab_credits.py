"""The lab's credit controller: credit charging, burst/baseline switching, the time scale. No root needed."""

from __future__ import annotations

import pytest

from profiling.probes.procfs import DiskStats
from tuning.ebs import KIB, MIB, Volume
from tuning.lab.credits import CreditController, DiskCounters


def controller(credits_mib: float, *, hold_empty: bool = False, time_scale: float = 1.0) -> CreditController:
    return CreditController(volume=Volume("st1", 500), device_name="loopX", set_limit=lambda _: None,
                            time_scale=time_scale, initial_credits_mib=credits_mib, tick_s=0.1,
                            hold_empty=hold_empty)


def test_charge_uses_hdd_accounting() -> None:
    c = controller(1000)
    zero = DiskCounters(0, 0, 0, 0)
    # 64 MiB in 1 MiB writes costs 64 MiB; sequential 64 KiB writes are merged into 1 MiB units: 64 MiB too.
    assert c.charge(zero, DiskCounters(0, 0, 64, 64 * MIB)) == pytest.approx(64)
    assert c.charge(zero, DiskCounters(0, 0, 1024, 1024 * 64 * KIB)) == pytest.approx(64)
    # Told the I/O is random, each 64 KiB write costs a whole MiB.
    c.random_share = 1.0
    assert c.charge(zero, DiskCounters(0, 0, 1024, 1024 * 64 * KIB)) == pytest.approx(1024)
    # Reads count too; zero-byte requests (flushes) cost nothing.
    assert c.charge(zero, DiskCounters(2, 2 * MIB, 5, 0)) == pytest.approx(2)


def test_burst_then_baseline_with_hysteresis() -> None:
    c = controller(100)
    assert c.bursting and c.current_limit() == c.burst_bps
    assert c.burst_bps == int(122.0703125 * MIB) and c.base_bps == int(19.53125 * MIB)
    empty = controller(0)
    assert not empty.bursting and empty.current_limit() == empty.base_bps
    # A few MiB earned while empty do not flip it back to burst: that would average burst and baseline.
    empty.credits = 5
    assert not empty.bursting
    empty.credits = empty.resume_credits
    assert empty.bursting


def test_time_scale_shrinks_the_bucket_not_the_rates() -> None:
    c = controller(Volume("st1", 500).credit_capacity, time_scale=400)
    assert c.capacity == pytest.approx(500 * 1024 / 400)
    assert c.credits == pytest.approx(500 * 1024 / 400)
    assert c.burst_bps == int(122.0703125 * MIB)
    # Reported at the real volume's scale.
    assert c.credits_gib == pytest.approx(500)


def test_hold_empty_never_bursts() -> None:
    c = controller(10_000, hold_empty=True)
    assert not c.bursting


def test_disk_counters_come_from_the_procfs_reading() -> None:
    # /proc/diskstats counts 512-byte sectors: 2048 sectors are 1 MiB.
    stats = DiskStats(reads=3, reads_merged=0, sectors_read=2048, ms_reading=0, writes=7, writes_merged=1,
                      sectors_written=4096, ms_writing=0, in_flight=0, io_ticks_ms=0, weighted_ms=0)
    assert DiskCounters.of(stats) == DiskCounters(3, MIB, 7, 2 * MIB)
