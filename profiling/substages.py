"""The sidecar's side of sub-stages: what a stage's own command announces on connections of its own.

The job holds the sidecar's first connection (profiling/sidecar.py). While one of its stages runs, the
command that stage runs (the user's process command) may connect too and announce sub-stages with the same
messages (profiling/protocol.py): each is sampled beside the stage, on the process tree of the pid it names,
and recorded as a stage of its own named "<stage>/<name>". Kernel counters only: the per-call probes follow
the job's stage (the eBPF probe moves the job's tree into a cgroup of its own for it).

Whatever a command sends, the job's stage is never disturbed: a bad message gets an `error` reply and one
warning, and a sub-stage still open when its stage ends, or whose connection closes, is recorded as
interrupted.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from profiling import protocol
from profiling.metrics import StageProfile
from profiling.probes.procfs import BlockDevice, pid_exists
from profiling.sampler import StageSampler

Warn = Callable[[str], None]
Record = Callable[[StageProfile], None]


@dataclass
class _Connection:
    sock: socket.socket
    buffer: bytes = b""
    open: dict[str, StageSampler] = field(default_factory=dict)  # sub-stage name -> its sampler


class SubStages:
    """Connections of a stage's command and the sub-stages they announce."""

    def __init__(self, *, device: BlockDevice | None, interval_s: float, properties: dict[str, str],
                 record: Record, warn: Warn) -> None:
        self._device = device
        self._interval_s = interval_s
        self._properties = properties
        self._record = record
        self._warn = warn
        self._connections: list[_Connection] = []
        self._names: set[str] = set()  # every sub-stage name recorded for this job, for MAX_SUBSTAGES

    def sockets(self) -> list[socket.socket]:
        return [c.sock for c in self._connections]

    def accept(self, server: socket.socket) -> None:
        conn, _ = server.accept()
        conn.settimeout(1.0)  # a command that does not read its acks cannot hold the sidecar up
        self._connections.append(_Connection(conn))

    def readable(self, sock: socket.socket, stage: str | None) -> None:
        """Read what a command's connection sent; `stage` is the job's running stage (None between stages)."""
        conn = next(c for c in self._connections if c.sock is sock)
        try:
            chunk = sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.buffer += chunk
        if len(conn.buffer) > protocol.MAX_MESSAGE_BYTES and b"\n" not in conn.buffer:
            self._reply(conn, {"type": "error", "message": "message too long"})
            self._drop(conn)
            return
        while b"\n" in conn.buffer and conn in self._connections:
            line, _, conn.buffer = conn.buffer.partition(b"\n")
            self._handle(conn, line, stage)

    def end_all(self) -> None:
        """The job's stage is ending: record every sub-stage still open as interrupted."""
        for conn in self._connections:
            self._flush(conn)

    def close(self) -> None:
        for conn in list(self._connections):
            self._drop(conn)

    # -- one connection

    def _handle(self, conn: _Connection, line: bytes, stage: str | None) -> None:
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            return self._refuse(conn, None, f"malformed sub-stage message: {exc}")
        kind = message["type"]
        if kind == "job_end":  # the command is done with this connection
            return self._drop(conn)
        name = message.get("stage")
        if kind not in ("stage_start", "stage_end"):
            return self._refuse(conn, name, f"a command does not send {kind!r} messages")
        if problem := protocol.substage_problem(name):
            return self._refuse(conn, name, f"{problem}: not profiled")
        full = protocol.substage_name(stage or "", str(name))
        if kind == "stage_start":
            error = self._start(conn, full, message["pid"], stage)
        else:
            error = self._end(conn, full, message)
        if error:
            return self._refuse(conn, name, error)
        self._reply(conn, {"type": "ack", "stage": name})

    def _start(self, conn: _Connection, full: str, pid: int, stage: str | None) -> str | None:
        if stage is None:
            return f"sub-stage {full.lstrip('/')} announced while no stage runs: not profiled"
        if full in conn.open:
            return f"sub-stage {full} is already running: not profiled again"
        if full not in self._names and len(self._names) >= protocol.MAX_SUBSTAGES:
            return (f"sub-stage {full} is over the limit of {protocol.MAX_SUBSTAGES} distinct sub-stages a job "
                    "(each is billed as custom metrics): not profiled")
        if pid <= 0 or not pid_exists(pid):
            return f"pid {pid} of sub-stage {full} does not exist: not profiled"
        sampler = StageSampler(stage=full, pid=pid, device=self._device, interval_s=self._interval_s)
        sampler.start()
        conn.open[full] = sampler
        self._names.add(full)
        return None

    def _end(self, conn: _Connection, full: str, message: dict[str, Any]) -> str | None:
        sampler = conn.open.pop(full, None)
        if sampler is None:
            return f"stage_end for sub-stage {full}, which is not running"
        sampler.close()  # the last sample follows the sub-stage's last byte, before the ack
        outcome = message.get("outcome")
        items = message.get("items")
        self._finish(sampler, outcome if outcome in ("ok", "failed", "interrupted") else "failed",
                     items if isinstance(items, int) and not isinstance(items, bool) else None)
        return None

    def _finish(self, sampler: StageSampler, outcome: str, items: int | None) -> None:
        try:
            self._record(sampler.finish(outcome=outcome, items=items, properties=self._properties))
        except Exception as exc:  # the profiler never fails the job: one warning, and go on
            self._warn(f"sub-stage {sampler.stage} was not recorded ({type(exc).__name__}: {exc})")

    def _flush(self, conn: _Connection) -> None:
        for sampler in conn.open.values():
            self._warn(f"sub-stage {sampler.stage} was still running when its stage ended: recorded as interrupted")
            self._finish(sampler, "interrupted", None)
        conn.open.clear()

    def _refuse(self, conn: _Connection, name: object, error: str) -> None:
        self._warn(error)
        self._reply(conn, {"type": "error", "stage": name, "message": error})

    def _reply(self, conn: _Connection, message: dict[str, Any]) -> None:
        # A command that went away is dropped when its socket reads EOF.
        with contextlib.suppress(OSError):
            conn.sock.sendall(protocol.encode(message))

    def _drop(self, conn: _Connection) -> None:
        self._flush(conn)
        conn.sock.close()
        self._connections.remove(conn)
