"""The advisor's named findings: each one fires on a workload that has the problem and stays quiet on a
clean one. Profiles are StageProfile (the sidecar's own type); per-call figures come from the probes'
own builder (profiling.probes.callstats.calls_dict)."""

from __future__ import annotations

import dataclasses

import pytest

from profiling.metrics import StageProfile
from profiling.probes.callstats import NO_SIZE, Stats, calls_dict
from tests.support.profiles import IMAGE, batch, child
from tuning.advise import advise
from tuning.ebs import GIB, Volume
from tuning.findings import CHECKS, Finding, find
from tuning.host import HostTuning
from tuning.plan import Plan

PLAN = Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=40)


def codes(profiles: list[StageProfile], plan: Plan = PLAN) -> dict[str, Finding]:
    return {f.code: f for f in advise(profiles, plan).findings}


def test_a_clean_workload_has_only_the_cpu_bound_note() -> None:
    assert set(codes(batch())) == {"STAGE_CPU_BOUND"}


def test_findings_are_priced_and_json_shaped() -> None:
    found = advise(batch(device_utilization_pct=99.0, io_stall_some_ms=9_000.0), PLAN).to_dict()["findings"]
    assert found, "a saturated device is a finding"
    for item in found:
        assert set(item) == {"code", "severity", "title", "evidence", "fix", "cost_s_per_child",
                             "cost_usd_per_month", "context", "stage", "what_if"}
    sat = next(f for f in found if f["code"] == "DEVICE_SATURATED")
    assert sat["cost_s_per_child"] == 9.0
    # 9 s per child x 10 rounds a day x 30 days x 0.384 USD/h / 3600.
    assert sat["cost_usd_per_month"] == pytest.approx(9 * 10 * 30 * 0.384 / 3600, abs=0.01)


def test_dirty_pause_from_ebpf_and_from_dirty_levels() -> None:
    paused = codes(batch(dirty_throttle_ms=4_000.0))["DIRTY_PAUSE"]
    assert paused.cost_s_per_child == 4.0 and "dirtyBytes" in paused.context
    at_limit = codes(batch(images=40, peak_dirty_bytes=int(3.5 * GIB)))  # 1.3 s per child
    assert "DIRTY_PAUSE" in at_limit
    # At the limit with 5 images a child the simulated download loses nothing: a 0 s finding is no finding.
    assert "DIRTY_PAUSE" not in codes(batch(peak_dirty_bytes=int(3.5 * GIB)))
    assert "DIRTY_PAUSE" not in codes(batch(dirty_throttle_ms=10.0))


def test_credits_running_out_within_the_day() -> None:
    heavy = Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=400, current_volume=Volume("st1", 125))
    found = codes(batch(images=400), heavy)["BURST_CREDITS"]  # 10 GiB a job: a day's credits gone, few steps
    assert found.cost_s_per_child is not None and found.cost_s_per_child > 0
    assert "BURST_CREDITS" not in codes(batch(images=40))  # 40 jobs a day on the default 500 GiB st1


def test_small_random_io_on_st1() -> None:
    random = dataclasses.replace(PLAN, random_pct=80)
    found = codes(batch(device_write_ops=5 * IMAGE // (64 * 1024)), random)["HDD_RANDOM_IO"]
    assert found.context["volumeType"] == "gp3" and (found.cost_s_per_child or 0) > 0
    assert "HDD_RANDOM_IO" not in codes(batch(device_write_ops=5 * IMAGE // (64 * 1024)))  # sequential
    on_gp3 = dataclasses.replace(random, current_volume=Volume("gp3", 500))
    assert "HDD_RANDOM_IO" not in codes(batch(device_write_ops=5 * IMAGE // (64 * 1024)), on_gp3)


def test_device_saturated_by_utilisation_or_queue() -> None:
    assert "DEVICE_SATURATED" in codes(batch(device_utilization_pct=97.0, stall_ms=2_000.0))
    assert "DEVICE_SATURATED" in codes(batch(device_queue_depth=12.0, stall_ms=2_000.0))
    # 0.3 s of io stall per child of 24.5 s is under the floor: not worth a change.
    assert "DEVICE_SATURATED" not in codes(batch(device_utilization_pct=97.0))


def test_io_bound_stage() -> None:
    found = codes(batch(io_stall_some_ms=10_000.0))["STAGE_IO_BOUND"]
    assert found.cost_s_per_child == 10.0
    assert "STAGE_IO_BOUND" not in codes(batch())


def test_cpu_bound_needs_psi() -> None:
    no_psi = [dataclasses.replace(p, io_stall_some_ms=None) for p in batch()]
    assert "STAGE_CPU_BOUND" not in codes(no_psi)


def test_download_network_bound() -> None:
    # 125 MiB in 40 s is ~3 MiB/s, far below the volume's 122 MiB/s, with almost no io stall.
    found = codes(batch(download_s=40.0, stall_ms=200.0))["DOWNLOAD_NETWORK_BOUND"]
    assert found.cost_s_per_child == pytest.approx(40 - 125 / 122.0703125, abs=0.1)
    waits = codes(batch(download_s=40.0, stall_ms=30_000.0))
    assert "DOWNLOAD_NETWORK_BOUND" not in waits and "STAGE_IO_BOUND" in waits
    # An S3 endpoint on the host (the demo's): no network was crossed, so none is blamed.
    loopback = dataclasses.replace(PLAN, network_loopback=True)
    assert "DOWNLOAD_NETWORK_BOUND" not in codes(batch(download_s=40.0, stall_ms=200.0), loopback)


def on(volume_type: str, profiles: list[StageProfile]) -> list[StageProfile]:
    return [dataclasses.replace(p, properties={**p.properties, "VolumeType": volume_type}) for p in profiles]


def test_a_volume_the_profiles_did_not_run_on_is_a_what_if_after_the_costs_of_now() -> None:
    heavy = Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=400, current_volume=Volume("st1", 125))
    workload = batch(images=400, dirty_throttle_ms=9_000.0)
    now = advise(on("st1", workload), heavy).findings
    assert next(f for f in now if f.code == "BURST_CREDITS").what_if is None
    local = advise(on("local", workload), heavy).findings
    credits = next(f for f in local if f.code == "BURST_CREDITS")
    assert credits.what_if == "st1 125 GiB" and credits.title.startswith("if this ran on st1 125 GiB: burst")
    # A measured pause is a cost now wherever it ran; every what-if comes after every cost of now.
    assert next(f for f in local if f.code == "DIRTY_PAUSE").what_if is None
    kinds = [f.what_if is not None for f in local]
    assert kinds == sorted(kinds) and kinds[0] is False


def test_severity_follows_the_cost_and_the_costliest_comes_first() -> None:
    found = [f for f in advise(batch(dirty_throttle_ms=9_000.0, device_utilization_pct=99.0, stall_ms=2_000.0),
                               PLAN).findings if f.cost_s_per_child is not None]
    costs = [f.cost_s_per_child or 0.0 for f in found]
    assert costs == sorted(costs, reverse=True) and found[0].code == "DIRTY_PAUSE"
    child_s = 1.5 + 20 + 3
    for f in found:
        share = (f.cost_s_per_child or 0.0) / child_s
        assert f.severity == ("high" if share >= 0.25 else "medium" if share >= 0.05 else "low"), f


def test_scratch_smaller_than_the_childrens_images() -> None:
    big = batch(images=2_000)  # 50 GiB per child, 4 per instance, on 125 GiB
    small_volume = dataclasses.replace(PLAN, current_volume=Volume("st1", 125))
    found = codes(big, small_volume)["SCRATCH_TOO_SMALL"]
    assert int(found.context["volumeSizeGiB"]) >= 4 * 2_000 * 25 * 2 // 1024
    assert "SCRATCH_TOO_SMALL" not in codes(big)  # 500 GiB holds 4 x 50 GiB


def test_stragglers_from_the_bad_apple_test() -> None:
    profiles = batch(8)
    slow = child(99, download_s=60.0)
    found = codes(profiles + slow)["STRAGGLERS"]
    assert "99" in found.evidence and found.cost_s_per_child == pytest.approx(58.5)
    assert "STRAGGLERS" not in codes(profiles)


def test_stragglers_are_judged_against_their_contemporaries() -> None:
    # Children 0 and 1 downloaded 4x slower together, before the others started (a cold start): slow against
    # the batch, but not against the children beside them. Beside the fast children, the same pair is slow.
    pair = [p for i in (0, 1) for p in child(i, download_s=6.0)]
    later = [dataclasses.replace(p, started_at=p.started_at + 10.0) for i in range(2, 12) for p in child(i)]
    assert "STRAGGLERS" not in codes(pair + later)
    beside = codes(pair + [p for i in range(2, 12) for p in child(i)])["STRAGGLERS"]
    assert "children 0, 1 ran at" in beside.evidence


def test_cache_over_the_memory_budget() -> None:
    greedy = dataclasses.replace(PLAN, current_tuning=HostTuning(dirty_ratio=60, dirty_background_ratio=30))
    found = codes(batch(), greedy)["CACHE_OVER_BUDGET"]
    assert found.cost_s_per_child is None and "not priced" in found.evidence
    assert "dirtyBytes" in found.context
    assert "CACHE_OVER_BUDGET" not in codes(batch())  # 30% of 90% of memory is under the 40% budget


def calls(call: str, count: int, total_ms: float) -> dict[str, object]:
    stats = Stats(count=count, total_ns=int(total_ms * 1e6))
    return calls_dict("ebpf", {("", call, NO_SIZE): stats}, [], filter_text="test", duration_s=12.0,
                      interval_s=1.0)


@pytest.mark.parametrize(("code", "call"), [("FSYNC_HEAVY", "fsync"), ("METADATA_HEAVY", "open")])
def test_fsync_and_metadata_heavy(code: str, call: str) -> None:
    found = codes(batch(calls=calls(call, 5_000, 6_000.0)))[code]
    assert found.cost_s_per_child == 6.0
    assert code not in codes(batch(calls=calls(call, 50, 60.0)))


def test_every_check_has_a_test() -> None:
    assert len(CHECKS) == 10
    assert find.__doc__
