"""From measured stage profiles to a scratch volume, write-cache settings and the CDK context that applies them.

In: StageProfiles (profiling.metrics) and a Plan (jobs per instance, instance memory, jobs per day; tuning.plan).
Out: an Advice: per candidate volume a day of the plan replayed (tuning.simulator), the recommended volume (the
cheapest EBS candidate that fits the day, its steady round within RECOMMEND_SLACK of the fastest EBS one's), the
write cache that lets one instance's largest stage burst pass without pausing writers (within the memory budget),
the findings (tuning.findings) and the `cdk deploy -c` context. `advise()` is pure; `load_profiles()`, the one
function here that touches files, reads run directories, profile lines and EMF files. The inputs (Plan, Workload,
parse_candidate, AdviseError) live in tuning.plan, the prices in tuning.prices, the console text in
tuning.advice_text; how the model works and where it is weak: docs/advisor.md.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from profiling import runfiles
from profiling.emfnamespaces import namespaces_in, no_stage_documents, stage_namespaces
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile, median
from tuning.cachedomain import Domains, domains, host_bytes_for_child_limit
from tuning.ebs import GIB, MIB, Volume
from tuning.findings import Finding, Situation, find
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.instancestore import InstanceStore, check_fits_plan, same_size_stores
from tuning.measured import at_measured, fleet_capability
from tuning.plan import AdviseError, Plan, Workload, workload_from_profiles
from tuning.prices import PRICES_AS_OF, PRICES_REGION, monthly_cost
from tuning.simulator import SimResult, simulate
from tuning.situation import ADVISOR_FIELDS
from tuning.versus import choose, compare, pool
from tuning.writecache import WriteCache

# A candidate counts as "as fast" as the fastest when its steady round is within this factor.
RECOMMEND_SLACK = 1.10
# The cache should absorb the burst with this much room to spare.
CACHE_HEADROOM = 1.10
SECONDS_PER_DAY = 86_400.0
# Simulating more rounds than this adds nothing (credits reach a steady state long before).
MAX_WAVES = 2_000


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
    time_to_durable_s: float | None  # the first round: until its writes are on the volume or removed with scratch
    credits_run_out_h: float | None  # hours into the day; None when they last
    fits_day: bool
    monthly_usd: float | None  # None: not priced (an instance store whose share of the instance price is not given)
    sim: SimResult = field(repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "volume": self.volume.label, "type": self.volume.kind, "size_gib": self.volume.size_gib,
            "instance_type": getattr(self.volume, "instance_type", None),
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


# A predicted range is shown when one of its ends is more than this share away from the prediction.
RANGE_SHOWN = 0.25


def shows_range(low: float | None, predicted: float, high: float | None = None) -> bool:
    """Whether a prediction is given as a range: its optimistic end (None: none) is far enough below it, or its
    pessimistic end far enough above."""
    return (low is not None and low < predicted * (1 - RANGE_SHOWN)) or \
        (high is not None and high > predicted * (1 + RANGE_SHOWN))


def range_ends(low: float | None, predicted: float, high: float | None) -> tuple[float, float]:
    """A prediction's range: the lowest and the highest of its optimistic end, the prediction and its pessimistic
    end (an end that was not computed, None, taken as the prediction itself). The optimistic state is not always the
    lowest: a new container's context paces harder than the settled controller on a volume that drains faster than
    its 100 MiB/s a writer (tuning.writecache)."""
    ends = [predicted] + [end for end in (low, high) if end is not None]
    return min(ends), max(ends)


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
    findings: tuple[Finding, ...] = ()
    comparison: tuple[str, ...] = ()  # st1 against gp3 and instance store on this plan (tuning.versus)
    # The same under the optimistic state of the kernel's pacing (cachedomain.Domains.optimistic: a controller not
    # settled, or the children's new containers): the optimistic end of the untuned download's range. Far below
    # untuned_download_s when the burst ends just past the freerun point.
    untuned_download_low_s: float | None = None
    # ... and with writers held at the freerun point (WriteCache.held): the pessimistic end.
    untuned_download_high_s: float | None = None

    @property
    def cdk_args(self) -> str:
        """`-c key=value ...` for `cdk deploy`."""
        return " ".join(f"-c {shlex.quote(f'{k}={v}')}" for k, v in self.context.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": {
                "jobs_per_instance": self.plan.jobs_per_instance, "memory_gib": self.plan.memory_gib,
                "job_memory_gib": self.plan.job_memory_gib, "instance_type": self.plan.instance_type,
                "jobs_per_day": self.plan.jobs_per_day, "instance_ebs_mibps": self.plan.instance_ebs_mibps,
                "kernel_release": self.plan.kernel_release, "waves_per_day": self.plan.waves_per_day,
                "instance_usd_per_hour": self.plan.instance_usd_per_hour, "assumed": self.plan.assumed,
                "summary": self.plan.describe(),
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
            "untuned_download_low_s": None if self.untuned_download_low_s is None else
            round(self.untuned_download_low_s, 1),
            "untuned_download_high_s": None if self.untuned_download_high_s is None else
            round(self.untuned_download_high_s, 1),
            "write_cache": self.cache.to_json(),
            "burst": self.burst_note,
            "comparison": list(self.comparison),
            "cdk_context": self.context,
            "cdk_args": self.cdk_args,
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_dict(self) -> dict[str, Any]:
        """The advice as a plain JSON-able dict: what the HTML report's advice section reads.

        Its keys: plan, workload (children_profiled, stages, notes), prices (region, as_of), candidates (one
        dict per volume: volume, type, size_gib, ..., download_s, steady_download_s, credits_run_out_h,
        fits_day, monthly_usd), recommended, untuned_download_s, write_cache, burst, cdk_context, cdk_args,
        and findings: a list, most severe first, of
        {code, severity, title, evidence, fix, cost_s_per_child, cost_usd_per_month, context, stage, what_if}
        where severity is high, medium, low or info (from the cost's share of a child's time), the costs are
        numbers or None (not measurable; the evidence says why), cost_usd_per_month is instance time per
        instance under plan.summary, context maps CDK context keys to the values that apply the fix (possibly
        empty), stage is the stage it is about (or None), and what_if is the volume a finding models when the
        run did not run on it (a local run's "if this ran on st1 500 GiB"), else None: a cost now.
        """
        return self.to_json()


# ---- the advisor -------------------------------------------------------------------------------------


def advise(profiles: Sequence[StageProfile], plan: Plan, candidates: Sequence[Volume] | None = None) -> Advice:
    """Simulate each candidate volume under the plan and recommend a volume and a write cache."""
    plan.validate()
    workload = workload_from_profiles(profiles, io_size_kib=plan.io_size_kib, random_pct=plan.random_pct)
    cache = advise_cache(workload, plan)
    volumes = list(candidates) if candidates else default_candidates(workload, plan)
    # The fleet's measured capability where it is below the model (tuning/measured.py), said in the notes.
    volumes, current, note = at_measured(volumes, plan.current_volume, fleet_capability(profiles))
    if note:
        plan, workload = replace(plan, current_volume=current), replace(workload, notes=(*workload.notes, note))
    for volume in volumes:
        misfit = check_fits_plan(volume, plan.memory_gib, plan.instance_type) if isinstance(
            volume, InstanceStore) else None
        if misfit:
            raise AdviseError(misfit)
    tuned = _cache(cache.tuning, plan)
    results = tuple(_evaluate(v, workload, plan, tuned) for v in volumes)
    recommended = recommend(results)
    untouched = _domains(KERNEL_DEFAULTS, plan)
    default = untouched.effective
    untuned, untuned_low, untuned_high = (_evaluate(recommended.volume, workload, plan, c, waves=1)
                                          for c in (default, untouched.optimistic, default.held()))
    context = recommended.volume.to_context()
    context.update(cache.tuning.to_context())
    context.update(plan.host_context)
    findings = find(_situation(profiles, plan, workload, tuned, cache, recommended.volume))
    versus = compare(results, workload, plan, RECOMMEND_SLACK, recommended)
    return Advice(plan, workload, results, recommended, cache, untuned.download_s, context,
                  _burst_note(recommended), tuple(findings), tuple(versus),
                  *range_ends(untuned_low.download_s, untuned.download_s, untuned_high.download_s))


def _situation(profiles: Sequence[StageProfile], plan: Plan, workload: Workload, tuned: WriteCache,
               cache: CacheAdvice, recommended: Volume) -> Situation:
    """The stack's volume and cache as they are now, replayed under the plan, for the findings."""
    volume, tuning = plan.current_volume, plan.current_tuning
    current = _domains(tuning, plan)
    now = _evaluate(volume, workload, plan, current.effective)
    advised = _evaluate(volume, workload, plan, tuned, waves=1)
    return Situation(plan, profiles, workload, volume, tuning, now.download_s, now.steady_download_s,
                     now.credits_run_out_h, advised.download_s, cache.tuning, recommended, current)


def recommend(results: Sequence[CandidateResult]) -> CandidateResult:
    """The cheapest EBS candidate that fits the day and is within RECOMMEND_SLACK of the fastest EBS candidate: the
    advice's one decision (tuning.versus.choose over tuning.versus.pool), which every other line says again.

    Instance store is compared (tuning.versus), never recommended: its price is in the instance's, which the
    advisor does not know, and choosing it changes the instance types (the line says how to deploy it)."""
    chosen = choose(pool(results), RECOMMEND_SLACK)
    if chosen is None:
        raise AdviseError("no EBS candidate to recommend: give at least one EBS --candidate (e.g. st1:500) beside "
                          "instance store, which is compared, not recommended")
    return chosen


def advise_cache(workload: Workload, plan: Plan) -> CacheAdvice:
    """dirty_bytes / dirty_background_bytes that let one instance's largest burst pass without pauses.

    Writers run free until dirty data reaches (background + limit) / 2. With the background limit at
    half the hard limit, that point is 3/4 of the limit, so limit = burst x headroom / 0.75, capped by
    the memory budget. When each child has a memory limit, its own domain must pass its own burst too: the host's
    dirty_bytes reaches it in proportion to its memory (tuning.cachedomain), so the host's limit is raised until
    the child's own is its burst x headroom / 0.75, within the budget's share of the child's memory.
    """
    per_child = max(s.write_bytes for s in workload.stages)
    burst = plan.jobs_per_instance * per_child
    budget = int(plan.memory_bytes * plan.cache_budget_pct / 100)
    want = math.ceil(burst * CACHE_HEADROOM / 0.75)
    child_fits = True
    job_bytes = plan.job_memory_bytes
    if job_bytes is not None:
        child_want = math.ceil(per_child * CACHE_HEADROOM / 0.75)
        child_budget = int(job_bytes * plan.cache_budget_pct / 100)
        child_fits = child_want <= child_budget
        want = max(want, host_bytes_for_child_limit(min(child_want, child_budget), plan.memory_bytes, job_bytes))
    limit = max(min(want, budget), 64 * MIB)
    limit = math.ceil(limit / MIB) * MIB
    background = limit // 2
    fits = want <= budget and child_fits
    # The stack's own host settings stay (mount options, expiry); the dirty limits are the advice, on EBS scratch.
    tuning = replace(plan.current_tuning, dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=limit,
                     dirty_background_bytes=background, scratch="ebs")
    tuning.validate(plan.kernel_release)
    default = _cache(KERNEL_DEFAULTS, plan)
    tradeoff = (
        f"Up to {limit / GIB:.2f} GiB per instance of downloaded data lives only in memory until it is "
        "written back (background writeback starts at "
        f"{background / GIB:.2f} GiB). A host crash or Spot reclaim loses it, which is harmless for "
        "scratch: the child is retried and downloads again from S3, and results are durable only once "
        "uploaded. Dirty pages cannot be reclaimed until written, so this memory is not available to "
        "the jobs while the burst drains."
    )
    if not child_fits:
        tradeoff += (
            f" Each child's own write cache is the dirty ratio of its {plan.job_memory_gib:g} GiB (its container's): "
            f"its burst of {per_child / GIB:.2f} GiB does not fit in {plan.cache_budget_pct:.0f}% of that; more "
            "memory per job (vcpusPerJob) would let it fit.")
    elif not fits:
        tradeoff += (
            f" Absorbing the burst ({burst / GIB:.2f} GiB) needs a {want / GIB:.2f} GiB limit, more than the "
            f"{plan.cache_budget_pct:.0f}% memory budget ({budget / GIB:.2f} GiB): past "
            f"{limit * 3 // 4 / GIB:.2f} GiB downloads run at volume speed; "
            "fewer jobs per instance or a larger instance would let it fit."
        )
    return CacheAdvice(tuning, burst, budget, fits, default.freerun_bytes, tradeoff)


def _domains(tuning: HostTuning, plan: Plan) -> Domains:
    """The host's and each child's write cache under `tuning` on the plan's hosts (tuning.cachedomain)."""
    return domains(tuning, plan.memory_bytes, plan.job_memory_bytes, plan.jobs_per_instance)


def _cache(tuning: HostTuning, plan: Plan) -> WriteCache:
    """The write cache the plan's children meet under `tuning`: the host's, or their containers' when tighter."""
    return _domains(tuning, plan).effective


def default_cache_domain(plan: Plan) -> str:
    """Which domain pauses the children under the kernel's defaults: 'container' or 'host'."""
    return _domains(KERNEL_DEFAULTS, plan).tighter


def default_candidates(workload: Workload, plan: Plan) -> list[Volume]:
    """st1, sc1, gp2 and gp3 (baseline and 250 MiB/s) sized for a round's data with room to spare, and the
    instance stores of the plan's instance size when it names one (tuning.instancestore.same_size_stores) and the plan
    is theirs (a --memory-gib other than the type's is not: check_fits_plan); a default is never refused."""
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
        *(store for store in same_size_stores(plan.instance_type)
          if check_fits_plan(store, plan.memory_gib, plan.instance_type) is None),
    ]


def _evaluate(volume: Volume, workload: Workload, plan: Plan, cache: WriteCache,
              waves: int | None = None) -> CandidateResult:
    rounds = min(plan.waves_per_day, MAX_WAVES) if waves is None else waves
    round_floor = sum(s.floor_s for s in workload.stages)
    gap = max(0.0, SECONDS_PER_DAY / plan.waves_per_day - round_floor)
    # The instance's EBS bandwidth caps EBS volumes only; its instance store is local.
    ebs_cap = plan.instance_ebs_mibps and not isinstance(volume, InstanceStore)
    cap = plan.instance_ebs_mibps * MIB if ebs_cap and plan.instance_ebs_mibps else None
    sim = simulate(volume, workload.stages, concurrency=plan.jobs_per_instance, waves=rounds, gap_s=gap,
                   cache=cache, instance_cap_bps=cap, sample_every_s=None)
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


# ---- reading inputs (the only file I/O here) ---------------------------------------------------------

def profiles_from_emf(documents: Iterable[Mapping[str, Any]], where: str = "the EMF documents",
                      namespace: str = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """StageProfiles rebuilt from EMF documents (one per stage), as CloudWatch Logs or a local run keep them: of
    `namespace` only, their figures checked as a profile's (runfiles.DamagedFileError naming `where`)."""
    return runfiles.profiles_from_documents(documents, where=where, namespace=namespace)


def load_profiles(paths: Sequence[Path], *, namespace: str = DEFAULT_NAMESPACE) -> list[StageProfile]:
    """Profiles from run directories, profile .jsonl files and EMF files (.emf, .json or .log; their stage documents
    of `namespace`: EMF files of only another namespace are an AdviseError naming what they hold).

    A run directory is read as profiling.runfiles reads it: its profiles, else its EMF files.
    """
    if not paths:
        raise AdviseError("no profiles given: pass a run directory, profiles/*.jsonl or emf/*.emf files")
    out: list[StageProfile] = []
    for path in paths:
        if not path.exists():
            raise AdviseError(f"{path} does not exist: pass a run directory or profile/EMF files")
        if path.is_dir() and not runfiles.profile_files(path) and not runfiles.emf_files(path):
            raise AdviseError(f"{path} has no profiles/*.jsonl or emf/*.emf: is it a run directory?")
        out.extend(_read_profiles(path, namespace))
    if not out:
        raise AdviseError("the inputs hold no stage profiles: give the profiles or EMF files of a finished run")
    return out


def _read_profiles(path: Path, namespace: str) -> list[StageProfile]:
    """One input's profiles; a damaged file is an AdviseError naming the file and line."""
    try:
        if path.is_dir():
            # The advisor reads a few per-stage figures only (100,000 children's timelines would not fit): the
            # read workers send back those alone.
            read = runfiles.read_run_profiles(path, timeline=False, fields=ADVISOR_FIELDS, namespace=namespace)
            if not read.profiles and read.from_emf and (found := namespaces_in(runfiles.emf_files(path))):
                raise AdviseError(no_stage_documents(str(path / runfiles.EMF), namespace, found))
            return [profile for profile, _ in read.profiles]
        if path.suffix == ".jsonl":
            return list(runfiles.read_profiles(path, timeline=False))
        docs = runfiles.read_emf_documents(path)
    except runfiles.DamagedFileError:
        raise  # bad input, as the report says too (the CLI's exit 65)
    except ValueError as exc:  # bytes that are not UTF-8
        raise AdviseError(str(exc)) from None
    profiles = profiles_from_emf(docs, str(path), namespace)
    if not profiles and docs:
        raise AdviseError(no_stage_documents(str(path), namespace, stage_namespaces(docs)))
    return profiles
