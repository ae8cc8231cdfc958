"""StageProfiles to test with."""

from __future__ import annotations

import time
from typing import Any

from profiling.metrics import StageProfile
from tuning.ebs import GIB, MIB

# aws-embedded-metrics refuses timestamps more than 14 days old or 2 hours ahead: stages end "now".
STARTED_AT = float(int(time.time()) - 60)
PROPS = {"Pipeline": "demo", "JobId": "job-1:7", "ArrayIndex": "7", "InstanceId": "i-0abc",
         "InstanceType": "m5.large", "VolumeType": "st1", "VolumeId": "vol-0123456789abcdef0",
         # the host's qualification at boot, as profiling.qualifyio.properties gives it
         "HostQualification": "qualified", "QualifiedMiBps": "119.6", "QualifiedExpectedMiBps": "122.1",
         "QualifiedRatio": "0.980"}


def full_profile(**overrides: Any) -> StageProfile:
    """A download stage with every metric set (device, page cache, stalls), with these fields replaced."""
    base: dict[str, Any] = dict(
        stage="download", outcome="ok", started_at=STARTED_AT, duration_s=2.5, read_bytes=10 * 2**20,
        write_bytes=40_960_000, read_calls=12, write_calls=10_000, storage_write_bytes=40_960_000, items=5,
        device="vda", device_write_ops=300, device_write_bytes=41_000_000, device_write_latency_ms=3.5,
        device_queue_depth=1.25, device_utilization_pct=40.0, device_random_pct=12.5, peak_dirty_bytes=30 * 2**20,
        peak_writeback_bytes=2**20, dirty_threshold_bytes=4 * 2**30, io_stall_some_ms=120.0,
        io_stall_full_ms=80.0, properties=dict(PROPS))
    base.update(overrides)
    return StageProfile(**base)


IMAGE = 25 * MIB


def child(i: int, *, download_s: float = 1.5, stall_ms: float = 300.0, images: int = 5,
          **download: object) -> list[StageProfile]:
    """One clean child: a download at 83 MiB/s (near the st1's burst) that waits a little on I/O, a
    CPU-bound process stage with a small shard, and an upload."""
    size = images * IMAGE
    props = {"ArrayIndex": str(i)}
    fields: dict[str, object] = dict(
        read_bytes=size, write_bytes=size, storage_write_bytes=size, device_write_bytes=size,
        device_write_ops=size // MIB, io_stall_some_ms=stall_ms,
        device_utilization_pct=40.0, device_queue_depth=1.0, peak_dirty_bytes=size,
        dirty_threshold_bytes=4 * GIB, dirty_background_threshold_bytes=2 * GIB, properties=props)
    fields.update(download)
    return [
        StageProfile("download", "ok", 0.0, download_s, **fields),  # type: ignore[arg-type]
        StageProfile("process", "ok", 12.0, 20.0, read_bytes=size, write_bytes=size // 8,
                     storage_write_bytes=size // 8, io_stall_some_ms=100.0, properties=props),
        StageProfile("upload", "ok", 32.0, 3.0, read_bytes=size // 8, write_bytes=size // 8,
                     io_stall_some_ms=100.0, properties=props),
    ]


def batch(children: int = 6, **download: object) -> list[StageProfile]:
    return [p for i in range(children) for p in child(i, **download)]
