"""What bounds each stage: the first thing to say about it, before any device or price. Pure.

A stage is judged on its median child, from what the profiler measured of it:

- "too short to judge" under SHORT_STAGE_S: a stage that short is mostly start-up and the profiler's own
  boundary, so no resource can be blamed;
- "write cache" when its writers were paused by the kernel's dirty limit (eBPF's balance_dirty_pages time)
  for at least WRITE_CACHE_SHARE of the stage;
- "I/O" when PSI io 'some' (host-wide: any task of the host waiting on I/O) covers at least IO_SHARE of it;
- otherwise "network" for a transfer stage (download, upload: what it waits on is the far end) and "CPU" for
  any other stage (it neither waits on I/O nor moves data over a network);
- "not measured" when the host has no PSI (the io stall is absent): nothing to judge by.

PSI io stall is host-wide, so on a host shared by several children a stage can look I/O-bound because of
another child's writeback: the evidence says so (`shared_by`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from profiling.metrics import StageProfile, median, stage_order

SHORT_STAGE_S = 1.0
IO_SHARE = 0.5
WRITE_CACHE_SHARE = 0.2
TRANSFER_STAGES = ("download", "upload")
CPU, IO, NETWORK, WRITE_CACHE, TOO_SHORT, UNKNOWN = "CPU", "I/O", "network", "write cache", "too short to judge", \
    "not measured"


@dataclass(frozen=True)
class StageBound:
    """One stage's median child: how long it took, what bounds it, and the figures that say so."""

    stage: str
    children: int
    duration_s: float
    bound: str  # one of CPU, IO, NETWORK, WRITE_CACHE, TOO_SHORT, UNKNOWN
    evidence: str
    io_stall_share: float | None = None

    @property
    def judged(self) -> bool:
        """Whether anything can be said about the stage (long enough, and measured)."""
        return self.bound not in (TOO_SHORT, UNKNOWN)


def _share(values: Sequence[float], duration: float) -> float | None:
    return median(list(values)) / duration if values and duration > 0 else None


def stage_bound(stage: str, profiles: Sequence[StageProfile]) -> StageBound | None:
    """What bounds `stage`, from its finished profiles; None when none finished."""
    rows = [p for p in profiles if p.stage == stage and p.outcome == "ok"]
    if not rows:
        return None
    duration = median([p.duration_s for p in rows])
    stall = _share([p.io_stall_some_ms / 1000 for p in rows if p.io_stall_some_ms is not None], duration)
    paused = _share([p.dirty_throttle_ms / 1000 for p in rows if p.dirty_throttle_ms is not None], duration)
    sharers = max((p.device_sharers or 1 for p in rows), default=1)
    scope = f"; host-wide, {sharers} children at once" if sharers > 1 else "; host-wide"
    stall_text = "" if stall is None else f"io stall {stall:.0%} of it{scope}"
    if duration < SHORT_STAGE_S:
        return StageBound(stage, len(rows), duration, TOO_SHORT,
                          f"{duration:.2f} s: under {SHORT_STAGE_S:g} s, mostly start-up and the profiler's "
                          "own stage boundary", stall)
    if paused is not None and paused >= WRITE_CACHE_SHARE:
        return StageBound(stage, len(rows), duration, WRITE_CACHE,
                          f"writers paused by the dirty limit {paused:.0%} of it", stall)
    if stall is None:
        return StageBound(stage, len(rows), duration, UNKNOWN, "no PSI io stall on this host", None)
    if stall >= IO_SHARE:
        return StageBound(stage, len(rows), duration, IO, stall_text, stall)
    if stage.split("/")[0] in TRANSFER_STAGES:
        return StageBound(stage, len(rows), duration, NETWORK,
                          f"{stall_text}: the rest is the far end and the transfer itself", stall)
    return StageBound(stage, len(rows), duration, CPU, f"{stall_text}: storage settings will not shorten it",
                      stall)


def stage_bounds(profiles: Iterable[StageProfile]) -> list[StageBound]:
    """Every stage's StageBound, in pipeline order (stages with no finished child left out)."""
    rows = list(profiles)
    found = (stage_bound(stage, rows) for stage in stage_order(p.stage for p in rows))
    return [b for b in found if b is not None]


def outside_stages_s(profiles: Iterable[StageProfile], elapsed_s: Mapping[str, float]) -> float | None:
    """The median child's time in no stage, from its whole time (`elapsed_s`, by ArrayIndex: the local
    executor's run.json) less its top-level stages: start-up, the markers and the profiler's boundaries.
    None when no child has both."""
    spent: dict[str, float] = {}
    for p in profiles:
        if "/" not in p.stage:
            key = p.properties.get("ArrayIndex") or ""
            spent[key] = spent.get(key, 0.0) + p.duration_s
    gaps = [max(0.0, float(elapsed_s[k]) - v) for k, v in spent.items()
            if isinstance(elapsed_s.get(k), int | float)]
    return median(gaps) if gaps else None


def between_stages_s(profiles: Iterable[StageProfile]) -> float | None:
    """The median child's time in no stage: from its first stage's start to its last stage's end, less its
    top-level stages (sub-stages `process/x` lie inside their stage). The profiler's own work at each
    boundary, and the job's between stages. None without two stages of one child."""
    spans: dict[str, list[StageProfile]] = {}
    for p in profiles:
        if "/" in p.stage:
            continue
        key = p.properties.get("ArrayIndex") or p.properties.get("JobId") or ""
        spans.setdefault(key, []).append(p)
    gaps = []
    for stages in spans.values():
        if len(stages) < 2:
            continue
        start = min(p.started_at for p in stages)
        end = max(p.started_at + p.duration_s for p in stages)
        gaps.append(max(0.0, end - start - sum(p.duration_s for p in stages)))
    return median(gaps) if gaps else None
