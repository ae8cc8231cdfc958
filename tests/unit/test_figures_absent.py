"""No silent zeros: a figure that could not be measured is absent with a notice; counters that wrap are
read across the wrap; EMF documents the library split are read back as the one stage they are."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from profiling import emf
from profiling.contract import ContractError, parse_contract
from profiling.metrics import StageProfile
from profiling.probes.callstats import Stats
from profiling.probes.procfs import DiskStats, IoUnreadable, ProcIo, device_delta, read_tree_io
from profiling.sampler import Snapshot, build_profile


def test_a_wrapped_diskstats_time_field_gives_the_time_that_passed() -> None:
    # ms_writing, io_ticks and weighted ms are 32-bit: 2^32 - 100 ms before, 400 ms after the wrap.
    before = DiskStats(0, 0, 0, 0, 1000, 0, 8000, 2**32 - 100, 0, 2**32 - 50, 2**32 - 200)
    after = DiskStats(0, 0, 0, 0, 1010, 0, 8080, 400, 0, 450, 1800)
    figures = device_delta(before, after, 1.0)
    assert figures.write_latency_ms == pytest.approx(50.0)  # 500 ms over 10 writes, not -429,496,680
    assert figures.queue_depth == pytest.approx(2.0) and figures.utilization_pct == pytest.approx(50.0)


def _snap(t: float, io: ProcIo | None, error: str | None = None) -> Snapshot:
    return Snapshot(t, io, None, None, None, io_error=error)


def test_a_failed_baseline_leaves_the_tree_figures_absent_not_the_jobs_lifetime() -> None:
    snaps = [_snap(0.0, None, "/proc/7/io is unreadable (Permission denied)"),
             _snap(1.0, ProcIo(10_000_000, 20_000_000, 5, 9))]
    profile = build_profile(stage="download", outcome="ok", started_at=time.time() - 1, snapshots=snaps,
                            device=None)
    assert profile.read_bytes is None and profile.write_bytes is None and profile.write_calls is None
    assert profile.throughput_bps is None and "io" not in profile.sources
    assert profile.notices == ["process-tree figures are absent: /proc/7/io is unreadable (Permission denied)"]
    (doc,) = [json.loads(line) for line in emf.serialize(profile)]
    assert not {"ReadBytes", "WriteBytes", "ReadCalls", "Throughput"} & set(doc)
    (back,) = emf.profiles_from_emf([doc])
    assert back.read_bytes is None and back.notices == profile.notices


def test_a_timeline_interval_without_counters_is_a_gap_not_a_zero() -> None:
    # Read at 0, 1 and 3 s; unreadable at 2 s (a member of the tree turned unreadable for a moment); no
    # /proc/meminfo anywhere.
    snaps = [_snap(0.0, ProcIo(0, 0, 0, 0)), _snap(1.0, ProcIo(1_000_000, 2_000_000, 1, 1)),
             _snap(2.0, None, "/proc/9/io is unreadable (Permission denied)"),
             _snap(3.0, ProcIo(3_000_000, 8_000_000, 3, 3))]
    profile = build_profile(stage="download", outcome="ok", started_at=time.time() - 3, snapshots=snaps,
                            device=None)
    rates = [(p.t, p.read_bps, p.write_bps) for p in profile.timeline]
    assert rates == [(1.0, 1_000_000, 2_000_000), (2.0, None, None), (3.0, None, None)]
    assert {(p.dirty_bytes, p.writeback_bytes) for p in profile.timeline} == {(None, None)}
    assert profile.write_bytes == 8_000_000  # the stage's total: both ends were read


def test_an_unreadable_member_of_the_tree_is_an_error_not_a_zero(tmp_path: Path) -> None:
    (tmp_path / "7" / "task" / "7").mkdir(parents=True)
    (tmp_path / "7" / "task" / "7" / "children").write_text("")
    (tmp_path / "7" / "io").mkdir()  # there, but not readable as a file
    with pytest.raises(IoUnreadable, match="/7/io is unreadable"):
        read_tree_io(7, tmp_path)
    assert read_tree_io(8, tmp_path) == (None, 0)  # gone is gone


def _with_contract(frames: int) -> StageProfile:
    rows = [{"label": "mean_lat_write", "value": float(i), "unit": "us", "emf_unit": "Microseconds",
             "frame": i, "start_s": float(i), "end_s": float(i + 1), "source": "ebpf"} for i in range(frames)]
    # The stage ends now: EMF refuses a time stamp more than 14 days old.
    return StageProfile(stage="upload", outcome="ok", started_at=time.time() - frames, duration_s=float(frames),
                        read_bytes=5, write_bytes=7, contract=rows,
                        properties={"Pipeline": "iobatch", "JobId": "j:3", "ArrayIndex": "3"})


def test_a_150_frame_contract_round_trips_through_emf_to_exactly_one_stage() -> None:
    profile = _with_contract(150)
    lines = emf.serialize(profile)
    assert len(lines) == 2  # the library split the 150 values into 100 + 50
    docs = [json.loads(line) for line in lines]
    (back,) = emf.profiles_from_emf(docs)
    assert back.stage == "upload" and back.duration_s == 150.0 and back.write_bytes == 7
    assert len(back.contract) == 150
    merged = emf.merge_documents(docs)[0]
    assert merged["mean_lat_write"] == [float(i) for i in range(150)]
    # A retried attempt of the same child ends at another time: two stages, not one.
    earlier = dataclasses.replace(profile, started_at=profile.started_at - 600)
    retry = [json.loads(line) for line in emf.serialize(earlier)]
    assert len(emf.profiles_from_emf(docs + retry)) == 2 and len(retry) == 2


def test_contract_labels_are_checked_against_emfs_limits_when_parsed() -> None:
    def contract(label: str) -> str:
        return f"2,monitortimeframe,1s\n{label},/,write,all,count,1\n"

    with pytest.raises(ContractError, match="250 characters"):
        parse_contract(contract("a" * 251))
    with pytest.raises(ContractError, match="property of the EMF document"):
        parse_contract(contract("Outcome"))
    assert parse_contract(contract("a" * 250)).rules[0].label == "a" * 250


def test_a_stages_extremes_taken_from_buckets_are_labelled_bounds() -> None:
    before = Stats(10, 0, 10_000, 500, 9_000, {8: 5, 13: 5})
    exact = Stats(12, 0, 40_000, 500, 20_000, {8: 5, 13: 5, 14: 2}).since(before)  # a new maximum: measured
    assert exact.max_ns == 20_000 and exact.extremes_bound is True  # the minimum came from a bucket
    assert exact.to_dict()["extremes_bound"] is True
    fresh = Stats(2, 0, 3_000, 1_000, 2_000, {9: 1, 10: 1}).since(Stats())
    assert fresh.extremes_bound is False and "extremes_bound" not in fresh.to_dict()
