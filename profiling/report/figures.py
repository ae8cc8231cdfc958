"""The report's figures (plotly, pure): the per-stage plots and one timeline per child.

Each per-stage plot is a row of STAGE_PLOTS and is drawn by the function PLOTTERS holds for its id;
metric names, units, labels and display scales come from profiling.metrics.METRICS only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling.metrics import METRICS_BY_NAME, MetricSpec, TimelinePoint, median
from profiling.report.sources import Entry, natural_key

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
# A limit higher than the bars by more than this factor is named, not drawn: the bars would be a pixel high.
OFF_SCALE_SHARE = 0.1
# The stall axis reaches at least this share of the stage's median duration.
STALL_AXIS_SHARE = 0.05
# Samples per child timeline; longer timelines keep the peak of each bucket, so a stall stays visible.
MAX_TIMELINE_POINTS = 1500

COLORS = {"ok": "#3b6fb6", "outlier": "#d62728", "failed": "#ff7f0e", "threshold": "#555555"}
STAGE_COLORS = {"download": "#1f77b4", "process": "#2ca02c", "upload": "#9467bd"}


@dataclass(frozen=True)
class StageView:
    """One stage's children as every per-stage plot shows them: in order, named, hovered and coloured."""

    entries: list[Entry]
    children: list[str]
    hover: list[str]
    colors: list[str]  # per child: bad apple, did not finish, or normal

    @classmethod
    def of(cls, entries: Sequence[Entry], flagged: set[str]) -> StageView:
        ordered = sorted(entries, key=lambda e: natural_key(e.child))
        return cls(ordered, [e.child for e in ordered], _hover(ordered), _child_colors(ordered, flagged))

    def series(self, spec: MetricSpec) -> list[float | None]:
        """Each child's value of `spec`, in its display unit."""
        return [_shown(spec, e.profile.value(spec)) for e in self.entries]


# A plot draws the metrics of its STAGE_PLOTS row (the first is the main one) into a laid-out figure.
Plotter = Callable[[go.Figure, Sequence[MetricSpec], StageView], None]


def _plot_spread(fig: go.Figure, specs: Sequence[MetricSpec], view: StageView) -> None:
    """A box of the spread (quartiles, median, whiskers to the extremes, drawn as shapes: the page's plotly.js
    bundle has no box trace), and one point per child coloured like the bars of the other plots."""
    main = specs[0]
    values = view.series(main)
    present = sorted(v for v in values if v is not None)
    if present:
        q1, mid, q3 = (float(f"{v:.5g}") for v in np.quantile(present, (0.25, 0.5, 0.75)))
        grey = {"color": "#7f7f7f", "width": 1.5}
        fig.update_layout(shapes=[
            {"type": "rect", "x0": q1, "x1": q3, "y0": -0.35, "y1": 0.35, "line": grey,
             "fillcolor": "rgba(59,111,182,0.12)", "layer": "below"},
            {"type": "line", "x0": mid, "x1": mid, "y0": -0.35, "y1": 0.35, "line": grey},
            {"type": "line", "x0": present[0], "x1": q1, "y0": 0, "y1": 0, "line": grey},
            {"type": "line", "x0": q3, "x1": present[-1], "y0": 0, "y1": 0, "line": grey},
        ])
    jitter = [((i * 7919) % 11 - 5) / 25 for i in range(len(values))]  # fixed, so reports diff
    fig.add_trace(go.Scatter(
        x=values, y=jitter, mode="markers", name="children", text=view.hover, hoverinfo="x+text",
        marker={"color": view.colors, "size": 9, "line": {"width": 1, "color": "#fff"}},
    ))
    fig.update_layout(showlegend=False)
    fig.update_xaxes(title_text=main.scoped_label, rangemode="tozero")
    fig.update_yaxes(showticklabels=False, range=[-1, 1], showgrid=False, zeroline=False)


def _plot_bars_with_median(fig: go.Figure, specs: Sequence[MetricSpec], view: StageView) -> None:
    """One bar per child and a line at the stage's median."""
    main = specs[0]
    values = view.series(main)
    fig.add_trace(go.Bar(x=view.children, y=values, name=main.label, marker_color=view.colors,
                         hovertext=view.hover))
    mid = median([v for v in values if v is not None])
    fig.add_hline(y=mid, line_dash="dot", line_color="#444", annotation_text=f"median {main.display(mid * main.scale)}",
                  annotation_position="top left")
    fig.update_yaxes(title_text=main.scoped_label, rangemode="tozero")
    fig.update_layout(showlegend=False)
    _category_axis(fig, view)


def _plot_against_limit(fig: go.Figure, specs: Sequence[MetricSpec], view: StageView) -> None:
    """One bar per child of the main metric, and the second metric (a limit) as a dashed line; a limit so far
    above the bars that they would be a pixel high is named instead of drawn (OFF_SCALE_SHARE)."""
    main, limit = specs
    values = view.series(main)
    fig.add_trace(go.Bar(x=view.children, y=values, name=main.label, marker_color=view.colors,
                         hovertext=view.hover))
    limits = view.series(limit)
    top = max((v for v in values if v is not None), default=0.0)
    highest = max((v for v in limits if v is not None), default=None)
    if highest is not None and top < OFF_SCALE_SHARE * highest:
        fig.add_annotation(text=f"{limit.label}: {limit.display(highest * limit.scale)}, off this scale (the "
                           f"highest bar is {top / highest:.0%} of it)", showarrow=False, xref="paper",
                           yref="paper", x=0.5, y=1.02, font={"size": 12, "color": COLORS["threshold"]})
    elif highest is not None:
        fig.add_trace(go.Scatter(
            x=view.children, y=limits, name=limit.label, mode="lines+markers",
            line={"color": COLORS["threshold"], "dash": "dash"}, marker={"symbol": "line-ew-open"},
        ))
    fig.update_yaxes(title_text=main.scoped_label, rangemode="tozero")
    _category_axis(fig, view)


def _plot_grouped(fig: go.Figure, specs: Sequence[MetricSpec], view: StageView) -> None:
    """Side-by-side bars per child, one colour per metric the run measured. A stall is judged against the
    stage: the axis reaches at least STALL_AXIS_SHARE of the stage's median duration, so a stall of a
    fraction of a millisecond is not drawn full height."""
    top = 0.0
    for spec, color in zip(specs, ("#e377c2", "#8c564b"), strict=True):
        series = view.series(spec)
        if any(v is not None for v in series):
            top = max([top, *(v for v in series if v is not None)])
            fig.add_trace(go.Bar(x=view.children, y=series, name=spec.label, marker_color=color,
                                 hovertext=view.hover))
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text=specs[0].scoped_label, rangemode="tozero")
    durations = [e.profile.duration_s for e in view.entries if e.profile.duration_s > 0]
    if durations and specs[0].display_unit == "ms":
        floor = STALL_AXIS_SHARE * median(durations) * 1000
        if top < floor:
            fig.update_yaxes(range=[0, floor])
            fig.add_annotation(text=f"axis: {STALL_AXIS_SHARE:.0%} of the stage's median duration", showarrow=False,
                               xref="paper", yref="paper", x=1, y=1.02, xanchor="right",
                               font={"size": 11, "color": "#888"})
    _category_axis(fig, view)


PLOTTERS: Mapping[str, Plotter] = {
    "duration": _plot_spread,
    "throughput": _plot_bars_with_median,
    "write-latency": _plot_bars_with_median,
    "queue-depth": _plot_bars_with_median,
    "dirty": _plot_against_limit,
    "io-stall": _plot_grouped,
}


def stage_figures(entries: Sequence[Entry], flagged: set[str]) -> list[tuple[str, go.Figure]]:
    """The STAGE_PLOTS of one stage, as (plot id, figure); `flagged` names the bad apples."""
    view = StageView.of(entries, flagged)
    figures: list[tuple[str, go.Figure]] = []
    for plot_id, title, names in STAGE_PLOTS:
        specs = [METRICS_BY_NAME[n] for n in names]
        main = specs[0]
        fig = go.Figure()
        unit = f" ({main.display_unit})" if main.display_unit else ""
        _base_layout(fig, title + unit)
        if all(v is None for v in view.series(main)):
            _no_data(fig, _why_absent(main, view))
        else:
            PLOTTERS[plot_id](fig, specs, view)
        figures.append((plot_id, fig))
    return figures


def _category_axis(fig: go.Figure, view: StageView) -> None:
    fig.update_xaxes(type="category", tickangle=-30 if len(view.children) > 8 else 0)


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


def _why_absent(spec: MetricSpec, view: StageView) -> str:
    """Why no child has `spec`: a per-request figure of a device that completed no such request was measured
    (there was nothing to average), anything else was not measured."""
    ops = {"DeviceWriteLatency": "device_write_ops", "DeviceReadLatency": "device_read_ops"}.get(spec.name)
    if ops and any(getattr(e.profile, ops) == 0 for e in view.entries):
        kind = "writes" if "Write" in spec.name else "reads"
        return f"nothing to show: the scratch device completed no {kind} in this stage"
    return f"no data: this run did not measure {spec.description.lower() or spec.name}"


def _no_data(fig: go.Figure, text: str) -> None:
    fig.add_annotation(
        text=text,
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


# ---- timelines ---------------------------------------------------------------------------------------


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


def sampling_note(entries: Sequence[Entry]) -> str:
    """How the timeline was sampled, from the samples themselves: how many, and how far apart."""
    gaps: list[float] = []
    count = 0
    for entry in entries:
        times = [0.0, *(q.t for q in entry.profile.timeline)]
        count += len(entry.profile.timeline)
        gaps.extend(b - a for a, b in itertools.pairwise(times) if b > a)
    if not gaps:
        return "no samples"
    low, high = min(gaps), max(gaps)
    spacing = f"every {_seconds(low)}" if high < 1.5 * low else f"{_seconds(low)} to {_seconds(high)} apart"
    return f"{count} samples, {spacing}"


def _seconds(value: float) -> str:
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.3g} s"


def timeline_figure(child: str, entries: Sequence[Entry], run_span: tuple[float, float] | None = None) -> go.Figure:
    """One child's stages on one time axis: throughput, dirty and writeback against the threshold, PSI.

    With `run_span` (the run's first start and last end, epoch seconds) every child is drawn on the run's
    time axis, the same for all: children that ran at once line up, so contention shows where it happens.
    Without it the axis starts at the child's first stage."""
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
    origin = run_span[0] if run_span else (ordered[0].profile.started_at if ordered else 0.0)
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
        job_peak = max([job_peak, *(v for q in points for v in (q.read_bps, q.write_bps) if v is not None)])
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
        template="plotly_white", height=540, hovermode="x unified",
        title={"text": f"{child}: {sampling_note(ordered)}", "font": {"size": 12, "color": "#555"}, "y": 0.985},
        margin={"l": 60, "r": 20, "t": 100, "b": 50}, legend={"orientation": "h", "y": -0.16},
        shapes=shapes, annotations=[*fig.layout.annotations, *labels],
        yaxis=top_axis,
        yaxis2={"title_text": dirty.display_unit, "rangemode": "tozero"},
        yaxis3={"title_text": stall.display_unit, "rangemode": "tozero"},
        xaxis3={"title_text": "seconds since the run's first stage" if run_span else
                "seconds since the child's first stage"},
    )
    if run_span:
        fig.update_xaxes(range=[0, round(run_span[1] - run_span[0], 3)])
    return fig


