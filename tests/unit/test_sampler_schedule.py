"""The sampler samples a young stage fast enough that a 0.1 s stage has a curve, then at the configured rate."""

from __future__ import annotations

import pytest

from profiling.sampler import YOUNG_MIN_INTERVAL_S, next_interval


def schedule(duration_s: float, interval_s: float) -> list[float]:
    """The sample times next_interval gives a stage of `duration_s`."""
    times, t = [], 0.0
    while (t := t + next_interval(t, interval_s)) < duration_s:
        times.append(t)
    return times


@pytest.mark.parametrize(("duration_s", "at_least"), [(0.06, 5), (0.1, 9), (0.5, 25), (3.0, 45)])
def test_short_stages_get_a_curve(duration_s: float, at_least: int) -> None:
    assert len(schedule(duration_s, 1.0)) >= at_least


def test_the_configured_interval_takes_over_and_caps_the_young_rate() -> None:
    assert next_interval(0.0, 1.0) == YOUNG_MIN_INTERVAL_S
    assert next_interval(2.0, 1.0) == pytest.approx(0.2)
    assert next_interval(10.0, 1.0) == 1.0 and next_interval(500.0, 1.0) == 1.0
    assert next_interval(0.0, 0.005) == 0.005  # never slower than asked
    long = schedule(3600.0, 1.0)
    assert 3600 - 10 < len(long) < 3600 - 10 + 70  # one per second after ten seconds, ~60 before
