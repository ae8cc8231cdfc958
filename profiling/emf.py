"""Emit StageProfiles as CloudWatch Embedded Metric Format through aws-embedded-metrics.

Build first, emit last: `build_context` and `serialize` are pure (a profile in, JSON lines out); only a
sink writes. In AWS the sink is stdout (the awslogs driver ships it and CloudWatch extracts the metrics);
locally it is a file that `iobatch report` reads.

Dimensions are exactly [Pipeline, Stage]; JobId, ArrayIndex, InstanceId, InstanceType and VolumeType are
properties, because every distinct dimension value set is billed as a custom metric.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol, TextIO

from aws_embedded_metrics.logger.metrics_context import MetricsContext
from aws_embedded_metrics.serializers.log_serializer import LogSerializer

from profiling.contract import contract_metrics
from profiling.metrics import DEFAULT_NAMESPACE, PROPERTY_KEYS, StageProfile, to_metrics


def build_context(profile: StageProfile, *, namespace: str = DEFAULT_NAMESPACE) -> MetricsContext:
    """One MetricsContext for one stage: metrics from metrics.to_metrics, per-job values as properties."""
    context = MetricsContext(namespace=namespace)
    context.set_dimensions([{"Pipeline": profile.properties.get("Pipeline", "iobatch"), "Stage": profile.stage}],
                           use_default=False)
    for name, value, unit in to_metrics(profile):
        context.put_metric(name, value, unit)
    # Contract rule values (profiling/contract.py): a metric named by each rule's label, and the rows.
    for name, value, unit in contract_metrics(profile.contract):
        context.put_metric(name, value, unit)
    if profile.contract:
        context.set_property("Contract", profile.contract)
    for key in PROPERTY_KEYS:
        if key in profile.properties:
            context.set_property(key, profile.properties[key])
    context.set_property("Outcome", profile.outcome)
    if profile.device:
        context.set_property("Device", profile.device)
    if profile.error:
        context.set_property("Error", profile.error)
    context.set_timestamp(datetime.fromtimestamp(profile.started_at + profile.duration_s, tz=UTC))
    return context


def serialize(profile: StageProfile, *, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """The EMF JSON documents for one stage (one line each; one unless over 100 metrics)."""
    return LogSerializer.serialize(build_context(profile, namespace=namespace))


class EmfSink(Protocol):
    """Where EMF lines go."""

    def accept(self, line: str) -> None: ...


class StreamSink:
    """Writes each document as a line to a stream (stdout in AWS), flushed at once."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def accept(self, line: str) -> None:
        stream = self._stream or sys.stdout
        stream.write(line + "\n")
        stream.flush()


class FileSink:
    """Appends each document as a line to a file, flushed at once (a crash loses no finished stage)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def accept(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")


class RecordingSink:
    """Keeps the lines, for tests."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def accept(self, line: str) -> None:
        self.lines.append(line)


class NullSink:
    def accept(self, line: str) -> None:
        return None


def sink_for(target: str | None) -> EmfSink:
    """'-' is stdout, None discards, anything else is a file path."""
    if target is None:
        return NullSink()
    if target == "-":
        return StreamSink()
    return FileSink(Path(target))


def emit_profile(profile: StageProfile, sink: EmfSink, *, namespace: str = DEFAULT_NAMESPACE) -> None:
    for line in serialize(profile, namespace=namespace):
        sink.accept(line)
