"""The bpftrace probe against the truth: exact counts across forks, and s5cmd's writes against strace."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profiling.metrics import by_call
from profiling.probes import bpftrace, ebpf

pytestmark = pytest.mark.root

WRITEBENCH = Path(__file__).resolve().parents[2] / "profiling" / "interpose" / "writebench"
WRITE_SYSCALLS = bpftrace.SYSCALLS["write"]


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
    assert by_call(calls)["write"]["count"] == 150_000
    assert by_call(calls)["write"]["bytes"] == 100_000 * 4096 + 50_000 * 512
    assert set(calls["by_size"]["write"]) == {"4KiB-8KiB", "512B-1KiB"}
    assert calls["by_size"]["write"]["4KiB-8KiB"]["count"] == 100_000
    assert calls["by_size"]["write"]["512B-1KiB"]["count"] == 50_000
    assert sum(c["count"] for f in calls["frames"] for c in f["cells"] if c["call"] == "write") == 150_000
    assert by_call(calls)["write"]["mean_us"] > 0
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
    ours = by_call(calls)["write"]["count"]
    assert theirs > 24
    assert abs(ours - theirs) <= 0.01 * theirs, f"eBPF {ours} write calls, strace {theirs}"
    # Every byte of the objects was written (the rest are requests and wake-ups: socket, eventfd).
    assert by_call(calls)["write"]["bytes"] >= 24 * (1 << 20)


def test_unavailable_reason_is_one_line() -> None:
    reason = ebpf.available()
    assert reason is None or ("\n" not in reason and reason.startswith("eBPF probe "))


# ---- one bpftrace per job, beside the real sidecar -----------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]

# Two stages of exact write(2)s on /dev/null, writes between them that belong to no stage, then a stage
# that waits for a line on stdin (so the sidecar can be signalled while a stage runs).
JOB = r"""
import os, sys
from pathlib import Path
from profiling.protocol import StageReporter
reporter = StageReporter(Path(sys.argv[1]))
assert reporter.active
fd = os.open("/dev/null", os.O_WRONLY)
with reporter.stage("download"):
    for _ in range(1000):
        os.write(fd, b"x" * 4096)
for _ in range(777):
    os.write(fd, b"between")
with reporter.stage("process"):
    for _ in range(500):
        os.write(fd, b"z" * 512)
if sys.argv[2] == "hang":
    with reporter.stage("upload"):
        sys.stdin.readline()
reporter.close()
"""


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """The process has exited (reaped, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def _sidecar_and_job(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for key in ("ECS_CONTAINER_METADATA_URI_V4", "ECS_CONTAINER_METADATA_URI"):
        env.pop(key, None)
    sock = tmp_path / "p.sock"
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(sock), "--emf", str(tmp_path / "out.emf"),
         "--profile-out", str(tmp_path / "out.jsonl"), "--scratch-dir", str(tmp_path)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert sidecar.poll() is None and time.monotonic() < deadline, "the sidecar did not create its socket"
        time.sleep(0.02)
    job = subprocess.Popen([sys.executable, "-c", JOB, str(sock), mode], cwd=REPO, env=env,
                           stdin=subprocess.PIPE, text=True)
    return sidecar, job


def test_one_bpftrace_for_the_job_exact_per_stage_and_gone_after(probe_ok: None, tmp_path: Path) -> None:
    sidecar, job = _sidecar_and_job(tmp_path, "plain")
    bpftraces: set[int] = set()
    while job.poll() is None:  # every bpftrace the sidecar runs is its child (setpriv execs it)
        bpftraces.update(p for p in _children(sidecar.pid) if "bpftrace" in Path(f"/proc/{p}/cmdline").read_text())
        time.sleep(0.05)
    assert job.wait() == 0
    assert sidecar.wait(timeout=30) == 0, sidecar.stderr.read() if sidecar.stderr else ""
    profiles = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [p["stage"] for p in profiles] == ["download", "process"]
    download, process = (p["calls"] for p in profiles)
    assert {p["sources"]["calls"] for p in profiles} == {"ebpf"}
    # Exact per stage across one bpftrace: the 777 writes between the stages belong to neither.
    assert (by_call(download)["write"]["count"], by_call(download)["write"]["bytes"]) == (1000, 1000 * 4096)
    assert (by_call(process)["write"]["count"], by_call(process)["write"]["bytes"]) == (500, 500 * 512)
    assert profiles[0]["write_calls"] == 1000 and profiles[1]["write_calls"] == 500  # procfs agrees
    for calls in (download, process):
        assert sum(c["count"] for f in calls["frames"] for c in f["cells"] if c["call"] == "write") == \
            by_call(calls)["write"]["count"]
    assert len(bpftraces) == 1, f"one bpftrace for the whole job, saw {sorted(bpftraces)}"
    assert all(_gone(pid) for pid in bpftraces)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_bpftrace_outlives_a_signalled_sidecar(probe_ok: None, tmp_path: Path, sig: signal.Signals) -> None:
    sidecar, job = _sidecar_and_job(tmp_path, "hang")
    try:
        deadline = time.monotonic() + 60
        bpftraces: list[int] = []
        while not bpftraces:  # the sidecar attaches bpftrace at the first stage_start
            assert time.monotonic() < deadline and sidecar.poll() is None
            bpftraces = [p for p in _children(sidecar.pid) if "bpftrace" in Path(f"/proc/{p}/cmdline").read_text()]
            time.sleep(0.05)
        # wait until the job sits in its last stage, then signal the sidecar
        while not (tmp_path / "out.jsonl").exists() or len((tmp_path / "out.jsonl").read_text().splitlines()) < 2:
            assert time.monotonic() < deadline and job.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        sidecar.send_signal(sig)
        sidecar.wait(timeout=30)
        assert all(_gone(pid) for pid in bpftraces), f"bpftrace {bpftraces} still running after {sig.name}"
        if sig == signal.SIGTERM:
            stages = [json.loads(line)["stage"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
            assert stages == ["download", "process", "upload"]  # flushed as interrupted
    finally:
        if job.poll() is None:
            assert job.stdin is not None
            job.stdin.write("\n")
            job.stdin.close()
            job.wait(timeout=30)
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()
