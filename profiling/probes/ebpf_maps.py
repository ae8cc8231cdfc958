"""The CO-RE program's maps as Python reads them (profiling/bpf/iobatch.h owns the layout). Pure.

A profiler's own maps sit at its slot of the program's maps of maps (`slot_maps` gives their shapes);
`cells` is an array of IOB_CELLS `struct iob_cell` (index = call x IOB_SIZES + size class), `state` one
`struct iob_state`, `files` the per-file records (`struct iob_file`: the cap of them, then one for every
file past the cap; the cap is the map's size, read from the object); all are read through mmap, so a
reading is a memory copy. Counters only grow; a window's figures are the difference of two readings,
except min and max (with the slowest call's size), which the loader clears at the window's start
(`clear_extremes`) so they are the window's own: min and max exact, the slowest call's size that of one of
the slowest calls when two finish at once (iobatch.h). min_ns is stored plus one, so that 0 means "no call
yet". `check_value_sizes` holds the object's value sizes against these, so a stale build fails at load.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats

# Mirrors of iobatch.h (tests/unit/test_ebpf_maps.py checks them against the header).
IOB_CALLS = 5
IOB_SIZES = 48
IOB_HIST = 48
IOB_CELLS = IOB_CALLS * IOB_SIZES
IOB_SLOTS = 128
IOB_DISKS = 64
IOB_TASKS = 1024
IOB_OTHER_PATHS = 65536
IOB_PATH = 256
IOB_ACCESS = 8
CELL_FIELDS = ("count", "bytes", "total_ns", "min_ns", "max_ns", "max_bytes")  # then hist[IOB_HIST]
CELL_WORDS = len(CELL_FIELDS) + IOB_HIST
CELL_SIZE = 8 * CELL_WORDS
STATE_FIELDS = (
    "throttle_ms", "throttle_wall_ns", "paused_until_ns", "dirtied_pages", "sock_sent", "sock_received", "missed",
    "files", "other_files", "other_lost",
)
STATE_SIZE = 8 * len(STATE_FIELDS)
HOST_FIELDS = ("levels", "files_cap", "find_ns_inum", "find_pid", "found_cgroup_id", "found_cgroup_level",
               "found_tgid", "joins")
HOST_SIZE = 8 * len(HOST_FIELDS)
SELECT = struct.Struct("<IIQ")  # struct iob_select: slot, level, exclude_tgid (the key: the cgroup v2 id, u64)
DISK_FIELDS = ("next", "seq_bytes", "random_bytes", "random_ios")  # struct iob_disk (the key: the kernel's dev_t)
DISK_SIZE = 8 * len(DISK_FIELDS)
TASK_PAUSE_SIZE = 8 + 16  # struct iob_task_pause: ms, comm[16]
SIZED_CALLS = ("read", "write")  # the calls with a size class; the others are all in class 0
FILE_CALL_FIELDS = ("count", "bytes", "total_ns", "min_ns", "max_ns", "max_bytes")  # struct iob_file_call
FILE_FIELDS = ("path", "calls", "sequential", "consecutive", "access_size", "access_count", "access_other", "cut")
FILE_WORDS = IOB_CALLS * len(FILE_CALL_FIELDS) + 2 * len(SIZED_CALLS) + 2 * IOB_ACCESS + 2
FILE_SIZE = IOB_PATH + 8 * FILE_WORDS
VALUE_SIZES = {"cells": CELL_SIZE, "state": STATE_SIZE, "files": FILE_SIZE, "task_pause": TASK_PAUSE_SIZE,
               "file_of_path": 4, "other_paths": 1}
OTHER_FILES = "(other files)"  # the path of the record that sums the files past the cap

_CELL = struct.Struct(f"<{CELL_WORDS}Q")
_FILE = struct.Struct(f"<{IOB_PATH}s{FILE_WORDS}Q")


def check_value_sizes(sizes: Mapping[str, int]) -> str | None:
    """None when every map's value size (as the object declares it) is what this decoder reads, else a
    one-line reason: the object was built from another iobatch.h."""
    wrong = [f"{name} {sizes[name]} bytes (read as {want})" for name, want in VALUE_SIZES.items()
             if sizes.get(name) != want]
    if not wrong:
        return None
    return f"the eBPF object's map values do not match its loader: {', '.join(wrong)}; rebuild it (`make setup`)"


@dataclass(frozen=True)
class SlotMap:
    """One of a slot's own maps, as the program's maps of maps `slot_<name>` take it (the inner template's
    shape: the kernel refuses a map of another shape at a slot)."""

    name: str
    kind: str  # "array" or "hash"
    key_size: int
    value_size: int
    max_entries: int
    mmapable: bool = False
    preallocated: bool = True


def slot_maps(files_cap: int) -> tuple[SlotMap, ...]:
    """The maps a profiler makes for its slot (iobatch.bpf.c's *_map templates), with `files_cap` files kept."""
    sizes = VALUE_SIZES
    return (
        SlotMap("cells", "array", 4, sizes["cells"], IOB_CELLS, mmapable=True),
        SlotMap("state", "array", 4, sizes["state"], 1, mmapable=True),
        SlotMap("task_pause", "hash", 4, sizes["task_pause"], IOB_TASKS),
        SlotMap("files", "array", 4, sizes["files"], files_cap + 1, mmapable=True),
        SlotMap("file_of_path", "hash", IOB_PATH, sizes["file_of_path"], files_cap),
        SlotMap("other_paths", "hash", IOB_PATH, sizes["other_paths"], IOB_OTHER_PATHS, preallocated=False),
    )


def decode_cells(memory: bytes) -> Cells:
    """Every cell that saw a call: {("", call, size class): Stats} (NO_SIZE for open, close, fsync)."""
    cells: Cells = {}
    for index in range(IOB_CELLS):
        offset = index * CELL_SIZE
        if not int.from_bytes(memory[offset:offset + 8], "little"):
            continue
        words = _CELL.unpack_from(memory, offset)
        call = CALLS[index // IOB_SIZES]
        k = index % IOB_SIZES if call in SIZED_CALLS else NO_SIZE
        count, nbytes, total, low, high, high_bytes = words[:6]
        hist = {h: n for h, n in enumerate(words[6:]) if n}
        cells[("", call, k)] = Stats(count, nbytes, total, low - 1 if low else None, high if low else None, hist,
                                     max_bytes=high_bytes if low else None)
    return cells


@dataclass
class FileRecord:
    """One file's figures: per call type, and its access pattern as Darshan counts it (iobatch.h)."""

    path: str
    calls: dict[str, Stats]
    sequential: tuple[int, int] = (0, 0)  # reads, writes
    consecutive: tuple[int, int] = (0, 0)
    access: dict[int, int] = field(default_factory=dict)  # bytes -> reads and writes of that size
    access_other: int = 0  # reads and writes of sizes past the IOB_ACCESS counted
    cut: bool = False  # the path is not whole: its head only, or "..." for an unknown head (iobatch.h)

    def since(self, before: FileRecord | None) -> FileRecord:
        """The calls after `before` (the same record read earlier); min and max are this reading's."""
        if before is None:
            return self
        calls = {call: stats for (_path, call, _k), stats in window(self.calls_cells(), before.calls_cells()).items()}
        return FileRecord(
            self.path, calls,
            (self.sequential[0] - before.sequential[0], self.sequential[1] - before.sequential[1]),
            (self.consecutive[0] - before.consecutive[0], self.consecutive[1] - before.consecutive[1]),
            {size: n - before.access.get(size, 0) for size, n in self.access.items() if n > before.access.get(size, 0)},
            self.access_other - before.access_other,
            self.cut,
        )

    def calls_cells(self) -> Cells:
        """The record as cells: (path, call, NO_SIZE), the shape contracts and by_path read."""
        return {(self.path, call, NO_SIZE): stats for call, stats in self.calls.items()}

    def to_dict(self) -> dict[str, object]:
        """Access pattern for the profile: sequential and consecutive counts, the 4 commonest among the first
        IOB_ACCESS distinct sizes (Darshan's ACCESS1-4 are of all sizes), and how many calls were of sizes past
        those (then a size left out may be commoner than the ones shown)."""
        top = sorted(self.access.items(), key=lambda item: (-item[1], item[0]))[:4]
        return {
            "path": self.path,
            **{call: {"sequential": self.sequential[i], "consecutive": self.consecutive[i]}
               for i, call in enumerate(SIZED_CALLS) if call in self.calls},
            "access_sizes": [{"bytes": size, "count": n} for size, n in top],
            **({"access_sizes_uncounted": self.access_other} if self.access_other else {}),
            **({"path_cut": True} if self.cut else {}),
        }


def decode_files(memory: bytes | mmap.mmap, count: int, cap: int, last: bytes | None = None) -> dict[int, FileRecord]:
    """{record index: FileRecord} of the first `count` records (those handed out) and of the last, the
    files past the cap summed (index `cap`; from `last` when given, a copy of that record alone); records that
    saw no call are left out. Only those records are read: the rest of `memory` (the map itself, say) is not
    copied."""
    out: dict[int, FileRecord] = {}
    for index in [*range(min(count, cap)), cap]:
        if index == cap and last is not None:
            raw_path, *words = _FILE.unpack_from(last)
        else:
            raw_path, *words = _FILE.unpack_from(memory, index * FILE_SIZE)
        calls: dict[str, Stats] = {}
        width = len(FILE_CALL_FIELDS)
        for c, call in enumerate(CALLS):
            n, nbytes, total, low, high, high_bytes = words[c * width:(c + 1) * width]
            if n:
                calls[call] = Stats(n, nbytes, total, low - 1 if low else None, high if low else None,
                                    max_bytes=high_bytes if low else None)
        if not calls:
            continue
        rest = words[IOB_CALLS * width:]
        sizes, counts = rest[4:4 + IOB_ACCESS], rest[4 + IOB_ACCESS:4 + 2 * IOB_ACCESS]
        path = OTHER_FILES if index == cap else raw_path.split(b"\0", 1)[0].decode(errors="replace")
        out[index] = FileRecord(path, calls, (rest[0], rest[1]), (rest[2], rest[3]),
                                {size - 1: n for size, n in zip(sizes, counts, strict=True) if size and n},
                                rest[-2], bool(rest[-1]))
    return out


def clear_file_extremes(memory: bytearray | mmap.mmap, count: int, cap: int) -> None:
    """Zero min, max and the slowest call's size of every call type of the records handed out."""
    zero = bytes(24)
    start = IOB_PATH + 8 * FILE_CALL_FIELDS.index("min_ns")
    for index in [*range(min(count, cap)), cap]:
        for c in range(IOB_CALLS):
            offset = index * FILE_SIZE + start + 8 * len(FILE_CALL_FIELDS) * c
            memory[offset:offset + 24] = zero


def decode_state(memory: bytes) -> dict[str, int]:
    return dict(zip(STATE_FIELDS, struct.unpack_from(f"<{len(STATE_FIELDS)}Q", memory), strict=True))


def decode_host(memory: bytes) -> dict[str, int]:
    return dict(zip(HOST_FIELDS, struct.unpack_from(f"<{len(HOST_FIELDS)}Q", memory), strict=True))


def host_offset(field: str) -> int:
    return 8 * HOST_FIELDS.index(field)


def decode_disk(memory: bytes) -> dict[str, int]:
    return dict(zip(DISK_FIELDS, struct.unpack_from(f"<{len(DISK_FIELDS)}Q", memory), strict=True))


def next_slot(taken: set[int], joins: int, slots: int = IOB_SLOTS) -> int | None:
    """The slot a joining profiler takes: the first free one from `joins` (mod `slots`) round the ring, so a slot
    just given back is the last to be taken again; None when all are taken."""
    return next(((joins + k) % slots for k in range(slots) if (joins + k) % slots not in taken), None)


def levels_of(selections: list[tuple[bytes, bytes]]) -> int:
    """iob_host.levels from the `selection` map's (key, value) pairs: bit L set for every depth L in use."""
    levels = 0
    for _key, value in selections:
        levels |= 1 << SELECT.unpack_from(value)[1]
    return levels


def clear_extremes(memory: bytearray | mmap.mmap) -> None:
    """Zero every cell's min, max and the slowest call's size (the start of a window whose extremes must be its
    own)."""
    zero = bytes(24)
    for index in range(IOB_CELLS):
        offset = index * CELL_SIZE + 8 * CELL_FIELDS.index("min_ns")
        memory[offset:offset + 24] = zero


def window(end: Mapping[tuple[str, str, int], Stats], base: Mapping[tuple[str, str, int], Stats]) -> Cells:
    """The calls between two readings; min and max are `end`'s (cleared at the window's start: exact)."""
    out: Cells = {}
    for key, now in end.items():
        before = base.get(key, Stats())
        count = now.count - before.count
        if count <= 0:
            continue
        hist = {h: n - before.hist.get(h, 0) for h, n in now.hist.items() if n - before.hist.get(h, 0) > 0}
        out[key] = Stats(count, now.bytes - before.bytes, now.total_ns - before.total_ns, now.min_ns, now.max_ns,
                         hist, max_bytes=now.max_bytes)
    return out


def decode_task_pauses(items: list[tuple[bytes, bytes]]) -> dict[int, tuple[str, int]]:
    """The task_pause hash map's (key, value) pairs -> {tid: (comm, ms paused)}."""
    out = {}
    for key, value in items:
        ms, comm = struct.unpack("<Q16s", value[:TASK_PAUSE_SIZE])
        out[int.from_bytes(key[:4], "little")] = (comm.split(b"\0", 1)[0].decode(errors="replace"), ms)
    return out
