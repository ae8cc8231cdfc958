"""The report's first section, the answer before the plots: time per stage and what bounds each, the time in no
stage, the costliest finding with the plan its price assumes, the bad apples, and the files that took the most
time in calls (Drishti-style, from the eBPF probe's per-file records). Pure (data in, HTML out).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from profiling.bounds import TOO_SHORT, UNKNOWN, between_stages_s, outside_stages_s, stage_bounds
from profiling.metrics import StageProfile
from profiling.report.advice import advice_as_data, context_args, findings_of
from profiling.report.badapples import BadApple
from profiling.report.page import ABSENT, e, human_bytes, number, seconds
from profiling.report.sources import ReportData

# Rows of the per-file table: the files with the most time in calls, across children.
TOP_FILES = 10
FILE_CALLS = ("read", "write", "open", "close", "fsync")


def _stage_table(profiles: Sequence[StageProfile], run: Mapping[str, Any] | None) -> str:
    bounds = stage_bounds(profiles)
    if not bounds:
        return "<p class=note>No stage finished: nothing to time.</p>"
    elapsed = (run or {}).get("child_elapsed_s")
    between = outside_stages_s(profiles, elapsed) if isinstance(elapsed, Mapping) else None
    what = ("a child's whole time (run.json) less its stages: start-up, the markers, and the profiler's work at "
            "each boundary")
    if between is None:
        between = between_stages_s(profiles)
        what = ("from a child's first stage start to its last stage end, in no stage: the profiler's work at "
                "each boundary and the job's between stages")
    total = sum(b.duration_s for b in bounds if "/" not in b.stage) + (between or 0.0)
    head = ("<tr><th class=l>stage</th><th>children</th><th>time per child</th><th>share</th>"
            "<th class=l>bound by</th><th class=l>why</th></tr>")
    rows = []
    for b in bounds:
        share = "" if "/" in b.stage or not total else f"{b.duration_s / total:.0%}"
        shown = b.bound if b.bound in (TOO_SHORT, UNKNOWN) else f"{b.bound}-bound"
        rows.append(f"<tr data-stage='{e(b.stage)}' data-bound='{e(b.bound)}'><td class=l>{e(b.stage)}</td>"
                    f"<td>{b.children}</td><td>{e(seconds(b.duration_s))}</td><td>{share}</td>"
                    f"<td class=l><b>{e(shown)}</b></td><td class=wrap>{e(b.evidence)}</td></tr>")
    if between is not None:
        rows.append(f"<tr data-stage='(no stage)'><td class=l><i>in no stage</i></td><td></td>"
                    f"<td>{e(seconds(between))}</td><td>{between / total:.0%}</td><td class=l>-</td>"
                    f"<td class=wrap>{e(what)}</td></tr>")
    return (f"<table id=stage-bounds>{head}{''.join(rows)}</table><p class=note>Medians per child. What bounds "
            "a stage comes from PSI io stall (host-wide) and the dirty-limit pauses: I/O when the stall covers half "
            "of it or more, else network for a transfer and CPU for the rest; under 1 s a stage is too short to "
            "judge.</p>")


def _top_finding(advice: Any) -> str:
    data = advice_as_data(advice)
    if data is None:
        return "<p id=summary-finding class=note>No recommendation was given to this report.</p>"
    findings = findings_of(data)
    raw_plan = data.get("plan")
    plan: Mapping[str, Any] = raw_plan if isinstance(raw_plan, Mapping) else {}
    assumes = f"<p class=note>Prices assume: {e(plan['summary'])}.</p>" if plan.get("summary") else ""
    now = [f for f in findings if not f.get("what_if") and f.get("severity") != "info"]
    parts = []
    if now:
        top = now[0]
        cost = top.get("cost_s_per_child")
        usd = top.get("cost_usd_per_month")
        context = context_args(top.get("context"))
        parts.append(
            f"<p id=summary-finding><span class='sev sev-{e(top.get('severity'))}'>{e(top.get('severity'))}</span> "
            f"<b>{e(top.get('title'))}</b> <code>{e(top.get('code'))}</code>: "
            + ("not priced" if cost is None else e(f"{seconds(cost)} per child")
               + ("" if usd is None else e(f", ${number(usd)} per month per instance")))
            + f". {e(top.get('evidence'))}. Fix: {e(top.get('fix'))}"
            + (f" <code>{e(context)}</code>" if context else "") + "</p>")
    else:
        parts.append("<p id=summary-finding>No finding of this run is worth a change here.</p>")
    what_ifs = [f for f in findings if f.get("what_if") and f.get("cost_s_per_child") is not None]
    if what_ifs:
        top_if = what_ifs[0]
        parts.append(f"<p class=note id=summary-what-if>What-if (modelled, not measured here): "
                     f"{e(top_if.get('title'))} would cost {e(seconds(top_if.get('cost_s_per_child')))} per "
                     "child. See <a href='#advice'>the recommendation</a>.</p>")
    return "".join(parts) + (assumes if now or what_ifs else "")


def _apples(apples: Sequence[BadApple]) -> str:
    if not apples:
        return "<p id=summary-apples>Bad apples: none stands out.</p>"
    names = ", ".join(f"host {a.name}: {a.detail}" if a.scope == "host" else
                      f"{a.name if a.scope == 'child' else 'instance ' + a.name} in {a.stage} "
                      f"({a.outlier.ratio:.2f}x the median)" if a.outlier.ratio is not None else
                      f"{a.name} in {a.stage}" for a in apples[:10])
    return f"<p id=summary-apples class=flag>Bad apples: {e(names)} (<a href='#bad-apples'>details</a>).</p>"


def file_rows(data: ReportData) -> list[dict[str, Any]]:
    """One row per (child, stage, file) of the eBPF probe's per-file records, the most time in calls first."""
    rows = []
    for entry in data.entries:
        files = (entry.profile.calls or {}).get("files")
        if not isinstance(files, Mapping) or not isinstance(files.get("by_path"), Mapping):
            continue
        by_path = files["by_path"]
        records = {str(r.get("path")): r for r in files.get("records") or [] if isinstance(r, Mapping)}
        for path, calls in by_path.items():
            if not isinstance(calls, Mapping) or not path:
                continue
            stats = {c: calls[c] for c in FILE_CALLS if isinstance(calls.get(c), Mapping)}
            slowest = max(stats.items(), key=lambda kv: float(kv[1].get("max_us") or 0), default=None)
            rows.append({
                "child": entry.child, "stage": entry.profile.stage, "path": str(path),
                "time_us": sum(float(s.get("total_us") or 0) for s in stats.values()),
                "calls": sum(int(s.get("count") or 0) for s in stats.values()),
                "read": stats.get("read", {}), "write": stats.get("write", {}),
                "slowest": None if slowest is None else (slowest[0], slowest[1].get("max_us"),
                                                         slowest[1].get("max_bytes")),
                "pattern": _pattern(records.get(str(path)), stats),
            })
    return sorted(rows, key=lambda r: -r["time_us"])


def _pattern(record: Mapping[str, Any] | None, stats: Mapping[str, Mapping[str, Any]]) -> str:
    """The access pattern as Darshan counts it: per read and write, how many calls were consecutive (at the
    offset where the last ended) and sequential (past it), and the commonest sizes."""
    if not record:
        return ABSENT
    parts = []
    for call in ("read", "write"):
        counts = record.get(call)
        total = int((stats.get(call) or {}).get("count") or 0)
        if isinstance(counts, Mapping) and total:
            parts.append(f"{call}s: {int(counts.get('consecutive') or 0):,} consecutive, "
                         f"{int(counts.get('sequential') or 0):,} sequential of {total:,}")
    sizes = [f"{human_bytes(a.get('bytes'))} x{int(a.get('count') or 0):,}" for a in record.get("access_sizes") or []
             if isinstance(a, Mapping) and a.get("bytes")]
    if sizes:
        parts.append("sizes " + ", ".join(sizes[:3]))
    return "; ".join(parts) or ABSENT


def ebpf_absent(profiles: Iterable[StageProfile]) -> str | None:
    """None when the eBPF probe gave any stage its per-call figures; else why not, as the profilers said it (their
    first reason naming it), or that they did not say: never a guess."""
    reasons = []
    for profile in profiles:
        if profile.sources.get("calls") == "ebpf":
            return None
        reasons += [n for n in profile.notices if "ebpf" in n.lower()]
    return reasons[0] if reasons else "the profiles do not say why: the children's logs may"



def _io(stats: Mapping[str, Any]) -> str:
    count = int(stats.get("count") or 0)
    if not count:
        return ABSENT
    size = float(stats.get("bytes") or 0)
    return f"{count:,} x {human_bytes(size / count)} = {human_bytes(size)}"


def _files_table(data: ReportData) -> str:
    rows = file_rows(data)
    if not rows:
        reason = ebpf_absent(entry.profile for entry in data.entries)
        return ("<p id=no-file-records class=note>No per-file records: they come from the eBPF probe, "
                + ("which recorded none for this run." if reason is None else f"which did not run ({e(reason)}).")
                + "</p>")
    head = ("<tr><th class=l>file</th><th class=l>child</th><th class=l>stage</th><th>time in calls</th>"
            "<th>calls</th><th>reads</th><th>writes</th><th>slowest call</th><th class=l>access pattern</th></tr>")
    body = []
    for r in rows[:TOP_FILES]:
        slow = r["slowest"]
        slowest = ABSENT if slow is None or slow[1] is None else (
            f"{slow[0]} {number(float(slow[1]) / 1000)} ms"
            + ("" if slow[2] is None else f" ({human_bytes(slow[2])})"))
        body.append(f"<tr class=file-row><td class=l><code>{e(r['path'])}</code></td><td class=l>{e(r['child'])}</td>"
                    f"<td class=l>{e(r['stage'])}</td><td>{e(seconds(r['time_us'] / 1e6))}</td>"
                    f"<td>{r['calls']:,}</td><td>{e(_io(r['read']))}</td><td>{e(_io(r['write']))}</td>"
                    f"<td>{e(slowest)}</td><td class=wrap>{e(r['pattern'])}</td></tr>")
    return (f"<h3>Files with the most time in calls (top {min(TOP_FILES, len(rows))} of {len(rows)})</h3>"
            f"<table id=files-table>{head}{''.join(body)}</table><p class=note>Per child and stage, from the eBPF "
            "probe's per-file records: time spent in read, write, open, close and fsync on the file; reads and "
            "writes as calls x mean size = bytes (a file read several times over shows more bytes than it "
            "holds); the access pattern as Darshan counts it (consecutive: at the offset where the last call "
            "ended; sequential: past it) with the commonest sizes.</p>")


def summary_section(data: ReportData, advice: Any, apples: Sequence[BadApple]) -> str:
    """The summary that opens the report."""
    profiles = [x.profile for x in data.entries]
    stages = _stage_table(profiles, data.run) if data.complete else (
        "<p class=note>A batch this large keeps per-stage columns, not every child's profile: its time per stage "
        "is under <a href='#fleet-time'>Over time</a> and in each stage's quantiles.</p>")
    return ("<section id=summary><h2>Summary</h2>" + stages + "<h3>Top finding</h3>"
            + _top_finding(advice) + _apples(apples) + _files_table(data) + "</section>")
