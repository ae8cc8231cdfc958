"""LocalStack's free runtime on loopback, for the localstack tier: S3 and CloudWatch Logs as a user would point
iobatch at them (`--s3-endpoint`, `--logs-endpoint`).

LocalStack runs from its own virtualenv (`make setup` installs localstack-core[runtime] 4.13.1 into
.tools/localstack-venv: the newest release that runs on Python 3.11), started as its runtime module, not through the
`localstack` CLI (which now refuses to start without an account). The settings keep it on this machine and in the
test's own folder:

- OVERRIDE_IN_DOCKER=0: else it believes it runs in its container and writes /var/lib/localstack and /tmp/localstack;
- GATEWAY_LISTEN=127.0.0.1:PORT: loopback only, a free port;
- DISABLE_EVENTS=1: else SIGTERM waits on retries of its analytics upload;
- SKIP_SSL_CERT_DOWNLOAD=1: no certificate download at start;
- FILESYSTEM_ROOT, and HOME: every file it writes under the test's folder.

Its CloudWatch Logs ignores `filterPattern` (every event is returned), which the report does not use.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from pipeline.local.s3server import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".tools" / "localstack-venv"
PYTHON = VENV / "bin" / "python"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
SERVICES = "s3,logs"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def missing() -> str | None:
    """Why LocalStack cannot run here (a reason to skip), or None."""
    if not PYTHON.exists():
        return f"LocalStack is not installed in {VENV.relative_to(ROOT)} (make setup installs it)"
    return None


class LocalStack:
    """One LocalStack process: `start()` waits until S3 and Logs are up, `stop()` ends it (SIGTERM, then SIGKILL)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_REGION"],
                            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])

    def start(self) -> LocalStack:
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": f"{VENV / 'bin'}{os.pathsep}/usr/bin:/bin",
            "HOME": str(self.workdir),
            "OVERRIDE_IN_DOCKER": "0",
            "FILESYSTEM_ROOT": str(self.workdir / "fs"),
            "GATEWAY_LISTEN": f"127.0.0.1:{self.port}",
            "DISABLE_EVENTS": "1",
            "SKIP_SSL_CERT_DOWNLOAD": "1",
            "SERVICES": SERVICES,
            "EAGER_SERVICE_LOADING": "1",
        }
        log = (self.workdir / "localstack.log").open("wb")
        self.proc = subprocess.Popen([str(PYTHON), "-m", "localstack.runtime.main"], cwd=self.workdir, env=env,
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"LocalStack exited {self.proc.returncode} at start: see {self.log_tail()}")
            if self._ready():
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"LocalStack did not answer within {START_TIMEOUT_S:.0f} s: {self.log_tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/_localstack/health", timeout=2) as response:
                services = json.loads(response.read().decode()).get("services", {})
        except (OSError, ValueError):
            return False
        return all(services.get(name) in ("available", "running") for name in SERVICES.split(","))

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / "localstack.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
