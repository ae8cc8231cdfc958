"""Per-call figures: deltas of cumulative counters, record parsing, bpftrace output parsing."""

from __future__ import annotations

import json

import pytest

from profiling.metrics import by_call
from profiling.probes.bpftrace import build_script, parse_output
from profiling.probes.callstats import Stats, calls_dict, size_class, size_label
from profiling.probes.ebpf import frames_to_calls
from profiling.probes.interpose import Record, parse_record, stage_calls


def test_size_classes() -> None:
    assert [size_class(n) for n in (0, 1, 4095, 4096, 8191, 1 << 20)] == [0, 1, 12, 13, 13, 21]
    assert size_label(13) == "4KiB-8KiB"
    assert size_label(0) == "0B" and size_label(-1) == "none"


def test_since_is_exact_for_counts_and_moved_extremes() -> None:
    before = Stats(10, 100, 1000, 50, 200, {5: 8, 7: 2})
    after = Stats(15, 150, 3000, 50, 900, {5: 10, 7: 2, 9: 3})
    delta = after.since(before)
    assert (delta.count, delta.bytes, delta.total_ns) == (5, 50, 2000)
    assert delta.hist == {5: 2, 9: 3}
    assert delta.max_ns == 900  # a new maximum: exact
    # unchanged minimum: the lowest bucket of the delta (2^5 = 32) or the overall minimum, if higher
    assert delta.min_ns == 50


def record_line(pid: int, t: float, count: int, final: bool = False) -> str:
    return json.dumps({"pid": pid, "t": t, "wall": 0.0, "final": final, "paths": ["", "/scratch"],
                       "cells": [[1, 1, 13, count, count * 4096, count * 1000, 900, 1100, {"9": count}]]})


def test_record_parsing_and_stage_window() -> None:
    record = parse_record(record_line(7, 10.0, 5))
    assert record.cells[("/scratch", "write", 13)].bytes == 5 * 4096
    records = {7: [parse_record(record_line(7, t, n)) for t, n in ((10.0, 5), (11.0, 20), (12.0, 50))],
               8: [parse_record(record_line(8, 11.5, 3, final=True))]}
    total, frames = stage_calls(records, start=10.5, stop=12.0, interval_s=0.5)
    assert total[("/scratch", "write", 13)].count == 45 + 3
    assert [sum(s.count for s in cells.values()) for _t, cells in frames] == [15, 3, 30]


def test_bpftrace_json_output() -> None:
    lines = [
        '{"type": "attached_probes", "data": {"probes": 9}}',
        '{"type": "printf", "data": "ready 1000000000\\n"}',
        '{"type": "printf", "data": "frame 2000000000\\n"}',
        '{"type": "map", "data": {"@n": {"1,13,9": 10, "4,-1,20": 2}}}',
        '{"type": "map", "data": {"@b": {"1,13": 40960}}}',
        '{"type": "map", "data": {"@t": {"1,13": 10000, "4,-1": 3000000}}}',
        '{"type": "map", "data": {"@mn": {"4,-1": 1000000}}}',
        '{"type": "map", "data": {"@mx": {"4,-1": 2000000}}}',
        '{"type": "printf", "data": "final 3000000000\\n"}',
        '{"type": "map", "data": {"@n": {"1,13,9": 25, "4,-1,20": 2}}}',
        '{"type": "map", "data": {"@b": {"1,13": 102400}}}',
        '{"type": "map", "data": {"@t": {"1,13": 30000, "4,-1": 3000000}}}',
        '{"type": "map", "data": {"@mn": {"4,-1": 1000000}}}',
        '{"type": "map", "data": {"@mx": {"4,-1": 2000000}}}',
        '{"type": "map", "data": {"@dt": 12}}',
    ]
    frames = parse_output(lines)
    assert [t for t, _c, _dt in frames] == [2.0, 3.0]
    write = frames[0][1][("", "write", 13)]
    # writes carry no exact extremes (too dear per call): the histogram bucket [512, 1024) bounds them
    assert (write.count, write.bytes, write.min_ns, write.max_ns, write.hist) == (10, 40960, 512, 1023, {9: 10})
    fsync = frames[0][1][("", "fsync", -1)]
    assert (fsync.count, fsync.min_ns, fsync.max_ns) == (2, 1_000_000, 2_000_000)
    total, per_frame, throttle = frames_to_calls(frames, start=1.0, stop=3.0)
    assert total[("", "write", 13)].count == 25
    assert [sum(s.count for s in c.values()) for _t, c in per_frame] == [12, 15]
    assert [t for t, _c in per_frame] == [0.0, 1.0]
    assert throttle == 12.0
    calls = calls_dict("ebpf", total, per_frame, filter_text="t", duration_s=2.0, interval_s=1.0,
                       dirty_throttle_ms=throttle, path_attribution=False)
    assert by_call(calls)["write"]["count"] == 25 and calls["dirty_throttle_ms"] == 12.0
    assert calls["path_attribution"] is False


def test_bpftrace_script_follows_the_tree() -> None:
    script = build_script([42, 7], 0.5)
    assert "@track[7] = 1; @track[42] = 1;" in script
    assert "sched_process_fork /@track[pid]/" in script
    assert "writeback:balance_dirty_pages" in script
    assert "interval:ms:500" in script
    assert "sys_exit_pwrite64" in script and "sys_enter_fdatasync" in script


def test_record_is_frozen() -> None:
    record = Record(1, 0.0, False, {})
    with pytest.raises(AttributeError):
        record.pid = 2  # type: ignore[misc]


def test_a_state_closes_on_done_and_a_window_starts_from_its_base() -> None:
    from profiling.probes.bpftrace import FrameParser

    parser = FrameParser()
    lines = [
        '{"type": "printf", "data": "frame 1000000000\\n"}',
        '{"type": "map", "data": {"@n": {"1,13,9": 10}}}',
        '{"type": "map", "data": {"@b": {"1,13": 40960}}}',
        '{"type": "map", "data": {"@dt": 5}}',
        '{"type": "printf", "data": "done\\n"}',
    ]
    assert [parser.feed(line) for line in lines[:-1]] == [[], [], [], []]
    (base,) = parser.feed(lines[-1])  # complete at "done", not one tick later at the next marker
    later = [line.replace("1000000000", "2000000000").replace(": 10}", ": 25}").replace("40960", "102400")
             .replace('"@dt": 5', '"@dt": 7') for line in lines]
    (end,) = [f for line in later for f in parser.feed(line)]
    total, per_frame, throttle = frames_to_calls([end], start=1.0, stop=2.0, base=base)
    assert (total[("", "write", 13)].count, total[("", "write", 13)].bytes) == (15, 61440)
    assert throttle == 2.0 and [sum(s.count for s in c.values()) for _t, c in per_frame] == [15]


def test_merge_keeps_the_first_probe_and_nests_the_others() -> None:
    from profiling.probes.callstats import merge_results

    ebpf = {"probe": "ebpf", "calls": {"write": {"count": 3}}, "path_attribution": False}
    interpose = {"probe": "interpose", "by_path": {"/scratch/in": {"write": {"count": 2}}}}
    calls, name = merge_results([("ebpf", ebpf), ("interpose", interpose)])
    assert name == "ebpf" and calls is not None
    assert by_call(calls) == by_call(ebpf) and calls["interpose"] == interpose
    assert "interpose" not in ebpf  # the probe's own dict is not modified
    assert merge_results([("ebpf", {}), ("interpose", interpose)]) == (interpose, "interpose")
    assert merge_results([]) == (None, None)


def test_the_probe_modules_import_one_way() -> None:
    """callstats and procfs import no probe; the probes import no factory; only the package picks probes."""
    import ast
    from pathlib import Path

    probes = Path(__file__).resolve().parents[2] / "profiling" / "probes"

    def imports(name: str) -> set[str]:
        tree = ast.parse((probes / f"{name}.py").read_text())
        found = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        return {m for m in found if m.startswith("profiling.probes")}

    assert imports("callstats") == set() and imports("procfs") == set()
    assert imports("bpftrace") == {"profiling.probes.callstats"}
    assert imports("interpose") == {"profiling.probes.callstats"}
    assert imports("ebpf") == {"profiling.probes.bpftrace", "profiling.probes.callstats", "profiling.probes.procfs"}
