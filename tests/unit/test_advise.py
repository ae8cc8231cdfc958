"""The advisor: profiles + plan -> volume, write cache, mount options and CDK context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiling.metrics import StageProfile
from tuning.advice_text import render
from tuning.advise import (
    advise,
    advise_cache,
    load_profiles,
    profiles_from_emf,
)
from tuning.ebs import GIB, MIB, Volume
from tuning.host import HostTuning
from tuning.plan import MIN_SHARE_DEVICE_BYTES, AdviseError, Plan, workload_from_profiles
from tuning.prices import PRICES_AS_OF


def case_study_profiles(children: int = 4, image_mib: int = 64, images: int = 5, download_s: float = 12.0,
                        process_s: float = 20.0) -> list[StageProfile]:
    """Children that each download `images` images, process them and upload a small shard."""
    size = images * image_mib * MIB
    out: list[StageProfile] = []
    for i in range(children):
        props = {"ArrayIndex": str(i)}
        out += [
            StageProfile("download", "ok", 0.0, download_s, read_bytes=size, write_bytes=size, storage_write_bytes=size,
                         device_write_bytes=size, device_write_ops=size // MIB, io_stall_some_ms=2000.0,
                         properties=props),
            StageProfile("process", "ok", download_s, process_s, read_bytes=size, write_bytes=size // 8,
                         storage_write_bytes=size // 8, properties=props),
            StageProfile("upload", "ok", download_s + process_s, 3.0, read_bytes=size // 8, write_bytes=size // 8,
                         properties=props),
        ]
    return out


def test_workload_takes_median_child_and_subtracts_io_stall() -> None:
    workload = workload_from_profiles(case_study_profiles())
    download = workload.stage("download")
    assert download is not None
    assert download.write_bytes == 320 * MIB
    assert download.io_size == MIB
    assert download.floor_s == pytest.approx(10.0)  # 12 s minus 2 s of io stall
    upload = workload.stage("upload")
    assert upload is not None and upload.write_bytes == 0  # wchar of upload is the network
    assert workload.children == 4
    assert any("process" in n for n in workload.notes)  # no device figures: 1 MiB assumed


def test_the_floor_takes_the_most_specific_wait_there_is() -> None:
    # A 12 s download during which the host's PSI counted 9 s of io stall (other tenants' included) but the
    # child's writers were paused 2 s (eBPF): the volume cost the child 2 s, not 9.
    def floor(**waits: float | None) -> float:
        p = StageProfile("download", "ok", 0.0, 12.0, write_bytes=MIB, storage_write_bytes=MIB, **waits)
        stage = workload_from_profiles([p]).stage("download")
        assert stage is not None
        return stage.floor_s

    assert floor(io_stall_some_ms=9000.0, dirty_throttle_ms=2000.0) == pytest.approx(10.0)
    assert floor(io_stall_some_ms=9000.0, dirty_throttle_ms=2000.0, own_io_stall_ms=3000.0) == pytest.approx(9.0)
    assert floor(io_stall_some_ms=9000.0) == pytest.approx(3.0)
    assert floor(io_stall_some_ms=None) == pytest.approx(12.0)
    # Only the host-wide measure is held to a tenth of the duration; the child's own are taken as they are
    # (the lab's default runs: writers paused 24 s of a 25 s download, a floor of 1 s, not 2.5).
    assert floor(io_stall_some_ms=11_900.0) == pytest.approx(1.2)
    assert floor(io_stall_some_ms=11_900.0, dirty_throttle_ms=11_000.0) == pytest.approx(1.0)
    assert floor(own_io_stall_ms=11_500.0) == pytest.approx(0.5)
    # Of the child's own two, the larger wait: the lab's download paused 8.7 s by the dirty limit had 7.9 s of its own
    # io stall; the same download unpaused took 0.5 s, not 1.3.
    assert floor(own_io_stall_ms=7_900.0, dirty_throttle_ms=8_700.0) == pytest.approx(3.3)
    assert floor(own_io_stall_ms=8_700.0, dirty_throttle_ms=7_900.0) == pytest.approx(3.3)


def test_the_random_share_is_the_profiles_unless_given() -> None:
    def download(pcts: list[float | None], random_pct: float | None = None,
                 device_bytes: int = 32 * MIB) -> tuple[float, tuple[str, ...]]:
        profiles = [StageProfile("download", "ok", 0.0, 10.0, write_bytes=MIB, storage_write_bytes=MIB,
                                 device_write_bytes=device_bytes, device_random_pct=pct) for pct in pcts]
        workload = workload_from_profiles(profiles, random_pct=random_pct)
        stage = workload.stage("download")
        assert stage is not None
        return stage.random_share, workload.notes

    share, notes = download([10.0, 30.0, 20.0])
    assert share == pytest.approx(0.2) and not any("random" in n for n in notes)  # the median child's
    assert download([10.0, 30.0], random_pct=80)[0] == pytest.approx(0.8)  # --random-pct overrides
    share, notes = download([None, None])  # no eBPF probe: sequential, said once
    assert share == 0.0 and sum("random" in n for n in notes) == 1
    # A stage that moved a few requests' worth says nothing of its pattern (the share is the device's).
    share, notes = download([100.0, 90.0], device_bytes=MIN_SHARE_DEVICE_BYTES - 1)
    assert share == 0.0 and sum("random" in n for n in notes) == 1
    assert download([100.0, 90.0], device_bytes=MIN_SHARE_DEVICE_BYTES)[0] == pytest.approx(0.95)


def test_no_successful_profiles_is_a_clear_error() -> None:
    failed = [StageProfile("download", "failed", 0.0, 1.0)]
    with pytest.raises(AdviseError, match="no successful stage profiles"):
        workload_from_profiles(failed)


def test_cache_is_sized_from_the_burst_and_memory() -> None:
    workload = workload_from_profiles(case_study_profiles())
    plan = Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=100)
    cache = advise_cache(workload, plan)
    burst = 4 * 320 * MIB
    assert cache.burst_bytes == burst
    limit = cache.tuning.dirty_bytes
    background = cache.tuning.dirty_background_bytes
    assert limit is not None and background is not None
    # Writers run free up to (limit + background) / 2, which must hold the burst with room to spare.
    assert (limit + background) // 2 >= burst * 1.1
    assert cache.fits
    assert cache.tuning.dirty_ratio is None  # bytes form only
    assert "Spot" in cache.tradeoff and "memory" in cache.tradeoff


def test_cache_capped_by_memory_budget_says_so() -> None:
    workload = workload_from_profiles(case_study_profiles(image_mib=256))
    plan = Plan(jobs_per_instance=4, memory_gib=4, jobs_per_day=100, cache_budget_pct=40)
    cache = advise_cache(workload, plan)
    assert not cache.fits
    assert cache.tuning.dirty_bytes is not None
    assert cache.tuning.dirty_bytes <= int(4 * GIB * 0.4) + MIB
    assert "memory budget" in cache.tradeoff


def test_advice_recommends_and_prints_cdk_context() -> None:
    plan = Plan(jobs_per_instance=4, memory_gib=16, jobs_per_day=400, kernel_release="6.1.0-18-amd64")
    candidates = [Volume("st1", 125), Volume("st1", 500), Volume("gp3", 200)]
    advice = advise(case_study_profiles(), plan, candidates)
    assert advice.recommended.volume in candidates
    ctx = advice.context
    assert ctx["volumeType"] == advice.recommended.volume.kind
    assert ctx["volumeSizeGiB"] == str(advice.recommended.volume.size_gib)
    assert ctx["dirtyBytes"] == str(advice.cache.tuning.dirty_bytes)
    assert ctx["dirtyRatio"] == "none"
    # The context round-trips through the stack's readers: the volume keys beside the host keys.
    assert HostTuning.from_context(ctx) == advice.cache.tuning
    assert ctx == {**advice.recommended.volume.to_context(), **advice.cache.tuning.to_context()}
    assert Volume.from_context(ctx).to_context() == advice.recommended.volume.to_context()
    assert advice.cdk_args.startswith("-c volumeType=")
    body = advice.to_json()
    json.dumps(body)
    assert body["prices"] == {"region": "us-east-1", "as_of": PRICES_AS_OF}
    text = render(advice)
    assert "Recommended volume" in text and "cdk deploy -c" in text and "Durability" in text


def test_small_st1_runs_out_of_credits_under_heavy_load() -> None:
    # 4 jobs x 1,280 MiB, more than an 8 GiB instance's cache holds, 2,400 a day: far above a 125 GiB st1's
    # 4.9 MiB/s baseline. (A burst the cache holds need not reach the volume: each job removes its scratch, and
    # what is still dirty then is dropped, never written: tests/unit/test_simulator.py.)
    plan = Plan(jobs_per_instance=4, memory_gib=8, jobs_per_day=4 * 600)
    advice = advise(case_study_profiles(images=20), plan, [Volume("st1", 125), Volume("st1", 2048)])
    small, big = advice.candidates
    assert small.credits_run_out_h is not None and small.credits_run_out_h < 24
    assert small.steady_download_s > small.download_s * 2
    assert big.credits_run_out_h is None
    assert advice.recommended is big
    assert "runs dry" in render(advice) or "never runs dry" in render(advice)


def test_default_cache_is_slower_than_tuned_for_a_big_burst() -> None:
    # 4 x 500 MiB burst on a 8 GiB instance, arriving at 1,000 MiB/s (2 s without the io stall).
    profiles = case_study_profiles(image_mib=100, download_s=4.0)
    plan = Plan(jobs_per_instance=4, memory_gib=8, jobs_per_day=100)
    advice = advise(profiles, plan, [Volume("st1", 500)])
    assert advice.untuned_download_s > advice.recommended.download_s * 2


def test_a_burst_just_past_the_default_freerun_point_is_advised_as_a_range() -> None:
    """2 x 240 MiB on a 3 GiB instance: the kernel's default cache starts pacing at ~415 MiB, its setpoint is ~484:
    how long the untuned download takes depends on the state of the pacing controller, so the advice gives the range
    from one not yet settled to one that holds writers at the freerun point (measured in the lab at baseline: 0.6 to
    4.2 s where the settled model says 2.7). A burst twice the limit is paced whichever: no range."""
    plan = Plan(jobs_per_instance=2, memory_gib=3, jobs_per_day=100)
    advice = advise(case_study_profiles(children=2, image_mib=20, images=12, download_s=0.6), plan,
                    [Volume("st1", 500)])
    assert advice.untuned_download_low_s is not None
    assert advice.untuned_download_low_s < 0.5 * advice.untuned_download_s
    high = advice.untuned_download_high_s
    assert high is not None and high > advice.untuned_download_s
    text = render(advice)
    assert f"({advice.untuned_download_low_s:,.1f}-{high:,.1f} s: the burst ends" in text
    body = json.loads(json.dumps(advice.to_json()))
    assert (body["untuned_download_low_s"], body["untuned_download_high_s"]) == \
        (round(advice.untuned_download_low_s, 1), round(high, 1))
    big = advise(case_study_profiles(children=2, image_mib=100, images=12, download_s=4.0), plan,
                 [Volume("st1", 500)])
    assert "the burst ends" not in render(big)


@pytest.mark.parametrize(
    ("plan", "message"),
    [(Plan(0, 16, 10), "jobs per instance"), (Plan(1, 0, 10), "memory"), (Plan(1, 16, 0), "jobs per day")],
)
def test_bad_plans(plan: Plan, message: str) -> None:
    with pytest.raises(AdviseError, match=message):
        advise(case_study_profiles(), plan)


def test_bad_kernel_release_is_refused() -> None:
    from tuning.host import HostTuningError

    with pytest.raises(HostTuningError):
        advise(case_study_profiles(), Plan(1, 16, 10, kernel_release="banana"))


DIRECTIVE = [{"Namespace": "IoBatch", "Dimensions": [["Pipeline", "Stage"]], "Metrics": []}]


def test_emf_documents_become_profiles() -> None:
    doc = {"_aws": {"Timestamp": 1_700_000_000_000, "CloudWatchMetrics": DIRECTIVE}, "Pipeline": "iobatch",
           "Stage": "download", "StageDuration": 12.5, "WriteBytes": 1000, "StorageWriteBytes": 900,
           "PeakDirtyBytes": [5000], "IoStallSome": 100.0, "JobId": "j"}
    (profile,) = profiles_from_emf([doc, {"not": "emf"}])
    assert profile.stage == "download" and profile.duration_s == 12.5
    assert profile.storage_write_bytes == 900 and isinstance(profile.storage_write_bytes, int)
    assert profile.peak_dirty_bytes == 5000
    # The emitter stamps a document with the stage's end (profiling.emf.emit_profile).
    assert profile.started_at == 1_700_000_000.0 - 12.5
    assert profile.properties["JobId"] == "j"


def test_load_profiles_from_run_dir_jsonl_and_emf(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "profiles").mkdir(parents=True)
    lines = [json.dumps(p.to_dict()) for p in case_study_profiles(children=1)]
    (run / "profiles" / "part-00000.jsonl").write_text("\n".join(lines) + "\n")
    assert len(load_profiles([run])) == 3
    emf = tmp_path / "x.emf"
    doc = {"_aws": {"CloudWatchMetrics": DIRECTIVE}, "Stage": "upload", "StageDuration": 1}
    emf.write_text("some log line\n" + json.dumps(doc) + "\n")
    assert [p.stage for p in load_profiles([emf])] == ["upload"]
    with pytest.raises(AdviseError, match="does not exist"):
        load_profiles([tmp_path / "missing"])
    with pytest.raises(AdviseError, match="no profiles"):
        load_profiles([])
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises((AdviseError, ValueError)):
        load_profiles([bad])
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdviseError, match="run directory"):
        load_profiles([tmp_path / "empty"])
