"""The HTML report of a run: per-stage plots, a timeline per child, bad apples, contract results, advice.

The page is one HTML file that opens with no network: plotly.js is embedded once, inline, and every
chart is a plotly figure (profiling.report.figures). What it shows comes from profiling.report.sources.

Entry points: `write_report(run_dir, out, advice=...)` for a local run and
`write_report_from_cloudwatch(client, log_group, out, since_s=...)` for a batch in AWS.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from profiling import runfiles
from profiling.metrics import DEFAULT_NAMESPACE, METRICS, METRICS_BY_NAME, TABLE_METRICS
from profiling.outliers import DEFAULT_MIN_RELATIVE, DEFAULT_THRESHOLD
from profiling.report import fleetpage
from profiling.report.advice import advice_section
from profiling.report.badapples import BadApple, find_bad_apples
from profiling.report.cloudwatch import load_cloudwatch
from profiling.report.figures import stage_figures, timeline_figure
from profiling.report.hosts import host_rows, hosts_table
from profiling.report.page import ABSENT, e, figure_html, human_bytes, key_values, number, page
from profiling.report.rundir import load_run_dir
from profiling.report.sources import Entry, ReportData, natural_key
from profiling.report.summary import summary_section

# Per-child timelines beyond this many are left out (slow children first): the file stays small.
MAX_TIMELINES = 48
# A large batch's page draws the timelines of this many children: the bad apples, then the longest per stage.
MAX_FLEET_TIMELINES = 12
MAX_BAD_APPLE_ROWS = 100
# run.json fields that hold a wall-clock time (seconds since the epoch).
RUN_TIMES = ("started", "finished")


def _utc(epoch: Any) -> str:
    if not isinstance(epoch, int | float):
        return str(epoch)
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _run_fields(run: Mapping[str, Any]) -> str:
    """run.json for a person: times as dates, bytes with units, absent fields left out."""
    shown = {k: (_utc(v) if k in RUN_TIMES else v) for k, v in run.items()}
    return key_values(shown)


def _summary_table(data: ReportData) -> str:
    summary = data.fleet.summary()
    # The network bytes are the children's own or the host's: the column no stage has is left out.
    specs = [METRICS_BY_NAME[n] for n in TABLE_METRICS
             if "Network" not in n or any(r.get(n) is not None for r in summary.values())]
    sharers = METRICS_BY_NAME["DeviceSharers"]
    head = ("<th class=l>stage</th><th>children</th>" + "".join(f"<th>{e(s.scoped_label)}</th>" for s in specs)
            + f"<th>{e(sharers.scoped_label)}</th>")
    rows = []
    for stage in data.stages():
        row = summary.get(stage)
        if row is None:
            continue
        children = len(set(data.fleet.stages[stage].children))
        cells = "".join(f"<td>{e(s.display(row.get(s.name)))}</td>" for s in [*specs, sharers])
        rows.append(f"<tr><td class=l><a href='#stage-{e(stage)}'>{e(stage)}</a></td><td>{children}</td>{cells}</tr>")
    return (
        f"<table id=summary-table><tr>{head}</tr>{''.join(rows)}</table>"
        "<p class=note>Durations, rates and latencies are medians across children; each child's own bytes, "
        "calls and images are totals over the run; dirty figures are the peak. A figure marked [device] is the "
        "scratch device's, shared by every child on it (the most children on it at once is the last column), "
        "and one marked [host] is the whole host's: those are the largest any child saw, never summed.</p>"
    )


def _detail_table(entries: Sequence[Entry]) -> str:
    specs = [s for s in METRICS if any(x.profile.value(s) is not None for x in entries)]
    head = "<th class=l>child</th><th class=l>outcome</th><th class=l>instance</th>" + "".join(
        f"<th>{e(s.scoped_label)}</th>" for s in specs
    )
    rows = []
    for x in sorted(entries, key=lambda x: natural_key(x.child)):
        cells = "".join(f"<td>{e(s.display(x.profile.value(s)))}</td>" for s in specs)
        rows.append(
            f"<tr><td class=l>{e(x.child)}</td><td class=l>{e(x.profile.outcome)}</td>"
            f"<td class=l>{e(x.instance or '-')}</td>{cells}</tr>"
        )
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _bad_apple_section(data: ReportData, apples: Sequence[BadApple]) -> str:
    tput = METRICS_BY_NAME["Throughput"]
    parts = ["<section id=bad-apples><h2>Bad apples</h2>"]
    parts.append(
        f"<p class=note>A child or instance is flagged when its {e(tput.label)} in a stage is low, with a "
        f"robust z-score (median and MAD) below -{DEFAULT_THRESHOLD}, and differs from the stage median by at least "
        f"{DEFAULT_MIN_RELATIVE:.0%}. Stages need three or more finished children to compare.</p>"
    )
    spread = []
    for stage in data.stages():
        values = data.fleet.present(stage, "throughput", ok_only=True)
        values = values[values > 0]
        if len(values) >= 2:
            spread.append(f"{e(stage)} {values.max() / values.min():.1f} : 1")
    if spread:
        parts.append(f"<p class=note>Spread between the fastest and the slowest child: {', '.join(spread)}.</p>")
    parts.append(hosts_table(host_rows(data.fleet)))
    if not apples:
        parts.append("<p id=no-bad-apples>No child or instance stands out.</p></section>")
        return "".join(parts)
    head = ("<tr><th class=l>stage</th><th class=l>scope</th><th class=l>name</th>"
            f"<th>{e(tput.label)}</th><th>stage median {e(tput.display_unit)}</th><th>vs median</th>"
            "<th>robust z</th><th class=l>where</th></tr>")
    rows = []
    if len(apples) > MAX_BAD_APPLE_ROWS:
        parts.append(f"<p class=note>{len(apples):,} bad apples; the {MAX_BAD_APPLE_ROWS} with the lowest z-scores "
                     "are listed.</p>")
    for a in sorted(apples, key=lambda a: a.outlier.z)[:MAX_BAD_APPLE_ROWS] if len(apples) > MAX_BAD_APPLE_ROWS \
            else apples:
        o = a.outlier
        ratio = f"{o.ratio:.2f}x" if o.ratio is not None else "-"
        rows.append(
            f"<tr class=bad data-stage='{e(a.stage)}' data-scope='{e(a.scope)}' data-name='{e(a.name)}'>"
            f"<td class=l>{e(a.stage)}</td><td class=l>{e(a.scope)}</td><td class=l>{e(a.name)}</td>"
            f"<td>{e(tput.display(o.value))}</td><td>{e(tput.display(o.median))}</td><td>{ratio}</td>"
            f"<td>{f'{o.z:+.1f}' if math.isfinite(o.z) else '-'}</td><td class=l>{e(a.detail)}</td></tr>"
        )
    parts.append(f"<table id=bad-apple-table>{head}{''.join(rows)}</table></section>")
    return "".join(parts)


def _contract_value(row: Mapping[str, Any]) -> str:
    """A contract row's value with its unit, or why there is none (the evaluator's note)."""
    value = row.get("value")
    if not isinstance(value, int | float):
        return str(row.get("note") or "unavailable")
    shown = f"{number(float(value))} {row.get('unit') or ''}".strip()
    if row.get("unit") == "B" and value >= 1 << 20:  # the contract's unit, and one a person reads at once
        shown += f" ({human_bytes(value)})"
    return shown


def _contract_frame(row: Mapping[str, Any]) -> str:
    start, end = row.get("start_s"), row.get("end_s")
    if not isinstance(start, int | float) or not isinstance(end, int | float):
        return ABSENT
    return f"{number(start)}-{number(end)} s (frame {row.get('frame', 0)})"


def _contract_section(data: ReportData) -> str:
    """The rows the contract evaluator wrote per stage (profiling.contract.evaluate_stage): a rule reports
    a value per time frame where it reaches its threshold, or one row with no value and a note."""
    rows: list[tuple[Entry, Mapping[str, Any]]] = [
        (entry, row) for entry in sorted(data.entries, key=lambda x: (natural_key(x.child), x.profile.stage))
        for row in entry.profile.contract if isinstance(row, Mapping)
    ]
    parts = ["<section id=contract><h2>Contract rules</h2>"]
    if not rows:
        parts.append("<p class=note>No contract rules were evaluated in this run.</p></section>")
        return "".join(parts)
    parts.append(
        "<p class=note>Each rule reports its value per time frame where the value reaches the rule's threshold; "
        "a rule the run's probes cannot answer is one row without a value, saying why.</p>"
    )
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for entry, row in rows:
        groups.setdefault((entry.profile.stage, str(row.get("label", ABSENT))), []).append(row)
    head = ("<tr><th class=l>stage</th><th class=l>label</th><th>children reporting</th><th>median</th>"
            "<th>lowest</th><th>highest</th><th class=l>source</th></tr>")
    summary = []
    for stage in data.stages():
        for (g_stage, label), group in groups.items():
            if g_stage != stage:
                continue
            values = sorted(float(r["value"]) for r in group if isinstance(r.get("value"), int | float))
            unit = str(group[0].get("unit") or "")
            shown = [f"{number(v)} {unit}".strip() for v in
                     (values[len(values) // 2], values[0], values[-1])] if values else [ABSENT] * 3
            if not values:
                shown[0] = _contract_value(group[0])
            sources = ", ".join(sorted({str(r.get("source", ABSENT)) for r in group}))
            summary.append(f"<tr data-label='{e(label)}'><td class=l>{e(stage)}</td><td class=l>{e(label)}</td>"
                           f"<td>{len(group)}</td>" + "".join(f"<td>{e(v)}</td>" for v in shown)
                           + f"<td class=l>{e(sources)}</td></tr>")
    parts.append(f"<table id=contract-summary>{head}{''.join(summary)}</table>")
    head = ("<tr><th class=l>child</th><th class=l>stage</th><th class=l>label</th><th>value</th>"
            "<th>time frame</th><th class=l>source</th><th class=l>note</th></tr>")
    body = "".join(
        f"<tr class=contract-row><td class=l>{e(entry.child)}</td><td class=l>{e(entry.profile.stage)}</td>"
        f"<td class=l>{e(row.get('label', ABSENT))}</td><td>{e(_contract_value(row))}</td>"
        f"<td>{e(_contract_frame(row))}</td><td class=l>{e(row.get('source', ABSENT))}</td>"
        f"<td class=wrap>{e(row.get('note') or '')}</td></tr>"
        for entry, row in rows
    )
    parts.append(f"<details><summary>every row ({len(rows)})</summary>"
                 f"<table id=contract-table>{head}{body}</table></details></section>")
    return "".join(parts)


def _overview(data: ReportData, apples: Sequence[BadApple]) -> str:
    stages = data.stages()
    body = ["<section id=overview><h2>Overview</h2>",
            f"<p>{e(data.source)}. Children: {data.child_count():,}. Stages: {e(', '.join(stages))}.</p>"]
    fleet = data.fleet
    failed = [(fleet.stages[stage].children[n], stage, outcome) for stage in stages
              for n, outcome in enumerate(fleet.stages[stage].outcome) if outcome != "ok"]
    if failed:
        names = ", ".join(f"{child} {stage} ({outcome})" for child, stage, outcome in failed[:20])
        more = f" and {len(failed) - 20:,} more" if len(failed) > 20 else ""
        body.append(f"<p class=flag>Stages that did not finish: {e(names)}{more}</p>")
    if apples:
        names = ", ".join(
            f"host {a.name} ({a.detail})" if a.scope == "host" else
            f"{a.name if a.scope == 'child' else 'instance ' + a.name} in {a.stage}" for a in apples[:10]
        )
        body.append(f"<p class=flag>Bad apples: {e(names)} (see <a href='#bad-apples'>below</a>).</p>")
    for note in data.notes:
        body.append(f"<p class=note>{e(note)}</p>")
    body.append(_summary_table(data))
    if data.run:
        body.append(f"<details><summary>the run (run.json)</summary>{_run_fields(data.run)}</details>")
    body.append("</section>")
    return "".join(body)


def _stage_sections(data: ReportData, apples: Sequence[BadApple]) -> str:
    """A small batch's stages: every plot with a bar or point per child, and every metric per child."""
    body = []
    for stage in data.stages():
        entries = data.of_stage(stage)
        flagged = {a.name for a in apples if a.stage == stage and a.scope == "child"}
        body.append(f"<section class=stage id='stage-{e(stage)}' data-stage='{e(stage)}'>")
        body.append(f"<h2>Stage: {e(stage)}</h2><p class=note>{len(entries)} children. "
                    "Red bars: bad apples; orange: the stage did not finish.</p><div class=grid>")
        for plot_id, fig in stage_figures(entries, flagged):
            div_id = f"plot-{stage}-{plot_id}"
            body.append(f"<div class=plot data-plot='{e(stage)}/{e(plot_id)}'>{figure_html(fig, div_id)}</div>")
        body.append(f"</div><details><summary>every metric per child</summary>{_detail_table(entries)}</details>")
        body.append("</section>")
    return "".join(body)


def _timelines(data: ReportData, apples: Sequence[BadApple], children: Sequence[str] | None = None) -> str:
    """A timeline per child: every child of a small batch (bad apples first, at most MAX_TIMELINES), or the
    `children` a large batch's page drills down to, read again from their files."""
    body = ["<section id=timelines><h2>Timelines per child</h2>"]
    slow = [a.name for a in apples if a.scope == "child"]
    if children is None:
        entries = data.entries
        with_samples = [c for c in data.children() if any(x.profile.timeline for x in entries if x.child == c)]
    else:
        entries = data.reread(set(children)) if data.reread is not None and data.has_timelines else []
        with_samples = [c for c in children if any(x.profile.timeline for x in entries if x.child == c)]
    if not data.has_timelines or not with_samples:
        body.append(
            "<p id=no-timelines class=note>No timelines: "
            + ("EMF documents carry one set of figures per stage, not the samples behind them. "
               "Run `iobatch report` on a local run directory for timelines."
               if not data.has_timelines else "the profiles carry no samples.")
            + "</p></section>"
        )
        return "".join(body)
    ordered = list(dict.fromkeys([c for c in slow if c in with_samples] + with_samples))
    shown = ordered[:MAX_TIMELINES]
    if children is not None:
        body.append(f"<p class=note>The timelines of {len(shown)} of {data.child_count():,} children: the bad "
                    "apples, then the children that took longest in each stage.</p>")
    elif len(ordered) > len(shown):
        body.append(f"<p class=note>Showing {len(shown)} of {len(ordered)} children (bad apples first).</p>")
    span = (min(x.profile.started_at for x in entries),  # not empty: some child has samples
            max(x.profile.started_at + x.profile.duration_s for x in entries))
    body.append("<p class=note>Every child on one time axis: children that ran at once line up.</p>")
    for n, child in enumerate(shown):
        mine = [x for x in entries if x.child == child]
        mark = " <span class=flag>(bad apple)</span>" if child in slow else ""
        body.append(f"<h3 id='timeline-of-{e(child)}'>{e(child)}{mark}</h3>")
        body.append(f"<div class='plot timeline' data-child='{e(child)}'>"
                    f"{figure_html(timeline_figure(child, mine, span), f'timeline-{n}')}</div>")
    body.append("</section>")
    return "".join(body)


def render_html(data: ReportData, *, advice: Any = None, title: str = "iobatch run report") -> str:
    """The whole report as one HTML document (plotly.js inline, no network needed to open it).

    A batch of up to PER_CHILD_LIMIT children shows every child in every plot; a larger one shows
    distributions, one time axis for the whole batch and the top stragglers (profiling.report.fleetpage).
    """
    apples = find_bad_apples(data)
    stages = data.stages()
    body = [summary_section(data, advice, apples), _overview(data, apples)]  # the answer first, the plots after
    if data.complete:
        body.append(_stage_sections(data, apples))
        body.append(_bad_apple_section(data, apples))
        body.append(_timelines(data, apples))
        body.append(_contract_section(data))
        nav = [("summary", "Summary"), ("overview", "Overview"), *((f"stage-{s}", s) for s in stages)]
    else:
        drilled = fleetpage.drill_down(data, apples, MAX_FLEET_TIMELINES)
        shown = drilled if data.has_timelines else []
        body.append(fleetpage.time_section(data, apples))
        body += [fleetpage.stage_section(data, stage, shown) for stage in stages]
        body.append(_bad_apple_section(data, apples))
        body.append(_timelines(data, apples, drilled))
        body.append(fleetpage.contract_section(data))
        nav = [("summary", "Summary"), ("overview", "Overview"), ("fleet-time", "Over time"),
               *((f"stage-{s}", s) for s in stages)]
    body.append(advice_section(advice))
    nav += [("bad-apples", "Bad apples"), ("timelines", "Timelines"), ("contract", "Contract"),
            ("advice", "Recommendation")]
    generated = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return page(title, f"generated {generated}", nav, "".join(body))


def write_report(run_dir: Path, out: Path | None = None, *, advice: Mapping[str, Any] | Any | None = None,
                 progress: Callable[[int, int], None] | None = None, namespace: str = DEFAULT_NAMESPACE) -> Path:
    """Write the HTML report of a local run directory and return its path.

    `out` defaults to <run_dir>/report.html. `advice` is the advisor's recommendation (a mapping, a
    dataclass or an object with to_dict(), e.g. from tuning.advise); it is rendered as given, and the
    report says so when there is none. A run without profile files is read from its EMF files' stage documents of
    `namespace`. Raises ReportInputError when the run directory is unusable.
    """
    data = load_run_dir(Path(run_dir), progress=progress, namespace=namespace)
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
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write the report of the EMF documents a CloudWatch Logs group received in the last `since_s` s.

    `client` is a boto3 'logs' client; `progress(pages, events)` is called after each page read. There are
    no timelines in EMF; the report says so.
    """
    data = load_cloudwatch(client, log_group, since_s=since_s, namespace=namespace, progress=progress)
    return runfiles.write_text_atomic(Path(out), render_html(data, advice=advice))
