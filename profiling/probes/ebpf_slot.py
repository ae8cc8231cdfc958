"""A profiler's slot on a loaded copy of the eBPF programs, and the loading both copies share.

A copy is a `Store`: the objects of one loaded build (links, shared maps, the task finder) by name
(`link_<program>`, `map_<name>`, `prog_iob_find_task`), and the lock every change to its shared maps is made under.
Two stores exist: the host's copy pinned in bpffs and shared by every profiler on the host (ebpf_host.Pins), and a
copy of this profiler's own when the host has no bpffs to share through (ebpf_private.Held). A `Slot` reads and
writes its copy only through its store, so it behaves the same on both.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import subprocess
import sys
import threading
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import profiling.probes.ebpf_maps as layout
import profiling.probes.libbpf as libbpf
from profiling.probes.libbpf import BpfError, BpfObject

SHARED_MAPS = ("selection", "host", "disks", *(f"slot_{m.name}" for m in layout.slot_maps(1)))
FINDER = "iob_find_task"
# The watched calls: fentry/fexit on each system call's own entry point where the kernel allows BPF trampolines,
# else the two raw syscall tracepoints (iobatch.bpf.c says why).
FENTRY_SECTIONS = ("fentry/", "fexit/")
TRACEPOINT_PROGRAMS = ("iob_sys_enter", "iob_sys_exit")
MAX_LEVELS = 64  # bits of iob_host.levels


# The watchdog (profiling/probes/ebpf_watchdog.py), run as `python -S -c` in "/" (no module of the job's folder is
# imported): wait for the pipe to close; only when the slot is still there, import the project and reap it. -S: no
# site-packages until they are needed (site.main() adds them then), so it starts in ~20 ms, not ~50, and a profiler
# that leaves at once (`iobatch profile -- true`) waits that much less for it.
WATCHDOG = """
import os, sys
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
if len(sys.argv) == 3 and os.path.exists(sys.argv[2]):
    import site
    site.main()
    from pathlib import Path
    from profiling.probes.ebpf_watchdog import watch
    watch(Path(sys.argv[1]), Path(sys.argv[2]))
"""


class Store(Protocol):
    """One loaded copy of the programs, its objects by name."""

    shared: bool  # whether other profilers use this copy too

    def lock(self) -> AbstractContextManager[object]:
        """Held for every change to the shared maps."""

    def opened(self, name: str) -> AbstractContextManager[int]:
        """A descriptor of object `name`, valid inside the block."""

    def names(self) -> set[str]:
        """The names of the objects the copy holds."""

    def leave(self, index: int) -> None:
        """Under the lock, once slot `index`'s maps are out: what else leaving takes (the host's copy frees the
        slot's lock and directory and unpins what no profiler uses)."""

    def release(self) -> None:
        """After leaving, however it went: what this profiler still holds of the copy (idempotent)."""

    def alone(self, index: int) -> bool:
        """Under the lock: whether slot `index` is the only live one, so its leave frees the whole copy."""


def load_object(obj_path: Path, hooks: str) -> BpfObject:
    """The object loaded (not attached) with the watched calls' programs of `hooks`, "fentry" or "tracepoint", and
    not the other's; BpfError where the kernel refuses them."""
    if hooks == "fentry":
        return BpfObject(obj_path, skip=TRACEPOINT_PROGRAMS)
    return BpfObject(obj_path, skip_sections=FENTRY_SECTIONS)


def load(obj_path: Path, extra: tuple[str, ...], refused: Path | None = None) -> BpfObject:
    """The object loaded and checked, its watched calls attached (fentry first, else the raw syscall tracepoints),
    and those programs of `extra` whose hooks this kernel has; its host map holds the files cap. Nothing pinned.

    `refused`: a directory whose presence says this kernel refuses fentry (EPERM, its answer to the first fentry
    program before any verifying), made here when it does and the tracepoints load. The host's copy keeps it in
    bpffs, which lasts as long as the kernel runs: a later first profiler skips the refused attempt, ~50 ms of
    libbpf reading the kernel's BTF and relocating the object (BENCHMARKS.md, "loading the programs")."""
    obj, fentry_errno = None, 0
    if refused is None or not refused.is_dir():
        try:
            obj = load_object(obj_path, "fentry")
            calls = obj.programs("fentry/") + obj.programs("fexit/")
        except BpfError as exc:
            fentry_errno = exc.errno
    if obj is None:
        obj = load_object(obj_path, "tracepoint")
        calls = list(TRACEPOINT_PROGRAMS)
        if refused is not None and fentry_errno == errno.EPERM:
            with contextlib.suppress(OSError):  # a record only: without it, the next load tries fentry again
                refused.mkdir()
    try:
        wrong = layout.check_value_sizes({name: obj.inner_map(f"slot_{name}")[0] for name in layout.VALUE_SIZES})
        if wrong is not None:
            raise BpfError(wrong)
        files_cap = obj.inner_map("slot_files")[1] - 1
        for name in calls:
            obj.attach(name)
        for name in extra:
            with contextlib.suppress(BpfError):  # its slot's figure is then absent, with a note (ebpf.EXTRA_PROGRAMS)
                obj.attach(name)
        host = bytearray(layout.HOST_SIZE)
        offset = layout.host_offset("files_cap")
        host[offset:offset + 8] = files_cap.to_bytes(8, "little")
        libbpf.map_update(obj.map_fd("host"), bytes(4), bytes(host))
    except BaseException:
        obj.close()
        raise
    return obj


def at_once(store: Store, changes: list[tuple[str, int, int | None]]) -> None:
    """Put map `fd` at index `slot` of each shared map of maps `name` (None: take it out), all at once: the kernel
    waits for an RCU grace period after every change to a map of maps (kernel/bpf/syscall.c,
    maybe_wait_bpf_programs), ~15 ms each here, and concurrent waits share one (ctypes lets go of the GIL)."""
    errors: list[BaseException] = []

    def change(name: str, slot: int, fd: int | None) -> None:
        try:
            with store.opened(name) as outer:
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


def set_levels(store: Store, selection_fd: int) -> None:
    levels = layout.levels_of(libbpf.map_items(selection_fd, 8, layout.SELECT.size, layout.IOB_SLOTS))
    with store.opened("map_host") as fd:
        host = libbpf.map_lookup(fd, bytes(4), layout.HOST_SIZE)
        if host is not None:
            offset = layout.host_offset("levels")
            libbpf.map_update(fd, bytes(4), host[:offset] + levels.to_bytes(8, "little") + host[offset + 8:])


def free_slot(store: Store, slot: int) -> None:
    """Take slot `slot`'s maps and selections out of the shared maps (its maps are freed with their last
    descriptor). Under the store's lock."""
    with contextlib.suppress(BpfError):
        at_once(store, [(f"map_{name}", slot, None) for name in SHARED_MAPS if name.startswith("slot_")])
    with contextlib.suppress(BpfError), store.opened("map_selection") as fd:
        items = libbpf.map_items(fd, 8, layout.SELECT.size, layout.IOB_SLOTS)
        for cgroup, value in items:
            if layout.SELECT.unpack_from(value)[0] == slot:
                libbpf.map_delete(fd, cgroup)
        set_levels(store, fd)


class Slot:
    """This profiler's share of a copy of the programs: its slot, its own maps (mmap-ed), the shared maps it
    writes (its selection, its disk). `close` gives it back (idempotent, never raises)."""

    def __init__(self, store: Store, index: int, notes: list[str] | None = None) -> None:
        self.store, self.index = store, index
        self._fds: dict[str, int] = {}
        self._maps: list[mmap.mmap] = []
        self._cgroups: list[int] = []
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watch_fd: int | None = None
        self._closed = False
        self.notes: list[str] = list(notes or [])
        names = store.names()
        self.hooks = "fentry" if any(n.startswith("link_iob_in_") for n in names) else "tracepoint"
        self.attached = {n[len("link_"):] for n in names if n.startswith("link_")}
        with store.opened("map_host") as fd:
            self.host = self._keep(libbpf.mmap_fd(fd, layout.HOST_SIZE))
        self.files_cap = layout.decode_host(self.host[:layout.HOST_SIZE])["files_cap"]
        for spec in layout.slot_maps(self.files_cap):
            kind = libbpf.BPF_MAP_TYPE_ARRAY if spec.kind == "array" else libbpf.BPF_MAP_TYPE_HASH
            flags = (libbpf.BPF_F_MMAPABLE if spec.mmapable else 0) | (
                0 if spec.preallocated else libbpf.BPF_F_NO_PREALLOC)
            self._fds[spec.name] = libbpf.map_create(kind, f"iob_{spec.name}"[:15], spec.key_size, spec.value_size,
                                                     spec.max_entries, flags)
        at_once(store, [(f"map_slot_{name}", index, fd) for name, fd in self._fds.items()])
        self.state = self._keep(libbpf.mmap_fd(self._fds["state"], layout.STATE_SIZE))
        self.cells = self._keep(libbpf.mmap_fd(self._fds["cells"], layout.IOB_CELLS * layout.CELL_SIZE))
        self.files = self._keep(libbpf.mmap_fd(self._fds["files"], (self.files_cap + 1) * layout.FILE_SIZE))

    def helpers(self) -> set[int]:
        """The pids of the processes this slot started (its watchdog): never the job's, wherever they are."""
        return {self._watchdog.pid} if self._watchdog is not None else set()

    def _keep(self, memory: mmap.mmap) -> mmap.mmap:
        self._maps.append(memory)
        return memory

    def watch(self, root: Path, slot_dir: Path) -> None:
        """Start the watchdog that reaps this slot of the host's copy if this process dies without leaving."""
        read_end, self._watch_fd = os.pipe()
        try:
            self._watchdog = subprocess.Popen(
                [sys.executable, "-S", "-c", WATCHDOG, str(root), str(slot_dir)], stdin=read_end, cwd="/",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            self.notes.append("no watchdog: a SIGKILL of this profiler leaves the programs until the next one")
        finally:
            os.close(read_end)

    # -- the shared maps, under the store's lock

    def find(self, pid: int) -> tuple[int, int, int]:
        """(cgroup id, its level, host pid) of process `pid` of this process's pid namespace."""
        with self.store.lock():
            host = self.host
            for field, value in (("find_ns_inum", os.stat("/proc/self/ns/pid").st_ino), ("find_pid", pid),
                                 ("found_cgroup_id", 0)):
                offset = layout.host_offset(field)
                host[offset:offset + 8] = value.to_bytes(8, "little")
            with self.store.opened(f"prog_{FINDER}") as prog:
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
        with self.store.lock(), self.store.opened("map_selection") as fd:
            key = cgroup.to_bytes(8, "little")
            held = libbpf.map_lookup(fd, key, layout.SELECT.size)
            if held is not None and layout.SELECT.unpack_from(held)[0] != self.index:
                raise RuntimeError(f"cgroup v2 id {cgroup} is already watched by another profiler on this host")
            libbpf.map_update(fd, key, layout.SELECT.pack(self.index, level, exclude_tgid))
            self._cgroups.append(cgroup)
            set_levels(self.store, fd)

    def unselect(self) -> None:
        if not self._cgroups:
            return
        with self.store.lock(), self.store.opened("map_selection") as fd:
            for cgroup in self._cgroups:
                libbpf.map_delete(fd, cgroup.to_bytes(8, "little"))
            self._cgroups = []
            set_levels(self.store, fd)

    def add_disk(self, dev: int) -> None:
        """Class disk `dev`'s requests (the kernel's dev_t); one entry per disk, shared by its profilers."""
        # BPF_NOEXIST fails when another profiler watches the disk already: its entry is kept
        with self.store.lock(), self.store.opened("map_disks") as fd, contextlib.suppress(BpfError):
            libbpf.map_update(fd, dev.to_bytes(8, "little"), bytes(layout.DISK_SIZE), libbpf.BPF_NOEXIST)

    def disk(self, dev: int) -> dict[str, int] | None:
        with self.store.opened("map_disks") as fd:
            raw = libbpf.map_lookup(fd, dev.to_bytes(8, "little"), layout.DISK_SIZE)
        return None if raw is None else layout.decode_disk(raw)

    def task_pauses(self) -> dict[int, tuple[str, int]]:
        items = libbpf.map_items(self._fds["task_pause"], 4, layout.TASK_PAUSE_SIZE, layout.IOB_TASKS)
        return layout.decode_task_pauses(items)

    def close(self) -> None:
        """Leave: this slot's maps and selections out, then what the store does on leaving. Never raises."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception), self.store.lock():
            self._cgroups = []
            if not self.store.alone(self.index):  # else the copy goes whole, and with it the slot's entries:
                free_slot(self.store, self.index)  # taking them out first would wait for an RCU grace period
            self.store.leave(self.index)
        for memory in self._maps:
            memory.close()
        self._maps = []
        for fd in self._fds.values():
            os.close(fd)
        self._fds = {}
        with contextlib.suppress(Exception):  # the lock could not be taken: the watchdog or the next profiler reaps
            self.store.release()
        if self._watch_fd is not None:
            os.close(self._watch_fd)  # the watchdog wakes, finds nothing to reap, exits
            self._watch_fd = None
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=5)
            self._watchdog = None
