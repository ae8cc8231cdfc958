"""The eBPF probe's dirty-throttle figures against a device that throttles, and tmpfs that cannot.

A loop device of our own gets a tiny dirty limit of its own (its backing device info's strict_limit and
max_bytes, Documentation/ABI/testing/sysfs-class-bdi), so buffered writes to it pause in
balance_dirty_pages as on a slow EBS volume with a small dirty limit, without touching any global setting.
The device's two settings are read first and restored on every path, and the device is detached.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling.probes import ebpf
from tests.support.loopdev import loop_device
from tests.support.probed import run_probed
from tests.support.writebench import writebench

pytestmark = pytest.mark.root

BLOCKS = 8192  # 32 MiB of 4 KiB writes


@pytest.fixture
def throttled_device(tmp_path: Path) -> Iterator[str]:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    with loop_device(tmp_path) as device:
        rdev = os.stat(device).st_rdev
        bdi = Path(f"/sys/class/bdi/{os.major(rdev)}:{os.minor(rdev)}")
        if not (bdi / "max_bytes").exists():
            pytest.skip("this kernel has no per-device max_bytes (Linux 6.2+)")
        # max_ratio_fine is the exact form of the limit max_bytes also sets: restore that one.
        saved = {name: (bdi / name).read_text().strip() for name in ("strict_limit", "max_ratio_fine")}
        try:
            (bdi / "strict_limit").write_text("1")
            (bdi / "max_bytes").write_text(str(1 << 20))
            yield device
        finally:
            for name, value in saved.items():
                (bdi / name).write_text(value)


def writes_to(target: str) -> dict:
    return run_probed([str(writebench()), target, str(BLOCKS), "4096"])


def test_a_throttled_device_shows_pause_and_tmpfs_none(throttled_device: str, tmp_path: Path) -> None:
    slow = writes_to(throttled_device)
    assert slow["dirty_throttle_ms"] > 0 and slow["dirty_throttle_wall_ms"] > 0
    # one writer: the wall time paused is its own pause
    assert slow["dirty_throttle_wall_ms"] == pytest.approx(slow["dirty_throttle_ms"], rel=0.01)
    (task,) = slow["dirty_throttle_tasks"]
    assert task["comm"] == "writebench" and task["ms"] == slow["dirty_throttle_ms"]
    assert slow["dirtied_bytes"] == BLOCKS * 4096  # every page it wrote, dirtied once
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else tmp_path
    fast = writes_to(str(shm / f"iobatch-throttle-{os.getpid()}"))
    (shm / f"iobatch-throttle-{os.getpid()}").unlink()
    assert fast["dirty_throttle_ms"] == 0 and fast["dirty_throttle_tasks"] == []
