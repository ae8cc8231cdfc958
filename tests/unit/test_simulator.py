"""The write cache and the burst-bucket simulator, against AWS's documented figures."""

from __future__ import annotations

import pytest

from tuning.ebs import GIB, MIB, Volume
from tuning.simulator import StageLoad, simulate
from tuning.writecache import INIT_BW_BPS, RATELIMIT_TAU_S, WriteCache, through_cache


def test_write_cache_freerun_is_halfway() -> None:
    cache = WriteCache.from_ratios(10 * GIB, 30, 20)
    assert cache.limit_bytes == int(10 * GIB * 0.9 * 0.3)
    assert cache.freerun_bytes == (cache.limit_bytes + cache.background_bytes) // 2


def test_simulator_without_cache_runs_at_burst_then_baseline() -> None:
    volume = Volume("st1", 500)
    # 1 GiB per round, no cache, no floor: each round is disk-bound.
    stage = StageLoad("download", write_bytes=GIB, io_size=MIB)
    credits = 10 * 1024.0  # MiB: ~100 s of burst
    result = simulate(volume, [stage], waves=20, initial_credits=credits, dt=0.05)
    times = result.stage_times("download")
    assert times[0] == pytest.approx(1024 / 122.0703125, rel=0.02)
    assert times[-1] == pytest.approx(1024 / 19.53125, rel=0.02)
    assert result.credits_empty_at is not None
    # Credits drain at burst - baseline while bursting.
    assert result.credits_empty_at == pytest.approx(credits / (122.0703125 - 19.53125), rel=0.03)


def test_simulator_cache_absorbs_a_burst_but_not_durability() -> None:
    volume = Volume("st1", 500)
    stage = StageLoad("download", write_bytes=512 * MIB, io_size=MIB, floor_s=2.0)
    small = WriteCache(limit_bytes=128 * MIB, background_bytes=64 * MIB)
    large = WriteCache(limit_bytes=1024 * MIB, background_bytes=512 * MIB)
    # A writer that keeps its files (the job removes its scratch at its end: see below).
    slow = simulate(volume, [stage], cache=small, dt=0.05, removes_scratch=False).waves[0]
    fast = simulate(volume, [stage], cache=large, dt=0.05, removes_scratch=False).waves[0]
    assert fast.stage_s["download"] == pytest.approx(2.0, abs=0.1)  # memory speed: the floor
    assert slow.stage_s["download"] > 3.0  # past 96 MiB writers wait for the disk
    # Time to durable is the disk's: 512 MiB at burst, give or take the background threshold wait.
    assert slow.time_to_durable_s == pytest.approx(512 / 122.07, rel=0.1)
    assert fast.time_to_durable_s is not None and fast.time_to_durable_s >= 512 / 122.07 * 0.95


def test_simulator_credit_cliff_over_hours() -> None:
    volume = Volume("st1", 500)
    stages = [StageLoad("download", 2 * GIB, floor_s=10), StageLoad("process", 0, floor_s=20)]
    result = simulate(volume, stages, concurrency=2, waves=300, cache=WriteCache(0, 0))
    assert result.credits_empty_at is not None and result.credits_empty_at > 3600
    burst, base = 122.0703125, 19.53125
    before = result.waves[0].stage_s["download"]
    assert before == pytest.approx(4096 / burst, rel=0.02)
    # After the cliff each round starts with the credits earned during the 20 s process stage: a short
    # burst, then the rest at baseline.
    earned = 20 * base
    burst_s = earned / (burst - base)
    expected = burst_s + (4096 - burst * burst_s) / base
    assert result.waves[-1].stage_s["download"] == pytest.approx(expected, rel=0.02)
    assert any(s.credits == 0 for s in result.samples)


def test_a_round_that_removes_its_scratch_leaves_the_next_round_an_empty_cache() -> None:
    # Two rounds of 240 MiB into a cache whose freerun point is 300 MiB, at baseline: kept, the second round's
    # bytes land on the first round's (below the background limit, not yet expired) and are paced; removed
    # with the children's scratch, they never reach the volume and the second round runs free.
    stage = StageLoad("download", write_bytes=240 * MIB, floor_s=0.5)
    cache = WriteCache(400 * MIB, 200 * MIB)

    def run(removes: bool) -> object:
        return simulate(Volume("st1", 500), [stage], waves=2, cache=cache, baseline_only=True, dt=0.02,
                        removes_scratch=removes)

    kept, removed = run(False), run(True)
    assert kept.stage_times("download")[1] > 3  # type: ignore[attr-defined]
    assert removed.stage_times("download") == [pytest.approx(0.5, abs=0.05)] * 2  # type: ignore[attr-defined]
    # Dropped, not written: the volume wrote only what crossed the background limit in the first round.
    assert removed.waves[0].durable_at == pytest.approx(removed.waves[0].started_at + 0.5, abs=0.05)  # type: ignore[attr-defined]


def test_dirty_data_below_the_background_limit_is_written_once_it_expires() -> None:
    # 100 MiB (below the 200 MiB background limit) then 60 s of work: the flusher writes it after 30 s.
    stages = [StageLoad("download", write_bytes=100 * MIB, floor_s=1.0), StageLoad("process", 0, floor_s=60.0)]
    cache = WriteCache(400 * MIB, 200 * MIB)
    sim = simulate(Volume("st1", 500), stages, cache=cache, baseline_only=True, dt=0.02, sample_every_s=1.0,
                   removes_scratch=False)
    # Not written back before it expired (from 30 s: accepted over 0-1 s), then at baseline, oldest first.
    assert [s.dirty_bytes for s in sim.samples if 2 < s.t < 31] == [pytest.approx(100 * MIB, rel=0.01)]
    assert sim.waves[0].time_to_durable_s == pytest.approx(30 + 100 / BASE_MIBPS, abs=0.2)


# ---- the write cache as balance_dirty_pages throttles it ----------------------------------------------------

BASE_MIBPS = 19.53125  # st1 500 GiB at baseline


def _burst_s(cache: WriteCache, mib: int = 500) -> float:
    stage = StageLoad("download", write_bytes=mib * MIB, floor_s=0.5)
    return simulate(Volume("st1", 500), [stage], cache=cache, baseline_only=True, dt=0.02).waves[0].stage_s["download"]


def test_pos_ratio_is_two_at_freerun_one_at_setpoint_zero_at_limit() -> None:
    cache = WriteCache(400 * MIB, 200 * MIB)
    assert (cache.freerun_bytes, cache.setpoint_bytes) == (300 * MIB, 350 * MIB)
    assert cache.pos_ratio(cache.freerun_bytes) == pytest.approx(2.0)
    assert cache.pos_ratio(cache.setpoint_bytes) == pytest.approx(1.0)
    assert cache.pos_ratio(cache.limit_bytes) == pytest.approx(0.0)
    assert cache.pos_ratio(0) == 2.0 and cache.pos_ratio(500 * MIB) == 0.0


def test_writers_past_freerun_climb_towards_the_setpoint_at_about_the_device_rate() -> None:
    cache = WriteCache(400 * MIB, 200 * MIB)
    took = _burst_s(cache)
    # Faster than pausing at freerun (200 MiB at baseline), slower than absorbing up to the setpoint.
    assert (500 - 350) / BASE_MIBPS < took < (500 - 300) / BASE_MIBPS
    sim = simulate(Volume("st1", 500), [StageLoad("download", 2048 * MIB, floor_s=0.5)], cache=cache,
                   baseline_only=True, dt=0.02, sample_every_s=1.0)
    peak = max(s.dirty_bytes for s in sim.samples)
    assert 330 * MIB < peak <= cache.setpoint_bytes + MIB  # held at the setpoint, never at the limit


def test_the_bounds_of_pacing_run_free_to_the_setpoint_or_hold_writers_at_freerun() -> None:
    cache = WriteCache(400 * MIB, 200 * MIB)  # freerun 300, setpoint 350 MiB
    settled, free, held = _burst_s(cache), _burst_s(cache.unsettled()), _burst_s(cache.held())
    assert free < settled < held
    assert held == pytest.approx(0.5 * 300 / 500 + 200 / BASE_MIBPS, abs=0.3)  # the last 200 MiB at the volume's rate
    sim = simulate(Volume("st1", 500), [StageLoad("download", 2048 * MIB, floor_s=0.5)], cache=cache.held(),
                   baseline_only=True, dt=0.02, sample_every_s=1.0)
    assert max(s.dirty_bytes for s in sim.samples) <= cache.kernel_freerun_bytes + MIB


def test_balance_is_where_pos_ratio_reaches_a_ratio() -> None:
    cache = WriteCache(400 * MIB, 200 * MIB)  # freerun 300, setpoint 350 MiB
    assert cache.balance_bytes(1.0) == cache.setpoint_bytes
    assert (cache.balance_bytes(2.5), cache.balance_bytes(0.0)) == (cache.freerun_bytes, cache.limit_bytes)
    for ratio in (0.2, 0.7, 1.5):
        assert cache.pos_ratio(cache.balance_bytes(ratio)) == pytest.approx(ratio)


def test_a_new_containers_writer_is_held_past_the_setpoint_until_its_ratelimit_comes_down() -> None:
    """A fresh writeback context paces at INIT_BW x pos_ratio: the count climbs past the setpoint to where that
    equals the drain (pos_ratio 0.195 at st1's baseline: ~396 MiB of 400), then follows dirty_ratelimit down towards
    the setpoint over a few RATELIMIT_TAU_S."""
    cache = WriteCache(400 * MIB, 200 * MIB)
    balance = cache.balance_bytes(BASE_MIBPS * MIB / INIT_BW_BPS)
    assert 390 * MIB < balance < cache.limit_bytes
    long = simulate(Volume("st1", 500), [StageLoad("download", 4096 * MIB, floor_s=0.5)], cache=cache.fresh(),
                    baseline_only=True, dt=0.02, sample_every_s=1.0)
    early = [s.dirty_bytes for s in long.samples if s.t < 5]
    late = [s.dirty_bytes for s in long.samples if 5 * RATELIMIT_TAU_S < s.t < 6 * RATELIMIT_TAU_S]
    assert balance - 5 * MIB < max(early) <= balance + MIB
    # After 5 time constants dirty_ratelimit is within 1 % of the drain: pos_ratio 0.97, 0.3 of the way to the limit.
    assert cache.setpoint_bytes < min(late) < cache.setpoint_bytes + 20 * MIB < max(early) - 20 * MIB
    # Past the setpoint a burst ends sooner than the settled controller lets it, later than run free to the limit.
    fresh = _burst_s(cache.fresh())
    assert (500 - 400) / BASE_MIBPS < fresh < _burst_s(cache)
    with pytest.raises(ValueError, match="dirty_ratelimit"):
        through_cache(cache.fresh(), 350 * MIB, MIB, MIB)


def test_other_devices_dirty_pages_use_up_the_same_room() -> None:
    alone = _burst_s(WriteCache(400 * MIB, 200 * MIB))
    shared = _burst_s(WriteCache(400 * MIB, 200 * MIB, other_dirty_bytes=100 * MIB))
    # 100 MiB less room: 100 MiB more at the device's rate.
    assert shared - alone == pytest.approx(100 / BASE_MIBPS, rel=0.15)
    # A burst under freerun runs at memory speed (its floor) until others' pages take the room.
    assert _burst_s(WriteCache(1024 * MIB, 512 * MIB), 500) == pytest.approx(0.5, abs=0.05)
    assert _burst_s(WriteCache(1024 * MIB, 512 * MIB, other_dirty_bytes=400 * MIB), 500) > 3


def test_baseline_only_ignores_a_full_bucket() -> None:
    stage = StageLoad("download", write_bytes=GIB)
    sim = simulate(Volume("st1", 500), [stage], baseline_only=True, dt=0.05)
    assert sim.waves[0].stage_s["download"] == pytest.approx(1024 / BASE_MIBPS, rel=0.02)
    assert sim.credits_empty_at is None


REPEATING = [
    # A bucket that refills to full between rounds (a day of small rounds: the demo's plans).
    dict(volume=Volume("st1", 500), stages=[StageLoad("download", 64 * MIB, floor_s=2), StageLoad("upload", 0,
         read_bytes=8 * MIB, floor_s=1)], concurrency=2, waves=400, gap_s=60.0, cache=WriteCache(512 * MIB, 256 * MIB)),
    # A bucket that runs dry over the hours, then starts each round with what one stage earned.
    dict(volume=Volume("st1", 500), stages=[StageLoad("download", 2 * GIB, floor_s=10), StageLoad("process", 0,
         floor_s=20)], concurrency=2, waves=300, cache=WriteCache(0, 0)),
    # Rounds that keep their files: what is dirty at a round's end is written in the gap.
    dict(volume=Volume("sc1", 500), stages=[StageLoad("download", 300 * MIB, floor_s=3, random_share=0.2)],
         concurrency=3, waves=200, gap_s=120.0, cache=WriteCache(256 * MIB, 64 * MIB), removes_scratch=False),
    # A volume without a bucket, behind the instance's cap.
    dict(volume=Volume("gp3", 100), stages=[StageLoad("download", GIB, floor_s=4)], concurrency=4, waves=150,
         gap_s=30.0, cache=WriteCache(GIB, GIB // 2), instance_cap_bps=200 * MIB),
]


@pytest.mark.parametrize("case", REPEATING, ids=["refills", "runs-dry", "keeps-files", "no-bucket"])
def test_rounds_that_repeat_their_start_are_what_replaying_them_gives(case: dict[str, object]) -> None:
    """Every round's times, credits and durability, the day's end and its samples: the same whether the rounds that
    start as the previous one did are shifted copies or replayed."""
    shifted = simulate(**case)  # type: ignore[arg-type]
    replayed = simulate(**case, replay_every_wave=True)  # type: ignore[arg-type]
    assert len(shifted.waves) == len(replayed.waves)
    for ours, theirs in zip(shifted.waves, replayed.waves, strict=True):
        assert ours.index == theirs.index
        assert ours.started_at == pytest.approx(theirs.started_at, rel=1e-9, abs=1e-6)
        assert ours.credits_at_start == pytest.approx(theirs.credits_at_start, rel=1e-9, abs=1e-6)
        assert ours.stage_s == pytest.approx(theirs.stage_s, rel=1e-9, abs=1e-6)
        durable = theirs.durable_at
        assert ours.durable_at == (None if durable is None else pytest.approx(durable, rel=1e-9, abs=1e-6))
    empty = replayed.credits_empty_at
    assert shifted.credits_empty_at == (None if empty is None else pytest.approx(empty, rel=1e-9))
    assert shifted.ended_at == pytest.approx(replayed.ended_at, rel=1e-9)
    assert [s.t for s in shifted.samples] == pytest.approx([s.t for s in replayed.samples], rel=1e-9, abs=1e-6)
    assert [s.credits for s in shifted.samples] == pytest.approx([s.credits for s in replayed.samples], rel=1e-9,
                                                                  abs=1e-6)


def test_a_day_of_rounds_that_repeat_replays_three_of_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first round (a full bucket, a sample due at once), the second (a full bucket, a sample due 10 s in, as
    for every later round: they are the second shifted in time) and the last."""
    from tuning import simulator

    replayed: list[str] = []
    real = simulator._run_stage

    def counting(stage: StageLoad, *args: object, **kwargs: object) -> float:
        replayed.append(stage.name)
        return real(stage, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(simulator, "_run_stage", counting)
    case = REPEATING[0]
    result = simulate(**case)  # type: ignore[arg-type]
    assert len(result.waves) == case["waves"]
    assert replayed == ["download", "upload"] * 3
