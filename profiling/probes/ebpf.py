"""Per-call latency of any program (static Go binaries such as s5cmd included) from syscall tracepoints.

Runs bpftrace on the syscall tracepoints of the read, write, open, close and fsync families, plus
`writeback:balance_dirty_pages` (the time writers were paused for dirty-page throttling).

Which processes: the job's process tree. The probe starts from the root pid and every process that
already descends from it (read from /proc), then follows `sched:sched_process_fork` for new ones.
Pids are those of the host's pid namespace, as bpftrace sees them.

Needs root, bpftrace and tracefs; `available()` says what is missing (and mounts tracefs at
/sys/kernel/tracing when it is not, which is the one change it makes: it is left mounted, as the
kernel does by default on most distributions). kprobes and kfuncs are not used: they are missing on
some kernels where tracepoints work. No path attribution: every call is under path "" and the result
says "path_attribution": false (contract rules on a path prefix need the interposer); keeping paths in
the maps cost more than the probe itself and grew with every file opened.

The interface the rest of the profiler uses is small on purpose: `NAME`, `available()` and `EbpfProbe`
(a CallProbe with `close()`). The program text and its output format are bpftrace.py's; this module
runs the program and cuts its cumulative states into stage windows (`frames_to_calls`).

Lifetime: attaching takes bpftrace 1.5-5 s, so the sidecar's probe (`keep_running=True`) starts one
bpftrace at the job's first stage and keeps it until the sidecar's `close()`; bpftrace prints its
cumulative state every 0.1 s and a stage is the difference of two of those states (see `EbpfProbe`).
bpftrace runs in its own session under `setpriv --pdeathsig KILL`, so it dies with the thread that
started it even when the sidecar is killed outright (its next print to the closed pipe, within a
tick, would end it too: SIGPIPE); an atexit hook closes any probe left open. Detaching takes the
kernel a second or two after that.

In AWS this is a local / privileged feature. The sidecar container needs the privileges bpftrace
needs (CAP_SYS_ADMIN or CAP_BPF + CAP_PERFMON, tracefs, the host's kernel headers or BTF), which a
default Batch job definition does not grant. And the pid filter uses host-namespace pids, as the
kernel's tracepoints see them: the job's pid as the sidecar knows it inside the task's pid namespace
(what the job sends in stage_start) is a different number there, so the filter would watch the wrong
processes (filtering on the task's cgroup would be the fix). The kernel-counter figures (procfs.py:
exact bytes and call counts for any binary) need none of this and work everywhere.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from typing import IO, Any

from profiling.probes.bpftrace import (
    READY_MARK,
    TRACEFS,
    Frame,
    FrameParser,
    build_script,
    kernel_syscalls,
    tracepoint_exists,
)
from profiling.probes.callstats import Cells, calls_dict, cells_since
from profiling.probes.procfs import process_tree, read_start_time

NAME = "ebpf"
ENV_OFF = "IOBATCH_NO_EBPF"  # "1": never run the eBPF probe (as if not root)
DEFAULT_INTERVAL_S = 1.0
TICK_S = 0.1  # how often a long-running bpftrace prints its state: what a stage boundary waits at most
READY_TIMEOUT_S = 30.0
STATE_TIMEOUT_S = 5.0  # a running bpftrace that prints nothing for this long is broken
CLOSE_TIMEOUT_S = 10.0


def available() -> str | None:
    """None when the probe can run here, else a one-line reason it cannot."""
    if os.environ.get(ENV_OFF) == "1":
        return f"eBPF probe turned off ({ENV_OFF}=1)"
    if os.geteuid() != 0:
        return "eBPF probe needs root"
    if shutil.which("bpftrace") is None:
        return "eBPF probe needs bpftrace (apt-get install bpftrace)"
    if not (TRACEFS / "events").is_dir():
        try:
            subprocess.run(["mount", "-t", "tracefs", "tracefs", str(TRACEFS)], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"eBPF probe needs tracefs at {TRACEFS} and mounting it failed: {exc}"
    if not tracepoint_exists("write"):
        return "eBPF probe needs syscall tracepoints (CONFIG_FTRACE_SYSCALLS)"
    return None


def frames_to_calls(frames: list[Frame], start: float, stop: float,
                    base: Frame | None = None) -> tuple[Cells, list[tuple[float, Cells]], float]:
    """Total cells, per-interval cells and throttle ms of the window from `base` (the cumulative state
    at the window's start; None: the probe's start, all zero) to the last of `frames`."""
    base_cells: Cells = base[1] if base is not None else {}
    base_dt = base[2] if base is not None else 0.0
    total = cells_since(frames[-1][1], base_cells) if frames else {}
    deltas: list[tuple[float, Cells]] = []
    previous = base_cells
    for t, cells, _dt in frames:
        deltas.append((max(0.0, t - start), cells_since(cells, previous)))
        previous = cells
    # A frame's time stamp is its end; report its start like the interposer does.
    shifted = [(max(0.0, deltas[i - 1][0]) if i else 0.0, c) for i, (_t, c) in enumerate(deltas)]
    return total, shifted, max(0.0, frames[-1][2] - base_dt) if frames else 0.0


_LIVE: weakref.WeakSet[EbpfProbe] = weakref.WeakSet()


@atexit.register
def _close_live_probes() -> None:
    """bpftrace runs in its own session: end it with this process even if nobody called close()."""
    for probe in list(_LIVE):
        probe.close()


class _Stage:
    """One start()..stop() window over a running bpftrace."""

    def __init__(self, start: float, base: Frame | None) -> None:
        self.start = start
        self.base = base  # cumulative state at the start (None: bpftrace started with the stage)
        self.kept: list[Frame] = []  # states about every interval_s inside the window


class EbpfProbe:
    """CallProbe: bpftrace over the job's process tree, from start(pid) to stop().

    One-shot (default): start() launches bpftrace and waits for it to attach (1.5-5 s on a busy
    machine), stop() ends it and reads its final state.

    keep_running=True (the sidecar's): bpftrace stays up from the first start(pid) until close(),
    printing its cumulative state every `tick_s` (0.1 s). A later start() with the same pid only marks
    the stage start; a different pid (or a dead bpftrace) starts a new one. A stage's figures are the
    difference between the first state printed at/after start() and the first printed at/after stop():
    the job waits for the sidecar's ack at both boundaries, so that difference is exact, and a
    boundary costs the job at most about one tick instead of an attach or detach.
    """

    name = NAME

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, count_root: bool = True,
                 keep_running: bool = False, tick_s: float = TICK_S) -> None:
        """count_root=False: the root's own calls are not counted, only those of processes it starts
        after start() (how `iobatch profile` watches the command it is about to run)."""
        self.interval_s = interval_s
        self.count_root = count_root
        self.keep_running = keep_running
        self.tick_s = tick_s if keep_running else interval_s
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._cond = threading.Condition()
        self._ready_at: float | None = None
        self._eof = False
        self._latest: Frame | None = None
        self._stage: _Stage | None = None
        self._root = 0
        self._root_ticks: int | None = None
        self._stderr_text = ""

    # -- lifecycle

    def running(self, pid: int | None = None) -> bool:
        """bpftrace is up (and watching the tree of `pid`, when given)."""
        if self._proc is None or self._proc.poll() is not None:
            return False
        return pid is None or (pid == self._root and read_start_time(pid) == self._root_ticks)

    def start(self, pid: int) -> None:
        if self.keep_running and self.running(pid):
            started = time.monotonic()
            base = self._state_after(started)
            with self._cond:
                self._stage = _Stage(started, base)
            return
        self.close()
        self._launch(pid)
        assert self._ready_at is not None
        with self._cond:
            self._stage = _Stage(self._ready_at, None)

    def _launch(self, pid: int) -> None:
        reason = available()
        if reason is not None:
            raise RuntimeError(reason)
        table = kernel_syscalls()
        if self.count_root:
            script = build_script(set(process_tree(pid)), self.tick_s, table)
        else:
            script = build_script((), self.tick_s, table, follow_only=[pid])
        env = {**os.environ, "BPFTRACE_MAP_KEYS_MAX": "65536"}
        self._root, self._root_ticks = pid, read_start_time(pid)
        self._ready_at, self._eof, self._latest, self._stage = None, False, None, None
        self._stderr_text = ""
        # bpftrace gets its own session (a ^C to the job's group must not end it early), so it would
        # outlive a sidecar killed by SIGKILL: setpriv makes the kernel kill it with this thread.
        argv = ["bpftrace", "-f", "json", "-e", script]
        if shutil.which("setpriv") is not None:
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        self._proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        _LIVE.add(self)
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True,
                                        name="bpftrace-reader")
        self._reader.start()
        # BEGIN runs once every probe is attached: from "ready" on, no call is missed.
        deadline = time.monotonic() + READY_TIMEOUT_S
        with self._cond:
            while self._ready_at is None:
                if self._proc.poll() is not None or self._eof or time.monotonic() > deadline:
                    break
                self._cond.wait(0.05)
        if self._ready_at is None:
            err = self._stderr()
            self.close()
            raise RuntimeError(f"bpftrace did not start: {err or 'timed out'}")

    def _read(self, stream: IO[str]) -> None:
        parser = FrameParser()
        for line in stream:
            if self._ready_at is None and READY_MARK in line:
                with self._cond:
                    self._ready_at = time.monotonic()
                    self._cond.notify_all()
            for frame in parser.feed(line):
                self._on_state(frame)
        for frame in parser.finish():
            self._on_state(frame)
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def _on_state(self, frame: Frame) -> None:
        with self._cond:
            self._latest = frame
            stage = self._stage
            if stage is not None:
                last = stage.kept[-1][0] if stage.kept else stage.start
                if frame[0] - last >= self.interval_s - self.tick_s / 2:
                    stage.kept.append(frame)
            self._cond.notify_all()

    def _state_after(self, t: float) -> Frame:
        """The first cumulative state bpftrace printed at or after monotonic time `t` (waits for it)."""
        deadline = time.monotonic() + max(STATE_TIMEOUT_S, 20 * self.tick_s)
        with self._cond:
            while self._latest is None or self._latest[0] < t:
                if self._eof or time.monotonic() > deadline:
                    raise RuntimeError("bpftrace stopped printing its state"
                                       + (f": {self._stderr()}" if self._eof else " (timed out)"))
                self._cond.wait(0.05)
            return self._latest

    def _stderr(self) -> str:
        proc = self._proc
        if proc is not None and proc.stderr is not None and proc.poll() is not None and not self._stderr_text:
            self._stderr_text = proc.stderr.read()
        useful = [ln for ln in self._stderr_text.splitlines() if ln.strip() and "RLIMIT_MEMLOCK" not in ln]
        return useful[-1] if useful else ""

    def close(self) -> None:
        """End bpftrace (it prints its final state first); idempotent, never raises."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # END prints the final state
            try:
                proc.wait(timeout=CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self._stderr()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        self._proc = None
        _LIVE.discard(self)

    def stop(self) -> dict[str, Any] | None:
        stage = self._stage
        if stage is None or self._proc is None:
            return None
        stop = time.monotonic()
        end: Frame | None
        if self.keep_running and self._proc.poll() is None:
            try:
                end = self._state_after(stop)
            except RuntimeError:
                self._stage = None
                self.close()  # broken: the next start() launches a fresh one
                raise
        else:
            self.close()
            end = self._latest
        if end is None:
            self._stage = None
            return None
        with self._cond:
            self._stage = None
            kept = [f for f in stage.kept if f[0] < end[0]]
        total, per_frame, throttle_ms = frames_to_calls([*kept, end], stage.start, stop, base=stage.base)
        return calls_dict(
            NAME,
            total,
            per_frame,
            filter_text=(f"process tree of pid {self._root} (followed through fork), host pid namespace"
                         + ("" if self.count_root else f"; pid {self._root} itself not counted")),
            duration_s=stop - stage.start,
            interval_s=self.interval_s,
            dirty_throttle_ms=throttle_ms,
            path_attribution=False,
        )
