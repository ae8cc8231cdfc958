"""How many children share the scratch device: a register of the profilers on one volume.

Every profiler beside a child holds, for as long as it runs, an exclusive flock(2) on a file of its own in
`<scratch root>/.iobatch-profilers/`. A lock lives with the open file, so it is released when its holder
dies, however it dies, and it is seen across containers, which share the host's kernel and the volume.
Counting the held locks counts the children on the device at that instant, whatever their batch or pid
namespace. A file is locked before it is put in place (rename(2) is atomic), so a file in place whose
lock can be taken is a dead profiler's, and is removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from pathlib import Path

DIR_NAME = ".iobatch-profilers"


class DeviceRegister:
    """This profiler's entry in the register of the volume holding `scratch_root`."""

    def __init__(self, scratch_root: Path) -> None:
        self.directory = Path(scratch_root) / DIR_NAME
        self._name = f"{uuid.uuid4().hex}.lock"
        self._fd: int | None = None

    def join(self) -> None:
        """Put this profiler in the register. Raises OSError when the volume is not writable."""
        if self._fd is not None:
            return
        try:
            self._join()
        except FileNotFoundError:  # the last profiler to leave removed the directory meanwhile
            self._join()

    def _join(self) -> None:
        self.directory.mkdir(mode=0o1777, exist_ok=True)
        with contextlib.suppress(OSError):
            self.directory.chmod(0o1777)  # children of other users register here too
        staging = self.directory / f".{self._name}"
        fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(staging, self.directory / self._name)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                staging.unlink()
            raise
        self._fd = fd

    def count(self) -> int | None:
        """Profilers registered on the volume now, this one included; None when not registered."""
        if self._fd is None:
            return None
        others = _count_alive(self.directory, own=self._name)
        return None if others is None else others + 1

    def leave(self) -> None:
        """Take this profiler out of the register (idempotent, never raises)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            (self.directory / self._name).unlink()
        os.close(self._fd)
        self._fd = None
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # only when empty: nothing is left on scratch


def _count_alive(directory: Path, *, own: str) -> int | None:
    """Registered profilers other than `own` whose lock is held; the entries of dead ones are removed."""
    try:
        names = os.listdir(directory)
    except OSError:
        return None
    alive = 0
    for name in names:
        if name == own or not name.endswith(".lock") or name.startswith("."):
            continue
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue  # removed meanwhile
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        else:
            with contextlib.suppress(OSError):
                path.unlink()  # its profiler is gone
        finally:
            os.close(fd)
    return alive


def sweep_register(scratch_root: Path) -> None:
    """Remove the entries of profilers that died without leaving (SIGKILL), and the register once empty.

    For whoever cleans the volume when no profiler may start again there (the job's scratch sweep), so a
    killed profiler leaves nothing behind.
    """
    directory = Path(scratch_root) / DIR_NAME
    _count_alive(directory, own="")
    with contextlib.suppress(OSError):
        directory.rmdir()  # only when empty: a live profiler's entry keeps it
