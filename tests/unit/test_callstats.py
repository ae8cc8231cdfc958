"""Per-call figures: deltas of cumulative counters, record parsing, merging probes."""

from __future__ import annotations

import json

import pytest

from profiling.metrics import by_call
from profiling.probes.callstats import Stats, size_class, size_label
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


def test_record_is_frozen() -> None:
    record = Record(1, 0.0, False, {})
    with pytest.raises(AttributeError):
        record.pid = 2  # type: ignore[misc]


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
    assert imports("libbpf") == set() and imports("cgroup") == set()
    assert imports("ebpf_maps") == {"profiling.probes.callstats"}
    assert imports("interpose") == {"profiling.probes.callstats"}
    assert imports("ebpf") == {"profiling.probes.callstats", "profiling.probes.cgroup",
                               "profiling.probes.ebpf_host", "profiling.probes.ebpf_maps", "profiling.probes.libbpf",
                               "profiling.probes.procfs"}
    assert imports("ebpf_host") == {"profiling.probes.ebpf_private", "profiling.probes.ebpf_maps",
                                    "profiling.probes.libbpf", "profiling.probes.ebpf_slot"}
    assert imports("ebpf_slot") == {"profiling.probes.ebpf_maps", "profiling.probes.libbpf"}
    assert imports("ebpf_private") == {"profiling.probes.ebpf_slot", "profiling.probes.libbpf"}
