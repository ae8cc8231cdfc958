"""The lab's closed loop (profile -> advice -> applied -> predicted against measured), with a stand-in volume.
No root needed: the lab volume is tests.support.lab's StandInLab, the batch returns profiles shaped as the
sidecar writes them."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from profiling.metrics import MIB, StageProfile
from tests.support.lab import StandInLab
from tuning.ebs import GIB, Volume
from tuning.host import KERNEL_DEFAULTS, HostTuning
from tuning.lab.compare import ComparePlan
from tuning.lab.config import LabConfig, emulated_sysctls
from tuning.lab.loop import (
    ADVISED,
    DEFAULT,
    LoopRun,
    cache_of,
    measured_cell,
    predict_download,
    predicted_cell,
    render_loop,
    run_advise_loop,
)
from tuning.plan import workload_from_profiles


def child_profiles(children: int, download_s: float, stall_s: float, mib: int = 500) -> list[StageProfile]:
    """Each child downloads `mib` MiB, processes and uploads a small shard."""
    size = mib * MIB
    out: list[StageProfile] = []
    for i in range(children):
        props = {"ArrayIndex": str(i)}
        out += [
            StageProfile("download", "ok", 0.0, download_s, write_bytes=size, storage_write_bytes=size,
                         device_write_bytes=size // 2, device_write_ops=size // 2 // MIB,
                         io_stall_some_ms=stall_s * 1000, properties=props),
            StageProfile("process", "ok", 0.0, 5.0, read_bytes=size, storage_write_bytes=size // 40, properties=props),
            StageProfile("upload", "ok", 0.0, 0.5, read_bytes=size // 40, properties=props),
        ]
    return out


PLAN = ComparePlan(tuned=HostTuning(), memory_gib=2.5, workers=2, images=32, image_mib=25.0, images_per_child=16)
AT_BASELINE = LabConfig(volume=Volume("st1", 500), hold_empty=True)


def test_default_then_others_then_the_advised_cache_each_predicted(tmp_path: Path) -> None:
    events: list[str] = []
    measured = {DEFAULT: 40.0, "30/20": 20.0, ADVISED: 3.0}

    def run_profiles(number: int, setting: str, scratch: Path) -> list[StageProfile]:
        assert scratch == tmp_path / f"run-{number}" and scratch.is_dir()
        events.append(f"batch {setting}")
        return child_profiles(2, measured[setting], stall_s=measured[setting] - 1.0, mib=400)

    result = run_advise_loop(AT_BASELINE, PLAN, run_profiles, also=[("30/20", HostTuning())], say=lambda _: None,
                             open_lab=lambda config, say: StandInLab(tmp_path, events, credits_gib=0.0),
                             other_dirty=lambda: 10 * MIB)
    assert [r.setting for r in result.runs] == [DEFAULT, "30/20", ADVISED]
    default_bytes = emulated_sysctls(KERNEL_DEFAULTS, PLAN.memory_bytes)["vm.dirty_bytes"]
    advised = result.advice.cache.tuning
    assert events[:4] == ["open", "drain", f"cache {default_bytes}", "batch default"]
    assert events[-3:] == [f"batch {ADVISED}", "check", "close"]
    assert result.runs[-1].sysctls["vm.dirty_bytes"] == str(advised.dirty_bytes)
    # Two children of 400 MiB at once on 2.5 GiB: the advisor asks for the 40 % budget, 1 GiB.
    assert advised.dirty_bytes == 1024 * MIB
    first, last = result.runs[0], result.runs[-1]
    assert first.other_dirty_bytes == 10 * MIB and first.measured_s == 40.0
    # Default: 800 MiB through a ~460 MiB cache at 19.5 MiB/s; advised: a 1 GiB cache takes nearly all of it.
    assert 15 < first.predicted_s < 25
    assert last.predicted_s < first.predicted_s / 3
    speedup = result.speedup(measured=True)
    assert speedup == pytest.approx(40 / 3)
    text = render_loop(result)
    assert "closed loop: st1 500 GiB at baseline" in text and "default / advised" in text
    assert f"vm.dirty_bytes={advised.dirty_bytes}" in text


def test_prediction_uses_rounds_and_the_bucket() -> None:
    workload = workload_from_profiles(child_profiles(4, 10.0, 9.0, mib=250))
    plan = ComparePlan(tuned=HostTuning(), memory_gib=2.5, workers=2, images=40, image_mib=25.0,
                       images_per_child=10)
    cache = cache_of(emulated_sysctls(KERNEL_DEFAULTS, plan.memory_bytes))
    at_baseline = predict_download(workload, plan, AT_BASELINE, cache)
    with_credits = predict_download(workload, plan, LabConfig(volume=Volume("st1", 500)), cache)
    assert with_credits < at_baseline / 3
    # Others' dirty pages in the same global limits make the wait longer.
    crowded = predict_download(workload, plan, AT_BASELINE, cache_of(emulated_sysctls(KERNEL_DEFAULTS,
                                                                                      plan.memory_bytes), 200 * MIB))
    assert crowded > at_baseline


def test_error_and_agreement() -> None:
    run = LoopRun(DEFAULT, {}, 0, predicted_s=12.0, measured_each=(10.0,), credits_gib=0.0)
    assert run.error == pytest.approx(0.2) and run.agrees and run.spread is None
    assert not LoopRun(DEFAULT, {}, 0, 13.0, (10.0,), 0.0).agrees
    assert LoopRun(DEFAULT, {}, 0, 13.0, (), 0.0).error is None
    # Over rounds the error is against their median, and the range is shown.
    rounds = LoopRun(DEFAULT, {}, 0, 12.0, (14.0, 9.0, 10.0), 0.0)
    assert rounds.measured_s == 10.0 and rounds.error == pytest.approx(0.2) and rounds.spread == (9.0, 14.0)
    assert measured_cell(rounds) == "10.0 (9.0-14.0, 3 runs)" and measured_cell(run) == "10.0"


def test_rounds_run_every_setting_again_and_keep_the_first_runs_advice(tmp_path: Path) -> None:
    order: list[str] = []
    # The same settings measure differently from round to round, as short stages do on a real machine.
    measured = {DEFAULT: [40.0, 44.0, 38.0], ADVISED: [3.0, 2.0, 2.6]}

    def run_profiles(number: int, setting: str, scratch: Path) -> list[StageProfile]:
        assert scratch == tmp_path / f"run-{number}"
        order.append(setting)
        seconds = measured[setting][order.count(setting) - 1]
        # Later rounds move less data: advice taken again from one of them would differ from the first's.
        return child_profiles(2, seconds, stall_s=seconds - 1.0, mib=400 if number == 1 else 150)

    plan = ComparePlan(tuned=HostTuning(), memory_gib=2.5, rounds=3, workers=2, images=32, image_mib=25.0,
                       images_per_child=16)
    result = run_advise_loop(AT_BASELINE, plan, run_profiles, say=lambda _: None,
                             open_lab=lambda config, say: StandInLab(tmp_path, [], credits_gib=0.0),
                             other_dirty=lambda: 0)
    assert order == [DEFAULT, ADVISED] * 3
    default, advised = result.runs
    assert default.measured_each == (40.0, 44.0, 38.0) and default.measured_s == 40.0
    assert advised.measured_each == (3.0, 2.0, 2.6) and advised.spread == (2.0, 3.0)
    # The advice (and so every prediction) is the first run's: later default runs do not change it.
    def advice_of_one_round(mib: int) -> Any:
        (tmp_path / str(mib)).mkdir()
        return run_advise_loop(AT_BASELINE, PLAN, lambda n, s, d: child_profiles(2, 40.0, 39.0, mib=mib),
                               say=lambda _: None, other_dirty=lambda: 0,
                               open_lab=lambda config, say: StandInLab(tmp_path / str(mib), [], credits_gib=0.0))

    first, later = advice_of_one_round(400), advice_of_one_round(150)
    assert first.advice.cache.tuning != later.advice.cache.tuning
    assert result.advice.cache.tuning == first.advice.cache.tuning
    assert default.predicted_s == pytest.approx(first.runs[0].predicted_s)
    text = render_loop(result)
    assert "measured s (median, range)" in text and "2.6 (2.0-3.0, 3 runs)" in text


def test_a_burst_just_past_the_freerun_point_is_predicted_as_a_range() -> None:
    """The held-out cell of BENCHMARKS.md: 480 MiB at once into a 3 GiB instance's default cache (freerun ~415 MiB,
    setpoint ~484) on st1 at baseline. The settled controller paces the last ~65 MiB at about the volume's rate
    (seconds); one not yet settled lets them through below the setpoint (the kernel paused one child 0.24-0.31 s);
    writers held at freerun are paced for all ~65 MiB at the volume's rate, ~3.3 s (measured 3.8-4.2 s with the
    count held at 396-409 MiB): the range spans the three. A burst far past the limit is paced either way: its
    range is narrow."""
    def predict(mib: int, memory_gib: float) -> tuple[float, float, float]:
        plan = ComparePlan(tuned=HostTuning(), memory_gib=memory_gib, workers=2, images=24, image_mib=mib / 12,
                           images_per_child=12)
        workload = workload_from_profiles(child_profiles(2, 0.6, 0.0, mib=mib))
        cache = cache_of(emulated_sysctls(KERNEL_DEFAULTS, plan.memory_bytes))
        return tuple(predict_download(workload, plan, AT_BASELINE, c)  # type: ignore[return-value]
                     for c in (cache.unsettled(), cache, cache.held()))

    low, settled, high = predict(240, 3.0)
    assert low < 0.9 and 2.0 < settled < high - 0.5, (low, settled, high)
    freerun = cache_of(emulated_sysctls(KERNEL_DEFAULTS, 3 * GIB)).kernel_freerun_bytes
    # Free up to freerun at the download's own speed (480 MiB in 0.6 s), the rest at the volume's 19.53 MiB/s (less
    # what writeback moved once the count passed the background limit, ~0.2 s).
    assert high == pytest.approx(0.6 * freerun / (480 * MIB) + (480 * MIB - freerun) / (19.53125 * MIB), abs=0.3)
    low, settled, high = predict(1000, 3.0)  # 2 GiB through a ~550 MiB limit: ~75 s paced at the volume's rate
    assert low > 0.9 * settled and high < 1.1 * settled, (low, settled, high)


def test_a_run_inside_its_range_is_said_so() -> None:
    run = LoopRun(DEFAULT, {}, 0, predicted_s=2.7, measured_each=(0.7,), credits_gib=0.0, predicted_low_s=0.6)
    assert not run.agrees and run.within_range and run.has_range
    assert "2.7 (0.6-2.7)" in predicted_cell(run)
    held = LoopRun(DEFAULT, {}, 0, predicted_s=2.7, measured_each=(4.1,), credits_gib=0.0, predicted_low_s=0.6,
                   predicted_high_s=3.9)
    assert not held.agrees and held.within_range and predicted_cell(held) == "2.7 (0.6-3.9)"
    above = dataclasses.replace(held, measured_each=(5.0,))  # past 3.9 x 1.25
    assert not above.within_range
    only_high = LoopRun(DEFAULT, {}, 0, predicted_s=2.7, measured_each=(3.5,), credits_gib=0.0, predicted_high_s=3.9)
    assert only_high.has_range and predicted_cell(only_high) == "2.7 (2.7-3.9)"
    narrow = LoopRun(DEFAULT, {}, 0, predicted_s=2.7, measured_each=(0.7,), credits_gib=0.0, predicted_low_s=2.6)
    assert not narrow.has_range and not narrow.within_range and predicted_cell(narrow) == "2.7"
