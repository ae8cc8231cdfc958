"""`iobatch profile -- CMD` as a container runs it: a stop sends SIGTERM to iobatch alone (the container's
first process), and the command under it must stop too, within seconds, with the code a shell would give."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def test_sigterm_to_profile_is_passed_on_to_the_command(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "profile", "--interval", "0.2", "--", "sleep",
                             "120"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not _children(proc.pid):  # the command has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.05)
        time.sleep(0.5)  # the sampler's first snapshot
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)  # before the fix: iobatch waited the command's two minutes
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 128 + signal.SIGTERM, (code, proc.stderr.read() if proc.stderr else "")
    assert took < 10
    out = proc.stdout.read().decode() if proc.stdout else ""
    assert "interrupted" in out  # the profile is still printed, marked as interrupted
