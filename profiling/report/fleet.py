"""A batch's stage profiles as columns, filled one profile at a time: what a report of any size keeps.

A report of 100,000 children cannot hold 300,000 StageProfile objects with their timelines. `Fleet` keeps,
per stage, one row per child in flat columns (every metric of METRICS as 8-byte floats, NaN where absent,
start, duration and throughput, the child's name parts, instance and outcome), the bytes every child's
timeline moved per second of wall time (a fleet-wide time axis), the contract rules' values per label and a
bounded number of the rows themselves. Quantiles, histograms and the activity over time are computed from
the columns when asked (numpy, O(n log n)); a child's whole profile, timeline included, is read again from
its file when the page shows it (`Fleet.profiles_of`).

Pure apart from `profiles_of`, which re-reads the run's files through profiling.runfiles.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from profiling.metrics import METRICS, METRICS_BY_NAME, StageProfile, stage_order
from profiling.qualification import QUALIFICATION_KEYS, VERDICT_KEY

# Up to this many children a report keeps every stage profile whole and draws a bar per child; above it, the
# page shows distributions across the fleet, a shared time axis and the top stragglers.
PER_CHILD_LIMIT = 64
# Contract rows kept as they are, for the page's "every row" table; the summary counts every row.
MAX_CONTRACT_ROWS = 500
NAN = float("nan")


def parent_job(properties: Mapping[str, str]) -> str | None:
    """The array job's id: AWS Batch gives each child '<parent id>:<index>' as its job id."""
    job = properties.get("JobId")
    index = properties.get("ArrayIndex")
    if job and index and job.endswith(f":{index}"):
        return job[: -len(index) - 1]
    return job


@dataclass
class StageRows:
    """One stage's children in columns; row i of every column is the same child."""

    names: list[tuple[str, str | None, str | None]] = field(default_factory=list)  # (file, job, ArrayIndex)
    source: array = field(default_factory=lambda: array("i"))  # index into Fleet.sources
    instance: list[str | None] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    started: array = field(default_factory=lambda: array("d"))
    duration: array = field(default_factory=lambda: array("d"))
    throughput: array = field(default_factory=lambda: array("d"))
    values: dict[str, array] = field(default_factory=lambda: {s.name: array("d") for s in METRICS})
    children: list[str] = field(default_factory=list)  # the names shown, set by Fleet.finish

    def __len__(self) -> int:
        return len(self.outcome)

    def column(self, name: str) -> np.ndarray:
        """A metric's values (raw units, NaN where a child has none), or 'started'/'duration'/'throughput'."""
        own = {"started": self.started, "duration": self.duration, "throughput": self.throughput}
        data = own.get(name, self.values.get(name))
        if data is None:
            raise KeyError(name)
        return np.frombuffer(data, dtype=np.float64) if len(data) else np.zeros(0)

    def ok(self) -> np.ndarray:
        """True for the rows whose stage finished."""
        return np.array([o == "ok" for o in self.outcome], dtype=bool)


@dataclass
class ContractGroup:
    """Every row one contract rule (label) gave in one stage: its values, unit, sources, and a note."""

    count: int = 0
    values: list[float] = field(default_factory=list)
    unit: str = ""
    sources: set[str] = field(default_factory=set)
    first_note: str = ""


class Fleet:
    """The per-stage columns of a batch, added one profile at a time (see the module docstring)."""

    def __init__(self) -> None:
        self.stages: dict[str, StageRows] = {}
        self.sources: list[Path | None] = []
        self._source_ids: dict[Path | None, int] = {}
        self.jobs: set[str | None] = set()
        # Bytes each child's timeline moved, per whole second of wall time: [read, written]. Summed first per
        # chunk of profiles (`_chunk`, see end_chunk), then chunk by chunk in order: the same sums, to the last
        # bit, whether the chunks were read here or in worker processes and merged (extend).
        self.traffic: dict[int, list[float]] = {}
        self._chunk: dict[int, list[float]] = {}
        self.timeline_points = 0
        self.contract_groups: dict[tuple[str, str], ContractGroup] = {}
        self.contract_rows: list[tuple[int, str, int, Mapping[str, Any]]] = []  # (stage row, stage, #, row)
        self.contract_total = 0
        self.profiles = 0
        self._finished = False
        # Each host's qualification properties, as its children's profiles carry them (profiling.qualification).
        self.qualifications: dict[str, dict[str, str]] = {}

    # ---- filling -------------------------------------------------------------------------------------

    def add(self, profile: StageProfile, name: str, source: Path | None = None,
            points: Sequence[Mapping[str, Any]] | None = None) -> None:
        """One stage of one child: `name` is shown when the profile has no ArrayIndex (its file's name);
        `source` is the file it came from, read again for its timeline. `points` are its timeline's points as
        read (profiling.runfiles.profile_and_points), when the profile was built without them."""
        rows = self.stages.setdefault(profile.stage, StageRows())
        props = profile.properties
        index = props.get("ArrayIndex") or None
        job = parent_job(props)
        self.jobs.add(job)
        if source not in self._source_ids:
            self._source_ids[source] = len(self.sources)
            self.sources.append(source)
        row = len(rows)
        rows.names.append((name, job, index))
        rows.source.append(self._source_ids[source])
        rows.instance.append(props.get("InstanceId") or None)
        if props.get(VERDICT_KEY) and props.get("InstanceId"):
            self.qualifications[props["InstanceId"]] = {k: v for k, v in props.items() if k in QUALIFICATION_KEYS}
        rows.outcome.append(profile.outcome)
        rows.started.append(profile.started_at)
        rows.duration.append(profile.duration_s)
        tput = profile.throughput_bps
        rows.throughput.append(NAN if tput is None else tput)
        for spec in METRICS:
            value = getattr(profile, spec.field)
            rows.values[spec.name].append(NAN if value is None else float(value))
        if points is None:
            self._add_traffic(profile.started_at, ((q.t, q.read_bps, q.write_bps) for q in profile.timeline))
        else:
            self._add_traffic(profile.started_at, ((q["t"], q.get("read_bps"), q.get("write_bps")) for q in points))
        for number, item in enumerate(profile.contract):
            if isinstance(item, Mapping):
                self._add_contract(profile.stage, row, number, item)
        self.profiles += 1

    def _add_traffic(self, started: float, points: Iterable[tuple[float, float | None, float | None]]) -> None:
        previous = 0.0
        for t, read, written in points:
            span = t - previous
            previous = t
            if span <= 0:
                continue
            self.timeline_points += 1
            cell = self._chunk.setdefault(int(started + t), [0.0, 0.0])
            cell[0] += (read or 0.0) * span
            cell[1] += (written or 0.0) * span

    def _add_contract(self, stage: str, row: int, number: int, item: Mapping[str, Any]) -> None:
        group = self.contract_groups.setdefault((stage, str(item.get("label", "-"))), ContractGroup())
        group.count += 1
        value = item.get("value")
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            group.values.append(float(value))
        group.unit = group.unit or str(item.get("unit") or "")
        group.sources.add(str(item.get("source", "-")))
        group.first_note = group.first_note or str(item.get("note") or "")
        self.contract_total += 1
        if len(self.contract_rows) < MAX_CONTRACT_ROWS:
            self.contract_rows.append((row, stage, number, dict(item)))

    def end_chunk(self) -> None:
        """Add the traffic of the profiles added since the last call to the fleet's (a reader of many files
        calls it after each chunk of them, profiling.report.sources.CHUNK_FILES)."""
        chunk, self._chunk = self._chunk, {}
        _add_cells(self.traffic, chunk)

    def extend(self, other: Fleet) -> None:
        """Append `other`'s rows after this fleet's, as if its profiles had been added here in their order
        after a call to end_chunk: columns appended per stage, its sources renumbered, traffic summed per
        second, contract groups merged and its contract rows kept (up to MAX_CONTRACT_ROWS) with their stage
        rows moved by this fleet's. Neither fleet may be finished."""
        self.end_chunk()
        other.end_chunk()
        offsets = {stage: len(rows) for stage, rows in self.stages.items()}
        ids = []
        for source in other.sources:
            if source not in self._source_ids:
                self._source_ids[source] = len(self.sources)
                self.sources.append(source)
            ids.append(self._source_ids[source])
        for stage, theirs in other.stages.items():
            rows = self.stages.setdefault(stage, StageRows())
            rows.names.extend(theirs.names)
            rows.source.extend(array("i", (ids[i] for i in theirs.source)))
            rows.instance.extend(theirs.instance)
            rows.outcome.extend(theirs.outcome)
            rows.started.extend(theirs.started)
            rows.duration.extend(theirs.duration)
            rows.throughput.extend(theirs.throughput)
            for name, values in theirs.values.items():
                rows.values[name].extend(values)
        self.jobs |= other.jobs
        self.qualifications.update(other.qualifications)
        _add_cells(self.traffic, other.traffic)
        self.timeline_points += other.timeline_points
        for key, group in other.contract_groups.items():
            mine = self.contract_groups.setdefault(key, ContractGroup())
            mine.count += group.count
            mine.values.extend(group.values)
            mine.unit = mine.unit or group.unit
            mine.sources |= group.sources
            mine.first_note = mine.first_note or group.first_note
        room = MAX_CONTRACT_ROWS - len(self.contract_rows)
        self.contract_rows.extend((row + offsets.get(stage, 0), stage, number, item)
                                  for row, stage, number, item in other.contract_rows[:max(room, 0)])
        self.contract_total += other.contract_total
        self.profiles += other.profiles

    def finish(self) -> Fleet:
        """Name the children ('child N' from ArrayIndex, 'JOB[N]' when the batch spans several jobs, else the
        name given to `add`); call once every profile is in."""
        self.end_chunk()
        several = len(self.jobs) > 1
        for rows in self.stages.values():
            rows.children = [
                name if index is None else (f"{job or '?'}[{index}]" if several else f"child {index}")
                for name, job, index in rows.names
            ]
        self._finished = True
        return self

    @classmethod
    def of(cls, profiles: Iterable[tuple[StageProfile, str]]) -> Fleet:
        fleet = cls()
        for profile, name in profiles:
            fleet.add(profile, name)
        return fleet.finish()

    # ---- reading -------------------------------------------------------------------------------------

    def stage_names(self) -> list[str]:
        return stage_order(self.stages)

    def children_added(self) -> int:
        """The children added so far (distinct file, job and ArrayIndex), before `finish` names them."""
        return len({names for rows in self.stages.values() for names in rows.names})

    def child_count(self) -> int:
        return len({c for rows in self.stages.values() for c in rows.children})

    def summary(self) -> dict[str, dict[str, float | None]]:
        """Per stage, as profiling.metrics.summarize: the children's count and each metric aggregated
        across them as its spec says (medians, totals, peaks)."""
        result: dict[str, dict[str, float | None]] = {}
        for stage in self.stage_names():
            rows = self.stages[stage]
            row: dict[str, float | None] = {"children": float(len(rows))}
            for spec in METRICS:
                column = rows.column(spec.name)
                present = column[~np.isnan(column)]
                row[spec.name] = spec.aggregate.of(present.tolist()) if present.size else None
            result[stage] = row
        return result

    def quantiles(self, stage: str, name: str, qs: Sequence[float], *, ok_only: bool = False) -> list[float] | None:
        """The `qs` quantiles (0..1, linear interpolation) of a column over the children that have a value."""
        values = self.present(stage, name, ok_only=ok_only)
        return [float(v) for v in np.quantile(values, qs)] if values.size else None

    def present(self, stage: str, name: str, *, ok_only: bool = False) -> np.ndarray:
        rows = self.stages[stage]
        column = rows.column(name)
        keep = ~np.isnan(column)
        if ok_only:
            keep &= rows.ok()
        return column[keep]

    def activity(self, buckets: int = 240) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Children in each stage over the batch's wall time: bucket starts (s since the first stage began)
        and, per stage, how many children were in it at some point of each bucket."""
        starts = [r.column("started") for r in self.stages.values() if len(r)]
        if not starts:
            return np.zeros(0), {}
        origin = min(float(s.min()) for s in starts)
        end = max(float((r.column("started") + r.column("duration")).max()) for r in self.stages.values() if len(r))
        width = max((end - origin) / buckets, 1e-3)
        edges = origin + width * np.arange(buckets)
        counts: dict[str, np.ndarray] = {}
        for stage in self.stage_names():
            rows = self.stages[stage]
            first = np.clip(((rows.column("started") - origin) // width).astype(int), 0, buckets - 1)
            last = np.clip(((rows.column("started") + rows.column("duration") - origin) // width).astype(int),
                           0, buckets - 1)
            delta = np.zeros(buckets + 1)
            np.add.at(delta, first, 1)
            np.add.at(delta, last + 1, -1)
            counts[stage] = np.cumsum(delta[:-1])
        return edges - origin, counts

    def origin(self) -> float:
        """When the batch's first stage began (seconds since the epoch); 0 for an empty fleet."""
        starts = [float(r.column("started").min()) for r in self.stages.values() if len(r)]
        return min(starts) if starts else 0.0

    def traffic_series(self, buckets: int = 240) -> tuple[list[float], list[float], list[float]] | None:
        """The bytes per second every child's own timeline moved, summed over the fleet, in at most `buckets`
        intervals: (seconds since the first stage began, read B/s, written B/s); None without timelines."""
        if not self.traffic:
            return None
        origin = self.origin()
        seconds = sorted(self.traffic)
        width = max(1, math.ceil((seconds[-1] - seconds[0] + 1) / buckets))
        merged: dict[int, list[float]] = {}
        for second in seconds:
            cell = merged.setdefault((second - seconds[0]) // width, [0.0, 0.0])
            cell[0] += self.traffic[second][0]
            cell[1] += self.traffic[second][1]
        keys = sorted(merged)
        at = [seconds[0] - origin + k * width for k in keys]
        return at, [merged[k][0] / width for k in keys], [merged[k][1] / width for k in keys]

    def slowest(self, stage: str, count: int) -> list[int]:
        """Rows of the `count` children that took longest in `stage` (finished or not), longest first."""
        durations = self.stages[stage].column("duration")
        if not durations.size:
            return []
        count = min(count, durations.size)
        top = np.argpartition(-durations, count - 1)[:count]
        return [int(i) for i in top[np.argsort(-durations[top], kind="stable")]]

    def profiles_of(self, children: set[str], read: Callable[[Path], Iterator[tuple[StageProfile, str]]]
                    ) -> list[tuple[str, StageProfile]]:
        """The whole profiles (timelines included) of the named children, read again from their files with
        `read`; children whose profiles came from no file are left out."""
        wanted: dict[int, set[str]] = {}
        for rows in self.stages.values():
            for child, source in zip(rows.children, rows.source, strict=True):
                if child in children and self.sources[source] is not None:
                    wanted.setdefault(source, set()).add(child)
        found: list[tuple[str, StageProfile]] = []
        for source, names in sorted(wanted.items()):
            path = self.sources[source]
            assert path is not None
            lone = Fleet()
            pairs = list(read(path))
            for profile, name in pairs:
                lone.add(profile, name)
            lone.jobs |= self.jobs  # the same naming as the whole fleet
            lone.finish()
            by_stage = {stage: iter(rows.children) for stage, rows in lone.stages.items()}
            for profile, _ in pairs:
                child = next(by_stage[profile.stage])
                if child in names:
                    found.append((child, profile))
        return found


def _add_cells(into: dict[int, list[float]], cells: Mapping[int, list[float]]) -> None:
    for second, (read, written) in cells.items():
        cell = into.setdefault(second, [0.0, 0.0])
        cell[0] += read
        cell[1] += written


def metric_label(name: str) -> str:
    """A column's label with its display unit, for tables and axes."""
    spec = METRICS_BY_NAME.get(name)
    if spec is None:
        return {"duration": "duration s", "throughput": "MiB/s moved", "started": "started"}[name]
    return spec.scoped_label
