"""Named findings, priced: what the profiles say is wrong, what it costs and what setting fixes it. Pure.

In: a Situation (tuning.situation: the profiles and what the advisor already computed, the workload, the stack's
volume and write cache under the plan, the recommended ones). Out: `find()`, the findings worth a change, each a
code, a severity, the evidence, the fix with the CDK context keys that apply it (`context`; empty when the fix is
not a stack setting) and its cost in seconds per child and instance dollars per month. The checks are CHECKS, each
docstring a row of docs/reference/findings.md; every threshold is a named constant. What a user can believe:
- A cost that cannot be worked out from what was measured is None, and the evidence says why.
- A finding that models the stack's volume is a cost of now only when the profiles ran on that volume type; else
  (a local run: VolumeType `local`) it is a what-if ("if this ran on st1 500 GiB: ..."), listed after those of now.
- Severity follows the cost's share of the median child's time (SEVERITY_SHARES); a finding priced under
  COST_FLOOR_S or COST_FLOOR_SHARE of that time, or on a stage under profiling.bounds.SHORT_STAGE_S, is dropped.
- Evidence built on device figures (shared by every child on the disk) says how many children shared it; there is
  no network finding when the endpoint was on the host (Plan.network_loopback).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from profiling.bounds import SHORT_STAGE_S
from profiling.metrics import STAGES, by_call, median
from profiling.outliers import find_slow
from tuning.dirtypause import dirty_pause
from tuning.ebs import GIB, MIB, Volume
from tuning.situation import SEVERITIES, Finding, Situation, make_finding, shared_note, values_of
from tuning.writecache import WriteCache

__all__ = ["CHECKS", "Finding", "Situation", "find", "graded"]
# A stage waits on I/O when PSI io stall is at least this share of its duration; CPU-bound below the other.
IO_BOUND_SHARE = 0.5
CPU_BOUND_SHARE = 0.1
CPU_BOUND_MIN_S = 1.0  # shorter stages say nothing either way
# The device is saturated at this utilisation or this many requests in flight.
SATURATED_UTIL_PCT = 90.0
SATURATED_QUEUE = 4.0
# An HDD workload is "random" from this share of random bytes: it pays 1 MiB for each small request.
HDD_RANDOM_SHARE = 0.25
# The download is network-bound below this share of the slower of the volume's rate and the network, while
# it waits little on I/O.
NETWORK_BOUND_SHARE = 0.5
NETWORK_BOUND_MAX_STALL = 0.2
# fsync-heavy: fsync time at least this share of the stage; metadata-heavy: open+close time the same.
SYNC_SHARE = 0.1
METADATA_SHARE = 0.1
# Severity from the cost's share of the median child's time: high from the first, medium from the second.
SEVERITY_SHARES = (0.25, 0.05)
# A priced finding that costs less than either of these (the larger is the floor) is dropped: not worth a change.
COST_FLOOR_S = 0.5
COST_FLOOR_SHARE = 0.02

# ---- the checks: each returns its findings (usually none or one) -------------------------------------


def credits(s: Situation) -> list[Finding]:
    """Burst credits exhausted, or projected to run out within the day's plan."""
    if s.current_credits_run_out_h is None:
        return []
    cost = max(0.0, s.current_steady_download_s - s.current_download_s)
    return [make_finding(
        s, "BURST_CREDITS", "high", f"Burst credits of {s.volume.label} run out during the day",
        f"at {s.plan.jobs_per_day} jobs per instance per day the bucket runs dry "
        f"{s.current_credits_run_out_h:.1f} h into the day; a download then takes "
        f"{s.current_steady_download_s:.0f} s instead of {s.current_download_s:.0f} s",
        f"use {s.recommended.label}" if s.recommended != s.volume else
        "a larger volume (its baseline grows with size) or gp3", cost,
        s.recommended.to_context() if s.recommended != s.volume else {}, stage="download", modelled=True)]


def hdd_random(s: Situation) -> list[Finding]:
    """Small or random I/O on st1/sc1: each random request under 1 MiB costs a whole MiB of throughput."""
    if not s.volume.is_hdd:
        return []
    out = []
    for load in s.workload.stages:
        moved = load.write_bytes + load.read_bytes
        if load.random_share < HDD_RANDOM_SHARE or moved == 0 or load.io_size >= MIB:
            continue
        base = s.volume.throughput_bps
        at_random = moved / base(io_size=load.io_size, bursting=False, random_share=load.random_share)
        if_sequential = moved / base(io_size=load.io_size, bursting=False)
        gp3 = Volume("gp3", max(1, s.volume.size_gib))
        out.append(make_finding(
            s, "HDD_RANDOM_IO", "high", f"Small random I/O on {s.volume.kind} ({load.name})",
            f"{load.name}: {load.random_share:.0%} of {moved / MIB:,.0f} MiB in random {load.io_size / 1024:,.0f} "
            f"KiB requests, each charged 1 MiB: {at_random:,.0f} s at baseline instead of {if_sequential:,.0f} s"
            + shared_note(s, load.name),
            "write whole files sequentially" + (" (one part per file for s5cmd)" if load.name in ("download",
                                                                                              "upload") else "")
            + ", or move scratch to gp3", at_random - if_sequential, gp3.to_context(), stage=load.name,
            modelled=True))
    return out


def saturated(s: Situation) -> list[Finding]:
    """The device is saturated: utilisation or queue depth high."""
    out = []
    for stage in STAGES:
        rows = s.of_stage(stage)
        util = values_of(rows, lambda p: p.device_utilization_pct)
        queue = values_of(rows, lambda p: p.device_queue_depth)
        u = median(util) if util else None
        q = median(queue) if queue else None
        if not ((u is not None and u >= SATURATED_UTIL_PCT) or (q is not None and q >= SATURATED_QUEUE)):
            continue
        stalls = values_of(rows, lambda p: p.io_stall_some_ms)
        cost = median(stalls) / 1000 if stalls else None
        out.append(make_finding(
            s, "DEVICE_SATURATED", "medium", f"Scratch device saturated ({stage})",
            f"{stage}: utilisation {'-' if u is None else f'{u:.0f}%'}, queue depth "
            f"{'-' if q is None else f'{q:.1f}'} (median child)" + shared_note(s, stage)
            + ("" if cost is not None else "; io stall not measured, so not priced"),
            f"a faster volume ({s.recommended.label}) or fewer jobs per instance", cost,
            s.recommended.to_context(), stage=stage))
    return out


def bound(s: Situation) -> list[Finding]:
    """Each stage I/O-bound (io stall most of its time) or CPU-bound (almost no io stall)."""
    out = []
    for stage in STAGES:
        rows = [p for p in s.of_stage(stage) if p.io_stall_some_ms is not None and p.duration_s > 0]
        if not rows:
            continue  # no PSI: nothing to say either way
        duration = median([p.duration_s for p in rows])
        stall = median([(p.io_stall_some_ms or 0.0) / 1000 for p in rows])
        share = stall / duration if duration else 0.0
        if share >= IO_BOUND_SHARE:
            out.append(make_finding(
                s, "STAGE_IO_BOUND", "medium", f"{stage} waits on I/O",
                f"{stage}: io stall {stall:.1f} s of {duration:.1f} s ({share:.0%}, median child)",
                "a larger write cache or a faster volume (see the other findings)", stall, stage=stage))
        elif share < CPU_BOUND_SHARE and duration >= CPU_BOUND_MIN_S and stage == "process":
            # Only the process stage: a transfer stage that does not wait on the volume waits on the network.
            out.append(make_finding(
                s, "STAGE_CPU_BOUND", "info", f"{stage} is CPU-bound",
                f"{stage}: io stall {stall:.1f} s of {duration:.1f} s ({share:.0%}): storage settings will "
                "not shorten it, so it is not priced", "more vCPUs per job (vcpusPerJob) or a faster instance",
                None, stage=stage))
    return out


def network_bound(s: Situation) -> list[Finding]:
    """The download runs well below both the volume's rate and the network's, without waiting on I/O."""
    rows = [p for p in s.of_stage("download") if p.throughput_bps and p.duration_s > 0]
    if not rows or s.plan.network_loopback:  # an endpoint on this host: no network was crossed
        return []
    rate = median(values_of(rows, lambda p: p.throughput_bps))
    stalls = values_of(rows, lambda p: p.io_stall_some_ms)
    duration = median([p.duration_s for p in rows])
    stall_share = median(stalls) / 1000 / duration if stalls else None
    limits = [s.volume.burst_mibps * MIB]
    if s.plan.instance_network_mibps:
        limits.append(s.plan.instance_network_mibps * MIB)
    ceiling = min(limits)
    if rate >= NETWORK_BOUND_SHARE * ceiling or stall_share is None or stall_share > NETWORK_BOUND_MAX_STALL:
        return []
    known = [float(p.write_bytes) for p in rows if p.write_bytes is not None]
    if not known:  # the tree's bytes could not be read: nothing to judge by
        return []
    moved = median(known)
    cost = max(0.0, duration - moved / ceiling)
    return [make_finding(
        s, "DOWNLOAD_NETWORK_BOUND", "medium", "The download is network-bound",
        f"download at {rate / MIB:,.1f} MiB/s (median child), under {NETWORK_BOUND_SHARE:.0%} of "
        f"{ceiling / MIB:,.0f} MiB/s (the volume's burst" + (" and the instance's network" if len(limits) > 1
                                                             else "") + f"), io stall {stall_share:.0%}",
        "more parallel transfers (s5cmd --numworkers), an S3 gateway endpoint, or an instance with more "
        "network bandwidth", cost, stage="download")]


def scratch_too_small(s: Situation) -> list[Finding]:
    """The children of one instance hold more on scratch at once than the volume has."""
    per_child = sum(load.write_bytes for load in s.workload.stages if load.name != "upload")
    need = per_child * s.plan.jobs_per_instance
    have = s.volume.size_gib * GIB
    if need <= have:
        return []
    size = -(-need * 2 // GIB)
    round_s = sum(load.floor_s for load in s.workload.stages)
    return [make_finding(
        s, "SCRATCH_TOO_SMALL", "high", "Scratch is smaller than the children's images",
        f"{s.plan.jobs_per_instance} children x {per_child / GIB:.1f} GiB = {need / GIB:.1f} GiB on a "
        f"{s.volume.size_gib} GiB volume: children fail with a full scratch and are retried",
        f"a volume of at least {size} GiB", round_s,
        Volume(s.volume.kind, max(size, s.volume.limits.size_gib[0]), s.volume.iops,
               s.volume.throughput_mibps).to_context(), modelled=True)]


def stragglers(s: Situation) -> list[Finding]:
    """Children whose throughput in a stage is a slow outlier (the report's bad-apple test)."""
    out = []
    for stage in STAGES:
        rows = [p for p in s.of_stage(stage) if p.throughput_bps]
        keyed = {p.properties.get("ArrayIndex") or p.properties.get("JobId") or str(i): p
                 for i, p in enumerate(rows)}
        # The report's rule, one rule: slow against all children and against the ones that ran beside it.
        slow = find_slow({k: float(p.throughput_bps or 0) for k, p in keyed.items()},
                         {k: (p.started_at, p.started_at + p.duration_s) for k, p in keyed.items()})
        if not slow:
            continue
        typical = median([p.duration_s for p in rows])
        worst = max(keyed[o.key].duration_s for o in slow)
        out.append(make_finding(
            s, "STRAGGLERS", "medium", f"Slow children ({stage})",
            f"{stage}: children {', '.join(o.key for o in slow)} ran at "
            + ", ".join(f"{o.value / MIB:,.1f}" for o in slow) + f" MiB/s against a median of "
            f"{slow[0].median / MIB:,.1f} MiB/s", "look at those children's instances (the report's bad "
            "apples): a noisy neighbour, a throttled volume or a slow network path", max(0.0, worst - typical),
            stage=stage))
    return out


def cache_over_budget(s: Situation) -> list[Finding]:
    """The stack's write cache may hold more than the memory budget allows."""
    t = s.tuning
    if t.dirty_bytes:
        limit = float(t.dirty_bytes)
    elif t.dirty_ratio:
        limit = float(WriteCache.from_ratios(s.plan.memory_bytes, t.dirty_ratio, t.dirty_background_ratio or 0)
                      .limit_bytes)
    else:
        return []
    budget = s.plan.memory_bytes * s.plan.cache_budget_pct / 100
    if limit <= budget:
        return []
    a = s.advised_tuning
    return [make_finding(
        s, "CACHE_OVER_BUDGET", "medium", "The write cache is larger than the memory budget allows",
        f"the dirty limit is {limit / GIB:.2f} GiB, over {s.plan.cache_budget_pct:.0f}% of "
        f"{s.plan.memory_gib:g} GiB ({budget / GIB:.2f} GiB): dirty pages the jobs cannot use; its cost is "
        "memory, not time, so it is not priced",
        f"vm.dirty_bytes={a.dirty_bytes} / vm.dirty_background_bytes={a.dirty_background_bytes}", None,
        a.to_context())]


def _call_share(s: Situation, stage: str, calls: tuple[str, ...]) -> tuple[float, float, int] | None:
    rows = [p for p in s.of_stage(stage) if by_call(p.calls)]
    if not rows:
        return None
    spent = median([sum(float(by_call(p.calls).get(c, {}).get("total_us", 0)) for c in calls) / 1e6 for p in rows])
    count = int(median([sum(int(by_call(p.calls).get(c, {}).get("count", 0)) for c in calls) for p in rows]))
    return spent, median([p.duration_s for p in rows]), count


def sync_and_metadata(s: Situation) -> list[Finding]:
    """fsync-heavy or metadata-heavy (open/close) stages, from the per-call probes."""
    out = []
    for stage in STAGES:
        for code, calls, share_min, fix in (
                ("FSYNC_HEAVY", ("fsync",), SYNC_SHARE,
                 "drop fsync on scratch (it is disposable: a lost child is retried), or batch it per shard"),
                ("METADATA_HEAVY", ("open", "close"), METADATA_SHARE,
                 "fewer, larger files (pack small files into a shard), and keep files open")):
            figures = _call_share(s, stage, calls)
            if figures is None:
                continue
            spent, duration, count = figures
            if duration <= 0 or spent / duration < share_min:
                continue
            out.append(make_finding(
                s, code, "medium", f"{stage} is {code.split('_')[0].lower()}-heavy",
                f"{stage}: {count:,} {'/'.join(calls)} calls took {spent:.1f} s of {duration:.1f} s "
                f"({spent / duration:.0%}, median child)", fix, spent, stage=stage))
    return out


CHECKS: tuple[Callable[[Situation], list[Finding]], ...] = (
    dirty_pause, credits, hdd_random, saturated, bound, network_bound, scratch_too_small, stragglers,
    cache_over_budget, sync_and_metadata,
)


def _stage_s(s: Situation, stage: str) -> float | None:
    rows = s.of_stage(stage)
    return median([p.duration_s for p in rows]) if rows else None


def graded(s: Situation, found: Sequence[Finding]) -> list[Finding]:
    """The findings worth a change: those on a stage too short to judge and those priced under the floor
    dropped, the severity of a priced one set by its cost's share of the median child's time."""
    child_s = s.child_s()
    floor = max(COST_FLOOR_S, COST_FLOOR_SHARE * child_s)
    kept = []
    for f in found:
        stage_s = _stage_s(s, f.stage) if f.stage else None
        if stage_s is not None and stage_s < SHORT_STAGE_S:
            continue
        cost = f.cost_s_per_child
        if cost is not None:
            if cost < floor:
                continue
            share = cost / child_s if child_s > 0 else 1.0
            severity = "high" if share >= SEVERITY_SHARES[0] else "medium" if share >= SEVERITY_SHARES[1] else "low"
            f = dataclasses.replace(f, severity=severity)
        kept.append(f)
    return kept


def find(situation: Situation) -> list[Finding]:
    """Every finding worth a change (graded): the findings of now before the what-ifs, each group the most
    severe and then the most costly first."""
    found = graded(situation, [f for check in CHECKS for f in check(situation)])
    return sorted(found, key=lambda f: (f.what_if is not None, SEVERITIES.index(f.severity),
                                        -(f.cost_s_per_child or 0.0)))
