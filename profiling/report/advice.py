"""The recommendation section: the advisor's findings, the volume and settings it recommends with their
predicted effect, its candidate volumes, and the `cdk deploy` line to copy. Pure (text in, HTML out).

It reads the plain dict of `tuning.advise.Advice.to_dict()` (documented there) and shows what is present:
an advice without findings, or with fields this page does not know, still renders, the unknown fields in a
collapsed list with their units.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from profiling.bounds import TOO_SHORT, UNKNOWN, StageBound, between_stages_s, outside_stages_s, stage_bounds
from profiling.metrics import StageProfile
from profiling.report.page import ABSENT, e, field_value, human_bytes, key_values, number, seconds

SEVERITY_ORDER = ("high", "medium", "low", "info")
# A tuned download within this share of the untuned one gains no time: the change is for memory and risk.
SAME_TIME_SHARE = 0.05
# The fields this section shows in its own places; any other top-level field goes under "other fields".
SHOWN = ("findings", "recommended", "candidates", "write_cache", "untuned_download_s", "burst", "cdk_args",
         "cdk_context", "plan", "workload", "prices")
# Candidate columns: (field, heading with its unit, formatter).
CANDIDATE_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("baseline_mibps", "baseline MiB/s", number),
    ("burst_mibps", "burst MiB/s", number),
    ("download_s", "download s (full credits)", number),
    ("upload_s", "upload s", number),
    ("time_to_durable_s", "on the volume (or removed) after s", number),
    ("steady_download_s", "download s (late in the day)", number),
    ("credits_run_out_h", "credits run out", lambda v: "never" if v is None else f"after {number(v)} h"),
    ("monthly_usd", "USD per month", lambda v: ABSENT if v is None else f"${number(v)}"),
)


def advice_as_data(advice: Any) -> dict[str, Any] | None:
    """The advisor's output as its plain dict: `to_dict()` when it has one (the Advice), else a mapping or
    a dataclass as given."""
    if advice is None:
        return None
    to_dict = getattr(advice, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    if isinstance(advice, Mapping):
        return dict(advice)
    if dataclasses.is_dataclass(advice) and not isinstance(advice, type):
        return dataclasses.asdict(advice)
    return {"advice": str(advice)}


def findings_of(advice: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The advice's findings (mappings only): the costs of now before the what-ifs, each most severe and then
    most costly first; [] when it has none."""
    raw = (advice or {}).get("findings")
    found = [dict(f) for f in raw if isinstance(f, Mapping)] if isinstance(raw, list) else []
    return sorted(found, key=lambda f: (bool(f.get("what_if")), SEVERITY_ORDER.index(f["severity"])
                                        if f.get("severity") in SEVERITY_ORDER else len(SEVERITY_ORDER),
                                        -(f.get("cost_s_per_child") or 0.0)))


def context_args(context: Any) -> str:
    """CDK context as `-c key=value ...`."""
    if not isinstance(context, Mapping):
        return ""
    return " ".join(f"-c {k}={v}" for k, v in context.items())


def findings_table(findings: Sequence[Mapping[str, Any]]) -> str:
    head = ("<tr><th class=l>severity</th><th class=l>code</th><th class=l>finding</th><th class=l>evidence</th>"
            "<th class=l>fix</th><th>costs per child</th><th>costs per month</th></tr>")
    rows = []
    for f in findings:
        severity = str(f.get("severity") or "info")
        context = context_args(f.get("context"))
        fix = e(f.get("fix") or ABSENT) + (f"<br><code>{e(context)}</code>" if context else "")
        cost_s = f.get("cost_s_per_child")
        cost_usd = f.get("cost_usd_per_month")
        what_if = f.get("what_if")
        label = f"what-if: {severity}" if what_if else severity
        rows.append(
            f"<tr class=finding data-code='{e(f.get('code', ''))}' data-what-if='{e(what_if or '')}'>"
            f"<td class=l><span class='sev sev-{e(severity)}'>{e(label)}</span></td>"
            f"<td class=l><code>{e(f.get('code', ABSENT))}</code></td><td class=wrap>{e(f.get('title', ABSENT))}</td>"
            f"<td class=wrap>{e(f.get('evidence') or ABSENT)}</td><td class=wrap>{fix}</td>"
            f"<td>{'not measured' if cost_s is None else e(seconds(cost_s))}</td>"
            f"<td>{'not measured' if cost_usd is None else '$' + e(number(cost_usd))}</td></tr>"
        )
    note = ("<p class=note>A what-if models the stack's volume, which this run did not run on: what it would "
            "cost there, not a cost measured here.</p>" if any(f.get("what_if") for f in findings) else "")
    return f"<table id=findings-table>{head}{''.join(rows)}</table>{note}"


def _candidate(advice: Mapping[str, Any]) -> dict[str, Any] | None:
    for c in advice.get("candidates") or []:
        if isinstance(c, Mapping) and c.get("volume") == advice.get("recommended"):
            return dict(c)
    return None


def _recommendation(advice: Mapping[str, Any]) -> str:
    parts = []
    rec = advice.get("recommended")
    chosen = _candidate(advice)
    cache = advice.get("write_cache") if isinstance(advice.get("write_cache"), Mapping) else {}
    if rec:
        line = f"<p><b>Volume: {e(rec)}</b>"
        if chosen:
            line += (f": download {e(seconds(chosen.get('download_s')))} with full credits, "
                     f"{e(seconds(chosen.get('steady_download_s')))} late in the day; "
                     f"{e(field_value('monthly_usd', chosen.get('monthly_usd')))} per volume")
        parts.append(line + ".</p>")
    if cache:
        settings = [f"vm.dirty_bytes = {human_bytes(cache.get('dirty_bytes'))}",
                    f"vm.dirty_background_bytes = {human_bytes(cache.get('dirty_background_bytes'))}"]
        effect = ""
        untuned = advice.get("untuned_download_s")
        if chosen and untuned is not None and chosen.get("download_s") is not None:
            effect = (f" Predicted download on {e(rec)}: {e(seconds(untuned))} with the kernel's defaults, "
                      f"{e(seconds(chosen['download_s']))} with these.")
            if untuned <= chosen["download_s"] * (1 + SAME_TIME_SHARE):
                effect += (" No time is gained: the kernel's defaults already absorb this burst, and the smaller "
                           "limit only keeps less unwritten data at risk and less memory pinned.")
        parts.append(f"<p><b>Write cache: {e(', '.join(settings))}</b>, sized for a burst of "
                     f"{e(human_bytes(cache.get('burst_bytes')))} per instance.{effect}</p>")
        if cache.get("tradeoff"):
            parts.append(f"<p class=note>Durability: {e(cache['tradeoff'])}</p>")
        if cache.get("mount_options"):
            parts.append(f"<p>Mount options: <code>{e(cache['mount_options'])}</code></p>")
    if advice.get("burst"):
        parts.append(f"<p class=note>{e(advice['burst'])}</p>")
    args = advice.get("cdk_args") or context_args(advice.get("cdk_context"))
    if args:
        parts.append(f"<p>To apply it all:</p><pre class=cmd id=cdk-deploy>cdk deploy {e(args)}</pre>")
    return "".join(parts)


def _candidates(advice: Mapping[str, Any]) -> str:
    rows = [c for c in advice.get("candidates") or [] if isinstance(c, Mapping)]
    if not rows:
        return ""
    prices = advice.get("prices") if isinstance(advice.get("prices"), Mapping) else {}
    where = f" (prices: {e(prices.get('region'))}, {e(prices.get('as_of'))})" if prices else ""
    head = "<tr><th class=l>volume</th>" + "".join(f"<th>{e(h)}</th>" for _, h, _ in CANDIDATE_COLUMNS) + "</tr>"
    body = []
    for c in rows:
        mark = " class=pick" if c.get("volume") == advice.get("recommended") else ""
        cells = "".join(f"<td>{e(show(c.get(k)))}</td>" for k, _, show in CANDIDATE_COLUMNS)
        body.append(f"<tr{mark}><td class=l>{e(c.get('volume', ABSENT))}</td>{cells}</tr>")
    return (f"<h3>Candidate volumes{where}</h3><table id=candidates-table>{head}{''.join(body)}</table>"
            "<p class=note>Each volume replays a day of the plan; the recommended one (highlighted) is the "
            "cheapest close to the fastest late in the day.</p>")


def _plan(advice: Mapping[str, Any]) -> str:
    parts = []
    plan = advice.get("plan")
    if isinstance(plan, Mapping):
        parts.append("<h3>Plan</h3>" + key_values(plan))
    workload = advice.get("workload")
    if isinstance(workload, Mapping):
        stages = [s for s in workload.get("stages") or [] if isinstance(s, Mapping)]
        if stages:
            head = ("<tr><th class=l>stage</th><th>written to the volume</th><th>read from it</th>"
                    "<th>I/O size</th><th>time not waiting on I/O</th></tr>")
            rows = "".join(
                f"<tr><td class=l>{e(s.get('stage', ABSENT))}</td><td>{e(human_bytes(s.get('write_bytes')))}</td>"
                f"<td>{e(human_bytes(s.get('read_bytes')))}</td><td>{e(human_bytes(s.get('io_size')))}</td>"
                f"<td>{e(seconds(s.get('floor_s')))}</td></tr>" for s in stages)
            children = workload.get("children_profiled")
            parts.append(f"<h3>Workload per child (median of {e(number(children))} children)</h3>"
                         f"<table>{head}{rows}</table>")
        notes = [str(n) for n in workload.get("notes") or []]
        parts.extend(f"<p class=note>{e(n)}</p>" for n in notes)
    return "".join(parts)


def advice_section(advice: Any) -> str:
    """The recommendation section of the report (a note when no advice was given)."""
    parts = ["<section id=advice><h2>Recommendation</h2>"]
    data = advice_as_data(advice)
    if data is None:
        parts.append("<p class=note>No recommendation was given to this report.</p></section>")
        return "".join(parts)
    findings = findings_of(data)
    raw_plan = data.get("plan")
    if isinstance(raw_plan, Mapping) and raw_plan.get("summary"):
        parts.append(f"<p id=advice-plan>Every price below assumes this plan: {e(raw_plan['summary'])}.</p>")
    if findings:
        parts.append("<h3>Findings</h3>" + findings_table(findings))
    elif isinstance(data.get("findings"), list):
        parts.append("<p id=no-findings>The advisor found nothing to fix in this run.</p>")
    else:
        parts.append("<p class=note>This advice carries no findings.</p>")
    parts.append(_recommendation(data))
    parts.append(_candidates(data))
    details = _plan(data)
    other = {k: v for k, v in data.items() if k not in SHOWN}
    if other:
        details += "<h3>Other fields</h3>" + key_values(other)
    if details:
        parts.append(f"<details><summary>what the advice is based on</summary>{details}</details>")
    parts.append("</section>")
    return "".join(parts)


def bound_line(bounds: Sequence[StageBound], between_s: float | None) -> str:
    """Time per stage and what bounds each, in one line (medians per child)."""
    parts = [f"{b.stage} {number(b.duration_s)} s " + (b.bound if b.bound in (TOO_SHORT, UNKNOWN)
                                                       else f"{b.bound}-bound") for b in bounds]
    if between_s is not None:
        parts.append(f"{number(between_s)} s in no stage (start-up, markers, the profiler's boundaries)")
    return "stages (median child): " + ", ".join(parts)


def _cost(f: Mapping[str, Any]) -> str:
    cost = f.get("cost_s_per_child")
    if cost is None:
        return "not priced"
    usd = f.get("cost_usd_per_month")
    return f"{seconds(cost)} per child" + ("" if usd is None else f", ${number(usd)}/month per instance")


def takeaways(profiles: Sequence[StageProfile], advice: Any, run: Mapping[str, Any] | None = None) -> list[str]:
    """The lines for the end of a run, the true ones first: each stage's time and what bounds it; the slowest
    stage and why; the one change the advisor would make now (a finding of this run with a CDK fix), or
    that it would change nothing; the costliest what-if, labelled as one; and the plan the prices assume."""
    bounds = stage_bounds(profiles)
    data = advice_as_data(advice) or {}
    findings = findings_of(data)
    now = [f for f in findings if not f.get("what_if")]
    lines = []
    if bounds:
        elapsed = (run or {}).get("child_elapsed_s")
        outside = outside_stages_s(profiles, elapsed) if isinstance(elapsed, Mapping) else None
        lines.append(bound_line(bounds, outside if outside is not None else between_stages_s(profiles)))
        top = [b for b in bounds if "/" not in b.stage]
        slowest = max(top or bounds, key=lambda b: b.duration_s)
        total = sum(b.duration_s for b in top or bounds)
        why = (slowest.bound if slowest.bound in (TOO_SHORT, UNKNOWN) else f"{slowest.bound}-bound")
        named = [f for f in now if f.get("stage") == slowest.stage]
        also = f"; {named[0].get('title')} [{named[0].get('code')}]" if named else ""
        lines.append(f"slowest stage: {slowest.stage}, {number(slowest.duration_s)} s of {number(total)} s per "
                     f"child: {why} ({slowest.evidence}){also}")
    fixes = [f for f in now if context_args(f.get("context"))]
    if fixes:
        top_fix = max(fixes, key=lambda f: f.get("cost_s_per_child") or 0.0)
        lines.append(f"the advisor would change: {context_args(top_fix.get('context'))} ({top_fix.get('fix')}; "
                     f"{top_fix.get('code')} costs {_cost(top_fix)} now)")
    elif data:
        lines.append("the advisor would change nothing on this machine: no finding of this run is worth a change")
    what_ifs = [f for f in findings if f.get("what_if") and f.get("cost_s_per_child") is not None]
    if what_ifs:
        top_if = max(what_ifs, key=lambda f: f.get("cost_s_per_child") or 0.0)
        lines.append(f"what-if (modelled, not measured here): {top_if.get('title')} [{top_if.get('code')}] would "
                     f"cost {_cost(top_if)}")
    raw_plan = data.get("plan")
    plan: Mapping[str, Any] = raw_plan if isinstance(raw_plan, Mapping) else {}
    if plan.get("summary") and (fixes or what_ifs):
        lines.append(f"prices assume: {plan['summary']}")
    return lines
