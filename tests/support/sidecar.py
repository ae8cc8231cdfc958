"""The sidecar as the executor starts it, for the functional tests: a real `iobatch sidecar` process on a socket in
the test's directory, with the environment a Batch child's profiler has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def sidecar_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env.update({"IOBATCH_PIPELINE": "sidecar-test", "AWS_BATCH_JOB_ID": "job-42", "AWS_BATCH_JOB_ARRAY_INDEX": "3",
                "IOBATCH_VOLUME_TYPE": "gp3", "IOBATCH_SCRATCH": str(tmp_path / "scratch")})
    for key in ("ECS_CONTAINER_METADATA_URI_V4", "ECS_CONTAINER_METADATA_URI"):
        env.pop(key, None)
    return env


def start_sidecar(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    sock = tmp_path / "p.sock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "sidecar", "--socket", str(sock), "--emf", str(tmp_path / "out.emf"),
         "--profile-out", str(tmp_path / "out.jsonl"), "--scratch-dir", str(tmp_path), "--interval", "0.2",
         "--no-call-probes", *extra],
        cwd=REPO, env=sidecar_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 10
    while not sock.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sidecar did not create its socket"
        time.sleep(0.02)
    return proc, sock


def read_profiles(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
