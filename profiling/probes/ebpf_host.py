"""One copy of the eBPF programs per host, shared by every profiler on it: pins in bpffs under a lock.

    <root>/                    the host lock: flock(2) on this directory for every join and leave (never removed)
    <root>/<digest>/           one build of the object (sha256 of iobatch.bpf.o): two builds never share maps
        link_<program>         the attached programs (a pinned link stays attached while its pin exists)
        map_<name>             the maps every profiler needs: selection, host, disks and the slot_* maps of maps
        prog_iob_find_task     the task finder (an iterator, run under the host lock)
        slots/<n>/             one per live profiler: it holds flock(LOCK_EX) on the directory while it lives
    <root>/no-fentry/          made when this kernel refused fentry (EPERM): the next load tries the tracepoints
                               at once (bpffs is emptied when the kernel stops, so the record is this boot's)

In: the built object; <root> is `pin_root()`, in the host's bpffs (where it is not bpffs, `join` hands over to
ebpf_private: a copy of the profiler's own, said in one note). Out: `join` gives a profiler its Slot (ebpf_slot),
loading and pinning the programs if no profiler has; its leave frees it. Invariants: every change is made under the
host lock; the slots whose lock nobody holds (a dead profiler's, SIGKILL included) are reaped at every join and
leave, and at once by the dead profiler's watchdog (ebpf_watchdog.py); the last profiler out removes the pins, so no
program stays loaded. Why pins and not a host service: docs/profiler.md, "Sharing, and why pins".
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import profiling.probes.ebpf_maps as layout
import profiling.probes.ebpf_private as ebpf_private
import profiling.probes.libbpf as libbpf
from profiling import hoststate
from profiling.probes.ebpf_slot import FINDER, SHARED_MAPS, Slot, free_slot, load
from profiling.probes.libbpf import BpfError

ENV_PIN = "IOBATCH_BPF_PIN"  # where the host's programs are pinned (a directory in bpffs)
# bpffs is one instance per mount: every profiler must see the host's own (a bind mount of /sys/fs/bpf), as a
# container's own `mount -t bpf` is a new, private instance.
DEFAULT_PIN = Path("/sys/fs/bpf/iobatch")


NO_FENTRY = "no-fentry"


def pin_root() -> Path:
    return Path(os.environ.get(ENV_PIN) or DEFAULT_PIN)


def builds(root: Path) -> list[Path]:
    """The builds pinned under `root` (every directory but the no-fentry record)."""
    return [p for p in root.iterdir() if p.is_dir() and p.name != NO_FENTRY] if root.is_dir() else []


@contextlib.contextmanager
def host_lock(root: Path) -> Iterator[None]:
    # A flock belongs to the open file description and is released when its last descriptor closes, however the
    # process ends (flock(2)): a profiler that dies holding it blocks no one. The same holds for a slot's lock.
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
    for build in builds(root):
        for slot_dir in _slot_dirs(build):
            if not _held(slot_dir):
                _free(root, build, slot_dir)
        if not _slot_dirs(build):
            _remove_build(build)


def _load(obj_path: Path, build: Path, extra: tuple[str, ...]) -> None:
    """Load the object (ebpf_slot.load) and pin its links and shared maps and the task finder in `build`."""
    before = set(os.listdir("/proc/self/fd"))
    obj = load(obj_path, extra, build.parent / NO_FENTRY)
    try:
        build.mkdir()
        (build / "slots").mkdir()
        # Pin names use `_`, never `.`: bpffs refuses names with a dot (kernel/bpf/inode.c, bpf_lookup).
        for name in obj.attached:
            obj.pin_link(name, build / f"link_{name}")
        for name in SHARED_MAPS:
            obj.pin_map(name, build / f"map_{name}")
        obj.pin_program(FINDER, build / f"prog_{FINDER}")
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


class Pins:
    """The host's copy (an ebpf_slot.Store): pins in `build`, changed under the host lock; this profiler's slot is
    `slot_dir`, held while `lock_fd` is open."""

    shared = True

    def __init__(self, root: Path, build: Path, slot_dir: Path, lock_fd: int | None) -> None:
        self.root, self.build, self.slot_dir = root, build, slot_dir
        self._lock_fd = lock_fd

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return host_lock(self.root)

    def opened(self, name: str) -> contextlib.AbstractContextManager[int]:
        return _opened(self.build / name)

    def names(self) -> set[str]:
        return {p.name for p in self.build.iterdir() if not p.is_dir()}

    def leave(self, index: int) -> None:
        self.release()
        with contextlib.suppress(OSError):
            self.slot_dir.rmdir()
        reap(self.root)

    def alone(self, index: int) -> bool:
        return not any(_held(d) for d in _slot_dirs(self.build) if d != self.slot_dir)

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def _free(root: Path, build: Path, slot_dir: Path) -> None:
    """Free the slot of a profiler that is gone. Under the host lock."""
    free_slot(Pins(root, build, slot_dir, None), int(slot_dir.name))
    with contextlib.suppress(OSError):
        slot_dir.rmdir()


def join(obj_path: Path, extra: tuple[str, ...]) -> Slot:
    """This profiler's slot on the host's shared programs, loaded and pinned now if no profiler has (with the
    optional programs `extra` where their hooks exist). Where the pins' directory is not in bpffs, a copy of this
    profiler's own (ebpf_private), with one note saying so."""
    root = pin_root()
    if not hoststate.mounted(hoststate.BPFFS, root.parent):
        return ebpf_private.join(obj_path, extra, note=(
            f"{root.parent} is not bpffs, so this profiler loaded its own copy of the eBPF programs, not shared "
            f"with the host's other profilers (`make setup` mounts bpffs as root, as a booted host has it; a "
            f"container binds the host's)"))
    root.mkdir(exist_ok=True)
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
        pins = Pins(root, build, slot_dir, lock_fd)
        try:
            slot = Slot(pins, index)
        except BaseException:
            pins.release()
            _free(root, build, slot_dir)
            reap(root)
            raise
    slot.watch(root, slot_dir)
    return slot


@contextlib.contextmanager
def _opened(pin: Path) -> Iterator[int]:
    fd = libbpf.obj_get(pin)
    try:
        yield fd
    finally:
        os.close(fd)


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
