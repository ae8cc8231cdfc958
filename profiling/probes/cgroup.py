"""A cgroup v2 of its own for a process tree, so the eBPF probe can select it by cgroup.

In a Batch task the job is its own container, so its cgroup holds the job and nothing else and the probe
selects it as it is. On one machine the job, its profiler and everything else often share one cgroup
(the root one, here): then the probe moves the job's process tree into a child cgroup of the one it is in
(`Carved`), and moves whatever is left there back when it is done, on every exit path; a cgroup left by a
profiler that was killed is emptied and removed the next time one is made beside it.

Moving a process between cgroups of the v2 hierarchy is writing its pid to the target's cgroup.procs
(Documentation/admin-guide/cgroup-v2.rst, "Organizing Processes and Threads"); a new cgroup has no
controllers enabled, so limits set above still apply to the moved processes. On a hybrid (v1 + v2)
host the v2 hierarchy carries no controllers at all.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PREFIX = "iobatch-probe-"


def v2_mount(mountinfo: str | None = None) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted with its root at "/" (e.g. /sys/fs/cgroup/unified), or None."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    for line in text.splitlines():
        fields = line.split()
        if " - cgroup2 " in line and len(fields) > 4 and fields[3] == "/":
            return Path(fields[4])
    return None


def v2_path(pid: int, text: str | None = None) -> str | None:
    """The cgroup v2 path of `pid` (its "0::" line in /proc/<pid>/cgroup), None when there is none."""
    try:
        content = text if text is not None else Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    for line in content.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def _move_all(source: Path, target: Path) -> None:
    """Move every process of cgroup `source` to cgroup `target` (processes that exit meanwhile are skipped)."""
    try:
        pids = (source / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            (target / "cgroup.procs").write_text(pid)


def _remove_stale(parent: Path) -> None:
    """Empty and remove the cgroups a killed profiler left beside `parent`'s new one."""
    for old in parent.glob(f"{PREFIX}*"):
        owner = old.name[len(PREFIX):].split("-", 1)[0]
        if owner.isdigit() and Path(f"/proc/{owner}").exists():
            continue
        _move_all(old, parent)
        with contextlib.suppress(OSError):
            old.rmdir()


class Carved:
    """A child cgroup holding a process tree, made by `carve` and undone by `restore` (idempotent)."""

    def __init__(self, path: Path, parent: Path) -> None:
        self.path = path
        self.parent = parent

    def restore(self) -> None:
        """Move whatever is still inside back to the parent and remove the cgroup; never raises."""
        if not self.path.exists():
            return
        _move_all(self.path, self.parent)
        with contextlib.suppress(OSError):
            self.path.rmdir()


def carve(pid: int, pids: list[int]) -> Carved:
    """Move `pids` (the tree of `pid`, root first) into a new child of `pid`'s cgroup. Raises OSError."""
    mount = v2_mount()
    path = v2_path(pid)
    if mount is None or path is None or "/.." in path:
        raise OSError(f"no cgroup v2 hierarchy to put process {pid} in")
    parent = mount / path.lstrip("/")
    _remove_stale(parent)
    carved = Carved(parent / f"{PREFIX}{os.getpid()}-{pid}", parent)
    carved.path.mkdir(exist_ok=True)
    try:
        for member in pids:
            try:
                (carved.path / "cgroup.procs").write_text(str(member))
            except ProcessLookupError:
                continue  # exited meanwhile
    except OSError:
        carved.restore()
        raise
    return carved
