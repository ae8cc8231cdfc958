"""`iobatch profile`'s stop reaches the command's whole process tree (profiling.proctree, issue 44): a SIGTERM
passed on to the group, SIGKILL after the grace period to whatever is left of it; at a terminal the command's
group is the foreground while it runs, so it reads the terminal and Ctrl-C reaches it."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling import command
from profiling.command import profile_command

ROOT = Path(__file__).resolve().parents[2]
# A grandchild that ignores SIGTERM writes its pid, then sleeps; its parent (the command) waits for it.
STUBBORN = "import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " \
           "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """Whether `pid` ended (no such process, or a zombie waiting for its reaper) within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def _sigterm_once(pid_file: Path, *, on_another_thread: bool = False) -> Iterator[None]:
    """SIGTERM to this process once the grandchild wrote its pid and the command's handler is in place, as a
    container's stop sends it (or, `on_another_thread`, delivered to a thread that is not the main one, as the
    kernel may choose); the grandchild is killed afterwards whatever the test found."""
    before = signal.getsignal(signal.SIGTERM)

    def send() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text()
                                                   and signal.getsignal(signal.SIGTERM) is not before):
            time.sleep(0.02)
        if on_another_thread:
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield
    finally:
        sender.join(timeout=30)
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(OSError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.parametrize("leader_ignores", [False, True], ids=["command-ends", "command-ignores-too"])
def test_sigkill_after_the_grace_period_reaches_a_grandchild_that_ignores_sigterm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leader_ignores: bool) -> None:
    monkeypatch.setattr(command, "FORWARD_GRACE_S", 0.5)
    pid_file = tmp_path / "grandchild.pid"
    trap = "trap '' TERM; " if leader_ignores else ""
    argv = ["sh", "-c", f'{trap}"{sys.executable}" -c "{STUBBORN}" "{pid_file}" & wait']
    started = time.monotonic()
    with _sigterm_once(pid_file):
        result = profile_command(argv, interval_s=0.1)
        grandchild = int(pid_file.read_text())
        assert _gone(grandchild, within_s=3.0), "the grandchild that ignores SIGTERM outlived the stop"
    assert result.profile.outcome == "interrupted"
    assert result.returncode == (-signal.SIGKILL if leader_ignores else -signal.SIGTERM)
    assert time.monotonic() - started < 15


def test_a_tree_that_ends_on_sigterm_is_not_kept_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "FORWARD_GRACE_S", 30.0)
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(60)", str(pid_file)]
    started = time.monotonic()
    with _sigterm_once(pid_file):
        result = profile_command(argv, interval_s=0.1)
    assert result.returncode == -signal.SIGTERM and time.monotonic() - started < 10


def test_a_signal_that_lands_on_another_thread_stops_the_command_at_once(tmp_path: Path) -> None:
    """The profiler's wait for the command wakes for it: the handler runs in the main thread only."""
    pid_file = tmp_path / "child.pid"
    argv = [sys.executable, "-c", "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
            "time.sleep(60)", str(pid_file)]
    started = time.monotonic()
    with _sigterm_once(pid_file, on_another_thread=True):
        result = profile_command(argv, interval_s=0.1)
    assert result.returncode == -signal.SIGTERM and time.monotonic() - started < 10


def _session(pid: int) -> Iterator[tuple[Path, str, list[str]]]:
    """Each process of the session `pid` leads: its /proc folder, its name and its stat fields after the name."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().rsplit(")", 1)
            fields = rest.split()
            if int(fields[3]) == pid:  # the session id
                yield stat.parent, comm.split("(", 1)[1], fields
        except (OSError, ValueError, IndexError):
            continue


def _tree_state(pid: int) -> str:
    """For a failure: each process of the session `pid` leads, with its state, wait channel and signal masks."""
    lines = []
    for proc, _, fields in _session(pid):
        try:
            status = dict(line.split(":\t", 1) for line in (proc / "status").read_text().splitlines() if ":\t" in line)
            wchan = (proc / "wchan").read_text()
            cmd = (proc / "cmdline").read_text().replace("\0", " ")[:80]
        except (OSError, ValueError):
            continue
        lines.append(f"{proc.name} {fields[0]} {wchan} blk={status.get('SigBlk')} ign={status.get('SigIgn')} "
                     f"cgt={status.get('SigCgt')} "
                     f"pnd={status.get('SigPnd')}/{status.get('ShdPnd')} {cmd}")
    return "\n".join(lines)


def _session_runs(pid: int, name: str) -> bool:
    """Whether a process called `name` is in the session `pid` leads."""
    return any(comm == name for _, comm, _ in _session(pid))


def _at_a_terminal(words: list[str], keys: bytes, after: bytes, timeout_s: float = 30.0,
                   running: str | None = None) -> tuple[int, str]:
    """`iobatch WORDS` as a terminal's foreground job (a pty, its session): `keys` typed once `after` was printed
    (and, given `running`, a process of that name is in the session). Its exit code and everything it printed."""
    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own whose controlling terminal is the pty
        os.chdir(ROOT)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.execv(sys.executable, [sys.executable, "-m", "pipeline.cli", *words])
    output, typed = b"", False
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the terminal's last process closed it
                    break
                if not chunk:
                    break
                output += chunk
            if not typed and after in output and (running is None or _session_runs(pid, running)):
                os.write(master, keys)
                typed = True
        else:
            state = _tree_state(pid)
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"still running after {timeout_s} s: {output.decode(errors='replace')[-600:]}\n{state}")
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    return os.waitstatus_to_exitcode(status), output.decode(errors="replace")


def test_the_command_reads_the_terminal_it_runs_at() -> None:
    # In a background process group a read of the terminal would stop it (SIGTTIN) for good.
    code, output = _at_a_terminal(["profile", "--interval", "0.1", "--", "sh", "-c",
                                   'echo ready; read x; echo "got $x"'], b"hello\n", b"ready")
    assert code == 0 and "got hello" in output, output[-600:]


def test_ctrl_c_at_the_terminal_reaches_the_command() -> None:
    # Typed once sleep runs: a Ctrl-C between the script's two commands is dash's to defer (it catches SIGINT and
    # acts on it only once its next child, sleep 30, has ended), seen once in a few runs.
    code, output = _at_a_terminal(["profile", "--interval", "0.1", "--", "sh", "-c", "echo ready; sleep 30"],
                                  b"\x03", b"ready", running="sleep")
    assert code == 128 + signal.SIGINT and "Traceback" not in output, output[-600:]


def test_a_cgroup_of_the_commands_own_is_killed_whole_and_a_shared_one_never(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from profiling import proctree

    # A process outside the command's group (it left it, as a daemon does) but inside its cgroup.
    escaped = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        own = tmp_path / "own"
        own.mkdir()
        (own / "cgroup.kill").mkdir()  # cgroup.kill cannot be written (before Linux 5.14): each member is killed
        (own / "cgroup.procs").write_text(f"{escaped.pid}\n")
        paths = {os.getpid(): "/ours"}
        monkeypatch.setattr(proctree, "v2_mount", lambda: tmp_path)
        monkeypatch.setattr(proctree, "v2_path", lambda pid: paths.get(pid, "/own"))
        tree = proctree.ProcessTree(2**22 + 1)  # no such process or group: only the cgroup reaches `escaped`
        paths[tree.pid] = "/ours"  # the cgroup this process is in too: left alone
        tree.kill()
        assert escaped.poll() is None
        del paths[tree.pid]
        tree.kill()
        assert escaped.wait(timeout=5) == -signal.SIGKILL
    finally:
        escaped.kill()
        escaped.wait()
