"""One copy of the eBPF programs per host, shared by every profiler on it: pins in bpffs under a lock.

Why pins and not a host service: a pin needs nothing started on the host but bpffs (mounted at boot by
systemd on Amazon Linux 2023, and bind-mounted into the profiler's container), so `iobatch profile` on a
laptop, the local run and a Batch task share programs the same way, with no daemon to deploy, version or
keep alive; and the kernel itself tells a dead profiler (its lock is dropped with its last descriptor).

    <root>/                    the host lock: flock(2) on this directory for every join and leave (never removed)
    <root>/<digest>/           one build of the object (sha256 of iobatch.bpf.o): two builds never share maps
        link_<program>         the attached programs (a pinned link stays attached while its pin exists)
        map_<name>             the maps every profiler needs: selection, host, disks and the slot_* maps of maps
        prog_iob_find_task     the task finder (an iterator, run under the host lock)
        slots/<n>/             one per live profiler: it holds flock(LOCK_EX) on the directory while it lives
    (bpffs refuses names with a dot: kernel/bpf/inode.c, bpf_lookup)

A profiler joins under the lock: reaps the slots whose lock nobody holds (their profiler died: SIGKILL
included), loads and pins the programs if no profiler has, takes the lowest free slot, makes its own maps
(ebpf_maps.slot_maps: their memory is its own, charged to its cgroup) and puts them at its slot of the slot_*
maps of maps. It leaves under the lock: takes its maps and selection out, frees its slot, and the last one out
removes the pins, so no program stays loaded. A profiler killed with SIGKILL cannot: a watchdog it started
(profiling/probes/ebpf_watchdog.py, waiting for the profiler's pipe to close) reaps it at once, and
every later join or leave reaps it too. flock locks belong to the open file description and are released when
its last descriptor closes, however the process ends (flock(2)); bpffs is one instance per mount, so every
profiler must see the host's own (`bind-mount /sys/fs/bpf`, not a new `mount -t bpf`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import profiling.probes.ebpf_maps as layout
import profiling.probes.libbpf as libbpf
from profiling.probes.libbpf import BpfError, BpfObject

ENV_PIN = "IOBATCH_BPF_PIN"  # where the host's programs are pinned (a directory in bpffs)
DEFAULT_PIN = Path("/sys/fs/bpf/iobatch")
BPFFS_MAGIC = 0xCAFE4A11  # include/uapi/linux/magic.h BPF_FS_MAGIC
SHARED_MAPS = ("selection", "host", "disks", *(f"slot_{m.name}" for m in layout.slot_maps(1)))
FINDER = "iob_find_task"
# The watched calls: fentry/fexit on each system call's own entry point where the kernel allows BPF trampolines,
# else the two raw syscall tracepoints (iobatch.bpf.c says why).
FENTRY_SECTIONS = ("fentry/", "fexit/")
TRACEPOINT_PROGRAMS = ("iob_sys_enter", "iob_sys_exit")


def pin_root() -> Path:
    return Path(os.environ.get(ENV_PIN) or DEFAULT_PIN)


def _is_bpffs(path: Path) -> bool:
    import ctypes

    class StatFs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]

    buf = StatFs()
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.statfs(str(path).encode(), ctypes.byref(buf)) == 0 and buf.f_type & 0xFFFFFFFF == BPFFS_MAGIC


def ensure_bpffs(root: Path) -> None:
    """Check that the root's parent is bpffs (systemd mounts it at boot on Amazon Linux 2023; a container binds the
    host's). Never mounted here: a mount made by one profiler would outlive it, and unmounting it under the other
    profilers' pins is no one's to do. Raises BpfError naming the fix when it is not."""
    parent = root.parent
    if not _is_bpffs(parent):
        raise BpfError(f"{parent} is not bpffs: mount it (`mount -t bpf bpf {parent}`, or bind-mount the host's "
                       f"into the container) so the host's profilers share one copy of the programs")
    root.mkdir(exist_ok=True)


@contextlib.contextmanager
def host_lock(root: Path) -> Iterator[None]:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def digest_of(obj: Path) -> str:
    return hashlib.sha256(obj.read_bytes()).hexdigest()[:16]


def _slot_dirs(build: Path) -> list[Path]:
    slots = build / "slots"
    return sorted(slots.iterdir(), key=lambda p: int(p.name)) if slots.is_dir() else []


def _held(slot_dir: Path) -> bool:
    """Whether a live profiler holds the slot's lock."""
    try:
        fd = os.open(slot_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _at_once(changes: list[tuple[Path, int, int | None]]) -> None:
    """Put map `fd` at index `slot` of each pinned map of maps (None: take it out), all at once: the kernel waits
    for an RCU grace period after every change to a map of maps (kernel/bpf/syscall.c, maybe_wait_bpf_programs),
    ~15 ms each here, and concurrent waits share one (ctypes lets go of the GIL during the call)."""
    errors: list[BaseException] = []

    def change(outer_pin: Path, slot: int, fd: int | None) -> None:
        try:
            with _opened(outer_pin) as outer:
                key = slot.to_bytes(4, "little")
                if fd is None:
                    libbpf.map_delete(outer, key)
                else:
                    libbpf.map_update(outer, key, fd.to_bytes(4, "little"))
        except BaseException as exc:  # handed to the caller's thread
            errors.append(exc)

    workers = [threading.Thread(target=change, args=item) for item in changes]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]


def _free_slot(build: Path, slot: int) -> None:
    """Take slot `slot`'s maps and selections out of the shared maps (its maps are freed with their last
    descriptor), then its directory. Under the host lock."""
    with contextlib.suppress(BpfError):
        _at_once([(build / f"map_{name}", slot, None) for name in SHARED_MAPS if name.startswith("slot_")])
    with contextlib.suppress(BpfError), _opened(build / "map_selection") as fd:
        items = libbpf.map_items(fd, 8, layout.SELECT.size, layout.IOB_SLOTS)
        for cgroup, value in items:
            if layout.SELECT.unpack_from(value)[0] == slot:
                libbpf.map_delete(fd, cgroup)
        _set_levels(build, fd)
    with contextlib.suppress(OSError):
        (build / "slots" / str(slot)).rmdir()


MAX_LEVELS = 64  # bits of iob_host.levels


def _set_levels(build: Path, selection_fd: int) -> None:
    levels = layout.levels_of(libbpf.map_items(selection_fd, 8, layout.SELECT.size, layout.IOB_SLOTS))
    with _opened(build / "map_host") as fd:
        host = libbpf.map_lookup(fd, bytes(4), layout.HOST_SIZE)
        if host is not None:
            offset = layout.host_offset("levels")
            libbpf.map_update(fd, bytes(4), host[:offset] + levels.to_bytes(8, "little") + host[offset + 8:])


@contextlib.contextmanager
def _opened(pin: Path) -> Iterator[int]:
    fd = libbpf.obj_get(pin)
    try:
        yield fd
    finally:
        os.close(fd)


def _remove_build(build: Path) -> None:
    """Unpin everything of one build: the links go (their programs detach and unload), then the maps."""
    if not build.is_dir():
        return
    for pin in sorted(build.iterdir(), key=lambda p: not p.name.startswith("link_")):
        if pin.is_dir():
            for slot in pin.iterdir():
                with contextlib.suppress(OSError):
                    slot.rmdir()
            with contextlib.suppress(OSError):
                pin.rmdir()
        else:
            with contextlib.suppress(OSError):
                pin.unlink()
    with contextlib.suppress(OSError):
        build.rmdir()


def reap(root: Path) -> None:
    """Under the host lock: free the slots of dead profilers; unpin every build no live profiler uses."""
    if not root.is_dir():
        return
    for build in [p for p in root.iterdir() if p.is_dir()]:
        for slot_dir in _slot_dirs(build):
            if not _held(slot_dir):
                _free_slot(build, int(slot_dir.name))
        if not _slot_dirs(build):
            _remove_build(build)


def _load(obj_path: Path, build: Path, extra: tuple[str, ...]) -> None:
    """Load the object, attach its programs (those in `extra` where the kernel has their hook) and pin links
    and maps in `build`."""
    try:  # fentry first; where the kernel refuses trampolines, the raw syscall tracepoints
        obj = BpfObject(obj_path, skip=TRACEPOINT_PROGRAMS)
        calls = obj.programs("fentry/") + obj.programs("fexit/")
    except BpfError:
        obj = BpfObject(obj_path, skip_sections=FENTRY_SECTIONS)
        calls = list(TRACEPOINT_PROGRAMS)
    before = set(os.listdir("/proc/self/fd"))
    try:
        wrong = layout.check_value_sizes({name: obj.inner_map(f"slot_{name}")[0] for name in layout.VALUE_SIZES})
        if wrong is not None:
            raise BpfError(wrong)
        files_cap = obj.inner_map("slot_files")[1] - 1
        build.mkdir()
        (build / "slots").mkdir()
        for name in calls:
            obj.attach(name, pin=build / f"link_{name}")
        for name in extra:
            try:
                obj.attach(name, pin=build / f"link_{name}")
            except BpfError:  # its slot's figure is then absent, with a note (ebpf.EXTRA_PROGRAMS)
                with contextlib.suppress(OSError):
                    (build / f"link_{name}").unlink()
        for name in SHARED_MAPS:
            obj.pin_map(name, build / f"map_{name}")
        obj.pin_program(FINDER, build / f"prog_{FINDER}")
        with _opened(build / "map_host") as fd:
            host = bytearray(layout.HOST_SIZE)
            offset = layout.host_offset("files_cap")
            host[offset:offset + 8] = files_cap.to_bytes(8, "little")
            libbpf.map_update(fd, bytes(4), bytes(host))
        obj.let_pins_hold()
        _close_perf_events(before)
    except BaseException:
        obj.close()
        _remove_build(build)
        raise
    obj.close()


def _close_perf_events(before: set[str]) -> None:
    """The perf events libbpf opened for the classic tracepoints: their pinned links hold them."""
    for name in set(os.listdir("/proc/self/fd")) - before:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:[perf_event]":
                os.close(int(name))


class Slot:
    """This profiler's share of the host's programs: its slot, its own maps (mmap-ed), the shared maps it
    writes (its selection, its disk). Made by `join`, given back by `close` (idempotent, never raises)."""

    def __init__(self, root: Path, build: Path, index: int, lock_fd: int) -> None:
        self.root, self.build, self.index = root, build, index
        self._lock_fd: int | None = lock_fd
        self._fds: dict[str, int] = {}
        self._maps: list[mmap.mmap] = []
        self._cgroups: list[int] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watch_fd: int | None = None
        self.notes: list[str] = []
        self.hooks = "fentry" if any(build.glob("link_iob_in_*")) else "tracepoint"
        self.attached = {p.name[len("link_"):] for p in build.glob("link_*")}
        self.host = self._mmap_pin("host", layout.HOST_SIZE)
        self.files_cap = layout.decode_host(self.host[:layout.HOST_SIZE])["files_cap"]
        for spec in layout.slot_maps(self.files_cap):
            kind = libbpf.BPF_MAP_TYPE_ARRAY if spec.kind == "array" else libbpf.BPF_MAP_TYPE_HASH
            flags = (libbpf.BPF_F_MMAPABLE if spec.mmapable else 0) | (
                0 if spec.preallocated else libbpf.BPF_F_NO_PREALLOC)
            self._fds[spec.name] = libbpf.map_create(kind, f"iob_{spec.name}"[:15], spec.key_size, spec.value_size,
                                                     spec.max_entries, flags)
        _at_once([(build / f"map_slot_{name}", index, fd) for name, fd in self._fds.items()])
        self.state = self._mmap("state", layout.STATE_SIZE)
        self.cells = self._mmap("cells", layout.IOB_CELLS * layout.CELL_SIZE)
        self.files = self._mmap("files", (self.files_cap + 1) * layout.FILE_SIZE)

    def _mmap(self, name: str, size: int) -> mmap.mmap:
        memory = libbpf.mmap_fd(self._fds[name], size)
        self._maps.append(memory)
        return memory

    def _mmap_pin(self, name: str, size: int) -> mmap.mmap:
        with _opened(self.build / f"map_{name}") as fd:
            memory = libbpf.mmap_fd(fd, size)
        self._maps.append(memory)
        return memory

    def watch(self) -> None:
        """Start the watchdog that reaps this slot if this process dies without leaving."""
        read_end, self._watch_fd = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-m", "profiling.probes.ebpf_watchdog", str(self.root),
                 str(self.build / "slots" / str(self.index))], stdin=read_end,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self.notes.append("no watchdog: a SIGKILL of this profiler leaves the programs until the next one")
        finally:
            os.close(read_end)

    # -- the shared maps, under the host lock

    def find(self, pid: int) -> tuple[int, int, int]:
        """(cgroup id, its level, host pid) of process `pid` of this process's pid namespace."""
        with host_lock(self.root):
            host = self.host
            for field, value in (("find_ns_inum", os.stat("/proc/self/ns/pid").st_ino), ("find_pid", pid),
                                 ("found_cgroup_id", 0)):
                offset = layout.host_offset(field)
                host[offset:offset + 8] = value.to_bytes(8, "little")
            with _opened(self.build / f"prog_{FINDER}") as prog:
                libbpf.run_iterator_fd(prog)
            found = layout.decode_host(host[:layout.HOST_SIZE])
        if not found["found_cgroup_id"]:
            raise RuntimeError(f"process {pid} not found by the eBPF task finder")
        return found["found_cgroup_id"], found["found_cgroup_level"], found["found_tgid"]

    def select(self, cgroup: int, level: int, exclude_tgid: int) -> None:
        """Count the calls of cgroup `cgroup` (and the cgroups below it) in this slot."""
        if not 0 <= level < MAX_LEVELS:  # iob_host.levels is a 64-bit mask of the depths in use
            raise RuntimeError(f"cgroup v2 id {cgroup} is {level} levels deep: the probe watches cgroups up to "
                               f"{MAX_LEVELS - 1} levels below the root")
        with host_lock(self.root), _opened(self.build / "map_selection") as fd:
            key = cgroup.to_bytes(8, "little")
            held = libbpf.map_lookup(fd, key, layout.SELECT.size)
            if held is not None and layout.SELECT.unpack_from(held)[0] != self.index:
                raise RuntimeError(f"cgroup v2 id {cgroup} is already watched by another profiler on this host")
            libbpf.map_update(fd, key, layout.SELECT.pack(self.index, level, exclude_tgid))
            self._cgroups.append(cgroup)
            _set_levels(self.build, fd)

    def unselect(self) -> None:
        if not self._cgroups:
            return
        with host_lock(self.root), _opened(self.build / "map_selection") as fd:
            for cgroup in self._cgroups:
                libbpf.map_delete(fd, cgroup.to_bytes(8, "little"))
            self._cgroups = []
            _set_levels(self.build, fd)

    def add_disk(self, dev: int) -> None:
        """Class disk `dev`'s requests (the kernel's dev_t); one entry per disk, shared by its profilers."""
        # BPF_NOEXIST fails when another profiler watches the disk already: its entry is kept
        with host_lock(self.root), _opened(self.build / "map_disks") as fd, contextlib.suppress(BpfError):
            libbpf.map_update(fd, dev.to_bytes(8, "little"), bytes(layout.DISK_SIZE), libbpf.BPF_NOEXIST)

    def disk(self, dev: int) -> dict[str, int] | None:
        with _opened(self.build / "map_disks") as fd:
            raw = libbpf.map_lookup(fd, dev.to_bytes(8, "little"), layout.DISK_SIZE)
        return None if raw is None else layout.decode_disk(raw)

    def task_pauses(self) -> dict[int, tuple[str, int]]:
        items = libbpf.map_items(self._fds["task_pause"], 4, layout.TASK_PAUSE_SIZE, layout.IOB_TASKS)
        return layout.decode_task_pauses(items)

    def close(self) -> None:
        """Leave: this slot's maps and selections out, its lock and directory freed; the last one out unpins
        everything. Never raises."""
        if self._lock_fd is None:
            return
        with contextlib.suppress(Exception), host_lock(self.root):
            self._cgroups = []
            _free_slot(self.build, self.index)
            os.close(self._lock_fd)
            self._lock_fd = None
            reap(self.root)
        for memory in self._maps:
            memory.close()
        self._maps = []
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        if self._lock_fd is not None:  # the lock could not be taken: the watchdog or the next profiler reaps
            os.close(self._lock_fd)
            self._lock_fd = None
        if self._watch_fd is not None:
            os.close(self._watch_fd)  # the watchdog wakes, finds nothing to reap, exits
            self._watch_fd = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None


def join(obj_path: Path, extra: tuple[str, ...]) -> Slot:
    """This profiler's slot on the host's shared programs, loaded and pinned now if no profiler has (with the
    optional programs `extra` where their hooks exist)."""
    root = pin_root()
    ensure_bpffs(root)
    build = root / digest_of(obj_path)
    with host_lock(root):
        reap(root)
        if not (build / "map_selection").exists():
            _load(obj_path, build, extra)
        taken = {int(p.name) for p in _slot_dirs(build)}
        with _opened(build / "map_host") as fd:
            host = bytearray(libbpf.map_lookup(fd, bytes(4), layout.HOST_SIZE) or bytes(layout.HOST_SIZE))
            offset = layout.host_offset("joins")
            joins = int.from_bytes(host[offset:offset + 8], "little")
            index = layout.next_slot(taken, joins)
            if index is None:
                raise BpfError(f"all {layout.IOB_SLOTS} profiler slots of this host are taken")
            host[offset:offset + 8] = (joins + 1).to_bytes(8, "little")
            libbpf.map_update(fd, bytes(4), bytes(host))
        slot_dir = build / "slots" / str(index)
        slot_dir.mkdir()
        lock_fd = os.open(slot_dir, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            slot = Slot(root, build, index, lock_fd)
        except BaseException:
            os.close(lock_fd)
            _free_slot(build, index)
            reap(root)
            raise
    return slot


def loaded_programs(root: Path | None = None) -> set[int]:
    """The ids of the programs the host's pins hold (what a test checks is gone after the last profiler)."""
    ids: set[int] = set()
    base = root or pin_root()
    if not base.is_dir():
        return ids
    for pin in base.glob("*/link_*"):
        with contextlib.suppress(BpfError, OSError), _opened(pin) as fd:
            info = Path(f"/proc/self/fdinfo/{fd}").read_text()
            ids |= {int(line.split()[1]) for line in info.splitlines() if line.startswith("prog_id:")}
    return ids
