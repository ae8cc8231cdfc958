"""The eBPF program's maps as Python reads them: the layout against its owner (profiling/bpf/iobatch.h), a
reading's decoding, a window's exact extremes; and where the probe finds the cgroup v2 hierarchy."""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from profiling.probes import ebpf_maps as layout
from profiling.probes.callstats import CALLS, NO_SIZE, Stats
from profiling.probes.cgroup import v2_mount, v2_path
from profiling.probes.ebpf import kernel_too_old

HEADER = Path(__file__).resolve().parents[2] / "profiling" / "bpf" / "iobatch.h"


def _struct_fields(text: str, name: str) -> list[str]:
    body = re.search(r"struct " + name + r" \{(.*?)\};", text, re.S)
    assert body is not None, name
    return re.findall(r"__u64 (\w+)(?:\[\w+\])?;", body.group(1))


def _members(text: str, name: str) -> list[str]:
    body = re.search(r"struct " + name + r" \{(.*?)\n\};", text, re.S)
    assert body is not None, name
    return re.findall(r"^\t(?:char|__u64|struct \w+) (\w+)", body.group(1), re.M)


def test_the_python_layout_is_the_headers() -> None:
    text = HEADER.read_text()
    defines = {k: int(v) for k, v in re.findall(r"#define (IOB_\w+) (\d+)", text)}
    # The file cap is read from the object (the map's size), the one place besides the header that knows it.
    assert defines.pop("IOB_FILES") > 0 and not hasattr(layout, "IOB_FILES")
    assert defines == {
        "IOB_CALLS": layout.IOB_CALLS, "IOB_SIZES": layout.IOB_SIZES, "IOB_HIST": layout.IOB_HIST,
        "IOB_TASKS": layout.IOB_TASKS, "IOB_PATH": layout.IOB_PATH, "IOB_ACCESS": layout.IOB_ACCESS,
        "IOB_SLOTS": layout.IOB_SLOTS, "IOB_DISKS": layout.IOB_DISKS, "IOB_OTHER_PATHS": layout.IOB_OTHER_PATHS}
    assert len(CALLS) == layout.IOB_CALLS
    assert _struct_fields(text, "iob_cell") == [*layout.CELL_FIELDS, "hist"]
    assert tuple(_struct_fields(text, "iob_state")) == layout.STATE_FIELDS
    assert tuple(_struct_fields(text, "iob_host")) == layout.HOST_FIELDS
    assert tuple(_struct_fields(text, "iob_disk")) == layout.DISK_FIELDS
    select = re.search(r"struct iob_select \{(.*?)\};", text, re.S)
    assert select is not None and re.findall(r"(__u\d+) (\w+);", select.group(1)) == [
        ("__u32", "slot"), ("__u32", "level"), ("__u64", "exclude_tgid")] and layout.SELECT.format == "<IIQ"
    assert tuple(_struct_fields(text, "iob_file_call")) == layout.FILE_CALL_FIELDS
    assert tuple(_members(text, "iob_file")) == layout.FILE_FIELDS
    assert "read, write, open, close, fsync" in text and CALLS == ("read", "write", "open", "close", "fsync")


def _cell(count: int, nbytes: int, total: int, low: int | None, high: int, hist: dict[int, int],
          high_bytes: int = 0) -> bytes:
    words = [count, nbytes, total, 0 if low is None else low + 1, high, high_bytes]
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
    memory = _memory({write_4k: _cell(3, 3 * 4096, 3000, 700, 1200, {9: 2, 10: 1}, 4100),
                      fsync: _cell(1, 0, 5_000_000, 5_000_000, 5_000_000, {22: 1})})
    cells = layout.decode_cells(bytes(memory))
    assert cells == {("", "write", 13): Stats(3, 12288, 3000, 700, 1200, {9: 2, 10: 1}, max_bytes=4100),
                     ("", "fsync", NO_SIZE): Stats(1, 0, 5_000_000, 5_000_000, 5_000_000, {22: 1}, max_bytes=0)}
    assert cells[("", "write", 13)].to_dict()["max_bytes"] == 4100  # the slowest call's own size


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
    memory = _memory({13: _cell(3, 3, 30, 5, 20, {3: 3}, 7)})
    layout.clear_extremes(memory)
    (stats,) = layout.decode_cells(bytes(memory)).values()
    assert (stats.count, stats.bytes, stats.total_ns, stats.min_ns, stats.max_ns, stats.max_bytes) == \
        (3, 3, 30, None, None, None)


def test_state_and_task_pauses() -> None:
    values = list(range(1, len(layout.STATE_FIELDS) + 1))
    state = layout.decode_state(struct.pack(f"<{len(values)}Q", *values))
    assert state["throttle_ms"] == 1 and state["other_lost"] == len(values)
    host = layout.decode_host(struct.pack(f"<{len(layout.HOST_FIELDS)}Q", *range(len(layout.HOST_FIELDS))))
    assert host["found_tgid"] == layout.HOST_FIELDS.index("found_tgid") and layout.host_offset("files_cap") == 8
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


# ---- per-file records ------------------------------------------------------------------------------------

def _file(path: bytes, calls: dict[int, tuple[int, ...]], sequential: tuple[int, int] = (0, 0),
          consecutive: tuple[int, int] = (0, 0), sizes: dict[int, int] | None = None, other: int = 0,
          cut: int = 0) -> bytes:
    """One struct iob_file as the program writes it: min_ns stored plus one, access sizes plus one."""
    words: list[int] = []
    for c in range(layout.IOB_CALLS):
        count, nbytes, total, low, high, high_bytes = calls.get(c, (0, 0, 0, None, 0, 0))
        words += [count, nbytes, total, 0 if low is None else low + 1, high, high_bytes]
    slots = list((sizes or {}).items()) + [(-1, 0)] * (layout.IOB_ACCESS - len(sizes or {}))
    words += [*sequential, *consecutive, *(size + 1 for size, _ in slots), *(n for _, n in slots), other, cut]
    return struct.pack(f"<{layout.IOB_PATH}s{layout.FILE_WORDS}Q", path, *words)


def test_file_records_decode_with_their_access_pattern_and_the_summed_rest() -> None:
    cap = 3
    memory = bytearray((cap + 1) * layout.FILE_SIZE)
    records = {
        0: _file(b"/scratch/in/a.jpg", {0: (10, 40960, 1000, 50, 400, 4096), 2: (1, 0, 90, 90, 90, 0)},
                 sequential=(9, 0), consecutive=(9, 0), sizes={4096: 10}),
        1: _file(b"/scratch/out/shard.tar", {1: (6, 6000, 600, 60, 200, 512)}, sequential=(0, 1),
                 sizes={512: 1, 1000: 2, 1500: 3, 8: 0}, other=4, cut=1),
        3: _file(b"", {1: (4, 40, 8, 1, 3, 10)}),  # the files past the cap, summed
    }
    for index, raw in records.items():
        memory[index * layout.FILE_SIZE:(index + 1) * layout.FILE_SIZE] = raw
    files = layout.decode_files(bytes(memory), 2, cap)
    assert sorted(files) == [0, 1, 3]
    a = files[0]
    assert a.path == "/scratch/in/a.jpg" and a.calls["read"] == Stats(10, 40960, 1000, 50, 400, max_bytes=4096)
    assert a.calls["open"].max_ns == 90 and set(a.calls) == {"read", "open"}
    assert a.to_dict() == {"path": "/scratch/in/a.jpg", "read": {"sequential": 9, "consecutive": 9},
                           "access_sizes": [{"bytes": 4096, "count": 10}]}
    # Darshan's ACCESS1-4: the four commonest sizes, most first
    assert files[1].to_dict()["access_sizes"] == [{"bytes": 1500, "count": 3}, {"bytes": 1000, "count": 2},
                                                  {"bytes": 512, "count": 1}]
    # calls of sizes past the slots are counted, and a path that is not whole says so
    assert files[1].to_dict()["access_sizes_uncounted"] == 4 and files[1].to_dict()["path_cut"] is True
    assert not a.cut and "path_cut" not in a.to_dict()
    assert files[3].path == layout.OTHER_FILES and files[3].calls["write"].count == 4
    assert set(a.calls_cells()) == {("/scratch/in/a.jpg", "read", NO_SIZE), ("/scratch/in/a.jpg", "open", NO_SIZE)}


def test_a_file_window_subtracts_and_clearing_keeps_counts() -> None:
    before = layout.FileRecord("/f", {"write": Stats(5, 500, 50, 5, 20, max_bytes=100)}, (0, 4), (0, 4), {100: 5})
    after = layout.FileRecord("/f", {"write": Stats(8, 900, 90, 7, 9, max_bytes=200)}, (0, 7), (0, 6),
                              {100: 6, 200: 2})
    window = after.since(before)
    assert window.calls == {"write": Stats(3, 400, 40, 7, 9, max_bytes=200)}
    assert (window.sequential, window.consecutive, window.access) == ((0, 3), (0, 2), {100: 1, 200: 2})
    memory = bytearray(2 * layout.FILE_SIZE)
    memory[:layout.FILE_SIZE] = _file(b"/f", {1: (3, 30, 9, 2, 5, 10)})
    layout.clear_file_extremes(memory, 1, 1)
    stats = layout.decode_files(bytes(memory), 1, 1)[0].calls["write"]
    assert (stats.count, stats.bytes, stats.min_ns, stats.max_ns, stats.max_bytes) == (3, 30, None, None, None)


def test_value_sizes_are_checked_against_the_object() -> None:
    """The loader refuses an object whose map values another layout wrote (a stale build), in one line."""
    sizes = dict(layout.VALUE_SIZES)
    assert layout.check_value_sizes(sizes) is None
    assert sizes["files"] == layout.IOB_PATH + 8 * (layout.IOB_CALLS * 6 + 2 * 2 + 2 * layout.IOB_ACCESS + 2)
    stale = layout.check_value_sizes({**sizes, "files": sizes["files"] + 16})
    assert stale is not None and "\n" not in stale
    assert f"files {sizes['files'] + 16} bytes (read as {sizes['files']})" in stale and "make setup" in stale


def test_the_kernel_needs_bpf_loop() -> None:
    reason = kernel_too_old("5.16.20-generic")
    assert reason == "eBPF probe needs Linux 5.17+ (bpf_loop); this kernel is 5.16.20-generic"
    assert kernel_too_old("5.10.0") is not None and kernel_too_old("4.19.0-26-amd64") is not None
    assert kernel_too_old("5.17.0") is None and kernel_too_old("6.1.102-111.182.amzn2023.x86_64") is None


def test_the_depths_in_use_come_from_the_selections() -> None:
    """The program looks at a caller's ancestors only at the depths some profiler's cgroup sits at."""
    selections = [(struct.pack("<Q", 11), layout.SELECT.pack(0, 3, 0)),
                  (struct.pack("<Q", 12), layout.SELECT.pack(1, 5, 7))]
    assert layout.levels_of(selections) == (1 << 3) | (1 << 5)
    assert layout.levels_of([]) == 0


def test_a_slots_maps_have_the_templates_shapes() -> None:
    maps = {m.name: m for m in layout.slot_maps(4096)}
    assert set(maps) == set(layout.VALUE_SIZES)
    assert (maps["files"].max_entries, maps["file_of_path"].max_entries) == (4097, 4096)
    assert maps["cells"].mmapable and maps["files"].mmapable and not maps["other_paths"].preallocated


def test_a_slot_given_back_is_the_last_taken_again() -> None:
    """A call in flight when its profiler left ends in whichever profiler holds the slot then: the ring puts
    IOB_SLOTS - 1 other joins between a slot's release and its reuse."""
    assert layout.next_slot(set(), 0, 4) == 0
    assert layout.next_slot({0}, 1, 4) == 1
    assert layout.next_slot({1}, 2, 4) == 2  # slot 0 was given back: not taken again at once
    assert layout.next_slot({2, 3}, 6, 4) == 0  # round the ring past the taken ones
    assert layout.next_slot({0, 1, 2, 3}, 9, 4) is None


def test_a_cgroup_deeper_than_the_depth_mask_is_refused_in_words() -> None:
    """iob_host.levels is a 64-bit mask of the depths profilers select: a deeper cgroup is a RuntimeError (the
    probe then says it did not start), never an OverflowError from the mask (found by the CLI fuzz, which left a
    process carved 64 levels deep)."""
    from profiling.probes import ebpf_slot

    slot = object.__new__(ebpf_slot.Slot)  # refused before it touches the host's maps
    with pytest.raises(RuntimeError, match="64 levels deep"):
        slot.select(1234, 64, 0)
