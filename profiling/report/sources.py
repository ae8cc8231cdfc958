"""What a report reads: a local run directory, or EMF documents from CloudWatch Logs, as ReportData.

A local run is read through profiling.runfiles (profile JSON with timelines, or its EMF files when it
kept no profiles) by profiling.report.rundir into a Reader; CloudWatch Logs give the per-stage figures of a
batch in AWS but no timelines, read either for the last DURATION (`load_cloudwatch`) or for a time range
(`parse_run_side`, `load_cloudwatch_range`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiling import runfiles
from profiling.emf import stage_key
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile, TimelinePoint, stage_order
from profiling.numbers import number
from profiling.report.fleet import PER_CHILD_LIMIT, Fleet

# EMF documents of this many stages are held open at once while reading a log group (stream_emf_profiles).
MERGE_WINDOW = 4096


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


def fetch_log_messages(client: Any, log_group: str, *, start_ms: int, end_ms: int | None = None,
                       progress: Callable[[int, int], None] | None = None) -> Iterator[str]:
    """Every message of a CloudWatch Logs group in [start_ms, end_ms], page by page, as they arrive.

    FilterLogEvents returns at most 1 MB or 10,000 events a call and a nextToken while there are more
    (CloudWatch Logs API Reference, FilterLogEvents: limit, nextToken); the paginator follows the token, and
    nothing but the current page is held. `progress(pages, events)` is called after each page. `client` is a
    boto3 'logs' client; errors from it propagate to the caller.
    """
    args: dict[str, Any] = {"logGroupName": log_group, "startTime": start_ms}
    if end_ms is not None:
        args["endTime"] = end_ms
    events = 0
    for pages, page in enumerate(client.get_paginator("filter_log_events").paginate(**args), 1):
        for event in page.get("events", []):
            events += 1
            yield str(event.get("message", ""))
        if progress is not None:
            progress(pages, events)


def stream_emf_profiles(lines: Iterable[str], *, where: str, namespace: str | None = DEFAULT_NAMESPACE,
                        window: int = MERGE_WINDOW) -> Iterator[StageProfile]:
    """Stage profiles from EMF text lines, one stage at a time, in the order the stages first appear.

    The library splits a stage with more than 100 metrics or values into several documents, written one after
    the other with one timestamp (profiling.emf.merge_documents joins them): the documents of the last `window`
    stages seen are held open, and the oldest is merged and given out once more stages have begun. A line
    that starts like JSON but does not parse is a DamagedInputError naming `where` and the line number.
    """
    pending: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def merged(docs: list[dict[str, Any]]) -> list[StageProfile]:
        return runfiles.profiles_from_documents(docs, where=where, namespace=namespace)

    try:
        for doc in runfiles.emf_documents(lines, where=where):
            key = stage_key(doc)
            if key is None:
                continue
            pending.setdefault(key, []).append(doc)
            if len(pending) > window:
                yield from merged(pending.pop(next(iter(pending))))
        for docs in pending.values():
            yield from merged(docs)
    except runfiles.DamagedFileError as exc:
        raise DamagedInputError(str(exc)) from None


def load_cloudwatch(
    client: Any,
    log_group: str,
    *,
    since_s: float,
    namespace: str = DEFAULT_NAMESPACE,
    now: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReportData:
    """The stage documents a batch's containers logged to CloudWatch Logs in the last `since_s` seconds."""
    end = time.time() if now is None else now
    return _load_window(client, log_group, end - since_s, end, namespace,
                        f"the last {_duration(since_s)}", "widen --since", progress)


def load_cloudwatch_range(client: Any, where: CloudWatchRange, *, namespace: str = DEFAULT_NAMESPACE,
                          progress: Callable[[int, int], None] | None = None) -> ReportData:
    """The stage documents a log group received within a range (parse_run_side)."""
    return _load_window(client, where.log_group, where.start, where.end, namespace, where.window(),
                        f"widen the range of {where.text}", progress)


def _load_window(client: Any, log_group: str, start: float, end: float, namespace: str, window: str,
                 widen: str, progress: Callable[[int, int], None] | None) -> ReportData:
    # FilterLogEvents returns the events whose timestamp is neither before startTime nor after endTime
    # (CloudWatch Logs API Reference, FilterLogEvents; milliseconds since the epoch): [start, end], whole
    # milliseconds outwards so that a document stamped on a bound is in.
    lines = fetch_log_messages(client, log_group, start_ms=math.floor(start * 1000), end_ms=math.ceil(end * 1000),
                               progress=progress)
    reader = Reader()
    for seen, profile in enumerate(stream_emf_profiles(lines, where=f"log group {log_group}",
                                                         namespace=namespace), 1):
        reader.add(profile, f"document {seen}")
    count = reader.fleet.profiles
    if not count:
        raise ReportInputError(f"log group {log_group} has no {namespace} EMF stage documents in {window}: "
                               f"{widen}, or check the log group and --namespace")
    return reader.data(source=f"CloudWatch Logs group {log_group}: {count} EMF documents from {window}",
                       has_timelines=False)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
