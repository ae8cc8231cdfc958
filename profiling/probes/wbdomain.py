"""A child's own write-cache limits: the dirty thresholds of its memory cgroup's writeback domain (cgroup v2).

A task in a memory cgroup meets two writeback domains, the host's and its cgroup's, and balance_dirty_pages()
paces it by whichever is nearer its limit (Documentation/admin-guide/cgroup-v2.rst, "Writeback": the dirty ratios
"apply the same to cgroup writeback with the amount of available memory capped by limits imposed by the memory
controller and system-wide clean memory"). This module computes the cgroup domain's thresholds as the kernel does
(Linux 6.1 and 6.12 alike, mm/page-writeback.c and mm/memcontrol.c):

- mem_cgroup_wb_stats(): the cgroup's file pages (active_file + inactive_file), its dirty and writeback pages, and
  its headroom, the least of min(memory.max, memory.high) - memory.current over the cgroup and its ancestors;
- mdtc_calc_avail(): available = file pages + min(headroom, the host's clean dirtyable memory not already the
  cgroup's own clean file pages);
- domain_dirty_limits(): threshold = dirty_ratio x available (background likewise). Byte settings cannot apply to
  a cgroup directly: vm.dirty_bytes is turned into a ratio of the host's dirtyable memory first, then applied. A
  background threshold at or above the threshold becomes half of it.

The host's dirtyable memory is free + file pages less the kernel's reserves; the reserves are not published, so
in ratio form it is read back from the kernel's own nr_dirty_threshold (threshold x 100 / ratio, exact but for
rounding) and in byte form it is free + file pages (an approximation that leaves the reserves in). The thresholds
are the kernel's "thresh"; its pacing "limit" follows thresh smoothly (hard_dirty_limit) and is not published.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MAX = "max"


@dataclass(frozen=True)
class HostDirtyState:
    """The host domain's inputs, in bytes: its dirtyable memory and its dirty + writeback pages."""

    dirtyable_bytes: int
    dirty_bytes: int  # nr_dirty + nr_writeback
    exact: bool  # dirtyable read back from the kernel's threshold (True) or free + file (False)


@dataclass(frozen=True)
class DirtySettings:
    """vm.dirty_ratio, vm.dirty_background_ratio, vm.dirty_bytes, vm.dirty_background_bytes (0 = not set)."""

    ratio: int
    background_ratio: int
    bytes: int
    background_bytes: int


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's inputs, in bytes: file pages, dirty + writeback pages, headroom to its tightest limit."""

    file_bytes: int
    dirty_bytes: int  # file_dirty + file_writeback
    headroom_bytes: int | None  # None: no limit on the way up (memory.max and memory.high "max")


@dataclass(frozen=True)
class Thresholds:
    dirty_bytes: int
    background_bytes: int


def host_state(vmstat: dict[str, int], settings: DirtySettings, page_size: int) -> HostDirtyState:
    """The host domain from /proc/vmstat counters (pages)."""
    dirty = (vmstat["nr_dirty"] + vmstat["nr_writeback"]) * page_size
    if settings.bytes == 0 and settings.ratio > 0:
        return HostDirtyState(vmstat["nr_dirty_threshold"] * 100 // settings.ratio * page_size, dirty, True)
    free_and_file = vmstat["nr_free_pages"] + vmstat["nr_active_file"] + vmstat["nr_inactive_file"]
    return HostDirtyState(free_and_file * page_size, dirty, False)


def cgroup_available(cgroup: CgroupMemory, host: HostDirtyState) -> int:
    """mdtc_calc_avail(): the memory the cgroup's dirty ratios apply to."""
    clean = cgroup.file_bytes - min(cgroup.file_bytes, cgroup.dirty_bytes)
    global_clean = host.dirtyable_bytes - min(host.dirtyable_bytes, host.dirty_bytes)
    other_clean = global_clean - min(global_clean, clean)
    headroom = other_clean if cgroup.headroom_bytes is None else min(cgroup.headroom_bytes, other_clean)
    return cgroup.file_bytes + headroom


def cgroup_thresholds(cgroup: CgroupMemory, host: HostDirtyState, settings: DirtySettings,
                      page_size: int = 4096) -> Thresholds:
    """domain_dirty_limits() for the cgroup's domain, in bytes (the kernel works in pages and per-page ratios)."""
    available = cgroup_available(cgroup, host) // page_size
    global_avail = max(1, host.dirtyable_bytes // page_size)
    # Ratios in parts of a page (ratio * PAGE_SIZE / 100), as the kernel keeps them for precision.
    ratio = settings.ratio * page_size // 100
    bg_ratio = settings.background_ratio * page_size // 100
    if settings.bytes:
        ratio = min(-(-settings.bytes // global_avail), page_size)
    if settings.background_bytes:
        bg_ratio = min(-(-settings.background_bytes // global_avail), page_size)
    thresh = ratio * available // page_size
    bg_thresh = bg_ratio * available // page_size
    if bg_thresh >= thresh:
        bg_thresh = thresh // 2
    return Thresholds(thresh * page_size, bg_thresh * page_size)


# ---- readers: the only code here that touches the file system ------------------------------------------


def parse_limit(text: str) -> int | None:
    """memory.max / memory.high: bytes, or None for "max"."""
    value = text.strip()
    return None if value == MAX else int(value)


def parse_file_pages(memory_stat: str) -> int:
    """active_file + inactive_file of a memory.stat, in bytes."""
    values = dict(line.split(" ", 1) for line in memory_stat.splitlines() if " " in line)
    return int(values["active_file"]) + int(values["inactive_file"])


def headroom(cgroup: Path, root: Path) -> int | None:
    """The least min(memory.max, memory.high) - memory.current over `cgroup` and its ancestors below `root`, the
    hierarchy's root (which has no limits); None when none of them has a limit."""
    least: int | None = None
    node = cgroup
    while node != root and root in node.parents:
        limits = [parse_limit((node / name).read_text()) for name in ("memory.max", "memory.high")]
        ceiling = min((v for v in limits if v is not None), default=None)
        if ceiling is not None:
            used = int((node / "memory.current").read_text())
            room = ceiling - min(ceiling, used)
            least = room if least is None else min(least, room)
        node = node.parent
    return least


def read_settings(proc_sys_vm: Path = Path("/proc/sys/vm")) -> DirtySettings:
    names = ("dirty_ratio", "dirty_background_ratio", "dirty_bytes", "dirty_background_bytes")
    return DirtySettings(*(int((proc_sys_vm / n).read_text()) for n in names))


def read_vmstat(proc: Path = Path("/proc")) -> dict[str, int]:
    wanted = {"nr_free_pages", "nr_active_file", "nr_inactive_file", "nr_dirty", "nr_writeback",
              "nr_dirty_threshold"}
    values = {}
    for line in (proc / "vmstat").read_text().splitlines():
        key, _, raw = line.partition(" ")
        if key in wanted:
            values[key] = int(raw)
    return values


def own_thresholds(cgroup: Path, root: Path, memory_stat: str, dirty_bytes: int, page_size: int) -> Thresholds | None:
    """The cgroup domain's thresholds now, or None when a file is missing (no memory controller down to it)."""
    try:
        settings = read_settings()
        host = host_state(read_vmstat(), settings, page_size)
        memory = CgroupMemory(parse_file_pages(memory_stat), dirty_bytes, headroom(cgroup, root))
    except (OSError, KeyError, ValueError):
        return None
    return cgroup_thresholds(memory, host, settings, page_size)
