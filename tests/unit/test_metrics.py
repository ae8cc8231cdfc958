from __future__ import annotations

import pytest

from profiling.metrics import (
    METRICS,
    METRICS_BY_NAME,
    TABLE_METRICS,
    Aggregate,
    MetricSpec,
    Scope,
    StageProfile,
    summarize,
    to_metrics,
)


def _profile(stage: str = "download", **kw: object) -> StageProfile:
    base: dict[str, object] = {"stage": stage, "outcome": "ok", "started_at": 1.0, "duration_s": 2.0}
    base.update(kw)
    return StageProfile(**base)  # type: ignore[arg-type]


def test_every_metric_reads_a_profile_attribute_with_a_cloudwatch_unit() -> None:
    from aws_embedded_metrics.unit import Unit

    profile = _profile()
    for spec in METRICS:
        assert hasattr(profile, spec.field), spec.name
        assert spec.unit in Unit, spec.unit
    assert set(TABLE_METRICS) <= set(METRICS_BY_NAME)
    assert len({m.name for m in METRICS}) == len(METRICS)


def test_throughput_is_bytes_moved_over_wall_time() -> None:
    profile = _profile(read_bytes=100, write_bytes=300, duration_s=2.0)
    assert profile.throughput_bps == 150.0
    assert _profile(duration_s=0.0).throughput_bps is None


def test_write_call_latency_comes_from_the_per_call_probe() -> None:
    calls = {"probe": "ebpf", "calls": {"write": {"count": 4, "mean_us": 12.5}}}
    assert _profile(calls=calls).write_call_latency_us == 12.5
    assert _profile(calls={"calls": {"write": {"count": 0, "mean_us": None}}}).write_call_latency_us is None
    assert _profile().write_call_latency_us is None
    assert ("WriteCallLatency", 12.5, "Microseconds") in to_metrics(_profile(calls=calls))


def test_profile_json_round_trips() -> None:
    calls = {"probe": "ebpf", "calls": {"write": {"count": 1, "mean_us": 3.0}}}
    profile = _profile(items=5, device="loop0", device_write_latency_ms=1.5, calls=calls,
                       properties={"JobId": "j:1"})
    assert StageProfile.from_dict(profile.to_dict()) == profile
    with pytest.raises(ValueError, match="schema"):
        StageProfile.from_dict({**profile.to_dict(), "schema": 99})


def test_summary_takes_medians_of_rates_and_totals_of_bytes() -> None:
    profiles = [_profile(duration_s=d, write_bytes=b) for d, b in ((1.0, 10), (2.0, 20), (9.0, 30))]
    row = summarize(profiles)["download"]
    assert row["children"] == 3
    assert row["StageDuration"] == 2.0
    assert row["WriteBytes"] == 60


def test_every_metric_says_how_it_aggregates_across_children() -> None:
    for spec in METRICS:
        assert isinstance(spec.aggregate, Aggregate), spec.name
    # Totals of each child's own bytes, calls and images; the device's and the host's figures are shared by
    # the children on them, so their largest is taken, never their sum (two children would count it twice).
    assert {m.name for m in METRICS if m.aggregate is Aggregate.SUM} == {
        "ReadBytes", "WriteBytes", "ReadCalls", "WriteCalls", "Items", "StorageReadBytes", "StorageWriteBytes",
        "OwnDeviceReadBytes", "OwnDeviceWriteBytes", "NetworkSentBytes", "NetworkReceivedBytes"}
    assert {m.name for m in METRICS if m.aggregate is Aggregate.MAX} == {
        "PeakDirtyBytes", "PeakWritebackBytes", "DirtyThresholdBytes", "DeviceReadBytes", "DeviceWriteBytes",
        "DeviceReadOps", "DeviceWriteOps", "DeviceSharers", "OwnPeakDirtyBytes", "OwnPeakWritebackBytes",
        "HostNetworkSentBytes", "HostNetworkReceivedBytes"}


def test_every_metric_has_a_scope_and_shared_ones_are_never_summed() -> None:
    shared = {m.name for m in METRICS if m.scope.shared}
    assert {"DeviceWriteBytes", "DeviceQueueDepth", "PeakDirtyBytes", "IoStallSome", "HostNetworkSentBytes"} <= shared
    assert not {"ReadBytes", "OwnDeviceWriteBytes", "NetworkSentBytes", "DirtyThrottle"} & shared
    assert all(m.aggregate is not Aggregate.SUM for m in METRICS if m.scope.shared)
    with pytest.raises(ValueError, match="device-wide"):
        MetricSpec("X", "Bytes", "x", "x", Aggregate.SUM, scope=Scope.DEVICE)
    by_name = {m.name: m for m in METRICS}
    assert by_name["DeviceWriteBytes"].scoped_label.endswith("[device]")
    assert by_name["IoStallSome"].scoped_label.endswith("[host]")
    assert by_name["OwnDeviceWriteBytes"].scoped_label == by_name["OwnDeviceWriteBytes"].label


def test_two_children_on_one_device_count_its_bytes_once() -> None:
    # Both saw the device move 500 bytes while they ran side by side; each moved its own share.
    profiles = [_profile(device_write_bytes=500, own_device_write_bytes=own, device_sharers=2)
                for own in (100, 400)]
    row = summarize(profiles)["download"]
    assert row["DeviceWriteBytes"] == 500 and row["OwnDeviceWriteBytes"] == 500 and row["DeviceSharers"] == 2


def test_summary_follows_each_metrics_aggregation() -> None:
    # Three children with distinct values for every field: sum, max and median all differ.
    fields = {spec.field for spec in METRICS} - {"throughput_bps"}
    profiles = [_profile(duration_s=d, read_bytes=r, **{f: n * k for f in fields - {"duration_s", "read_bytes"}})
                for n, (d, r, k) in enumerate(((1.0, 10, 1), (2.0, 40, 5), (9.0, 20, 2)), start=1)]
    row = summarize(profiles)["download"]
    for spec in METRICS:
        values = sorted(v for v in (p.value(spec) for p in profiles) if v is not None)
        expected = {Aggregate.SUM: sum(values), Aggregate.MAX: values[-1], Aggregate.MEDIAN: values[1]}
        assert row[spec.name] == pytest.approx(expected[spec.aggregate]), spec.name
    assert summarize([_profile()])["download"]["DeviceWriteLatency"] is None
