"""A real sampler (a thread reading this machine's /proc) draws a curve for a quarter-second stage."""

from __future__ import annotations

import os
import time

from profiling.sampler import YOUNG_MIN_INTERVAL_S, StageSampler


def test_a_real_sampler_draws_a_quarter_second_stage() -> None:
    sampler = StageSampler(stage="s", pid=os.getpid(), device=None, interval_s=1.0)
    sampler.start()
    time.sleep(0.25)
    profile = sampler.finish(outcome="ok")
    assert len(profile.timeline) >= 10
    gaps = [b.t - a.t for a, b in zip(profile.timeline, profile.timeline[1:-1], strict=False)]
    assert min(gaps) >= YOUNG_MIN_INTERVAL_S * 0.5  # the closing sample may come at any moment
