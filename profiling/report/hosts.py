"""A batch's hosts ranked by the qualification of their scratch at boot (profiling.qualification), beside what their
children's device figures said later (pure).

A child's device figure here is what the scratch device moved while busy in one of its stages: (device read + write
bytes) / (the stage's duration x DeviceUtilization), over stages that kept it busy at least MIN_UTIL_PCT and moved
MIN_DEVICE_BYTES (a stage that barely used the device says nothing of its capability). A host's is the median over
its children's stages. These are device figures, shared by the children on the device: never summed.

A host that qualified (not slow) is named degraded when that figure fell below DEGRADED_SHARE of what it qualified
at, against the fleet: relative to the median host's children / qualification when three or more hosts have both
(workloads of small random I/O move fewer MiB/s on every host), else to 1.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from profiling.metrics import median
from profiling.qualification import Qualification, read_qualification
from profiling.report.fleet import Fleet

MIN_UTIL_PCT = 20.0
MIN_DEVICE_BYTES = 16 << 20
DEGRADED_SHARE = 1 / 3
FLEET_REFERENCE_HOSTS = 3
MAX_HOST_ROWS = 50


@dataclass(frozen=True)
class HostRow:
    """One host: its qualification, and its children's device MiB/s while busy (None: no stage showed it)."""

    instance: str
    qualification: Qualification | None
    children_mibps: float | None
    stages: int
    degraded: bool = False

    @property
    def slow(self) -> bool:
        return self.qualification is not None and self.qualification.slow

    @property
    def share(self) -> float | None:
        """Its children's device figure / what it qualified at."""
        q = self.qualification
        if q is None or self.children_mibps is None or q.mibps <= 0:
            return None
        return self.children_mibps / q.mibps

    def describe(self) -> str:
        said = self.qualification.describe() if self.qualification else "no qualification"
        if self.children_mibps is None:
            return said
        return f"{said}; its children's device {self.children_mibps:.1f} MiB/s while busy"


def _children_mibps(fleet: Fleet) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {}
    for rows in fleet.stages.values():
        read, written = rows.column("DeviceReadBytes"), rows.column("DeviceWriteBytes")
        util, took = rows.column("DeviceUtilization"), rows.column("duration")
        for n, instance in enumerate(rows.instance):
            moved = (0.0 if math.isnan(read[n]) else read[n]) + (0.0 if math.isnan(written[n]) else written[n])
            if (instance is None or rows.outcome[n] != "ok" or math.isnan(util[n]) or util[n] < MIN_UTIL_PCT
                    or moved < MIN_DEVICE_BYTES or took[n] <= 0):
                continue
            found.setdefault(instance, []).append(moved / 2**20 / (took[n] * util[n] / 100))
    return found


def host_rows(fleet: Fleet) -> list[HostRow]:
    """Every host that qualified or ran a child with device figures: slow ones first (lowest ratio first), then the
    degraded (lowest share first), then the rest by ratio."""
    busy = _children_mibps(fleet)
    rows = [HostRow(i, read_qualification(fleet.qualifications.get(i, {})),
                    median(busy[i]) if busy.get(i) else None, len(busy.get(i, [])))
            for i in sorted(set(fleet.qualifications) | set(busy))]
    shares = [s for r in rows if (s := r.share) is not None and not r.slow]
    reference = median(shares) if len(shares) >= FLEET_REFERENCE_HOSTS else 1.0
    rows = [HostRow(r.instance, r.qualification, r.children_mibps, r.stages,
                    not r.slow and r.share is not None and r.share < DEGRADED_SHARE * reference) for r in rows]

    def rank(row: HostRow) -> tuple[int, float]:
        ratio = row.qualification.ratio if row.qualification and row.qualification.ratio is not None else math.inf
        return (0, ratio) if row.slow else (1, row.share or 0.0) if row.degraded else (2, ratio)

    return sorted(rows, key=rank)


def hosts_table(rows: Sequence[HostRow]) -> str:
    """The hosts, ranked, as the report's table (empty when no host qualified)."""
    if not any(r.qualification for r in rows):
        return ""
    e = html.escape
    body = []
    for r in rows[:MAX_HOST_ROWS]:
        q = r.qualification
        state = "slow" if r.slow else "degraded" if r.degraded else (q.verdict if q else "-")
        cells = [e(r.instance), e(state), "-" if q is None or q.ratio is None else f"{q.ratio:.2f}x",
                 "-" if q is None else f"{q.mibps:.1f}", "-" if q is None or not q.expected_mibps else
                 f"{q.expected_mibps:.1f}", "-" if r.children_mibps is None else f"{r.children_mibps:.1f}",
                 str(r.stages)]
        flag = " class=bad" if r.slow or r.degraded else ""
        body.append(f"<tr{flag} data-host='{e(r.instance)}'>" + "".join(
            f"<td{' class=l' if n < 2 else ''}>{c}</td>" for n, c in enumerate(cells)) + "</tr>")
    head = ("<tr><th class=l>host</th><th class=l>state</th><th>qualified</th><th>MiB/s at boot</th>"
            "<th>expected MiB/s</th><th>children's device MiB/s busy</th><th>stages</th></tr>")
    return (f"<h3>Hosts by qualification</h3><table id=hosts-table>{head}{''.join(body)}</table>"
            f"<p class=note>Each host measured its scratch before it took jobs (sequential O_DIRECT at 1 MiB against "
            f"the volume model); its children's device figures are MiB/s while the device was busy, over stages that "
            f"kept it busy {MIN_UTIL_PCT:.0f} % or more. Degraded: qualified well, but its children's devices later "
            f"did less than {DEGRADED_SHARE:.2f} of it against the fleet.</p>")
