"""The process tree of a command `iobatch profile` runs: started in a process group of its own, so that a signal
reaches the whole tree and not the command alone, and stopped whole (its cgroup, where it has one of its own).

A signal sent to one pid stops only that process: a grandchild that ignores SIGTERM outlives the command, and a
SIGKILL to the command after the grace period leaves it running. Sent to the group (kill(2) with -pgid), it
reaches every process the command started that did not leave the group (setsid, setpgid: a daemon); a cgroup of
the command's own (systemd-run --scope, a container) holds even those, and cgroup.kill ends it whole (Linux 5.14+,
Documentation/admin-guide/cgroup-v2.rst; each member is signalled on older kernels). The cgroup the command
shares with this process (the eBPF probe carves one for both) is never killed: this process is in it.

A group of its own is a background group at a terminal: a command reading it would be stopped (SIGTTIN). So when
this process is the terminal's foreground, the command's group is made the foreground while it runs, and this
process's taken back after, as a job-control shell does (tcsetpgrp(3)); Ctrl-C then reaches the command's group.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Iterator

from profiling.probes.cgroup import v2_mount, v2_path

__all__ = ["Forwarding", "ProcessTree", "foreground", "forwarding_signals"]


class ProcessTree:
    """The tree of the command `pid`, which leads a process group of its own (Popen's process_group=0)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.reaped = False  # set once the command is reaped: its pid may then be another process's

    def signal(self, signum: int) -> None:
        """`signum` to every process of the group, and to the command itself while it is not reaped (it may have
        left the group); none left is no error."""
        targets = [(os.killpg, self.pid)] + ([] if self.reaped else [(os.kill, self.pid)])
        for send, pid in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(pid, signum)

    def alive(self) -> bool:
        """Whether a process of the group is left (the command itself reaped, or a zombie that counts as one)."""
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member now runs as another user: still there
            return True
        return True

    def kill(self) -> None:
        """SIGKILL to the whole tree: its cgroup when it has one of its own, and its process group."""
        self._kill_own_cgroup()
        self.signal(signal.SIGKILL)

    def stop_by(self, deadline: float) -> None:
        """After a forwarded SIGTERM, once the command itself is reaped: wait until `deadline` (monotonic) for the
        rest of the group to end, then SIGKILL whatever is left (a grandchild that ignores SIGTERM)."""
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            self.kill()

    def _kill_own_cgroup(self) -> None:
        mount, own, ours = v2_mount(), v2_path(self.pid), v2_path(os.getpid())
        if mount is None or own is None or own == ours or "/.." in own or own in ("", "/"):
            return
        folder = mount / own.lstrip("/")
        try:
            (folder / "cgroup.kill").write_text("1")
            return
        except OSError:  # before Linux 5.14, or not ours to write: each member, as far as we may
            pass
        with contextlib.suppress(OSError):
            for pid in (folder / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)


def _terminal() -> int | None:
    """The descriptor of the terminal this process is the foreground of (stdin), or None."""
    try:
        return 0 if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp() else None
    except OSError:
        return None


@contextlib.contextmanager
def foreground(tree: ProcessTree) -> Iterator[None]:
    """While inside, the command's group is the terminal's foreground when this process was (else nothing
    changes); this process's group is the foreground again after, however the block ends."""
    fd = _terminal()
    if fd is None:
        yield
        return
    with contextlib.suppress(OSError):
        os.tcsetpgrp(fd, tree.pid)
    tree.signal(signal.SIGCONT)  # a read before the handover stopped it (SIGTTIN)
    try:
        yield
    finally:
        # Now in the background: the kernel stops a process that sets the foreground unless SIGTTOU is blocked.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
        try:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(fd, os.getpgrp())
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


class Forwarding:
    """Signals this process receives while the command runs, passed on to the command's tree: the stopping ones
    (`signals`) start the grace period, after which the tree is killed (a timer while the command runs, `finish`
    once it is reaped). One received before the tree exists (the command being started) is passed on when it
    is `attach`ed, so no signal falls between the two."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.signals: list[int] = []
        self.deadline = math.inf  # monotonic
        self._tree: ProcessTree | None = None
        self._pending: list[int] = []
        self._timer: threading.Timer | None = None

    def receive(self, signum: int, stops: bool) -> None:
        if stops:
            self.signals.append(signum)
            if self._timer is None:
                self.deadline = time.monotonic() + self.grace_s
                self._timer = threading.Timer(self.grace_s, self._kill)
                self._timer.daemon = True
                self._timer.start()
        if self._tree is None:
            self._pending.append(signum)
        else:
            self._tree.signal(signum)

    def attach(self, tree: ProcessTree) -> None:
        self._tree = tree
        pending, self._pending = self._pending, []
        for signum in pending:
            tree.signal(signum)

    def _kill(self) -> None:
        if self._tree is not None:
            self._tree.kill()

    def finish(self) -> None:
        """Once the command is reaped: when it was told to stop, what is left of its tree ends by the deadline."""
        if self._tree is not None and self.signals:
            self._tree.stop_by(self.deadline)
        if self._timer is not None:
            self._timer.cancel()


@contextlib.contextmanager
def forwarding_signals(grace_s: float) -> Iterator[Forwarding]:
    """While inside, SIGTERM and SIGHUP sent to this process stop the command's tree (a container's stop reaches
    `iobatch profile`, the command's parent, alone), SIGKILL following after `grace_s`; a SIGINT is passed on
    uncounted (at a terminal Ctrl-C reaches the command's group itself, the foreground: `foreground`), and this
    process goes on to write the profile. Only the main thread can set handlers: elsewhere nothing is passed on."""
    forwarding = Forwarding(grace_s)
    if threading.current_thread() is not threading.main_thread():
        yield forwarding
        return

    def stop(signum: int, _frame: object) -> None:
        forwarding.receive(signum, stops=True)

    def interrupt(signum: int, _frame: object) -> None:
        forwarding.receive(signum, stops=False)

    saved = {sig: signal.signal(sig, handler) for sig, handler in
             ((signal.SIGTERM, stop), (signal.SIGHUP, stop), (signal.SIGINT, interrupt))}
    try:
        yield forwarding
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
