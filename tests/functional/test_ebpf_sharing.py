"""One copy of the eBPF programs per host (profiling/probes/ebpf_host.py), against the truth: profilers in separate
processes share one set of programs, eight children writing different amounts at once get exact counts each, a
profiler's SIGKILL does not break the others, and nothing stays loaded after the last profiler leaves, however it
leaves."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from profiling.probes import ebpf, ebpf_host, ebpf_slot, libbpf
from tests.support.bpfhost import builds, slots
from tests.support.writebench import writebench as built_writebench

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
WATCHDOG_S = 30  # a watchdog's start and reap, on a machine shared with other heavy work

# A profiler of its own: the child (a shell that waits, then runs writebench COUNT SIZE) under its probe. It
# prints "ready" once attached, runs the child when told, prints the child's write count and bytes, then waits
# for one more line before it leaves (so a test can look at the host while it is still there).
PROFILER = r"""
import json, subprocess, sys
from profiling.metrics import by_call
from profiling.probes import ebpf
bench, count, size = sys.argv[1:4]
child = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "sh", bench, "/dev/null", count, size],
                         stdin=subprocess.PIPE)
probe = ebpf.EbpfProbe(keep_running=True)  # as the sidecar: loaded until close()
probe.start(child.pid)
print("ready", flush=True)
sys.stdin.readline()
child.stdin.write(b"go\n")
child.stdin.close()
assert child.wait() == 0
write = by_call(probe.stop())["write"]
print(json.dumps({"count": write["count"], "bytes": write["bytes"]}), flush=True)
sys.stdin.readline()
probe.close()
"""


@pytest.fixture
def writebench() -> Iterator[Path]:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    if ebpf_host.loaded_programs():
        pytest.skip("another profiler runs on this host: the test counts what the host holds")
    yield built_writebench()
    assert _gone_within(WATCHDOG_S), "programs still pinned after the test's last profiler left"


def _gone_within(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while ebpf_host.loaded_programs() or builds():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _profiler(bench: Path, count: int, size: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", PROFILER, str(bench), str(count), str(size)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def _say(proc: subprocess.Popen[str], line: str = "go") -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def _finish(*procs: subprocess.Popen[str]) -> None:
    """Let each profiler run to its end and leave, wherever it is (end of input reads as every line it waits for)."""
    for proc in procs:
        if proc.poll() is None and proc.stdin is not None:
            proc.stdin.close()
    for proc in procs:
        proc.wait(timeout=60)


def _result(proc: subprocess.Popen[str]) -> dict[str, int]:
    assert proc.stdout is not None
    return dict(json.loads(proc.stdout.readline()))


# Eight children of one host (a packed host runs one per core), each writing its own count and size.
CHILDREN = [(120_000, 4096), (70_000, 512), (30_000, 1), (25_000, 8192), (20_000, 100), (15_000, 65536),
            (10_000, 4096), (5_000, 1000)]


def test_eight_children_at_once_exact_each_on_one_set_of_programs(writebench: Path) -> None:
    first = _profiler(writebench, *CHILDREN[0])
    alone = ebpf_host.loaded_programs()
    others = [_profiler(writebench, count, size) for count, size in CHILDREN[1:]]
    everyone = [first, *others]
    try:
        # One copy: each later profiler added its slot, not programs.
        assert alone and ebpf_host.loaded_programs() == alone and len(builds()) == 1
        assert slots() == sorted(str(n) for n in range(len(CHILDREN)))
        for proc in everyone:
            _say(proc)  # every child writes at once
        for proc, (count, size) in zip(everyone, CHILDREN, strict=True):
            assert _result(proc) == {"count": count, "bytes": count * size}
        _finish(first)
        assert first.returncode == 0
        # the others still have them
        assert ebpf_host.loaded_programs() == alone and slots() == sorted(str(n) for n in range(1, len(CHILDREN)))
    finally:
        _finish(*everyone)
    assert _gone_within(5)


def test_a_killed_profiler_is_reaped_and_breaks_nobody(writebench: Path) -> None:
    killed = _profiler(writebench, 1000, 4096)
    survivor = _profiler(writebench, 30_000, 4096)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
        # Its watchdog frees its slot as soon as it runs (a Python process: its start-up is seconds on a loaded
        # machine); the survivor's probe goes on, exact.
        deadline = time.monotonic() + WATCHDOG_S
        while slots() != ["1"]:
            assert time.monotonic() < deadline, f"slots {slots()} after a SIGKILL"
            time.sleep(0.1)
        _say(survivor)
        assert _result(survivor) == {"count": 30_000, "bytes": 30_000 * 4096}
        assert ebpf_host.loaded_programs()
    finally:
        _finish(survivor)
    assert _gone_within(5)


def test_a_profiler_killed_with_its_watchdog_is_reaped_by_the_next_one(writebench: Path) -> None:
    """The whole process group gone at once (a container killed): nobody reaps at once; the next profiler on
    the host does when it joins, and nothing is left when it leaves."""
    killed = _profiler(writebench, 1000, 4096)
    watchdogs = [int(p) for p in subprocess.run(["pgrep", "-P", str(killed.pid), "-f", "ebpf_watchdog"],
                                                capture_output=True, text=True).stdout.split()]
    killed.send_signal(signal.SIGSTOP)  # so its watchdog, stopped first, cannot see it die
    for pid in watchdogs:
        os.kill(pid, signal.SIGKILL)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=10)
    assert ebpf_host.loaded_programs() and slots() == ["0"]  # left behind, for now
    later = _profiler(writebench, 500, 4096)
    try:
        assert slots() == ["0"]  # the dead one reaped, its programs with it (nobody was left), loaded anew
        _say(later)
        assert _result(later) == {"count": 500, "bytes": 500 * 4096}
    finally:
        _finish(later)
    assert _gone_within(5)


def test_a_kernel_that_refuses_fentry_is_asked_once_per_boot(writebench: Path, monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """The first load tries fentry, then the tracepoints; where the kernel said EPERM, the host's bpffs keeps the
    answer and the next host's first profiler loads the tracepoints at once. Where fentry loads, nothing is kept.
    A pin root of the test's own: the record is never one another test or person left."""
    root = ebpf_host.DEFAULT_PIN.parent / f"iobatch-test-{os.getpid()}"
    monkeypatch.setenv(ebpf_host.ENV_PIN, str(root))
    tried: list[tuple[str, int | None]] = []  # (hooks, errno of a refusal, None: loaded)
    real = ebpf_slot.load_object

    def load_object(path: Path, hooks: str) -> libbpf.BpfObject:
        try:
            obj = real(path, hooks)
        except libbpf.BpfError as exc:
            tried.append((hooks, exc.errno))
            raise
        tried.append((hooks, None))
        return obj

    monkeypatch.setattr(ebpf_slot, "load_object", load_object)
    record = root / ebpf_host.NO_FENTRY
    try:
        for _ in range(2):
            probe = ebpf.EbpfProbe()
            probe.prepare()
            hooks = probe.hooks
            probe.close()
            assert not builds()
        if hooks == "fentry":
            assert tried == [("fentry", None), ("fentry", None)] and not record.exists()
        elif record.exists():
            assert tried == [("fentry", errno.EPERM), ("tracepoint", None), ("tracepoint", None)]
        else:  # refused for another reason: asked again
            assert [kind for kind, _ in tried] == ["fentry", "tracepoint"] * 2 and tried[0][1] != errno.EPERM
    finally:
        with contextlib.suppress(OSError):
            record.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
