"""The eBPF probe: per-call figures of one job's processes, any binary (static Go such as s5cmd included).

Owns: selecting the job's cgroup v2 (carving one for its process tree when the job shares the profiler's or the
root's; never the profiler's own helpers), and turning readings of its slot's maps into the per-call dict of
profiling/probes/callstats.py (calls, size classes, per-file records, dirty-throttle pauses, pages dirtied,
socket bytes, the scratch disk's sequential and random requests).
Inputs: the compiled program (profiling/bpf/iobatch.bpf.o, `make setup`), a slot on a loaded copy of it
(ebpf_host.join: the host's shared copy in bpffs, else this profiler's own), the job's pid.
Outputs: `EbpfProbe.stop()` -> the per-call dict; a figure whose hook this kernel lacks is absent, with a note.
Invariants: counts are exact (every call of the selected cgroup, forks followed); a stage boundary reads the maps
(mmap), it never reloads; `close()` leaves the slot on every path, and a SIGKILLed profiler leaves nothing loaded.
Needs Linux 5.17+, root (or CAP_BPF + CAP_PERFMON, or CAP_SYS_ADMIN), the kernel's BTF and libbpf: `available()`
says what is missing. How it works and what it costs: docs/profiler.md, "The eBPF probe".
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import profiling.probes.ebpf_maps as layout
from profiling import hoststate
from profiling.probes.callstats import Cells, calls_dict, cells_since
from profiling.probes.cgroup import Carved, carve
from profiling.probes.ebpf_host import join
from profiling.probes.libbpf import library_missing
from profiling.probes.procfs import process_tree, read_start_time

NAME = "ebpf"
ENV_OFF = "IOBATCH_NO_EBPF"  # "1": never run the eBPF probe (as if not root)
ENV_OBJECT = "IOBATCH_BPF_OBJECT"  # override where the compiled program is
OBJECT_NAME = "iobatch.bpf.o"
BTF = Path("/sys/kernel/btf/vmlinux")
TRACEFS = Path("/sys/kernel/tracing")
DEFAULT_INTERVAL_S = 1.0
MIN_KERNEL = (5, 17)  # bpf_loop (include/uapi/linux/bpf.h: "bpf_loop", added in 5.17)
CAPS = {21: "CAP_SYS_ADMIN", 38: "CAP_PERFMON", 39: "CAP_BPF"}
# The kernel's dev_t inside the kernel (and in its tracepoints) is major << 20 | minor (include/linux/kdev_t.h,
# MINORBITS), not the user-space encoding os.makedev gives.
KERNEL_MINOR_BITS = 20
# Optional hooks: (program, what is missing without it). sock_*_length exist from Linux 6.3.
EXTRA_PROGRAMS = (
    ("iob_dirty_pause", "dirty-throttle pause (tracepoint writeback:balance_dirty_pages, needs tracefs)"),
    ("iob_dirtied", "pages dirtied (tracepoint writeback:writeback_dirty_folio)"),
    ("iob_sock_send", "socket bytes (tracepoint sock:sock_send_length, Linux 6.3+)"),
    ("iob_sock_recv", "socket bytes (tracepoint sock:sock_recv_length, Linux 6.3+)"),
    ("iob_block_issue", "the scratch disk's sequential and random requests (tracepoint block:block_rq_issue)"),
)


def object_path() -> Path | None:
    """The compiled program, or None when `make setup` has not built it."""
    candidates = [Path(os.environ[ENV_OBJECT])] if os.environ.get(ENV_OBJECT) else []
    candidates.append(Path(__file__).resolve().parent.parent / "bpf" / OBJECT_NAME)
    return next((p for p in candidates if p.is_file()), None)


def _effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def kernel_too_old(release: str) -> str | None:
    """None when kernel `release` (uname -r) is new enough for the program, else a one-line reason."""
    numbers = release.split("-", 1)[0].split(".")
    try:
        version = (int(numbers[0]), int(numbers[1]))
    except (IndexError, ValueError):
        return None  # not a version we can read: loading will tell
    if version < MIN_KERNEL:
        return f"eBPF probe needs Linux {MIN_KERNEL[0]}.{MIN_KERNEL[1]}+ (bpf_loop); this kernel is {release}"
    return None


def available() -> str | None:
    """None when the probe can run here, else a one-line reason it cannot."""
    if os.environ.get(ENV_OFF) == "1":
        return f"eBPF probe turned off ({ENV_OFF}=1)"
    old = kernel_too_old(os.uname().release)
    if old is not None:
        return old
    caps = _effective_caps()
    if not (caps >> 21 & 1 or (caps >> 38 & 1 and caps >> 39 & 1)):
        return "eBPF probe needs root (or CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN)"
    if not BTF.is_file():
        return f"eBPF probe needs the kernel's BTF ({BTF}: CONFIG_DEBUG_INFO_BTF)"
    if object_path() is None:
        return "eBPF probe is not built (run `make setup`: clang and libbpf-dev build profiling/bpf)"
    missing = library_missing()
    if missing is not None:
        return f"eBPF probe needs libbpf: {missing}"
    return None


def _mount_tracefs() -> str | None:
    """The classic tracepoint (balance_dirty_pages) is attached by its id under tracefs: mount it if it is not
    (left mounted, as a booted host has it: profiling/probes/hoststate.py), and say so. The raw tracepoints need
    no tracefs."""
    if (TRACEFS / "events").is_dir():
        return None
    problem = hoststate.make(hoststate.TRACEFS)
    return f"mounted tracefs at {TRACEFS}, as a booted host has it" if problem is None else None


class _Loaded:
    """This profiler's slot on the host's shared programs (profiling/probes/ebpf_host.py), its maps mmap-ed."""

    def __init__(self) -> None:
        path = object_path()
        if path is None:
            raise RuntimeError("the eBPF program is not built")
        mounted = _mount_tracefs()
        self.slot = join(path, tuple(name for name, _what in EXTRA_PROGRAMS))
        self.attached = self.slot.attached
        self.notes = [f"{what}: not available on this kernel" for name, what in EXTRA_PROGRAMS
                      if name not in self.attached] + self.slot.notes + ([mounted] if mounted else [])
        self.files_cap = self.slot.files_cap
        self.state, self.cells, self.files = self.slot.state, self.slot.cells, self.slot.files
        self.dev: int | None = None  # the disk whose requests are classed (the kernel's dev_t)

    def add_disk(self, dev: int) -> None:
        self.slot.add_disk(dev)
        self.dev = dev

    def find(self, pid: int) -> tuple[int, int, int]:
        """(cgroup id, its level, host pid) of process `pid` of this process's pid namespace."""
        return self.slot.find(pid)

    def task_pauses(self) -> dict[int, tuple[str, int]]:
        """{tid: (comm, ms paused)} of the tasks the dirty throttle paused (at most IOB_TASKS of them)."""
        return self.slot.task_pauses()

    def reading(self) -> tuple[Cells, dict[str, int], Files]:
        return self.copy()()

    def copy(self) -> Callable[[], tuple[Cells, dict[str, int], Files]]:
        """reading() in two halves: the maps' bytes copied now (the records handed out, not the whole files
        map), decoded when the function returned is called."""
        raw_state = bytes(self.state[:layout.STATE_SIZE])
        raw_cells = bytes(self.cells[:layout.IOB_CELLS * layout.CELL_SIZE])
        cap = self.files_cap
        handed_out = min(layout.decode_state(raw_state)["files"], cap)
        raw_files = bytes(self.files[:handed_out * layout.FILE_SIZE])
        raw_other = bytes(self.files[cap * layout.FILE_SIZE:(cap + 1) * layout.FILE_SIZE])
        disk = self.slot.disk(self.dev) if self.dev is not None else None

        def decode() -> tuple[Cells, dict[str, int], Files]:
            state = layout.decode_state(raw_state)
            if disk is not None:  # device-wide counts, one entry per disk however many profilers class it
                state.update({f"block_{key}": value for key, value in disk.items()})
            files = layout.decode_files(raw_files, handed_out, cap, raw_other)
            return layout.decode_cells(raw_cells), state, files

        return decode

    def clear_extremes(self) -> None:
        layout.clear_extremes(self.cells)
        handed_out = layout.decode_state(self.state[:layout.STATE_SIZE])["files"]
        layout.clear_file_extremes(self.files, handed_out, self.files_cap)

    def close(self) -> None:
        self.slot.close()


def _paused_tasks(now: dict[int, tuple[str, int]], before: dict[int, tuple[str, int]],
                  most: int = 10) -> list[dict[str, Any]]:
    """The tasks paused most in the window, most first: [{tid, comm, ms}] (the kernel's thread ids)."""
    paused = [(ms - before.get(tid, ("", 0))[1], tid, comm) for tid, (comm, ms) in now.items()]
    return [{"tid": tid, "comm": comm, "ms": ms} for ms, tid, comm in sorted(paused, reverse=True)[:most] if ms > 0]


Files = dict[int, layout.FileRecord]  # record index -> cumulative per-file figures
Reading = tuple[float, Cells, dict[str, int], Files]  # (monotonic s, cumulative cells, state, files)


def file_cells(files: Files) -> Cells:
    """Per-file figures as cells (path, call, NO_SIZE), the shape by_path and contracts read."""
    cells: Cells = {}
    for record in files.values():
        cells.update(record.calls_cells())
    return cells


def files_window(end: Files, base: Files) -> Files:
    """Each file's calls between two readings (files without any left out); extremes are `end`'s own."""
    out = {index: record.since(base.get(index)) for index, record in end.items()}
    return {index: record for index, record in out.items() if record.calls}

_LIVE: weakref.WeakSet[EbpfProbe] = weakref.WeakSet()


@atexit.register
def _close_live_probes() -> None:
    """A probe left open at exit gives its job's processes back to their cgroup (the kernel detaches the
    program by itself)."""
    for probe in list(_LIVE):
        probe.close()


def _files_dict(window: Files, frames: list[tuple[float, Cells]], state: dict[str, int], cap: int,
                filter_text: str, duration_s: float, interval_s: float) -> dict[str, Any]:
    """calls["files"]: the window's per-file figures as a probe's dict (by_path, cells and frames per file path,
    no size classes), each file's access pattern ("records"), and the cap: whether the window had calls on
    files past it ("other_calls") and how many such files it saw first ("other_files"; `state` holds the
    window's change of the program's counters)."""
    notes = []
    other = next((r for r in window.values() if r.path == layout.OTHER_FILES), None)
    if other is not None:
        lost = (f"; {state['other_lost']} more could not be told apart, so that count is a lower bound"
                if state["other_lost"] else "")
        notes.append(f"calls on files past the cap of {cap} files are summed as {layout.OTHER_FILES!r} "
                     f"({state['other_files']} such files first seen in this stage{lost})")
    cut = sorted(r.path for r in window.values() if r.cut)
    if cut:
        notes.append(f"paths not whole (longer than {layout.IOB_PATH - 1} bytes: the head kept; or too deep: '...' "
                     f"for the head), so several files may share one record: {len(cut)}, e.g. {cut[0]!r}")
    out = calls_dict(NAME, file_cells(window), frames, filter_text=filter_text, duration_s=duration_s,
                     interval_s=interval_s, notes=notes)
    out["size_classes"] = False
    out["records"] = [record.to_dict() for _index, record in sorted(window.items())
                      if record.path != layout.OTHER_FILES and {"read", "write"} & record.calls.keys()]
    out["files_cap"] = cap
    out["other_files"] = state["other_files"]
    out["other_calls"] = other is not None
    return out


class EbpfProbe:
    """CallProbe: the job's cgroup, from start(pid) to stop().

    One-shot (default): start() loads and attaches the program, stop() reads it and detaches it.
    keep_running=True (the sidecar's): the program stays loaded from prepare() or the first start(pid) until close();
    a later start() reads the counters (the window's base) and clears min and max, stop() reads them
    again. The job waits for the sidecar's ack at both boundaries, so the window is exact.
    count_root=False: `pid` itself is not counted, only the processes it starts after start()
    (how `iobatch profile` watches the command it is about to run).
    """

    name = NAME

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, count_root: bool = True,
                 keep_running: bool = False, disk: tuple[int, int] | None = None) -> None:
        self.interval_s = interval_s
        self.disk = disk  # (major, minor) of the scratch disk whose requests are classed; None: none
        self.count_root = count_root
        self.keep_running = keep_running
        self._loaded: _Loaded | None = None
        self._carved: Carved | None = None
        self._root: tuple[int, int | None] | None = None  # (pid, start time): the job being watched
        self._filter = ""
        self._lock = threading.Lock()
        self._base: Reading | None = None
        self._base_pauses: dict[int, tuple[str, int]] = {}
        self._frames: list[tuple[float, Cells]] = []
        self._file_frames: list[tuple[float, Cells]] = []
        self._last: Reading | None = None
        self._ticker: threading.Thread | None = None
        self._stop_ticks = threading.Event()

    @property
    def hooks(self) -> str | None:
        """The watched calls' hooks of the host's programs: "fentry", "tracepoint" (where the kernel refuses
        fentry), None before prepare() or start() or after close()."""
        return self._loaded.slot.hooks if self._loaded is not None else None

    # -- lifecycle

    def prepare(self) -> None:
        """Join the host's programs (loading them when this is the host's first profiler) ahead of the first
        start(): the sidecar does it while its job starts up, so the job's first stage does not wait for it."""
        if self._loaded is None:
            self._loaded = _Loaded()
            _LIVE.add(self)
            if self.disk is not None:
                self._loaded.add_disk(self.disk[0] << KERNEL_MINOR_BITS | self.disk[1])

    def start(self, pid: int) -> None:
        root = (pid, read_start_time(pid))
        if not self.keep_running:
            self.close()
        self.prepare()
        assert self._loaded is not None
        if self._root != root:
            try:
                self._select(pid)
            except BaseException:
                self.close()
                raise
            self._root = root
        loaded = self._loaded
        loaded.clear_extremes()
        now = time.monotonic()
        cells, state, files = loaded.reading()
        self._base_pauses = loaded.task_pauses() if "iob_dirty_pause" in loaded.attached else {}
        with self._lock:
            self._base = self._last = (now, cells, state, files)
            self._frames = []
            self._file_frames = []
        self._stop_ticks.clear()
        self._ticker = threading.Thread(target=self._tick, daemon=True, name="ebpf-frames")
        self._ticker.start()

    def _select(self, pid: int) -> None:
        """Point the program at the cgroup holding `pid`'s tree (carving one out when it is shared)."""
        assert self._loaded is not None
        loaded = self._loaded
        loaded.slot.unselect()
        if self._carved is not None:
            self._carved.restore()
            self._carved = None
        cgroup, level, host_pid = loaded.find(pid)
        own = loaded.find(os.getpid())[0]
        where = f"cgroup v2 id {cgroup}"
        if cgroup == own or level == 0:
            # The tree of a profiler watching its own children holds its watchdog too, whose imports are not the
            # command's (`iobatch profile -- /bin/true` once counted 30 opens of .pyc files).
            tree = [p for p in process_tree(pid) if p not in loaded.slot.helpers()]
            try:
                self._carved = carve(pid, tree)
            except OSError as exc:
                raise RuntimeError(f"cannot give process {pid} a cgroup of its own ({exc})") from None
            cgroup, level, host_pid = loaded.find(pid)
            where = f"cgroup {self._carved.path.name} made for the process tree of pid {pid}"
        loaded.slot.select(cgroup, level, 0 if self.count_root else host_pid)
        self._filter = where + ("" if self.count_root else f"; pid {pid} itself not counted")

    def _tick(self) -> None:
        """Every interval_s while a window is open: one frame (the calls since the previous reading)."""
        while not self._stop_ticks.wait(self.interval_s):
            loaded = self._loaded
            if loaded is None:
                return
            now = time.monotonic()
            cells, state, files = loaded.reading()
            with self._lock:
                if self._base is None or self._last is None:
                    return
                t = self._last[0] - self._base[0]
                self._frames.append((t, cells_since(cells, self._last[1])))
                self._file_frames.append((t, cells_since(file_cells(files), file_cells(self._last[3]))))
                self._last = (now, cells, state, files)

    def _end_ticks(self) -> None:
        self._stop_ticks.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None

    def close(self) -> None:
        """Detach the program and give back the cgroup; idempotent, never raises."""
        self._end_ticks()
        if self._loaded is not None:
            self._loaded.close()
            self._loaded = None
        if self._carved is not None:
            self._carved.restore()
            self._carved = None
        self._root = None

    def stop(self) -> dict[str, Any] | None:
        return self.stop_later()()

    def stop_later(self) -> Callable[[], dict[str, Any] | None]:
        """stop() in two halves: the window's closing reading now, its figures built when the function
        returned is called (after the sidecar has answered the job)."""
        self._end_ticks()
        loaded = self._loaded
        with self._lock:
            base, last, frames, file_frames = self._base, self._last, self._frames, self._file_frames
            self._base = None
        if loaded is None or base is None or last is None:
            return lambda: None
        now = time.monotonic()
        reading = loaded.copy()
        cap = loaded.files_cap
        notes = list(loaded.notes)
        attached = loaded.attached
        pauses = loaded.task_pauses() if "iob_dirty_pause" in attached else {}
        filter_text = self._filter
        if not self.keep_running:
            self.close()
        base_pauses = self._base_pauses

        def build() -> dict[str, Any] | None:
            cells, state, files = reading()
            every = [*frames, (last[0] - base[0], cells_since(cells, last[1]))]
            every_file = [*file_frames, (last[0] - base[0], cells_since(file_cells(files), file_cells(last[3])))]
            total = layout.window(cells, base[1])
            delta = {key: state[key] - base[2][key] for key in ("throttle_ms", "throttle_wall_ns", "dirtied_pages",
                                                               "sock_sent", "sock_received", "missed")}
            if delta["missed"]:
                notes.append(f"{delta['missed']} calls not timed (no per-task slot for their entry time)")
            result = calls_dict(
                NAME, total, every, filter_text=filter_text, duration_s=now - base[0], interval_s=self.interval_s,
                notes=notes, path_attribution=False,
                dirty_throttle_ms=float(delta["throttle_ms"]) if "iob_dirty_pause" in attached else None,
            )
            if "iob_dirty_pause" in attached:
                result["dirty_throttle_wall_ms"] = delta["throttle_wall_ns"] / 1e6
                result["dirty_throttle_tasks"] = _paused_tasks(pauses, base_pauses)
            if "iob_dirtied" in attached:
                result["dirtied_bytes"] = delta["dirtied_pages"] * os.sysconf("SC_PAGE_SIZE")
            if {"iob_sock_send", "iob_sock_recv"} <= attached:
                result["socket"] = {"sent_bytes": delta["sock_sent"], "received_bytes": delta["sock_received"]}
            if self.disk is not None and "iob_block_issue" in attached and "block_seq_bytes" in state:
                result["device_requests"] = {
                    "disk": f"{self.disk[0]}:{self.disk[1]}",
                    **{key: state[f"block_{key}"] - base[2][f"block_{key}"]
                       for key in ("seq_bytes", "random_bytes", "random_ios")}}
            files_delta = {key: state[key] - base[2][key] for key in ("other_files", "other_lost")}
            result["files"] = _files_dict(files_window(files, base[3]), every_file, files_delta, cap, filter_text,
                                          now - base[0], self.interval_s)
            return result

        return build
