"""What a finding is (Finding, its JSON shape) and what the findings are judged on (Situation). Pure.

tuning.findings holds the checks and their grading; tuning.dirtypause the dirty-limit check. See tuning.findings
for what a user can believe of a finding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from profiling.metrics import StageProfile, median
from profiling.profilefields import ProfileFields
from tuning.cachedomain import Domains
from tuning.ebs import Volume
from tuning.host import HostTuning
from tuning.plan import Plan, Workload

DAYS_PER_MONTH = 30
SEVERITIES = ("high", "medium", "low", "info")
# Every field of a stage profile the advice is made of (tuning.plan's workload, the findings, tuning.dirtypause): a
# run's read workers send back these alone (profiling.profilefields). Another field a check reads must be added here;
# tests/unit/test_advise_reduced.py fails when one left out changes the advice.
ADVISOR_FIELDS = ProfileFields((
    "stage", "outcome", "started_at", "duration_s", "read_bytes", "write_bytes", "storage_read_bytes",
    "storage_write_bytes", "device_read_ops", "device_write_ops", "device_read_bytes", "device_write_bytes",
    "device_queue_depth", "device_utilization_pct", "device_sharers", "device_random_pct", "own_io_stall_ms",
    "own_peak_dirty_bytes", "own_peak_writeback_bytes", "own_dirty_threshold_bytes",
    "own_dirty_background_threshold_bytes", "peak_dirty_bytes", "dirty_threshold_bytes",
    "dirty_background_threshold_bytes", "io_stall_some_ms", "dirty_throttle_ms", "calls", "properties"))


@dataclass(frozen=True)
class Finding:
    """One named finding; `to_dict()` is the JSON shape the report renders."""

    code: str
    severity: str  # one of SEVERITIES
    title: str
    evidence: str
    fix: str
    cost_s_per_child: float | None
    cost_usd_per_month: float | None
    context: dict[str, str] = field(default_factory=dict)
    stage: str | None = None  # the stage it is about, when one
    what_if: str | None = None  # the modelled volume (e.g. "st1 500 GiB") when the run did not run on it

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code, "severity": self.severity, "title": self.title, "evidence": self.evidence,
            "fix": self.fix,
            "cost_s_per_child": None if self.cost_s_per_child is None else round(self.cost_s_per_child, 1),
            "cost_usd_per_month": None if self.cost_usd_per_month is None else round(self.cost_usd_per_month, 2),
            "context": dict(self.context), "stage": self.stage, "what_if": self.what_if,
        }


@dataclass(frozen=True)
class Situation:
    """What the findings are judged on: the plan, the profiles and the advisor's results."""

    plan: Plan
    profiles: Sequence[StageProfile]
    workload: Workload
    volume: Volume  # the stack's scratch volume now
    tuning: HostTuning  # the stack's write-cache settings now
    current_download_s: float  # the stack's volume and cache, first round of the day (simulated)
    current_steady_download_s: float  # the same, late in the day
    current_credits_run_out_h: float | None
    tuned_download_s: float  # the stack's volume with the advised cache
    advised_tuning: HostTuning
    recommended: Volume
    # The write caches a child meets under the stack's settings now (host and container); None: not modelled.
    current_domains: Domains | None = None
    # of_stage's answers: the findings ask for each stage's profiles about 20 times (300,000 profiles at fleet size).
    _of_stage: dict[str, list[StageProfile]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def usd_per_month(self, cost_s_per_child: float | None) -> float | None:
        """Instance dollars per month (per instance) that `cost_s_per_child` seconds per child cost."""
        if cost_s_per_child is None:
            return None
        rounds = self.plan.jobs_per_day / self.plan.jobs_per_instance
        return cost_s_per_child * rounds * DAYS_PER_MONTH * self.plan.instance_usd_per_hour / 3600

    def of_stage(self, stage: str) -> list[StageProfile]:
        """The stage's successful profiles (a new list each call)."""
        if not self._of_stage:
            for p in self.profiles:
                if p.outcome == "ok":
                    self._of_stage.setdefault(p.stage, []).append(p)
        return list(self._of_stage.get(stage, ()))

    @property
    def what_if(self) -> str | None:
        """The stack's volume when the profiles say they ran on another type (e.g. VolumeType `local`), else None."""
        measured = {p.properties.get("VolumeType") for p in self.profiles} - {None, ""}
        # Profiles that do not say (older ones) are taken as run on the stack's volume, as before.
        return None if not measured or measured == {self.volume.kind} else self.volume.label

    def sharers(self, stage: str) -> int:
        """The most children profiled on the scratch device at once during `stage` (1 when not known)."""
        return max((p.device_sharers or 1 for p in self.of_stage(stage)), default=1)

    def child_s(self) -> float:
        """The median child's time in its top-level stages."""
        per_child: dict[str, float] = {}
        for p in self.profiles:
            if p.outcome == "ok" and "/" not in p.stage:
                key = p.properties.get("ArrayIndex") or p.properties.get("JobId") or ""
                per_child[key] = per_child.get(key, 0.0) + p.duration_s
        return median(list(per_child.values())) if per_child else 0.0


def values_of(profiles: Sequence[StageProfile], get: Callable[[StageProfile], float | None]) -> list[float]:
    return [v for v in (get(p) for p in profiles) if v is not None]


def make_finding(s: Situation, code: str, severity: str, title: str, evidence: str, fix: str,
             cost: float | None, context: dict[str, str] | None = None, *, stage: str | None = None,
             modelled: bool = False) -> Finding:
    """A finding; `modelled` when it judges the stack's volume by its model rather than by what was measured:
    a what-if when the run did not run on that volume type."""
    what_if = s.what_if if modelled else None
    if what_if:
        title = f"if this ran on {what_if}: {title[0].lower()}{title[1:]}"
    return Finding(code, severity, title, evidence, fix, cost, s.usd_per_month(cost), context or {}, stage, what_if)


def shared_note(s: Situation, stage: str) -> str:
    """The scope of a device figure: '' when the child had the device to itself."""
    n = s.sharers(stage)
    return f" (device-wide: {n} children shared the scratch disk, their writeback included)" if n > 1 else ""
