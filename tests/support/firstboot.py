"""The guest tier's first boot (tests/guest/conftest.py boots it once a session): every check that needs no host
prepared by the user data, since each boot is 10-30 s under TCG: the kernel's facts, the raw scratch disk's
throttle, the exact-count eBPF tests of this suite run again inside, and the probe's fentry hooks. The tests that
use it read what that boot left."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.support.packedhost import ST1, scratch_image
from tests.support.writebench import writebench
from tuning.guest.machine import Guest, GuestError, GuestResult
from tuning.guest.qemu import ScratchDisk, scratch_throttle

REPO = Path(__file__).resolve().parents[2]
# A boot, the eBPF tests, a first load of the programs with fentry hooks (verified under TCG: ~10 s) and small runs:
# 100-120 s on two cores. A boot past this is killed and booted once more (see boot_first).
FIRST_BOOT_TIMEOUT = 420

# The exact-count eBPF tests of this suite, run again inside the guest: CO-RE relocates the object built against
# this machine's kernel onto 6.1's, and the counts must hold there too. Their files live on the guest's tmpfs: on the
# 9p share the per-file records miss a file written with pwrite (9p's own write path), which no Batch host has.
EBPF_EXACT = ("tests/functional/test_ebpf.py::test_counts_every_write_of_the_process_tree",
              "tests/functional/test_ebpf.py::test_min_and_max_are_exact_with_one_slow_call",
              "tests/functional/test_ebpf.py::test_a_job_in_a_pid_namespace_is_found_and_counted",
              "tests/functional/test_ebpf_files.py::test_two_files_exact_per_file_with_their_access_pattern")

# The scratch disk, raw, as st1 500 GiB past its cliff (credits 0): 40 MiB in 1 MiB writes, then 40 small random
# ones from one process (a dd each would time its own start under TCG, not the disk), each with O_DIRECT so the
# guest's page cache does not hide the disk; what dd and the small writes' clock said, in SCRATCH_OUT.
SCRATCH_OUT = "scratch.txt"
SMALL_WRITES = ("import mmap, os, time\n"
                "fd = os.open('/dev/xvdb', os.O_WRONLY | os.O_DIRECT)\n"
                "block = mmap.mmap(-1, 4096)\n"
                "start = time.monotonic()\n"
                "for i in range(1, 41):\n"
                "    os.pwrite(fd, block, i * 7919 * 4096 % (1 << 30))\n"
                "print('small', time.monotonic() - start)\n")
SCRATCH_CHECK = ("dd if=/dev/zero of=/dev/xvdb bs=1M count=40 oflag=direct 2>&1 | tail -1; "
                 f"python3 -c \"{SMALL_WRITES}\"")


# In the guest: a profiler holding the programs, a second one running a static program, then forked ones.
FENTRY_CHECK = r"""
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


@dataclass(frozen=True)
class FirstBoot:
    result: GuestResult
    share: Path  # the folder shared with the guest: what it wrote there
    qemu_left: bool  # a QEMU of this boot still running after it


def qemu_running(share: Path) -> bool:
    return subprocess.run(["pgrep", "-f", f"qemu-system.*{share}"], capture_output=True).returncode == 0


def boot_first(share: Path) -> FirstBoot:
    """Boot the guest once and run, in order, the facts, the scratch disk's check, the eBPF tests and the fentry
    check; what each printed or wrote is in `share`."""
    (share / "fentry_check.py").write_text(FENTRY_CHECK)
    bench = writebench().with_name("writebench-static")
    facts = ("uname -r; cat /sys/fs/cgroup/cgroup.subtree_control; test -r /sys/kernel/btf/vmlinux && echo btf; "
             f"echo made-in-guest > {share}/handed-back")
    ebpf_tests = (f"cd {REPO} && {sys.executable} -m pytest -q -p no:cacheprovider -o addopts= "
                  "--basetemp=/tmp/ebpf-tests " + " ".join(EBPF_EXACT) + f" > {share}/ebpf.log 2>&1; echo ebpf=$?")
    fentry = (f"cd {REPO} && PYTHONPATH={REPO} {sys.executable} {share / 'fentry_check.py'} {bench} "
              f"> {share}/fentry.json 2> {share}/fentry.err; echo fentry=$?")
    command = f"{facts}; ({SCRATCH_CHECK}) > {share / SCRATCH_OUT} 2>&1; {ebpf_tests}; {fentry}"
    disk = ScratchDisk(scratch_image(share), scratch_throttle(ST1, credits_mib=0))
    try:
        with Guest(vcpus=2, memory_mib=2048, share=share, scratch=disk) as guest:
            result = guest.run(command, timeout=FIRST_BOOT_TIMEOUT)
    except GuestError as first:
        # Seen once (2026-11-26) in about ten first boots: both vCPUs of the TCG guest in soft lockup ("watchdog:
        # BUG: soft lockup - CPU#0 stuck for 45s! [python]") from the in-guest pytest's first seconds until the
        # kill, the tests' output empty. The second boot is the check; the first one's console is kept beside it.
        (share / "first-attempt.txt").write_text(str(first))
        print(f"the guest's first boot did not finish; booting once more: {str(first)[:200]}", file=sys.stderr)
        with Guest(vcpus=2, memory_mib=2048, share=share, scratch=disk) as guest:
            result = guest.run(command, timeout=FIRST_BOOT_TIMEOUT)
    return FirstBoot(result, share, qemu_running(share))
