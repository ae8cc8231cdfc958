"""The HTML report of a run: per-stage plots, a timeline per child, bad apples, contract results, advice.

Input is either a local run directory (profiling/runfiles.py: profile JSON with timelines, or EMF lines
when no profiles were kept) or EMF documents read back from CloudWatch Logs, which carry the per-stage
figures but no timelines. Output is one HTML file that opens with no network: plotly.js is embedded
once, inline, and every chart is a plotly figure.

Metric names, units, labels and display scales come from profiling.metrics.METRICS only.

Entry points: `write_report(run_dir, out, advice=...)` for a local run and
`write_report_from_cloudwatch(client, log_group, out, since_s=...)` for a batch in AWS.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline
from plotly.subplots import make_subplots

from profiling import runfiles
from profiling.emf import profile_from_emf
from profiling.metrics import (
    DEFAULT_NAMESPACE,
    METRICS,
    METRICS_BY_NAME,
    STAGES,
    TABLE_METRICS,
    MetricSpec,
    StageProfile,
    TimelinePoint,
    median,
    summarize,
)
from profiling.outliers import DEFAULT_MIN_RELATIVE, DEFAULT_THRESHOLD, Outlier, find_outliers

# The per-stage plots: (id, title, metric names). Every stage section holds all of them, with a
# "no data" note in the plot where the run did not measure a metric (no block device behind scratch,
# PSI off), so the layout is the same for every run.
STAGE_PLOTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("duration", "Duration across children", ("StageDuration",)),
    ("throughput", "Throughput per child", ("Throughput",)),
    ("write-latency", "Device write latency per child", ("DeviceWriteLatency",)),
    ("queue-depth", "Device queue depth per child", ("DeviceQueueDepth",)),
    ("dirty", "Peak dirty page cache against the dirty threshold", ("PeakDirtyBytes", "DirtyThresholdBytes")),
    ("io-stall", "I/O stall (PSI) per child", ("IoStallSome", "IoStallFull")),
)
# Per-child timelines beyond this many are left out (slow children first): the file stays small.
MAX_TIMELINES = 48
# Samples per child timeline; longer timelines keep the peak of each bucket, so a stall stays visible.
MAX_TIMELINE_POINTS = 1500

PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}
COLORS = {"ok": "#3b6fb6", "outlier": "#d62728", "failed": "#ff7f0e", "threshold": "#555555"}
STAGE_COLORS = {"download": "#1f77b4", "process": "#2ca02c", "upload": "#9467bd"}


class ReportInputError(ValueError):
    """The report's input is missing or unusable; the message names the thing and the fix."""


class DamagedInputError(ReportInputError):
    """A profile or EMF file exists but a line in it does not parse (the message names file and line)."""


@dataclass(frozen=True)
class Entry:
    """One stage of one child, with the names the report shows for it."""

    child: str
    profile: StageProfile
    instance: str | None = None


@dataclass
class ReportData:
    """Everything a report shows, whatever it was read from."""

    entries: list[Entry]
    source: str
    has_timelines: bool
    run: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def stages(self) -> list[str]:
        present = {e.profile.stage for e in self.entries}
        return [s for s in STAGES if s in present] + sorted(present - set(STAGES))

    def of_stage(self, stage: str) -> list[Entry]:
        return [e for e in self.entries if e.profile.stage == stage]

    def children(self) -> list[str]:
        return sorted({e.child for e in self.entries}, key=_natural_key)


@dataclass(frozen=True)
class BadApple:
    """A child or instance whose throughput in one stage is an outlier against the rest."""

    stage: str
    scope: str  # "child" or "instance"
    name: str
    outlier: Outlier
    detail: str = ""


# ---- reading ---------------------------------------------------------------------------------------


def parse_since(text: str) -> float:
    """'90s', '30m', '1h', '2d' (or a bare number of seconds) -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    body = text.strip().lower()
    try:
        value = float(body[:-1]) * units[body[-1]] if body and body[-1] in units else float(body)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ReportInputError(f"--since {text!r} is not a duration: write e.g. 90s, 30m, 1h or 2d")
    return value


def profiles_from_emf_lines(
    lines: Iterable[str], *, where: str, namespace: str | None = DEFAULT_NAMESPACE
) -> list[StageProfile]:
    """Stage profiles from EMF text lines; lines that are not iobatch EMF documents are skipped.

    A line that starts like JSON but does not parse is an error naming `where` and the line number.
    """
    out: list[StageProfile] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text.startswith("{"):
            continue
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DamagedInputError(f"{where}:{number}: not an EMF document ({exc.msg})") from None
        if isinstance(doc, dict):
            profile = profile_from_emf(doc, namespace=namespace)
            if profile is not None:
                out.append(profile)
    return out


def _child_labels(profiles: Sequence[tuple[StageProfile, str]]) -> list[str]:
    """The name shown for each child: 'child N' from ArrayIndex (with the job id when a report spans
    several jobs), else the name of the file the profile came from."""
    jobs = {_parent_job(p) for p, _ in profiles}
    labels = []
    for profile, fallback in profiles:
        index = profile.properties.get("ArrayIndex")
        if index is None or index == "":
            labels.append(fallback)
        elif len(jobs) > 1:
            labels.append(f"{_parent_job(profile) or '?'}[{index}]")
        else:
            labels.append(f"child {index}")
    return labels


def _parent_job(profile: StageProfile) -> str | None:
    """The array job's id: AWS Batch gives each child '<parent id>:<index>' as its job id."""
    job = profile.properties.get("JobId")
    index = profile.properties.get("ArrayIndex")
    if job and index and job.endswith(f":{index}"):
        return job[: -len(index) - 1]
    return job


def _instance(profile: StageProfile) -> str | None:
    return profile.properties.get("InstanceId") or None


def _entries(profiles: Sequence[tuple[StageProfile, str]]) -> list[Entry]:
    labels = _child_labels(profiles)
    return [Entry(child=label, profile=p, instance=_instance(p))
            for (p, _), label in zip(profiles, labels, strict=True)]


def load_run_dir(run_dir: Path) -> ReportData:
    """Read a local run directory: profile JSON when present (with timelines), else the EMF files."""
    if not run_dir.is_dir():
        raise ReportInputError(f"run directory {run_dir} does not exist: pass the --run-dir of a finished run")
    pairs: list[tuple[StageProfile, str]] = []
    profile_files = sorted((run_dir / runfiles.PROFILES).glob("*.jsonl"))
    for file in profile_files:
        try:
            pairs.extend((p, file.stem) for p in runfiles.read_profiles(file))
        except ValueError as exc:
            raise DamagedInputError(f"{exc}: the file is damaged; rerun the child or delete the file") from None
    source = f"local run {run_dir}: {len(pairs)} stage profiles from {runfiles.PROFILES}/"
    has_timelines = True
    if not pairs:
        for file in sorted((run_dir / runfiles.EMF).glob("*.emf")):
            with file.open(encoding="utf-8") as lines:
                pairs.extend((p, file.stem) for p in profiles_from_emf_lines(lines, where=str(file), namespace=None))
        source = f"local run {run_dir}: {len(pairs)} EMF documents from {runfiles.EMF}/ (no profile files)"
        has_timelines = False
    if not pairs:
        raise ReportInputError(
            f"{run_dir} holds no {runfiles.PROFILES}/*.jsonl or {runfiles.EMF}/*.emf files: "
            "pass the run directory of a finished run (iobatch demo --run-dir DIR)"
        )
    run: dict[str, Any] | None = None
    if (run_dir / runfiles.RUN_FILE).is_file():
        try:
            run = runfiles.read_run(run_dir)
        except (ValueError, OSError):
            run = None
    data = ReportData(entries=_entries(pairs), source=source, has_timelines=has_timelines, run=run)
    if has_timelines and not any(e.profile.timeline for e in data.entries):
        data.notes.append("The profiles carry no timeline samples.")
    return data


def fetch_log_messages(client: Any, log_group: str, *, start_ms: int, end_ms: int | None = None) -> Iterator[str]:
    """Every message of a CloudWatch Logs group in [start_ms, end_ms], page by page.

    `client` is a boto3 'logs' client; errors from it propagate to the caller.
    """
    args: dict[str, Any] = {"logGroupName": log_group, "startTime": start_ms}
    if end_ms is not None:
        args["endTime"] = end_ms
    for page in client.get_paginator("filter_log_events").paginate(**args):
        for event in page.get("events", []):
            yield str(event.get("message", ""))


def load_cloudwatch(
    client: Any,
    log_group: str,
    *,
    since_s: float,
    namespace: str = DEFAULT_NAMESPACE,
    now: float | None = None,
) -> ReportData:
    """The stage documents a batch's containers logged to CloudWatch Logs in the last `since_s` seconds."""
    end = time.time() if now is None else now
    start_ms = int((end - since_s) * 1000)
    lines = fetch_log_messages(client, log_group, start_ms=start_ms, end_ms=int(end * 1000))
    profiles = profiles_from_emf_lines(lines, where=f"log group {log_group}", namespace=namespace)
    if not profiles:
        raise ReportInputError(
            f"log group {log_group} has no {namespace} EMF stage documents in the last {_duration(since_s)}: "
            "widen --since, or check the log group and --namespace"
        )
    pairs = [(p, f"document {n}") for n, p in enumerate(profiles, 1)]
    return ReportData(
        entries=_entries(pairs),
        source=f"CloudWatch Logs group {log_group}: {len(profiles)} EMF documents from the last {_duration(since_s)}",
        has_timelines=False,
    )


# ---- analysis ----------------------------------------------------------------------------------------


def find_bad_apples(
    data: ReportData, *, threshold: float = DEFAULT_THRESHOLD, min_relative: float = DEFAULT_MIN_RELATIVE
) -> list[BadApple]:
    """Per stage: children, then instances, whose throughput is a robust outlier on the slow side
    (profiling.outliers).

    Only stages that finished ("ok") count: a failed stage's throughput says nothing about the machine.
    An instance's value is the median over the children it ran; instances need three or more to compare,
    and are only compared when some ran more than one child.
    """
    found: list[BadApple] = []
    for stage in data.stages():
        by_child: dict[str, float] = {}
        instance_of: dict[str, str] = {}
        for entry in data.of_stage(stage):
            tput = entry.profile.throughput_bps
            if entry.profile.outcome != "ok" or tput is None:
                continue
            by_child[entry.child] = tput
            if entry.instance:
                instance_of[entry.child] = entry.instance
        # Only the slow side: a child faster than the rest holds nobody back.
        for o in find_outliers(by_child, threshold=threshold, min_relative=min_relative, low_only=True):
            detail = f"instance {instance_of[o.key]}" if o.key in instance_of else ""
            found.append(BadApple(stage, "child", o.key, o, detail))
        per_instance: dict[str, list[float]] = {}
        for child, tput in by_child.items():
            if child in instance_of:
                per_instance.setdefault(instance_of[child], []).append(tput)
        if len(per_instance) == len(by_child):
            continue  # one child per instance: the child rows already name the instance
        instance_values = {i: median(v) for i, v in per_instance.items()}
        for o in find_outliers(instance_values, threshold=threshold, min_relative=min_relative, low_only=True):
            found.append(BadApple(stage, "instance", o.key, o, f"{len(per_instance[o.key])} children"))
    return found


def downsample(points: Sequence[TimelinePoint], limit: int) -> list[TimelinePoint]:
    """At most `limit` points; each bucket keeps its last time and the peak of every series.

    Peaks, not means: a one-sample stall or dirty spike is what a reader looks for.
    """
    if limit <= 0 or len(points) <= limit:
        return list(points)
    size = math.ceil(len(points) / limit)
    out = []
    for start in range(0, len(points), size):
        bucket = points[start : start + size]

        def peak(name: str, bucket: Sequence[TimelinePoint] = bucket) -> Any:
            values = [getattr(p, name) for p in bucket if getattr(p, name) is not None]
            return max(values) if values else None

        out.append(
            TimelinePoint(
                t=bucket[-1].t,
                read_bps=peak("read_bps"),
                write_bps=peak("write_bps"),
                device_write_bps=peak("device_write_bps"),
                device_queue_depth=peak("device_queue_depth"),
                dirty_bytes=peak("dirty_bytes"),
                writeback_bytes=peak("writeback_bytes"),
                io_stall_some_ms=peak("io_stall_some_ms"),
            )
        )
    return out


# ---- figures -----------------------------------------------------------------------------------------


def _axis_title(spec: MetricSpec) -> str:
    return spec.label


def _shown(spec: MetricSpec, value: float | None) -> float | None:
    """The value in the spec's display unit, to 5 significant digits (the HTML carries every sample)."""
    return None if value is None else float(f"{value / spec.scale:.5g}")


def _base_layout(fig: go.Figure, title: str, height: int = 320) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        template="plotly_white",
        height=height,
        margin={"l": 60, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def _no_data(fig: go.Figure, what: str) -> None:
    fig.add_annotation(
        text=f"no data: this run did not measure {what}",
        showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font={"size": 13, "color": "#888"},
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)


def _child_colors(entries: Sequence[Entry], flagged: set[str]) -> list[str]:
    colors = []
    for e in entries:
        if e.profile.outcome != "ok":
            colors.append(COLORS["failed"])
        elif e.child in flagged:
            colors.append(COLORS["outlier"])
        else:
            colors.append(COLORS["ok"])
    return colors


def _hover(entries: Sequence[Entry]) -> list[str]:
    out = []
    for e in entries:
        parts = [e.child, f"outcome {e.profile.outcome}"]
        if e.instance:
            parts.append(f"instance {e.instance}")
        itype = e.profile.properties.get("InstanceType")
        if itype:
            parts.append(itype)
        out.append("<br>".join(parts))
    return out


def stage_figures(entries: Sequence[Entry], flagged: set[str]) -> list[tuple[str, go.Figure]]:
    """The STAGE_PLOTS of one stage, as (plot id, figure)."""
    entries = sorted(entries, key=lambda e: _natural_key(e.child))
    children = [e.child for e in entries]
    hover = _hover(entries)
    colors = _child_colors(entries, flagged)
    figures: list[tuple[str, go.Figure]] = []
    for plot_id, title, names in STAGE_PLOTS:
        specs = [METRICS_BY_NAME[n] for n in names]
        main = specs[0]
        values = [_shown(main, e.profile.value(main)) for e in entries]
        fig = go.Figure()
        unit = f" ({main.display_unit})" if main.display_unit else ""
        _base_layout(fig, title + unit)
        if all(v is None for v in values):
            _no_data(fig, main.description.lower() or main.name)
            figures.append((plot_id, fig))
            continue
        if plot_id == "duration":
            # The box summarises the spread; the points (one per child, coloured like the bars of
            # the other plots) show who is where.
            fig.add_trace(go.Box(
                x=values, name=main.label, boxpoints=False, hoverinfo="x",
                line={"color": "#7f7f7f"}, fillcolor="rgba(59,111,182,0.12)", orientation="h",
            ))
            jitter = [((i * 7919) % 11 - 5) / 25 for i in range(len(values))]  # fixed, so reports diff
            fig.add_trace(go.Scatter(
                x=values, y=jitter, mode="markers", name="children", text=hover, hoverinfo="x+text",
                marker={"color": colors, "size": 9, "line": {"width": 1, "color": "#fff"}}, yaxis="y2",
            ))
            fig.update_layout(
                showlegend=False, yaxis2={"overlaying": "y", "range": [-1, 1], "visible": False},
            )
            fig.update_xaxes(title_text=_axis_title(main), rangemode="tozero")
            fig.update_yaxes(showticklabels=False)
        elif plot_id == "dirty":
            fig.add_trace(go.Bar(x=children, y=values, name=main.label, marker_color=colors,
                                 hovertext=hover))
            limit = specs[1]
            limits = [_shown(limit, e.profile.value(limit)) for e in entries]
            if any(v is not None for v in limits):
                fig.add_trace(go.Scatter(
                    x=children, y=limits, name=limit.label, mode="lines+markers",
                    line={"color": COLORS["threshold"], "dash": "dash"}, marker={"symbol": "line-ew-open"},
                ))
            fig.update_yaxes(title_text=main.label, rangemode="tozero")
        elif plot_id == "io-stall":
            for spec, color in zip(specs, ("#e377c2", "#8c564b"), strict=True):
                series = [_shown(spec, e.profile.value(spec)) for e in entries]
                if any(v is not None for v in series):
                    fig.add_trace(go.Bar(x=children, y=series, name=spec.label, marker_color=color,
                                         hovertext=hover))
            fig.update_layout(barmode="group")
            fig.update_yaxes(title_text=main.label, rangemode="tozero")
        else:
            fig.add_trace(go.Bar(x=children, y=values, name=main.label, marker_color=colors, hovertext=hover))
            present = [v for v in values if v is not None]
            mid = median(present)
            fig.add_hline(y=mid, line_dash="dot", line_color="#444",
                          annotation_text=f"median {main.display(mid * main.scale)}",
                          annotation_position="top left")
            fig.update_yaxes(title_text=main.label, rangemode="tozero")
            fig.update_layout(showlegend=False)
        if plot_id != "duration":
            fig.update_xaxes(type="category", tickangle=-30 if len(children) > 8 else 0)
        figures.append((plot_id, fig))
    return figures


def timeline_figure(child: str, entries: Sequence[Entry]) -> go.Figure:
    """One child's stages on one time axis: throughput, dirty and writeback against the threshold, PSI."""
    tput = METRICS_BY_NAME["Throughput"]
    dirty = METRICS_BY_NAME["PeakDirtyBytes"]
    wback = METRICS_BY_NAME["PeakWritebackBytes"]
    limit = METRICS_BY_NAME["DirtyThresholdBytes"]
    stall = METRICS_BY_NAME["IoStallSome"]
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
        subplot_titles=(
            f"Throughput ({tput.display_unit})",
            f"Dirty and writeback page cache ({dirty.display_unit}, host-wide)",
            f"I/O stall, PSI some ({stall.display_unit} in each sample)",
        ),
    )
    fig.update_annotations(font={"size": 12})  # the subplot titles; stage labels come after
    ordered = sorted(entries, key=lambda e: e.profile.started_at)
    origin = ordered[0].profile.started_at if ordered else 0.0
    # Traces, shapes and labels are collected and added at once: plotly validates on every add, and
    # one call per trace costs seconds on a large run.
    traces: list[go.Scatter] = []
    rows: list[int] = []
    shapes: list[dict[str, Any]] = []
    labels: list[dict[str, Any]] = []
    job_peak = 0.0
    device_peak = 0.0
    for n, entry in enumerate(ordered):
        p = entry.profile
        begin = p.started_at - origin
        points = downsample(p.timeline, MAX_TIMELINE_POINTS)
        xs = [round(begin + q.t, 3) for q in points]
        first = n == 0

        def line(values: list[float | None], name: str, color: str, row: int, dash: str = "solid",
                 xs: list[float] = xs, first: bool = first) -> None:
            traces.append(go.Scatter(x=xs, y=values, name=name, mode="lines", showlegend=first,
                                     line={"color": color, "dash": dash, "width": 1.6}))
            rows.append(row)

        line([_shown(tput, q.read_bps) for q in points], "read", "#1f77b4", 1)
        line([_shown(tput, q.write_bps) for q in points], "written", "#ff7f0e", 1)
        job_peak = max([job_peak, *(max(q.read_bps, q.write_bps) for q in points)])
        if any(q.device_write_bps is not None for q in points):
            line([_shown(tput, q.device_write_bps) for q in points], "device write (all writers)", "#2ca02c", 1,
                 "dot")
            device_peak = max([device_peak, *(q.device_write_bps or 0.0 for q in points)])
        line([_shown(dirty, q.dirty_bytes) for q in points], "dirty", "#d62728", 2)
        line([_shown(wback, q.writeback_bytes) for q in points], "writeback", "#9467bd", 2)
        if p.dirty_threshold_bytes is not None:
            threshold = _shown(limit, p.dirty_threshold_bytes)
            line([threshold, threshold], limit.label, COLORS["threshold"], 2, "dash",
                 xs=[round(begin, 3), round(begin + p.duration_s, 3)])
        if any(q.io_stall_some_ms is not None for q in points):
            line([_shown(stall, q.io_stall_some_ms) for q in points], "io stall some", "#e377c2", 3)
        # The x axes are shared, so one band from the bottom of the figure to the top marks all rows.
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": begin, "x1": begin + p.duration_s,
                       "y0": 0, "y1": 1, "fillcolor": STAGE_COLORS.get(p.stage, "#7f7f7f"), "opacity": 0.08,
                       "line": {"width": 0}, "layer": "below"})
        labels.append({
            # staggered, so the names of two short stages side by side do not overprint
            "x": begin + p.duration_s / 2, "y": 1.05 + 0.04 * (n % 2), "xref": "x", "yref": "paper",
            "yanchor": "bottom", "showarrow": False,
            "text": p.stage + ("" if p.outcome == "ok" else f" ({p.outcome})"),
            "font": {"size": 11, "color": STAGE_COLORS.get(p.stage, "#444")},
        })
    fig.add_traces(traces, rows=rows, cols=[1] * len(rows))
    top_axis: dict[str, Any] = {"title_text": tput.display_unit, "rangemode": "tozero"}
    if job_peak > 0 and device_peak > 3 * job_peak:
        # The device is host-wide: other writers (or a short sample's burst) would flatten the job's own
        # lines to zero. Scale to the job; zooming out shows the rest.
        top_axis["range"] = [0, _shown(tput, job_peak * 1.25)]
    # One layout update: each update_* call re-validates the whole layout.
    fig.update_layout(
        template="plotly_white", height=520, hovermode="x unified",
        margin={"l": 60, "r": 20, "t": 80, "b": 50}, legend={"orientation": "h", "y": -0.16},
        shapes=shapes, annotations=[*fig.layout.annotations, *labels],
        yaxis=top_axis,
        yaxis2={"title_text": dirty.display_unit, "rangemode": "tozero"},
        yaxis3={"title_text": stall.display_unit, "rangemode": "tozero"},
        xaxis3={"title_text": "seconds since the child's first stage"},
    )
    return fig


# ---- HTML --------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#24364b;color:#fff;padding:16px 28px}
header h1{margin:0;font-size:22px} header p{margin:4px 0 0;opacity:.85;font-size:14px}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #ddd;padding:8px 28px;z-index:10;font-size:14px}
nav a{margin-right:16px;color:#24364b;text-decoration:none}
main{padding:8px 28px 40px}
section{background:#fff;border:1px solid #e3e3e3;border-radius:6px;padding:12px 18px;margin:16px 0}
h2{font-size:19px;margin:6px 0 10px} h3{font-size:15px;margin:14px 0 6px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(440px,1fr));gap:10px}
.plot{border:1px solid #eee;border-radius:4px;min-height:320px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}
th,td{border:1px solid #e0e0e0;padding:4px 8px;text-align:right} th{background:#f3f5f8}
td.l,th.l{text-align:left} tr.bad td{background:#fde8e8} tr.good td{background:#eaf6ea}
.note{color:#555;font-size:13px} .flag{color:#d62728;font-weight:600}
pre{background:#f6f6f6;padding:8px;overflow:auto}
details summary{cursor:pointer;font-size:14px;margin:6px 0}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _natural_key(text: str) -> tuple[Any, ...]:
    """'child 10' after 'child 9'."""
    parts: list[Any] = []
    number = ""
    word = ""
    for ch in text:
        if ch.isdigit():
            if word:
                parts.append((1, word))
                word = ""
            number += ch
        else:
            if number:
                parts.append((0, int(number)))
                number = ""
            word += ch
    if number:
        parts.append((0, int(number)))
    if word:
        parts.append((1, word))
    return tuple(parts)


def _figure_html(fig: go.Figure, div_id: str) -> str:
    return str(pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOT_CONFIG))


def _render_value(value: Any, depth: int = 0) -> str:
    """Any JSON-like value as HTML: mappings as two-column tables, lists of mappings as tables."""
    if depth > 6:
        return f"<pre>{_e(json.dumps(value, default=str, indent=1))}</pre>"
    if isinstance(value, Mapping):
        if not value:
            return "<span class=note>(empty)</span>"
        rows = "".join(
            f"<tr><th class=l>{_e(k)}</th><td class=l>{_render_value(v, depth + 1)}</td></tr>"
            for k, v in value.items()
        )
        return f"<table>{rows}</table>"
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, Mapping) for v in value):
            return _table_of_dicts(list(value), depth)
        return "<ul>" + "".join(f"<li>{_render_value(v, depth + 1)}</li>" for v in value) + "</ul>"
    if isinstance(value, float):
        return _e(f"{value:,.4g}")
    text = str(value)
    if "\n" in text:
        return f"<pre>{_e(text)}</pre>"
    return _e(text)


def _table_of_dicts(rows: Sequence[Mapping[str, Any]], depth: int = 0, lead: Sequence[str] = ()) -> str:
    keys: list[str] = list(lead)
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    head = "".join(f"<th class=l>{_e(k)}</th>" for k in keys)
    body = []
    for row in rows:
        verdict = _verdict(row)
        cls = {True: " class=good", False: " class=bad"}.get(verdict, "") if verdict is not None else ""
        cells = "".join(
            f"<td class=l>{_render_value(row[k], depth + 1) if k in row else ''}</td>" for k in keys
        )
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _verdict(row: Mapping[str, Any]) -> bool | None:
    """True for a passed rule, False for a broken one, None when the row does not say."""
    for key in ("passed", "ok", "pass"):
        if isinstance(row.get(key), bool):
            return bool(row[key])
    status = str(row.get("status", row.get("result", row.get("outcome", "")))).lower()
    if status in {"pass", "passed", "ok", "met"}:
        return True
    if status in {"fail", "failed", "violated", "broken", "error"}:
        return False
    return None


def advice_as_data(advice: Any) -> Any:
    """Normalise the advisor's output (a mapping, a dataclass, or an object with to_dict()) for rendering."""
    if advice is None:
        return None
    if isinstance(advice, Mapping):
        return dict(advice)
    if dataclasses.is_dataclass(advice) and not isinstance(advice, type):
        return dataclasses.asdict(advice)
    to_dict = getattr(advice, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    return advice


def _summary_table(data: ReportData) -> str:
    summary = summarize([e.profile for e in data.entries])
    specs = [METRICS_BY_NAME[n] for n in TABLE_METRICS]
    head = "<th class=l>stage</th><th>children</th>" + "".join(f"<th>{_e(s.label)}</th>" for s in specs)
    rows = []
    for stage in data.stages():
        row = summary.get(stage)
        if row is None:
            continue
        children = len({e.child for e in data.of_stage(stage)})
        cells = "".join(f"<td>{_e(s.display(row.get(s.name)))}</td>" for s in specs)
        rows.append(f"<tr><td class=l><a href='#stage-{_e(stage)}'>{_e(stage)}</a></td><td>{children}</td>{cells}</tr>")
    return (
        f"<table id=summary-table><tr>{head}</tr>{''.join(rows)}</table>"
        "<p class=note>Durations, rates and latencies are medians across children; bytes, calls and images "
        "are totals over the run; dirty figures are the peak.</p>"
    )


def _detail_table(entries: Sequence[Entry]) -> str:
    specs = [s for s in METRICS if any(e.profile.value(s) is not None for e in entries)]
    head = "<th class=l>child</th><th class=l>outcome</th><th class=l>instance</th>" + "".join(
        f"<th>{_e(s.label)}</th>" for s in specs
    )
    rows = []
    for e in sorted(entries, key=lambda e: _natural_key(e.child)):
        cells = "".join(f"<td>{_e(s.display(e.profile.value(s)))}</td>" for s in specs)
        rows.append(
            f"<tr><td class=l>{_e(e.child)}</td><td class=l>{_e(e.profile.outcome)}</td>"
            f"<td class=l>{_e(e.instance or '-')}</td>{cells}</tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _bad_apple_section(data: ReportData, apples: Sequence[BadApple]) -> str:
    tput = METRICS_BY_NAME["Throughput"]
    parts = ["<section id=bad-apples><h2>Bad apples</h2>"]
    parts.append(
        f"<p class=note>A child or instance is flagged when its {_e(tput.label)} in a stage is low, with a "
        f"robust z-score (median and MAD) below -{DEFAULT_THRESHOLD}, and differs from the stage median by at least "
        f"{DEFAULT_MIN_RELATIVE:.0%}. Stages need three or more finished children to compare.</p>"
    )
    spread = []
    for stage in data.stages():
        values = [t for e in data.of_stage(stage) if e.profile.outcome == "ok"
                  and (t := e.profile.throughput_bps) is not None and t > 0]
        if len(values) >= 2:
            spread.append(f"{_e(stage)} {max(values) / min(values):.1f} : 1")
    if spread:
        parts.append(f"<p class=note>Spread between the fastest and the slowest child: {', '.join(spread)}.</p>")
    if not apples:
        parts.append("<p id=no-bad-apples>No child or instance stands out.</p></section>")
        return "".join(parts)
    head = ("<tr><th class=l>stage</th><th class=l>scope</th><th class=l>name</th>"
            f"<th>{_e(tput.label)}</th><th>stage median {_e(tput.display_unit)}</th><th>vs median</th>"
            "<th>robust z</th><th class=l>where</th></tr>")
    rows = []
    for a in apples:
        o = a.outlier
        ratio = f"{o.ratio:.2f}x" if o.ratio is not None else "-"
        rows.append(
            f"<tr class=bad data-stage='{_e(a.stage)}' data-scope='{_e(a.scope)}' data-name='{_e(a.name)}'>"
            f"<td class=l>{_e(a.stage)}</td><td class=l>{_e(a.scope)}</td><td class=l>{_e(a.name)}</td>"
            f"<td>{_e(tput.display(o.value))}</td><td>{_e(tput.display(o.median))}</td><td>{ratio}</td>"
            f"<td>{o.z:+.1f}</td><td class=l>{_e(a.detail)}</td></tr>"
        )
    parts.append(f"<table id=bad-apple-table>{head}{''.join(rows)}</table></section>")
    return "".join(parts)


def _contract_section(data: ReportData) -> str:
    rows: list[dict[str, Any]] = []
    for e in sorted(data.entries, key=lambda e: (_natural_key(e.child), e.profile.stage)):
        for result in e.profile.contract:
            rows.append({"child": e.child, "stage": e.profile.stage, **result})
    parts = ["<section id=contract><h2>Contract rules</h2>"]
    if not rows:
        parts.append("<p class=note>No contract rules were evaluated in this run.</p></section>")
        return "".join(parts)
    verdicts = [_verdict(r) for r in rows]
    parts.append(
        f"<p>{verdicts.count(True)} passed, <span class=flag>{verdicts.count(False)} broken</span>, "
        f"{verdicts.count(None)} without a verdict.</p>"
    )
    broken = [r for r, v in zip(rows, verdicts, strict=True) if v is False]
    if broken:
        parts.append("<h3>Broken rules</h3>" + _table_of_dicts(broken, lead=("child", "stage")))
    parts.append(f"<details{' open' if not broken else ''}><summary>every rule result</summary>"
                 f"{_table_of_dicts(rows, lead=('child', 'stage'))}</details></section>")
    return "".join(parts)


def _advice_section(advice: Any) -> str:
    parts = ["<section id=advice><h2>Recommendation</h2>"]
    body = advice_as_data(advice)
    if body is None:
        parts.append("<p class=note>No recommendation was given to this report.</p>")
    else:
        parts.append(_render_value(body))
    parts.append("</section>")
    return "".join(parts)


def render_html(data: ReportData, *, advice: Any = None, title: str = "iobatch run report") -> str:
    """The whole report as one HTML document (plotly.js inline, no network needed to open it)."""
    apples = find_bad_apples(data)
    stages = data.stages()
    body: list[str] = []

    body.append("<section id=overview><h2>Overview</h2>")
    body.append(f"<p>{_e(data.source)}. Children: {len(data.children())}. Stages: {_e(', '.join(stages))}.</p>")
    failed = [e for e in data.entries if e.profile.outcome != "ok"]
    if failed:
        names = ", ".join(f"{e.child} {e.profile.stage} ({e.profile.outcome})" for e in failed[:20])
        body.append(f"<p class=flag>Stages that did not finish: {_e(names)}</p>")
    if apples:
        names = ", ".join(
            f"{a.name if a.scope == 'child' else 'instance ' + a.name} in {a.stage}" for a in apples[:10]
        )
        body.append(f"<p class=flag>Bad apples: {_e(names)} (see <a href='#bad-apples'>below</a>).</p>")
    for note in data.notes:
        body.append(f"<p class=note>{_e(note)}</p>")
    body.append(_summary_table(data))
    if data.run:
        body.append(f"<details><summary>run.json</summary>{_render_value(data.run)}</details>")
    body.append("</section>")

    for stage in stages:
        entries = data.of_stage(stage)
        flagged = {a.name for a in apples if a.stage == stage and a.scope == "child"}
        body.append(f"<section class=stage id='stage-{_e(stage)}' data-stage='{_e(stage)}'>")
        body.append(f"<h2>Stage: {_e(stage)}</h2><p class=note>{len(entries)} children. "
                    "Red bars: bad apples; orange: the stage did not finish.</p><div class=grid>")
        for plot_id, fig in stage_figures(entries, flagged):
            div_id = f"plot-{stage}-{plot_id}"
            body.append(f"<div class=plot data-plot='{_e(stage)}/{_e(plot_id)}'>{_figure_html(fig, div_id)}</div>")
        body.append(f"</div><details><summary>every metric per child</summary>{_detail_table(entries)}</details>")
        body.append("</section>")

    body.append(_bad_apple_section(data, apples))

    body.append("<section id=timelines><h2>Timelines per child</h2>")
    with_samples = [c for c in data.children() if any(e.profile.timeline for e in data.entries if e.child == c)]
    if not data.has_timelines or not with_samples:
        body.append(
            "<p id=no-timelines class=note>No timelines: "
            + ("EMF documents carry one set of figures per stage, not the samples behind them. "
               "Run `iobatch report` on a local run directory for timelines."
               if not data.has_timelines else "the profiles carry no samples.")
            + "</p>"
        )
    else:
        slow = [a.name for a in apples if a.scope == "child"]
        ordered = list(dict.fromkeys([c for c in slow if c in with_samples] + with_samples))
        shown = ordered[:MAX_TIMELINES]
        if len(ordered) > len(shown):
            body.append(f"<p class=note>Showing {len(shown)} of {len(ordered)} children (bad apples first).</p>")
        for n, child in enumerate(shown):
            entries = [e for e in data.entries if e.child == child]
            mark = " <span class=flag>(bad apple)</span>" if child in slow else ""
            body.append(f"<h3>{_e(child)}{mark}</h3>")
            body.append(f"<div class='plot timeline' data-child='{_e(child)}'>"
                        f"{_figure_html(timeline_figure(child, entries), f'timeline-{n}')}</div>")
    body.append("</section>")

    body.append(_contract_section(data))
    body.append(_advice_section(advice))

    nav = "".join(
        ["<a href='#overview'>Overview</a>"]
        + [f"<a href='#stage-{_e(s)}'>{_e(s)}</a>" for s in stages]
        + ["<a href='#bad-apples'>Bad apples</a>", "<a href='#timelines'>Timelines</a>",
           "<a href='#contract'>Contract</a>", "<a href='#advice'>Recommendation</a>"]
    )
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return (
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
        "<meta name=viewport content='width=device-width, initial-scale=1'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<header><h1>{_e(title)}</h1><p>generated {generated}</p></header><nav>{nav}</nav>"
        f"<main>{''.join(body)}</main></body></html>\n"
    )


def _write(text: str, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(out)  # a reader never sees half a report
    return out


def write_report(run_dir: Path, out: Path | None = None, *, advice: Mapping[str, Any] | Any | None = None) -> Path:
    """Write the HTML report of a local run directory and return its path.

    `out` defaults to <run_dir>/report.html. `advice` is the advisor's recommendation (a mapping, a
    dataclass or an object with to_dict(), e.g. from tuning.advise); it is rendered as given, and the
    report says so when there is none. Raises ReportInputError when the run directory is unusable.
    """
    data = load_run_dir(Path(run_dir))
    target = Path(out) if out is not None else Path(run_dir) / runfiles.REPORT
    return _write(render_html(data, advice=advice), target)


def write_report_from_cloudwatch(
    client: Any,
    log_group: str,
    out: Path,
    *,
    since_s: float,
    namespace: str = DEFAULT_NAMESPACE,
    advice: Mapping[str, Any] | Any | None = None,
) -> Path:
    """Write the report of the EMF documents a CloudWatch Logs group received in the last `since_s` s.

    `client` is a boto3 'logs' client. There are no timelines in EMF; the report says so.
    """
    data = load_cloudwatch(client, log_group, since_s=since_s, namespace=namespace)
    return _write(render_html(data, advice=advice), out)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
