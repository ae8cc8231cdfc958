"""The lab's fixed-rate FUSE device: its arithmetic against AWS's documented st1 figures, computed here
independently of tuning.ebs (40 and 250 MiB/s per TiB, a 1 TiB bucket per TiB, 1 MiB units)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tuning.ebs import KIB, MIB, Volume
from tuning.lab.fusedev import DeviceRates, RateDevice

SIZE_TIB = 500 / 1024
BASE = 40 * SIZE_TIB  # MiB/s
BURST = 250 * SIZE_TIB


def rates(capacity_mib: float, initial_mib: float) -> DeviceRates:
    return DeviceRates(burst_bps=BURST * MIB, base_bps=BASE * MIB, capacity_mib=capacity_mib,
                       initial_mib=initial_mib, earn_mibps=BASE)


def run(device: RateDevice, requests: list[tuple[int, int]]) -> float:
    """Back-to-back requests from t=0: when the last completes."""
    now = 0.0
    for offset, size in requests:
        now = device.serve(offset, size, now, write=True)
    return now


def test_the_lab_rates_match_the_documented_figures() -> None:
    made = DeviceRates.of(Volume("st1", 500), time_scale=1, initial_mib=500 * 1024, hold_empty=False)
    assert made.base_bps == pytest.approx(BASE * MIB)
    assert made.burst_bps == pytest.approx(BURST * MIB)
    assert made.capacity_mib == pytest.approx(500 * 1024)
    held = DeviceRates.of(Volume("st1", 500), time_scale=1, initial_mib=500 * 1024, hold_empty=True)
    assert held.capacity_mib == 0 and held.earn_mibps == 0


def test_sequential_256_kib_requests_run_at_baseline_random_ones_at_a_quarter() -> None:
    seq = [(i * 256 * KIB, 256 * KIB) for i in range(400)]  # 100 MiB
    assert run(RateDevice(rates(0, 0), 0.0), seq) == pytest.approx(100 / BASE, rel=0.01)
    rnd = [((i * 7919 % 400) * 4 * MIB, 256 * KIB) for i in range(400)]
    assert run(RateDevice(rates(0, 0), 0.0), rnd) == pytest.approx(400 / BASE, rel=0.01)


def test_burst_until_the_credits_are_spent_then_baseline() -> None:
    credits = 100.0  # MiB
    device = RateDevice(rates(1_000, credits), 0.0)
    seq = [(i * MIB, MIB) for i in range(400)]
    end = run(device, seq)
    # Bursting drains at burst - baseline: credits / (burst - baseline) seconds, moving BURST x that.
    burst_s = credits / (BURST - BASE)
    expected = burst_s + (400 - BURST * burst_s) / BASE
    assert end == pytest.approx(expected, rel=0.02)
    assert device.empty_at == pytest.approx(burst_s, rel=0.05)
    assert device.stats(end)["units"] == 400


def test_unthrottled_serves_at_once() -> None:
    device = RateDevice(rates(0, 0), 0.0)
    device.unthrottled = True
    assert run(device, [(0, 64 * MIB)]) == 0.0


def test_the_store_is_in_memory_only_on_a_tmpfs_with_room(tmp_path: Path) -> None:
    from tuning.lab.fusedev import STORE_MARGIN, STORE_NAME, store_path

    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    shm = tmp_path / "shm"
    shm.mkdir()
    lab = tmp_path / "lab"

    def host(fs: str, available_kib: int) -> None:
        (proc / "self" / "mounts").write_text(f"sysfs /sys sysfs rw 0 0\n{fs} {shm} {fs} rw 0 0\n")
        (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")

    small = 1 << 20
    host("tmpfs", (small + STORE_MARGIN) // 1024)
    assert store_path(lab, small, shm=shm, proc=proc).parent == shm
    host("tmpfs", (small + STORE_MARGIN) // 1024 - 1)  # not enough memory besides the margin
    assert store_path(lab, small, shm=shm, proc=proc) == lab / STORE_NAME
    host("ext4", 1 << 40)  # not a tmpfs: its pages would be dirty pages of another device
    assert store_path(lab, small, shm=shm, proc=proc) == lab / STORE_NAME
    host("tmpfs", 1 << 40)
    room = os.statvfs(shm)
    assert store_path(lab, room.f_bavail * room.f_frsize + 1, shm=shm, proc=proc) == lab / STORE_NAME
    (proc / "meminfo").unlink()  # unreadable: on disk
    assert store_path(lab, small, shm=shm, proc=proc) == lab / STORE_NAME
