"""The report's sections for a batch too large for a bar per child (profiling.report.fleet.PER_CHILD_LIMIT).

Per stage: the distribution of duration and throughput across the children (histograms on a log count axis,
so one straggler among 100,000 is a visible bar), the quantiles of every metric the run measured, and the
children that took longest. For the batch: one time axis shared by every child (children in each stage, the
bytes per second all children's own timelines moved, and the spread of throughput by start time), where waves,
stalls and slow periods show where they happened. Every figure is computed from the Fleet's columns; the page
weighs the same at 1,000 children as at 100,000.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling.metrics import METRICS, METRICS_BY_NAME
from profiling.report.badapples import BadApple
from profiling.report.fleet import Fleet
from profiling.report.page import ABSENT, e, figure_html, number
from profiling.report.sources import ReportData

QUANTILES = (0.1, 0.5, 0.9, 0.99)
HISTOGRAM_BINS = 40
TIME_BUCKETS = 240
TOP_STRAGGLERS = 10
STAGE_COLORS = {"download": "#1f77b4", "process": "#2ca02c", "upload": "#9467bd"}


def _layout(fig: go.Figure, title: str, height: int = 320) -> None:
    fig.update_layout(title={"text": title, "font": {"size": 14}}, template="plotly_white", height=height,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, showlegend=False, bargap=0.02)


def histogram(fleet: Fleet, stage: str, name: str, title: str, scale: float, unit: str) -> go.Figure:
    """Children per bin of one column, on a log count axis, the median marked."""
    values = fleet.present(stage, name, ok_only=True) / scale
    fig = go.Figure()
    _layout(fig, f"{title} ({unit}), finished children")
    if not values.size:
        fig.add_annotation(text="no finished child has this figure", showarrow=False, xref="paper", yref="paper",
                           x=0.5, y=0.5, font={"size": 13, "color": "#888"})
        return fig
    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS)
    mids = (edges[:-1] + edges[1:]) / 2
    keep = counts > 0
    fig.add_trace(go.Bar(x=[float(f"{m:.5g}") for m in mids[keep]], y=counts[keep].tolist(),
                         width=float(edges[1] - edges[0]) if len(edges) > 1 else None,
                         marker_color="#3b6fb6", hovertemplate="%{x} " + unit + ": %{y} children<extra></extra>"))
    mid = float(np.median(values))
    fig.add_vline(x=mid, line_dash="dot", line_color="#444", annotation_text=f"median {number(mid)} {unit}",
                  annotation_position="top right")
    fig.update_xaxes(title_text=unit)
    fig.update_yaxes(title_text="children (log)", type="log")
    return fig


def quantile_table(fleet: Fleet, stage: str) -> str:
    """p10, median, p90, p99 and the largest value of every metric the stage measured, finished children."""
    head = ("<tr><th class=l>metric</th><th>children</th>" + "".join(f"<th>p{round(q * 100)}</th>" for q in QUANTILES)
            + "<th>largest</th></tr>")
    rows = []
    for spec in METRICS:
        values = fleet.present(stage, spec.name, ok_only=True)
        if not values.size:
            continue
        cells = [spec.display(float(v)) for v in np.quantile(values, QUANTILES)] + [spec.display(float(values.max()))]
        rows.append(f"<tr><td class=l>{e(spec.scoped_label)}</td><td>{values.size:,}</td>"
                    + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    return f"<table class=quantiles data-stage='{e(stage)}'>{head}{''.join(rows)}</table>"


def stragglers_table(fleet: Fleet, stage: str, shown: Sequence[str]) -> str:
    """The children that took longest in the stage, against the median, each linked to its timeline when the
    page shows it."""
    rows = fleet.stages[stage]
    durations = fleet.present(stage, "duration", ok_only=True)
    mid = float(np.median(durations)) if durations.size else None
    tput = METRICS_BY_NAME["Throughput"]
    head = ("<tr><th class=l>child</th><th>duration s</th><th>vs median</th>"
            f"<th>{e(tput.label)}</th><th class=l>outcome</th><th class=l>instance</th></tr>")
    body = []
    for n in fleet.slowest(stage, TOP_STRAGGLERS):
        child = rows.children[n]
        name = (f"<a href='#timeline-of-{e(child)}'>{e(child)}</a>" if child in shown else e(child))
        ratio = f"{rows.duration[n] / mid:.1f}x" if mid else ABSENT
        rate = rows.throughput[n]
        body.append(f"<tr class=straggler data-child='{e(child)}'><td class=l>{name}</td>"
                    f"<td>{number(rows.duration[n])}</td><td>{ratio}</td>"
                    f"<td>{e(tput.display(None if rate != rate else rate))}</td><td class=l>{e(rows.outcome[n])}</td>"
                    f"<td class=l>{e(rows.instance[n] or ABSENT)}</td></tr>")
    return f"<table class=stragglers data-stage='{e(stage)}'>{head}{''.join(body)}</table>"


def stage_section(data: ReportData, stage: str, shown: Sequence[str]) -> str:
    """One stage of a large batch: distributions, quantiles and the top stragglers."""
    fleet = data.fleet
    rows = fleet.stages[stage]
    unfinished = len(rows) - int(rows.ok().sum())
    tput = METRICS_BY_NAME["Throughput"]
    parts = [f"<section class=stage id='stage-{e(stage)}' data-stage='{e(stage)}'><h2>Stage: {e(stage)}</h2>",
             f"<p class=note>{len(rows):,} children"
             + (f", {unfinished:,} of them did not finish" if unfinished else "")
             + ". Distributions across the children: one bar per child is drawn only for batches of "
               "64 children or fewer.</p><div class=grid>"]
    figures = (("duration", histogram(fleet, stage, "duration", "Duration", 1.0, "s")),
               ("throughput", histogram(fleet, stage, "throughput", "Throughput", tput.scale, tput.display_unit)))
    for plot_id, fig in figures:
        parts.append(f"<div class=plot data-plot='{e(stage)}/{plot_id}'>"
                     f"{figure_html(fig, f'plot-{stage}-{plot_id}')}</div>")
    parts.append("</div><h3>Every metric across the children</h3>" + quantile_table(fleet, stage))
    parts.append(f"<h3>The {TOP_STRAGGLERS} children that took longest</h3>" + stragglers_table(fleet, stage, shown))
    parts.append("</section>")
    return "".join(parts)


def _throughput_bands(fleet: Fleet, stage: str, width: float, origin: float) -> dict[str, list[float]]:
    """Per time bucket (by start): the 10th, 50th and 90th percentile of the children's throughput."""
    rows = fleet.stages[stage]
    ok = rows.ok() & ~np.isnan(rows.column("throughput"))
    starts = rows.column("started")[ok] - origin
    rates = rows.column("throughput")[ok] / METRICS_BY_NAME["Throughput"].scale
    out: dict[str, list[float]] = {"t": [], "p10": [], "p50": [], "p90": []}
    if not starts.size:
        return out
    bucket = (starts // width).astype(np.int64)
    order = np.argsort(bucket, kind="stable")
    bucket, rates = bucket[order], rates[order]
    cuts = np.flatnonzero(np.diff(bucket)) + 1
    for group, values in zip(np.split(bucket, cuts), np.split(rates, cuts), strict=True):
        low, mid, high = np.quantile(values, (0.1, 0.5, 0.9))
        out["t"].append(round(float(group[0]) * width, 3))
        out["p10"].append(float(f"{low:.5g}"))
        out["p50"].append(float(f"{mid:.5g}"))
        out["p90"].append(float(f"{high:.5g}"))
    return out


def time_section(data: ReportData, apples: Sequence[BadApple]) -> str:
    """The whole batch on one wall-clock axis: where waves, stalls and slow periods happened."""
    fleet = data.fleet
    at, counts = fleet.activity(TIME_BUCKETS)
    origin = fleet.origin()
    width = float(at[1] - at[0]) if len(at) > 1 else 1.0
    traffic = fleet.traffic_series(TIME_BUCKETS)
    tput = METRICS_BY_NAME["Throughput"]
    titles = ["Children in each stage", f"Throughput of the children by start time ({tput.display_unit}: "
              "median, band p10-p90; red: bad apples)"]
    if traffic is not None:
        titles.insert(1, f"Bytes per second all children's own timelines moved ({tput.display_unit})")
    fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.09, subplot_titles=titles)
    fig.update_annotations(font={"size": 12})
    traces: list[Any] = []
    where: list[int] = []
    xs = [round(float(t), 3) for t in at]
    for stage, count in counts.items():
        color = STAGE_COLORS.get(stage, "#7f7f7f")
        traces.append(go.Scatter(x=xs, y=count.tolist(), name=stage, mode="lines", line={"color": color},
                                 legendgroup=stage))
        where.append(1)
    row = 2
    if traffic is not None:
        times, read, written = traffic
        for values, name, color in ((read, "read", "#1f77b4"), (written, "written", "#ff7f0e")):
            traces.append(go.Scatter(x=[round(t, 3) for t in times], y=[float(f"{v / tput.scale:.5g}") for v in values],
                                     name=f"all children {name}", mode="lines", line={"color": color}))
            where.append(row)
        row += 1
    flagged = {(a.stage, a.name) for a in apples if a.scope == "child"}
    for stage in counts:
        color = STAGE_COLORS.get(stage, "#7f7f7f")
        bands = _throughput_bands(fleet, stage, width, origin)
        traces.append(go.Scatter(x=bands["t"] + bands["t"][::-1], y=bands["p90"] + bands["p10"][::-1],
                                 fill="toself", mode="lines", line={"width": 0}, fillcolor=color, opacity=0.15,
                                 name=f"{stage} p10-p90", legendgroup=stage, showlegend=False, hoverinfo="skip"))
        traces.append(go.Scatter(x=bands["t"], y=bands["p50"], mode="lines", line={"color": color, "width": 1.4},
                                 name=f"{stage} median", legendgroup=stage, showlegend=False))
        where += [row, row]
        rows = fleet.stages[stage]
        marks = [n for n, child in enumerate(rows.children) if (stage, child) in flagged][:200]
        if marks:
            traces.append(go.Scatter(
                x=[round(rows.started[n] - origin, 3) for n in marks],
                y=[float(f"{rows.throughput[n] / tput.scale:.5g}") for n in marks], mode="markers",
                marker={"color": "#d62728", "size": 7}, name=f"{stage} bad apples", showlegend=False,
                text=[rows.children[n] for n in marks], hoverinfo="x+y+text"))
            where.append(row)
    fig.add_traces(traces, rows=where, cols=[1] * len(where))
    fig.update_layout(template="plotly_white", height=220 * len(titles) + 80, hovermode="x",
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, legend={"orientation": "h", "y": -0.08})
    fig.update_xaxes(title_text="seconds since the batch's first stage began", row=len(titles), col=1)
    fig.update_yaxes(rangemode="tozero")
    return ("<section id=fleet-time><h2>The batch over time</h2><p class=note>One time axis for every child: "
            "how many children were in each stage, what they moved together, and how fast the children that "
            "started at each moment went. A dip shared by many children is the batch's (a wave, a slow "
            "server); a red point alone is a child's.</p>"
            f"<div class=plot data-plot='fleet/time'>{figure_html(fig, 'plot-fleet-time')}</div></section>")


def contract_section(data: ReportData) -> str:
    """The contract rules' results of a large batch: per stage and label, the median, lowest and highest
    value over the children that reported one, and the first rows as they are."""
    fleet = data.fleet
    parts = ["<section id=contract><h2>Contract rules</h2>"]
    if not fleet.contract_total:
        parts.append("<p class=note>No contract rules were evaluated in this run.</p></section>")
        return "".join(parts)
    head = ("<tr><th class=l>stage</th><th class=l>label</th><th>children reporting</th><th>median</th>"
            "<th>lowest</th><th>highest</th><th class=l>source</th></tr>")
    body = []
    for stage in fleet.stage_names():
        for (g_stage, label), group in fleet.contract_groups.items():
            if g_stage != stage:
                continue
            if group.values:
                values = np.asarray(group.values)
                shown = [f"{number(float(v))} {group.unit}".strip()
                         for v in (np.median(values), values.min(), values.max())]
            else:
                shown = [group.first_note or "unavailable", ABSENT, ABSENT]
            body.append(f"<tr data-label='{e(label)}'><td class=l>{e(stage)}</td><td class=l>{e(label)}</td>"
                        f"<td>{group.count:,}</td>" + "".join(f"<td>{e(v)}</td>" for v in shown)
                        + f"<td class=l>{e(', '.join(sorted(group.sources)))}</td></tr>")
    parts.append(f"<table id=contract-summary>{head}{''.join(body)}</table>")
    parts.append(f"<p class=note>{fleet.contract_total:,} rows in all; the page lists the first "
                 f"{len(fleet.contract_rows):,} in the profiles' order.</p>")
    rows_html = "".join(
        f"<tr class=contract-row><td class=l>{e(fleet.stages[stage].children[row])}</td><td class=l>{e(stage)}</td>"
        f"<td class=l>{e(item.get('label', ABSENT))}</td><td>{e(item.get('value', item.get('note', ABSENT)))}</td>"
        f"<td class=l>{e(item.get('source', ABSENT))}</td></tr>"
        for row, stage, _, item in fleet.contract_rows)
    parts.append(f"<details><summary>the first {len(fleet.contract_rows):,} rows</summary><table id=contract-table>"
                 "<tr><th class=l>child</th><th class=l>stage</th><th class=l>label</th><th>value</th>"
                 f"<th class=l>source</th></tr>{rows_html}</table></details></section>")
    return "".join(parts)


def drill_down(data: ReportData, apples: Sequence[BadApple], limit: int) -> list[str]:
    """The children whose timelines a large batch's page shows: bad apples first, then each stage's
    longest, at most `limit`."""
    fleet = data.fleet
    chosen = [a.name for a in apples if a.scope == "child"]
    for stage in fleet.stage_names():
        chosen += [fleet.stages[stage].children[n] for n in fleet.slowest(stage, 3)]
    return list(dict.fromkeys(chosen))[:limit]
