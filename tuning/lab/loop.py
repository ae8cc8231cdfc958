"""The closed loop in the lab: profile -> advice -> applied -> the predicted download time against the measured.

`run_advise_loop` runs the batch on the lab volume under the kernel's default write cache, gives its
profiles to the advisor (tuning.advise) as one instance of the lab's shape, applies the advised cache and
runs the batch again (with any other settings asked for in between). For every run the advisor's
simulator (tuning.simulator) predicts the median child's download stage from the first run's workload,
and the lab measures it. The volume's limit comes from the lab device (tuning.lab.fusedev: two fixed
rates and its own credit count), which the simulator does not drive: the agreement is a check, not an
echo.

The first run's own prediction is partly in-sample: the workload's floor (the stage's duration minus its
io stall) comes from that run. The other runs are predicted before they run. With `rounds` > 1 every setting
runs that many times, round-robin (drift on the machine falls on all settings alike); the advice stays the
one from the very first run, as a user's would, and each setting's measured time is the median of its runs,
shown with their spread: on stages of a few seconds the spread between runs of the same settings is of the
order of the error being judged.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from profiling.metrics import StageProfile, median
from tuning.advise import Advice, advise, range_ends, shows_range
from tuning.ebs import GIB, MIB, Volume
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab.compare import ComparePlan
from tuning.lab.config import LabConfig
from tuning.lab.credits import read_host_sample
from tuning.lab.volume import Lab
from tuning.plan import AdviseError, Plan, Workload
from tuning.simulator import simulate
from tuning.writecache import WriteCache

# Runs one batch on the lab volume: (run number, setting name, scratch directory on the volume) -> the
# profiles of its children. It raises when the batch fails.
RunProfiles = Callable[[int, str, Path], list[StageProfile]]
DEFAULT = "default"
ADVISED = "advised"
# The agreement the loop is held to: prediction within this share of the measured time.
AGREEMENT = 0.25


def in_range(measured: float, low: float, high: float) -> bool:
    """Whether a measured time is inside a predicted range, each end widened by AGREEMENT."""
    return low * (1 - AGREEMENT) <= measured <= high * (1 + AGREEMENT)


@dataclass(frozen=True)
class LoopRun:
    """One run of the loop: its write cache, the predicted and the measured download of the median child."""

    setting: str
    sysctls: dict[str, str]
    other_dirty_bytes: int  # dirty + writeback pages of the host's other devices when the run started (shown)
    predicted_s: float
    measured_each: tuple[float, ...]  # per round, the median child's download; empty when none was profiled
    # Credits at the start of its first round. With the bucket not held empty, later rounds start with what
    # the rounds before left, while the prediction assumes the first round's start: compare at baseline.
    credits_gib: float
    # The optimistic bound: the same run with the kernel's pacing controller not yet settled (WriteCache); equal
    # to predicted_s when no writer is paced.
    predicted_low_s: float | None = None
    # The pessimistic bound: writers held at the freerun point (WriteCache.held).
    predicted_high_s: float | None = None

    @property
    def measured_s(self) -> float | None:
        """The median over rounds of the median child's download; None when no round profiled one."""
        return median(list(self.measured_each)) if self.measured_each else None

    @property
    def spread(self) -> tuple[float, float] | None:
        """The fastest and slowest round, when there were two or more."""
        each = self.measured_each
        return (min(each), max(each)) if len(each) > 1 else None

    @property
    def error(self) -> float | None:
        """(predicted - measured) / measured."""
        if self.measured_s is None or self.measured_s <= 0:
            return None
        return (self.predicted_s - self.measured_s) / self.measured_s

    @property
    def agrees(self) -> bool:
        """Within AGREEMENT of the prediction (the settled controller's)."""
        return self.error is not None and abs(self.error) <= AGREEMENT

    @property
    def within_range(self) -> bool:
        """Inside the predicted range (unsettled controller to writers held at freerun), each end widened by
        AGREEMENT."""
        return self.measured_s is not None and in_range(
            self.measured_s, *range_ends(self.predicted_low_s, self.predicted_s, self.predicted_high_s))

    @property
    def has_range(self) -> bool:
        """Whether the two ends differ enough to show (writers paced past the freerun point)."""
        return shows_range(self.predicted_low_s, self.predicted_s, self.predicted_high_s)


@dataclass(frozen=True)
class LoopResult:
    volume: str
    baseline_only: bool
    memory_gib: float
    plan: ComparePlan
    advice: Advice
    runs: tuple[LoopRun, ...]

    def run(self, setting: str) -> LoopRun | None:
        return next((r for r in self.runs if r.setting == setting), None)

    def speedup(self, measured: bool) -> float | None:
        """Default over advised download time, measured or predicted."""
        first, last = self.run(DEFAULT), self.run(ADVISED)
        if first is None or last is None:
            return None
        a, b = (first.measured_s, last.measured_s) if measured else (first.predicted_s, last.predicted_s)
        return None if a is None or b is None or b <= 0 else a / b


def lab_plan(plan: ComparePlan, volume: Volume) -> Plan:
    """The advisor's plan for the lab: one instance running `workers` children at once, this one batch a day,
    on the lab's volume (which the findings judge)."""
    return Plan(jobs_per_instance=min(plan.workers, plan.children), memory_gib=plan.memory_gib,
                jobs_per_day=plan.children, kernel_release=os.uname().release, current_volume=volume)


def cache_of(sysctls: dict[str, str], other_dirty_bytes: int = 0) -> WriteCache:
    """The write cache the kernel applies for the lab's bytes-form sysctls."""
    return WriteCache(int(sysctls.get("vm.dirty_bytes", 0)), int(sysctls.get("vm.dirty_background_bytes", 0)),
                      other_dirty_bytes)


def predict_download(workload: Workload, plan: ComparePlan, config: LabConfig, cache: WriteCache) -> float:
    """The median child's download stage for the lab's batch: rounds of `workers` children back to back on
    the lab volume, at baseline when its bucket is held empty, else from its initial credits."""
    children = plan.children
    at_once = min(plan.workers, children)
    rounds = -(-children // at_once)
    initial = config.initial_credits / config.time_scale
    sim = simulate(config.volume, workload.stages, concurrency=at_once, waves=rounds, cache=cache,
                   initial_credits=initial, baseline_only=config.hold_empty, sample_every_s=None)
    # Each round stands for the children it ran; the last round may run fewer.
    per_child: list[float] = []
    for index, wave in enumerate(sim.waves):
        count = min(at_once, children - index * at_once)
        per_child.extend([wave.stage_s.get("download", 0.0)] * count)
    return median(per_child)


def measured_download(profiles: Sequence[StageProfile]) -> float | None:
    durations = [p.duration_s for p in profiles if p.stage == "download" and p.outcome == "ok"]
    return median(durations) if durations else None


def other_dirty_now() -> int:
    """Dirty + writeback pages on the host now; right after the lab's drain, none are the lab volume's."""
    sample = read_host_sample(time.monotonic())
    return sample.dirty_bytes + sample.writeback_bytes


def run_advise_loop(config: LabConfig, plan: ComparePlan, run_profiles: RunProfiles, *,
                    also: Sequence[tuple[str, HostTuning]] = (), say: Callable[[str], None] = print,
                    open_lab: Callable[..., Lab] = Lab, other_dirty: Callable[[], int] = other_dirty_now) -> LoopResult:
    """Build the lab volume; run the batch under the kernel's defaults; advise from its profiles; run it under
    each of `also` and then under the advised cache. LabError and LabInterrupted come through, after the lab
    has restored everything; an advisor that cannot use the first run's profiles is an AdviseError."""
    runs: dict[str, LoopRun] = {}
    advice: Advice | None = None
    settings: list[tuple[str, HostTuning | None]] = [(DEFAULT, KERNEL_DEFAULTS), *also, (ADVISED, None)]
    with open_lab(config, say=say) as lab:
        rounds = [setting for _ in range(plan.rounds) for setting in settings]
        for number, (name, tuning) in enumerate(rounds, 1):
            if tuning is None:
                assert advice is not None
                tuning = advice.cache.tuning
            lab.drain()
            sysctls = lab.apply_cache(tuning, plan.memory_bytes)
            others = other_dirty()
            credits = lab.credits_gib
            scratch = lab.mount / f"run-{number}"
            scratch.mkdir()
            profiles = run_profiles(number, name, scratch)
            lab.check()
            if advice is None:
                advice = advise(profiles, lab_plan(plan, config.volume))
            measured = measured_download(profiles)
            if name not in runs:
                # Others' dirty pages are shown, not modelled: the host's other devices are fast and flush them
                # once the global count passes the background limit (measured: BENCHMARKS.md).
                cache = cache_of(sysctls)
                predicted = predict_download(advice.workload, plan, config, cache)
                low = predict_download(advice.workload, plan, config, cache.unsettled())
                high = predict_download(advice.workload, plan, config, cache.held())
                runs[name] = LoopRun(name, sysctls, others, predicted, (), credits, low, high)
            run = runs[name]
            if measured is not None:
                runs[name] = run = dataclasses.replace(run, measured_each=(*run.measured_each, measured))
            say(f"lab: run {number} ({name}, {', '.join(f'{k}={v}' for k, v in sysctls.items())}): download "
                f"predicted {predicted_cell(run)} s, measured {_seconds(measured)}")
    if advice is None:
        raise AdviseError("the loop made no runs")
    return LoopResult(config.volume.label, config.hold_empty, plan.memory_gib, plan, advice, tuple(runs.values()))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def predicted_cell(run: LoopRun) -> str:
    """'2.7'; with a range (writers paced past the freerun point) '2.7 (0.6-3.9)': a controller not yet settled to
    one that holds writers at the freerun point."""
    text = f"{run.predicted_s:.1f}"
    if not run.has_range:
        return text
    low, high = range_ends(run.predicted_low_s, run.predicted_s, run.predicted_high_s)
    return f"{text} ({low:.1f}-{high:.1f})"


def measured_cell(run: LoopRun) -> str:
    """'12.8'; over several rounds '12.8 (11.9-14.0, 3 runs)', counting the runs that profiled a download;
    '-' when none did."""
    if run.measured_s is None:
        return "-"
    spread = run.spread
    return f"{run.measured_s:.1f}" + ("" if spread is None else
                                      f" ({spread[0]:.1f}-{spread[1]:.1f}, {len(run.measured_each)} runs)")


def render_loop(result: LoopResult) -> str:
    """The advice and, per run, the predicted and measured download stage side by side."""
    state = "at baseline (bucket held empty)" if result.baseline_only else "with its credits (burst)"
    plan = result.plan
    cache = result.advice.cache
    lines = [f"closed loop: {result.volume} {state}, {result.memory_gib:g} GiB of memory emulated, "
             f"{min(plan.workers, plan.children)} children at once, {plan.children} children of "
             f"{plan.images_per_child} x ~{plan.image_mib:g} MiB",
             f"advice from run 1's profiles: vm.dirty_bytes={cache.tuning.dirty_bytes} "
             f"({(cache.tuning.dirty_bytes or 0) / GIB:.2f} GiB), vm.dirty_background_bytes="
             f"{cache.tuning.dirty_background_bytes}; burst {cache.burst_bytes / MIB:,.0f} MiB, "
             f"{'fits' if cache.fits else 'does not fit'} the {cache.budget_bytes / GIB:.2f} GiB budget",
             f"deploy: cdk deploy {result.advice.cdk_args}", ""]
    rounds = plan.rounds
    measured_header = "measured s" if rounds == 1 else "measured s (median, range)"
    header = ["setting", "dirty MiB (limit/bg)", "others' dirty MiB", "predicted s (range)", measured_header, "error"]
    rows = []
    for run in result.runs:
        limit = int(run.sysctls.get("vm.dirty_bytes", 0)) / MIB
        background = int(run.sysctls.get("vm.dirty_background_bytes", 0)) / MIB
        error = "-" if run.error is None else f"{run.error:+.0%}" + (
            "" if run.agrees else " (in the range)" if run.within_range else " (outside 25%)")
        rows.append([run.setting, f"{limit:,.0f}/{background:,.0f}", f"{run.other_dirty_bytes / MIB:,.0f}",
                     predicted_cell(run), measured_cell(run), error])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    lines.extend("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows)
    measured, predicted = result.speedup(True), result.speedup(False)
    if measured is not None and predicted is not None:
        lines.append(f"\ndownload stage, median child: default / advised = {measured:.2f}x measured, "
                     f"{predicted:.2f}x predicted")
    return "\n".join(lines)
