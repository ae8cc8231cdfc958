"""The mounts a booted Linux host has and the eBPF probe needs: one owner for the list, its check and its making.

    bpffs   /sys/fs/bpf          where the host's profilers share one copy of the programs (ebpf_host.py)
    tracefs /sys/kernel/tracing  where the dirty-throttle tracepoint's id is read (ebpf.py attaches it by id)

systemd mounts both at boot on Amazon Linux 2023 and Debian; a machine that boots no systemd (a container, a CI
runner) may have neither. `make setup` and `make demo` run `python -m profiling.hoststate` as root: it mounts
what is missing and says so in one line each. The mounts stay, as a booted host's do (unmounting bpffs under
another profiler's pins is no one's to do). `missing()` is what the test suite checks before it starts.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    label: str
    fstype: str  # as mount(8) takes it
    path: Path
    magic: int  # statfs(2) f_type, include/uapi/linux/magic.h
    why: str


BPFFS = Mount("bpffs", "bpf", Path("/sys/fs/bpf"), 0xCAFE4A11,
              "the eBPF probe shares one copy of its programs per host there")
TRACEFS = Mount("tracefs", "tracefs", Path("/sys/kernel/tracing"), 0x74726163,
                "the eBPF probe attaches the dirty-throttle tracepoint by its id there")
MOUNTS = (BPFFS, TRACEFS)


class _StatFs(ctypes.Structure):
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]


def fs_type(path: Path) -> int | None:
    """statfs(2) f_type of `path`, None when it cannot be read (missing, no permission)."""
    buf = _StatFs()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.statfs(str(path).encode(), ctypes.byref(buf)) != 0:
        return None
    return int(buf.f_type) & 0xFFFFFFFF


def mounted(mount: Mount, path: Path | None = None) -> bool:
    """Whether `path` (the mount's own path by default) is on a file system of the mount's type."""
    return fs_type(path or mount.path) == mount.magic


def missing() -> list[Mount]:
    return [m for m in MOUNTS if not mounted(m)]


def make(mount: Mount) -> str | None:
    """Mount `mount` at its path (root only); None when done, else one line saying why not."""
    try:
        mount.path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{mount.path} cannot be made ({exc.strerror})"
    done = subprocess.run(["mount", "-t", mount.fstype, mount.fstype, str(mount.path)], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0 or not mounted(mount):
        return (done.stderr.strip().splitlines() or ["mount failed"])[-1]
    return None


def main() -> int:
    """Mount what is missing, one line each. Exit 0 however it went: a host without a mount still runs, and the
    probe says what it lacks."""


    absent = missing()
    if absent and os.geteuid() != 0:
        for mount in absent:
            print(f"note: {mount.label} is not mounted at {mount.path} and only root can mount it ({mount.why})")
        return 0
    for mount in absent:
        problem = make(mount)
        if problem is None:
            print(f"mounted {mount.label} at {mount.path}, as a booted host has it ({mount.why})")
        else:
            print(f"note: could not mount {mount.label} at {mount.path}: {problem} ({mount.why})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
