"""A run directory of many children, written by the real producers: the sidecar's profile lines
(profiling.sidecar.write_profile_line) or its EMF documents (profiling.emf.serialize)."""

from __future__ import annotations

import time
from pathlib import Path

from profiling import runfiles
from profiling.emf import serialize
from profiling.metrics import MIB, StageProfile, TimelinePoint
from profiling.sidecar import write_profile_line

# EMF timestamps must be recent (aws-embedded-metrics); the stages ended about an hour ago.
T0 = float(int(time.time()) - 3600)


def _points(duration: float, rate: float, count: int) -> list[TimelinePoint]:
    return [TimelinePoint(t=duration * (k + 1) / count, read_bps=rate * (1 + k / 7), write_bps=rate / (k + 3),
                          device_write_bps=None, device_queue_depth=None, dirty_bytes=MIB * k,
                          writeback_bytes=0, io_stall_some_ms=0.1 * k) for k in range(count)]


def child_stages(child: int, *, jobs: int = 2) -> list[StageProfile]:
    """Three stages of one child of an array job (`jobs` array jobs share the children), overlapping its
    neighbours' in time, with timelines whose rates do not add up to round figures and two contract rows on
    its download."""
    job = f"job-{child % jobs}"
    props = {"JobId": f"{job}:{child}", "ArrayIndex": str(child), "InstanceId": f"i-{child // 8:05x}"}
    start = T0 + child * 0.37
    rate = 97.3 * MIB * (1 + (child % 13) / 97)
    download = 100 * MIB / rate
    # rows as profiling.contract evaluates them (its _row)
    contract = [{"label": "write latency", "value": 1.0 + (child % 29) / 7, "unit": "ms", "emf_unit": "Milliseconds",
                 "frame": 0, "start_s": 0.0, "end_s": round(download, 3), "source": "ebpf",
                 "note": f"child {child}"},
                {"label": "small writes", "value": float(child % 5), "unit": "calls", "emf_unit": "Count",
                 "frame": 0, "start_s": 0.0, "end_s": round(download, 3), "source": "interpose"}]
    return [
        StageProfile("download", "ok" if child % 41 else "error", start, download, read_bytes=100 * MIB,
                     write_bytes=100 * MIB, device_write_latency_ms=1.0 + (child % 7) / 3,
                     peak_dirty_bytes=(child % 9) * MIB, properties=props, contract=contract,
                     timeline=_points(download, rate, 5 + child % 4)),
        StageProfile("process", "ok", start + download, 2.0 + (child % 11) / 10, read_bytes=100 * MIB,
                     write_bytes=12 * MIB, io_stall_some_ms=float(child % 17), properties=props,
                     timeline=_points(2.0, 6.1 * MIB, 3)),
        StageProfile("upload", "ok", start + download + 3.1, 0.8 + (child % 3) / 10, read_bytes=12 * MIB,
                     write_bytes=12 * MIB, properties=props, timeline=_points(0.8, 15.7 * MIB, 2)),
    ]


def write_fleet(run_dir: Path, children: int, *, emf: bool = False) -> list[Path]:
    """`children` children's files under run_dir (profiles/part-NNNNN.jsonl, or emf/part-NNNNN.emf with
    `emf`), in child order."""
    files = []
    for child in range(children):
        name = f"part-{child:05d}"
        if emf:
            path = runfiles.emf_path(run_dir, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(line + "\n" for p in child_stages(child) for line in serialize(p)))
        else:
            path = runfiles.profile_path(run_dir, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            for profile in child_stages(child):
                write_profile_line(path, profile)
        files.append(path)
    return files
