"""A workload that waits for a go: probes attach to it first, and only its own work is measured."""

from __future__ import annotations

import resource
import subprocess


def gated(argv: list[str]) -> subprocess.Popen[bytes]:
    """`argv` started behind a shell that waits for a line on stdin before it execs it."""
    return subprocess.Popen(["sh", "-c", 'read go; exec "$0" "$@"', *argv], stdin=subprocess.PIPE)


def released_cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """Release a gated process and wait for it: its CPU seconds (user + system, wait4)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.close()
    proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
