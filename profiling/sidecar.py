"""The profiler sidecar: a Unix-socket server speaking profiling/protocol.py, one StageProfile per stage.

In: one job's connection (and its sub-stages', profiling/substages.py) and a SidecarConfig. Out: per stage, one EMF
document and, when asked, one profile JSON line, finished by profiling/finish.py (per-call figures, contract
results) when neither the job nor the next stage's sampler waits for it (FINISH_IDLE_S, FINISH_AFTER_S), and at the
latest at the job's end; `job_exit_code`, the code the job's job_end carries. Invariants:
- At stage_start the per-call probes start on the stage's pid before the StageSampler's baseline, so attaching is
  not stage time; at stage_end both stop before the ack, so the job's work after the stage is not counted.
- Whatever goes wrong here is one warning and never reaches the job, which only ever sees an `ack` or an `error`
  reply; a probe that cannot run is said once and kept in every stage's notices.
- A probe's `close()` (eBPF keeps its program loaded for the whole job) runs when `serve` returns, on every path.
Injected, with the real thing by default: `probes` (profiling.probes.call_probes_for, made when the socket is bound;
none with `--no-call-probes`) and `rules_loader` (profiling.finish.contract_rules, once, for the contract file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import select
import signal
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from profiling import protocol, qualification
from profiling.emf import EmfSink, emit_profile
from profiling.files import append_line
from profiling.finish import RulesLoader, contract_rules, finish_stage, load_rules
from profiling.metrics import StageProfile
from profiling.probes import CallProbe, Warn, call_probes_for, prepare, stop_later
from profiling.probes.cgroupfs import own_cgroup
from profiling.probes.procfs import BlockDevice, pid_exists
from profiling.probes.sharing import DeviceRegister
from profiling.sampler import DEFAULT_INTERVAL_S, Sources, StageSampler
from profiling.substages import SubStages

ProbeResults = list[tuple[str, dict[str, Any] | None]]
ProbeReadings = list[tuple[str, Callable[[], dict[str, Any] | None]]]  # a probe's reading, its figures built later


def _warn(text: str) -> None:
    print(f"warning: profiler: {text}", file=sys.stderr, flush=True)


def remove_stale_socket(path: Path) -> None:
    """Remove a socket a dead profiler left at `path` (connect(2) gives ECONNREFUSED for a socket without a
    listener, unix(7)); refuse anything else there: a file, a directory or a live profiler's socket is another's."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ValueError("it exists and is not a socket: give a new path with --socket (the file was left alone)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        path.unlink(missing_ok=True)
        return
    except OSError:
        return  # not connectable for another reason (permissions): bind(2) reports it
    finally:
        probe.close()
    raise ValueError("a profiler is already serving it: stop that one, or give another path with --socket")


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
    # No job connected this long after the socket was bound: one warning (the job and the sidecar may have
    # derived different task ids, and the job then runs unprofiled). The sidecar goes on waiting.
    grace_s: float = 60.0
    remove_empty_dir: bool = False  # the socket's directory is the attempt's: removed on exit when empty
    host_cgroup_mount: Path | None = None  # the host's cgroup v2 hierarchy, where the job's cgroup is found


def write_profile_line(path: Path, profile: StageProfile) -> None:
    """Append one profile JSON object (schema 1) as a line, whole or not at all (profiling.files.append_line)."""
    append_line(path, json.dumps(profile.to_dict(), separators=(",", ":")))


# When the sidecar builds the profiles of ended stages (tens of ms for a stage with many files): after the job has
# sent nothing for FINISH_IDLE_S between stages (it starts its next stage within a few ms of an ack, and would wait
# for the building: bench/stage_boundaries.py), or once the running stage is FINISH_AFTER_S old, and at the job's
# end. A young stage is sampled every 10 ms at first, every 50 ms at 0.5 s (profiling/sampler.py): a build beside
# it in this process, the sampler thread waiting for the GIL at each read, cost a 0.1 s stage half its samples.
FINISH_IDLE_S = 0.1
FINISH_AFTER_S = 0.5


@dataclass(frozen=True)
class _Finishing:
    """A stage whose closing snapshot and probe readings are taken, its profile not yet built."""

    sampler: StageSampler
    outcome: str
    items: int | None
    readings: ProbeReadings
    properties: Mapping[str, str]


class Sidecar:
    """Serves one job connection; one StageProfile per stage, emitted as EMF and profile JSON."""

    def __init__(self, config: SidecarConfig, *, warn: Warn = _warn, probes: list[CallProbe] | None = None,
                 rules_loader: RulesLoader = contract_rules) -> None:
        self.config = config
        config.properties.update(qualification.host_properties())  # the host's, once: profiling/qualification.py
        self.warn = warn
        self.profiles: list[StageProfile] = []
        self._sampler: StageSampler | None = None
        self._finishing: list[_Finishing] = []  # stages acknowledged as ended, their profiles not yet built
        self._probes: list[CallProbe] | None = probes
        self._running_probes: list[CallProbe] = []
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._register: DeviceRegister | None = None
        self._said: set[str] = set()  # notices already printed: each is said once per job
        self.job_exit_code: int | None = None  # the code the job's job_end says it exits with
        self._probes_missing: list[str] = []  # why a per-call probe is not running
        # What the running stage's own command announces (the user's process command): profiling/substages.py.
        self._substages = SubStages(device=config.device, interval_s=config.interval_s,
                                    properties=config.properties, record=self._record_in_order, warn=warn)
        try:
            self._rules = load_rules(config.contract_path, rules_loader)
        except ValueError as exc:  # the job runs on; its stages are profiled without the rules
            warn(f"{exc}; stages are profiled without it")
            self._rules = None

    # -- lifecycle
    def bind(self) -> None:
        """Create the socket (removing a stale one): the job retries connecting for a few seconds. Then make the
        per-call probes, unless given: a socket that cannot be served is the only message its caller prints."""
        path = self.config.socket_path
        if len(str(path)) > protocol.MAX_SOCKET_PATH:
            raise ValueError(f"socket path {path} is over {protocol.MAX_SOCKET_PATH} bytes: use a shorter path")
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_socket(path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1)
        self._server = server
        if self._probes is None:
            self._probes = self._make_probes()
        prepare(self._probes)
        self._join_register()

    def _join_register(self) -> None:
        """Count this child among the profilers on the scratch volume (the device figures are shared)."""
        if self.config.scratch_dir is None or self.config.device is None:
            return
        register = DeviceRegister(self.config.scratch_dir.parent)
        try:
            register.join()
        except OSError as exc:
            self._notice(f"the children sharing the scratch device are not counted ({exc.strerror or exc})")
            return
        self._register = register

    def _notice(self, text: str) -> None:
        if text and text not in self._said:
            self._said.add(text)
            self.warn(text)

    def _sources(self, pid: int) -> Sources:
        """What the stage of `pid` samples beside its tree: its cgroup v2, its network namespace, the register."""
        device = self.config.device
        cgroup, notice = own_cgroup(pid, device.major if device else None, device.minor if device else None,
                                    self.config.host_cgroup_mount)
        self._notice(notice)
        notices = (*self._probes_missing, *((notice,) if notice else ()))
        return Sources(cgroup=cgroup, register=self._register, net=True, notices=notices)

    def _probe_missing(self, text: str) -> None:
        """A per-call probe that cannot run, said once and kept in the profiles (the report names the reason)."""
        self._probes_missing += [] if text in self._probes_missing else [text]
        self._notice(text)

    def _make_probes(self) -> list[CallProbe]:
        if self.config.scratch_dir is None or not self.config.call_probes:
            return []
        try:
            return list(call_probes_for(self.config.scratch_dir, warn=self._probe_missing))
        except Exception as exc:  # a probe must never stop the sidecar
            self._probe_missing(f"per-call probes unavailable ({exc})")
            return []

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
        warn_at: float | None = time.monotonic() + self.config.grace_s
        try:
            while conn is None and not self._stop.is_set():
                ready, _, _ = select.select([self._server], [], [], poll_s)
                if ready:
                    conn, _ = self._server.accept()
                if conn is None and warn_at is not None and time.monotonic() >= warn_at:
                    warn_at = None
                    self.warn(f"no job connected to {self.config.socket_path} within {self.config.grace_s:g} s: "
                              "the job may have derived another task id (its stages are then not profiled), "
                              "or it had nothing to do")
            if conn is not None:
                self._serve_connection(conn, poll_s)
        finally:
            self._finish_pending()
            if self._sampler is not None:
                self._end_stage("interrupted", None)
            self._substages.close()
            self.close_probes()
            if self._register is not None:
                self._register.leave()
            if conn is not None:
                conn.close()
            self._server.close()
            with contextlib.suppress(OSError):
                self.config.socket_path.unlink()
            if self.config.remove_empty_dir:
                # The job removes its directory when it ends; this one may have bound after that.
                with contextlib.suppress(OSError):
                    self.config.socket_path.parent.rmdir()

    def _serve_connection(self, conn: socket.socket, poll_s: float) -> None:
        buffer = b""
        while not self._stop.is_set():
            assert self._server is not None
            wait_s = FINISH_IDLE_S if self._finishing else poll_s
            ready, _, _ = select.select([conn, self._server, *self._substages.sockets()], [], [], wait_s)
            if not ready and (self._sampler is None or self._sampler.age_s() >= FINISH_AFTER_S):
                self._finish_pending()
            for sock in ready:
                if sock is self._server:
                    self._substages.accept(self._server)
                elif sock is not conn:
                    self._substages.readable(sock, self._sampler.stage if self._sampler else None)
            if conn not in ready:
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
            self.job_exit_code = message.get("exit_code")
            self._finish_pending()
            if self._sampler is not None:
                self._end_stage("interrupted", None)
            return True
        if kind == "stage_start":
            error = self._start_stage(message["stage"], message["pid"], message.get("job") or {})
        elif kind == "stage_end":
            error = self._check_end(message)
            if error is None and self._sampler is not None:
                # The closing snapshot and the probes' stop follow the stage's last byte; then the job may
                # go on, and the profile is built later (FINISH_IDLE_S).
                readings = self._close_stage()
                sampler, self._sampler = self._sampler, None
                self._reply(conn, {"type": "ack", "stage": message["stage"]})
                items = message.get("items")
                outcome = message.get("outcome")
                self._finishing.append(_Finishing(sampler, outcome if outcome in ("ok", "failed", "interrupted")
                                                  else "failed", items if isinstance(items, int) else None,
                                                  readings, dict(self.config.properties)))
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

    def _start_stage(self, stage: str, pid: int, job: dict[str, str]) -> str | None:
        if self._sampler is not None:
            self.warn(f"stage {stage} started while {self._sampler.stage} was running: "
                      f"{self._sampler.stage} flushed as interrupted")
            self._end_stage("interrupted", None)
        # The job's own identity, when it sends one, labels the profiles from here on (protocol.IDENTITY_KEYS).
        self.config.properties.update(job)
        if pid <= 0 or not pid_exists(pid):
            return (f"pid {pid} of stage {stage} does not exist (or exited before the first sample); "
                    "the stage is not profiled")
        # Probes first (loading one takes a moment), so the baseline and the stage's clock
        # start only when everything is ready and the job is about to begin.
        self._running_probes = []
        for probe in self._probes or []:
            try:
                probe.start(pid)
                self._running_probes.append(probe)
            except Exception as exc:  # a probe must never stop the sidecar
                self._probe_missing(f"probe {probe.name} did not start ({exc})")
        sampler = StageSampler(stage=stage, pid=pid, device=self.config.device,
                               interval_s=self.config.interval_s, sources=self._sources(pid))
        sampler.start()
        self._sampler = sampler
        return None

    def close_probes(self) -> None:
        """End what the probes keep running between stages (the eBPF program): `serve` does it on every way out."""
        for probe in self._probes or []:
            close = getattr(probe, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception as exc:  # a probe must never stop the sidecar
                self.warn(f"probe {probe.name} did not close ({exc})")

    def _close_stage(self) -> ProbeReadings:
        """Take the closing snapshot and stop the probes: their (name, reading), best first. A probe with a
        `stop_later` (eBPF) leaves building its figures to _finish, after the job has its answer."""
        self._substages.end_all()
        if self._sampler is not None:
            self._sampler.close()
        readings: ProbeReadings = []
        running, self._running_probes = self._running_probes, []
        for probe in running:
            try:
                readings.append((probe.name, stop_later(probe)))
            except Exception as exc:
                self.warn(f"probe {probe.name} failed ({exc})")
        return readings

    def _end_stage(self, outcome: str, items: int | None) -> None:
        readings = self._close_stage()
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            self._finishing.append(_Finishing(sampler, outcome, items, readings, self.config.properties))
        self._finish_pending()

    def _finish_pending(self) -> None:
        finishing, self._finishing = self._finishing, []
        for stage in finishing:  # in stage order
            self._finish(stage)

    def _finish(self, stage: _Finishing) -> None:
        try:
            profile = stage.sampler.finish(outcome=stage.outcome, items=stage.items, properties=stage.properties)
            results: ProbeResults = []
            for name, build in stage.readings:
                try:
                    results.append((name, build()))
                except Exception as exc:  # a probe must never stop the sidecar
                    self.warn(f"probe {name} failed ({exc})")
            self._record(profile, results)
        except Exception as exc:  # the profiler never fails the job: one warning, and go on
            self.warn(f"stage {stage.sampler.stage} was not recorded ({type(exc).__name__}: {exc})")

    def _record_in_order(self, profile: StageProfile, results: ProbeResults | None = None) -> None:
        """A sub-stage's profile, after those of the stages that ended before it: lines in the order they ended."""
        self._finish_pending()
        self._record(profile, results)

    def _record(self, profile: StageProfile, results: ProbeResults | None = None) -> None:
        """Finish a stage's (or a sub-stage's) profile and emit it as EMF and a profile line."""
        profile = finish_stage(profile, results or [], self._rules, warn=self.warn)
        # A probe that could not take an exact reading at a boundary says which figures are approximate.
        approximate = [str(n) for _name, result in results or [] if result for n in result.get("approximate", [])]
        if approximate:
            profile = dataclasses.replace(profile, notices=[*profile.notices, *approximate])
        self.profiles.append(profile)
        for notice in profile.notices:
            self._notice(notice)
        # The profile first, and whatever EMF makes of it apart: an EMF document the library refuses
        # loses no profile.
        if self.config.profile_out is not None:
            write_profile_line(self.config.profile_out, profile)
        try:
            emit_profile(profile, self.config.emf_sink, namespace=self.config.namespace)
        except Exception as exc:
            self.warn(f"stage {profile.stage}: no EMF document ({type(exc).__name__}: {exc}); its profile is kept")

