"""The sampler's pure StageProfile builder (from procfs snapshots) and its interval check."""

from __future__ import annotations

import pytest

from profiling.probes.procfs import BlockDevice, DiskStats, PageCache, Pressure, ProcIo
from profiling.sampler import Snapshot, build_profile, check_interval


def _snap(mono: float, io: ProcIo | None, writes: int = 0, dirty: int = 0, some_us: int = 0) -> Snapshot:
    disk = DiskStats(0, 0, 0, 0, writes, 0, writes * 8, writes * 2, 0, int(mono * 500), int(mono * 1000))
    return Snapshot(mono, io, disk, PageCache(dirty, dirty // 2, 1000, 500), Pressure(some_us, some_us // 2))


def test_build_profile_totals_peaks_and_timeline() -> None:
    dev = BlockDevice("vda", 254, 0)
    snaps = [
        _snap(0.0, ProcIo(100, 100, 1, 1, 0, 0, 0)),
        _snap(1.0, ProcIo(200, 4196, 2, 2, 0, 4096, 0), writes=10, dirty=8192, some_us=1000),
        # the tree sum dips (a child was being reaped): the timeline holds the maximum
        _snap(2.0, ProcIo(150, 4196, 2, 2, 0, 4096, 0), writes=10, dirty=4096, some_us=1500),
        _snap(3.0, ProcIo(300, 8292, 5, 3, 0, 8192, 0), writes=30, dirty=0, some_us=4000),
    ]
    p = build_profile(stage="download", outcome="ok", started_at=1.7e9, snapshots=snaps, device=dev, items=4,
                      properties={"Pipeline": "x"})
    assert (p.read_bytes, p.write_bytes, p.read_calls, p.write_calls) == (200, 8192, 4, 2)
    assert p.storage_write_bytes == 8192 and p.duration_s == 3.0 and p.items == 4
    assert p.device == "vda" and p.device_write_ops == 30 and p.device_write_bytes == 30 * 8 * 512
    assert p.device_write_latency_ms == pytest.approx(2.0)
    assert p.device_queue_depth == pytest.approx(1.0) and p.device_utilization_pct == pytest.approx(50.0)
    assert p.peak_dirty_bytes == 8192 and p.peak_writeback_bytes == 4096 and p.dirty_threshold_bytes == 1000
    assert p.io_stall_some_ms == pytest.approx(4.0) and p.io_stall_full_ms == pytest.approx(2.0)
    assert [pt.t for pt in p.timeline] == [1.0, 2.0, 3.0]
    assert [pt.read_bps for pt in p.timeline] == [100.0, 0.0, 100.0]
    assert p.timeline[1].write_bps == 0.0 and p.timeline[2].device_write_bps == 20 * 8 * 512
    assert p.sources == {"io": "procfs", "device": "procfs"} and p.properties == {"Pipeline": "x"}


def test_build_profile_with_a_zero_baseline_and_no_device() -> None:
    snaps = [Snapshot(0.0, ProcIo(5, 5, 5, 5, 0, 0, 0), None, None, None),
             Snapshot(0.5, ProcIo(50, 60, 7, 8, 0, 0, 0), None, None, None)]
    p = build_profile(stage="command", outcome="ok", started_at=0.0, snapshots=snaps, device=None,
                      base_io=ProcIo())
    assert (p.read_bytes, p.write_bytes, p.read_calls, p.write_calls) == (50, 60, 7, 8)
    assert p.device is None and p.device_write_latency_ms is None and p.peak_dirty_bytes is None
    assert p.io_stall_some_ms is None and p.sources == {"io": "procfs"}
    with pytest.raises(ValueError):
        build_profile(stage="x", outcome="ok", started_at=0.0, snapshots=snaps[:1], device=None)


@pytest.mark.parametrize("bad", [0.0, 0.05, 61.0])
def test_check_interval_rejects_out_of_range(bad: float) -> None:
    with pytest.raises(ValueError, match="10 Hz"):
        check_interval(bad)
    assert check_interval(0.1) == 0.1
