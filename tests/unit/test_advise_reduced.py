"""The advisor's reduced read: a run's read workers send back only ADVISOR_FIELDS of each profile
(profiling.profilefields), and the advice made of those is the advice made of the whole profiles.

The run is written by the real producer (the sidecar's profile lines) from profiles with every figure the findings
judge: device, page cache, the child's own cgroup, pauses, per-call figures, a straggler, a volume type.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from profiling import fanout, runfiles
from profiling.metrics import BY_CALL, StageProfile
from profiling.profilefields import ProfileFields
from profiling.sidecar import write_profile_line
from tests.support.fleet import write_fleet
from tests.support.profiles import batch, full_profile
from tuning.advise import advise, load_profiles
from tuning.ebs import GIB, MIB, Volume
from tuning.plan import Plan
from tuning.situation import ADVISOR_FIELDS

PLANS = (Plan(jobs_per_instance=8, memory_gib=32, jobs_per_day=500),
         Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=2400, job_memory_gib=3.5,
              kernel_release="6.1.0-18-amd64", current_volume=Volume("st1", 125)))


def _calls(fsync_us: float, count: int) -> dict[str, Any]:
    """A per-call probe's result as the sidecar keeps it: the figures per call type, and the rest it carries."""
    stats = {"count": count, "bytes": 0, "total_us": fsync_us, "mean_us": fsync_us / count, "min_us": 1.0,
             "max_us": fsync_us, "hist": {"10": count}}
    return {"probe": "ebpf", "filter": "the child's cgroup", "duration_s": 12.0,
            BY_CALL: {"fsync": stats, "open": {**stats, "total_us": 900_000.0}, "close": stats,
                      "write": {**stats, "count": 4000, "mean_us": 21.5}},
            "by_path": {"": {"fsync": stats}}, "cells": [{"path": "", "call": "fsync", "size": -1, **stats}],
            "frames": [{"t": 0.0, "cells": []}], "notes": ["a note"]}


def run_profiles() -> list[StageProfile]:
    """A batch whose advice holds findings of most kinds, each child's stages its own, with figures of every field."""
    out = []
    for p in batch(24, download_s=9.0, stall_ms=6000.0, device_random_pct=60.0, device_utilization_pct=95.0):
        i = int(p.properties["ArrayIndex"])
        slow = 9.0 if i == 17 and p.stage == "download" else 1.0
        out.append(dataclasses.replace(
            p, duration_s=p.duration_s * slow * (1 + (i % 5) / 20), started_at=p.started_at + 40.0 * (i // 8),
            own_io_stall_ms=500.0 + i, own_peak_dirty_bytes=900 * MIB, own_peak_writeback_bytes=40 * MIB,
            own_dirty_threshold_bytes=GIB, own_dirty_background_threshold_bytes=GIB // 2,
            dirty_throttle_ms=800.0 + 10 * i, dirty_throttle_thread_sum_ms=1600.0, device_sharers=4,
            device_read_ops=10 + i, device_read_bytes=MIB * i, io_stall_full_ms=50.0, net_received_bytes=3 * GIB,
            calls=_calls(3_000_000.0 + i, 200) if p.stage == "process" else None, device="nvme1n1",
            sources={"io": "procfs"}, notices=["a figure absent"],
            properties={**p.properties, "VolumeType": "st1", "JobId": f"job:{i}", "Pipeline": "demo"}))
    out.append(full_profile(outcome="failed", properties={"ArrayIndex": "99", "VolumeType": "st1"}))
    return out


def write_run(run: Path, profiles: list[StageProfile]) -> None:
    for p in profiles:
        write_profile_line(runfiles.profile_path(run, f"part-{int(p.properties['ArrayIndex']):05d}"), p)


@pytest.fixture
def two_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs of a few files read as a fleet's are: in 2 worker processes, a few files each."""
    monkeypatch.setattr(fanout, "PARALLEL_MIN_FILES", 1)
    monkeypatch.setattr(fanout, "CHUNK_FILES", 4)
    monkeypatch.setenv(fanout.READ_WORKERS_ENV, "2")


@pytest.mark.usefixtures("two_workers")
@pytest.mark.parametrize("plan", PLANS)
def test_the_advice_from_the_reduced_read_is_the_advice_from_whole_profiles(tmp_path: Path, plan: Plan) -> None:
    write_run(tmp_path, run_profiles())
    whole = list(runfiles.read_profiles(tmp_path))  # every field, timelines and all
    reduced = load_profiles([tmp_path])
    assert len(reduced) == len(whole) == 73
    expected = advise(whole, plan).to_json()
    assert advise(reduced, plan).to_json() == expected
    codes = {f["code"] for f in expected["findings"]}
    assert {"DIRTY_PAUSE", "STRAGGLERS", "FSYNC_HEAVY", "METADATA_HEAVY", "DEVICE_SATURATED"} <= codes, codes


@pytest.mark.usefixtures("two_workers")
@pytest.mark.parametrize("emf", [False, True], ids=["profiles", "emf"])
def test_a_fleet_written_by_the_sidecar_gives_the_same_advice(tmp_path: Path, emf: bool) -> None:
    write_fleet(tmp_path, 40, emf=emf)
    whole = [p for p, _ in runfiles.read_run_profiles(tmp_path, workers=1).profiles]
    assert advise(load_profiles([tmp_path]), PLANS[0]).to_json() == advise(whole, PLANS[0]).to_json()


def _other_value(name: str, value: Any) -> Any:
    """A different value of a field's kind."""
    if isinstance(value, bool) or value is None:
        return {"device": "sdz", "error": "boom"}.get(name, 7)
    if isinstance(value, int | float):
        return value * 3 + 11
    if isinstance(value, list):
        return [*value, "another"] if name == "notices" else []
    if isinstance(value, dict):
        return {"elsewhere": "x"}
    return value + "-other"


@pytest.mark.parametrize("plan", PLANS)
def test_no_field_left_out_changes_the_advice(plan: Plan) -> None:
    """Every field the workers do not send back, changed in every profile, leaves the advice as it was: a check that
    starts reading one fails here until the field is in ADVISOR_FIELDS."""
    profiles = run_profiles()
    expected = advise(profiles, plan).to_json()
    left_out = [f.name for f in dataclasses.fields(StageProfile) if f.name not in ADVISOR_FIELDS.names]
    assert "timeline" in left_out and "write_call_latency_us" in left_out

    def changed(names: list[str]) -> dict[str, Any]:
        return advise([dataclasses.replace(p, **{n: _other_value(n, getattr(p, n)) for n in names})
                       for p in profiles], plan).to_json()

    if changed(left_out) != expected:  # all at once; then the first that matters, by name
        assert [name for name in left_out if changed([name]) != expected] == []
    # Of `calls`, the figures per call type alone are read.
    trimmed = [dataclasses.replace(p, calls=p.calls and {BY_CALL: p.calls[BY_CALL]}) for p in profiles]
    assert advise(trimmed, plan).to_json() == expected


def test_a_reduced_profile_keeps_its_fields_and_defaults_the_rest(tmp_path: Path) -> None:
    profile = run_profiles()[4]  # a process stage: per-call figures
    write_run(tmp_path, [profile])
    (reduced, name), = runfiles.read_run_profiles(tmp_path, fields=ADVISOR_FIELDS, workers=1).profiles
    assert name == "part-00001"
    for field in dataclasses.fields(StageProfile):
        if field.name == "calls":
            assert reduced.calls == {BY_CALL: profile.calls[BY_CALL]} if profile.calls else None
        elif field.name in ADVISOR_FIELDS.names:
            assert getattr(reduced, field.name) == getattr(profile, field.name), field.name
        elif field.name != "write_call_latency_us":  # derived from `calls` when absent: the same here
            assert getattr(reduced, field.name) == getattr(StageProfile("x", "ok", 0.0, 0.0), field.name), field.name
    assert reduced.write_call_latency_us == 21.5


def test_a_damaged_line_is_named_by_the_reduced_read_too(tmp_path: Path) -> None:
    write_run(tmp_path, run_profiles()[:6])
    path = runfiles.profile_path(tmp_path, "part-00001")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], '{"schema": 1, "stage": "x"}', *lines[1:]]) + "\n")
    with pytest.raises(runfiles.DamagedFileError, match=rf"^{path}:2: not a profile \(the line has no 'outcome'\)"):
        runfiles.read_run_profiles(tmp_path, fields=ADVISOR_FIELDS, workers=1)


@pytest.mark.parametrize(("names", "message"), [
    (("stage", "outcome", "started_at", "duration_s", "size"), "StageProfile has no field size"),
    (("stage", "outcome", "started_at"), "cannot be built without duration_s"),
    (("stage", "outcome", "started_at", "duration_s", "stage"), "named twice"),
])
def test_profile_fields_are_checked(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ProfileFields(names)
