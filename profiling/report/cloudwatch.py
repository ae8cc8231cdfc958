"""Reading a batch's EMF documents back from CloudWatch Logs: the one reader `iobatch report` and `iobatch advise`
share.

`fetch_log_messages` pages through FilterLogEvents, a window cut into time slices read at once and given out in
time order; `stream_emf_profiles` merges a stage's split documents into its profile; `cloudwatch_profiles` is both
for a window (LogWindow); `load_cloudwatch` and `load_cloudwatch_range` stream them into the report's ReportData.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from profiling import runfiles
from profiling.emf import stage_key
from profiling.metrics import DEFAULT_NAMESPACE, StageProfile
from profiling.report.sources import CloudWatchRange, DamagedInputError, Reader, ReportData, ReportInputError

# EMF documents of this many stages are held open at once while reading a log group (stream_emf_profiles).
MERGE_WINDOW = 4096
# FilterLogEvents answers at most 5 calls a second per account and Region, a quota AWS does not raise (AWS Knowledge
# Center, "How do I determine throttling in my CloudWatch logs?"): this many slices are read at once, so the calls in
# flight stay under it while each waits on its answer (botocore retries a throttled one with back-off).
READERS = 4
# A window is cut into slices of at least this long: a shorter one buys nothing for the threads it costs.
MIN_SLICE_MS = 60_000
# Messages of later slices held while an earlier one is given out; past it their readers wait.
READ_AHEAD_BYTES = 64 * 2**20

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class LogWindow:
    """A log group and [start, end] in seconds since the epoch; `text` names the window in messages and `widen` says
    how to widen it when it holds no documents."""

    log_group: str
    start: float
    end: float
    text: str
    widen: str

    @classmethod
    def last(cls, log_group: str, since_s: float, now: float | None = None) -> LogWindow:
        """The last `since_s` seconds up to `now` (default: the clock)."""
        end = time.time() if now is None else now
        return cls(log_group, end - since_s, end, f"the last {_duration(since_s)}", "widen --since")

    @classmethod
    def of_range(cls, where: CloudWatchRange) -> LogWindow:
        return cls(where.log_group, where.start, where.end, where.window(), f"widen the range of {where.text}")


def slices(start_ms: int, end_ms: int, readers: int = READERS) -> list[tuple[int, int]]:
    """[start_ms, end_ms] cut into at most `readers` disjoint slices of whole milliseconds, each at least MIN_SLICE_MS
    long, both ends inclusive as FilterLogEvents takes them."""
    count = max(1, min(readers, (end_ms - start_ms + 1) // MIN_SLICE_MS))
    cuts = [start_ms + (end_ms - start_ms + 1) * i // count for i in range(count + 1)]
    return [(cuts[i], cuts[i + 1] - 1) for i in range(count)]


def _pages(client: Any, log_group: str, start_ms: int, end_ms: int | None) -> Iterator[list[str]]:
    """The messages of each FilterLogEvents page of one slice. FilterLogEvents returns at most 1 MB or 10,000 events
    a call and a nextToken while there are more (CloudWatch Logs API Reference, FilterLogEvents: limit, nextToken);
    the paginator follows the token."""
    args: dict[str, Any] = {"logGroupName": log_group, "startTime": start_ms}
    if end_ms is not None:
        args["endTime"] = end_ms
    for page in client.get_paginator("filter_log_events").paginate(**args):
        yield [str(event.get("message", "")) for event in page.get("events", [])]


class _ReadAhead:
    """Slices read by threads at once, their pages given out slice by slice: the slice being given out is never held
    back; a later one waits once READ_AHEAD_BYTES of pages are held."""

    def __init__(self, count: int, budget: int) -> None:
        self.cond = threading.Condition()
        self.pages: list[deque[list[str]]] = [deque() for _ in range(count)]
        self.done = [False] * count
        self.error: list[BaseException | None] = [None] * count
        self.held = 0
        self.current = 0
        self.closed = False
        self.budget = budget

    def read(self, index: int, pages: Iterator[list[str]]) -> None:
        try:
            for messages in pages:
                size = sum(map(len, messages))
                with self.cond:
                    self.cond.wait_for(partial(self._may_hold, index, size))
                    if self.closed:
                        return
                    self.pages[index].append(messages)
                    self.held += size
                    self.cond.notify_all()
        except BaseException as exc:  # given to the reader that consumes this slice, in order
            with self.cond:
                self.error[index] = exc
        finally:
            with self.cond:
                self.done[index] = True
                self.cond.notify_all()

    def _may_hold(self, index: int, size: int) -> bool:
        return self.closed or index == self.current or self.held + size <= self.budget

    def take(self, index: int) -> list[str] | None:
        """The next page of slice `index`, None once it has no more (its reader's error raised here)."""
        with self.cond:
            if self.current != index:
                self.current = index
                self.cond.notify_all()
            self.cond.wait_for(lambda: bool(self.pages[index]) or self.done[index])
            if self.pages[index]:
                messages = self.pages[index].popleft()
                self.held -= sum(map(len, messages))
                self.cond.notify_all()
                return messages
            error = self.error[index]
        if error is not None:
            raise error
        return None

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()


def fetch_log_messages(client: Any, log_group: str, *, start_ms: int, end_ms: int | None = None,
                       progress: Progress | None = None, readers: int = READERS,
                       read_ahead_bytes: int = READ_AHEAD_BYTES) -> Generator[str, None, None]:
    """Every message of a CloudWatch Logs group in [start_ms, end_ms], in time order, page by page.

    The window is cut into slices (`slices`) read at once, one thread each, and given out slice after slice, so the
    order is the one a single reader would see; at most `read_ahead_bytes` of later slices' messages are held.
    `progress(pages, events)` is called after each page given out. `client` is a boto3 'logs' client (safe to
    share between threads); errors from it propagate to the caller.
    """
    parts = [(start_ms, end_ms)] if end_ms is None else slices(start_ms, end_ms, readers)
    pages = events = 0
    if len(parts) == 1:
        for messages in _pages(client, log_group, *parts[0]):
            yield from messages
            pages, events = pages + 1, events + len(messages)
            if progress is not None:
                progress(pages, events)
        return
    ahead = _ReadAhead(len(parts), read_ahead_bytes)
    threads = [threading.Thread(target=ahead.read, args=(i, _pages(client, log_group, a, b)), daemon=True,
                                name=f"logs-slice-{i}") for i, (a, b) in enumerate(parts)]
    for thread in threads:
        thread.start()
    try:
        for index in range(len(parts)):
            while (page := ahead.take(index)) is not None:
                yield from page
                pages, events = pages + 1, events + len(page)
                if progress is not None:
                    progress(pages, events)
    finally:
        ahead.close()
        for thread in threads:
            thread.join()


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


def cloudwatch_profiles(client: Any, window: LogWindow, *, namespace: str = DEFAULT_NAMESPACE,
                        progress: Progress | None = None,
                        keep: Callable[[StageProfile], bool] | None = None) -> Iterator[StageProfile]:
    """The stage profiles of the EMF documents a log group received within `window` (those `keep` keeps), streamed.

    FilterLogEvents returns the events whose timestamp is neither before startTime nor after endTime (CloudWatch Logs
    API Reference, FilterLogEvents; milliseconds since the epoch): [start, end], whole milliseconds outwards so that
    a document stamped on a bound is in."""
    lines = fetch_log_messages(client, window.log_group, start_ms=math.floor(window.start * 1000),
                               end_ms=math.ceil(window.end * 1000), progress=progress)
    for profile in stream_emf_profiles(lines, where=f"log group {window.log_group}", namespace=namespace):
        if keep is None or keep(profile):
            yield profile


def no_documents(window: LogWindow, namespace: str) -> ReportInputError:
    """The error for a window that holds none of the pipeline's documents."""
    return ReportInputError(f"log group {window.log_group} has no {namespace} EMF stage documents in {window.text}: "
                            f"{window.widen}, or check the log group and --namespace")


def load_cloudwatch(client: Any, log_group: str, *, since_s: float, namespace: str = DEFAULT_NAMESPACE,
                    now: float | None = None, progress: Progress | None = None) -> ReportData:
    """The stage documents a batch's containers logged to CloudWatch Logs in the last `since_s` seconds."""
    return load_window(client, LogWindow.last(log_group, since_s, now), namespace=namespace, progress=progress)


def load_cloudwatch_range(client: Any, where: CloudWatchRange, *, namespace: str = DEFAULT_NAMESPACE,
                          progress: Progress | None = None) -> ReportData:
    """The stage documents a log group received within a range (parse_run_side)."""
    return load_window(client, LogWindow.of_range(where), namespace=namespace, progress=progress)


def load_window(client: Any, window: LogWindow, *, namespace: str = DEFAULT_NAMESPACE,
                progress: Progress | None = None) -> ReportData:
    """The report's data of a window's documents, streamed into the report's Reader (columns at fleet size)."""
    reader = Reader()
    for seen, profile in enumerate(cloudwatch_profiles(client, window, namespace=namespace, progress=progress), 1):
        reader.add(profile, f"document {seen}")
    count = reader.fleet.profiles
    if not count:
        raise no_documents(window, namespace)
    return reader.data(source=f"CloudWatch Logs group {window.log_group}: {count} EMF documents from {window.text}",
                       has_timelines=False)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
