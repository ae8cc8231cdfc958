"""Sub-stages: a stage's own command announces them on a connection of its own, with the Python helper or a
plain socket message, and the sidecar records each as a stage named "<stage>/<name>"."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.sidecar import REPO, read_profiles, sidecar_env, start_sidecar

# The job runs the process stage; inside it, a command (another process, as the process stage runs one)
# announces "write" with the helper and writes exactly 3 x 4096 bytes, then "raw" with plain socket lines.
JOB = r"""
import os, subprocess, sys
from pathlib import Path
from profiling.protocol import StageReporter, SUBSTAGE_SOCKET_ENV
work, sock = Path(sys.argv[1]), sys.argv[2]
reporter = StageReporter(Path(sock))
assert reporter.active
with reporter.stage("process") as stage:
    subprocess.run([sys.executable, "-c", sys.argv[3], str(work)], check=True,
                   env={**os.environ, SUBSTAGE_SOCKET_ENV: sock})
    stage.items = 2
reporter.close()
"""

COMMAND = r"""
import json, os, socket, sys
from pathlib import Path
from profiling.protocol import substage
work = Path(sys.argv[1])
with substage("write") as stage:
    with open(work / "out.bin", "wb", buffering=0) as f:
        for _ in range(3):
            f.write(b"z" * 4096)
    stage.items = 3
raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
raw.connect(os.environ["IOBATCH_STAGE_SOCKET"])
replies = raw.makefile("rb")
def say(line):
    raw.sendall(line.encode() + b"\n")
    return json.loads(replies.readline())
assert say('{"type":"stage_start","stage":"raw","pid":%d}' % os.getpid())["type"] == "ack"
assert say('{"type":"stage_end","stage":"raw","outcome":"ok","items":1}')["type"] == "ack"
assert say('{"type":"stage_start","stage":"Bad Name","pid":%d}' % os.getpid())["type"] == "error"
# left open: the sidecar records it as interrupted when the process stage ends
assert say('{"type":"stage_start","stage":"left-open","pid":%d}' % os.getpid())["type"] == "ack"
"""


def test_substages_by_helper_and_plain_socket(tmp_path: Path) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    job = subprocess.run([sys.executable, "-c", JOB, str(tmp_path), str(sock), COMMAND], cwd=REPO,
                         env=sidecar_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert job.returncode == 0, job.stderr
    _, err = sidecar.communicate(timeout=30)
    assert sidecar.returncode == 0, err
    by_stage = {p["stage"]: p for p in read_profiles(tmp_path)}
    assert list(by_stage) == ["process/write", "process/raw", "process/left-open", "process"]
    write = by_stage["process/write"]
    assert (write["outcome"], write["items"], write["write_bytes"], write["write_calls"]) == ("ok", 3, 3 * 4096, 3)
    assert by_stage["process/raw"]["outcome"] == "ok" and by_stage["process/raw"]["items"] == 1
    assert by_stage["process/left-open"]["outcome"] == "interrupted"
    assert by_stage["process"]["write_bytes"] >= 3 * 4096
    assert "sub-stage name 'Bad Name'" in err and "left-open was still running" in err
    # Each sub-stage is an EMF document of its own, with its name as the Stage dimension.
    stages = [json.loads(line)["Stage"] for line in (tmp_path / "out.emf").read_text().splitlines()]
    assert stages == list(by_stage)


def test_a_substage_outside_any_stage_is_refused(tmp_path: Path) -> None:
    sidecar, sock = start_sidecar(tmp_path)
    job = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    job.connect(str(sock))
    command = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    command.connect(str(sock))
    command.sendall(b'{"type":"stage_start","stage":"early","pid":%d}\n' % os.getpid())
    reply = json.loads(command.makefile("rb").readline())
    assert reply["type"] == "error" and "no stage runs" in reply["message"]
    command.close()
    job.sendall(b'{"type":"job_end","outcome":"ok"}\n')
    job.close()
    sidecar.communicate(timeout=30)
    assert not (tmp_path / "out.jsonl").exists()
