"""Qualification's measurement: what a scratch device does for sequential direct writes and reads at one I/O size
and for small random reads, bounded by time and bytes, with python3's standard library alone.

The same code runs in two places: `iobatch qualify` on any machine, and a Batch host's user data after scratch is
mounted (tuning/hostqualify.py; the ECS-optimized AL2023 AMI has python3 3.9 and no fio, so nothing newer than 3.9's
syntax and nothing outside the standard library: tests/unit/test_qualify.py parses it as 3.9).

- On a directory: a file there (PROBE_FILE) is written with O_DIRECT at `io_size` (the page cache would measure
  memory), fsynced, read back with O_DIRECT, then read at SMALL_IO random offsets when `small` is set (instance
  stores); the file is removed on every way out. No root needed.
- On a block device: reads only (sequential, then random with `small`): writing would destroy what it holds.

Bounds: `seconds` in all, split between the phases (PHASE_SHARES), and `max_bytes` moved in all (writes at most half,
reads at most what was written). On st1 a new volume's bucket holds 1 TiB of credits per TiB of size and sequential
I/O is charged by its bytes, so 2 GiB is 0.4 % of a 500 GiB volume's bucket (tuning/qualify.py says what it costs).

The record (`measure`) holds per phase its bytes, seconds, MiB/s, I/O count and latency percentiles (ms); `judge` adds
the expected figure, the ratio and the verdict. Its keys are read by profiling/qualification.py.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import random
import stat
import time
from collections.abc import Iterable
from typing import Any

PROBE_FILE = ".iobatch-qualify"
MIB = 1 << 20
SMALL_IO = 4096
SECONDS = 10.0
MAX_BYTES = 2 << 30
# The time budget's shares: (sequential write, sequential read, small random read), by what is measured.
PHASE_SHARES = {"file": (0.55, 0.45, 0.0), "file+small": (0.45, 0.35, 0.2), "device": (0.0, 1.0, 0.0),
                "device+small": (0.0, 0.7, 0.3)}
PERCENTILES = (50, 90, 99)
# The properties a child's profiles and EMF documents carry of its host's qualification (`properties`).
VERDICT_KEY, MIBPS_KEY, EXPECTED_KEY, RATIO_KEY = ("HostQualification", "QualifiedMiBps", "QualifiedExpectedMiBps",
                                                   "QualifiedRatio")
# The verdicts: at or above the minimum ratio; below it (the host works, its profiles say so); below it and shut
# down (fence); below it with the pipeline's fences of the hour used up (it works, as a slow one); no expectation.
QUALIFIED, SLOW, FENCED, SLOW_CAPPED, UNJUDGED = "qualified", "slow", "fenced", "slow-fence-cap", "unjudged"


class QualifyError(Exception):
    """A target that cannot be measured; the message names it and the fix."""


def _latencies(seconds: list[float]) -> dict[str, Any]:
    ordered = sorted(seconds)
    out = {}
    for p in PERCENTILES:
        out[f"p{p}_ms"] = round(ordered[min(len(ordered) - 1, len(ordered) * p // 100)] * 1000, 3)
    out["max_ms"] = round(ordered[-1] * 1000, 3)
    return out


def _phase(fd: int, write: bool, buf: mmap.mmap, offsets: Iterable[int], deadline: float, cap: int,
           sync: bool) -> dict[str, Any]:
    """One phase: I/Os of len(buf) at `offsets` in order until the deadline or `cap` bytes; with `sync`, an fsync
    at its end counts in its time (the data is on the device, not in a cache of the device's driver)."""
    took = []
    moved = 0
    size = len(buf)
    start = time.perf_counter()
    for offset in offsets:
        if time.perf_counter() >= deadline or moved + size > cap:
            break
        begin = time.perf_counter()
        try:
            done = os.pwrite(fd, buf, offset) if write else os.preadv(fd, [buf], offset)
        except OSError as exc:
            if exc.errno == errno.ENOSPC and write:
                break
            raise
        took.append(time.perf_counter() - begin)
        moved += done
        if done < size:
            break
    if sync:
        os.fsync(fd)
    seconds = time.perf_counter() - start
    out = {"bytes": moved, "seconds": round(seconds, 3), "ios": len(took),
           "mibps": round(moved / MIB / seconds, 2) if seconds > 0 and moved else 0.0}
    if took:
        out.update(_latencies(took))
    return out


def _open(path: str, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise QualifyError(f"{path}: its file system refuses O_DIRECT (tmpfs or overlay?): give a directory on "
                               "the volume to measure") from None
        raise


def measure(target: str, io_size: int = MIB, seconds: float = SECONDS, max_bytes: int = MAX_BYTES,
            small: bool = False) -> dict[str, Any]:
    """The record of one qualification of `target`, a directory (a file in it, written then read) or a block device
    (read only). QualifyError names a target that cannot be measured."""
    if io_size <= 0 or io_size % SMALL_IO:
        raise QualifyError(f"I/O size {io_size} is not a positive multiple of {SMALL_IO} bytes")
    mode = os.stat(target).st_mode
    device = stat.S_ISBLK(mode)
    if not device and not stat.S_ISDIR(mode):
        raise QualifyError(f"{target} is neither a directory nor a block device: give the volume's mount point "
                           "or its device")
    shares = PHASE_SHARES[("device" if device else "file") + ("+small" if small else "")]
    # Bytes kept for the random reads, which a fast device's sequential phases would otherwise use up.
    reserve = max_bytes // 16 if small else 0
    sequential = max_bytes - reserve
    buf = mmap.mmap(-1, io_size)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(io_size))
    small_buf = mmap.mmap(-1, SMALL_IO)
    record: dict[str, Any] = {"target": target, "mode": "device" if device else "file", "io_bytes": io_size,
              "write": None, "read": None, "random_read": None}
    start = time.perf_counter()
    path = target if device else os.path.join(target, PROBE_FILE)
    try:
        if device:
            fd = _open(path, os.O_RDONLY)
            try:
                extent = os.lseek(fd, 0, os.SEEK_END) // io_size * io_size
            finally:
                os.close(fd)
        else:
            fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                deadline = start + seconds * shares[0]
                offsets = range(0, sequential // 2, io_size)
                record["write"] = _phase(fd, True, buf, offsets, deadline, sequential // 2, True)
            finally:
                os.close(fd)
            extent = record["write"]["bytes"]
        if extent < io_size:
            done = "read" if device else "written"
            raise QualifyError(f"{path}: less than one I/O of {io_size} bytes could be {done}: free some space on "
                               "the volume")
        fd = _open(path, os.O_RDONLY)
        try:
            deadline = time.perf_counter() + seconds * shares[1]
            cap = min(extent, sequential - (0 if device else extent))
            record["read"] = _phase(fd, False, buf, range(0, extent, io_size), deadline, cap, False)
            if small:
                deadline = time.perf_counter() + seconds * shares[2]
                slots = extent // SMALL_IO
                picks = (random.randrange(slots) * SMALL_IO for _ in range(max_bytes // SMALL_IO))
                left = max_bytes - record["read"]["bytes"] - (0 if device else extent)
                record["random_read"] = _phase(fd, False, small_buf, picks, deadline, left, False)
        finally:
            os.close(fd)
    finally:
        if not device:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        buf.close()
        small_buf.close()
    phases = [record[k] for k in ("write", "read", "random_read") if record[k]]
    record["seconds"] = round(time.perf_counter() - start, 3)
    record["bytes"] = sum(p["bytes"] for p in phases)
    return record


def judge(record: dict[str, Any], write_mibps: float, read_mibps: float, min_ratio: float) -> dict[str, Any]:
    """`record` with the expected MiB/s, the ratio (the lower of write and read to its expectation) and the verdict
    (QUALIFIED or SLOW; UNJUDGED without an expectation; the fence's decision is the caller's)."""
    ratios = [record[k]["mibps"] / want for k, want in (("write", write_mibps), ("read", read_mibps))
              if record.get(k) and want > 0]
    ratio = min(ratios) if ratios else None
    record["expected_write_mibps"] = round(write_mibps, 2)
    record["expected_read_mibps"] = round(read_mibps, 2)
    record["ratio"] = None if ratio is None else round(ratio, 3)
    record["verdict"] = UNJUDGED if ratio is None else QUALIFIED if ratio >= min_ratio else SLOW
    record["min_ratio"] = min_ratio
    return record


def summary(record: dict[str, Any]) -> str:
    """One line: the figures, the expectation and the verdict."""
    parts = []
    for key in ("write", "read"):
        phase = record.get(key)
        if phase:
            parts.append(f"{key} {phase['mibps']:.1f} MiB/s (p50 {phase.get('p50_ms', '-')} ms, p99 "
                         f"{phase.get('p99_ms', '-')} ms)")
    small = record.get("random_read")
    if small and small["seconds"]:
        iops = small["ios"] / small["seconds"]
        parts.append(f"4 KiB random read {iops:.0f} IOPS (p50 {small.get('p50_ms', '-')} ms)")
    ratio = record.get("ratio")
    if ratio is not None:
        parts.append(f"{ratio:.2f}x of the expected (write {record['expected_write_mibps']:.1f}, read "
                     f"{record['expected_read_mibps']:.1f} MiB/s): {record['verdict']}")
    return "; ".join(parts)


def properties(record: dict[str, Any]) -> dict[str, str]:
    """The properties a child's profiles and EMF documents carry of its host's qualification (strings, as every
    property): the verdict, the lower of the write and read figures (MiB/s) and its expectation, and the ratio."""
    phases = [(record[k]["mibps"], record.get(f"expected_{k}_mibps") or 0.0) for k in ("write", "read")
              if record.get(k)]
    if not phases:
        return {}
    mibps, want = min(phases, key=lambda p: p[0] / p[1] if p[1] > 0 else p[0])
    out = {VERDICT_KEY: str(record.get("verdict") or UNJUDGED), MIBPS_KEY: f"{mibps:.1f}"}
    if want > 0:
        out[EXPECTED_KEY] = f"{want:.1f}"
    if record.get("ratio") is not None:
        out[RATIO_KEY] = f"{record['ratio']:.3f}"
    return out
