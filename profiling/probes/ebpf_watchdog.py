"""A profiler's watchdog: reaps its slot of the host's shared eBPF programs (profiling/probes/ebpf_host.py) when
the profiler dies without leaving, SIGKILL included, so the last profiler's death leaves nothing loaded.

    python -S -c WATCHDOG ROOT SLOT_DIR   (stdin: the read end of the profiler's pipe; ebpf_slot.WATCHDOG)

The profiler starts it in a session of its own and keeps the pipe's write end; the kernel closes it however the
profiler ends. When the profiler left normally its slot is gone already and the watchdog exits having imported
nothing of this project (`python -m` would import `profiling` and `profiling.probes` first, ~0.1 s, and a profiler's
stop waits for its watchdog): this module and libbpf's bindings are imported only to reap.
"""

from __future__ import annotations

import contextlib
import os
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
