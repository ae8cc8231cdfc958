"""A program run under the eBPF probe from its first instruction: a shell waits on stdin while the probe attaches
to it, then execs the program."""

from __future__ import annotations

import subprocess
from typing import Any

from profiling.probes import ebpf


def run_probed(argv: list[str], *, timeout: float = 300, disk: tuple[int, int] | None = None) -> dict[str, Any]:
    """Run `argv` (exec'd by a waiting shell, so the probe is attached first); the probe's result. `disk`:
    (major, minor) of a disk whose requests the probe classes (EbpfProbe's disk)."""
    proc = subprocess.Popen(["sh", "-c", 'read go; exec "$@"', "sh", *argv], stdin=subprocess.PIPE)
    probe = ebpf.EbpfProbe(disk=disk)
    probe.start(proc.pid)
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(timeout=timeout) == 0
    finally:
        calls = probe.stop()
    assert calls is not None
    return calls
