"""The HTML report of a run: per-stage plots, a timeline per child, bad apples, contract results, advice.

The page is one HTML file that opens with no network: plotly.js is embedded once, inline, and every
chart is a plotly figure (profiling.report.figures). What it shows comes from profiling.report.sources.

Entry points: `write_report(run_dir, out, advice=...)` for a local run and
`write_report_from_cloudwatch(client, log_group, out, since_s=...)` for a batch in AWS.
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from profiling import runfiles
from profiling.metrics import DEFAULT_NAMESPACE, METRICS, METRICS_BY_NAME, TABLE_METRICS, summarize
from profiling.outliers import DEFAULT_MIN_RELATIVE, DEFAULT_THRESHOLD
from profiling.report.badapples import BadApple, find_bad_apples
from profiling.report.figures import stage_figures, timeline_figure
from profiling.report.sources import Entry, ReportData, load_cloudwatch, load_run_dir, natural_key

# Per-child timelines beyond this many are left out (slow children first): the file stays small.
MAX_TIMELINES = 48

PLOT_CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True}

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
    for e in sorted(entries, key=lambda e: natural_key(e.child)):
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
    for e in sorted(data.entries, key=lambda e: (natural_key(e.child), e.profile.stage)):
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


def write_report(run_dir: Path, out: Path | None = None, *, advice: Mapping[str, Any] | Any | None = None) -> Path:
    """Write the HTML report of a local run directory and return its path.

    `out` defaults to <run_dir>/report.html. `advice` is the advisor's recommendation (a mapping, a
    dataclass or an object with to_dict(), e.g. from tuning.advise); it is rendered as given, and the
    report says so when there is none. Raises ReportInputError when the run directory is unusable.
    """
    data = load_run_dir(Path(run_dir))
    target = Path(out) if out is not None else runfiles.report_path(Path(run_dir))
    return runfiles.write_text_atomic(target, render_html(data, advice=advice))


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
    return runfiles.write_text_atomic(Path(out), render_html(data, advice=advice))
