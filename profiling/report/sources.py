"""What a report reads: a local run directory, or EMF documents from CloudWatch Logs, as ReportData.

A local run is read through profiling.runfiles (profile JSON with timelines, or its EMF files when it
kept no profiles); CloudWatch Logs give the per-stage figures of a batch in AWS but no timelines, read
either for the last DURATION (`load_cloudwatch`) or for a time range (`parse_run_side`, `load_cloudwatch_range`).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from profiling import runfiles
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile, stage_order
from profiling.numbers import number


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
    """Everything a report shows, whatever it was read from."""

    entries: list[Entry]
    source: str
    has_timelines: bool
    run: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    def stages(self) -> list[str]:
        return stage_order(e.profile.stage for e in self.entries)

    def of_stage(self, stage: str) -> list[Entry]:
        return [e for e in self.entries if e.profile.stage == stage]

    def children(self) -> list[str]:
        return sorted({e.child for e in self.entries}, key=natural_key)


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
    if not LOG_GROUP_NAME.fullmatch(group):
        raise ReportInputError(f"--compare {text!r}: {group!r} is not a log group name (1-512 letters, digits and "
                               f"._-/#): use {CLOUDWATCH_FORMS}")
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


def _child_labels(profiles: Sequence[tuple[StageProfile, str]]) -> list[str]:
    """The name shown for each child: 'child N' from ArrayIndex (with the job id when a report spans
    several jobs), else the name of the file the profile came from."""
    jobs = {_parent_job(p) for p, _ in profiles}
    labels = []
    for profile, fallback in profiles:
        index = profile.properties.get("ArrayIndex")
        if index is None or index == "":
            labels.append(fallback)
        elif len(jobs) > 1:
            labels.append(f"{_parent_job(profile) or '?'}[{index}]")
        else:
            labels.append(f"child {index}")
    return labels


def _parent_job(profile: StageProfile) -> str | None:
    """The array job's id: AWS Batch gives each child '<parent id>:<index>' as its job id."""
    job = profile.properties.get("JobId")
    index = profile.properties.get("ArrayIndex")
    if job and index and job.endswith(f":{index}"):
        return job[: -len(index) - 1]
    return job


def _entries(profiles: Sequence[tuple[StageProfile, str]]) -> list[Entry]:
    labels = _child_labels(profiles)
    return [Entry(child=label, profile=p, instance=p.properties.get("InstanceId") or None)
            for (p, _), label in zip(profiles, labels, strict=True)]


def load_run_dir(run_dir: Path) -> ReportData:
    """Read a local run directory: profile JSON when present (with timelines), else the EMF files."""
    if not run_dir.is_dir():
        raise ReportInputError(f"run directory {run_dir} does not exist: pass the --run-dir of a finished run")
    try:
        kept = runfiles.read_run_profiles(run_dir)
    except runfiles.DamagedFileError as exc:
        raise DamagedInputError(f"{exc}: {exc.fix}") from None
    pairs = kept.profiles
    if not pairs:
        raise ReportInputError(
            f"{run_dir} holds no {runfiles.PROFILES}/*.jsonl or {runfiles.EMF}/*.emf files: "
            "pass the run directory of a finished run (iobatch demo --run-dir DIR)"
        )
    if kept.from_emf:
        source = f"local run {run_dir}: {len(pairs)} EMF documents from {runfiles.EMF}/ (no profile files)"
    else:
        source = f"local run {run_dir}: {len(pairs)} stage profiles from {runfiles.PROFILES}/"
    run: dict[str, Any] | None = None
    if runfiles.is_run_dir(run_dir):
        try:
            run = runfiles.read_run(run_dir)
        except (ValueError, OSError):
            run = None  # the profiles make the report; a damaged run file only loses its own section
    data = ReportData(entries=_entries(pairs), source=source, has_timelines=not kept.from_emf, run=run)
    if not kept.from_emf and not any(e.profile.timeline for e in data.entries):
        data.notes.append("The profiles carry no timeline samples.")
    return data


def fetch_log_messages(client: Any, log_group: str, *, start_ms: int, end_ms: int | None = None) -> Iterator[str]:
    """Every message of a CloudWatch Logs group in [start_ms, end_ms], page by page.

    `client` is a boto3 'logs' client; errors from it propagate to the caller.
    """
    args: dict[str, Any] = {"logGroupName": log_group, "startTime": start_ms}
    if end_ms is not None:
        args["endTime"] = end_ms
    for page in client.get_paginator("filter_log_events").paginate(**args):
        for event in page.get("events", []):
            yield str(event.get("message", ""))


def load_cloudwatch(
    client: Any,
    log_group: str,
    *,
    since_s: float,
    namespace: str = DEFAULT_NAMESPACE,
    now: float | None = None,
) -> ReportData:
    """The stage documents a batch's containers logged to CloudWatch Logs in the last `since_s` seconds."""
    end = time.time() if now is None else now
    return _load_window(client, log_group, end - since_s, end, namespace,
                        f"the last {_duration(since_s)}", "widen --since")


def load_cloudwatch_range(client: Any, where: CloudWatchRange, *, namespace: str = DEFAULT_NAMESPACE) -> ReportData:
    """The stage documents a log group received within a range (parse_run_side)."""
    return _load_window(client, where.log_group, where.start, where.end, namespace, where.window(),
                        f"widen the range of {where.text}")


def _load_window(client: Any, log_group: str, start: float, end: float, namespace: str, window: str,
                 widen: str) -> ReportData:
    # FilterLogEvents returns the events whose timestamp is neither before startTime nor after endTime
    # (CloudWatch Logs API Reference, FilterLogEvents; milliseconds since the epoch): [start, end], whole
    # milliseconds outwards so that a document stamped on a bound is in.
    lines = fetch_log_messages(client, log_group, start_ms=math.floor(start * 1000), end_ms=math.ceil(end * 1000))
    profiles = profiles_from_emf_lines(lines, where=f"log group {log_group}", namespace=namespace)
    if not profiles:
        raise ReportInputError(f"log group {log_group} has no {namespace} EMF stage documents in {window}: "
                               f"{widen}, or check the log group and --namespace")
    pairs = [(p, f"document {n}") for n, p in enumerate(profiles, 1)]
    return ReportData(
        entries=_entries(pairs),
        source=f"CloudWatch Logs group {log_group}: {len(profiles)} EMF documents from {window}",
        has_timelines=False,
    )


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
