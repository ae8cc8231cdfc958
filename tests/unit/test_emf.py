"""EMF documents built by profiling.emf through the real aws-embedded-metrics serializer."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.cli import app
from profiling.emf import (
    FileSink,
    RecordingSink,
    StreamSink,
    dimension_value_problem,
    emit_profile,
    namespace_problem,
    serialize,
    sink_for,
)
from profiling.metrics import DIMENSIONS, METRICS, METRICS_BY_NAME, PROPERTY_KEYS, StageProfile
from tests.support.cli import CliRunner
from tests.support.profiles import PROPS, STARTED_AT, full_profile


def _document(profile: StageProfile, namespace: str = "IoBatch") -> dict[str, Any]:
    lines = serialize(profile, namespace=namespace)
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert isinstance(doc, dict)
    return doc


def test_document_has_the_aws_block_with_namespace_dimensions_and_timestamp() -> None:
    doc = _document(full_profile(), namespace="Custom")
    (directive,) = doc["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == "Custom"
    assert directive["Dimensions"] == [list(DIMENSIONS)] == [["Pipeline", "Stage"]]
    assert doc["Pipeline"] == "demo" and doc["Stage"] == "download"
    assert doc["_aws"]["Timestamp"] == int((STARTED_AT + 2.5) * 1000)


def test_every_metric_is_in_the_spec_with_its_unit_and_value() -> None:
    profile = full_profile()
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
    doc = _document(full_profile())
    dims = {d for dset in doc["_aws"]["CloudWatchMetrics"][0]["Dimensions"] for d in dset}
    assert dims.isdisjoint(PROPERTY_KEYS)
    for key in PROPERTY_KEYS:
        assert doc[key] == PROPS[key]
    assert doc["Outcome"] == "ok" and doc["Device"] == "vda"


def test_sinks(tmp_path: Path) -> None:
    recorder = RecordingSink()
    emit_profile(full_profile(), recorder)
    emit_profile(full_profile(stage="upload"), recorder)
    assert [json.loads(line)["Stage"] for line in recorder.lines] == ["download", "upload"]
    target = tmp_path / "emf" / "part-00000.emf"
    sink = sink_for(str(target))
    assert isinstance(sink, FileSink)
    emit_profile(full_profile(), sink)
    emit_profile(full_profile(stage="process"), sink)
    assert [json.loads(line)["Stage"] for line in target.read_text().splitlines()] == ["download", "process"]
    stream = io.StringIO()
    StreamSink(stream).accept('{"a":1}')
    assert stream.getvalue() == '{"a":1}\n'
    assert isinstance(sink_for("-"), StreamSink)


def test_the_limits_read_without_the_library_are_the_librarys() -> None:
    from aws_embedded_metrics import constants

    from profiling import emflimits

    for name in ("MAX_METRICS_PER_EVENT", "MAX_DATAPOINTS_PER_METRIC", "MAX_DIMENSION_NAME_LENGTH"):
        assert getattr(emflimits, name) == getattr(constants, name), name


def test_the_cli_starts_without_importing_the_emf_library() -> None:
    """Its package imports aiohttp (~0.18 s): every command paid it at start-up for a few numbers."""
    import subprocess
    import sys

    code = ("import sys, pipeline.cli\n"
            "print(sorted(m for m in sys.modules if m.startswith(('aws_embedded', 'aiohttp'))))")
    shown = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert shown.strip() == "[]", shown


def _insights_fields(node: Any, prefix: str = "") -> list[str]:
    """The fields Logs Insights discovers in a JSON event, in document order: every leaf, nested keys joined by '.'
    and list items by their index."""
    if isinstance(node, dict):
        return [f for key, value in node.items() for f in _insights_fields(value, f"{prefix}{key}.")]
    if isinstance(node, list):
        return [f for i, value in enumerate(node) for f in _insights_fields(value, f"{prefix}{i}.")]
    return [prefix[:-1]]


def test_the_fields_the_dashboards_queries_read_come_within_logs_insights_first_200() -> None:
    import re

    from infra.dashboard import scratch_volumes_query, slowest_download_query

    words = set(re.findall(r"[A-Za-z]+", slowest_download_query("p") + scratch_volumes_query("p")))
    queried = sorted(words & {*DIMENSIONS, *PROPERTY_KEYS, *METRICS_BY_NAME})
    assert {"InstanceId", "Throughput", "VolumeId", "Pipeline", "Stage"} <= set(queried)
    # Ten rules over two time frames: 160 fields of rows, and ten more metrics in the directive.
    rows = [{"label": f"rule_{i:02d}", "value": 1.0, "unit": "count", "emf_unit": "Count", "frame": frame,
             "start_s": float(frame), "end_s": frame + 1.0, "source": "ebpf"} for i in range(10) for frame in (0, 1)]
    profile = full_profile(contract=rows, properties={**PROPS, "VolumeId": "vol-0123456789abcdef0"})
    for line in serialize(profile):
        fields = _insights_fields(json.loads(line))
        assert len(fields) > 200
        assert all(fields.index(name) < 200 for name in queried), [(n, fields.index(n)) for n in queried]


def test_a_namespace_under_aws_is_refused_by_the_one_rule_every_command_uses(tmp_path: Path) -> None:
    assert namespace_problem("IoBatch") is None and namespace_problem("Team/AWS/x") is None
    assert namespace_problem("AWS/EBS") == ("begins with AWS/, which CloudWatch keeps for AWS's own metrics: give e.g. "
                                            "IoBatch")
    for args in (["report", "--from-cloudwatch", "g", "--namespace", "AWS/IoBatch"],
                 ["sidecar", "--socket", str(tmp_path / "s.sock"), "--namespace", "AWS/IoBatch"]):
        result = CliRunner().invoke(app, args, env={"AWS_REGION": "us-east-1"})
        assert result.exit_code == 64, result.output
        assert result.output == "error: --namespace 'AWS/IoBatch' begins with AWS/, which CloudWatch keeps for AWS's " \
            "own metrics: give e.g. IoBatch\n"


# Names near the rules' edges: the namespace alphabet and its neighbours, blanks, non-ASCII, and both lengths.
_EDGE_TEXT = st.one_of(
    st.text(alphabet=st.sampled_from("aZ09._#:/- \t\u00e9+"), max_size=8),
    st.builds(lambda c, n: c * n, st.sampled_from("a- \u00e9"), st.sampled_from([255, 256, 257, 1023, 1024, 1025])),
    st.text(max_size=6),
)


@given(_EDGE_TEXT)
def test_the_namespace_and_dimension_checks_agree_with_the_emf_librarys_validator(text: str) -> None:
    # The checks apply the library's rules without importing it (~0.2 s at every job's start): they must refuse
    # exactly what its validator refuses, besides the rules of their own (AWS/, control characters).
    from aws_embedded_metrics.exceptions import InvalidDimensionError, InvalidNamespaceError
    from aws_embedded_metrics.validator import validate_dimension_set, validate_namespace

    try:
        validate_namespace(text)
        library_takes_namespace = True
    except InvalidNamespaceError:
        library_takes_namespace = False
    ours = namespace_problem(text)
    assert (ours is None or ours.startswith("begins with AWS/")) == library_takes_namespace, (text, ours)
    try:
        validate_dimension_set({"Pipeline": text})
        library_takes_value = True
    except InvalidDimensionError:
        library_takes_value = False
    ours = dimension_value_problem(text)
    assert (ours is None or ours.startswith("has a control character")) == library_takes_value, (text, ours)
