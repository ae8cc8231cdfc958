"""The lab's pure parts: credit charging, burst/baseline switching, emulated memory. No root needed."""

from __future__ import annotations

import pytest

from tuning.ebs import GIB, KIB, MIB, Volume
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab import CreditController, DiskCounters, LabRun, download_ratio, emulated_sysctls

pytestmark = pytest.mark.unit


def controller(credits_mib: float, *, hold_empty: bool = False, time_scale: float = 1.0) -> CreditController:
    return CreditController(volume=Volume("st1", 500), device_name="loopX", set_limit=lambda _: None,
                            time_scale=time_scale, initial_credits_mib=credits_mib, tick_s=0.1,
                            hold_empty=hold_empty)


def test_charge_uses_hdd_accounting() -> None:
    c = controller(1000)
    zero = DiskCounters(0, 0, 0, 0)
    # 64 MiB in 1 MiB writes costs 64 MiB; 64 MiB in 64 KiB writes costs 1024 MiB.
    assert c.charge(zero, DiskCounters(0, 0, 64, 64 * MIB)) == pytest.approx(64)
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


def test_hold_empty_never_bursts() -> None:
    c = controller(10_000, hold_empty=True)
    assert not c.bursting


def test_emulated_memory_turns_ratios_into_bytes() -> None:
    values = emulated_sysctls(HostTuning(), 4 * GIB)  # 30 / 20 of 4 GiB x 0.9 dirtyable
    assert values == {"vm.dirty_bytes": str(int(4 * GIB * 0.9 * 0.30)),
                      "vm.dirty_background_bytes": str(int(4 * GIB * 0.9 * 0.20))}
    defaults = emulated_sysctls(KERNEL_DEFAULTS, 4 * GIB)
    assert int(defaults["vm.dirty_bytes"]) < int(values["vm.dirty_bytes"])
    as_bytes = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=GIB,
                          dirty_background_bytes=GIB // 2)
    assert emulated_sysctls(as_bytes, 4 * GIB) == {"vm.dirty_bytes": str(GIB),
                                                   "vm.dirty_background_bytes": str(GIB // 2)}
    assert emulated_sysctls(HostTuning(), None) == {"vm.dirty_ratio": "30", "vm.dirty_background_ratio": "20"}


def test_download_ratio_is_median_default_over_median_tuned() -> None:
    def run(setting: str, seconds: float) -> LabRun:
        return LabRun(setting, {}, {"download": {"StageDuration": seconds}}, 1.0, 0.0, 0.0, 19.5)

    runs = [run("default", 12.0), run("tuned", 3.0), run("default", 10.0), run("tuned", 4.0)]
    assert download_ratio(runs) == pytest.approx(11.0 / 3.5)
    assert download_ratio([run("default", 1.0)]) is None
