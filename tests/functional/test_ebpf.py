"""The bpftrace probe against the truth: exact counts across forks, and s5cmd's writes against strace."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profiling.probes import ebpf

pytestmark = [pytest.mark.functional, pytest.mark.root]

WRITEBENCH = Path(__file__).resolve().parents[2] / "profiling" / "interpose" / "writebench"
WRITE_SYSCALLS = ebpf.SYSCALLS["write"]


@pytest.fixture(scope="module")
def probe_ok() -> None:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def writebench() -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build the workload")
    subprocess.run(["make", "-s", "-C", str(WRITEBENCH.parent)], check=True, capture_output=True)
    return WRITEBENCH


def gated(command: str) -> subprocess.Popen[bytes]:
    """A shell that waits for a line on stdin before it runs `command`: probes attach first."""
    return subprocess.Popen(["sh", "-c", f"read go; {command}"], stdin=subprocess.PIPE)


def release(proc: subprocess.Popen[bytes]) -> int:
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    return proc.wait(timeout=120)


def test_counts_every_write_of_the_process_tree(probe_ok: None, writebench: Path) -> None:
    # Two children forked after the probe started: found through sched_process_fork.
    proc = gated(f"{writebench} /dev/null 100000; {writebench} /dev/null 50000 512")
    probe = ebpf.EbpfProbe(interval_s=0.5)
    probe.start(proc.pid)
    try:
        assert release(proc) == 0
    finally:
        calls = probe.stop()
    assert calls is not None and calls["probe"] == "ebpf"
    # The shell writes nothing; the two writebench processes write exactly this, nothing else.
    assert calls["calls"]["write"]["count"] == 150_000
    assert calls["calls"]["write"]["bytes"] == 100_000 * 4096 + 50_000 * 512
    assert set(calls["by_size"]["write"]) == {"4KiB-8KiB", "512B-1KiB"}
    assert calls["by_size"]["write"]["4KiB-8KiB"]["count"] == 100_000
    assert calls["by_size"]["write"]["512B-1KiB"]["count"] == 50_000
    assert sum(c["count"] for f in calls["frames"] for c in f["cells"] if c["call"] == "write") == 150_000
    assert calls["calls"]["write"]["mean_us"] > 0
    assert calls["dirty_throttle_ms"] >= 0


def strace_counts(summary: str) -> dict[str, int]:
    """syscall -> calls from an `strace -c` table."""
    counts = {}
    for line in summary.splitlines():
        match = re.match(r"^\s*[0-9.]+\s+[0-9.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$", line)
        if match and match.group(2) != "total":
            counts[match.group(2)] = int(match.group(1))
    return counts


@pytest.fixture
def s5cmd_source(s3: Any, bucket: str) -> Iterator[str]:
    if shutil.which("s5cmd") is None:
        pytest.skip("s5cmd not installed")
    body = bytes(range(256)) * 4096  # 1 MiB
    for i in range(24):
        s3.put_object(Bucket=bucket, Key=f"in/obj-{i:03d}.bin", Body=body)
    yield f"s3://{bucket}/in/*"


def test_s5cmd_writes_match_strace(probe_ok: None, s5cmd_source: str, s3_server: Any, tmp_path: Path) -> None:
    """The same download watched by both: strace attached to the gated shell, the probe on its tree."""
    if shutil.which("strace") is None:
        pytest.skip("strace not installed")
    dest = tmp_path / "out"
    proc = gated(f"exec s5cmd --endpoint-url {s3_server.endpoint} cp '{s5cmd_source}' {dest}/")
    summary = tmp_path / "strace.txt"
    tracer = subprocess.Popen(["strace", "-f", "-c", "-e", f"trace={','.join(WRITE_SYSCALLS)}", "-o", str(summary),
                               "-p", str(proc.pid)], stderr=subprocess.PIPE, text=True)
    assert tracer.stderr is not None
    assert "attached" in tracer.stderr.readline()
    probe = ebpf.EbpfProbe()
    probe.start(proc.pid)
    try:
        assert release(proc) == 0
    finally:
        calls = probe.stop()
    tracer.wait(timeout=60)
    assert len(list(dest.iterdir())) == 24
    theirs = sum(strace_counts(summary.read_text()).values())
    assert calls is not None
    ours = calls["calls"]["write"]["count"]
    assert theirs > 24
    assert abs(ours - theirs) <= 0.01 * theirs, f"eBPF {ours} write calls, strace {theirs}"
    # Every byte of the objects was written (the rest are requests and wake-ups: socket, eventfd).
    assert calls["calls"]["write"]["bytes"] >= 24 * (1 << 20)


def test_unavailable_reason_is_one_line() -> None:
    reason = ebpf.available()
    assert reason is None or ("\n" not in reason and reason.startswith("eBPF probe "))
