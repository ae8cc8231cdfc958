"""EMF documents built by profiling.emf through the real aws-embedded-metrics serializer."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import pytest

from profiling.emf import FileSink, RecordingSink, StreamSink, emit_profile, serialize, sink_for
from profiling.metrics import DIMENSIONS, METRICS, METRICS_BY_NAME, PROPERTY_KEYS, StageProfile
from profiling.table import profile_row, render_stage_table

pytestmark = pytest.mark.unit

# aws-embedded-metrics refuses timestamps more than 14 days old or 2 hours ahead: stages end "now".
STARTED_AT = float(int(time.time()) - 60)
PROPS = {"Pipeline": "demo", "JobId": "job-1:7", "ArrayIndex": "7", "InstanceId": "i-0abc",
         "InstanceType": "m5.large", "VolumeType": "st1"}


def _profile(**overrides: Any) -> StageProfile:
    base: dict[str, Any] = dict(
        stage="download", outcome="ok", started_at=STARTED_AT, duration_s=2.5, read_bytes=10 * 2**20,
        write_bytes=40_960_000, read_calls=12, write_calls=10_000, storage_write_bytes=40_960_000, items=5,
        device="vda", device_write_ops=300, device_write_bytes=41_000_000, device_write_latency_ms=3.5,
        device_queue_depth=1.25, device_utilization_pct=40.0, peak_dirty_bytes=30 * 2**20,
        peak_writeback_bytes=2**20, dirty_threshold_bytes=4 * 2**30, io_stall_some_ms=120.0,
        io_stall_full_ms=80.0, properties=dict(PROPS))
    base.update(overrides)
    return StageProfile(**base)


def _document(profile: StageProfile, namespace: str = "IoBatch") -> dict[str, Any]:
    lines = serialize(profile, namespace=namespace)
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    return doc


def test_document_has_the_aws_block_with_namespace_dimensions_and_timestamp() -> None:
    doc = _document(_profile(), namespace="Custom")
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Custom"
    assert directive["Dimensions"] == [list(DIMENSIONS)] == [["Pipeline", "Stage"]]
    assert doc["Pipeline"] == "demo" and doc["Stage"] == "download"
    assert doc["_aws"]["Timestamp"] == int((STARTED_AT + 2.5) * 1000)


def test_every_metric_is_in_the_spec_with_its_unit_and_value() -> None:
    profile = _profile()
    doc = _document(profile)
    metrics = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    assert metrics, "no metrics emitted"
    for entry in metrics:
        spec = METRICS_BY_NAME[entry["Name"]]
        assert entry["Unit"] == spec.unit
        assert doc[entry["Name"]] == pytest.approx(profile.value(spec))
    names = {m["Name"] for m in metrics}
    # None-valued figures (no reads on the device, no eBPF) are left out rather than sent as 0.
    assert "DeviceReadLatency" not in names and "DirtyThrottle" not in names
    assert {"StageDuration", "WriteCalls", "DeviceWriteLatency", "IoStallSome", "Throughput"} <= names
    assert [m["Name"] for m in metrics] == [s.name for s in METRICS if s.name in names]


def test_per_job_values_are_properties_never_dimensions() -> None:
    doc = _document(_profile())
    dims = {d for dset in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] for d in dset}
    assert dims.isdisjoint(PROPERTY_KEYS)
    for key in PROPERTY_KEYS:
        assert doc[key] == PROPS[key]
    assert doc["Outcome"] == "ok" and doc["Device"] == "vda"


def test_sinks(tmp_path: Path) -> None:
    recorder = RecordingSink()
    emit_profile(_profile(), recorder)
    emit_profile(_profile(stage="upload"), recorder)
    assert [json.loads(line)["Stage"] for line in recorder.lines] == ["download", "upload"]
    target = tmp_path / "emf" / "part-00000.emf"
    sink = sink_for(str(target))
    assert isinstance(sink, FileSink)
    emit_profile(_profile(), sink)
    emit_profile(_profile(stage="process"), sink)
    assert [json.loads(line)["Stage"] for line in target.read_text().splitlines()] == ["download", "process"]
    stream = io.StringIO()
    StreamSink(stream).accept('{"a":1}')
    assert stream.getvalue() == '{"a":1}\n'
    assert isinstance(sink_for("-"), StreamSink)


def test_table_renders_each_column_with_its_display_format() -> None:
    from rich.console import Console

    row = profile_row(_profile())
    assert row["WriteBytes"] == 40_960_000 and row["DeviceWriteLatency"] == 3.5
    console = Console(width=250, record=True)
    console.print(render_stage_table({"download": row, "upload": {"children": 2.0}}, "run"))
    text = console.export_text()
    assert "39.06" in text  # 40,960,000 B as MiB with two decimals
    assert "10,000" in text and "3.50" in text and "run" in text
    assert "children" in text
