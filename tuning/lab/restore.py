"""Every kernel setting the lab changes, recorded before it is changed and restored on every exit path.

The state file (`state.json` in the state directory) names the sysctls' original values, the loop device,
its backing file, the mount point, the throttle rules and the proactive reclaim it paused (tuning.lab.damon).
It is restored by the lab itself on normal exit, exception, SIGINT, SIGTERM and SIGHUP (LabInterrupted unwinds
every `finally`); by a small guard process that waits on the lab's pid after SIGKILL; by the next lab run, which
finds the state of a crashed one and cleans up first; and by hand with `recover()` (`iobatch lab --recover`).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from profiling.probes.procfs import read_mount_points, read_process_state, read_start_time
from tuning.host import sysctl_path
from tuning.lab import damon
from tuning.lab.config import DEFAULT_STATE_DIR, LabError

STATE_NAME = "state.json"
BLKIO_ROOT = Path("/sys/fs/cgroup/blkio")
# Bytes per second only. An I/O-rate limit (HDD: one I/O <= 1 MiB per MiB/s) would act on bios before
# the block layer merges them, and so slow sequential writeback far below what st1 delivers (EBS merges
# sequential I/O). Small I/O is charged in full against the credits instead (CreditController.charge).
THROTTLE_FILES = ("blkio.throttle.write_bps_device", "blkio.throttle.read_bps_device")
# Every page-cache sysctl the lab may write; all are recorded before the first write.
DIRTY_SYSCTLS: tuple[str, ...] = (
    "vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_background_bytes",
    "vm.dirty_expire_centisecs", "vm.dirty_writeback_centisecs",
)
INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class LabInterrupted(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived; raised in the main thread so every `finally` runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def install_interrupt_handlers() -> dict[int, Any]:
    """Make the interrupt signals raise LabInterrupted; returns the handlers they replaced (none off the main
    thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: FrameType | None) -> None:
        raise LabInterrupted(signum)

    return {signum: signal.signal(signum, handler) for signum in INTERRUPT_SIGNALS}


# ---- sysctls -------------------------------------------------------------------------------------------


def read_sysctl(key: str) -> str:
    """The current value of a sysctl such as 'vm.dirty_bytes'."""
    return Path(sysctl_path(key)).read_text(encoding="ascii").strip()


def write_sysctl(key: str, value: str) -> None:
    """Set a sysctl (root only)."""
    Path(sysctl_path(key)).write_text(value + "\n", encoding="ascii")


# ---- the state file ------------------------------------------------------------------------------------


def state_path(state_dir: Path) -> Path:
    """Where the state of a lab with this state directory lives."""
    return state_dir / STATE_NAME


def write_state(state_dir: Path, state: Mapping[str, Any]) -> None:
    """Replace the state file atomically (a reader never sees half of it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    tmp = state_dir / (STATE_NAME + ".partial")
    tmp.write_text(json.dumps(state, indent=1), encoding="utf-8")
    os.replace(tmp, state_path(state_dir))


def read_state(state_dir: Path = DEFAULT_STATE_DIR) -> dict[str, Any] | None:
    """The recorded state, None when there is none (nothing to restore)."""
    path = state_path(state_dir)
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except ValueError:
        # A torn write cannot happen (os.replace), but a hand-edited file can: treat it as empty state.
        return {}


def new_state(*, backing: Path | None, mount: Path) -> dict[str, Any]:
    """The state of a lab about to start in this process: its identity and the sysctls as they are now."""
    pid = os.getpid()
    start = read_start_time(pid)
    return {
        "pid": pid, "pid_start": None if start is None else str(start), "started": time.time(),
        "sysctls": {key: read_sysctl(key) for key in DIRTY_SYSCTLS},
        "backing": None if backing is None else str(backing), "mount": str(mount),
    }


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False)


# ---- restoring -----------------------------------------------------------------------------------------


def restore(state: Mapping[str, Any], *, say: Callable[[str], None] = lambda _: None) -> list[str]:
    """Undo everything a state records, in the safe order; returns the problems (empty when all went well).

    Throttle off first (so unmounting flushes at full speed), then unmount, detach, delete the backing
    file (with the FUSE device: unmount it, end its daemon, delete its store), restore the sysctls in
    the form (ratio or bytes) they had, and turn the host's proactive reclaim back on (tuning.lab.damon).
    """
    problems: list[str] = []
    fuse: Mapping[str, Any] = state.get("fuse") or {}
    if fuse.get("stats"):
        # The FUSE device's "throttle off": it serves at full speed from its next stats tick.
        with contextlib.suppress(OSError):
            Path(fuse["stats"]).with_suffix(".unthrottle").touch()
    devno = state.get("devno")
    for name, original in (state.get("throttle") or {}).items():
        path = BLKIO_ROOT / name
        try:
            path.write_text(f"{devno} {original}\n", encoding="ascii")
        except OSError as exc:
            # Writing 0 for a device without a rule fails with ENODEV on some kernels: that is the goal.
            if original != 0 or _has_rule(path, str(devno)):
                problems.append(f"{path}: {exc}")
    mount = state.get("mount")
    if mount and _is_mounted(mount):
        for attempt in range(10):
            result = _run(["umount", mount])
            if result.returncode == 0:
                break
            if attempt == 9:
                # Something still has files open (a killed child's leftovers): detach lazily.
                lazy = _run(["umount", "-l", mount])
                if lazy.returncode != 0:
                    problems.append(f"umount {mount}: {result.stderr.strip() or lazy.stderr.strip()}")
            time.sleep(0.3)
    backing = state.get("backing")
    if backing:
        listed = set(_run(["losetup", "-j", backing, "-O", "NAME", "-n"]).stdout.split())
        # A dead FUSE daemon makes the backing path unreadable, so `losetup -j` cannot match it: the
        # recorded device is detached too when the kernel still names this backing file for it.
        device = str(state.get("device") or "")
        if device and _loop_backing(device) == backing:
            listed.add(device)
        for device in sorted(listed):
            result = _run(["losetup", "-d", device])
            if result.returncode != 0:
                problems.append(f"losetup -d {device}: {result.stderr.strip()}")
        if fuse:
            problems.extend(_restore_fuse(fuse))
        with contextlib.suppress(FileNotFoundError):
            Path(backing).unlink()
    sysctls: Mapping[str, str] = state.get("sysctls") or {}
    problems.extend(_restore_sysctls(sysctls))
    problems.extend(damon.resume(state.get("damon") or {}))
    if problems:
        say("lab restore problems: " + "; ".join(problems))
    return problems


def _loop_backing(device: str) -> str | None:
    # /sys/block/loopN/loop/backing_file (drivers/block/loop.c, loop_attr_backing_file_show).
    with contextlib.suppress(OSError):
        return Path(f"/sys/block/{Path(device).name}/loop/backing_file").read_text(encoding="utf-8").strip()
    return None


def _restore_fuse(fuse: Mapping[str, Any]) -> list[str]:
    """Unmount the FUSE device (its daemon then exits), end the daemon if it is still there, delete its store."""
    problems: list[str] = []
    mount = fuse.get("mount")
    if mount and _is_mounted(mount):
        result = _run(["fusermount3", "-u", "-z", mount])
        if result.returncode != 0 and _run(["umount", "-l", mount]).returncode != 0:
            problems.append(f"fusermount3 -u {mount}: {result.stderr.strip()}")
    pid = int(fuse.get("pid") or 0)
    if pid and _pid_alive(pid) and str(read_start_time(pid)) == str(fuse.get("pid_start")):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if mount:
        with contextlib.suppress(OSError):
            Path(mount).rmdir()
    for key in ("store", "stats"):
        if fuse.get(key):
            for path in (Path(fuse[key]), Path(fuse[key]).with_suffix(".unthrottle")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
    return problems


def _restore_sysctls(original: Mapping[str, str]) -> list[str]:
    # dirty_bytes and dirty_ratio exclude each other: writing one zeroes the other. Write back the one
    # that was in force (non-zero), which also resets its partner to what it was (zero).
    problems: list[str] = []
    order: list[str] = []
    for ratio, nbytes in (("vm.dirty_ratio", "vm.dirty_bytes"),
                          ("vm.dirty_background_ratio", "vm.dirty_background_bytes")):
        if ratio in original and nbytes in original:
            order.append(nbytes if original[nbytes] != "0" else ratio)
    order += [k for k in ("vm.dirty_expire_centisecs", "vm.dirty_writeback_centisecs") if k in original]
    for key in order:
        try:
            if read_sysctl(key) != original[key]:
                write_sysctl(key, original[key])
        except OSError as exc:
            problems.append(f"{key}: {exc}")
    for key, value in original.items():
        with contextlib.suppress(OSError):
            if read_sysctl(key) != value:
                problems.append(f"{key} is {read_sysctl(key)} after restore, not {value}")
    return problems


def _has_rule(path: Path, devno: str) -> bool:
    with contextlib.suppress(OSError):
        return any(line.split()[0] == devno for line in path.read_text(encoding="ascii").splitlines() if line)
    return False


def _is_mounted(mount: str) -> bool:
    points = read_mount_points()
    # Unknown (mounts unreadable): try to unmount; umount of something not mounted only fails.
    return points is None or os.path.realpath(mount) in points


def close_state(state_dir: Path, state: Mapping[str, Any], *, say: Callable[[str], None]) -> bool:
    """Restore a state and delete its file; keep the file (and say so) when something could not be restored.
    Returns True when everything was restored."""
    problems = restore(state, say=say)
    if problems:
        say(f"lab: state kept in {state_dir} for `iobatch lab --recover`")
        return False
    with contextlib.suppress(FileNotFoundError):
        state_path(state_dir).unlink()
    return True


def recover(state_dir: Path = DEFAULT_STATE_DIR, *, say: Callable[[str], None] = print) -> bool:
    """Clean up after a lab that died. Returns True if there was something to clean up.

    Refuses (LabError) when the lab that wrote the state is still running.
    """
    state = read_state(state_dir)
    if state is None:
        return False
    pid = int(state.get("pid", 0))
    if pid and pid != os.getpid() and _pid_alive(pid) and _looks_like_lab(pid, state):
        raise LabError(f"another lab (pid {pid}) is running with state in {state_dir}: wait for it or stop it")
    say(f"cleaning up after an earlier lab run (pid {pid}): {state.get('mount')} on {state.get('device')}")
    problems = restore(state, say=say)
    if problems:
        raise LabError("could not restore everything: " + "; ".join(problems))
    with contextlib.suppress(FileNotFoundError):
        state_path(state_dir).unlink()
    return True


def _pid_alive(pid: int) -> bool:
    # A zombie (exited, not yet reaped by its parent) is dead for our purposes.
    return read_process_state(pid) not in (None, "Z", "X")


def _looks_like_lab(pid: int, state: Mapping[str, Any]) -> bool:
    # A reused pid is another program: compare the process start time recorded with the state.
    start = read_start_time(pid)
    return start is not None and str(start) == str(state.get("pid_start"))


# ---- the guard process ---------------------------------------------------------------------------------


def start_guard(state_dir: Path) -> None:
    """Start the guard process: it restores this process's state if this process dies without doing so."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)}
    subprocess.Popen(
        [sys.executable, "-m", "tuning.lab", "guard", str(state_dir), str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        cwd="/", env=env, start_new_session=True, close_fds=True,
    )


def guard(state_dir: Path, owner: int) -> int:
    """Wait for the lab process `owner` to end; if its state is still there, restore it. Returns an exit code."""
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        pidfd = -1
    try:
        while pidfd >= 0:
            ready, _, _ = select.select([pidfd], [], [], 0.5)
            if ready:
                break
            if read_state(state_dir) is None:
                return 0  # the lab cleaned up itself
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    state = read_state(state_dir)
    if state is None or int(state.get("pid", 0)) != owner:
        return 0
    try:
        recover(state_dir, say=lambda _: None)
    except LabError:
        return 1
    return 0
