"""The one CloudWatch Logs reader of `report` and `advise` (profiling.report.cloudwatch): a window cut into slices read
at once, given out in the order one reader would, with a bounded read-ahead; against a stand-in FilterLogEvents."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from profiling.report.cloudwatch import MIN_SLICE_MS, fetch_log_messages, slices

HOUR_MS = 3_600_000


class FakeLogs:
    """FilterLogEvents over a list of (timestamp ms, message), `page` events a call, each call taking `delay_s`;
    `fail_after` makes the call for a window starting there fail."""

    def __init__(self, events: list[tuple[int, str]], page: int = 50, delay_s: float = 0.002,
                 fail_at: int | None = None) -> None:
        self.events = sorted(events)
        self.page, self.delay_s, self.fail_at = page, delay_s, fail_at
        self.lock = threading.Lock()
        self.in_flight = self.most = self.calls = 0

    def get_paginator(self, name: str) -> FakeLogs:
        assert name == "filter_log_events"
        return self

    def paginate(self, *, logGroupName: str, startTime: int, endTime: int | None = None) -> Iterator[dict[str, Any]]:
        found = [m for t, m in self.events if t >= startTime and (endTime is None or t <= endTime)]
        for first in range(0, max(len(found), 1), self.page):
            with self.lock:
                self.calls += 1
                self.in_flight += 1
                self.most = max(self.most, self.in_flight)
            time.sleep(self.delay_s)
            with self.lock:
                self.in_flight -= 1
            if self.fail_at is not None and startTime == self.fail_at:
                raise RuntimeError("throttled for good")
            yield {"events": [{"message": m} for m in found[first:first + self.page]]}


def events(count: int, span_ms: int = HOUR_MS) -> list[tuple[int, str]]:
    return [(i * span_ms // count, f"line {i}") for i in range(count)]


def test_slices_cover_the_window_once_and_are_not_too_short() -> None:
    parts = slices(0, HOUR_MS - 1, 4)
    assert parts == [(0, 899_999), (900_000, 1_799_999), (1_800_000, 2_699_999), (2_700_000, 3_599_999)]
    assert slices(0, 2 * MIN_SLICE_MS - 1, 4) == [(0, MIN_SLICE_MS - 1), (MIN_SLICE_MS, 2 * MIN_SLICE_MS - 1)]
    assert slices(5, 10, 4) == [(5, 10)]  # shorter than a slice: one reader


def test_the_slices_are_read_at_once_and_given_out_in_one_readers_order() -> None:
    client = FakeLogs(events(2_000))
    progress: list[tuple[int, int]] = []
    got = list(fetch_log_messages(client, "g", start_ms=0, end_ms=HOUR_MS - 1, progress=lambda p, e:
                                  progress.append((p, e))))
    assert got == [f"line {i}" for i in range(2_000)]
    assert client.most > 1  # more than one call in flight
    assert [p for p, _ in progress] == list(range(1, client.calls + 1)) and progress[-1][1] == 2_000
    one = FakeLogs(events(2_000))
    assert list(fetch_log_messages(one, "g", start_ms=0, end_ms=HOUR_MS - 1, readers=1)) == got
    assert one.most == 1


def test_later_slices_wait_once_the_read_ahead_is_full() -> None:
    client = FakeLogs(events(400), page=10, delay_s=0.0)
    held: list[int] = []
    reader = fetch_log_messages(client, "g", start_ms=0, end_ms=HOUR_MS - 1, read_ahead_bytes=200)
    assert next(reader) == "line 0"
    time.sleep(0.2)  # the other slices read what they may meanwhile
    held.append(client.calls)
    # The first slice's 10 pages; of the other three slices' 30, what 200 bytes hold (pages of ~70) and the page
    # each reader holds while it waits.
    assert 10 <= held[0] <= 16
    assert list(reader) == [f"line {i}" for i in range(1, 400)]


def test_a_slices_error_comes_after_the_earlier_slices_lines_and_no_thread_is_left() -> None:
    threads = threading.active_count()
    client = FakeLogs(events(100), fail_at=1_800_000)
    got: list[str] = []
    with pytest.raises(RuntimeError, match="throttled for good"):
        for line in fetch_log_messages(client, "g", start_ms=0, end_ms=HOUR_MS - 1):
            got.append(line)
    assert got == [f"line {i}" for i in range(50)]  # the first two slices', in order
    assert threading.active_count() == threads
    early = fetch_log_messages(FakeLogs(events(1_000)), "g", start_ms=0, end_ms=HOUR_MS - 1)
    assert next(early) == "line 0"
    early.close()  # a reader that stops early stops every slice's thread
    assert threading.active_count() == threads
