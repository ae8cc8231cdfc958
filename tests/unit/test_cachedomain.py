"""A child's write cache on a cgroup v2 host is the lower of the host's domain and its container's: the advisor,
the simulator and DIRTY_PAUSE model both (tuning.cachedomain, with profiling.probes.wbdomain's formula)."""

from __future__ import annotations

import dataclasses

import pytest

from profiling.probes.wbdomain import CgroupMemory, DirtySettings, HostDirtyState, cgroup_thresholds
from tests.support.profiles import batch
from tuning.advise import advise, advise_cache
from tuning.cachedomain import CONTAINER, HOST, domains, host_bytes_for_child_limit
from tuning.ebs import GIB, MIB, Volume
from tuning.host import HostTuning
from tuning.instances import job_memory_mib
from tuning.plan import Plan, workload_from_profiles
from tuning.writecache import FRESH, UNSETTLED

STACK = HostTuning()  # the stack's dirtyRatio 30 / dirtyBackgroundRatio 20
JOB_GIB = job_memory_mib(2) / 1024  # 6.75: the job container of a 2-vCPU job
# An m6i.2xlarge with one child: its container is the tighter domain whatever the burst.
ONE_CHILD = Plan(jobs_per_instance=1, memory_gib=32, jobs_per_day=40, job_memory_gib=JOB_GIB)


def test_a_675_gib_child_on_a_32_gib_host_pauses_near_2_gib_not_9() -> None:
    d = domains(STACK, 32 * GIB, int(JOB_GIB * GIB), children=1)
    assert d.host.limit_bytes / GIB == pytest.approx(8.64, abs=0.01)  # 30 % of the host's dirtyable 28.8 GiB
    assert d.tighter == CONTAINER and d.child_limit_bytes / GIB == pytest.approx(0.3 * 6.75, abs=0.01)
    # The kernel's formula, one owner: the same as the profiler's own threshold for a child of that limit.
    own = cgroup_thresholds(CgroupMemory(0, 0, int(JOB_GIB * GIB)), HostDirtyState(int(28.8 * GIB), 0, False),
                            DirtySettings(30, 20, 0, 0))
    assert (d.container is not None and d.container.limit_bytes == own.dirty_bytes
            and d.container.background_bytes == own.background_bytes)
    # No memory limit: the host's alone, shared.
    assert domains(STACK, 32 * GIB, None, children=4).tighter == HOST


def test_four_children_share_the_host_and_each_meets_its_own() -> None:
    d = domains(STACK, 32 * GIB, int(JOB_GIB * GIB), children=4)
    # 4 x 2.03 GiB = 8.1 GiB under the host's 8.64: the containers pace them.
    assert d.tighter == CONTAINER and d.effective.limit_bytes == 4 * d.child_limit_bytes
    # A ratio or bytes reaches each child in proportion to its memory, so the host's is the tighter only where the
    # children's limits add up to more than the host's dirtyable memory (90 % of it here): 8 x 4 GiB on 32 GiB.
    over = domains(STACK, 32 * GIB, 4 * GIB, children=8)
    assert over.tighter == HOST and over.effective == over.host
    assert domains(STACK, 32 * GIB, int(3.5 * GIB), children=8).tighter == CONTAINER


def test_children_their_containers_pace_start_in_a_new_writeback_context() -> None:
    # The optimistic end of the advice's range: a new container's context where the containers pace the children, a
    # controller not yet settled where the host does.
    assert domains(STACK, 32 * GIB, int(JOB_GIB * GIB), children=4).optimistic.pacing == FRESH
    over = domains(STACK, 32 * GIB, 4 * GIB, children=8)
    assert over.optimistic == over.host.unsettled()
    assert domains(STACK, 32 * GIB, None, children=4).optimistic.pacing == UNSETTLED
    # On st1 the new context lets a burst through sooner than the settled controller; on a volume draining faster
    # than its 100 MiB/s it paces harder, and the advice's range still spans the point it prints.
    profiles = batch(images=100)  # 2.5 GiB a child: past its container's 1.7 GiB freerun point
    for volume in (Volume("st1", 500), Volume("gp3", 500, iops=16000, throughput_mibps=1000)):
        advice = advise(profiles, ONE_CHILD, [volume])
        low, high = advice.untuned_download_low_s, advice.untuned_download_high_s
        assert low is not None and high is not None and low <= advice.untuned_download_s <= high, (volume, advice)


def test_dirty_bytes_reach_a_child_in_proportion_to_its_memory() -> None:
    tuning = HostTuning(dirty_ratio=None, dirty_background_ratio=None, dirty_bytes=8 * GIB,
                        dirty_background_bytes=4 * GIB)
    d = domains(tuning, 32 * GIB, int(JOB_GIB * GIB), children=1)
    assert d.container is not None and d.container.limit_bytes / GIB == pytest.approx(8 * 6.75 / 28.8, abs=0.01)
    # The inverse: the host's bytes that give a child 3 GiB of its own.
    need = host_bytes_for_child_limit(3 * GIB, 32 * GIB, int(JOB_GIB * GIB))
    again = domains(dataclasses.replace(tuning, dirty_bytes=need, dirty_background_bytes=need // 2), 32 * GIB,
                    int(JOB_GIB * GIB), children=1)
    assert again.container is not None and again.container.limit_bytes == pytest.approx(3 * GIB, rel=0.001)


def test_the_simulated_download_pauses_at_the_containers_limit() -> None:
    profiles = batch(images=160)  # 4 GiB per child: past a 6.75 GiB child's 1.7 GiB freerun, under the host's 7.2
    host_only = advise(profiles, dataclasses.replace(ONE_CHILD, job_memory_gib=None))
    contained = advise(profiles, ONE_CHILD)
    assert contained.untuned_download_s > host_only.untuned_download_s * 1.5
    # The advised cache gives the child its own room: the host's dirty_bytes raised until 4 GiB x 1.1 / 0.75 fits
    # in the child's share (within 40 % of its 6.75 GiB? no: 5.9 GiB is more, so it does not fit and says so).
    cache = advise_cache(workload_from_profiles(profiles), ONE_CHILD)
    assert not cache.fits and "more memory per job (vcpusPerJob)" in cache.tradeoff
    small = advise_cache(workload_from_profiles(batch(images=40)), ONE_CHILD)  # 1 GiB: fits in 2.7 GiB of its own
    assert small.fits
    d = domains(small.tuning, 32 * GIB, int(JOB_GIB * GIB), children=1)
    assert d.child_limit_bytes >= 1000 * MIB * 1.1 / 0.75


def test_dirty_pause_names_the_container_and_its_fix() -> None:
    # Modelled: dirty levels at the freerun point, no own figures: the plan's model names the domain.
    found = {f.code: f for f in advise(batch(images=160, peak_dirty_bytes=int(3.5 * GIB)), ONE_CHILD).findings}
    pause = found["DIRTY_PAUSE"]
    assert pause.title.startswith("Writers paused by the container's dirty limit")
    assert "vcpusPerJob" in pause.fix and "max_bytes and strict_limit (Linux 6.2+" in pause.fix
    assert "6.1 has only max_ratio" in pause.fix and "is 2.02 GiB, the host's 8.64 GiB:" in pause.evidence
    # Without a memory limit the same run is the host's, and its fix the host's vm.dirty_*.
    host = {f.code: f for f in advise(batch(images=160, peak_dirty_bytes=int(3.5 * GIB)),
                                      dataclasses.replace(ONE_CHILD, job_memory_gib=None, memory_gib=8)).findings}
    assert host["DIRTY_PAUSE"].title.startswith("Writers paused by the host's dirty limit")
    assert host["DIRTY_PAUSE"].fix.startswith("raise the host's write cache to vm.dirty_bytes=")


def test_dirty_pause_reads_the_domain_from_the_profiles_own_thresholds() -> None:
    own = dict(dirty_throttle_ms=4_000.0, own_dirty_threshold_bytes=2 * GIB,
               own_dirty_background_threshold_bytes=GIB, own_peak_dirty_bytes=int(1.6 * GIB))
    plan = dataclasses.replace(ONE_CHILD, job_memory_gib=None)  # the model would say host: the profiles win
    pause = next(f for f in advise(batch(peak_dirty_bytes=GIB, **own), plan).findings if f.code == "DIRTY_PAUSE")
    assert "container's dirty limit" in pause.title and "107% of its container's freerun point" in pause.evidence
    own["own_peak_dirty_bytes"] = GIB // 4  # its own far from its limit, the host's at it
    pause = next(f for f in advise(batch(peak_dirty_bytes=int(3.5 * GIB), **own), plan).findings
                 if f.code == "DIRTY_PAUSE")
    assert "host's dirty limit" in pause.title


def test_a_job_bigger_than_the_host_is_refused() -> None:
    with pytest.raises(ValueError, match="job memory 40 GiB is not within the instance's 32 GiB"):
        dataclasses.replace(ONE_CHILD, job_memory_gib=40).validate()


def test_a_pause_measured_on_a_smaller_host_is_not_carried_to_a_plan_whose_children_have_room() -> None:
    # Measured on a host whose threshold was 0.36 GiB (the lab's 2 GiB of memory): paused 10 s per child. On an
    # m6i.2xlarge child (6.75 GiB, 2.02 GiB of its own under dirtyRatio 30) a 250 MiB burst passes without pauses.
    paused = batch(images=10, dirty_throttle_ms=10_000.0, dirty_threshold_bytes=int(0.36 * GIB),
                   dirty_background_threshold_bytes=int(0.18 * GIB))
    pause = next(f for f in advise(paused, ONE_CHILD).findings if f.code == "DIRTY_PAUSE")
    assert pause.severity == "info" and pause.cost_s_per_child is None
    assert pause.title.startswith("Writers paused by the run's dirty limit, not expected on the plan's hosts")
    assert "0.36 GiB of dirty room each" in pause.evidence
    assert "each gets 2.02 GiB (container's domain)" in pause.evidence
    assert pause.fix.startswith("none needed")
    # A plan whose children get less than the run's did: the pause stands, with its domain and knob.
    small = dataclasses.replace(ONE_CHILD, job_memory_gib=0.5, memory_gib=2)
    pause = next(f for f in advise(paused, small).findings if f.code == "DIRTY_PAUSE")
    assert pause.title.startswith("Writers paused by the container's dirty limit") and "vcpusPerJob" in pause.fix

