"""The sidecar as the executor starts it: a real process, a real job speaking the protocol, /proc counters."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from profiling import protocol
from profiling.metrics import METRICS_BY_NAME
from tests.support.sidecar import REPO, read_profiles, sidecar_env, start_sidecar

# The job: three stages with known I/O. Each write is one write(2) of 4 KiB on an unbuffered file;
# the reads are of that 4,096,000-byte file in 64 KiB calls (63), plus the read that returns 0 at EOF.
JOB = r"""
import os, subprocess, sys
from pathlib import Path
from profiling.protocol import StageReporter
work = Path(sys.argv[1])
reporter = StageReporter(Path(sys.argv[2]))
assert reporter.active
with reporter.stage("download") as st:
    with open(work / "a.bin", "wb", buffering=0) as f:
        for _ in range(1000):
            f.write(b"x" * 4096)
    st.items = 3
with reporter.stage("process"):
    with open(work / "a.bin", "rb", buffering=0) as f:
        while f.read(65536):
            pass
with reporter.stage("upload"):
    # a child that exits and is reaped during the stage: its counts must not be lost
    subprocess.run([sys.executable, "-S", "-c",
                    "import os\nfd = os.open(%r, os.O_WRONLY | os.O_CREAT)\n"
                    "for _ in range(500): os.write(fd, b'y' * 8192)\n" % str(work / "b.bin")], check=True)
reporter.close()
"""


def test_three_stages_exact_counts_emf_and_exit(tmp_path: Path) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path), str(sock)], cwd=REPO, env=sidecar_env(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stderr
    assert "warning" not in job.stderr
    _, err = sidecar.communicate(timeout=15)
    assert sidecar.returncode == 0, err
    assert not sock.exists()

    profiles = {p["stage"]: p for p in read_profiles(tmp_path)}
    assert list(profiles) == ["download", "process", "upload"]
    down, proc, up = profiles["download"], profiles["process"], profiles["upload"]
    # /proc/<pid>/io is exact, and so are the stage deltas
    assert (down["write_calls"], down["write_bytes"], down["read_calls"]) == (1000, 4096 * 1000, 0)
    assert down["items"] == 3 and down["outcome"] == "ok" and down["schema"] == 1
    assert (proc["read_calls"], proc["read_bytes"], proc["write_calls"]) == (63 + 1, 4096 * 1000, 0)
    # the reaped child's 500 x 8 KiB writes arrive through the parent's counters
    assert up["write_calls"] >= 500 and up["write_bytes"] >= 500 * 8192
    assert up["write_bytes"] - 500 * 8192 < 64 * 1024, "a Python child writes nothing at start-up but this"
    assert down["device"] and down["properties"] == {
        "Pipeline": "sidecar-test", "JobId": "job-42", "ArrayIndex": "3", "InstanceId": socket.gethostname(),
        "InstanceType": "local", "VolumeType": "gp3"}
    assert down["peak_dirty_bytes"] is not None and down["io_stall_some_ms"] is not None

    docs = [json.loads(line) for line in (tmp_path / "out.emf").read_text().splitlines()]
    assert [d["Stage"] for d in docs] == ["download", "process", "upload"]
    for doc in docs:
        directive = doc["_aws"]["CloudWatchMetrics"][0]
        assert directive["Dimensions"] == [["Pipeline", "Stage"]] and directive["Namespace"] == "IoBatch"
        for metric in directive["Metrics"]:
            assert metric["Unit"] == METRICS_BY_NAME[metric["Name"]].unit
        assert doc["JobId"] == "job-42" and doc["Pipeline"] == "sidecar-test"
    assert docs[0]["WriteCalls"] == 1000


def _talk(sock: Path, *lines: bytes) -> list[dict[str, Any]]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    conn.settimeout(10)
    replies = []
    with conn:
        for line in lines:
            conn.sendall(line)
            buf = b""
            while not buf.endswith(b"\n"):
                chunk = conn.recv(4096)
                assert chunk, "the sidecar hung up"
                buf += chunk
            replies.append(protocol.decode(buf))
    return replies


def test_malformed_messages_get_an_error_reply_and_the_sidecar_goes_on(tmp_path: Path) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    replies = _talk(sock, b"not json\n", b'{"type":"bogus"}\n',
                    protocol.encode({"type": "stage_start", "stage": "download", "pid": 2**22 + 12345}),
                    protocol.encode({"type": "stage_end", "stage": "upload", "outcome": "ok"}),
                    protocol.encode({"type": "stage_start", "stage": "download", "pid": os.getpid()}),
                    protocol.encode({"type": "stage_end", "stage": "download", "outcome": "ok", "items": 2}))
    assert [r["type"] for r in replies] == ["error", "error", "error", "error", "ack", "ack"]
    assert "not JSON" in replies[0]["message"] and "does not exist" in replies[2]["message"]
    _, err = sidecar.communicate(timeout=15)  # EOF from the job: the sidecar exits
    assert sidecar.returncode == 0
    # One warning per malformed message; a host whose cgroup lacks controllers adds its one notice about them.
    warnings = [line for line in err.splitlines() if line.startswith("warning: profiler:")
                and "controller files" not in line]
    assert len(warnings) == 4 and "Traceback" not in err
    (only,) = read_profiles(tmp_path)
    assert only["stage"] == "download" and only["outcome"] == "ok" and only["items"] == 2


def test_sigterm_flushes_the_running_stage_as_interrupted(tmp_path: Path) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(str(sock))
    conn.sendall(protocol.encode({"type": "stage_start", "stage": "process", "pid": os.getpid()}))
    conn.settimeout(10)
    assert protocol.decode(conn.recv(4096))["type"] == "ack"
    time.sleep(0.5)
    sidecar.send_signal(signal.SIGTERM)
    _, err = sidecar.communicate(timeout=15)
    conn.close()
    assert sidecar.returncode == 0, err
    (only,) = read_profiles(tmp_path)
    assert only["stage"] == "process" and only["outcome"] == "interrupted"
    assert only["duration_s"] >= 0.4 and len(only["timeline"]) >= 2
    assert json.loads((tmp_path / "out.emf").read_text())["Outcome"] == "interrupted"


def test_bad_flags_are_one_line_errors(tmp_path: Path) -> None:
    for args, needle in ((["--device", str(tmp_path / "nope")], "does not exist"),
                         (["--interval", "0.01"], "10 Hz"),
                         (["--socket", "/" + "x" * 120], "over 107 bytes")):
        cmd = [sys.executable, "-m", "pipeline.cli", "sidecar", "--scratch-dir", str(tmp_path), *args]
        if "--socket" not in args:
            cmd += ["--socket", str(tmp_path / "s.sock")]
        done = subprocess.run(cmd, cwd=REPO, env=sidecar_env(tmp_path), capture_output=True, text=True, timeout=30)
        assert done.returncode == 64, done.stderr
        assert done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
