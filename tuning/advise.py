"""From measured stage profiles to a scratch volume, write-cache settings and the CDK context that applies them.

`advise()` is pure: it takes profiles (profiling.metrics.StageProfile) and a Plan (jobs per instance,
instance memory, jobs per day) and returns an Advice. Reading profile and EMF files is kept apart in
`load_profiles()`, the one function here that touches files.

How the advice is made:

1. The workload: per stage, the median child's bytes to and from the volume, its block I/O size and the
   time the stage needs when the volume is not what it waits on (its duration minus PSI io stall).
2. Each candidate volume replays a day of the plan (tuning.ebs.simulate): ceil(jobs per day / jobs per
   instance) rounds of jobs, spread over 24 hours, through the recommended write cache.
3. The recommended volume is the cheapest whose steady-state round (the median of the last quarter of
   the day, when credits may be gone) takes at most RECOMMEND_SLACK times the fastest candidate's.
4. The write cache absorbs the largest burst one instance writes in a stage (jobs per instance x bytes
   per job) without pausing writers, within a memory budget.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiling.emf import profile_from_emf
from profiling.metrics import STAGES, StageProfile, median
from profiling.runfiles import read_profiles
from tuning.ebs import GIB, MIB, SimResult, StageLoad, Volume, VolumeError, WriteCache, simulate
from tuning.host import KERNEL_DEFAULTS, HostTuning

# ---- prices ------------------------------------------------------------------------------------------
# AWS EBS list prices for us-east-1 (https://aws.amazon.com/ebs/pricing/), unchanged from 2021 through
# the date below. Storage is billed per GB-month of provisioned size; prices differ by region.
PRICES_REGION = "us-east-1"
PRICES_AS_OF = "2025-06-01"
PRICE_PER_GB_MONTH: dict[str, float] = {"st1": 0.045, "sc1": 0.015, "gp2": 0.10, "gp3": 0.08, "io2": 0.125}
GP3_PRICE_PER_IOPS_MONTH = 0.005  # above the free 3,000
GP3_PRICE_PER_MIBPS_MONTH = 0.040  # above the free 125 MiB/s
# io2 provisioned IOPS are billed in tiers: (up to this many IOPS, price per IOPS-month).
IO2_IOPS_TIERS: tuple[tuple[float, float], ...] = ((32_000, 0.065), (64_000, 0.0455), (math.inf, 0.032))

# A candidate counts as "as fast" as the fastest when its steady round is within this factor.
RECOMMEND_SLACK = 1.10
# The cache should absorb the burst with this much room to spare.
CACHE_HEADROOM = 1.10
# Default share of instance memory the write cache may hold (the jobs need the rest).
DEFAULT_CACHE_BUDGET_PCT = 40.0
# A stage's floor (time not spent waiting on the volume) is never taken below this share of its duration.
MIN_FLOOR_SHARE = 0.1
SECONDS_PER_DAY = 86_400.0
# Simulating more rounds than this adds nothing (credits reach a steady state long before).
MAX_WAVES = 2_000


class AdviseError(ValueError):
    """Input the advisor cannot use; the message names the input and the fix."""


def monthly_cost(volume: Volume) -> float:
    """USD per month for the volume in PRICES_REGION, at the PRICES_AS_OF list prices."""
    cost = volume.size_gib * PRICE_PER_GB_MONTH[volume.kind]
    if volume.kind == "gp3":
        cost += max(0, volume.provisioned_iops - 3000) * GP3_PRICE_PER_IOPS_MONTH
        cost += max(0.0, volume.provisioned_mibps - 125) * GP3_PRICE_PER_MIBPS_MONTH
    elif volume.kind == "io2":
        left, low = float(volume.provisioned_iops), 0.0
        for upto, price in IO2_IOPS_TIERS:
            take = min(left, upto - low)
            cost += take * price
            left -= take
            low = upto
            if left <= 0:
                break
    return round(cost, 2)


# ---- inputs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the user intends to run on each instance."""

    jobs_per_instance: int
    memory_gib: float
    jobs_per_day: int  # per instance: each instance has its own scratch volume
    instance_ebs_mibps: float | None = None
    kernel_release: str | None = None
    cache_budget_pct: float = DEFAULT_CACHE_BUDGET_PCT
    io_size_kib: int | None = None  # overrides the measured block I/O size

    def validate(self) -> None:
        if self.jobs_per_instance < 1:
            raise AdviseError(f"jobs per instance {self.jobs_per_instance} must be at least 1")
        if not self.memory_gib > 0:
            raise AdviseError(f"instance memory {self.memory_gib} GiB must be positive, e.g. --memory-gib 16")
        if self.jobs_per_day < 1:
            raise AdviseError(f"jobs per day {self.jobs_per_day} must be at least 1")
        if self.instance_ebs_mibps is not None and not self.instance_ebs_mibps > 0:
            raise AdviseError(f"instance EBS bandwidth {self.instance_ebs_mibps} MiB/s must be positive")
        if not 1 <= self.cache_budget_pct <= 90:
            raise AdviseError(f"cache budget {self.cache_budget_pct}% is outside 1-90% of memory")
        if self.io_size_kib is not None and self.io_size_kib < 1:
            raise AdviseError(f"I/O size {self.io_size_kib} KiB must be at least 1")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def waves_per_day(self) -> int:
        return math.ceil(self.jobs_per_day / self.jobs_per_instance)


@dataclass(frozen=True)
class Workload:
    """One job as the volume sees it, and where the figures came from."""

    stages: tuple[StageLoad, ...]
    children: int
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> StageLoad | None:
        return next((s for s in self.stages if s.name == name), None)


def workload_from_profiles(profiles: Sequence[StageProfile], *, io_size_kib: int | None = None) -> Workload:
    """The median child's load per stage, from successful stage profiles."""
    ok = [p for p in profiles if p.outcome == "ok"]
    if not ok:
        raise AdviseError("no successful stage profiles in the input: give the profiles/ or emf/ files of "
                          "a run whose children finished")
    notes: list[str] = []
    loads: list[StageLoad] = []
    children = 0
    for stage in STAGES:
        of_stage = [p for p in ok if p.stage == stage]
        if not of_stage:
            continue
        children = max(children, len(of_stage))
        writes = [float(_volume_writes(p)) for p in of_stage]
        reads = [float(p.storage_read_bytes) for p in of_stage]
        floors = [_floor(p) for p in of_stage]
        io = _io_size(of_stage)
        if io_size_kib is not None:
            io = io_size_kib * 1024
        elif io is None:
            io = MIB
            notes.append(f"{stage}: no block-device figures in the profiles; assuming 1 MiB I/O")
        loads.append(StageLoad(stage, int(median(writes)), int(median(reads)), int(io), median(floors)))
    if not any(s.write_bytes or s.read_bytes for s in loads):
        raise AdviseError("the profiles show no bytes written to or read from scratch: was the run empty?")
    return Workload(tuple(loads), children, tuple(notes))


def _volume_writes(p: StageProfile) -> int:
    # Bytes the stage sends to storage; wchar stands in when the scratch filesystem does not count them
    # (tmpfs). The upload stage's wchar is network traffic, never scratch.
    if p.storage_write_bytes > 0:
        return p.storage_write_bytes
    return 0 if p.stage == "upload" else p.write_bytes


def _floor(p: StageProfile) -> float:
    stall = (p.io_stall_some_ms or 0.0) / 1000
    return max(p.duration_s - stall, p.duration_s * MIN_FLOOR_SHARE, 0.0)


def _io_size(of_stage: Sequence[StageProfile]) -> float | None:
    nbytes = sum((p.device_write_bytes or 0) + (p.device_read_bytes or 0) for p in of_stage)
    ops = sum((p.device_write_ops or 0) + (p.device_read_ops or 0) for p in of_stage)
    return nbytes / ops if ops > 0 and nbytes > 0 else None


# ---- outputs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CandidateResult:
    """One volume under the plan: predicted stage times, credits and cost."""

    volume: Volume
    download_s: float  # the first round (full bucket)
    upload_s: float
    steady_download_s: float  # the median of the last quarter of the day
    steady_upload_s: float
    steady_round_s: float
    time_to_durable_s: float | None  # the first round: until its writes are all on the volume
    credits_run_out_h: float | None  # hours into the day; None when they last
    fits_day: bool
    monthly_usd: float
    sim: SimResult = field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "volume": self.volume.label, "type": self.volume.kind, "size_gib": self.volume.size_gib,
            "iops": self.volume.iops, "throughput_mibps": self.volume.throughput_mibps,
            "baseline_mibps": round(self.volume.baseline_mibps, 2),
            "burst_mibps": round(self.volume.burst_mibps, 2),
            "download_s": round(self.download_s, 1), "upload_s": round(self.upload_s, 1),
            "steady_download_s": round(self.steady_download_s, 1),
            "steady_upload_s": round(self.steady_upload_s, 1),
            "time_to_durable_s": None if self.time_to_durable_s is None else round(self.time_to_durable_s, 1),
            "credits_run_out_h": None if self.credits_run_out_h is None else round(self.credits_run_out_h, 2),
            "fits_day": self.fits_day, "monthly_usd": self.monthly_usd,
        }


@dataclass(frozen=True)
class CacheAdvice:
    """Write-cache limits for one instance and why."""

    tuning: HostTuning
    burst_bytes: int  # the most one instance writes in one stage
    budget_bytes: int
    fits: bool  # the burst fits under the freerun point within the budget
    default_freerun_bytes: int  # what an untuned kernel lets through before pausing writers
    tradeoff: str

    def to_json(self) -> dict[str, Any]:
        return {
            "dirty_bytes": self.tuning.dirty_bytes,
            "dirty_background_bytes": self.tuning.dirty_background_bytes,
            "burst_bytes": self.burst_bytes, "budget_bytes": self.budget_bytes, "fits": self.fits,
            "default_freerun_bytes": self.default_freerun_bytes, "tradeoff": self.tradeoff,
            "sysctls": self.tuning.sysctls(), "mount_options": self.tuning.mount_option_string(),
        }


@dataclass(frozen=True)
class Advice:
    plan: Plan
    workload: Workload
    candidates: tuple[CandidateResult, ...]
    recommended: CandidateResult
    cache: CacheAdvice
    untuned_download_s: float  # the recommended volume with the kernel's default cache
    context: dict[str, str]
    burst_note: str

    @property
    def cdk_args(self) -> str:
        """`-c key=value ...` for `cdk deploy`."""
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in self.context.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": {
                "jobs_per_instance": self.plan.jobs_per_instance, "memory_gib": self.plan.memory_gib,
                "jobs_per_day": self.plan.jobs_per_day, "instance_ebs_mibps": self.plan.instance_ebs_mibps,
                "kernel_release": self.plan.kernel_release, "waves_per_day": self.plan.waves_per_day,
            },
            "workload": {
                "children_profiled": self.workload.children,
                "stages": [
                    {"stage": s.name, "write_bytes": s.write_bytes, "read_bytes": s.read_bytes,
                     "io_size": s.io_size, "floor_s": round(s.floor_s, 3)}
                    for s in self.workload.stages
                ],
                "notes": list(self.workload.notes),
            },
            "prices": {"region": PRICES_REGION, "as_of": PRICES_AS_OF},
            "candidates": [c.to_json() for c in self.candidates],
            "recommended": self.recommended.volume.label,
            "untuned_download_s": round(self.untuned_download_s, 1),
            "write_cache": self.cache.to_json(),
            "burst": self.burst_note,
            "cdk_context": self.context,
            "cdk_args": self.cdk_args,
        }

    def to_dict(self) -> dict[str, Any]:
        """The same as to_json(): what the HTML report's advice section reads."""
        return self.to_json()


# ---- the advisor -------------------------------------------------------------------------------------


def advise(profiles: Sequence[StageProfile], plan: Plan, candidates: Sequence[Volume] | None = None) -> Advice:
    """Simulate each candidate volume under the plan and recommend a volume and a write cache."""
    plan.validate()
    workload = workload_from_profiles(profiles, io_size_kib=plan.io_size_kib)
    cache = advise_cache(workload, plan)
    volumes = list(candidates) if candidates else default_candidates(workload, plan)
    dirty_bytes = cache.tuning.dirty_bytes or 0
    background = cache.tuning.dirty_background_bytes or 0
    tuned = WriteCache(dirty_bytes, background)
    results = tuple(_evaluate(v, workload, plan, tuned) for v in volumes)
    recommended = recommend(results)
    untuned = _evaluate(recommended.volume, workload, plan, _kernel_default_cache(plan), waves=1)
    context = volume_context(recommended.volume)
    context.update(cache.tuning.to_context())
    return Advice(plan, workload, results, recommended, cache, untuned.download_s, context,
                  _burst_note(recommended))


def recommend(results: Sequence[CandidateResult]) -> CandidateResult:
    """The cheapest candidate that fits the day and is within RECOMMEND_SLACK of the fastest."""
    if not results:
        raise AdviseError("no candidate volumes to compare: give at least one --candidate")
    pool = [r for r in results if r.fits_day] or list(results)
    fastest = min(r.steady_round_s for r in pool)
    good = [r for r in pool if r.steady_round_s <= fastest * RECOMMEND_SLACK]
    return min(good, key=lambda r: (r.monthly_usd, r.steady_round_s))


def advise_cache(workload: Workload, plan: Plan) -> CacheAdvice:
    """dirty_bytes / dirty_background_bytes that let one instance's largest burst pass without pauses.

    Writers run free until dirty data reaches (background + limit) / 2. With the background limit at
    half the hard limit, that point is 3/4 of the limit, so limit = burst x headroom / 0.75, capped by
    the memory budget.
    """
    burst = plan.jobs_per_instance * max(s.write_bytes for s in workload.stages)
    budget = int(plan.memory_bytes * plan.cache_budget_pct / 100)
    want = math.ceil(burst * CACHE_HEADROOM / 0.75)
    limit = max(min(want, budget), 64 * MIB)
    limit = math.ceil(limit / MIB) * MIB
    background = limit // 2
    fits = want <= budget
    tuning = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=limit,
                        dirty_background_bytes=background)
    tuning.validate(plan.kernel_release)
    default = _kernel_default_cache(plan)
    tradeoff = (
        f"Up to {limit / GIB:.2f} GiB per instance of downloaded data lives only in memory until it is "
        "written back (background writeback starts at "
        f"{background / GIB:.2f} GiB). A host crash or Spot reclaim loses it, which is harmless for "
        "scratch: the child is retried and downloads again from S3, and results are durable only once "
        "uploaded. Dirty pages cannot be reclaimed until written, so this memory is not available to "
        "the jobs while the burst drains."
    )
    if not fits:
        tradeoff += (
            f" Absorbing the burst ({burst / GIB:.2f} GiB) needs a {want / GIB:.2f} GiB limit, more than the "
            f"{plan.cache_budget_pct:.0f}% memory budget ({budget / GIB:.2f} GiB): past "
            f"{limit * 3 // 4 / GIB:.2f} GiB downloads run at volume speed; "
            "fewer jobs per instance or a larger instance would let it fit."
        )
    return CacheAdvice(tuning, burst, budget, fits, default.freerun_bytes, tradeoff)


def _kernel_default_cache(plan: Plan) -> WriteCache:
    ratio = KERNEL_DEFAULTS.dirty_ratio or 20
    background = KERNEL_DEFAULTS.dirty_background_ratio or 10
    return WriteCache.from_ratios(plan.memory_bytes, ratio, background)


def default_candidates(workload: Workload, plan: Plan) -> list[Volume]:
    """st1, sc1, gp2 and gp3 (baseline and 250 MiB/s) sized for a round's data with room to spare."""
    per_round = plan.jobs_per_instance * sum(s.write_bytes for s in workload.stages)
    need_gib = max(1, math.ceil(per_round * 2 / GIB))
    hdd = max(125, need_gib)
    ssd = max(20, need_gib)
    return [
        Volume("st1", hdd),
        Volume("st1", max(hdd, 500)),
        Volume("st1", max(hdd, 2048)),
        Volume("sc1", max(hdd, 500)),
        Volume("gp2", max(ssd, 200)),
        Volume("gp3", ssd),
        Volume("gp3", max(ssd, 2), iops=3000, throughput_mibps=250),
    ]


def _evaluate(volume: Volume, workload: Workload, plan: Plan, cache: WriteCache,
              waves: int | None = None) -> CandidateResult:
    rounds = min(plan.waves_per_day, MAX_WAVES) if waves is None else waves
    round_floor = sum(s.floor_s for s in workload.stages)
    gap = max(0.0, SECONDS_PER_DAY / plan.waves_per_day - round_floor)
    cap = plan.instance_ebs_mibps * MIB if plan.instance_ebs_mibps else None
    sim = simulate(volume, workload.stages, concurrency=plan.jobs_per_instance, waves=rounds, gap_s=gap,
                   cache=cache, instance_cap_bps=cap, sample_every_s=60.0)
    first = sim.waves[0]
    tail = sim.waves[-max(1, len(sim.waves) // 4):]
    downloads = [w.stage_s.get("download", 0.0) for w in tail]
    uploads = [w.stage_s.get("upload", 0.0) for w in tail]
    rounds_s = [sum(w.stage_s.values()) for w in tail]
    last = sim.waves[-1]
    day_end = last.started_at + sum(last.stage_s.values())
    fits = rounds < plan.waves_per_day or day_end <= SECONDS_PER_DAY * 1.0001 or plan.waves_per_day == 1
    return CandidateResult(
        volume=volume,
        download_s=first.stage_s.get("download", 0.0),
        upload_s=first.stage_s.get("upload", 0.0),
        steady_download_s=median(downloads),
        steady_upload_s=median(uploads),
        steady_round_s=median(rounds_s),
        time_to_durable_s=first.time_to_durable_s,
        credits_run_out_h=None if sim.credits_empty_at is None else sim.credits_empty_at / 3600,
        fits_day=fits,
        monthly_usd=monthly_cost(volume),
        sim=sim,
    )


def volume_context(volume: Volume) -> dict[str, str]:
    """The CDK context keys for the scratch volume."""
    ctx = {"volumeType": volume.kind, "volumeSizeGiB": str(volume.size_gib)}
    if volume.kind in ("gp3", "io2"):
        ctx["volumeIops"] = str(volume.provisioned_iops)
    if volume.kind == "gp3":
        ctx["volumeThroughput"] = f"{volume.provisioned_mibps:g}"
    return ctx


def _burst_note(result: CandidateResult) -> str:
    volume = result.volume
    if not volume.bursts:
        return f"{volume.label} does not burst: its speed does not change over the day."
    text = volume.explain_burst()
    if result.credits_run_out_h is None:
        return text + " At the planned load the bucket never runs dry."
    return text + (f" At the planned load it runs dry {result.credits_run_out_h:.1f} h into the day; after "
                   f"that a download takes {result.steady_download_s:.0f} s instead of "
                   f"{result.download_s:.0f} s.")


def parse_candidate(text: str) -> Volume:
    """'st1:500', 'gp3:200:iops=4000:throughput=250' or 'io2:100:iops=3000' -> Volume."""
    parts = [p.strip() for p in text.split(":")]
    if len(parts) < 2:
        raise AdviseError(f"candidate {text!r} is not TYPE:SIZE_GIB[:iops=N][:throughput=MIBPS], e.g. st1:500")
    try:
        size = int(parts[1])
    except ValueError:
        raise AdviseError(f"candidate {text!r}: size {parts[1]!r} is not a whole number of GiB") from None
    extra: dict[str, float] = {}
    for part in parts[2:]:
        key, _, value = part.partition("=")
        if key not in ("iops", "throughput") or not value:
            raise AdviseError(f"candidate {text!r}: {part!r} is not iops=N or throughput=MIBPS")
        try:
            extra[key] = float(value)
        except ValueError:
            raise AdviseError(f"candidate {text!r}: {part!r} is not a number") from None
    try:
        return Volume(parts[0], size,
                      iops=int(extra["iops"]) if "iops" in extra else None,
                      throughput_mibps=extra.get("throughput"))
    except VolumeError as exc:
        raise AdviseError(f"candidate {text!r}: {exc}") from None


# ---- reading inputs (the only file I/O here) ---------------------------------------------------------

def profiles_from_emf(documents: Iterable[Mapping[str, Any]]) -> list[StageProfile]:
    """StageProfiles rebuilt from EMF documents (one per stage), as CloudWatch Logs or a local run keep them."""
    found = (profile_from_emf(doc, namespace=None) for doc in documents)
    return [profile for profile in found if profile is not None]


def load_profiles(paths: Sequence[Path]) -> list[StageProfile]:
    """Profiles from run directories, profile .jsonl files and EMF files (.emf, .json or .log)."""
    if not paths:
        raise AdviseError("no profiles given: pass a run directory, profiles/*.jsonl or emf/*.emf files")
    out: list[StageProfile] = []
    for path in paths:
        if not path.exists():
            raise AdviseError(f"{path} does not exist: pass a run directory or profile/EMF files")
        if path.is_dir():
            files = sorted((path / "profiles").glob("*.jsonl"))
            if files:
                for f in files:
                    out.extend(_read_profile_file(f))
                continue
            emf = sorted((path / "emf").glob("*.emf"))
            if not emf:
                raise AdviseError(f"{path} has no profiles/*.jsonl or emf/*.emf: is it a run directory?")
            for f in emf:
                out.extend(_read_emf_file(f))
        elif path.suffix == ".jsonl":
            out.extend(_read_profile_file(path))
        else:
            out.extend(_read_emf_file(path))
    if not out:
        raise AdviseError("the inputs hold no stage profiles: give the profiles or EMF files of a finished run")
    return out


def _read_profile_file(path: Path) -> list[StageProfile]:
    try:
        return list(read_profiles(path))
    except ValueError as exc:
        raise AdviseError(str(exc)) from None


def _read_emf_file(path: Path) -> list[StageProfile]:
    docs: list[Mapping[str, Any]] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line.startswith("{"):
                continue  # log lines around the EMF documents
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                raise AdviseError(f"{path}:{number}: not a JSON document") from None
            if isinstance(doc, dict):
                docs.append(doc)
    profiles = profiles_from_emf(docs)
    if not profiles and docs:
        raise AdviseError(f"{path}: no EMF stage documents (with _aws and Stage) in it")
    return profiles


# ---- rendering ---------------------------------------------------------------------------------------


def render(advice: Advice) -> str:
    """The advice as a console table and a few paragraphs."""
    plan = advice.plan
    lines = [
        f"Plan: {plan.jobs_per_instance} jobs per instance, {plan.memory_gib:g} GiB memory, "
        f"{plan.jobs_per_day} jobs per instance per day ({plan.waves_per_day} rounds)"
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
            f"{c.monthly_usd:,.2f}",
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
        "",
        f"Write cache: vm.dirty_bytes={cache.tuning.dirty_bytes} ({(cache.tuning.dirty_bytes or 0) / GIB:.2f} "
        f"GiB), vm.dirty_background_bytes={cache.tuning.dirty_background_bytes} "
        f"({(cache.tuning.dirty_background_bytes or 0) / GIB:.2f} GiB), sized for a burst of "
        f"{cache.burst_bytes / GIB:.2f} GiB per instance. The kernel's defaults (dirty_ratio 20, "
        f"background 10) pause writers at {cache.default_freerun_bytes / GIB:.2f} GiB: a download takes "
        f"{advice.untuned_download_s:,.1f} s untuned vs {rec.download_s:,.1f} s tuned on {rec.volume.label}"
        + (". The defaults already absorb the burst; the smaller limit keeps less data at risk and less "
           "memory pinned." if cache.default_freerun_bytes >= cache.burst_bytes * CACHE_HEADROOM else "."),
        f"Durability: {cache.tradeoff}",
        f"Mount options (valid for kernel {plan.kernel_release or 'current'}): "
        f"{cache.tuning.mount_option_string()}",
        "",
        "CDK context:",
        f"  cdk deploy {advice.cdk_args}",
    ]
    return "\n".join(lines)
