"""The always-on probe: kernel counters from /proc and /sys.

- /proc/<pid>/io of the job's process tree: bytes and calls, exact for any binary (Python, C, static Go).
- /proc/diskstats of the block device behind the scratch directory: ops, sectors, time, queue.
- /proc/vmstat: dirty and writeback pages, and the dirty thresholds (host-wide).
- /proc/pressure/io: PSI io stall totals (host-wide).

The parsers and the delta arithmetic are pure functions of text and numbers; the readers at the bottom
are the only code here that touches the file system.

A kernel fact the stage totals rely on: when a parent reaps a child, the child's io counters are added to
the parent's (signal->ioac), so /proc/<root>/io already includes every reaped descendant. A live or
zombie descendant is not yet in its parent's counters, so the tree total is root + every live
descendant, read parents first so that a child reaped between two reads is missed (then caught at the
next sample) rather than counted twice.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path

SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size
# The time fields of /proc/diskstats (ms reading, ms writing, io ticks, weighted ms) are printed as
# `unsigned int` (block/genhd.c, diskstats_show; Documentation/admin-guide/iostats.rst: "these counters
# may wrap"), so they wrap at 2^32 ms (49.7 days of busy time); ops and sectors are unsigned long.
TIME_FIELD_WRAP = 1 << 32


class DeviceError(ValueError):
    """A path given as the device to sample is unusable."""


class IoUnreadable(OSError):
    """/proc/<pid>/io of a process that exists could not be read (EACCES: a non-dumpable process or
    another user's; /proc/<pid>/io needs ptrace read access, proc(5))."""


@dataclass(frozen=True)
class ProcIo:
    """The seven counters of /proc/<pid>/io.

    rchar and wchar are the bytes the read and write calls moved (page cache, pipes, sockets included);
    the kernel's read_bytes and write_bytes are the bytes sent to or fetched from storage, named
    storage_read_bytes and storage_write_bytes here as in StageProfile.
    """

    rchar: int = 0
    wchar: int = 0
    syscr: int = 0
    syscw: int = 0
    storage_read_bytes: int = 0
    storage_write_bytes: int = 0
    cancelled_write_bytes: int = 0

    def __add__(self, other: ProcIo) -> ProcIo:
        return ProcIo(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: ProcIo) -> ProcIo:
        return ProcIo(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def elementwise_max(self, other: ProcIo) -> ProcIo:
        return ProcIo(*(max(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)))


# The kernel's name of each ProcIo counter in /proc/<pid>/io.
_PROC_IO_KEYS = {"storage_read_bytes": "read_bytes", "storage_write_bytes": "write_bytes"}


def parse_proc_io(text: str) -> ProcIo:
    """Parse /proc/<pid>/io. Raises ValueError if a counter is missing or not a number."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition(":")
        if sep:
            values[key.strip()] = int(raw)
    try:
        return ProcIo(**{f.name: values[_PROC_IO_KEYS.get(f.name, f.name)] for f in fields(ProcIo)})
    except KeyError as exc:
        raise ValueError(f"/proc/<pid>/io has no {exc.args[0]} line") from None


def sum_io(items: Iterable[ProcIo]) -> ProcIo:
    total = ProcIo()
    for item in items:
        total = total + item
    return total


def parse_stat_ppid(text: str) -> int:
    """The parent pid from /proc/<pid>/stat. The command name may hold spaces and ')', so split after
    the LAST ')'."""
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[1])


def parse_stat_cpu_ticks(text: str) -> int:
    """utime + stime (clock ticks) from /proc/<pid>/stat."""
    rest = text[text.rindex(")") + 2 :].split()
    # Fields after the comm: state(3) ppid(4) ... utime(14) stime(15): index = field - 3.
    return int(rest[11]) + int(rest[12])


def parse_stat_state(text: str) -> str:
    """The one-letter state (R, S, D, Z, X, ...) from /proc/<pid>/stat."""
    return text[text.rindex(")") + 2 :].split()[0]


def parse_stat_start_time(text: str) -> int:
    """starttime (clock ticks after boot, field 22) from /proc/<pid>/stat: with the pid it names one process,
    since a reused pid has a later start time."""
    rest = text[text.rindex(")") + 2 :].split()
    return int(rest[19])


def parse_mounts(text: str) -> dict[str, str]:
    """{mount point: file system type} (second and third fields) of /proc/<pid>/mounts, as the kernel writes
    them (octal escapes kept)."""
    return {parts[1]: parts[2] for parts in (line.split() for line in text.splitlines()) if len(parts) > 2}


def parse_mount_points(text: str) -> set[str]:
    """The mount points of /proc/<pid>/mounts (parse_mounts)."""
    return set(parse_mounts(text))


def parse_mem_available(text: str) -> int | None:
    """MemAvailable of /proc/meminfo in bytes, None when the line is not there."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


@dataclass(frozen=True)
class DiskStats:
    """One line of /proc/diskstats (the first 11 counters; discard and flush fields are not used)."""

    reads: int
    reads_merged: int
    sectors_read: int
    ms_reading: int
    writes: int
    writes_merged: int
    sectors_written: int
    ms_writing: int
    in_flight: int
    io_ticks_ms: int
    weighted_ms: int


def parse_diskstats(text: str, device: str) -> DiskStats | None:
    """The counters of `device` (a name such as 'vda', 'vda1' or 'loop3'), or None if it is not listed."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 14 and parts[2] == device:
            return DiskStats(*(int(v) for v in parts[3:14]))
    return None


@dataclass(frozen=True)
class DeviceFigures:
    """What a device did between two /proc/diskstats readings."""

    read_ops: int
    write_ops: int
    read_bytes: int
    write_bytes: int
    read_latency_ms: float | None  # None when no read completed
    write_latency_ms: float | None
    queue_depth: float  # average requests in flight
    utilization_pct: float


def device_delta(before: DiskStats, after: DiskStats, elapsed_s: float) -> DeviceFigures:
    """Figures over an interval, the way iostat derives them.

    Mean latency = time spent on completed requests / requests completed; queue depth = weighted time in
    queue / wall time; utilisation = time with at least one request in flight / wall time.
    """
    read_ops = after.reads - before.reads
    write_ops = after.writes - before.writes
    elapsed_ms = max(elapsed_s, 1e-9) * 1000.0

    def ms(field: str) -> int:  # a 32-bit time field's increase, across one wrap
        return (getattr(after, field) - getattr(before, field)) % TIME_FIELD_WRAP

    return DeviceFigures(
        read_ops=read_ops,
        write_ops=write_ops,
        read_bytes=(after.sectors_read - before.sectors_read) * SECTOR_BYTES,
        write_bytes=(after.sectors_written - before.sectors_written) * SECTOR_BYTES,
        read_latency_ms=ms("ms_reading") / read_ops if read_ops > 0 else None,
        write_latency_ms=ms("ms_writing") / write_ops if write_ops > 0 else None,
        queue_depth=ms("weighted_ms") / elapsed_ms,
        utilization_pct=min(100.0, 100.0 * ms("io_ticks_ms") / elapsed_ms),
    )


@dataclass(frozen=True)
class PageCache:
    """Host-wide page-cache levels from /proc/vmstat, in bytes."""

    dirty_bytes: int
    writeback_bytes: int
    dirty_threshold_bytes: int
    dirty_background_threshold_bytes: int


def parse_vmstat(text: str, page_size: int) -> PageCache:
    """Dirty and writeback levels and thresholds; /proc/vmstat counts pages."""
    wanted = ("nr_dirty", "nr_writeback", "nr_dirty_threshold", "nr_dirty_background_threshold")
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, raw = line.partition(" ")
        if key in wanted:
            values[key] = int(raw)
    missing = [k for k in wanted if k not in values]
    if missing:
        raise ValueError(f"/proc/vmstat has no {', '.join(missing)}")
    return PageCache(*(values[k] * page_size for k in wanted))


@dataclass(frozen=True)
class Pressure:
    """PSI io stall totals in microseconds since boot. `full_us` is None on kernels without it."""

    some_us: int
    full_us: int | None


def parse_pressure(text: str) -> Pressure:
    """Parse /proc/pressure/io: lines 'some avg10=.. avg60=.. avg300=.. total=US' and 'full ...'."""
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, raw = pair.partition("=")
            if key == "total":
                totals[kind] = int(raw)
    if "some" not in totals:
        raise ValueError("/proc/pressure/io has no 'some ... total=' line")
    return Pressure(totals["some"], totals.get("full"))


# ---- readers: the only part that touches /proc and /sys -------------------------------------------

PROC = Path("/proc")
SYS_DEV_BLOCK = Path("/sys/dev/block")


def read_proc_io(pid: int, proc: Path = PROC) -> ProcIo | None:
    """The counters of one process, or None if it is gone (or was never there).

    Raises IoUnreadable when it is there but its counters cannot be read: a figure built without them
    would be short, so the caller reports it as absent rather than as the process's."""
    path = proc / str(pid) / "io"
    try:
        return parse_proc_io(path.read_text())
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        if not (proc / str(pid)).exists():
            return None  # it exited while being read
        raise IoUnreadable(exc.errno, f"{path} is unreadable ({exc.strerror})") from None
    except ValueError as exc:
        raise IoUnreadable(0, f"{path} is not in the kernel's format ({exc})") from None


def pid_exists(pid: int, proc: Path = PROC) -> bool:
    return (proc / str(pid) / "io").exists()


def _children_from_task(pid: int, proc: Path) -> list[int] | None:
    """Children of every thread of `pid` (CONFIG_PROC_CHILDREN), or None if the kernel has no such file."""
    task_dir = proc / str(pid) / "task"
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return []
    children: list[int] = []
    for tid in tids:
        try:
            text = (task_dir / tid / "children").read_text()
        except FileNotFoundError:
            if not (task_dir / tid).exists():
                continue  # the thread exited between listdir and read
            return None
        except OSError:
            continue
        children.extend(int(c) for c in text.split())
    return children


def _parents_by_scan(proc: Path) -> dict[int, list[int]]:
    """parent pid -> children, from every /proc/<pid>/stat (the slow fallback)."""
    by_parent: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            ppid = parse_stat_ppid((proc / entry / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        by_parent.setdefault(ppid, []).append(int(entry))
    return by_parent


def process_tree(root: int, proc: Path = PROC) -> list[int]:
    """`root` and all its live descendants, parents before children (breadth first)."""
    order = [root]
    scan: dict[int, list[int]] | None = None
    index = 0
    while index < len(order):
        pid = order[index]
        index += 1
        children = None if scan is not None else _children_from_task(pid, proc)
        if children is None:
            if scan is None:
                scan = _parents_by_scan(proc)
            children = scan.get(pid, [])
        order.extend(c for c in children if c not in order)
    return order


def read_tree_io(root: int, proc: Path = PROC) -> tuple[ProcIo | None, int]:
    """(sum of the counters of root and its live descendants, number of processes read).

    None when the root itself is gone. Each process is read once, parents first (see module docstring).
    Raises IoUnreadable when any of them exists but cannot be read.
    """
    pids = process_tree(root, proc)
    root_io = read_proc_io(root, proc)
    if root_io is None:
        return None, 0
    total, count = root_io, 1
    for pid in pids[1:]:
        io = read_proc_io(pid, proc)
        if io is not None:
            total, count = total + io, count + 1
    return total, count


@dataclass(frozen=True)
class BlockDevice:
    """The block device behind a path, as /proc/diskstats names it."""

    name: str  # e.g. vda, vda1, loop3, nvme1n1
    major: int
    minor: int

    @property
    def dev(self) -> str:
        return f"{self.major}:{self.minor}"


def device_of(path: Path, sys_dev_block: Path = SYS_DEV_BLOCK) -> tuple[BlockDevice | None, str]:
    """The block device holding `path` (or the device node `path` itself), and a notice when there is none.

    Resolves st_dev (st_rdev for a device node) through /sys/dev/block/MAJ:MIN, which exists for whole
    disks, partitions, loop and device-mapper devices. overlay, tmpfs and other virtual file systems have
    an anonymous device (major 0) with no block device behind it: (None, notice).
    Raises DeviceError if `path` does not exist.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise DeviceError(f"device path {path} does not exist: give a directory on the scratch volume "
                          "or a block device such as /dev/nvme1n1") from None
    except OSError as exc:
        raise DeviceError(f"device path {path} is unreadable ({exc.strerror})") from None
    number = st.st_rdev if stat.S_ISBLK(st.st_mode) else st.st_dev
    major, minor = os.major(number), os.minor(number)
    link = sys_dev_block / f"{major}:{minor}"
    if not link.exists():
        return None, (f"{path} is on device {major}:{minor}, which is not a block device "
                      "(overlay, tmpfs or similar): device figures are not measured")
    return BlockDevice(link.resolve().name, major, minor), ""


def read_diskstats(device: str, proc: Path = PROC) -> DiskStats | None:
    try:
        return parse_diskstats((proc / "diskstats").read_text(), device)
    except OSError:
        return None


def read_page_cache(page_size: int | None = None, proc: Path = PROC) -> PageCache | None:
    try:
        return parse_vmstat((proc / "vmstat").read_text(), page_size or os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError):
        return None


def read_pressure(proc: Path = PROC) -> Pressure | None:
    """None where PSI is off (psi=0) or absent."""
    try:
        return parse_pressure((proc / "pressure" / "io").read_text())
    except (OSError, ValueError):
        return None


def read_cpu_ticks(pid: int, proc: Path = PROC) -> int | None:
    try:
        return parse_stat_cpu_ticks((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_process_state(pid: int, proc: Path = PROC) -> str | None:
    """The state letter of one process, or None if it is gone."""
    try:
        return parse_stat_state((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_start_time(pid: int, proc: Path = PROC) -> int | None:
    """The start time of one process (clock ticks after boot), or None if it is gone."""
    try:
        return parse_stat_start_time((proc / str(pid) / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None


def read_mounts(proc: Path = PROC) -> dict[str, str] | None:
    """{mount point: file system type} this process sees, or None if /proc/self/mounts is unreadable."""
    try:
        return parse_mounts((proc / "self" / "mounts").read_text())
    except OSError:
        return None


def read_mount_points(proc: Path = PROC) -> set[str] | None:
    """The mount points this process sees, or None if /proc/self/mounts is unreadable."""
    mounts = read_mounts(proc)
    return None if mounts is None else set(mounts)


def read_mem_available(proc: Path = PROC) -> int | None:
    """The memory available for new work (MemAvailable), or None if /proc/meminfo says nothing of it."""
    try:
        return parse_mem_available((proc / "meminfo").read_text(encoding="ascii"))
    except (OSError, ValueError, IndexError):
        return None
