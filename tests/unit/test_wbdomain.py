"""A child's own dirty thresholds, worked by hand from the kernel's formulas (mm/page-writeback.c:
mdtc_calc_avail, domain_dirty_limits; mm/memcontrol.c: mem_cgroup_wb_stats), in pages of 4 KiB."""

from __future__ import annotations

from pathlib import Path

from profiling.probes.wbdomain import (
    CgroupMemory,
    DirtySettings,
    HostDirtyState,
    cgroup_available,
    cgroup_thresholds,
    headroom,
    host_state,
)

PAGE = 4096
RATIOS = DirtySettings(ratio=30, background_ratio=20, bytes=0, background_bytes=0)


def test_the_host_domain_is_read_back_from_the_kernels_threshold_in_ratio_form() -> None:
    vmstat = {"nr_dirty_threshold": 150_000, "nr_dirty": 7_000, "nr_writeback": 3_000, "nr_free_pages": 1,
              "nr_active_file": 1, "nr_inactive_file": 1}
    host = host_state(vmstat, RATIOS, PAGE)
    assert host == HostDirtyState(dirtyable_bytes=500_000 * PAGE, dirty_bytes=10_000 * PAGE, exact=True)
    in_bytes = host_state(vmstat, DirtySettings(0, 0, 200 << 20, 100 << 20), PAGE)
    assert in_bytes.dirtyable_bytes == 3 * PAGE and not in_bytes.exact  # free + file: the reserves left in


def test_a_limited_cgroup_gets_its_file_pages_plus_its_headroom() -> None:
    host = HostDirtyState(500_000 * PAGE, 10_000 * PAGE, True)
    cgroup = CgroupMemory(file_bytes=50_000 * PAGE, dirty_bytes=20_000 * PAGE, headroom_bytes=30_000 * PAGE)
    # clean 30,000; the host's clean 490,000; others' clean 460,000; avail = 50,000 + min(30,000, 460,000).
    assert cgroup_available(cgroup, host) == 80_000 * PAGE
    thresholds = cgroup_thresholds(cgroup, host, RATIOS, PAGE)
    # Ratios in parts of a page: 30 % is 1,228/4,096 and 20 % 819/4,096, so 23,984 and 15,996 pages, not 24,000
    # and 16,000.
    assert (thresholds.dirty_bytes, thresholds.background_bytes) == (23_984 * PAGE, 15_996 * PAGE)


def test_without_a_limit_the_cgroup_may_use_the_hosts_other_clean_memory() -> None:
    host = HostDirtyState(500_000 * PAGE, 10_000 * PAGE, True)
    cgroup = CgroupMemory(file_bytes=50_000 * PAGE, dirty_bytes=20_000 * PAGE, headroom_bytes=None)
    assert cgroup_available(cgroup, host) == (50_000 + 460_000) * PAGE


def test_byte_settings_become_a_ratio_of_the_hosts_dirtyable_memory() -> None:
    host = HostDirtyState(500_000 * PAGE, 0, False)
    cgroup = CgroupMemory(file_bytes=50_000 * PAGE, dirty_bytes=20_000 * PAGE, headroom_bytes=30_000 * PAGE)
    settings = DirtySettings(ratio=0, background_ratio=0, bytes=200 << 20, background_bytes=100 << 20)
    thresholds = cgroup_thresholds(cgroup, host, settings, PAGE)
    # 200 MiB over 500,000 pages is 420/4,096 (rounded up), 100 MiB 210/4,096; of 80,000 pages: 8,203 and 4,101.
    assert (thresholds.dirty_bytes, thresholds.background_bytes) == (8_203 * PAGE, 4_101 * PAGE)


def test_a_background_threshold_at_or_over_the_threshold_is_half_of_it() -> None:
    host = HostDirtyState(500_000 * PAGE, 0, True)
    cgroup = CgroupMemory(file_bytes=40_000 * PAGE, dirty_bytes=0, headroom_bytes=0)
    thresholds = cgroup_thresholds(cgroup, host, DirtySettings(10, 20, 0, 0), PAGE)
    assert thresholds.background_bytes == thresholds.dirty_bytes // PAGE // 2 * PAGE


def test_the_headroom_is_the_tightest_limit_up_to_the_root(tmp_path: Path) -> None:
    root = tmp_path
    parent, child = root / "task", root / "task" / "job"
    child.mkdir(parents=True)
    for node, limit, high, current in ((parent, "1000000", "max", "600000"), (child, "900000", "800000", "100000")):
        (node / "memory.max").write_text(limit + "\n")
        (node / "memory.high").write_text(high + "\n")
        (node / "memory.current").write_text(current + "\n")
    # The child: min(900,000, 800,000) - 100,000 = 700,000; its parent: 1,000,000 - 600,000 = 400,000.
    assert headroom(child, root) == 400_000
    for name in ("memory.max", "memory.high"):
        (parent / name).write_text("max\n")
    assert headroom(child, root) == 700_000
    (child / "memory.max").write_text("max\n")
    (child / "memory.high").write_text("max\n")
    assert headroom(child, root) is None
