"""One attempt's directory on a scratch volume that many children share: claim, lock, sweep, release, full.

A host runs children of several batches on one volume, and a `--force` rerun may run beside the first run, so an
attempt works in a directory named by the attempt (pipeline.interface.task_dir_name), never by its array index:

    SCRATCH/.iobatch-scratch-ready     the host's marker: this is the prepared volume (tuning/host.py)
    SCRATCH/.iobatch-profilers/        the profilers' register of the device (profiling/probes/sharing.py)
    SCRATCH/task-<id>/.lock            flock(2)ed by the job for as long as it runs
    SCRATCH/task-<id>/profiler.sock    the sidecar's socket; .iobatch-calls/ the interposer's records
    SCRATCH/task-<id>/input/, output/, images.jsonl, download.cmds

`Scratch.claim` checks the volume, sweeps the directories of attempts no longer running (a `.lock` nobody holds;
one never locked, after UNCLAIMED_AGE_S), then makes and locks its own; `Scratch.release` removes it, on every exit
path of the job. `full_error` decides a full volume by evidence, the child's own bytes against the volume's size:
permanent when they fill it, else retryable (the neighbours did).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import IobatchError, ScratchError, ScratchUnavailable
from pipeline.interface import ENV, TASK_DIR_PREFIX
from profiling.probes.sharing import sweep_register
from tuning.host import SCRATCH_READY_MARKER

# The evidence that an attempt is running: the kernel drops a flock when the last descriptor of its open file goes,
# "either by an explicit LOCK_UN operation on any of these duplicate file descriptors, or when all such file
# descriptors have been closed" (flock(2)), so a lock nobody holds is a dead attempt's, SIGKILL included.
LOCK_NAME = ".lock"
#: A task directory nobody ever locked is removed after this long (its sidecar made it; the job never came).
UNCLAIMED_AGE_S = 15 * 60.0
#: A child whose own files (and those still to come) fill this share of the volume cannot fit beside
#: anything: the rest is filesystem metadata and the neighbours' few bytes.
ALONE_SHARE = 0.9


def size_text(size: float) -> str:
    """Bytes as GiB or MiB with one decimal, as the headlines print them."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def tree_bytes(path: Path) -> int:
    """The bytes the files under `path` take on the volume (allocated blocks; 0 when it is gone)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


def _lock(path: Path) -> int | None:
    """A descriptor holding an exclusive flock on `path`, or None when another process holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def sweep(root: Path, *, keep: str = "", now: Callable[[], float] = time.time) -> list[str]:
    """Remove the task directories under `root` of attempts that no longer run; return their names."""
    swept: list[str] = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return swept
    for entry in entries:
        if not entry.name.startswith(TASK_DIR_PREFIX) or entry.name == keep:
            continue
        if not entry.is_dir(follow_symlinks=False):
            continue
        path = Path(entry.path)
        fd: int | None = None
        try:
            fd = _lock(path / LOCK_NAME)
            if fd is None:
                continue  # a running attempt holds it
        except FileNotFoundError:
            try:
                if now() - entry.stat(follow_symlinks=False).st_mtime < UNCLAIMED_AGE_S:
                    continue  # young and never locked: its job may be starting
            except OSError:
                continue
        except OSError:
            continue  # not ours to judge (another user's, or unreadable)
        try:
            shutil.rmtree(path, ignore_errors=True)
            if not path.exists():
                swept.append(entry.name)
        finally:
            if fd is not None:
                os.close(fd)
    sweep_register(root)  # the profilers' register: entries of profilers killed with their attempt
    return swept


class Scratch:
    """One attempt's scratch directory: `claim` it first, `release` it on every way out."""

    def __init__(self, root: Path, work_dir: Path, *, require_prepared: bool) -> None:
        self.root = root
        self.work_dir = work_dir
        self.require_prepared = require_prepared
        self._fd: int | None = None

    def check_volume(self) -> None:
        """The root exists, and is the prepared volume when that is required (AWS hosts)."""
        if not self.root.is_dir():
            if self.require_prepared:
                raise self._unprepared("does not exist")
            if self.root.exists():
                raise ScratchError(f"scratch directory {self.root} is a file, not a directory: set {ENV.SCRATCH} to "
                                   "the scratch volume's directory")
            raise ScratchError(f"scratch directory {self.root} does not exist: mount the scratch volume or set "
                               f"{ENV.SCRATCH}")
        if self.require_prepared and not (self.root / SCRATCH_READY_MARKER).is_file():
            raise self._unprepared(f"has no {SCRATCH_READY_MARKER} marker")

    def _unprepared(self, why: str) -> ScratchUnavailable:
        # The host's user data writes the marker on the mounted volume only after every check passed; without
        # it this is the root disk's mount point, so another host (a retry) can run the child.
        return ScratchUnavailable(f"scratch {self.root} {why}: this host did not prepare its scratch volume; "
                                  "the child is retried on another host")

    def claim(self) -> list[str]:
        """Check the volume, sweep dead attempts, make and lock this attempt's directory; return what was swept."""
        self.check_volume()
        swept = sweep(self.root, keep=self.work_dir.name)
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            # Locked under a private name, then renamed: a sweeper never sees an unlocked .lock of a live attempt.
            private = self.work_dir / f"{LOCK_NAME}.{os.getpid()}"
            private.touch()
            fd = _lock(private)
            assert fd is not None, "a fresh private lock file cannot be held by anyone else"
            private.rename(self.work_dir / LOCK_NAME)
            self._fd = fd
            for sub in ("input", "output"):
                shutil.rmtree(self.work_dir / sub, ignore_errors=True)
                (self.work_dir / sub).mkdir()
        except OSError as exc:
            self.release()
            if exc.errno == errno.ENOSPC:  # before this attempt wrote a byte: the neighbours filled the volume
                raise self.full_error("starting") from None
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise ScratchError(f"scratch directory {self.work_dir} is not writable ({exc.strerror}): fix the "
                                   f"owner or mode of {self.root}, or set {ENV.SCRATCH}") from None
            raise ScratchError(f"scratch directory {self.root} cannot hold files ({exc.strerror}): set "
                               f"{ENV.SCRATCH} to a directory on a writable disk volume") from None
        return swept

    def release(self) -> None:
        """Remove this attempt's directory (its lock goes last, so no sweeper races the removal)."""
        shutil.rmtree(self.work_dir, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def check_fits(self, needed_bytes: int) -> None:
        """Fail for good, before downloading, when the child's inputs alone exceed the volume."""
        total = shutil.disk_usage(self.root).total
        if needed_bytes > total:
            raise ScratchError(f"scratch volume {self.root} ({size_text(total)}) is smaller than this child's "
                               f"{size_text(needed_bytes)} of images: use a bigger volume (see `iobatch advise`) "
                               "or fewer images per job")

    def full_error(self, what: str, *, at_least: int = 0) -> IobatchError:
        """The error for a full volume, by evidence: permanent (65) when this child's own files (at least
        `at_least` bytes: its whole download) would fill it alone; else transient (75): the neighbours' did."""
        usage = shutil.disk_usage(self.root)
        own = tree_bytes(self.work_dir)
        need = max(own, at_least)
        if need >= ALONE_SHARE * usage.total:
            return ScratchError(f"scratch volume {self.root} ({size_text(usage.total)}) is full while {what}, "
                                f"this child's own files need {size_text(need)}: use a bigger volume (see "
                                "`iobatch advise`) or fewer images per job")
        others = max(0, usage.used - own)
        return ScratchUnavailable(f"scratch volume {self.root} ({size_text(usage.total)}) is full while {what}, "
                                  f"but this child needs only {size_text(need)}; other children hold "
                                  f"{size_text(others)}: the child is retried")
