"""Emit StageProfiles as CloudWatch Embedded Metric Format through aws-embedded-metrics.

Build first, emit last: `build_context` and `serialize` are pure (a profile in, JSON lines out); only a
sink writes. In AWS the sink is stdout (the awslogs driver ships it and CloudWatch extracts the metrics);
locally it is a file that `iobatch report` reads.

Dimensions are exactly [Pipeline, Stage]; JobId, ArrayIndex, InstanceId, InstanceType and VolumeType are
properties, because every distinct dimension value set is billed as a custom metric.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

from profiling import emflimits
from profiling.contract import contract_metrics
from profiling.files import append_line
from profiling.metrics import (
    DEFAULT_NAMESPACE,
    METRICS,
    METRICS_BY_NAME,
    OUTCOMES,
    PROPERTY_KEYS,
    StageProfile,
    figure_problem,
    median,
    to_metrics,
)

# The EMF library is imported where it is used: importing it takes ~0.18 s (its package imports aiohttp for its
# agent sink, whichever module is asked for), which every command would otherwise pay at start-up.
if TYPE_CHECKING:
    from aws_embedded_metrics.logger.metrics_context import MetricsContext

# The largest line the awslogs log driver ships as one CloudWatch event: moby's
# daemon/logger/awslogs/cloudwatchlogs.go, `maximumBytesPerEvent = 262144 - perEventBytes` (26), after the
# PutLogEvents per-event limit of 256 KB. A longer line is split into several events, and an EMF document
# split in two is no longer JSON: CloudWatch extracts no metric from it. Every document stays within this.
MAX_EVENT_BYTES = 262_144 - 26
CONTRACT_ROWS_CUT = ("contract rows: {kept} of {total} in the EMF document (a CloudWatch event holds at most "
                     "256 KiB); every rule's value per frame is in the metrics, and every row in the profile")


# The namespace prefix CloudWatch reserves for AWS services' metrics (namespace_problem).
RESERVED_NAMESPACE_PREFIX = "AWS/"


def namespace_problem(namespace: str) -> str | None:
    """Why CloudWatch would not take `namespace` for the metrics, or None: the EMF library's own rule
    (aws_embedded_metrics/validator.py validate_namespace: 1-256 of A-Z a-z 0-9 . _ # : / -, its constants read by
    profiling.emflimits; tests/unit/test_emf.py checks this against the library's validator), checked before a stage
    is measured rather than on every document. Not the validator itself: importing it costs ~0.2 s of CPU (the
    package imports aiohttp), which every job would pay at its start for one check."""
    if not namespace.strip() or len(namespace) > emflimits.MAX_NAMESPACE_LENGTH \
            or not re.match(emflimits.VALID_NAMESPACE_REGEX, namespace):
        return (f"is not a CloudWatch namespace: 1 to {emflimits.MAX_NAMESPACE_LENGTH} letters, digits or "
                f". _ # : / - ({len(namespace):,} characters given)")
    # "You cannot specify a namespace that begins with AWS/": reserved for AWS's own (CloudWatch API Reference,
    # PutMetricData, Namespace); the library passes it, CloudWatch would not take the metrics.
    if namespace.startswith(RESERVED_NAMESPACE_PREFIX):
        return f"begins with {RESERVED_NAMESPACE_PREFIX}, which CloudWatch keeps for AWS's own metrics: give e.g. " \
            "IoBatch"
    return None


def dimension_value_problem(value: str) -> str | None:
    """Why `value` cannot be a dimension value of every document (the Pipeline dimension), or None: the EMF
    library's rule (validator.py validate_dimension_set: 1-1024 ASCII characters, not only blanks; checked against
    the library by tests/unit/test_emf.py), and no control character (a newline splits the log line CloudWatch
    Logs reads the document from)."""
    if not value.strip() or len(value) > emflimits.MAX_DIMENSION_VALUE_LENGTH or not value.isascii():
        return f"is not a CloudWatch dimension value: 1 to {emflimits.MAX_DIMENSION_VALUE_LENGTH} ASCII characters"
    if not value.isprintable():
        return "has a control character (a newline?): CloudWatch Logs would split the document there"
    return None


def build_context(profile: StageProfile, *, namespace: str = DEFAULT_NAMESPACE,
                  rows: int | None = None) -> MetricsContext:
    """One MetricsContext for one stage: metrics from metrics.to_metrics, per-job values as properties.
    `rows` keeps only the contract's first rows in the "Contract" property (see serialize), not its metrics."""
    from aws_embedded_metrics.logger.metrics_context import MetricsContext

    context = MetricsContext(namespace=namespace)
    context.set_dimensions([{"Pipeline": profile.properties.get("Pipeline", "iobatch"), "Stage": profile.stage}],
                           use_default=False)
    for name, value, unit in to_metrics(profile):
        context.put_metric(name, value, unit)
    # Contract rule values (profiling/contract.py): a metric named by each rule's label, and the rows.
    for name, value, unit in contract_metrics(profile.contract):
        context.put_metric(name, value, unit)
    kept = profile.contract if rows is None else profile.contract[:rows]
    if kept:
        context.set_property("Contract", kept)
    for key in PROPERTY_KEYS:
        if key in profile.properties:
            context.set_property(key, profile.properties[key])
    context.set_property("Outcome", profile.outcome)
    if profile.device:
        context.set_property("Device", profile.device)
    if profile.error:
        context.set_property("Error", profile.error)
    # What each shared figure is of (a metric's scope is not part of its name): {"DeviceWriteBytes": "device"}.
    scopes = {name: METRICS_BY_NAME[name].scope_note for name, _, _ in to_metrics(profile)
              if METRICS_BY_NAME[name].scope_note}
    if scopes:
        context.set_property("Scopes", scopes)
    notices = list(profile.notices)
    if rows is not None and rows < len(profile.contract):
        notices.append(CONTRACT_ROWS_CUT.format(kept=rows, total=len(profile.contract)))
    if notices:
        context.set_property("Notices", notices)
    context.set_timestamp(datetime.fromtimestamp(profile.started_at + profile.duration_s, tz=UTC))
    return context


def serialize(profile: StageProfile, *, namespace: str = DEFAULT_NAMESPACE) -> list[str]:
    """The EMF JSON documents for one stage (one line each; one unless over 100 metrics or 100 values a
    metric).

    The library repeats every property in each document it splits off. The contract's rows (up to a row per
    rule and time frame) are the one property that can pass MAX_EVENT_BYTES, so when a document would, the
    rows go in the first document only (the reader, merge_documents, takes a stage's properties from its
    first), as many as fit, with a notice saying how many. Nothing else is cut: the metrics and the other
    properties (bounded by the caps on rules, frames, notices) fit with room to spare."""
    from aws_embedded_metrics.serializers.log_serializer import LogSerializer

    lines = LogSerializer.serialize(build_context(profile, namespace=namespace))
    if not profile.contract or all(_fits(line) for line in lines):
        return [_queried_first(line) for line in lines]
    low, high = 0, len(profile.contract)  # the most rows that fit, by bisection: _first(low) fits
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if _fits(_first(profile, namespace, middle)) else (low, middle - 1)
    head = _first(profile, namespace, low)
    notices = json.loads(head).get("Notices")
    rest = []
    for line in lines[1:]:
        doc = json.loads(line)
        del doc["Contract"]
        rest.append(json.dumps({**doc, "Notices": notices}))
    return [_queried_first(line) for line in (head, *rest)]


# Logs Insights extracts at most 200 fields of a JSON log event, a nested value's leaves each one field in dot
# notation (CloudWatch Logs User Guide, "Supported logs and discovered fields", section "Fields in JSON logs":
# https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/CWL_AnalyzeLogData-discoverable-fields.html; the page's
# 2019 copy in awsdocs/amazon-cloudwatch-logs-user-guide said 100): the library writes the contract's rows first and
# the metric directive (two fields a metric) before the figures, so ten contract rules pushed InstanceId and
# Throughput, which the dashboard's queries read, out of reach. Those bulky fields go last.
FIELDS_LAST = ("_aws", "Contract", "Scopes", "Notices")


def _queried_first(line: str) -> str:
    """The document with the dimensions, properties and figures first and FIELDS_LAST after them (same bytes)."""
    doc = json.loads(line)
    return json.dumps({**{k: v for k, v in doc.items() if k not in FIELDS_LAST},
                       **{k: doc[k] for k in FIELDS_LAST if k in doc}})


def _first(profile: StageProfile, namespace: str, rows: int) -> str:
    """The stage's first EMF document with only the contract's first `rows` rows."""
    from aws_embedded_metrics.serializers.log_serializer import LogSerializer

    return LogSerializer.serialize(build_context(profile, namespace=namespace, rows=rows))[0]


def _fits(line: str) -> bool:
    return len(line.encode()) <= MAX_EVENT_BYTES


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
        append_line(self.path, line)  # whole or not at all: a full disk cuts no document in the middle


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


# ---- reading EMF back: the inverse of emit_profile, for the report and the advisor -----------------

_INT_FIELDS = {f.name for f in dataclasses.fields(StageProfile) if str(f.type).startswith("int")}
# Fields whose dataclass default is 0: a document without their metric had no figure (absent), not zero.
_ZERO_DEFAULT = {f.name for f in dataclasses.fields(StageProfile) if f.default == 0}


def _figure(value: Any, name: str) -> float:
    """An EMF metric value, a number or a list of observations (their median), each checked as a profile line's
    figures are (metrics.figure_problem); ValueError naming the metric otherwise."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{name} is an empty list, not a number")
    for one in values:
        if problem := figure_problem(one):
            raise ValueError(f"{name} is {json.dumps(one)[:40]}: {problem}")
    return median([float(v) for v in values])


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def stage_key(doc: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Which stage of which attempt an EMF document is of: (namespace, Pipeline, JobId, ArrayIndex, Stage,
    end time).

    The documents of one stage (split by the library: at most 100 metrics, and 100 values a metric, a
    document) share all of them; a retried attempt of the same child ends its stage at another time.
    None for a document without metadata."""
    meta = doc.get("_aws")
    if not isinstance(meta, Mapping):
        return None
    directives = meta.get("CloudWatchMetrics")
    namespaces = sorted({str(d.get("Namespace")) for d in directives if isinstance(d, Mapping)}
                        if isinstance(directives, list) else [])
    return (*namespaces, *(str(doc.get(k, "")) for k in ("Pipeline", "JobId", "ArrayIndex", "Stage")),
            str(meta.get("Timestamp", "")))


def merge_documents(docs: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The documents of each stage merged into one, in the order their stages first appear: the values of
    a metric split across documents are joined, and every document's metric directives are kept."""
    merged: dict[tuple[str, ...], dict[str, Any]] = {}
    for doc in docs:
        key = stage_key(doc)
        if key is None:
            continue
        if key not in merged:
            merged[key] = {**doc, "_aws": dict(doc["_aws"])}
            continue
        into = merged[key]
        directives = [d for d in doc["_aws"].get("CloudWatchMetrics") or [] if isinstance(d, Mapping)]
        into["_aws"]["CloudWatchMetrics"] = [*(into["_aws"].get("CloudWatchMetrics") or []), *directives]
        for directive in directives:
            for metric in directive.get("Metrics") or []:
                name = metric.get("Name") if isinstance(metric, Mapping) else None
                if isinstance(name, str) and name in doc:
                    into[name] = _as_list(into[name]) + _as_list(doc[name]) if name in into else doc[name]
    return list(merged.values())


def profiles_from_emf(docs: Iterable[Mapping[str, Any]], *,
                      namespace: str | None = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """The StageProfiles EMF documents describe, exactly one per stage that ran (see merge_documents);
    documents that are not iobatch stage documents (of `namespace`, when given) are skipped."""
    found = (profile_from_emf(doc, namespace=namespace) for doc in merge_documents(docs))
    return [profile for profile in found if profile is not None]


def profile_from_emf(doc: Mapping[str, Any], *, namespace: str | None = DEFAULT_NAMESPACE) -> StageProfile | None:
    """The StageProfile an EMF document describes, or None if it is not an iobatch stage document.

    EMF carries the metric values, the dimensions (Pipeline, Stage) and the properties (JobId,
    ArrayIndex, ...), not timelines. Throughput is derived from bytes and duration, as the sidecar does.
    One document may be only part of a stage: read several with `profiles_from_emf`, which merges them.
    """
    meta = doc.get("_aws")
    if not isinstance(meta, Mapping):
        return None
    directives = meta.get("CloudWatchMetrics")
    if not isinstance(directives, list) or not directives:
        return None
    if namespace is not None and not any(
        isinstance(d, Mapping) and d.get("Namespace") == namespace for d in directives
    ):
        return None
    stage = doc.get("Stage")
    if not isinstance(stage, str) or not stage:
        return None
    kwargs: dict[str, Any] = {}
    timestamp = meta.get("Timestamp")
    try:
        for spec in METRICS:
            if spec.name in doc and spec.field != "throughput_bps":
                value = _figure(doc[spec.name], spec.name)
                kwargs[spec.field] = round(value) if spec.field in _INT_FIELDS else value
        ended = _figure(timestamp, "_aws.Timestamp") / 1000 if timestamp is not None else 0.0
    except ValueError as exc:
        child = doc.get("ArrayIndex", doc.get("JobId", "?"))
        raise ValueError(f"the EMF document of stage {stage[:40]!r} (child {str(child)[:40]}): {exc}") from None
    for spec in METRICS:
        if spec.field in _ZERO_DEFAULT and spec.field not in kwargs:
            kwargs[spec.field] = None
    duration = float(kwargs.pop("duration_s", 0.0))
    outcome = doc.get("Outcome")
    contract = doc.get("Contract")
    properties = {k: str(doc[k]) for k in ("Pipeline", *PROPERTY_KEYS) if k in doc and doc[k] is not None}
    notices = doc.get("Notices")
    return StageProfile(
        stage=stage,
        notices=[str(n) for n in notices] if isinstance(notices, list) else [],
        outcome=outcome if isinstance(outcome, str) and outcome in OUTCOMES else "ok",
        started_at=ended - duration,
        duration_s=duration,
        contract=[c for c in contract if isinstance(c, dict)] if isinstance(contract, list) else [],
        properties=properties,
        error=str(doc["Error"]) if doc.get("Error") else None,
        device=str(doc["Device"]) if doc.get("Device") else None,
        **kwargs,
    )
