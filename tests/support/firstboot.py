"""The guest tier's first boot (tests/support/guestboots.py boots it once a session): every check that needs no host
prepared by the user data, since each boot is 10-30 s under TCG: the kernel's facts, the raw scratch disk's
throttle, and the eBPF checks (tests/support/guestprobe.py: the probe's fentry hooks and this suite's exact-count
tests, run again inside). The tests that use it read what that boot left."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.packedhost import ST1, scratch_image
from tests.support.writebench import writebench
from tuning.guest.machine import Guest, GuestResult
from tuning.guest.qemu import ScratchDisk, scratch_throttle

REPO = Path(__file__).resolve().parents[2]
# A boot, a first load of the programs with fentry hooks (verified under TCG: ~10 s), the eBPF checks and small runs:
# 60-120 s on two cores. A boot past this is killed (and booted once more: tests/support/guestboots.py).
FIRST_BOOT_TIMEOUT = 420

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
SCRATCH_CHECKED = "== scratch checked"  # printed once the scratch check ends
EBPF_OUT, EBPF_ERR = "ebpf.json", "ebpf.err"  # what tests/support/guestprobe.py printed in the guest
SCRATCH_CHECK = ("dd if=/dev/zero of=/dev/xvdb bs=1M count=40 oflag=direct 2>&1 | tail -1; "
                 f"python3 -c \"{SMALL_WRITES}\"")


@dataclass(frozen=True)
class FirstBoot:
    result: GuestResult
    share: Path  # the folder shared with the guest: what it wrote there
    qemu_left: bool  # a QEMU of this boot still running after it


def qemu_running(share: Path) -> bool:
    return subprocess.run(["pgrep", "-f", f"qemu-system.*{share}"], capture_output=True).returncode == 0


def scratch_checked(stream: str, text: str) -> bool:
    """Whether the first boot's output (Guest.run's on_output) says its scratch check, its timed part, is done."""
    return stream == "stdout" and SCRATCH_CHECKED in text


def boot_first(share: Path, on_output: Callable[[str, str], None] | None = None) -> FirstBoot:
    """Boot the guest once and run, in order, the facts, the scratch disk's check and the eBPF checks; what each
    printed or wrote is in `share`. `on_output`: Guest.run's."""
    bench = writebench().with_name("writebench-static")
    facts = ("uname -r; cat /sys/fs/cgroup/cgroup.subtree_control; test -r /sys/kernel/btf/vmlinux && echo btf; "
             f"echo made-in-guest > {share}/handed-back")
    ebpf_checks = (f"cd {REPO} && PYTHONPATH={REPO} {sys.executable} -m tests.support.guestprobe {bench} "
                   f"> {share / EBPF_OUT} 2> {share / EBPF_ERR}; echo ebpf=$?")
    command = f"{facts}; ({SCRATCH_CHECK}) > {share / SCRATCH_OUT} 2>&1; echo '{SCRATCH_CHECKED}'; {ebpf_checks}"
    disk = ScratchDisk(scratch_image(share), scratch_throttle(ST1, credits_mib=0))
    with Guest(vcpus=2, memory_mib=2048, share=share, scratch=disk) as guest:
        result = guest.run(command, timeout=FIRST_BOOT_TIMEOUT, on_output=on_output)
    return FirstBoot(result, share, qemu_running(share))
