"""Two runs side by side, per stage: the loop deploy -> profile -> advice -> redeploy -> faster, in one page.

Per stage it shows, for run A and run B, the figures of COMPARED (aggregated across children as
profiling.metrics.METRICS says: durations and rates are medians, dirty figures the peak) with the ratio
B / A, and a plot of the children of both runs; then the advisor's findings that went away, stayed, or
came with B, when advice for the runs is given.

Entry points: `render_comparison(a, b)` on two ReportData, and `write_comparison(run_a, run_b, out)` on
two local run directories or ReportData already read (a CloudWatch Logs range: sources.parse_run_side),
what `iobatch report --compare` and `iobatch lab` write.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from profiling import runfiles
from profiling.metrics import METRICS_BY_NAME, Better
from profiling.report.advice import advice_as_data, findings_of
from profiling.report.page import e, figure_html, human_bytes, number, page
from profiling.report.rundir import load_run_dir
from profiling.report.sources import ReportData

# The figures compared per stage; which way each gets better is its definition's (MetricSpec.better).
COMPARED: tuple[str, ...] = ("StageDuration", "Throughput", "PeakDirtyBytes", "DirtyThresholdBytes", "IoStallSome",
                             "DirtyThrottle", "DeviceWriteLatency", "DeviceQueueDepth")


def smaller_is_better(name: str) -> bool | None:
    """True when a smaller value of the metric is the better one, False when a larger is, None for neither."""
    better = METRICS_BY_NAME[name].better
    return None if better is Better.NEITHER else better is Better.LOWER
# The plot's panels: (metric, title).
PANELS: tuple[tuple[str, str], ...] = (
    ("StageDuration", "duration"),
    ("Throughput", "throughput"),
    ("PeakDirtyBytes", "peak dirty against the limit"),
    ("IoStallSome", "I/O stall (PSI some)"),
)
RUN_COLORS = ("#7f8c8d", "#2e86de")
# Changes smaller than this share are shown without colour: run-to-run noise on a shared machine.
NOISE_SHARE = 0.05


def ratio_text(a: float | None, b: float | None, smaller_is_better: bool | None) -> tuple[str, str]:
    """(B / A as text, css class): 'better' or 'worse' when the change is past the noise, else ''."""
    if a is None or b is None:
        return "-", ""
    if a == 0:
        return ("same", "") if b == 0 else ("from 0", "")
    ratio = b / a
    if smaller_is_better is None or abs(ratio - 1) < NOISE_SHARE:
        return f"{ratio:.2f}x", ""
    return f"{ratio:.2f}x", "better" if (ratio < 1) == smaller_is_better else "worse"


def _stage_table(stage: str, rows: tuple[dict[str, float | None], dict[str, float | None]],
                 names: Sequence[str]) -> str:
    head = (f"<tr><th class=l>figure</th><th>{e(names[0])}</th><th>{e(names[1])}</th>"
            f"<th>{e(names[1])} / {e(names[0])}</th></tr>")
    body = []
    for name in COMPARED:
        spec = METRICS_BY_NAME[name]
        a, b = rows[0].get(name), rows[1].get(name)
        if a is None and b is None:
            continue
        text, css = ratio_text(a, b, smaller_is_better(name))
        unit = f" {spec.display_unit}" if spec.display_unit else ""
        shown = [spec.display(v) + (unit if v is not None else "") for v in (a, b)]
        body.append(f"<tr data-figure='{e(name)}'><td class=l>{e(spec.description or spec.label)}</td>"
                    f"<td>{e(shown[0])}</td><td>{e(shown[1])}</td><td class='{css}'>{e(text)}</td></tr>")
    children = [int(r.get("children") or 0) for r in rows]
    return (f"<table class=compare-table data-stage='{e(stage)}'>{head}{''.join(body)}</table>"
            f"<p class=note>{children[0]} and {children[1]} children. Durations, rates, latencies and stalls "
            "are medians across children; dirty figures are the peak.</p>")


def _stage_figure(stage: str, runs: Sequence[ReportData], names: Sequence[str]) -> go.Figure:
    """Each child of both runs, per panel: the runs side by side, the dirty limit as a line."""
    fig = make_subplots(rows=1, cols=len(PANELS), subplot_titles=[
        f"{title} ({METRICS_BY_NAME[m].display_unit})" for m, title in PANELS])
    fig.update_annotations(font={"size": 12})
    limit = METRICS_BY_NAME["DirtyThresholdBytes"]
    for col, (metric, _) in enumerate(PANELS, 1):
        spec = METRICS_BY_NAME[metric]
        for n, (data, name, color) in enumerate(zip(runs, names, RUN_COLORS, strict=True)):
            entries = data.of_stage(stage)
            if not data.complete:  # a large batch: its box from the quantiles, not a point per child
                present = data.fleet.present(stage, spec.name) / spec.scale
                if present.size:
                    q = [float(f"{v:.5g}") for v in np.quantile(present, (0, 0.25, 0.5, 0.75, 1))]
                    fig.add_trace(go.Box(x=[name], lowerfence=[q[0]], q1=[q[1]], median=[q[2]], q3=[q[3]],
                                         upperfence=[q[4]], name=name, marker_color=color, showlegend=col == 1,
                                         legendgroup=name, offsetgroup=str(n)), row=1, col=col)
                limits = (data.fleet.present(stage, limit.name) / limit.scale).tolist() \
                    if metric == "PeakDirtyBytes" else []
            else:
                values = [None if (v := x.profile.value(spec)) is None else v / spec.scale for x in entries]
                fig.add_trace(go.Box(y=values, name=name, marker_color=color, boxpoints="all", jitter=0.4,
                                     pointpos=0, text=[x.child for x in entries], showlegend=col == 1,
                                     legendgroup=name, offsetgroup=str(n)), row=1, col=col)
                limits = [v / limit.scale for x in entries if (v := x.profile.value(limit)) is not None]
            if metric == "PeakDirtyBytes" and limits:
                fig.add_trace(go.Scatter(x=[name], y=[max(limits)], mode="markers", showlegend=False,
                                         marker={"symbol": "line-ew-open", "size": 40, "color": "#555"},
                                         name=f"{limit.label} ({name})"), row=1, col=col)
        fig.update_yaxes(rangemode="tozero", row=1, col=col)
    fig.update_layout(template="plotly_white", height=340, margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.12}, boxmode="group")
    return fig


# Two runs did the same work when their images and bytes per child differ by less than this share.
SAME_WORK_SHARE = 0.1


def _per_child(row: Mapping[str, float | None], name: str) -> float | None:
    """A stage's total `name` (a summed figure) over its children: the mean child's."""
    total, children = row.get(name), row.get("children")
    return None if total is None or not children else total / children


def _workloads(runs: Sequence[ReportData], names: Sequence[str],
               summaries: Sequence[Mapping[str, Mapping[str, float | None]]]) -> tuple[str, bool]:
    """The work each run did (children, images and bytes downloaded per child), and whether it differs: a
    duration ratio of runs that did different work compares work, not speed."""
    work = [(r.child_count(), _per_child(s.get("download", {}), "Items"),
             _per_child(s.get("download", {}), "WriteBytes")) for r, s in zip(runs, summaries, strict=True)]
    differ = any(a is not None and b is not None and abs(b - a) > SAME_WORK_SHARE * max(a, b)
                 for a, b in zip(work[0][1:], work[1][1:], strict=True))
    rows = "".join(f"<tr><td class=l>{e(n)}</td><td>{c:,}</td><td>{e(number(i))}</td><td>{e(human_bytes(b))}</td>"
                   "</tr>" for n, (c, i, b) in zip(names, work, strict=True))
    table = ("<table id=compare-workloads><tr><th class=l>run</th><th>children</th><th>images per child</th>"
             f"<th>downloaded per child</th></tr>{rows}</table>")
    if differ:
        table += ("<p class=flag id=compare-work-differs>The runs did different work: their durations compare the "
                  "work, not the speed. Compare the per-GiB and per-image columns below.</p>")
    return table, differ


def _per_unit(row: Mapping[str, float | None]) -> tuple[float | None, float | None]:
    """A stage's median duration per GiB the mean child moved, and per image it handled."""
    duration = row.get("StageDuration")
    moved = max(_per_child(row, "ReadBytes") or 0.0, _per_child(row, "WriteBytes") or 0.0)
    images = _per_child(row, "Items")
    if duration is None:
        return None, None
    return (duration / (moved / 2**30) if moved else None), (duration / images if images else None)


def _findings(advice: Sequence[Any], names: Sequence[str]) -> str:
    parts = ["<section id=compare-findings><h2>Findings</h2>"]
    data = [advice_as_data(a) for a in advice]
    missing = [n for n, d in zip(names, data, strict=True) if d is None or not isinstance(d.get("findings"), list)]
    if missing:
        parts.append(f"<p class=note>No advisor findings for {e(' and '.join(missing))}, so none are compared "
                     "(iobatch report --compare gives them for local run directories, judged on this machine; "
                     "a CloudWatch range has none).</p></section>")
        return "".join(parts)
    found = [{f.get("code"): f for f in findings_of(d)} for d in data]
    groups = (("went away", [c for c in found[0] if c not in found[1]], 0, "better"),
              ("still there", [c for c in found[0] if c in found[1]], 1, ""),
              (f"new in {names[1]}", [c for c in found[1] if c not in found[0]], 1, "worse"))
    rows = []
    for label, codes, side, css in groups:
        for code in codes:
            f = found[side][code]
            rows.append(f"<tr data-code='{e(code)}'><td class='l {css}'>{e(label)}</td><td class=l><code>"
                        f"{e(code)}</code></td><td class=wrap>{e(f.get('title', ''))}</td>"
                        f"<td class=wrap>{e(f.get('evidence', ''))}</td></tr>")
    if not rows:
        parts.append("<p>Neither run has findings.</p></section>")
        return "".join(parts)
    parts.append("<table id=compare-findings-table><tr><th class=l></th><th class=l>code</th>"
                 f"<th class=l>finding</th><th class=l>evidence</th></tr>{''.join(rows)}</table></section>")
    return "".join(parts)


def render_comparison(a: ReportData, b: ReportData, *, names: Sequence[str] = ("A", "B"),
                      advice: Sequence[Any] = (None, None), title: str = "iobatch: two runs compared") -> str:
    """The comparison page of two runs (plotly.js inline, no network needed to open it)."""
    runs = (a, b)
    summaries = [r.fleet.summary() for r in runs]
    stages = [s for s in a.stages() if s in b.stages()]
    only = sorted(set(a.stages()) ^ set(b.stages()))
    body = ["<section id=compare-overview><h2>The runs</h2><dl class=kv>"]
    body += [f"<dt>{e(n)}</dt><dd>{e(r.source)}</dd>" for n, r in zip(names, runs, strict=True)]
    body.append("</dl>")
    if only:
        body.append(f"<p class=note>Stages in one run only, not compared: {e(', '.join(only))}.</p>")
    work, differ = _workloads(runs, names, summaries)
    body.append(work)
    head = ("<tr><th class=l>stage</th>" + "".join(f"<th>duration {e(n)}</th>" for n in names) + "<th>ratio</th>"
            + ("<th>ratio per GiB moved</th><th>ratio per image</th>" if differ else "") + "</tr>")
    rows = []
    for stage in stages:
        d = [summaries[i].get(stage, {}).get("StageDuration") for i in (0, 1)]
        text, css = ratio_text(d[0], d[1], not differ or None)
        cells = ""
        if differ:
            units = [_per_unit(summaries[i].get(stage, {})) for i in (0, 1)]
            for k in (0, 1):
                unit_text, unit_css = ratio_text(units[0][k], units[1][k], True)
                cells += f"<td class='{unit_css}'>{e(unit_text)}</td>"
        rows.append(f"<tr><td class=l><a href='#compare-{e(stage)}'>{e(stage)}</a></td>"
                    + "".join(f"<td>{e(METRICS_BY_NAME['StageDuration'].display(v))} s</td>" for v in d)
                    + f"<td class='{css}'>{e(text)}</td>{cells}</tr>")
    body.append(f"<table id=compare-summary>{head}{''.join(rows)}</table></section>")
    for stage in stages:
        rows_ab = (summaries[0].get(stage, {}), summaries[1].get(stage, {}))
        body.append(f"<section class=compare-stage id='compare-{e(stage)}' data-stage='{e(stage)}'>"
                    f"<h2>Stage: {e(stage)}</h2>{_stage_table(stage, rows_ab, names)}"
                    f"<div class=plot data-plot='compare/{e(stage)}'>"
                    f"{figure_html(_stage_figure(stage, runs, names), f'compare-plot-{stage}')}</div></section>")
    body.append(_findings(advice, names))
    nav = [("compare-overview", "The runs"), *((f"compare-{s}", s) for s in stages),
           ("compare-findings", "Findings")]
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return page(title, f"{names[0]} against {names[1]}, generated {generated}", nav, "".join(body))


def write_comparison(run_a: Path | ReportData, run_b: Path | ReportData, out: Path, *,
                     names: Sequence[str] | None = None, advice: Sequence[Any] = (None, None)) -> Path:
    """Write the comparison of two runs, each a local run directory or ReportData, to `out` (atomically) and
    return it.

    `names` label the runs (default: the directories' names, or A and B); `advice` is the advisor's output
    for each run (Advice, its to_dict(), or None). Raises ReportInputError when a run directory is unusable.
    """
    runs = [r if isinstance(r, ReportData) else load_run_dir(Path(r)) for r in (run_a, run_b)]
    shown = tuple(names) if names else tuple(
        default if isinstance(r, ReportData) else (Path(r).name or str(r))
        for r, default in zip((run_a, run_b), ("A", "B"), strict=True))
    if shown[0] == shown[1]:
        shown = (f"A: {shown[0]}", f"B: {shown[1]}")
    return runfiles.write_text_atomic(Path(out), render_comparison(runs[0], runs[1], names=shown, advice=advice))
