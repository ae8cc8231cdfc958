"""The child's own figures from its cgroup v2, read from files in the kernel's formats (tests/fixtures/cgroup2)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from profiling.metrics import METRICS_BY_NAME, StageProfile, summarize
from profiling.probes.cgroupfs import DeviceIo, OwnCgroup, find_cgroup, parse_io_stat, parse_memory_stat
from profiling.probes.procfs import BlockDevice, DiskStats, ProcIo
from profiling.sampler import Snapshot, build_profile

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup2"
CHILD_A = "ecs/0c2e5b6f8e2a4d1f9b7c3a1e5d6f7a8b/0c2e5b6f8e2a4d1f9b7c3a1e5d6f7a8b-1845672901"
CHILD_B = "ecs/9a1d7c3e2b4f4e6a8c0d1e2f3a4b5c6d/9a1d7c3e2b4f4e6a8c0d1e2f3a4b5c6d-3321907145"
MIB = 1 << 20
SCRATCH = BlockDevice("nvme1n1", 259, 1)


def test_io_stat_gives_the_scratch_disks_line_and_nothing_for_a_disk_not_used_yet() -> None:
    text = (FIXTURES / "end" / CHILD_A / "io.stat").read_text()
    assert parse_io_stat(text, "259:1") == DeviceIo(0, 69382144, 0, 603)
    assert parse_io_stat(text, "259:0") == DeviceIo(48156672, 0, 392, 0)
    assert parse_io_stat((FIXTURES / "start" / CHILD_B / "io.stat").read_text(), "259:1") is None


def test_memory_stat_gives_the_cgroups_dirty_and_writeback_bytes() -> None:
    assert parse_memory_stat((FIXTURES / "mid" / CHILD_B / "memory.stat").read_text()) == (184549376, 25165824)
    with pytest.raises(ValueError, match="file_dirty"):
        parse_memory_stat("anon 1\nfile 2\n")


def test_the_job_is_found_from_outside_its_cgroup_namespace(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "start", tmp_path, dirs_exist_ok=True)
    container = CHILD_A.rsplit("/", 1)[1]
    # The profiler is a container of its own: the job's path is relative to the profiler's namespace root.
    assert find_cgroup(1, [tmp_path], f"0::/../{container}\n") == tmp_path / CHILD_A
    assert find_cgroup(1, [tmp_path], f"0::/{CHILD_B}\n") == tmp_path / CHILD_B
    assert find_cgroup(2, [tmp_path], f"0::/{CHILD_B}\n") is None  # pid 2 is not in it
    assert find_cgroup(1, [tmp_path], "0::/../no-such-container\n") is None


def _child_profile(tmp_path: Path, child: str, disk: list[DiskStats], sharers: int) -> StageProfile:
    """One child's stage sampled from its cgroup files at the start, middle and end (copied in turn)."""
    own = OwnCgroup(tmp_path / child, "259:1")
    snaps = []
    for mono, (phase, stats) in enumerate(zip(("start", "mid", "end"), disk, strict=True)):
        shutil.copytree(FIXTURES / phase / child, tmp_path / child, dirs_exist_ok=True)
        snaps.append(Snapshot(float(mono), ProcIo(), stats, None, None, own=own.sample(), sharers=sharers))
    return build_profile(stage="process", outcome="ok", started_at=0.0, snapshots=snaps, device=SCRATCH)


def test_two_children_writing_to_one_device_each_get_their_own_bytes(tmp_path: Path) -> None:
    # The device saw both children's 320 MiB plus the file system's own journal writes, whichever child's
    # window it is read in; each child's cgroup saw its own writes and their writeback.
    def disk(sectors: int) -> DiskStats:
        return DiskStats(0, 0, 0, 0, sectors // 256, 0, sectors, sectors // 512, 0, 0, 0)

    device = [disk(0), disk(330 * MIB // 512), disk(330 * MIB // 512)]
    a = _child_profile(tmp_path, CHILD_A, device, sharers=2)
    b = _child_profile(tmp_path, CHILD_B, device, sharers=2)
    assert a.own_device_write_bytes == pytest.approx(64 * MIB, rel=0.10)
    assert b.own_device_write_bytes == pytest.approx(256 * MIB, rel=0.10)
    assert a.device_write_bytes == b.device_write_bytes == 330 * MIB
    assert a.device_sharers == b.device_sharers == 2
    assert a.own_peak_dirty_bytes == 40 * MIB and b.own_peak_writeback_bytes == 24 * MIB
    assert b.own_io_stall_ms == pytest.approx((2650339 - 988) / 1000)
    assert a.sources["own"] == "cgroup v2"
    row = summarize([a, b])["process"]
    # The children's own bytes add up; the device's are counted once, never twice.
    assert row["OwnDeviceWriteBytes"] == a.own_device_write_bytes + b.own_device_write_bytes
    assert row["DeviceWriteBytes"] == 330 * MIB and row["DeviceSharers"] == 2
    assert METRICS_BY_NAME["DeviceWriteBytes"].scope_note == "device"


def test_without_a_cgroup_v2_the_own_figures_are_absent_not_zero(tmp_path: Path) -> None:
    empty = OwnCgroup(tmp_path, "259:1")  # a directory without the controllers' files (cgroup v1 host)
    snaps = [Snapshot(t, ProcIo(), None, None, None, own=empty.sample()) for t in (0.0, 1.0)]
    profile = build_profile(stage="process", outcome="ok", started_at=0.0, snapshots=snaps, device=None)
    assert profile.own_device_write_bytes is None and profile.own_io_stall_ms is None
    assert profile.own_peak_dirty_bytes is None and "own" not in profile.sources


def test_a_missing_controller_is_named_in_one_notice(tmp_path: Path) -> None:
    from profiling.probes.cgroupfs import missing_controllers_notice

    (tmp_path / "io.pressure").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    (tmp_path / "memory.stat").write_text("file_dirty 0\nfile_writeback 0\n")
    assert missing_controllers_notice(tmp_path) == (
        f"cgroup {tmp_path.name} has no io controller files (not enabled in its parent's cgroup.subtree_control, or "
        "held by a cgroup v1 hierarchy): the child's own device bytes are absent")
    (tmp_path / "io.stat").write_text("")
    assert missing_controllers_notice(tmp_path) == ""
    (tmp_path / "memory.stat").unlink()
    assert "no memory controller files" in missing_controllers_notice(tmp_path)
