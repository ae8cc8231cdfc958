"""What the suite checks of the machine and of each test: `make setup`'s work is there before the first test, and
no test leaves process state behind for the tests after it: a preload or an iobatch variable in the environment,
another working directory, a signal handler, a mount."""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Built into the tree by `make setup` (the Makefile's targets), which the tests use without building.
BUILT = (".tools/bin/versitygw", "node_modules/.bin/cdk")
# What a test may not leave behind: a preload or an iobatch variable reaches every program a later test starts (an
# interposer's LD_PRELOAD once did, recording into a directory a finished test had removed).
LEAKABLE = ("LD_PRELOAD",)
LEAKABLE_PREFIX = "IOBATCH_"


def setup_missing(root: Path, euid: int) -> str | None:
    """One line naming what `make setup` makes that this machine lacks, None when nothing is: the mounts a booted
    host has (as root; profiling/probes/hoststate.py owns the list) and what setup builds into the tree `root`."""
    from profiling import hoststate

    absent = [f"{m.label} at {m.path}" for m in hoststate.missing()] if euid == 0 else []
    absent += [name for name in BUILT if not (root / name).exists()]
    if not absent:
        return None
    return f"missing: {', '.join(absent)}. Run `make setup` (as root it also mounts what a booted host has)"


def _leakable(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k in LEAKABLE or k.startswith(LEAKABLE_PREFIX)}


def environment_left(before: Mapping[str, str], environ: MutableMapping[str, str]) -> str | None:
    """What a test changed of the leakable variables since `before`, put back in `environ` (so one leak fails one
    test, not every test after it), in one line; None when nothing."""
    was, now = _leakable(before), _leakable(environ)
    changed = sorted(k for k in was.keys() | now.keys() if was.get(k) != now.get(k))
    for key in changed:
        if key in was:
            environ[key] = was[key]
        else:
            environ.pop(key, None)
    if not changed:
        return None
    return f"the test left {', '.join(changed)} changed in the environment: restore it (e.g. monkeypatch.setenv)"


# The kernel's write-cache settings: tests that run the rendered user data apply the stack's sysctls for real, as a
# host does. Whatever a test did, the machine's values are put back after it (the ratio and the bytes form each zero
# the other when written, so the one in force is written last).
DIRTY = ("vm.dirty_background_bytes", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_ratio")


def saved_dirty() -> dict[str, str]:
    out = {}
    for key in DIRTY:
        with contextlib.suppress(OSError):
            out[key] = Path("/proc/sys", key.replace(".", "/")).read_text().strip()
    return out


def restore_dirty(saved: Mapping[str, str]) -> None:
    """Put the write-cache sysctls back as `saved` (root only; elsewhere a test cannot have changed them)."""
    if not saved or saved_dirty() == dict(saved) or os.geteuid() != 0:
        return
    for ratio, size in (("vm.dirty_background_ratio", "vm.dirty_background_bytes"),
                        ("vm.dirty_ratio", "vm.dirty_bytes")):
        key = size if saved.get(size, "0") != "0" else ratio
        Path("/proc/sys", key.replace(".", "/")).write_text(saved[key])


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE)


# Where a test makes its mounts (its tmp_path, the tree's run directories): a mount elsewhere is a service's own,
# made once and kept (podman binds /run/netns to itself on its first pod), not a test's to undo.
MOUNT_ROOTS = (tempfile.gettempdir(), str(Path(__file__).resolve().parents[2]))


def _mounts() -> frozenset[str]:
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as table:
        points = (line.split()[4] for line in table)
        return frozenset(p for p in points if p.startswith(MOUNT_ROOTS))


@dataclass(frozen=True)
class ProcessState:
    """What a test could leave behind in this process besides its environment."""

    cwd: str
    handlers: tuple[Any, ...]
    mounts: frozenset[str]
    blocked: frozenset[int]  # the main thread's signal mask: what every process a later test starts inherits

    @classmethod
    def now(cls) -> ProcessState:
        return cls(os.getcwd(), tuple(signal.getsignal(s) for s in SIGNALS), _mounts(),
                   frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, ())))


def state_left(before: ProcessState) -> str | None:
    """What a test changed of the process's working directory, signal handlers and mounts since `before`, put back
    where it can be (a mount cannot: it is only named), in one line; None when nothing."""
    now = ProcessState.now()
    changed = []
    if now.cwd != before.cwd:
        os.chdir(before.cwd)
        changed.append(f"the working directory ({now.cwd})")
    for sig, was, is_now in zip(SIGNALS, before.handlers, now.handlers, strict=True):
        if was != is_now:
            signal.signal(sig, was)
            changed.append(f"the {sig.name} handler")
    if now.blocked != before.blocked:
        signal.pthread_sigmask(signal.SIG_SETMASK, before.blocked)
        changed.append("the signal mask (" + ", ".join(signal.Signals(s).name for s in now.blocked ^ before.blocked)
                       + ")")
    added, removed = now.mounts - before.mounts, before.mounts - now.mounts
    if added or removed:
        changed.append("mounts (" + ", ".join([*(f"+{m}" for m in sorted(added)), *(f"-{m}" for m in sorted(removed))])
                       + ")")
    return f"the test left {'; '.join(changed)} changed: restore it on every path" if changed else None
