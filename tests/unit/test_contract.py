"""Contracts: parsing (errors name line and field), evaluation per time frame, procfs fallback, EMF."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest

from profiling.contract import (
    LATENCY_UNAVAILABLE,
    PATHS_UNAVAILABLE,
    ContractError,
    contract_metrics,
    evaluate_stage,
    format_results,
    load_contract,
    parse_contract,
    rule_matches,
)
from profiling.emf import serialize
from profiling.metrics import StageProfile
from profiling.probes.callstats import Stats, calls_dict

CONTRACTS = Path(__file__).resolve().parents[2] / "contracts"
CASE_STUDY = """2,monitortimeframe,1000s
mean_lat_write,/,write,all,mean-latency,1us
num_write,/,write,all,count,1
total_write,/,write,all,bandwidth,1B
"""


def test_case_study_contract_ships_exactly() -> None:
    assert (CONTRACTS / "case-study.contract").read_text() == CASE_STUDY
    contract = load_contract(CONTRACTS / "case-study.contract")
    assert contract.timeframe_s == 1000
    assert [(r.label, r.path, r.call, r.measurement, r.threshold, r.unit) for r in contract.rules] == [
        ("mean_lat_write", "/", "write", "mean-latency", 1, "us"),
        ("num_write", "/", "write", "count", 1, ""),
        ("total_write", "/", "write", "bandwidth", 1, "B"),
    ]


@pytest.mark.parametrize("path", sorted(CONTRACTS.glob("*.contract")), ids=lambda p: p.name)
def test_shipped_contracts_parse(path: Path) -> None:
    assert load_contract(path).rules


def test_units_and_ranges() -> None:
    contract = parse_contract(
        "# comment\n\n2,monitortimeframe,2m\n"
        "a,/scratch,read,4kB-1MB,count,2k\n"
        "b,/,fsync,all,max-latency,10ms\n"
        "c,/,all,0-4kB,bandwidth,1MB\n"
    )
    a, b, c = contract.rules
    assert contract.timeframe_s == 120
    assert (a.size_low, a.size_high, a.threshold, a.unit) == (4096, 1 << 20, 2000, "")
    assert (b.threshold, b.unit, b.emf_unit) == (10, "ms", "Milliseconds")
    assert (c.size_low, c.size_high, c.emf_unit) == (0, 4096, "Megabytes")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "<contract>:1: header ''"),
        ("3,monitortimeframe,1s\na,/,write,all,count,1", "<contract>:1: version '3'"),
        ("2,timeframe,1s\na,/,write,all,count,1", "<contract>:1: header keyword 'timeframe'"),
        ("2,monitortimeframe,10 parsecs\na,/,write,all,count,1", "<contract>:1: time frame '10 parsecs'"),
        ("2,monitortimeframe,1s", "rules ''"),
        ("2,monitortimeframe,1s\na,/,write,all,count", "<contract>:2: rule"),
        ("2,monitortimeframe,1s\n1a,/,write,all,count,1", "<contract>:2: LABEL '1a'"),
        ("2,monitortimeframe,1s\na,/,write,all,count,1\na,/,read,all,count,1", "<contract>:3: LABEL 'a'"),
        ("2,monitortimeframe,1s\na,scratch,write,all,count,1", "<contract>:2: PATH 'scratch'"),
        ("2,monitortimeframe,1s\na,/,mmap,all,count,1", "<contract>:2: CALLTYPE 'mmap'"),
        ("2,monitortimeframe,1s\na,/,write,big,count,1", "<contract>:2: SIZERANGE 'big'"),
        ("2,monitortimeframe,1s\na,/,write,1MB-4kB,count,1", "<contract>:2: SIZERANGE '1MB-4kB'"),
        ("2,monitortimeframe,1s\na,/,write,all,median,1", "<contract>:2: MEASUREMENT 'median'"),
        ("2,monitortimeframe,1s\na,/,write,all,mean-latency,1B", "<contract>:2: THRESHOLD '1B'"),
        ("2,monitortimeframe,1s\na,/,write,all,bandwidth,1us", "<contract>:2: THRESHOLD '1us'"),
        ("2,monitortimeframe,1s\na,/,write,all,count,1kB", "<contract>:2: THRESHOLD '1kB'"),
        ("2,monitortimeframe,1s\na,/,write,0-" + "9" * 400 + "B,count,1", "<contract>:2: SIZERANGE"),
    ],
)
def test_malformed_contract_names_line_and_field(text: str, message: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_contract(text)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_rule_matching_by_path_and_size() -> None:
    contract = parse_contract("2,monitortimeframe,1s\na,/scratch/in,write,4kB-1MB,count,1\nb,/,all,all,count,1\n")
    a, b = contract.rules
    assert rule_matches(a, "/scratch/in", "write", 13)  # [4096, 8192)
    assert rule_matches(a, "/scratch/in/x", "write", 20)  # [512 KiB, 1 MiB)
    assert not rule_matches(a, "/scratch/inbox", "write", 13)
    assert not rule_matches(a, "/scratch/in", "write", 12)  # [2048, 4096)
    assert not rule_matches(a, "/scratch/in", "write", 21)  # [1 MiB, 2 MiB)
    assert not rule_matches(a, "/scratch/in", "read", 13)
    assert rule_matches(b, "", "fsync", -1)  # "/" is every call, sockets included


def profile_with(calls: dict[str, Any] | None, duration: float = 30.0, *, write_calls: int = 0,
                 write_bytes: int = 0, read_calls: int = 0, read_bytes: int = 0) -> StageProfile:
    return StageProfile(stage="download", outcome="ok", started_at=time.time() - duration, duration_s=duration,
                        calls=calls, write_calls=write_calls, write_bytes=write_bytes, read_calls=read_calls,
                        read_bytes=read_bytes)


def writes(count: int, size_class: int, mean_ns: int, path: str = "/scratch/in") -> dict[tuple[str, str, int], Stats]:
    nbytes = count * (1 << (size_class - 1))
    return {(path, "write", size_class): Stats(count, nbytes, count * mean_ns, mean_ns // 2, mean_ns * 3,
                                               {mean_ns.bit_length() - 1: count})}


def test_case_study_from_probe_figures() -> None:
    cells = writes(1000, 13, 5000)
    calls = calls_dict("ebpf", cells, [(0.0, cells)], filter_text="t", duration_s=30, interval_s=1.0)
    results = evaluate_stage(parse_contract(CASE_STUDY), profile_with(calls))
    assert [(r["label"], r["value"], r["unit"], r["frame"], r["source"]) for r in results] == [
        ("mean_lat_write", 5.0, "us", 0, "ebpf"),
        ("num_write", 1000.0, "calls", 0, "ebpf"),
        ("total_write", 4096000.0, "B", 0, "ebpf"),
    ]
    lines = format_results(results)
    assert lines[0].startswith("mean_lat_write") and "5 us" in lines[0]


def test_time_frames_and_threshold_filter() -> None:
    busy = writes(3000, 13, 2000)
    idle = writes(10, 13, 2000)
    frames = [(0.0, busy), (1.0, idle), (2.5, busy)]  # interval frames; contract frames of 1 s
    total: dict[tuple[str, str, int], Stats] = {}
    for _t, cells in frames:
        for key, stats in cells.items():
            total.setdefault(key, Stats()).add(stats)
    calls = calls_dict("interpose", total, frames, filter_text="t", duration_s=3.0, interval_s=0.5)
    contract = parse_contract("2,monitortimeframe,1s\nmany,/,write,all,count,1k\n")
    results = evaluate_stage(contract, profile_with(calls, duration=3.0))
    assert [(r["frame"], r["value"], r["start_s"], r["end_s"]) for r in results] == [
        (0, 3000.0, 0.0, 1.0),
        (2, 3000.0, 2.0, 3.0),
    ]  # frame 1 (10 writes) is below the 1k threshold: not reported


def test_procfs_fallback_without_a_probe() -> None:
    profile = profile_with(None, write_calls=1234, write_bytes=5_000_000, read_calls=7, read_bytes=70)
    results = evaluate_stage(parse_contract(CASE_STUDY), profile)
    by_label = {r["label"]: r for r in results}
    assert by_label["num_write"]["value"] == 1234
    assert by_label["total_write"]["value"] == 5_000_000
    assert by_label["num_write"]["source"] == "procfs"
    assert by_label["mean_lat_write"]["value"] is None
    assert by_label["mean_lat_write"]["note"] == LATENCY_UNAVAILABLE
    assert "unavailable (static binary, no eBPF)" in format_results(results)[0]


def test_procfs_fallback_cannot_answer_paths_or_sizes() -> None:
    contract = parse_contract("2,monitortimeframe,1s\na,/scratch,write,all,count,1\nb,/,fsync,all,count,1\n")
    results = evaluate_stage(contract, profile_with(None, write_calls=5))
    assert [r["value"] for r in results] == [None, None]
    assert all("per-call probe" in r["note"] for r in results)


def test_contract_values_in_the_stage_emf_document() -> None:
    profile = profile_with(None, write_calls=1234, write_bytes=5_000_000)
    results = evaluate_stage(parse_contract(CASE_STUDY), profile)
    profile = dataclasses.replace(profile, contract=results)
    (line,) = serialize(profile, namespace="IoBatchTest")
    doc = json.loads(line)
    directive = doc["_aws"]["CloudWatchMetrics"][0]
    assert directive["Namespace"] == "IoBatchTest"
    assert directive["Dimensions"] == [["Pipeline", "Stage"]]
    units = {m["Name"]: m["Unit"] for m in directive["Metrics"]}
    assert units["num_write"] == "Count" and units["total_write"] == "Bytes"
    assert "mean_lat_write" not in units  # no value without a probe: not a metric, only a row
    assert doc["Stage"] == "download"
    assert doc["num_write"] == 1234.0 and doc["total_write"] == 5_000_000.0
    assert [row["label"] for row in doc["Contract"]] == ["mean_lat_write", "num_write", "total_write"]
    assert contract_metrics(results) == [("num_write", 1234.0, "Count"), ("total_write", 5_000_000.0, "Bytes")]


def test_label_may_not_shadow_a_stage_metric() -> None:
    with pytest.raises(ContractError, match="LABEL 'WriteBytes'"):
        parse_contract("2,monitortimeframe,1s\nWriteBytes,/,write,all,count,1\n")


def test_path_rules_use_the_interposer_kept_beside_ebpf() -> None:
    contract = parse_contract("2,monitortimeframe,1000s\nscratch_writes,/scratch,write,all,count,1\n")
    everything = writes(50, 13, 3000, path="")
    main = calls_dict("ebpf", everything, [(0.0, everything)], filter_text="t", duration_s=5, interval_s=1.0,
                      path_attribution=False)
    alone = evaluate_stage(contract, profile_with(main, duration=5.0))
    assert [(r["value"], r["note"]) for r in alone] == [(None, PATHS_UNAVAILABLE.format(probe="ebpf"))]
    on_scratch = writes(20, 13, 3000, path="/scratch/in")
    beside = calls_dict("interpose", on_scratch, [(0.0, on_scratch)], filter_text="t", duration_s=5,
                        interval_s=1.0)
    merged = evaluate_stage(contract, profile_with({**main, "interpose": beside}, duration=5.0))
    assert [(r["label"], r["value"], r["source"]) for r in merged] == [("scratch_writes", 20.0, "interpose")]


def test_a_contract_at_the_caps_fits_cloudwatch_events_and_reads_back() -> None:
    """100 rules x 100 frames, every one over its threshold: each EMF document stays within what the awslogs
    driver ships as one event, every value is a metric, and the rows that fit are in the first document."""
    from profiling.contract import MAX_FRAMES, MAX_RULES
    from profiling.emf import MAX_EVENT_BYTES, merge_documents, profiles_from_emf

    frames = [(float(second), writes(100, 13, 2000)) for second in range(MAX_FRAMES)]
    total: dict[tuple[str, str, int], Stats] = {}
    for _t, cells in frames:
        for key, stats in cells.items():
            total.setdefault(key, Stats()).add(stats)
    calls = calls_dict("ebpf", total, frames, filter_text="t", duration_s=MAX_FRAMES, interval_s=1.0)
    rules = "".join(f"rule_{i:03d}_with_a_longish_label,/,write,all,count,1\n" for i in range(MAX_RULES))
    profile = profile_with(calls, duration=float(MAX_FRAMES))
    results = evaluate_stage(parse_contract("2,monitortimeframe,1s\n" + rules), profile)
    assert len(results) == MAX_RULES * MAX_FRAMES
    lines = serialize(dataclasses.replace(profile, contract=results))
    assert all(len(line.encode()) <= MAX_EVENT_BYTES for line in lines)
    docs = [json.loads(line) for line in lines]
    assert len(docs) == 2 and all("Contract" not in doc for doc in docs[1:])
    assert docs[1]["Notices"] == docs[0]["Notices"]
    kept = len(docs[0]["Contract"])
    assert 0 < kept < len(results)
    assert f"contract rows: {kept} of {len(results)}" in " ".join(docs[0]["Notices"])
    (back,) = profiles_from_emf(docs, namespace=None)
    assert len(back.contract) == kept
    # The metrics carry every rule's value in every frame.
    (merged,) = merge_documents(docs)
    assert all(merged[f"rule_{i:03d}_with_a_longish_label"] == [100.0] * MAX_FRAMES for i in range(MAX_RULES))
