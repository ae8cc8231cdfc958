"""The eBPF probe's classing of the scratch disk's requests (block:block_rq_issue by sector continuity), on a
loop device of our own: O_DIRECT writes in order are sequential, writes 1 MiB apart in shuffled order random,
and another disk's requests are not counted. What AWS's HDD accounting charges (tuning.accounting)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling.finish import finish_stage
from profiling.metrics import StageProfile
from profiling.probes import ebpf
from tests.support.loopdev import loop_device as attached_loop
from tests.support.probed import run_probed

pytestmark = pytest.mark.root

WRITES = 64
# Writes 64 KiB with O_DIRECT (a page-aligned buffer from mmap) at each offset given in units of argv[2] bytes,
# in the order given.
WRITER = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 65536)
for n in sys.argv[3:]:
    os.pwritev(fd, [buf], int(n) * int(sys.argv[2]))
os.close(fd)
"""
KIB64, MIB = 65536, 1 << 20


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    with attached_loop(tmp_path) as device:  # the counts are the whole disk's: nothing else on it
        yield device


def _requests(device: str, unit: int, offsets: list[int], disk: tuple[int, int] | None = None) -> dict:
    rdev = os.stat(device).st_rdev
    calls = run_probed([sys.executable, "-c", WRITER, device, str(unit), *map(str, offsets)],
                       disk=disk or (os.major(rdev), os.minor(rdev)))
    return dict(calls["device_requests"])


def test_in_order_writes_are_sequential_and_scattered_ones_random(loop_device: str) -> None:
    # 64 KiB each, one after the other: every request but the first starts where the previous ended.
    seq = _requests(loop_device, KIB64, list(range(WRITES)))
    assert seq["seq_bytes"] + seq["random_bytes"] == WRITES * 65536
    assert seq["random_ios"] <= 2 and seq["seq_bytes"] >= (WRITES - 2) * 65536
    # 64 KiB at 1 MiB strides, shuffled: no request continues the one before.
    order = [(i * 37) % WRITES for i in range(WRITES)]
    scattered = _requests(loop_device, MIB, order)
    assert scattered["random_ios"] == WRITES and scattered["seq_bytes"] == 0
    # What a stage's profile says of it: the share of bytes in random requests, device-wide.
    profile = finish_stage(StageProfile("download", "ok", 0.0, 1.0), [("ebpf", {"device_requests": scattered})])
    assert profile.device_random_pct == pytest.approx(100.0)


def test_another_disks_requests_are_not_counted(loop_device: str) -> None:
    # The loop device's own major with the largest minor: a disk no one writes to while the test runs.
    major, last_minor = os.major(os.stat(loop_device).st_rdev), (1 << ebpf.KERNEL_MINOR_BITS) - 1
    counted = _requests(loop_device, KIB64, list(range(8)), disk=(major, last_minor))
    assert counted == {"disk": f"{major}:{last_minor}", "seq_bytes": 0, "random_bytes": 0, "random_ios": 0}
