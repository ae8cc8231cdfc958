"""Qualification across the fleet: the report names slow hosts before anything else and ranks the hosts beside what
their children's devices did (a host that qualified well and whose children's device fell far below is degraded),
and the advisor simulates the volume at the fleet's measured capability when it is below the model, and says so."""

from __future__ import annotations

from dataclasses import replace

from profiling.metrics import StageProfile
from profiling.qualification import QUALIFICATION_KEYS, read_qualification
from profiling.qualifyio import judge, properties
from profiling.report import ReportData, find_bad_apples, render_html
from profiling.report.hosts import host_rows
from profiling.report.sources import Entry
from tuning.advice_text import render
from tuning.advise import advise
from tuning.ebs import MIB, Volume
from tuning.measured import MeasuredVolume, fleet_capability
from tuning.plan import Plan
from tuning.qualify import expect

ST1 = Volume("st1", 500)
EXPECTED = expect(ST1).write_mibps  # 122.07


def qualified(mibps: float) -> dict[str, str]:
    record = judge({"write": {"mibps": mibps}, "read": {"mibps": mibps}}, EXPECTED, EXPECTED, 0.5)
    return properties(record)


def stage(child: int, host: str, quality: dict[str, str], busy_mibps: float, seconds: float = 20.0) -> StageProfile:
    """A download of `seconds` whose device moved `busy_mibps` while busy at 80 %."""
    moved = int(busy_mibps * MIB * seconds * 0.8)
    return StageProfile("download", "ok", 1000.0 + child, seconds, read_bytes=moved, write_bytes=moved,
                        storage_write_bytes=moved, device="xvdb", device_write_bytes=moved,
                        device_write_ops=moved // MIB, device_utilization_pct=80.0, io_stall_some_ms=100.0,
                        properties={"JobId": f"job-1:{child}", "ArrayIndex": str(child), "InstanceId": host,
                                    "VolumeType": "st1", **quality})


def fleet(hosts: dict[str, tuple[float, float]]) -> list[StageProfile]:
    """Two children a host: {host: (qualified MiB/s, its children's device MiB/s while busy)}."""
    out = []
    for n, (host, (at_boot, later)) in enumerate(hosts.items()):
        out += [stage(2 * n + k, host, qualified(at_boot), later) for k in range(2)]
    return out


def data_of(profiles: list[StageProfile]) -> ReportData:
    entries = [Entry(f"child {p.properties['ArrayIndex']}", p, p.properties["InstanceId"]) for p in profiles]
    return ReportData(entries=entries, source="test", has_timelines=False)


HOSTS = {"i-00000000000000001": (120.0, 118.0), "i-00000000000000002": (4.1, 4.0),
         "i-00000000000000003": (121.0, 12.0), "i-00000000000000004": (119.0, 117.0),
         "i-00000000000000005": (123.0, 120.0)}


def test_the_slow_host_comes_first_then_the_degraded_one_then_the_rest() -> None:
    profiles = fleet(HOSTS)
    rows = host_rows(data_of(profiles).fleet)
    assert [r.instance for r in rows][:2] == ["i-00000000000000002", "i-00000000000000003"]
    assert rows[0].slow and not rows[0].degraded and rows[1].degraded and not rows[1].slow
    assert not any(r.slow or r.degraded for r in rows[2:])
    assert rows[1].children_mibps is not None and abs(rows[1].children_mibps - 12.0) < 0.1
    apples = find_bad_apples(data_of(profiles))
    assert [(a.scope, a.name) for a in apples[:2]] == [("host", "i-00000000000000002"),
                                                       ("host", "i-00000000000000003")]
    assert apples[0].detail.startswith("qualified at 0.03x of 122.1 MiB/s")
    assert apples[1].detail.startswith("degraded: qualified at 0.99x")
    page = render_html(data_of(profiles))
    assert "id=hosts-table" in page and "Bad apples: host i-00000000000000002 (qualified at 0.03x" in page


def test_a_workload_that_moves_little_on_every_host_degrades_none() -> None:
    """Small random I/O: every host's children move a tenth of what the hosts qualified at; none is degraded."""
    rows = host_rows(data_of(fleet({f"i-0000000000000000{n}": (120.0, 12.0 + n) for n in range(1, 5)})).fleet)
    assert not any(r.degraded or r.slow for r in rows)


def test_without_qualifications_no_host_is_named() -> None:
    bare = [StageProfile("download", "ok", 0.0, 10.0, write_bytes=MIB, properties={"InstanceId": "i-0a",
                                                                                    "ArrayIndex": "0"})]
    assert all(a.scope != "host" for a in find_bad_apples(data_of(bare)))
    assert "hosts-table" not in render_html(data_of(bare))


def test_the_fleets_capability_is_the_median_host() -> None:
    capability = fleet_capability(fleet(HOSTS))
    assert capability is not None and capability.hosts == 5 and not capability.below_model
    slow_fleet = fleet({f"i-0000000000000000{n}": (70.0 + n, 70.0) for n in range(1, 4)})
    capability = fleet_capability(slow_fleet)
    assert capability is not None and capability.below_model
    assert abs(capability.share - 72 / EXPECTED) < 1e-3 and capability.expected_mibps == round(EXPECTED, 1)


def test_the_advisor_simulates_the_measured_volume_at_the_fleets_share_and_says_so() -> None:
    # A plan the volume holds back (2 GiB of memory: little write cache), on profiles of hosts at half the model.
    plan = Plan(jobs_per_instance=2, memory_gib=2, jobs_per_day=2000, current_volume=ST1)
    candidates = [Volume("st1", 500), Volume("gp3", 200)]
    slow = fleet({f"i-0000000000000000{n}": (61.0, 60.0) for n in range(1, 4)})
    unqualified = [replace(p, properties={k: v for k, v in p.properties.items() if k not in QUALIFICATION_KEYS})
                   for p in slow]
    nominal = advise(unqualified, plan, candidates)
    assert not any(isinstance(c.volume, MeasuredVolume) for c in nominal.candidates)
    assert not any(n.startswith("measured:") for n in nominal.workload.notes)
    assert not any(isinstance(c.volume, MeasuredVolume) for c in advise(fleet(HOSTS), plan, candidates).candidates)
    measured = advise(slow, plan, candidates)
    [st1] = [c for c in measured.candidates if c.volume.kind == "st1"]
    [gp3] = [c for c in measured.candidates if c.volume.kind == "gp3"]
    assert isinstance(st1.volume, MeasuredVolume) and abs(st1.volume.share - 0.5) < 0.01
    assert st1.volume.label == "st1 500 GiB (measured 0.50x)" and not isinstance(gp3.volume, MeasuredVolume)
    assert st1.volume.burst_mibps == ST1.burst_mibps * st1.volume.share
    [same] = [c for c in nominal.candidates if c.volume.kind == "st1"]
    assert st1.steady_round_s > 1.2 * same.steady_round_s  # half the speed: longer rounds
    assert st1.volume.to_context() == ST1.to_context()  # deploying it is deploying the same volume
    note = next(n for n in measured.workload.notes if n.startswith("measured:"))
    assert "3 host(s) qualified their st1 scratch at a median 0.50x of the model" in note
    assert note in render(measured)
    assert read_qualification(slow[0].properties) is not None
