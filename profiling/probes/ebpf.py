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
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats, calls_dict, cells_since

NAME = "ebpf"
ENV_OFF = "IOBATCH_NO_EBPF"  # "1": never run the eBPF probe (as if not root)
TRACEFS = Path("/sys/kernel/tracing")
DEFAULT_INTERVAL_S = 1.0
READY_TIMEOUT_S = 30.0

# syscall tracepoint names per call type; the ones a kernel lacks are left out of the script
SYSCALLS: dict[str, tuple[str, ...]] = {
    "read": ("read", "pread64", "readv", "preadv", "preadv2"),
    "write": ("write", "pwrite64", "writev", "pwritev", "pwritev2"),
    "open": ("open", "openat", "openat2"),  # glibc and Go make creat() an openat
    "close": ("close",),
    "fsync": ("fsync", "fdatasync"),
}


def _bit_length(src: str, dst: str) -> str:
    """bpftrace statements setting `dst` to the bit length of the unsigned value `src` (no loops there)."""
    lines = [f"$v = (uint64){src}; {dst} = 0;"]
    for shift in (32, 16, 8, 4, 2, 1):
        lines.append(f"if ($v >= {1 << shift}) {{ {dst} += {shift}; $v = $v >> {shift}; }}")
    lines.append(f"{dst} += (int64)$v;")
    return "\n    ".join(lines)


def tracepoint_exists(syscall: str, direction: str = "enter") -> bool:
    return (TRACEFS / "events" / "syscalls" / f"sys_{direction}_{syscall}").is_dir()


def build_script(pids: Iterable[int], interval_s: float, syscalls: dict[str, tuple[str, ...]] | None = None,
                 follow_only: Iterable[int] = ()) -> str:
    """The bpftrace program. Maps: @n[call, size, lat_bucket] = count, @b/@t[call, size] = bytes /
    total ns, @mn/@mx = min / max ns; @dt = ms paused in balance_dirty_pages. Keys are small integers
    only: a string key (a path) per call made the probe several times dearer, and grows without bound."""
    table = syscalls if syscalls is not None else SYSCALLS
    # 1: counted; 2: only its new children are (the CLI that runs the command it profiles)
    marks = {pid: 1 for pid in pids} | {pid: 2 for pid in follow_only}
    track = " ".join(f"@track[{pid}] = {mark};" for pid, mark in sorted(marks.items()))
    interval_ms = max(100, int(interval_s * 1000))
    parts = [
        f'BEGIN {{ {track} printf("ready %llu\\n", nsecs); }}',
        "tracepoint:sched:sched_process_fork /@track[pid]/ { @track[args->child_pid] = 1; }",
        "tracepoint:sched:sched_process_exit /@track[pid] && pid == tid/ { delete(@track[pid]); }",
        "tracepoint:writeback:balance_dirty_pages /@track[pid] == 1 && args->pause > 0/ { @dt = sum(args->pause); }",
    ]
    for index, call in enumerate(CALLS):
        names = table.get(call, ())
        if not names:
            continue
        enter = ", ".join(f"tracepoint:syscalls:sys_enter_{n}" for n in names)
        leave = ", ".join(f"tracepoint:syscalls:sys_exit_{n}" for n in names)
        parts.append(f"{enter} /@track[pid] == 1/ {{ @ts[tid] = nsecs; }}")
        if call in ("read", "write"):
            size = (
                "$r = args->ret > 0 ? (uint64)args->ret : (uint64)0;\n    "
                + _bit_length("$r", "$k")
                + f"\n    @b[{index}, $k] = sum($r);"
            )
        else:
            size = "$k = -1;"
        # Exact extremes only for the rarer calls: on reads and writes two more map updates per call
        # cost ~10 % of a 4 KiB write; their extremes come from the histogram's bucket bounds instead.
        extremes = "" if call in ("read", "write") else f"@mn[{index}, $k] = min($lat); @mx[{index}, $k] = max($lat);"
        parts.append(
            f"{leave} /@ts[tid]/ {{\n"
            f"    $lat = nsecs - @ts[tid]; delete(@ts[tid]);\n"
            f"    {size}\n"
            f"    {_bit_length('$lat', '$h')}\n"
            f"    $h = $h > 0 ? $h - 1 : 0;\n"
            f"    @n[{index}, $k, $h] = count(); @t[{index}, $k] = sum($lat);\n"
            f"    {extremes}\n"
            f"}}"
        )
    dump = 'printf("frame %llu\\n", nsecs); print(@n); print(@b); print(@t); print(@mn); print(@mx); print(@dt);'
    parts.append(f"interval:ms:{interval_ms} {{ {dump} }}")
    parts.append(
        f"END {{ {dump.replace('frame', 'final')} "
        "clear(@n); clear(@b); clear(@t); clear(@mn); clear(@mx); clear(@dt); clear(@ts); clear(@track); }"
    )
    return "\n".join(parts) + "\n"


def process_tree(root: int) -> set[int]:
    """root and every process descending from it, from /proc (racy by nature; forks are followed after)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo.extend(children.get(pid, []))
    return tree


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


Frame = tuple[float, Cells, float]  # (monotonic seconds, cumulative cells, cumulative dirty throttle ms)


def parse_output(lines: Iterable[str]) -> list[Frame]:
    """bpftrace -f json lines -> cumulative states, one per "frame"/"final" marker, in order."""
    frames: list[Frame] = []
    t: float | None = None
    maps: dict[str, dict[str, Any]] = {}
    dt = 0.0

    def close() -> None:
        if t is not None:
            frames.append((t, _cells(maps), dt))

    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.get("type")
        if kind == "printf":
            words = str(event.get("data", "")).split()
            if len(words) == 2 and words[0] in ("frame", "final"):
                close()
                t, maps, dt = int(words[1]) / 1e9, {}, 0.0
        elif kind == "map" and t is not None:
            for name, values in dict(event.get("data", {})).items():
                if name == "@dt":
                    dt = float(values) if not isinstance(values, dict) else float(sum(values.values()))
                else:
                    maps[name] = dict(values)
    close()
    return frames


def _cells(maps: dict[str, dict[str, Any]]) -> Cells:
    cells: Cells = {}

    def cell(call: str, k: str, path: str) -> Stats:
        return cells.setdefault((path, CALLS[int(call)], NO_SIZE if int(k) < 0 else int(k)), Stats())

    for key, n in maps.get("@n", {}).items():
        call, k, h = key.split(",")
        stats = cell(call, k, "")
        stats.count += int(n)
        stats.hist[int(h)] = stats.hist.get(int(h), 0) + int(n)
    for name, attr in (("@b", "bytes"), ("@t", "total_ns"), ("@mn", "min_ns"), ("@mx", "max_ns")):
        for key, value in maps.get(name, {}).items():
            call, k = key.split(",")
            setattr(cell(call, k, ""), attr, int(value))
    for stats in cells.values():
        if stats.hist and stats.min_ns is None:
            stats.min_ns = 1 << min(stats.hist) if min(stats.hist) else 0
        if stats.hist and stats.max_ns is None:
            stats.max_ns = (1 << (max(stats.hist) + 1)) - 1
    return {key: s for key, s in cells.items() if s.count}


def frames_to_calls(frames: list[Frame], start: float, stop: float) -> tuple[Cells, list[tuple[float, Cells]], float]:
    """Total cells, per-interval cells and throttle ms from cumulative states (all since the probe began)."""
    total = frames[-1][1] if frames else {}
    deltas: list[tuple[float, Cells]] = []
    previous: Cells = {}
    for t, cells, _dt in frames:
        deltas.append((max(0.0, t - start), cells_since(cells, previous)))
        previous = cells
    # A frame's time stamp is its end; report its start like the interposer does.
    shifted = [(max(0.0, deltas[i - 1][0]) if i else 0.0, c) for i, (_t, c) in enumerate(deltas)]
    return total, shifted, frames[-1][2] if frames else 0.0


class EbpfProbe:
    """CallProbe: bpftrace over the job's process tree, from start(pid) to stop()."""

    name = NAME

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, count_root: bool = True) -> None:
        """count_root=False: the root's own calls are not counted, only those of processes it starts
        after start() (how `iobatch profile` watches the command it is about to run)."""
        self.interval_s = interval_s
        self.count_root = count_root
        self._proc: subprocess.Popen[str] | None = None
        self._lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._start = 0.0
        self._root = 0
        self._ready = threading.Event()

    def start(self, pid: int) -> None:
        reason = available()
        if reason is not None:
            raise RuntimeError(reason)
        table = {c: tuple(n for n in names if tracepoint_exists(n)) for c, names in SYSCALLS.items()}
        if self.count_root:
            script = build_script(process_tree(pid), self.interval_s, table)
        else:
            script = build_script((), self.interval_s, table, follow_only=[pid])
        env = {**os.environ, "BPFTRACE_MAP_KEYS_MAX": "65536"}
        self._root = pid
        self._lines = []
        self._ready.clear()
        self._proc = subprocess.Popen(
            ["bpftrace", "-f", "json", "-e", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
        )
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._reader.start()
        # BEGIN runs once every probe is attached: from "ready" on, no call is missed.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready.wait(0.05):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                err = self._stderr()
                self._kill()
                raise RuntimeError(f"bpftrace did not start: {err or 'timed out'}")
        self._start = time.monotonic()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.append(line)
            if '"ready ' in line:
                self._ready.set()

    def _stderr(self) -> str:
        if self._proc is None or self._proc.stderr is None or self._proc.poll() is None:
            return ""
        text = self._proc.stderr.read()
        useful = [ln for ln in text.splitlines() if ln.strip() and "RLIMIT_MEMLOCK" not in ln]
        return useful[-1] if useful else ""

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()

    def stop(self) -> dict[str, Any] | None:
        if self._proc is None:
            return None
        proc, self._proc = self._proc, None
        stop = time.monotonic()
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # END prints the final state
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        frames = parse_output(self._lines)
        if not frames:
            return None
        total, per_frame, throttle_ms = frames_to_calls(frames, self._start, stop)
        return calls_dict(
            NAME,
            total,
            per_frame,
            filter_text=(f"process tree of pid {self._root} (followed through fork), host pid namespace"
                         + ("" if self.count_root else f"; pid {self._root} itself not counted")),
            duration_s=stop - self._start,
            interval_s=self.interval_s,
            dirty_throttle_ms=throttle_ms,
            path_attribution=False,
        )


def start_command_probe(warn: Callable[[str], None]) -> EbpfProbe | None:
    """An eBPF probe on the processes this process starts from now on (not on itself), started; or
    None with one notice through `warn` when eBPF cannot run here. For `iobatch profile -- CMD`."""
    reason = available()
    if reason is not None:
        warn(f"{reason}: no per-call latency; counts and bytes come from procfs")
        return None
    probe = EbpfProbe(count_root=False)
    try:
        probe.start(os.getpid())
    except RuntimeError as exc:
        warn(f"eBPF probe did not start ({exc}): no per-call latency; counts and bytes come from procfs")
        return None
    return probe
