"""The eBPF program's maps as Python reads them: the layout against its owner (profiling/bpf/iobatch.h), a
reading's decoding, a window's exact extremes; and where the probe finds the cgroup v2 hierarchy."""

from __future__ import annotations

import re
import struct
from pathlib import Path

from profiling.probes import ebpf_maps as layout
from profiling.probes.callstats import CALLS, NO_SIZE, Stats
from profiling.probes.cgroup import v2_mount, v2_path

HEADER = Path(__file__).resolve().parents[2] / "profiling" / "bpf" / "iobatch.h"


def _struct_fields(text: str, name: str) -> list[str]:
    body = re.search(r"struct " + name + r" \{(.*?)\};", text, re.S)
    assert body is not None, name
    return re.findall(r"__u64 (\w+)(?:\[\w+\])?;", body.group(1))


def test_the_python_layout_is_the_headers() -> None:
    text = HEADER.read_text()
    defines = dict(re.findall(r"#define (IOB_\w+) (\d+)", text))
    assert {k: int(v) for k, v in defines.items()} == {
        "IOB_CALLS": layout.IOB_CALLS, "IOB_SIZES": layout.IOB_SIZES, "IOB_HIST": layout.IOB_HIST,
        "IOB_TASKS": layout.IOB_TASKS}
    assert len(CALLS) == layout.IOB_CALLS
    assert _struct_fields(text, "iob_cell") == [*layout.CELL_FIELDS, "hist"]
    assert tuple(_struct_fields(text, "iob_state")) == layout.STATE_FIELDS
    assert "read, write, open, close, fsync" in text and CALLS == ("read", "write", "open", "close", "fsync")


def _cell(count: int, nbytes: int, total: int, low: int | None, high: int, hist: dict[int, int]) -> bytes:
    words = [count, nbytes, total, 0 if low is None else low + 1, high]
    words += [hist.get(h, 0) for h in range(layout.IOB_HIST)]
    return struct.pack(f"<{layout.CELL_WORDS}Q", *words)


def _memory(cells: dict[int, bytes]) -> bytearray:
    memory = bytearray(layout.IOB_CELLS * layout.CELL_SIZE)
    for index, raw in cells.items():
        memory[index * layout.CELL_SIZE:(index + 1) * layout.CELL_SIZE] = raw
    return memory


def test_decoding_names_call_and_size_class() -> None:
    write_4k = 1 * layout.IOB_SIZES + 13
    fsync = 4 * layout.IOB_SIZES
    memory = _memory({write_4k: _cell(3, 3 * 4096, 3000, 700, 1200, {9: 2, 10: 1}),
                      fsync: _cell(1, 0, 5_000_000, 5_000_000, 5_000_000, {22: 1})})
    cells = layout.decode_cells(bytes(memory))
    assert cells == {("", "write", 13): Stats(3, 12288, 3000, 700, 1200, {9: 2, 10: 1}),
                     ("", "fsync", NO_SIZE): Stats(1, 0, 5_000_000, 5_000_000, 5_000_000, {22: 1})}


def test_a_window_subtracts_counts_and_keeps_its_own_extremes() -> None:
    key = ("", "write", 13)
    base = {key: Stats(10, 100, 1000, 50, 900, {5: 8, 9: 2})}
    # min and max were cleared at the window's start: the end's are the window's own
    end = {key: Stats(15, 150, 3000, 80, 200, {5: 10, 7: 3, 9: 2}), ("", "close", -1): Stats(1, 0, 9, 9, 9, {3: 1})}
    window = layout.window(end, base)
    assert window[key] == Stats(5, 50, 2000, 80, 200, {5: 2, 7: 3})
    assert window[("", "close", -1)].count == 1
    assert layout.window(base, base) == {}


def test_clearing_extremes_leaves_the_counts() -> None:
    memory = _memory({13: _cell(3, 3, 30, 5, 20, {3: 3})})
    layout.clear_extremes(memory)
    (stats,) = layout.decode_cells(bytes(memory)).values()
    assert (stats.count, stats.bytes, stats.total_ns, stats.min_ns, stats.max_ns) == (3, 3, 30, None, None)


def test_state_and_task_pauses() -> None:
    values = list(range(1, len(layout.STATE_FIELDS) + 1))
    state = layout.decode_state(struct.pack(f"<{len(values)}Q", *values))
    assert state["cgroup_id"] == 1 and state["found_tgid"] == len(values)
    assert layout.state_offset("throttle_ms") == 24
    pauses = layout.decode_task_pauses([(struct.pack("<I", 42), struct.pack("<Q16s", 120, b"s5cmd"))])
    assert pauses == {42: ("s5cmd", 120)}


def test_the_cgroup_v2_mount_and_a_process_path() -> None:
    hybrid = ("30 24 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    assert v2_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    # In a container with its own cgroup namespace the mount's root is "/" too; a bind of a sub-tree is not.
    assert v2_mount("50 40 0:30 /kubepods /mnt rw - cgroup2 cgroup2 rw\n") is None
    assert v2_path(1, "4:memory:/x\n0::/system.slice/job.scope\n") == "/system.slice/job.scope"
    assert v2_path(1, "4:memory:/x\n") is None
