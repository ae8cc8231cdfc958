"""The bpftrace program behind the eBPF probe, and the output it prints. Pure text in, text out.

`build_script` writes the program: syscall tracepoints of the read, write, open, close and fsync
families, `writeback:balance_dirty_pages` (writers paused for dirty-page throttling) and
`sched:sched_process_fork` to follow the job's process tree. Keys are small integers only (call type,
size class, log2 latency bucket): a string key (a path) per call made the probe several times dearer
and grew with every file opened, so there is no path attribution.

The program prints its cumulative state every tick with `bpftrace -f json`; `FrameParser` turns those
lines back into cumulative cells (profiling/probes/callstats.py). ebpf.py runs the program; a later
libbpf program would replace this module and keep ebpf.py's interface.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats

TRACEFS = Path("/sys/kernel/tracing")
READY_MARK = '"ready '  # in the JSON line BEGIN prints once every tracepoint is attached

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
    """Whether this kernel has the syscall tracepoint sys_<direction>_<syscall>."""
    return (TRACEFS / "events" / "syscalls" / f"sys_{direction}_{syscall}").is_dir()


def kernel_syscalls() -> dict[str, tuple[str, ...]]:
    """SYSCALLS without the tracepoints this kernel lacks (bpftrace refuses a program naming one)."""
    return {call: tuple(n for n in names if tracepoint_exists(n)) for call, names in SYSCALLS.items()}


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
    # "done" closes a state at once (else the reader would wait for the next marker: one more tick)
    dump = ('printf("frame %llu\\n", nsecs); print(@n); print(@b); print(@t); print(@mn); print(@mx); print(@dt); '
            'printf("done\\n");')
    parts.append(f"interval:ms:{interval_ms} {{ {dump} }}")
    parts.append(
        f"END {{ {dump.replace('frame', 'final')} "
        "clear(@n); clear(@b); clear(@t); clear(@mn); clear(@mx); clear(@dt); clear(@ts); clear(@track); }"
    )
    return "\n".join(parts) + "\n"


Frame = tuple[float, Cells, float]  # (monotonic seconds, cumulative cells, cumulative dirty throttle ms)


class FrameParser:
    """bpftrace -f json lines -> cumulative states, fed one line at a time (the probe's reader thread).

    A state opens with a "frame <nsecs>" (or "final <nsecs>") printf, then one map line per map, and
    closes with a "done" printf (or, in older output, with the next state's marker / `finish()`)."""

    def __init__(self) -> None:
        self._t: float | None = None
        self._maps: dict[str, dict[str, Any]] = {}
        self._dt = 0.0

    def _close(self) -> Frame | None:
        if self._t is None:
            return None
        frame = (self._t, _cells(self._maps), self._dt)
        self._t, self._maps, self._dt = None, {}, 0.0
        return frame

    def feed(self, line: str) -> list[Frame]:
        """The states this line completes (zero or one, two only for a marker after an unclosed one)."""
        try:
            event = json.loads(line)
        except ValueError:
            return []
        if not isinstance(event, dict):
            return []
        kind = event.get("type")
        out: list[Frame] = []
        if kind == "printf":
            words = str(event.get("data", "")).split()
            if len(words) == 2 and words[0] in ("frame", "final"):
                closed = self._close()
                out += [closed] if closed else []
                self._t = int(words[1]) / 1e9
            elif words == ["done"]:
                closed = self._close()
                out += [closed] if closed else []
        elif kind == "map" and self._t is not None:
            for name, values in dict(event.get("data", {})).items():
                if name == "@dt":
                    self._dt = float(values) if not isinstance(values, dict) else float(sum(values.values()))
                else:
                    self._maps[name] = dict(values)
        return out

    def finish(self) -> list[Frame]:
        closed = self._close()
        return [closed] if closed else []


def parse_output(lines: Iterable[str]) -> list[Frame]:
    """bpftrace -f json lines -> cumulative states, one per "frame"/"final" marker, in order."""
    parser = FrameParser()
    frames: list[Frame] = []
    for line in lines:
        frames += parser.feed(line)
    return frames + parser.finish()


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
