"""Bad apples: the children and instances whose throughput in a stage holds a batch back (pure)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from profiling.metrics import median
from profiling.outliers import DEFAULT_MIN_RELATIVE, DEFAULT_THRESHOLD, Outlier, find_outliers, find_slow
from profiling.report.hosts import HostRow, host_rows
from profiling.report.sources import ReportData

# A child (or instance) flagged slow must also have lost this long against the median it is judged by: its stage's
# duration x (1 - its throughput / that median). Stages of a fraction of a second (a demo's 1 MiB downloads, s5cmd's
# start-up included) vary 2-3x between children on a loaded machine, and a child that lost 0.3 s holds no batch back.
MIN_LOST_S = 0.5
QUALIFICATION = "qualification"  # the bad apples' stage of a host named by its qualification


@dataclass(frozen=True)
class BadApple:
    """A child or instance whose throughput in one stage is an outlier against the rest; or a host whose scratch
    qualified slow at boot, or degraded later (stage QUALIFICATION, its outlier against what it should have done)."""

    stage: str
    scope: str  # "child", "instance" or "host"
    name: str
    outlier: Outlier
    detail: str = ""


def find_bad_apples(
    data: ReportData, *, threshold: float = DEFAULT_THRESHOLD, min_relative: float = DEFAULT_MIN_RELATIVE
) -> list[BadApple]:
    """Per stage: children, then instances, whose throughput is a robust outlier on the slow side
    (profiling.outliers), by at least `min_relative` of the stage's median.

    A child is also compared with its contemporaries, the children whose same stage overlapped it in time
    (profiling.outliers.find_slow): it must be slower than their median by the same margin.

    Either must also have lost MIN_LOST_S or more against that median (an instance: its children's median
    duration). Only stages that finished ("ok") count: a failed stage's throughput says nothing about the
    machine. An instance's value is the median over the children it ran; instances need three or more to
    compare, and are only compared when some ran more than one child.

    Before all of them: the hosts whose scratch qualified slow at boot, then those degraded since (host_apples).
    """
    found: list[BadApple] = host_apples(host_rows(data.fleet))  # slow and degraded hosts before anything else
    fleet = data.fleet
    for stage in fleet.stage_names():
        rows = fleet.stages[stage]
        by_child: dict[str, float] = {}
        took: dict[str, float] = {}
        spans: dict[str, tuple[float, float]] = {}
        instance_of: dict[str, str] = {}
        for n, (child, outcome, tput) in enumerate(zip(rows.children, rows.outcome, rows.throughput, strict=True)):
            if outcome != "ok" or not tput or tput != tput:  # tput != tput: NaN, no throughput
                continue
            by_child[child], took[child] = tput, rows.duration[n]
            spans[child] = (rows.started[n], rows.started[n] + rows.duration[n])
            if (instance := rows.instance[n]) is not None:
                instance_of[child] = instance
        # Only the slow side: a child faster than the rest holds nobody back.
        for o in find_slow(by_child, spans, threshold=threshold, min_relative=min_relative):
            if _lost_s(o, took[o.key]) < MIN_LOST_S:
                continue
            detail = f"instance {instance_of[o.key]}" if o.key in instance_of else ""
            found.append(BadApple(stage, "child", o.key, o, detail))
        per_instance: dict[str, list[float]] = {}
        durations: dict[str, list[float]] = {}
        for child, tput in by_child.items():
            if child in instance_of:
                per_instance.setdefault(instance_of[child], []).append(tput)
                durations.setdefault(instance_of[child], []).append(took[child])
        if len(per_instance) == len(by_child):
            continue  # one child per instance: the child rows already name the instance
        instance_values = {i: median(v) for i, v in per_instance.items()}
        for o in find_outliers(instance_values, threshold=threshold, min_relative=min_relative, low_only=True):
            if _lost_s(o, median(durations[o.key])) < MIN_LOST_S:
                continue
            found.append(BadApple(stage, "instance", o.key, o, f"{len(per_instance[o.key])} children"))
    return found


def host_apples(rows: list[HostRow]) -> list[BadApple]:
    """The slow hosts (measured against the model's figure) and the degraded ones (their children's device figure
    against what they qualified at), in the rows' order (profiling.report.hosts)."""
    out = []
    for row in rows:
        q = row.qualification
        if q is not None and row.slow:
            out.append(BadApple(QUALIFICATION, "host", row.instance,
                                Outlier(row.instance, q.mibps, q.expected_mibps or q.mibps, -math.inf), row.describe()))
        elif q is not None and row.degraded and row.children_mibps is not None:
            out.append(BadApple(QUALIFICATION, "host", row.instance,
                                Outlier(row.instance, row.children_mibps, q.mibps, -math.inf),
                                "degraded: " + row.describe()))
    return out


def _lost_s(o: Outlier, duration_s: float) -> float:
    """What a stage of `duration_s` at the outlier's throughput lost against the median it was judged by."""
    return duration_s * (1 - o.value / o.median) if o.median > 0 else 0.0
