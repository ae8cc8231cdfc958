"""The CO-RE program's maps as Python reads them (profiling/bpf/iobatch.h owns the layout). Pure.

`cells` is an array of IOB_CELLS `struct iob_cell` (index = call x IOB_SIZES + size class), `state` one
`struct iob_state`; both are read through mmap, so a reading is a memory copy. Counters only grow; a
window's figures are the difference of two readings, except min and max, which the loader clears at the
window's start (`clear_extremes`) so they are the window's own, exact. min_ns is stored plus one, so that
0 means "no call yet".
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping

from profiling.probes.callstats import CALLS, NO_SIZE, Cells, Stats

# Mirrors of iobatch.h (tests/unit/test_ebpf_maps.py checks them against the header).
IOB_CALLS = 5
IOB_SIZES = 48
IOB_HIST = 48
IOB_CELLS = IOB_CALLS * IOB_SIZES
IOB_TASKS = 1024
CELL_FIELDS = ("count", "bytes", "total_ns", "min_ns", "max_ns")  # then hist[IOB_HIST]
CELL_WORDS = len(CELL_FIELDS) + IOB_HIST
CELL_SIZE = 8 * CELL_WORDS
STATE_FIELDS = (
    "cgroup_id", "cgroup_level", "exclude_tgid", "throttle_ms", "throttle_wall_ns", "paused_until_ns",
    "dirtied_pages", "sock_sent", "sock_received", "missed", "find_ns_inum", "find_pid", "found_cgroup_id",
    "found_cgroup_level", "found_tgid",
)
STATE_SIZE = 8 * len(STATE_FIELDS)
TASK_PAUSE_SIZE = 8 + 16  # struct iob_task_pause: ms, comm[16]
SIZED_CALLS = ("read", "write")  # the calls with a size class; the others are all in class 0

_CELL = struct.Struct(f"<{CELL_WORDS}Q")


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
        count, nbytes, total, low, high = words[:5]
        hist = {h: n for h, n in enumerate(words[5:]) if n}
        cells[("", call, k)] = Stats(count, nbytes, total, low - 1 if low else None, high if low else None, hist)
    return cells


def decode_state(memory: bytes) -> dict[str, int]:
    return dict(zip(STATE_FIELDS, struct.unpack_from(f"<{len(STATE_FIELDS)}Q", memory), strict=True))


def state_offset(field: str) -> int:
    return 8 * STATE_FIELDS.index(field)


def clear_extremes(memory: bytearray | mmap.mmap) -> None:
    """Zero every cell's min and max (the start of a window whose extremes must be its own)."""
    zero = bytes(16)
    for index in range(IOB_CELLS):
        offset = index * CELL_SIZE + 8 * CELL_FIELDS.index("min_ns")
        memory[offset:offset + 16] = zero


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
                         hist)
    return out


def decode_task_pauses(items: list[tuple[bytes, bytes]]) -> dict[int, tuple[str, int]]:
    """The task_pause hash map's (key, value) pairs -> {tid: (comm, ms paused)}."""
    out = {}
    for key, value in items:
        ms, comm = struct.unpack("<Q16s", value[:TASK_PAUSE_SIZE])
        out[int.from_bytes(key[:4], "little")] = (comm.split(b"\0", 1)[0].decode(errors="replace"), ms)
    return out
