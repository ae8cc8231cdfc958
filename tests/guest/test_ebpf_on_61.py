"""The eBPF probe on the AL2023 kernel line (the cgroup v2 guest's Debian 6.1): the programs take their fentry/fexit
hooks there (this build machine's kernel refuses them, so only here do they run), one copy serves two profilers,
a static program's and forked processes' writes are exact, and nothing stays pinned after the last one leaves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.support.writebench import writebench
from tuning.guest.machine import Guest, unavailable

if reason := unavailable():
    pytest.skip(f"no cgroup v2 guest: {reason}", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
BOOT_TIMEOUT = 900  # a boot, a first load of the programs (verified under TCG: ~10 s) and three small runs

# In the guest: a profiler holding the programs, a second one running a static program, then forked ones.
CHECK = r"""
import json, os, subprocess, sys
from profiling.metrics import by_call
from profiling.probes import ebpf, ebpf_host
from tests.support.probed import run_probed
bench = sys.argv[1]
idle = subprocess.Popen(["sleep", "600"])
holder = ebpf.EbpfProbe(keep_running=True)
holder.start(idle.pid)
out = {"release": os.uname().release, "hooks": holder._loaded.slot.hooks, "programs": len(ebpf_host.loaded_programs())}
static = by_call(run_probed([bench, "/dev/null", "3000", "4096"]))["write"]
out["shared"] = len(ebpf_host.loaded_programs())
forked = by_call(run_probed(["sh", "-c", f"{bench} /dev/null 500 512 & {bench} /dev/null 700 100; wait"]))["write"]
out["static"] = [static["count"], static["bytes"]]
out["forked"] = [forked["count"], forked["bytes"]]
holder.close()
idle.kill()
out["left"] = sorted(ebpf_host.loaded_programs())
print(json.dumps(out))
"""


def test_fentry_hooks_exact_counts_and_nothing_left_on_61(tmp_path: Path) -> None:
    bench = writebench().with_name("writebench-static")
    (tmp_path / "check.py").write_text(CHECK)
    with Guest(vcpus=2, memory_mib=2048, share=tmp_path) as guest:
        result = guest.run(f"cd {REPO} && PYTHONPATH={REPO} {sys.executable} {tmp_path / 'check.py'} {bench}",
                           timeout=BOOT_TIMEOUT)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["release"].startswith("6.1.")
    assert out["hooks"] == "fentry"
    assert out["programs"] > 0 and out["shared"] == out["programs"]  # the second profiler added none
    assert out["static"] == [3000, 3000 * 4096]
    assert out["forked"] == [1200, 500 * 512 + 700 * 100]
    assert out["left"] == []
