"""The profiler sidecar: samples the job's process tree and the scratch device, one StageProfile per stage.

Three layers, kept apart:

- `Snapshot` / `build_profile` / `timeline_point`: pure arithmetic from kernel counters to a StageProfile.
- `StageSampler`: takes a baseline snapshot, samples on a thread at a fixed interval, and a final one.
- `Sidecar`: the Unix-socket server speaking profiling/protocol.py; `profile_command` runs one command as
  one stage (`iobatch profile`).

Whatever goes wrong here is logged as one warning and never reaches the job: the job only ever sees an
`ack` or an `error` reply.

Extension seams (kept tiny on purpose):

- per-call probes: `profiling.probes.call_probes_for(scratch_dir)` returns CallProbe objects; each is
  started with the stage's pid at stage_start (before the baseline, so attaching is not stage time) and
  stopped at stage_end (before the ack, so the job's work after the stage is not counted). The first
  non-empty result is stored in StageProfile.calls and the probe's name in StageProfile.sources["calls"];
  a later probe's result goes under calls[<its name>] (eBPF first, the interposer's per-path figures in
  calls["interpose"]). A probe with a `close()` (eBPF keeps one bpftrace for the whole job) is closed
  when `serve` returns, on every path (job_end, EOF, SIGTERM, error).
  `iobatch sidecar --no-call-probes` runs the kernel counters alone.
- contracts: when a contract file is given and the module `profiling.contract` exists, the sidecar calls
  `profiling.contract.load_contract(path)` once and `profiling.contract.evaluate_stage(contract, profile)`
  at every stage end, storing the returned list of dicts in StageProfile.contract.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from profiling import protocol
from profiling.emf import EmfSink, emit_profile
from profiling.metrics import StageProfile, TimelinePoint
from profiling.probes import CallProbe, call_probes_for
from profiling.probes.callstats import merge_results
from profiling.probes.procfs import (
    BlockDevice,
    DiskStats,
    PageCache,
    Pressure,
    ProcIo,
    device_delta,
    pid_exists,
    read_diskstats,
    read_page_cache,
    read_pressure,
    read_tree_io,
)

DEFAULT_INTERVAL_S = 1.0
MIN_INTERVAL_S = 0.1  # 10 Hz at most: /proc reads cost ~100 us each, and 1 s is plenty for a stage
IMDS_URL = "http://169.254.169.254/latest"
IMDS_TIMEOUT_S = 0.5
Warn = Callable[[str], None]


def _warn(text: str) -> None:
    print(f"warning: profiler: {text}", file=sys.stderr, flush=True)


def check_interval(interval_s: float) -> float:
    """Raise ValueError unless the interval is between 0.1 s (10 Hz) and 60 s."""
    if not MIN_INTERVAL_S <= interval_s <= 60:
        raise ValueError(f"interval {interval_s} s is out of range: give 0.1 (10 Hz) to 60 seconds")
    return interval_s


# ---- pure: snapshots to a profile --------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """Every counter the sidecar reads, at one instant."""

    mono: float  # time.monotonic()
    tree_io: ProcIo | None  # None when the root process is gone
    disk: DiskStats | None
    cache: PageCache | None
    pressure: Pressure | None
    processes: int = 0


def _monotonic_io(snapshots: Sequence[Snapshot], base: ProcIo) -> list[ProcIo]:
    """Cumulative I/O since the baseline at every snapshot, never decreasing.

    The live tree sum can dip between samples (a child reaped by a process outside the tree, a child
    missed in the instant it was being reaped); holding the running maximum keeps the timeline honest
    without ever counting a byte twice (see procfs.read_tree_io).
    """
    out: list[ProcIo] = []
    running = ProcIo()
    for snap in snapshots:
        if snap.tree_io is not None:
            running = running.elementwise_max(snap.tree_io - base)
        out.append(running)
    return out


def timeline_point(t: float, prev: Snapshot, cur: Snapshot, io_prev: ProcIo, io_cur: ProcIo) -> TimelinePoint:
    """Rates and levels over one interval [prev, cur]."""
    dt = max(cur.mono - prev.mono, 1e-9)
    device_bps = queue = None
    if prev.disk is not None and cur.disk is not None:
        figures = device_delta(prev.disk, cur.disk, dt)
        device_bps, queue = figures.write_bytes / dt, figures.queue_depth
    stall = None
    if prev.pressure is not None and cur.pressure is not None:
        stall = (cur.pressure.some_us - prev.pressure.some_us) / 1000.0
    return TimelinePoint(
        t=round(t, 3),
        read_bps=(io_cur.rchar - io_prev.rchar) / dt,
        write_bps=(io_cur.wchar - io_prev.wchar) / dt,
        device_write_bps=device_bps,
        device_queue_depth=queue,
        dirty_bytes=cur.cache.dirty_bytes if cur.cache else 0,
        writeback_bytes=cur.cache.writeback_bytes if cur.cache else 0,
        io_stall_some_ms=stall,
    )


def build_profile(
    *,
    stage: str,
    outcome: str,
    started_at: float,
    snapshots: Sequence[Snapshot],
    device: BlockDevice | None,
    base_io: ProcIo | None = None,
    items: int | None = None,
    properties: Mapping[str, str] | None = None,
) -> StageProfile:
    """A StageProfile from the baseline snapshot, the periodic ones and the final one (in that order).

    `base_io` overrides the baseline's process counters: a process the profiler started itself begins
    at exactly zero, whatever it did before the first read.
    """
    if len(snapshots) < 2:
        raise ValueError("a stage needs at least a baseline and a final snapshot")
    first, last = snapshots[0], snapshots[-1]
    base = base_io if base_io is not None else (first.tree_io or ProcIo())
    cumulative = _monotonic_io(snapshots, base)
    total = cumulative[-1]
    duration = max(last.mono - first.mono, 0.0)

    dev: dict[str, Any] = {}
    if device is not None and first.disk is not None and last.disk is not None:
        fig = device_delta(first.disk, last.disk, duration)
        dev = {
            "device": device.name,
            "device_read_ops": fig.read_ops,
            "device_write_ops": fig.write_ops,
            "device_read_bytes": fig.read_bytes,
            "device_write_bytes": fig.write_bytes,
            "device_read_latency_ms": fig.read_latency_ms,
            "device_write_latency_ms": fig.write_latency_ms,
            "device_queue_depth": fig.queue_depth,
            "device_utilization_pct": fig.utilization_pct,
        }
    caches = [s.cache for s in snapshots if s.cache is not None]
    cache: dict[str, Any] = {}
    if caches:
        cache = {
            "peak_dirty_bytes": max(c.dirty_bytes for c in caches),
            "peak_writeback_bytes": max(c.writeback_bytes for c in caches),
            "dirty_threshold_bytes": caches[-1].dirty_threshold_bytes,
            "dirty_background_threshold_bytes": caches[-1].dirty_background_threshold_bytes,
        }
    psi: dict[str, Any] = {}
    if first.pressure is not None and last.pressure is not None:
        full = None
        if first.pressure.full_us is not None and last.pressure.full_us is not None:
            full = (last.pressure.full_us - first.pressure.full_us) / 1000.0
        psi = {"io_stall_some_ms": (last.pressure.some_us - first.pressure.some_us) / 1000.0,
               "io_stall_full_ms": full}
    timeline = [
        timeline_point(cur.mono - first.mono, prev, cur, io_prev, io_cur)
        for prev, cur, io_prev, io_cur in zip(snapshots, snapshots[1:], cumulative, cumulative[1:], strict=False)
        if cur.mono > prev.mono
    ]
    sources = {"io": "procfs"}
    if dev:
        sources["device"] = "procfs"
    return StageProfile(
        stage=stage,
        outcome=outcome,
        started_at=started_at,
        duration_s=duration,
        read_bytes=total.rchar,
        write_bytes=total.wchar,
        read_calls=total.syscr,
        write_calls=total.syscw,
        storage_read_bytes=total.read_bytes,
        storage_write_bytes=total.write_bytes,
        cancelled_write_bytes=total.cancelled_write_bytes,
        items=items,
        sources=sources,
        properties=dict(properties or {}),
        timeline=timeline,
        **dev,
        **cache,
        **psi,
    )


# ---- sampling ------------------------------------------------------------------------------------------


def take_snapshot(root: int, device: BlockDevice | None) -> Snapshot:
    """Read every counter once. Process counters first: they are the ones that race with the job."""
    tree_io, count = read_tree_io(root)
    return Snapshot(
        mono=time.monotonic(),
        tree_io=tree_io,
        disk=read_diskstats(device.name) if device else None,
        cache=read_page_cache(),
        pressure=read_pressure(),
        processes=count,
    )


class StageSampler:
    """Samples one stage: `start()` takes the baseline, a thread samples every interval, `finish()` the end."""

    def __init__(self, *, stage: str, pid: int, device: BlockDevice | None, interval_s: float,
                 base_io: ProcIo | None = None) -> None:
        self.stage = stage
        self.pid = pid
        self.device = device
        self.interval_s = interval_s
        self.base_io = base_io
        self.started_at = time.time()
        self._snapshots: list[Snapshot] = []
        self._closing: Snapshot | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{stage}", daemon=True)

    def start(self) -> None:
        self.started_at = time.time()
        self._snapshots.append(take_snapshot(self.pid, self.device))
        self._thread.start()

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            snap = take_snapshot(self.pid, self.device)
            with self._lock:
                if not self._stop.is_set():
                    self._snapshots.append(snap)
            next_at += self.interval_s
            if next_at < time.monotonic():  # fell behind (suspended VM): do not burst to catch up
                next_at = time.monotonic() + self.interval_s

    def close(self, final: Snapshot | None = None) -> None:
        """Stop sampling and take the closing snapshot (or use `final`: a command the profiler waited
        for is read while still a zombie, before it is reaped). Cheap: the job may go on after this."""
        if self._closing is not None:
            return
        with self._lock:
            self._stop.set()
        self._thread.join(timeout=5)
        self._closing = final or take_snapshot(self.pid, self.device)

    def finish(self, *, outcome: str, items: int | None = None, final: Snapshot | None = None,
               properties: Mapping[str, str] | None = None) -> StageProfile:
        """Close (if not yet closed) and build the profile."""
        self.close(final)
        assert self._closing is not None
        snapshots = [*self._snapshots, self._closing]
        return build_profile(stage=self.stage, outcome=outcome, started_at=self.started_at,
                             snapshots=snapshots, device=self.device, base_io=self.base_io, items=items,
                             properties=properties)


# ---- per-job identity ----------------------------------------------------------------------------------


def _imds_get(base_url: str, path: str, token: str) -> str:
    request = urllib.request.Request(f"{base_url}/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
        return str(response.read().decode())


def instance_identity(environ: Mapping[str, str], *, base_url: str = IMDS_URL) -> tuple[str, str]:
    """(InstanceId, InstanceType). In an ECS/Batch container, from IMDSv2 with a short timeout (the
    launch template must allow a hop limit of 2 for bridge-mode containers); elsewhere the host name
    and "local"."""
    if not (environ.get("ECS_CONTAINER_METADATA_URI_V4") or environ.get("ECS_CONTAINER_METADATA_URI")):
        return socket.gethostname(), "local"
    try:
        request = urllib.request.Request(f"{base_url}/api/token", method="PUT",
                                         headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
        with urllib.request.urlopen(request, timeout=IMDS_TIMEOUT_S) as response:
            token = response.read().decode()
        return (_imds_get(base_url, "meta-data/instance-id", token),
                _imds_get(base_url, "meta-data/instance-type", token))
    except (OSError, ValueError):
        return "unknown", "unknown"


# ---- the sidecar ---------------------------------------------------------------------------------------


@dataclass
class SidecarConfig:
    """Everything the sidecar needs; the CLI fills it from flags and the job's environment."""

    socket_path: Path
    emf_sink: EmfSink
    profile_out: Path | None = None
    interval_s: float = DEFAULT_INTERVAL_S
    device: BlockDevice | None = None
    scratch_dir: Path | None = None
    namespace: str = "IoBatch"
    properties: dict[str, str] = field(default_factory=dict)  # Pipeline, JobId, ArrayIndex, ...
    contract_path: Path | None = None
    call_probes: bool = True  # False: kernel counters only (no eBPF / interposer per-call probes)


def load_contract_hook(path: Path | None, warn: Warn = _warn) -> tuple[Any, Callable[..., Any] | None]:
    """(contract, evaluate_stage) when a contract was given and profiling.contract provides both.

    Raises ValueError naming the file when the contract does not load."""
    if path is None:
        return None, None
    try:
        module = importlib.import_module("profiling.contract")
    except ImportError:
        warn(f"contract {path} given but this build has no contract support; rules are not evaluated")
        return None, None
    try:
        return module.load_contract(path), module.evaluate_stage
    except (ValueError, OSError) as exc:
        raise ValueError(f"contract {path}: {exc}") from None


def write_profile_line(path: Path, profile: StageProfile) -> None:
    """Append one profile JSON object (schema 1) as a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(profile.to_dict(), separators=(",", ":")) + "\n")


class Sidecar:
    """Serves one job connection; one StageProfile per stage, emitted as EMF and profile JSON."""

    def __init__(self, config: SidecarConfig, *, warn: Warn = _warn,
                 probes: list[CallProbe] | None = None) -> None:
        self.config = config
        self.warn = warn
        self.profiles: list[StageProfile] = []
        self._sampler: StageSampler | None = None
        self._probes: list[CallProbe] = []
        self._running_probes: list[CallProbe] = []
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        try:
            self._contract, self._evaluate = load_contract_hook(config.contract_path, warn)
        except ValueError as exc:  # the job runs on; its stages are profiled without the rules
            warn(f"{exc}; stages are profiled without it")
            self._contract, self._evaluate = None, None
        if probes is not None:
            self._probes = probes
        elif config.scratch_dir is not None and config.call_probes:
            try:
                self._probes = list(call_probes_for(config.scratch_dir))
            except Exception as exc:  # a probe must never stop the sidecar
                warn(f"per-call probes unavailable ({exc})")

    # -- lifecycle

    def bind(self) -> None:
        """Create the socket (removing a stale one): the job retries connecting for a few seconds."""
        path = self.config.socket_path
        if len(str(path)) > protocol.MAX_SOCKET_PATH:
            raise ValueError(f"socket path {path} is over {protocol.MAX_SOCKET_PATH} bytes: use a shorter path")
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        self._server = server

    def stop(self) -> None:
        """Ask `serve` to flush the running stage as interrupted and return (signal-safe)."""
        self._stop.set()

    def install_sigterm(self) -> None:
        def on_term(signum: int, frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, on_term)

    def serve(self, poll_s: float = 0.2) -> None:
        """Accept one job, answer its messages until job_end, EOF or stop(). Never raises for the job's sake."""
        if self._server is None:
            self.bind()
        assert self._server is not None
        conn: socket.socket | None = None
        try:
            while conn is None and not self._stop.is_set():
                ready, _, _ = select.select([self._server], [], [], poll_s)
                if ready:
                    conn, _ = self._server.accept()
            if conn is not None:
                self._serve_connection(conn, poll_s)
        finally:
            if self._sampler is not None:
                self._end_stage("interrupted", None)
            self.close_probes()
            if conn is not None:
                conn.close()
            self._server.close()
            with contextlib.suppress(OSError):
                self.config.socket_path.unlink()

    def _serve_connection(self, conn: socket.socket, poll_s: float) -> None:
        buffer = b""
        while not self._stop.is_set():
            ready, _, _ = select.select([conn], [], [], poll_s)
            if not ready:
                continue
            try:
                chunk = conn.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                if self._sampler is not None:
                    self.warn(f"the job closed the socket during stage {self._sampler.stage}: "
                              "flushed as interrupted")
                return
            buffer += chunk
            if len(buffer) > protocol.MAX_MESSAGE_BYTES and b"\n" not in buffer:
                self._reply(conn, {"type": "error", "message": "message too long"})
                self.warn("a message over the size limit was dropped")
                buffer = b""
            while b"\n" in buffer:
                line, _, buffer = buffer.partition(b"\n")
                if self._handle(conn, line):
                    return

    def _reply(self, conn: socket.socket, message: dict[str, Any]) -> None:
        try:
            conn.sendall(protocol.encode(message))
        except OSError as exc:
            self.warn(f"could not answer the job ({exc.strerror})")

    def _handle(self, conn: socket.socket, line: bytes) -> bool:
        """Answer one message; True when the job is over."""
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError as exc:
            self.warn(f"malformed message: {exc}")
            self._reply(conn, {"type": "error", "message": f"malformed message: {exc}"})
            return False
        kind = message["type"]
        if kind == "job_end":
            if self._sampler is not None:
                self._end_stage("interrupted", None)
            return True
        if kind == "stage_start":
            error = self._start_stage(message["stage"], message["pid"])
        elif kind == "stage_end":
            error = self._check_end(message)
            if error is None and self._sampler is not None:
                # The closing snapshot and the probes' stop follow the stage's last byte; then the job
                # may go on while the profile is built and emitted (before the next message is read).
                calls = self._close_stage()
                self._reply(conn, {"type": "ack", "stage": message["stage"]})
                items = message.get("items")
                outcome = message.get("outcome")
                self._end_stage(outcome if outcome in ("ok", "failed", "interrupted") else "failed",
                                items if isinstance(items, int) else None, calls)
                return False
        else:
            error = f"the job does not send {kind!r} messages"
        if error:
            self.warn(error)
            self._reply(conn, {"type": "error", "stage": message.get("stage"), "message": error})
        else:
            self._reply(conn, {"type": "ack", "stage": message["stage"]})
        return False

    def _check_end(self, message: dict[str, Any]) -> str | None:
        stage = message["stage"]
        if self._sampler is None or self._sampler.stage != stage:
            running = self._sampler.stage if self._sampler else "none"
            return f"stage_end for {stage!r}, but the running stage is {running}"
        return None

    # -- stages

    def _start_stage(self, stage: str, pid: int) -> str | None:
        if self._sampler is not None:
            self.warn(f"stage {stage} started while {self._sampler.stage} was running: "
                      f"{self._sampler.stage} flushed as interrupted")
            self._end_stage("interrupted", None)
        if pid <= 0 or not pid_exists(pid):
            return (f"pid {pid} of stage {stage} does not exist (or exited before the first sample); "
                    "the stage is not profiled")
        # Probes first (bpftrace takes a while to attach), so the baseline and the stage's clock
        # start only when everything is ready and the job is about to begin.
        self._running_probes = []
        for probe in self._probes:
            try:
                probe.start(pid)
                self._running_probes.append(probe)
            except Exception as exc:  # a probe must never stop the sidecar
                self.warn(f"probe {probe.name} did not start ({exc})")
        sampler = StageSampler(stage=stage, pid=pid, device=self.config.device,
                               interval_s=self.config.interval_s)
        sampler.start()
        self._sampler = sampler
        return None

    def close_probes(self) -> None:
        """End what the probes keep running between stages (bpftrace): `serve` does it on every way out."""
        for probe in self._probes:
            close = getattr(probe, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception as exc:  # a probe must never stop the sidecar
                self.warn(f"probe {probe.name} did not close ({exc})")

    def _close_stage(self) -> tuple[dict[str, Any] | None, str | None]:
        """Take the closing snapshot and stop the probes: (per-call figures, probe name)."""
        if self._sampler is not None:
            self._sampler.close()
        results: list[tuple[str, dict[str, Any]]] = []
        running, self._running_probes = self._running_probes, []
        for probe in running:
            try:
                result = probe.stop()
            except Exception as exc:
                self.warn(f"probe {probe.name} failed ({exc})")
                continue
            if result:
                results.append((probe.name, result))
        return merge_results(results)

    def _end_stage(self, outcome: str, items: int | None,
                   calls: tuple[dict[str, Any] | None, str | None] | None = None) -> None:
        if calls is None:
            calls = self._close_stage()
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        try:
            profile = sampler.finish(outcome=outcome, items=items, properties=self.config.properties)
            profile = self._add_calls(profile, *calls)
            if self._evaluate is not None:
                try:
                    profile = dataclasses.replace(profile, contract=list(self._evaluate(self._contract, profile)))
                except Exception as exc:
                    self.warn(f"contract evaluation failed ({exc})")
            self.profiles.append(profile)
            emit_profile(profile, self.config.emf_sink, namespace=self.config.namespace)
            if self.config.profile_out is not None:
                write_profile_line(self.config.profile_out, profile)
        except Exception as exc:  # the profiler never fails the job: one warning, and go on
            self.warn(f"stage {sampler.stage} was not recorded ({type(exc).__name__}: {exc})")

    @staticmethod
    def _add_calls(profile: StageProfile, calls: dict[str, Any] | None, name: str | None) -> StageProfile:
        if calls is None or name is None:
            return profile
        sources = {**profile.sources, "calls": name}
        throttle = calls.get("dirty_throttle_ms")  # eBPF: pauses in balance_dirty_pages
        if throttle is not None:
            profile = dataclasses.replace(profile, dirty_throttle_ms=float(throttle))
        return dataclasses.replace(profile, calls=calls, sources=sources)


# ---- `iobatch profile`: one command as one stage -------------------------------------------------------


class CommandNotFound(ValueError):
    """The command to profile does not exist or is not executable."""


@dataclass
class CommandResult:
    returncode: int
    profile: StageProfile


def _wait_unreaped(pid: int) -> None:
    """Wait for `pid` to exit without reaping it: its /proc/<pid>/io stays readable (as a zombie) and
    still holds everything it and its reaped descendants did. Reaping would fold it into our own."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def profile_command(
    argv: Sequence[str],
    *,
    interval_s: float = DEFAULT_INTERVAL_S,
    device: BlockDevice | None = None,
    stage: str = "command",
    properties: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
) -> CommandResult:
    """Run `argv` as one profiled stage; its figures are exact for any binary (kernel counters)."""
    if not argv:
        raise CommandNotFound("no command given: write it after --, e.g. iobatch profile -- dd ...")
    try:
        child = subprocess.Popen(list(argv), stdout=stdout)
    except FileNotFoundError:
        raise CommandNotFound(f"command {argv[0]!r} not found: check the name and PATH") from None
    except PermissionError:
        raise CommandNotFound(f"command {argv[0]!r} is not executable: check its permissions") from None
    # A new process starts with all io counters at zero: that is the exact baseline, even if the
    # command has already done I/O by the time the first snapshot is read.
    sampler = StageSampler(stage=stage, pid=child.pid, device=device, interval_s=interval_s, base_io=ProcIo())
    sampler.start()
    outcome = "interrupted"
    try:
        _wait_unreaped(child.pid)
        outcome = "ok"
    finally:
        final = take_snapshot(child.pid, device)
        returncode = child.wait()
        if outcome == "ok" and returncode != 0:
            outcome = "failed"
        profile = sampler.finish(outcome=outcome, final=final, properties=properties)
    return CommandResult(returncode, profile)
