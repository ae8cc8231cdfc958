"""The embedded S3 server: versitygw (a real S3 gateway, POSIX backend) on a free loopback port.

Objects land as plain files under `data_dir/<bucket>/<key>`, so a demo's outputs can be looked at with
`ls`. The server is stopped on every exit path of the `with` block (exceptions and Ctrl-C included).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from pipeline.errors import EndpointUnreachable, ToolMissing

VERSITYGW_ENV = "IOBATCH_VERSITYGW"
REGION = "us-east-1"


def versitygw_binary() -> str:
    """IOBATCH_VERSITYGW, .tools/bin/versitygw of this checkout, or versitygw on PATH."""
    given = os.environ.get(VERSITYGW_ENV, "")
    if given and not (os.path.isfile(given) and os.access(given, os.X_OK)):
        what = "a directory" if os.path.isdir(given) else "not an executable file"
        raise ToolMissing(f"{VERSITYGW_ENV}={given} is {what}: set it to the versitygw program, or unset it")
    candidates = [given,
                  str(Path(__file__).resolve().parents[2] / ".tools" / "bin" / "versitygw"),
                  shutil.which("versitygw") or ""]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ToolMissing("versitygw is not installed: run `make setup` (it builds it into .tools/bin), "
                      f"or set {VERSITYGW_ENV}, or point at another S3 with --s3-endpoint")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


START_TIMEOUT_S = 60.0


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EndpointUnreachable(f"the embedded S3 server exited with code {proc.returncode} at start")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise EndpointUnreachable(f"the embedded S3 server did not listen on {host}:{port} within {timeout_s:.0f} s")


class EmbeddedS3:
    """`with EmbeddedS3(data_dir) as s3: ...` runs versitygw for the duration of the block."""

    def __init__(self, data_dir: Path, *, port: int | None = None, log_file: Path | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.access_key = "iobatch" + secrets.token_hex(6)
        self.secret_key = secrets.token_hex(20)
        self.log_file = log_file
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Variables that point s5cmd and boto3 at this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key, region_name=REGION,
            config=Config(s3={"addressing_style": "path"}, retries={"mode": "standard", "max_attempts": 3}),
        )

    def start(self) -> EmbeddedS3:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [versitygw_binary(), "--access", self.access_key, "--secret", self.secret_key,
                "--region", REGION, "--port", f"127.0.0.1:{self.port}", "--quiet", "posix", str(self.data_dir)]
        log = self.log_file.open("ab") if self.log_file else subprocess.DEVNULL
        try:
            # Its own process group: a Ctrl-C to the terminal reaches us, and we stop it in order.
            self._proc = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True)
        finally:
            if self.log_file:
                log.close()  # type: ignore[union-attr]
        try:
            # A server that exits is reported at once; one that lives but is slow (under the lab guest's emulation
            # it takes 10-30 s to listen) is given a minute.
            wait_for_port("127.0.0.1", self.port, START_TIMEOUT_S, self._proc)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> EmbeddedS3:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":  # pragma: no cover - a manual aid: `python -m pipeline.local.s3server DIR`
    with EmbeddedS3(Path(sys.argv[1] if len(sys.argv) > 1 else "s3data")) as server:
        print(server.endpoint, server.access_key, server.secret_key, flush=True)
        signal.pause()
