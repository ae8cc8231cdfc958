"""A copy of the eBPF programs of one profiler's own, for a host with no bpffs to share them through (a container
without the host's /sys/fs/bpf, a machine that boots no systemd): loaded, attached and held by this process's
descriptors alone, for its lifetime. Nothing is pinned, so nothing outlives the process, however it ends (the
kernel frees a program with its last descriptor: libbpf.py), and no watchdog is needed. The figures are the same
as the host's copy gives; the price is that every system call on the host runs this copy's programs too (about
0.16 us each per copy here, FACTS: the libbpf probe before sharing).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from profiling.probes.ebpf_slot import FINDER, SHARED_MAPS, Slot, load
from profiling.probes.libbpf import BpfObject


class Held:
    """This profiler's own copy (an ebpf_slot.Store): the loaded object, its objects by name."""

    shared = False

    def __init__(self, obj: BpfObject) -> None:
        self._obj: BpfObject | None = obj
        self._lock = threading.Lock()
        self._fds = {f"map_{name}": obj.map_fd(name) for name in SHARED_MAPS}
        self._fds[f"prog_{FINDER}"] = obj.program_fd(FINDER)
        self._names = {*self._fds, *(f"link_{name}" for name in obj.attached)}

    def lock(self) -> contextlib.AbstractContextManager[object]:
        return self._lock

    @contextlib.contextmanager
    def opened(self, name: str) -> Iterator[int]:
        yield self._fds[name]  # the object's own: closed with it

    def names(self) -> set[str]:
        return set(self._names)

    def leave(self, index: int) -> None:
        pass

    def alone(self, index: int) -> bool:
        return True  # one slot: the copy goes with it

    def release(self) -> None:
        """Detach and unload: the object's links and maps go with it."""
        if self._obj is not None:
            self._obj.close()
            self._obj = None


def join(obj_path: Path, extra: tuple[str, ...], *, note: str) -> Slot:
    """Slot 0 of a copy loaded now for this profiler alone (the optional programs `extra` where their hooks exist);
    `note` is said once, in the slot's notes."""
    held = Held(load(obj_path, extra))
    try:
        return Slot(held, 0, notes=[note])
    except BaseException:
        held.release()
        raise
