"""Finishing a stage: per-call figures and contract results merged into the StageProfile, in one place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from profiling.finish import contract_rules, finish_stage, load_rules
from profiling.metrics import StageProfile, by_call
from profiling.probes.callstats import Stats, calls_dict

CASE_STUDY = Path(__file__).resolve().parents[2] / "contracts" / "case-study.contract"


def profile(**fields: Any) -> StageProfile:
    return StageProfile(stage="process", outcome="ok", started_at=0.0, duration_s=2.0,
                        sources={"io": "procfs"}, **fields)


def ebpf_calls(count: int, throttle_ms: float | None = None) -> dict[str, Any]:
    cells = {("", "write", 13): Stats(count, count * 4096, count * 5000, 4000, 6000, {12: count})}
    return calls_dict("ebpf", cells, [(0.0, cells)], filter_text="t", duration_s=2.0, interval_s=1.0,
                      dirty_throttle_ms=throttle_ms, path_attribution=False)


def test_the_first_result_is_the_calls_and_names_the_source() -> None:
    interpose = {"probe": "interpose", "by_path": {"/scratch": {"write": {"count": 2}}}}
    done = finish_stage(profile(), [("ebpf", ebpf_calls(10, 1.5)), ("interpose", interpose)])
    assert done.calls is not None and by_call(done.calls)["write"]["count"] == 10
    assert done.calls["interpose"] == interpose
    assert done.sources == {"io": "procfs", "calls": "ebpf"}
    assert done.dirty_throttle_thread_sum_ms == 1.5 and done.write_call_latency_us == 5.0
    assert done.dirty_throttle_ms is None  # no wall time in this result: not the summed figure in its place


def test_dirty_pause_is_wall_time_and_the_thread_sum_says_so() -> None:
    # Eight threads paused at once for a second each, in a 2 s stage: 1 s of wall time, 8 s summed.
    calls = {**ebpf_calls(10, 8000.0), "dirty_throttle_wall_ms": 1000.0}
    done = finish_stage(profile(), [("ebpf", calls)])
    assert done.dirty_throttle_ms == 1000.0 <= done.duration_s * 1000
    assert done.dirty_throttle_thread_sum_ms == 8000.0


def test_socket_bytes_are_the_childs_network_bytes_in_place_of_the_hosts() -> None:
    calls = {**ebpf_calls(10), "socket": {"sent_bytes": 5_000_000, "received_bytes": 40_000}}
    done = finish_stage(profile(host_net_sent_bytes=9_000_000, host_net_received_bytes=9_000_000), [("ebpf", calls)])
    assert (done.net_sent_bytes, done.net_received_bytes) == (5_000_000, 40_000)
    assert done.host_net_sent_bytes is None and done.sources["network"] == "ebpf"


def test_the_devices_random_share_is_its_random_bytes_over_all_and_absent_without_requests() -> None:
    def share(seq: int, random: int) -> float | None:
        requests = {"disk": "259:0", "seq_bytes": seq, "random_bytes": random, "random_ios": random // 4096}
        return finish_stage(profile(), [("ebpf", {**ebpf_calls(1), "device_requests": requests})]).device_random_pct

    assert share(3 << 20, 1 << 20) == pytest.approx(25.0)
    assert share(0, 1 << 20) == pytest.approx(100.0)
    assert share(0, 0) is None  # no request in the window: not known, not 0
    assert finish_stage(profile(), [("ebpf", ebpf_calls(1))]).device_random_pct is None  # no disk watched


def test_no_figures_leave_the_profile_as_it_was() -> None:
    before = profile(dirty_throttle_ms=None)
    assert finish_stage(before, [("ebpf", None), ("interpose", {})]) == before
    assert finish_stage(before) == before


def test_contract_results_come_from_the_finished_profile() -> None:
    def rules(p: StageProfile) -> list[dict[str, Any]]:
        return [{"label": "n", "value": by_call(p.calls)["write"]["count"] if p.calls else None}]

    done = finish_stage(profile(), [("ebpf", ebpf_calls(7))], rules)
    assert done.contract == [{"label": "n", "value": 7}]


def test_the_shipped_contract_evaluates_through_the_default_loader() -> None:
    rules = load_rules(CASE_STUDY)
    assert rules is not None
    done = finish_stage(profile(), [("ebpf", ebpf_calls(1000))], rules)
    assert {r["label"]: r["source"] for r in done.contract} == {"mean_lat_write": "ebpf", "num_write": "ebpf",
                                                                 "total_write": "ebpf"}


def test_a_failing_evaluation_is_one_warning_with_warn_and_raises_without() -> None:
    def broken(p: StageProfile) -> list[dict[str, Any]]:
        raise KeyError("lat")

    warned: list[str] = []
    done = finish_stage(profile(), [], broken, warn=warned.append)
    assert done.contract == [] and warned == ["contract evaluation failed ('lat')"]
    with pytest.raises(KeyError):
        finish_stage(profile(), [], broken)


def test_load_rules_names_the_file(tmp_path: Path) -> None:
    assert load_rules(None) is None
    bad = tmp_path / "bad.contract"
    bad.write_text("2,monitortimeframe,1s\nx,/,write,all,lat,1us\n")
    with pytest.raises(ValueError, match=r"^contract .*bad\.contract: .*bad\.contract:2: MEASUREMENT"):
        load_rules(bad)
    with pytest.raises(ValueError, match=r"missing\.contract"):
        load_rules(tmp_path / "missing.contract", contract_rules)


def interposer_calls(count: int, size: int) -> dict[str, Any]:
    cells = {("/scratch", "write", 13): Stats(count, count * size, count * 15_000, 9000, 30_000, {13: count})}
    return calls_dict("interpose", cells, [(0.0, cells)], filter_text="t", duration_s=2.0, interval_s=1.0)


def test_an_interposer_that_missed_most_of_the_trees_bytes_does_not_speak_for_the_stage() -> None:
    # The download stage of a task with the interposer alone, as the rehearsal measured it: the job's own
    # 1,000 B through the interposer, s5cmd's 4.2 MB (a static binary) only in the kernel's counters.
    kernel = profile(write_bytes=4_224_800, write_calls=161, read_bytes=4_300_000, read_calls=375)
    done = finish_stage(kernel, [("interpose", interposer_calls(4, 250))], contract_rules(CASE_STUDY))
    assert done.calls is None and done.write_call_latency_us is None and "calls" not in done.sources
    [notice] = done.notices
    assert "saw 1,000 B of the stage's 4,224,800 B write bytes" in notice and "static binaries" in notice
    rows = {r["label"]: r for r in done.contract}
    assert (rows["total_write"]["value"], rows["total_write"]["source"]) == (4_224_800, "procfs")
    assert rows["mean_lat_write"]["value"] is None and "unavailable" in rows["mean_lat_write"]["note"]


def test_an_interposer_that_saw_the_trees_bytes_speaks_for_the_stage() -> None:
    kernel = profile(write_bytes=4_096_000 + 512, write_calls=1001)  # one small write it did not see
    done = finish_stage(kernel, [("interpose", interposer_calls(1000, 4096))])
    assert done.calls is not None and done.sources["calls"] == "interpose" and done.notices == []
    assert done.write_call_latency_us == 15.0


def test_an_interposer_beside_ebpf_that_missed_the_trees_bytes_is_left_out() -> None:
    kernel = profile(write_bytes=4_224_800, write_calls=161)
    done = finish_stage(kernel, [("ebpf", ebpf_calls(161)), ("interpose", interposer_calls(4, 250))])
    assert done.calls is not None and done.sources["calls"] == "ebpf" and "interpose" not in done.calls
    [notice] = done.notices
    assert "saw 1,000 B of the stage's 4,224,800 B write bytes" in notice
