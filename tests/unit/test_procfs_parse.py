"""Parsers and delta arithmetic of the procfs probe (the StageProfile builder is in test_sampler.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiling.probes.procfs import (
    DiskStats,
    PageCache,
    Pressure,
    ProcIo,
    device_delta,
    device_of,
    parse_diskstats,
    parse_mount_points,
    parse_pressure,
    parse_proc_io,
    parse_stat_cpu_ticks,
    parse_stat_ppid,
    parse_stat_start_time,
    parse_stat_state,
    parse_vmstat,
    process_tree,
    read_tree_io,
)

PROC_IO = """rchar: 6976
wchar: 40960000
syscr: 10
syscw: 10000
read_bytes: 4096
write_bytes: 40960000
cancelled_write_bytes: 8192
"""

DISKSTATS = """   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0
 254       0 vda 1000 10 80000 500 2000 30 160000 4000 2 3000 4500 0 0 0 0 10 5
 254       1 vda1 900 10 70000 400 1900 30 150000 3900 0 2900 4300 0 0 0 0 0 0
"""

VMSTAT = """nr_free_pages 100
nr_dirty 25
nr_writeback 3
nr_dirty_threshold 1209918
nr_dirty_background_threshold 604220
"""


def test_parse_proc_io_reads_all_seven_counters() -> None:
    assert parse_proc_io(PROC_IO) == ProcIo(6976, 40960000, 10, 10000, 4096, 40960000, 8192)


def test_parse_proc_io_names_a_missing_counter() -> None:
    with pytest.raises(ValueError, match="syscw"):
        parse_proc_io("rchar: 1\nwchar: 2\nsyscr: 3\n")


def test_proc_io_arithmetic() -> None:
    a, b = ProcIo(1, 2, 3, 4, 5, 6, 7), ProcIo(10, 1, 30, 1, 50, 1, 70)
    assert a + b == ProcIo(11, 3, 33, 5, 55, 7, 77)
    assert b - a == ProcIo(9, -1, 27, -3, 45, -5, 63)
    assert a.elementwise_max(b) == ProcIo(10, 2, 30, 4, 50, 6, 70)


def test_parse_stat_handles_spaces_and_parens_in_the_command_name() -> None:
    text = "4242 (evil ) (name) S 17 4242 17 0 -1 4194304 100 0 0 0 250 31 0 0 20 0 1 0 99 0 0"
    assert parse_stat_ppid(text) == 17
    assert parse_stat_cpu_ticks(text) == 281


def test_parse_diskstats_finds_disks_and_partitions() -> None:
    assert parse_diskstats(DISKSTATS, "vda") == DiskStats(1000, 10, 80000, 500, 2000, 30, 160000, 4000, 2, 3000,
                                                          4500)
    vda1 = parse_diskstats(DISKSTATS, "vda1")
    assert vda1 is not None and vda1.writes == 1900
    assert parse_diskstats(DISKSTATS, "vdb") is None


def test_device_delta_like_iostat() -> None:
    before = DiskStats(1000, 0, 80000, 500, 2000, 0, 160000, 4000, 0, 3000, 4500)
    after = DiskStats(1010, 0, 80080, 550, 2100, 0, 162048, 4800, 4, 3500, 6500)
    fig = device_delta(before, after, elapsed_s=1.0)
    assert (fig.read_ops, fig.write_ops) == (10, 100)
    assert (fig.read_bytes, fig.write_bytes) == (80 * 512, 2048 * 512)
    assert fig.read_latency_ms == pytest.approx(5.0)
    assert fig.write_latency_ms == pytest.approx(8.0)
    assert fig.queue_depth == pytest.approx(2.0)  # 2000 ms of request time in 1000 ms of wall time
    assert fig.utilization_pct == pytest.approx(50.0)


def test_device_delta_without_completions_has_no_latency_and_caps_utilisation() -> None:
    same = DiskStats(1, 0, 8, 1, 1, 0, 8, 1, 0, 0, 0)
    later = DiskStats(1, 0, 8, 1, 1, 0, 8, 1, 1, 5000, 0)
    fig = device_delta(same, later, elapsed_s=1.0)
    assert fig.read_latency_ms is None and fig.write_latency_ms is None
    assert fig.utilization_pct == 100.0


def test_parse_vmstat_converts_pages_to_bytes() -> None:
    assert parse_vmstat(VMSTAT, 4096) == PageCache(25 * 4096, 3 * 4096, 1209918 * 4096, 604220 * 4096)
    with pytest.raises(ValueError, match="nr_dirty_threshold"):
        parse_vmstat("nr_dirty 1\nnr_writeback 0\nnr_dirty_background_threshold 1\n", 4096)


def test_parse_pressure_some_and_full() -> None:
    text = ("some avg10=0.00 avg60=0.00 avg300=0.23 total=3987386\n"
            "full avg10=0.00 avg60=0.00 avg300=0.09 total=2151751\n")
    assert parse_pressure(text) == Pressure(3987386, 2151751)
    assert parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n") == Pressure(5, None)
    with pytest.raises(ValueError):
        parse_pressure("")


def _fake_proc(root: Path, tree: dict[int, int], io: dict[int, ProcIo]) -> Path:
    """A /proc without task/*/children files (like this kernel), so the /proc/*/stat scan is used."""
    for pid, ppid in tree.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (x y) S {ppid} 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n")
        if pid in io:
            c = io[pid]
            (d / "io").write_text(
                f"rchar: {c.rchar}\nwchar: {c.wchar}\nsyscr: {c.syscr}\nsyscw: {c.syscw}\nread_bytes: "
                f"{c.storage_read_bytes}\nwrite_bytes: {c.storage_write_bytes}\n"
                f"cancelled_write_bytes: {c.cancelled_write_bytes}\n")
    return root


def test_process_tree_by_stat_scan_is_parents_first(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {10: 1, 11: 10, 12: 10, 13: 11, 99: 1}, {})
    order = process_tree(10, proc)
    assert sorted(order) == [10, 11, 12, 13]
    assert order[0] == 10 and order.index(11) < order.index(13)


def test_process_tree_uses_task_children_when_present(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, {10: 1, 11: 10, 12: 11}, {})
    (proc / "10" / "task" / "10" / "children").write_text("11 ")
    (proc / "11" / "task" / "11" / "children").write_text("12")
    (proc / "12" / "task" / "12" / "children").write_text("")
    assert process_tree(10, proc) == [10, 11, 12]


def test_read_tree_io_sums_live_descendants_and_skips_vanished_ones(tmp_path: Path) -> None:
    io = {10: ProcIo(1, 2, 3, 4, 0, 0, 0), 11: ProcIo(10, 20, 30, 40, 0, 0, 0)}
    proc = _fake_proc(tmp_path, {10: 1, 11: 10, 12: 10}, io)  # 12 has no io file: exited meanwhile
    total, count = read_tree_io(10, proc)
    assert total == ProcIo(11, 22, 33, 44, 0, 0, 0) and count == 2
    assert read_tree_io(77, proc) == (None, 0)


def test_device_of_errors_and_notices(tmp_path: Path) -> None:
    from profiling.probes.procfs import DeviceError

    with pytest.raises(DeviceError, match="does not exist"):
        device_of(tmp_path / "nope")
    device, notice = device_of(tmp_path, sys_dev_block=tmp_path / "empty")
    assert device is None and "not a block device" in notice


def test_parse_stat_state_and_start_time_after_the_command_name() -> None:
    text = "4242 (evil ) (name) S 17 4242 17 0 -1 4194304 100 0 0 0 250 31 0 0 20 0 1 0 99 0 0"
    assert parse_stat_state(text) == "S"
    assert parse_stat_start_time(text) == 99
    assert parse_stat_state(text.replace(") S ", ") Z ")) == "Z"


def test_parse_mount_points_takes_the_second_field() -> None:
    text = "sysfs /sys sysfs rw 0 0\n/dev/loop3 /srv/lab/mnt xfs rw,noatime 0 0\n\n"
    assert parse_mount_points(text) == {"/sys", "/srv/lab/mnt"}
    from profiling.probes.procfs import parse_mem_available, parse_mounts

    assert parse_mounts(text) == {"/sys": "sysfs", "/srv/lab/mnt": "xfs"}
    assert parse_mem_available("MemTotal: 10 kB\nMemAvailable:  2048 kB\n") == 2048 * 1024
    assert parse_mem_available("MemTotal: 10 kB\n") is None


def test_whole_disk_is_a_partitions_disk_as_block_requests_name_it(tmp_path: Path) -> None:
    import os

    from profiling.probes.disk import whole_disk

    st = os.stat(tmp_path)
    here = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    disk = tmp_path / "devices" / "nvme1n1"
    (disk / "nvme1n1p1").mkdir(parents=True)
    (disk / "dev").write_text("259:0\n")
    (disk / "nvme1n1p1" / "dev").write_text(here + "\n")
    (disk / "nvme1n1p1" / "partition").write_text("1\n")
    links = tmp_path / "dev-block"
    links.mkdir()
    (links / here).symlink_to(disk / "nvme1n1p1")
    assert whole_disk(tmp_path, sys_dev_block=links) == (259, 0)
    (disk / "nvme1n1p1" / "partition").unlink()  # a whole disk is itself
    assert whole_disk(tmp_path, sys_dev_block=links) == (os.major(st.st_dev), os.minor(st.st_dev))
    assert whole_disk(tmp_path, sys_dev_block=tmp_path / "empty") is None  # tmpfs, overlay: no disk
