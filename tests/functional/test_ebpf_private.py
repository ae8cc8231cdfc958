"""The eBPF probe where the host has no bpffs to share its programs through (a container without the host's
/sys/fs/bpf, a machine that boots no systemd): each profiler loads a copy of its own (profiling/probes/
ebpf_private.py), counts exactly as the shared copy does, says once that it is not shared, and leaves nothing
loaded or pinned, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from profiling.metrics import by_call
from profiling.probes import ebpf
from tests.support.bpfhost import kernel_programs
from tests.support.writebench import writebench as built_writebench

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_bpffs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pins' directory moved to a folder that is not bpffs, as on a host without it."""
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    root = tmp_path / "not-bpffs" / "iobatch"
    root.parent.mkdir()
    monkeypatch.setenv("IOBATCH_BPF_PIN", str(root))
    return root


def test_a_profiler_without_bpffs_counts_exactly_with_a_copy_of_its_own(no_bpffs: Path) -> None:
    # `before` may hold programs an earlier profiler unpinned and the kernel is still freeing (it puts a link's last
    # reference in a work item): they may go meanwhile; what this test checks is that none of its own stay
    before = kernel_programs("iob_")
    writebench = built_writebench()
    proc = subprocess.Popen(["sh", "-c", f"read go; {writebench} /dev/null 20000; {writebench} /dev/null 5000 512"],
                            stdin=subprocess.PIPE)
    probe = ebpf.EbpfProbe(interval_s=0.5)
    probe.start(proc.pid)
    try:
        assert kernel_programs("iob_") - before  # loaded, by this profiler
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0
    finally:
        calls = probe.stop()
    assert calls is not None and calls["probe"] == "ebpf"
    assert by_call(calls)["write"]["count"] == 25_000
    assert by_call(calls)["write"]["bytes"] == 20_000 * 4096 + 5_000 * 512
    assert by_call(calls)["write"]["mean_us"] > 0
    [note] = [n for n in calls["notes"] if "not bpffs" in n]  # said once
    assert "own copy" in note and "make setup" in note
    assert not no_bpffs.exists()  # nothing pinned, nowhere
    assert not kernel_programs("iob_") - before  # unloaded with the profiler's descriptors


def test_a_killed_profilers_own_copy_goes_with_it(no_bpffs: Path) -> None:
    """SIGKILL: nothing pinned holds the programs, so the kernel frees them with the process (no watchdog needed)."""
    before = kernel_programs("iob_")
    code = ("import subprocess, time; from profiling.probes import ebpf; job = subprocess.Popen(['sleep', '60']); "
            "p = ebpf.EbpfProbe(); p.start(job.pid); print('started', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "started"
        assert kernel_programs("iob_") - before
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the profiler and its job
        holder.wait(timeout=10)
    deadline = time.monotonic() + 10  # the last descriptors are released just after the process is gone
    while kernel_programs("iob_") - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not kernel_programs("iob_") - before
