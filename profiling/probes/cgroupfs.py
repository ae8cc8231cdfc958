"""The child's own share of the device, of I/O stalls and of the page cache, from its cgroup v2.

On cgroup v2 (Amazon Linux 2023, the hosts this project deploys to) every container has a cgroup of its
own, and the kernel keeps three files there that attribute to the child what /proc/diskstats,
/proc/pressure/io and /proc/vmstat give for the whole device or host (Documentation/admin-guide/
cgroup-v2.rst):

- io.stat: per device "MAJ:MIN rbytes= wbytes= rios= wios= dbytes= dios=", cumulative. Writeback is
  charged to the cgroup that dirtied the pages ("Writeback" section), so a child's wbytes include the
  flushing of its own page cache, whoever flushes it. Keyed by the whole disk, never by a partition.
- io.pressure: PSI of the cgroup's own tasks, "some ... total=US" / "full ... total=US"
  (Documentation/accounting/psi.rst, "Cgroup2 interface"), the format of /proc/pressure/io.
- memory.stat: "file_dirty N" and "file_writeback N", in bytes, the cgroup's own pages.

On cgroup v1 (this machine) or without the controllers the files are absent and so are these figures,
with one notice: the device, PSI and page-cache figures are then host-wide only.

The parsers are pure; the readers at the bottom are the only code here that touches the file system.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from profiling.probes.cgroup import v2_mount, v2_path
from profiling.probes.procfs import Pressure, parse_pressure
from profiling.probes.wbdomain import Thresholds, own_thresholds

MAX_SEARCH_DEPTH = 5  # /ecs/<task>/<container> on ECS hosts, system.slice/docker-<id>.scope elsewhere
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class DeviceIo:
    """One device's line of io.stat: bytes and operations, cumulative."""

    read_bytes: int = 0
    write_bytes: int = 0
    read_ops: int = 0
    write_ops: int = 0


def parse_io_stat(text: str, device: str) -> DeviceIo | None:
    """The counters of `device` ("MAJ:MIN") in an io.stat, or None when the cgroup has not used it yet
    (the kernel lists a device only once the cgroup did I/O on it: then it did none)."""
    for line in text.splitlines():
        key, *pairs = line.split()
        if key != device:
            continue
        values = dict(pair.partition("=")[::2] for pair in pairs)
        return DeviceIo(*(int(values.get(k, 0)) for k in ("rbytes", "wbytes", "rios", "wios")))
    return None


def parse_memory_stat(text: str) -> tuple[int, int]:
    """(file_dirty, file_writeback) bytes from a memory.stat. Raises ValueError if either is missing."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, raw = line.partition(" ")
        if key in ("file_dirty", "file_writeback"):
            values[key] = int(raw)
    if len(values) < 2:
        raise ValueError("memory.stat has no file_dirty or file_writeback line")
    return values["file_dirty"], values["file_writeback"]


@dataclass(frozen=True)
class CgroupSample:
    """The cgroup's counters at one instant; a field is None when its file is absent."""

    io: DeviceIo | None
    pressure: Pressure | None
    dirty_bytes: int | None
    writeback_bytes: int | None
    thresholds: Thresholds | None = None  # its memory cgroup's own dirty thresholds (profiling/probes/wbdomain.py)


@dataclass(frozen=True)
class OwnCgroup:
    """The cgroup v2 directory of a child and the scratch disk's key in its io.stat."""

    path: Path
    disk: str | None  # "MAJ:MIN" of the whole disk behind scratch; None: no block device
    root: Path | None = None  # the hierarchy's root it was found under: its ancestors' limits count up to there

    def sample(self) -> CgroupSample:
        io = None
        if self.disk is not None:
            text = _read(self.path / "io.stat")
            # A cgroup that has not touched the disk yet has no line for it: it moved nothing.
            io = None if text is None else (parse_io_stat(text, self.disk) or DeviceIo())
        pressure_text = _read(self.path / "io.pressure")
        pressure = None
        if pressure_text is not None:
            try:
                pressure = parse_pressure(pressure_text)
            except ValueError:
                pressure = None
        dirty = writeback = None
        thresholds = None
        memory_text = _read(self.path / "memory.stat")
        if memory_text is not None:
            with contextlib.suppress(ValueError):  # no memory controller: no dirty figures
                dirty, writeback = parse_memory_stat(memory_text)
            if dirty is not None and writeback is not None and self.root is not None:
                thresholds = own_thresholds(self.path, self.root, memory_text, dirty + writeback, _PAGE_SIZE)
        return CgroupSample(io, pressure, dirty, writeback, thresholds)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def whole_disk(major: int, minor: int, sys_dev_block: Path = Path("/sys/dev/block")) -> str:
    """The "MAJ:MIN" of the disk holding device MAJ:MIN: a partition's parent (sysfs puts a partition's
    directory inside its disk's and gives it a `partition` file), else the device itself."""
    link = sys_dev_block / f"{major}:{minor}"
    try:
        if (link / "partition").exists():
            return (link.resolve().parent / "dev").read_text().strip()
    except OSError:
        pass
    return f"{major}:{minor}"


def _holds(directory: Path, pid: int) -> bool:
    text = _read(directory / "cgroup.procs")
    return text is not None and str(pid) in text.split()


def find_cgroup(pid: int, mounts: list[Path] | None = None, cgroup_text: str | None = None, *,
                host_mount: Path | None = None) -> Path | None:
    """The cgroup v2 directory holding `pid`, or None.

    Its path is the "0::" line of /proc/<pid>/cgroup, relative to the reader's cgroup namespace. Where
    that is the hierarchy's root (locally) it is the path under the mount. In a Batch task the profiler
    is a container of its own, so the job's path reads "/../<job container>" (outside the profiler's
    namespace, cgroup_namespaces(7)): then the directory is found by its last component under the host's
    hierarchy, which the job definition mounts read-only into the profiler (`host_mount`), and checked to
    hold the pid (cgroup.procs lists pids as the reader's pid namespace sees them: the task's, which the two
    containers share).
    """
    relative = v2_path(pid, cgroup_text)
    if relative is None:
        return None
    if mounts is None:
        own = v2_mount()
        mounts = [m for m in (own, host_mount) if m is not None and m.is_dir()]
    parts = [p for p in relative.split("/") if p]
    for mount in mounts:
        if ".." not in parts:
            candidate = mount.joinpath(*parts)
            if _holds(candidate, pid):
                return candidate
        tail = [p for p in parts if p != ".."]
        if not tail:
            continue
        for depth in range(MAX_SEARCH_DEPTH):
            for candidate in mount.glob("/".join(["*"] * depth + tail)):
                if _holds(candidate, pid):
                    return candidate
    return None


def own_cgroup(pid: int, major: int | None, minor: int | None,
               host_mount: Path | None = None) -> tuple[OwnCgroup | None, str]:
    """The child's cgroup for the per-child figures, and a notice when there is none to read."""
    path = find_cgroup(pid, host_mount=host_mount)
    if path is None:
        return None, (f"no cgroup v2 of process {pid} is readable (cgroup v1 host, or the host's hierarchy is "
                      "not mounted): device, io stall and dirty figures are device- or host-wide only")
    disk = None if major is None or minor is None else whole_disk(major, minor)
    roots = [m for m in (v2_mount(), host_mount) if m is not None and (m == path or m in path.parents)]
    cgroup = OwnCgroup(path, disk, max(roots, key=lambda m: len(m.parts)) if roots else None)
    if all(not (path / name).exists() for name in ("io.stat", "io.pressure", "memory.stat")):
        return None, (f"cgroup {path.name} has no io or memory controller files (cgroup v1 controllers on "
                      "this host): device, io stall and dirty figures are device- or host-wide only")
    return cgroup, missing_controllers_notice(path)


# What each controller's absence takes away. A controller's files appear in a cgroup only when its parent enables it
# in cgroup.subtree_control, all the way down from the root (Documentation/admin-guide/cgroup-v2.rst, "Enabling and
# Disabling"); io.pressure is there whatever is enabled (with PSI). On Amazon Linux 2023 the ECS agent puts each task
# in a systemd slice (ecstasks-<task>.slice, the systemd cgroup driver) that sets the task's memory and CPU limits, so
# memory is enabled down to the containers; io is enabled only where systemd or Docker enables it, which AWS does not
# document: where it is not, the profile says so instead of leaving the child's device bytes out silently.
_CONTROLLER_FILES = (("io", "io.stat", "own device bytes"),
                     ("memory", "memory.stat", "own dirty and writeback pages"))


def missing_controllers_notice(path: Path) -> str:
    """'' when the io and memory controllers' files are in the cgroup; else one line naming what is missing."""
    missing = [(name, figures) for name, file, figures in _CONTROLLER_FILES if not (path / file).exists()]
    if not missing:
        return ""
    names = " and ".join(name for name, _ in missing)
    figures = " and ".join(figures for _, figures in missing)
    return (f"cgroup {path.name} has no {names} controller files (not enabled in its parent's "
            f"cgroup.subtree_control, or held by a cgroup v1 hierarchy): the child's {figures} are absent")
