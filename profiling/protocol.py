"""The job <-> sidecar protocol: stage start and end messages over a Unix stream socket on the shared scratch
volume, one JSON object per line each way (MESSAGE_TYPES; `decode` refuses anything else, naming what is wrong).

The job's side is StageReporter: stage_start (the stage, its pid, the job's identity), stage_end (outcome, items),
job_end (the exit code the sidecar then exits with). It waits for each ack, so the sidecar's baseline precedes the
stage's first byte and its last sample follows the stage's last byte. A sidecar that is absent, slow or dead costs
one warning line, never the job. A stage's own command announces sub-stages the same way, through `substage`:

    with substage("features") as stage:     # a no-op when SUBSTAGE_SOCKET_ENV is unset (not profiled)
        stage.items = 40

The messages in full: docs/architecture.md; sub-stages from any language: docs/local.md, "Your own processing".
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MESSAGE_TYPES = ("stage_start", "stage_end", "job_end", "ack", "error")
MAX_MESSAGE_BYTES = 64 * 1024
# Unix socket paths are limited to 107 bytes on Linux.
MAX_SOCKET_PATH = 107
# Where the job and its sidecar meet unless told otherwise: this file in the child's scratch directory.
SOCKET_NAME = "profiler.sock"
# Set by the job for its process command: the sidecar's socket, where the command announces sub-stages.
SUBSTAGE_SOCKET_ENV = "IOBATCH_STAGE_SOCKET"
SUBSTAGE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
MAX_SUBSTAGES = 8  # each is a Stage dimension value: its metrics are billed as custom metrics
# What the job says of itself in each stage_start ("job": {...}): the properties the job container is sure
# to know (Batch documents AWS_BATCH_JOB_ARRAY_INDEX for the job's own container), which the profiler takes
# over its own view, so a profiler container that lacks the variables still labels the child right.
IDENTITY_KEYS = ("JobId", "ArrayIndex")
MAX_IDENTITY_VALUE = 256


def substage_name(parent: str, name: str) -> str:
    """The stage name a sub-stage is recorded under: its stage's name, '/', its own."""
    return f"{parent}/{name}"


def substage_problem(name: object) -> str | None:
    """Why `name` cannot name a sub-stage, or None when it can."""
    if not isinstance(name, str) or not SUBSTAGE_NAME.fullmatch(name):
        return f"sub-stage name {str(name)[:40]!r} is not 1-32 lowercase letters, digits, '_' or '-'"
    return None


class ProtocolError(ValueError):
    """A message that is not one of ours."""


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), sort_keys=True) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line; raise ProtocolError naming what is wrong."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(line)} bytes is over {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"message is not JSON: {line[:80]!r} ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"message is not a JSON object: {line[:80]!r}")
    kind = message.get("type")
    if kind not in MESSAGE_TYPES:
        raise ProtocolError(f"message type {kind!r} is not one of {', '.join(MESSAGE_TYPES)}")
    if kind in ("stage_start", "stage_end") and not isinstance(message.get("stage"), str):
        raise ProtocolError(f"{kind} message names no stage")
    if kind == "stage_start" and not isinstance(message.get("pid"), int):
        raise ProtocolError("stage_start message has no integer pid")
    code = message.get("exit_code")
    if code is not None and not (type(code) is int and 0 <= code <= 255):
        raise ProtocolError(f"exit_code {str(code)[:20]!r} is not a process exit code (0-255)")
    job = message.get("job")
    if job is not None and not (isinstance(job, dict) and set(job) <= set(IDENTITY_KEYS) and all(
            isinstance(v, str) and 0 < len(v) <= MAX_IDENTITY_VALUE for v in job.values())):
        raise ProtocolError(f"the job's identity is not {{{', '.join(IDENTITY_KEYS)}}} as short strings")
    return message


@dataclass
class StageHandle:
    """Yielded by `StageReporter.stage`; set `items` to report how many images the stage handled."""

    name: str
    items: int | None = None


def _warn(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr, flush=True)


class StageReporter:
    """The job's side: announces stages to the sidecar, never fails the job."""

    def __init__(
        self,
        socket_path: Path | None,
        *,
        connect_timeout_s: float = 5.0,
        ack_timeout_s: float = 30.0,
        warn: Callable[[str], None] = _warn,
        identity: Mapping[str, str] | None = None,
    ) -> None:
        self._warn = warn
        self._identity = {k: v[:MAX_IDENTITY_VALUE] for k, v in (identity or {}).items() if k in IDENTITY_KEYS and v}
        self._ack_timeout_s = ack_timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""
        if socket_path is None:
            return
        if len(str(socket_path)) > MAX_SOCKET_PATH:
            self._disable(f"profiler socket path {socket_path} is over {MAX_SOCKET_PATH} bytes; "
                          "stages are not profiled (use a shorter scratch path)")
            return
        deadline = time.monotonic() + connect_timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(socket_path))
                self._sock = sock
                return
            except OSError as exc:
                sock.close()
                if time.monotonic() >= deadline:
                    self._disable(f"no profiler at {socket_path} ({exc.strerror}); the job goes on unprofiled")
                    return
                time.sleep(0.05)

    @property
    def active(self) -> bool:
        return self._sock is not None

    def _disable(self, why: str) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._warn(why)

    def _exchange(self, message: dict[str, Any], *, wait_ack: bool = True) -> None:
        if self._sock is None:
            return
        try:
            self._sock.settimeout(self._ack_timeout_s)
            self._sock.sendall(encode(message))
            if not wait_ack:
                return
            while b"\n" not in self._buffer:
                chunk = self._sock.recv(4096)
                if not chunk:
                    raise ConnectionError("the profiler closed the socket")
                self._buffer += chunk
            line, _, self._buffer = self._buffer.partition(b"\n")
            reply = decode(line)
            if reply["type"] == "error":
                self._warn(f"profiler: {reply.get('message', 'error')}")
        except (OSError, ProtocolError) as exc:
            self._disable(f"profiler stopped answering ({exc}); the job goes on unprofiled")

    @contextmanager
    def stage(self, name: str) -> Iterator[StageHandle]:
        """Run the body as one profiled stage. The outcome is 'ok', or 'failed' if the body raised."""
        handle = StageHandle(name)
        start: dict[str, Any] = {"type": "stage_start", "stage": name, "pid": os.getpid(), "time": time.time()}
        if self._identity:
            start["job"] = self._identity
        self._exchange(start)
        outcome = "failed"
        try:
            yield handle
            outcome = "ok"
        except BaseException as exc:
            # An exception may say it is an interruption (pipeline.errors.Interrupted does).
            interrupted = isinstance(exc, KeyboardInterrupt) or getattr(exc, "stage_outcome", "") == "interrupted"
            outcome = "interrupted" if interrupted else "failed"
            raise
        finally:
            self._exchange({"type": "stage_end", "stage": name, "outcome": outcome, "items": handle.items})

    def close(self, outcome: str = "ok", exit_code: int | None = None) -> None:
        """Tell the sidecar the job is over, so it can exit, with the job's exit code when given: the profiler's
        container then ends as the job's does (pipeline/cli/profiler.py)."""
        message: dict[str, Any] = {"type": "job_end", "outcome": outcome}
        if exit_code is not None:
            message["exit_code"] = exit_code
        self._exchange(message, wait_ack=False)
        if self._sock is not None:
            self._sock.close()
            self._sock = None


@contextmanager
def substage(name: str, *, socket_path: str | None = None) -> Iterator[StageHandle]:
    """Run the body as a sub-stage of the stage that runs this process, recorded as "<stage>/<name>".

    The socket comes from SUBSTAGE_SOCKET_ENV unless given; without one the body just runs. Like the job's
    own stages, a profiler that is absent or stops answering costs one warning line, never the work."""
    if problem := substage_problem(name):
        raise ValueError(problem)
    path = socket_path if socket_path is not None else os.environ.get(SUBSTAGE_SOCKET_ENV, "")
    reporter = StageReporter(Path(path) if path else None, connect_timeout_s=1.0)
    try:
        with reporter.stage(name) as handle:
            yield handle
    finally:
        reporter.close()
