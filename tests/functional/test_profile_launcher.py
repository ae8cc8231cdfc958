"""`iobatch profile -- CMD` counts the command's calls and nothing of its own: whatever the launcher runs around the
command (its watchdog importing its modules, its own reads) is not the command's. Checked against strace on the same
binary, run now, so the truth is this machine's libc's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.interface import EXIT_USAGE
from profiling.probes import ebpf, ebpf_host
from tests.support.bpfhost import builds

pytestmark = pytest.mark.root


def _strace_counts(argv: list[str]) -> tuple[int, int, int, set[str]]:
    """(opens, reads, bytes read, files opened) of `argv` as strace sees its system calls."""
    out = subprocess.run(["strace", "-f", "-e", "trace=open,openat,read,pread64,readv,preadv,preadv2", *argv],
                         capture_output=True, text=True, check=True).stderr
    opens = re.findall(r'open(?:at)?\((?:AT_FDCWD, )?"([^"]+)".*= (\d+)$', out, re.M)
    reads = [int(n) for n in re.findall(r"^(?:\[pid +\d+\] )?(?:read|pread64|readv|preadv2?)\(.*= (\d+)$", out, re.M)]
    return len(opens), len(reads), sum(reads), {path for path, _fd in opens}


def test_profiling_true_counts_only_trues_own_opens_and_reads(tmp_path: Path) -> None:
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    if shutil.which("strace") is None:
        pytest.skip("needs strace (make setup installs it)")
    opens, reads, read_bytes, files = _strace_counts(["/bin/true"])
    out = tmp_path / "true.json"
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "profile", "--json", str(out), "--", "/bin/true"],
                          capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
    assert done.returncode == 0, done.stderr
    profile = json.loads(out.read_text())
    assert profile["sources"]["calls"] == "ebpf", profile["sources"]
    calls = profile["calls"]["calls"]
    assert calls["open"]["count"] == opens, calls
    assert (calls["read"]["count"], calls["read"]["bytes"]) == (reads, read_bytes), calls
    assert {path for path in profile["calls"]["files"]["by_path"] if path} == {os.path.realpath(f) for f in files}
    # procfs counts more: the kernel's own reads of the binary and its interpreter at exec (fs/read_write.c,
    # __kernel_read: add_rchar and inc_syscr), which are no system call of the command's; never fewer.
    assert profile["read_calls"] >= reads and profile["read_bytes"] >= read_bytes


def test_a_bad_flag_is_refused_before_the_probe_loads(tmp_path: Path) -> None:
    """Every flag is checked before the probe loads the host's programs: a contract that cannot be read ends the
    command with a usage error, and nothing was loaded."""
    reason = ebpf.available()
    if reason is not None:
        pytest.skip(reason)
    if ebpf_host.loaded_programs() or builds():
        pytest.skip("another profiler runs on this host: the test counts what the host holds")
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "profile", "--contract", str(tmp_path / "none.yaml"),
                           "--", "/bin/true"], capture_output=True, text=True)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stderr.count("\n") == 1 and "--contract" in done.stderr, done.stderr
    assert not ebpf_host.loaded_programs() and not builds()
