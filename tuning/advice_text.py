"""The advice as console text: the plan, a table of candidate volumes and the recommended settings. Pure."""

from __future__ import annotations

from tuning.advise import CACHE_HEADROOM, RECOMMEND_SLACK, Advice, range_ends, shows_range
from tuning.cachedomain import domains
from tuning.deployed import KEPT_FROM_CDK_JSON
from tuning.ebs import GIB, MIB
from tuning.prices import PRICES_AS_OF, PRICES_REGION


def render(advice: Advice, *, deploy: str | None = None) -> str:
    """The advice as a console table and a few paragraphs; `deploy`, when given, is the whole command that applies it
    to a deployed stack (tuning.deployed.make_deploy), shown instead of the advice's context keys alone."""
    plan = advice.plan
    lines = [
        *render_findings(advice),
        f"Plan (every price assumes it): {plan.describe()}; {plan.waves_per_day:,} rounds"
        + (f", instance EBS cap {plan.instance_ebs_mibps:g} MiB/s" if plan.instance_ebs_mibps else ""),
        "Workload per job (median of " + f"{advice.workload.children} profiled children): "
        + ", ".join(f"{s.name} {s.write_bytes / MIB:,.0f} MiB written/{s.read_bytes / MIB:,.0f} MiB read "
                    f"({s.io_size / 1024:,.0f} KiB I/O, {s.floor_s:.1f} s unthrottled)"
                    for s in advice.workload.stages),
    ]
    lines.extend(f"  note: {n}" for n in advice.workload.notes)
    lines.append("")
    header = ("volume", "base MiB/s", "burst MiB/s", "download s", "upload s", "durable s",
              "steady dl s", "credits out", f"USD/month ({PRICES_REGION}, {PRICES_AS_OF})")
    rows = []
    for c in advice.candidates:
        mark = " *" if c is advice.recommended else ""
        rows.append((
            c.volume.label + mark, f"{c.volume.baseline_mibps:,.1f}", f"{c.volume.burst_mibps:,.1f}",
            f"{c.download_s:,.1f}", f"{c.upload_s:,.1f}",
            "-" if c.time_to_durable_s is None else f"{c.time_to_durable_s:,.1f}",
            f"{c.steady_download_s:,.1f}" + ("" if c.fits_day else " (over 24 h)"),
            "never" if c.credits_run_out_h is None else f"after {c.credits_run_out_h:.1f} h",
            "not priced" if c.monthly_usd is None else f"{c.monthly_usd:,.2f}",
        ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.extend("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows)
    rec = advice.recommended
    cache = advice.cache
    lines += [
        "",
        f"Recommended volume: {rec.volume.label} (*): the cheapest within {RECOMMEND_SLACK:.2f}x of the "
        f"fastest steady-state round.",
        advice.burst_note,
        *(["", "st1 against the candidates without credits (this plan's figures):"] if advice.comparison else []),
        *(f"  {line}" for line in advice.comparison),
        "",
        f"Write cache: vm.dirty_bytes={cache.tuning.dirty_bytes} ({(cache.tuning.dirty_bytes or 0) / GIB:.2f} "
        f"GiB), vm.dirty_background_bytes={cache.tuning.dirty_background_bytes} "
        f"({(cache.tuning.dirty_background_bytes or 0) / GIB:.2f} GiB), sized for a burst of "
        f"{cache.burst_bytes / GIB:.2f} GiB per instance. The kernel's defaults (dirty_ratio 20, "
        f"background 10) pause writers at {cache.default_freerun_bytes / GIB:.2f} GiB: a download takes "
        f"{advice.untuned_download_s:,.1f} s untuned{_untuned_range(advice)} vs {rec.download_s:,.1f} s tuned on "
        f"{rec.volume.label}"
        + (". The defaults already absorb the burst; the smaller limit keeps less data at risk and less "
           "memory pinned." if cache.default_freerun_bytes >= cache.burst_bytes * CACHE_HEADROOM else "."),
        *_own_cache(advice),
        f"Durability: {cache.tradeoff}",
        f"Mount options (valid for kernel {plan.kernel_release or 'current'}): "
        f"{cache.tuning.mount_option_string()}",
        "",
        *(["CDK context:", f"  cdk deploy {advice.cdk_args}"] if deploy is None else
          [f"To apply it (the stack's deployed context with the advice's keys in place; {KEPT_FROM_CDK_JSON}):",
           f"  {deploy}"]),
    ]
    return "\n".join(lines)


def _untuned_range(advice: Advice) -> str:
    """' (0.6-3.9 s: ...)' where the state of the kernel's pacing makes the untuned time uncertain."""
    low, high, at = advice.untuned_download_low_s, advice.untuned_download_high_s, advice.untuned_download_s
    if not shows_range(low, at, high):
        return ""
    low, high = range_ends(low, at, high)
    return (f" ({low:,.1f}-{high:,.1f} s: the burst ends "
            "past the point where the kernel starts pacing writers, and how hard it paces them depends on the "
            "state of its controller on that writeback context: a new one lets writers through, one that earlier "
            "writers left low holds them at that point)")


def render_findings(advice: Advice) -> list[str]:
    """The findings, most severe first: code, severity, cost, then evidence and fix (empty when none)."""
    if not advice.findings:
        return []
    lines = [f"Findings ({len(advice.findings)}; cost per child, and instance USD per month per instance):"]
    for f in advice.findings:
        cost = ("not priced" if f.cost_s_per_child is None else
                f"{f.cost_s_per_child:,.1f} s/child, {f.cost_usd_per_month or 0:,.2f} USD/month")
        label = "WHAT-IF" if f.what_if else f.severity.upper()
        lines.append(f"  [{label}] {f.code}: {f.title} ({'would cost ' if f.what_if else ''}{cost})")
        lines.append(f"      evidence: {f.evidence}")
        lines.append(f"      fix: {f.fix}" + (f"  (-c {' -c '.join(f'{k}={v}' for k, v in f.context.items())})"
                                                if f.context else ""))
    lines.append("")
    return lines


def _own_cache(advice: Advice) -> list[str]:
    """Each child's own write cache (its container's) against the host's, under the stack's settings now and the
    advised ones (empty when the plan gives the children no memory limit)."""
    plan = advice.plan
    if plan.job_memory_bytes is None:
        return []
    now, advised = (domains(t, plan.memory_bytes, plan.job_memory_bytes, plan.jobs_per_instance)
                    for t in (plan.current_tuning, advice.cache.tuning))
    own_now = now.container.limit_bytes if now.container else 0
    own_advised = advised.container.limit_bytes if advised.container else 0
    return [f"Per child: each child's write cache is its container's ({plan.job_memory_gib:g} GiB): its own dirty "
            f"limit is {own_now / GIB:.2f} GiB under the stack's settings now ({now.tighter}'s domain the tighter; the "
            f"host's is {now.host.limit_bytes / GIB:.2f} GiB for {plan.jobs_per_instance}) and "
            f"{own_advised / GIB:.2f} GiB advised: vm.dirty_* reach a child in proportion to its memory."]
