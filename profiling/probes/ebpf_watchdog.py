"""A profiler's watchdog: reaps its slot of the host's shared eBPF programs (profiling/probes/ebpf_host.py) when
the profiler dies without leaving, SIGKILL included, so the last profiler's death leaves nothing loaded.

    python -m profiling.probes.ebpf_watchdog ROOT SLOT_DIR      (stdin: the read end of the profiler's pipe)

The profiler starts it in a session of its own and keeps the pipe's write end; the kernel closes it however the
profiler ends. When the profiler left normally its slot is gone already and the watchdog just exits.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from profiling.probes.ebpf_host import host_lock, reap


def watch(root: Path, slot_dir: Path, patience_s: float = 30.0) -> None:
    """The watchdog: wait until the profiler's pipe closes (it left, or died), then reap under the lock until its
    slot is gone. A dying process's files are released one by one after it is gone (their last fput runs as task
    work, not in the order they were opened): the pipe may close while the slot's lock is still held, so a
    single look could find the slot alive."""
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    deadline = time.monotonic() + patience_s
    while slot_dir.exists() and time.monotonic() < deadline:
        with contextlib.suppress(Exception), host_lock(root):
            reap(root)
        time.sleep(0.05)


if __name__ == "__main__":
    if len(sys.argv) == 3:
        watch(Path(sys.argv[1]), Path(sys.argv[2]))
