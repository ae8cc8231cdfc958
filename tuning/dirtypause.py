"""DIRTY_PAUSE: writers paused by the dirty limit, which domain paused them (the child's container or the host) and
the fix that follows from it. Pure.

A child on a cgroup v2 host meets two writeback domains and is paced by whichever is nearer its limit
(tuning.cachedomain). Which one it was is read from the profiles where they carry both (the child's own threshold,
OwnDirtyThresholdBytes, and dirty pages, against the host's): the domain whose dirty count stood nearer its freerun
point; else from the plan's model of the stack's settings (Situation.current_domains).

A pause measured in a run on another kind of host (a laptop, the lab, a smaller instance) need not recur on the
plan's hosts: where the profiles carry no thresholds of a container and the plan's children each get well more of
their own than the run's children had (its host's threshold over the children it ran at once), and the simulated
download on the plan's hosts under the stack's settings now is no slower than under the advised cache, the finding
says so (info, no cost) and names no knob.

The fixes differ. The host's domain: the host's vm.dirty_*. The container's: a larger job MEMORY (its domain is the
dirty ratio of its own memory), or a larger vm.dirty_* (each child gets it in proportion to its memory) with the
scratch device's host-wide share bounded by the per-device limits /sys/class/bdi/<dev>/max_bytes and strict_limit.
Those two came in Linux 6.2 (S. Roesch, "mm/block: add bdi sysfs knobs"; Documentation/ABI/testing/sysfs-class-bdi):
AL2023's 6.12 kernel has them, its 6.1 kernel only max_ratio, in whole percent and enforced only past the freerun
point ("this knob only applies once (dirty_ratio + dirty_background_ratio)/2 is reached", the series' cover letter).
"""

from __future__ import annotations

from profiling.metrics import STAGES, StageProfile, median
from tuning.cachedomain import CONTAINER, HOST
from tuning.ebs import GIB
from tuning.situation import Finding, Situation, make_finding, values_of

# Writers count as paused when the dirty-throttle pause (eBPF) is at least this long in a stage.
DIRTY_PAUSE_MIN_MS = 100.0
# The plan's hosts give a child "well more" dirty room than the run's host did: at least this many times its share.
MORE_ROOM = 1.25
BDI_LIMITS = ("/sys/class/bdi/<dev>/max_bytes and strict_limit (Linux 6.2+, so on AL2023's 6.12 kernel; 6.1 has only "
              "max_ratio, in whole percent and enforced only past the freerun point)")


def _freerun_share(dirty: int | None, thresh: int | None, background: int | None) -> float | None:
    """How far a domain's dirty count got towards its freerun point ((thresh + background) / 2), 1 = there."""
    if not dirty or not thresh or background is None:
        return None
    return dirty / ((thresh + background) / 2)


def _host_share(p: StageProfile) -> float | None:
    return _freerun_share(p.peak_dirty_bytes, p.dirty_threshold_bytes, p.dirty_background_threshold_bytes)


def _own_share(p: StageProfile) -> float | None:
    own = (p.own_peak_dirty_bytes or 0) + (p.own_peak_writeback_bytes or 0)
    return _freerun_share(own, p.own_dirty_threshold_bytes, p.own_dirty_background_threshold_bytes)


def paused_domain(s: Situation, rows: list[StageProfile]) -> tuple[str, str]:
    """(CONTAINER or HOST, the evidence that says so)."""
    both = [(own, host) for own, host in ((_own_share(p), _host_share(p)) for p in rows)
            if own is not None and host is not None]
    if both:
        own, host = median([o for o, _ in both]), median([h for _, h in both])
        limits = [p.own_dirty_threshold_bytes or 0 for p in rows if p.own_dirty_threshold_bytes]
        domain = CONTAINER if own >= host else HOST
        return domain, (f"the child's own dirty pages reached {own:.0%} of its container's freerun point (its "
                        f"threshold {median(limits) / GIB:.2f} GiB), the host's {host:.0%}: the {domain}'s domain "
                        "paced it (median child)")
    d = s.current_domains
    if d is None or d.container is None:
        return HOST, ""
    shared = "" if d.children == 1 else (f" for {d.children} children "
                                         f"({d.host.limit_bytes / d.children / GIB:.2f} GiB each)")
    return d.tighter, (f"modelled: a child's own limit (its container's, {s.plan.job_memory_gib:g} GiB) is "
                       f"{d.container.limit_bytes / GIB:.2f} GiB, the host's {d.host.limit_bytes / GIB:.2f} GiB"
                       f"{shared}: the {d.tighter}'s domain paces it")


def _fix(s: Situation, domain: str) -> str:
    t = s.advised_tuning
    cache = f"vm.dirty_bytes={t.dirty_bytes} / vm.dirty_background_bytes={t.dirty_background_bytes}"
    if domain == HOST:
        return f"raise the host's write cache to {cache} so one instance's burst passes without pauses"
    return (f"the child's own write cache is the limit, not the host's: give the job more memory (vcpusPerJob: "
            f"3.5 GiB per vCPU), or raise the host's to {cache}, which each child gets in proportion to its "
            f"memory, with the scratch device's host-wide share bounded by {BDI_LIMITS}")


def _not_on_plan_hosts(s: Situation, rows: list[StageProfile], stage: str) -> str | None:
    """Why a measured pause would not recur on the plan's hosts (see the module), or None when it may."""
    d = s.current_domains
    run_limits = [p.dirty_threshold_bytes for p in rows if p.dirty_threshold_bytes]
    if d is None or not run_limits or any(p.own_dirty_threshold_bytes for p in rows):
        return None
    run_limit, sharers = median([float(x) for x in run_limits]), s.sharers(stage)
    run_share = run_limit / sharers
    if d.child_limit_bytes < run_share * MORE_ROOM or s.current_download_s > s.tuned_download_s + \
            DIRTY_PAUSE_MIN_MS / 1000:
        return None
    return (f"the run's children had {run_share / GIB:.2f} GiB of dirty room each (its host's threshold "
            f"{run_limit / GIB:.2f} GiB for {sharers} at once); on the plan's "
            f"hosts each gets {d.child_limit_bytes / GIB:.2f} GiB ({d.tighter}'s domain) under the stack's settings "
            f"now, and the download is modelled at {s.current_download_s:,.1f} s, as with the advised cache")


def dirty_pause(s: Situation) -> list[Finding]:
    """Writers paused by the dirty limit: eBPF's pause, or dirty data at a domain's freerun point."""
    out = []
    for stage in STAGES:
        rows = s.of_stage(stage)
        pauses = values_of(rows, lambda p: p.dirty_throttle_ms)
        at_limit = [p for p in rows if max(_host_share(p) or 0.0, _own_share(p) or 0.0) >= 1.0]
        pause = median(pauses) if pauses else None
        paused = pause is not None and pause >= DIRTY_PAUSE_MIN_MS
        if not paused and len(at_limit) * 2 <= len(rows):
            continue
        cost: float | None
        modelled = False
        if pause is not None and paused:
            evidence = f"{stage}: writers paused {pause / 1000:.1f} s per child in balance_dirty_pages (median)"
            cost = pause / 1000
        else:
            modelled = stage == "download"
            evidence = (f"{stage}: dirty data reached the point where the kernel pauses writers in "
                        f"{len(at_limit)} of {len(rows)} children")
            cost = max(0.0, s.current_download_s - s.tuned_download_s) if stage == "download" else None
        if paused and (elsewhere := _not_on_plan_hosts(s, rows, stage)):
            out.append(make_finding(
                s, "DIRTY_PAUSE", "info", f"Writers paused by the run's dirty limit, not expected on the plan's hosts "
                f"({stage})", f"{evidence}; {elsewhere}", "none needed on the plan's hosts: the stack's settings now "
                "already hold a child's burst", None, stage=stage))
            continue
        domain, why = paused_domain(s, rows)
        out.append(make_finding(
            s, "DIRTY_PAUSE", "high", f"Writers paused by the {domain}'s dirty limit ({stage})",
            evidence + (f"; {why}" if why else ""), _fix(s, domain), cost, s.advised_tuning.to_context(),
            stage=stage, modelled=modelled))
    return out
