"""What a report reads: a local run directory, or EMF documents from CloudWatch Logs, as ReportData.

A local run is read through profiling.runfiles (profile JSON with timelines, or its EMF files when it
kept no profiles) by profiling.report.rundir into a Reader; CloudWatch Logs give the per-stage figures of a
batch in AWS but no timelines, read by profiling.report.cloudwatch for the last DURATION or for a time range
(`parse_run_side`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiling import runfiles
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile, TimelinePoint, stage_order
from profiling.numbers import number
from profiling.report.fleet import PER_CHILD_LIMIT, Fleet


class ReportInputError(ValueError):
    """The report's input is missing or unusable; the message names the thing and the fix."""


class DamagedInputError(ReportInputError):
    """A profile or EMF file exists but a line in it does not parse (the message names file and line)."""


@dataclass(frozen=True)
class Entry:
    """One stage of one child, with the names the report shows for it."""

    child: str
    profile: StageProfile
    instance: str | None = None


@dataclass
class ReportData:
    """Everything a report shows, whatever it was read from.

    `fleet` holds every child's per-stage figures in columns (profiling.report.fleet); `entries` holds every
    stage profile whole only when the batch is small (`complete`), else none: a large batch's page is drawn
    from the columns, and the few children it shows in full are read again (`reread`).
    """

    entries: list[Entry]
    source: str
    has_timelines: bool
    run: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    fleet_columns: Fleet | None = None
    complete: bool = True
    # Reads the named children's whole profiles again (timelines included); None when nothing can be re-read.
    reread: Callable[[set[str]], list[Entry]] | None = None

    @property
    def fleet(self) -> Fleet:
        """Every child's figures in columns (built from the entries when none were given)."""
        if self.fleet_columns is None:
            self.fleet_columns = Fleet()
            for x in self.entries:
                self.fleet_columns.add(x.profile, x.child)
            self.fleet_columns.finish()
            for rows in self.fleet_columns.stages.values():  # the entries' own names stand
                rows.children = []
            for x in self.entries:
                self.fleet_columns.stages[x.profile.stage].children.append(x.child)
        return self.fleet_columns

    def stages(self) -> list[str]:
        return self.fleet.stage_names() if not self.complete else stage_order(e.profile.stage for e in self.entries)

    def of_stage(self, stage: str) -> list[Entry]:
        return [e for e in self.entries if e.profile.stage == stage]

    def children(self) -> list[str]:
        if not self.complete:
            return sorted({c for rows in self.fleet.stages.values() for c in rows.children}, key=natural_key)
        return sorted({e.child for e in self.entries}, key=natural_key)

    def child_count(self) -> int:
        return self.fleet.child_count() if not self.complete else len({e.child for e in self.entries})


def natural_key(text: str) -> tuple[Any, ...]:
    """'child 10' after 'child 9'."""
    parts: list[Any] = []
    number = ""
    word = ""
    for ch in text:
        if ch.isdigit():
            if word:
                parts.append((1, word))
                word = ""
            number += ch
        else:
            if number:
                parts.append((0, int(number)))
                number = ""
            word += ch
    if number:
        parts.append((0, int(number)))
    if word:
        parts.append((1, word))
    return tuple(parts)


# The longest CloudWatch Logs keeps an event: retention is 1 to 3653 days (CloudWatch Logs API Reference,
# PutRetentionPolicy, retentionInDays). Longer, a start time reaches before 1970, which the API refuses
# (FilterLogEvents, startTime: minimum 0) as a malformed request, not as no events.
MAX_SINCE_S = 3653 * 86400


def parse_since(text: str) -> float:
    """'90s', '30m', '1h', '2d' (or a bare number of seconds) -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    body = text.strip().lower()
    amount = number(body[:-1]) if body and body[-1] in units else number(body)
    value = -1.0 if amount is None else amount * units.get(body[-1:], 1)
    if not math.isfinite(value) or value <= 0:
        raise ReportInputError(f"--since {text[:40]!r} is not a duration: write e.g. 90s, 30m, 1h or 2d")
    if value > MAX_SINCE_S:
        raise ReportInputError(f"--since {text[:40]!r} is longer than {MAX_SINCE_S // 86400:,} days, the longest "
                               "CloudWatch Logs keeps events: give a shorter duration")
    return value


# A CloudWatch Logs side of a comparison: cw:LOG_GROUP@START..END (ISO 8601 times; no zone means UTC; an
# empty END means now) or cw:LOG_GROUP@DURATION (the last DURATION, as --since).
CLOUDWATCH_PREFIX = "cw:"
CLOUDWATCH_FORMS = "cw:LOG_GROUP@2026-11-20T10:00..2026-11-20T11:30 (UTC unless a zone is given) or cw:LOG_GROUP@1h"
# The characters and length CloudWatch Logs accepts in a log group name (CloudWatch Logs API Reference,
# CreateLogGroup, logGroupName: 1-512 of [\.\-_/#A-Za-z0-9]); '@' is not among them, so it ends the name.
LOG_GROUP_NAME = re.compile(r"[.\-_/#A-Za-z0-9]{1,512}")


def check_log_group(name: str, what: str = "--from-cloudwatch",
                    fix: str = "give the stack's LogGroupName output, e.g. /aws/batch/iobatch") -> str:
    """A CloudWatch Logs group name, checked before any request (LOG_GROUP_NAME); ReportInputError naming `what`
    and `fix` otherwise: every flag that names a log group goes through here."""
    if not LOG_GROUP_NAME.fullmatch(name):
        raise ReportInputError(f"{what} {name[:80]!r} is not a log group name (1-512 letters, digits and ._-/#): "
                               f"{fix}")
    return name


@dataclass(frozen=True)
class CloudWatchRange:
    """A log group and a time window, [start, end] in seconds since the epoch, as given on the command line."""

    log_group: str
    start: float
    end: float
    text: str

    def window(self) -> str:
        """'2026-11-20 10:00:00 to 11:30:00 UTC' (the date repeated only when the end is on another day)."""
        a, b = (datetime.fromtimestamp(t, tz=UTC) for t in (self.start, self.end))
        end = b.strftime("%H:%M:%S" if a.date() == b.date() else "%Y-%m-%d %H:%M:%S")
        return f"{a:%Y-%m-%d %H:%M:%S} to {end} UTC"


def _instant(text: str, side: str) -> float:
    try:
        moment = datetime.fromisoformat(text.strip())
        # A time without a zone is UTC, whatever this machine's zone is.
        seconds = (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
    except (ValueError, OverflowError):
        seconds = -1.0
    if seconds < 0:
        raise ReportInputError(f"{side}: {text!r} is not a time after 1970: write ISO 8601, e.g. "
                               f"2026-11-20T10:00 or 2026-11-20T10:00+01:00; use {CLOUDWATCH_FORMS}")
    return seconds


def parse_run_side(text: str, *, now: float | None = None) -> Path | CloudWatchRange:
    """One side of `--compare`: a local run directory, or a CloudWatch Logs range (CLOUDWATCH_FORMS).

    A directory whose name starts with 'cw:' is given as ./cw:... . `now` (default: the clock) ends the
    DURATION form and a range without an end. Raises ReportInputError naming the side and the fix.
    """
    if not text.startswith(CLOUDWATCH_PREFIX):
        if not text:
            raise ReportInputError("--compare: a side is empty: give a run directory or " + CLOUDWATCH_FORMS)
        return Path(text)
    group, at, window = text[len(CLOUDWATCH_PREFIX):].partition("@")
    check_log_group(group, f"--compare {text[:80]!r}:", f"use {CLOUDWATCH_FORMS}")
    if not at or not window.strip():
        raise ReportInputError(f"--compare {text!r} has no time range: use {CLOUDWATCH_FORMS}")
    clock = time.time() if now is None else now
    if ".." not in window:
        try:
            span = parse_since(window)
        except ReportInputError:
            raise ReportInputError(f"--compare {text!r}: {window!r} is neither START..END nor a duration (90s, "
                                   f"30m, 1h, 2d): use {CLOUDWATCH_FORMS}") from None
        return CloudWatchRange(group, max(0.0, clock - span), clock, text)
    first, _, last = window.partition("..")
    start = _instant(first, f"--compare {text!r}")
    end = _instant(last, f"--compare {text!r}") if last.strip() else clock
    if end <= start:
        raise ReportInputError(f"--compare {text!r}: the range ends before it starts: give START..END with "
                               "START first")
    return CloudWatchRange(group, start, end, text)


def profiles_from_emf_lines(
    lines: Iterable[str], *, where: str, namespace: str | None = DEFAULT_NAMESPACE
) -> list[StageProfile]:
    """Stage profiles from EMF text lines (runfiles.profiles_from_emf_lines); lines that are not iobatch
    EMF documents are skipped. A line that starts like JSON but does not parse is a DamagedInputError
    naming `where` and the line number.
    """
    try:
        return runfiles.profiles_from_emf_lines(lines, where=where, namespace=namespace)
    except runfiles.DamagedFileError as exc:
        raise DamagedInputError(str(exc)) from None


class Reader:
    """Profiles streamed into a Fleet, the whole profiles kept while the batch is small (PER_CHILD_LIMIT);
    `keep=False` keeps none (a batch known to be large)."""

    def __init__(self, *, keep: bool = True) -> None:
        self.fleet = Fleet()
        self.kept: list[tuple[StageProfile, str]] | None = [] if keep else None
        self._children: set[tuple[str, str | None, str | None]] = set()

    def add(self, profile: StageProfile, name: str, source: Path | None = None,
            points: list[dict[str, Any]] | None = None) -> None:
        self.fleet.add(profile, name, source, points)
        if self.kept is None:
            return
        if points is not None:  # kept whole: its timeline built
            profile = replace(profile, timeline=[TimelinePoint(**q) for q in points])
        rows = self.fleet.stages[profile.stage]
        self._children.add(rows.names[-1])
        if len(self._children) > PER_CHILD_LIMIT:
            self.kept = None  # a large batch: its page is drawn from the columns
            self._children.clear()
        else:
            self.kept.append((profile, name))

    def data(self, *, source: str, has_timelines: bool, reread: Callable[[set[str]], list[Entry]] | None = None
             ) -> ReportData:
        fleet = self.fleet.finish()
        entries: list[Entry] = []
        if self.kept is not None:
            names = {stage: iter(rows.children) for stage, rows in fleet.stages.items()}
            entries = [Entry(child=next(names[p.stage]), profile=p, instance=p.properties.get("InstanceId") or None)
                       for p, _ in self.kept]
        return ReportData(entries=entries, source=source, has_timelines=has_timelines, fleet_columns=fleet,
                          complete=self.kept is not None, reread=None if self.kept is not None else reread)
