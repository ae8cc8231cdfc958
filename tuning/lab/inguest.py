"""`iobatch lab --where guest`: the same lab, run inside the cgroup v2 guest (tuning.guest).

The guest is an instance of its own: its scratch disk is throttled by QEMU like the volume (tuning.guest.qemu:
burst, baseline and a bucket of the credits asked for, scaled by --time-scale), and the lab inside it runs with
the hypervisor throttle (tuning.lab.volume) and sets the guest's sysctls, not this machine's. So nothing here
changes (no sysctl, mount, loop device or throttle) and no root is needed. What stays on this machine: the run
directory (shared with the guest read-write, at the same path, so its profiles, reports and S3 data are written
here) and a sparse disk image in a temporary folder, deleted after. The guest's memory is the emulated instance's
plus room for its own processes (the S3 server, the children, their profilers).
"""

from __future__ import annotations

import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tuning.ebs import MIB
from tuning.guest.machine import Guest, GuestError
from tuning.guest.qemu import ScratchDisk, scratch_throttle
from tuning.lab.config import LabConfig, LabError

# The guest's own processes beside the emulated instance's page cache (measured: a lab run's peak in the guest,
# with two children, their profilers and versitygw, stays under 1 GiB).
HEADROOM_MIB = 1536
GUEST_LAB_DIR = "/var/tmp/iobatch-lab"  # the guest's own (its RAM overlay), for the mount point and state


def guest_memory_mib(memory_gib: float) -> int:
    return int(memory_gib * 1024) + HEADROOM_MIB


def credits_for_qemu(config: LabConfig) -> float:
    """The bucket QEMU is given, in MiB: the credits the lab starts with, shrunk by the time scale."""
    return config.initial_credits / config.time_scale


def inner_argv(lab_argv: Sequence[str], run_dir: Path) -> list[str]:
    """The user's `iobatch lab` arguments for the lab inside the guest: run there on the throttled disk, with the
    run directory at the same path (later options win)."""
    return [*lab_argv, "--where", "host", "--throttle", "hypervisor", "--lab-dir", GUEST_LAB_DIR,
            "--run-dir", str(run_dir)]


def run_in_guest(lab_argv: Sequence[str], config: LabConfig, *, memory_gib: float, vcpus: int, run_dir: Path,
                 iobatch: str, env: Mapping[str, str], timeout: float,
                 say: Callable[[str], None] = print) -> int:
    """Boot the guest for this lab, run `iobatch lab ARGV` in it with its output shown as it comes; its exit code."""
    run_dir = run_dir.resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    throttle = scratch_throttle(config.volume, credits_mib=credits_for_qemu(config))
    say(f"lab: in the cgroup v2 guest ({vcpus} vCPUs, {guest_memory_mib(memory_gib)} MiB, Linux 6.1); "
        f"{config.volume.label} throttled by the hypervisor: baseline {throttle.baseline_bps / MIB:.1f} MiB/s"
        + (f", burst {throttle.burst_bps / MIB:.1f} MiB/s for {throttle.burst_seconds} s"
           if throttle.burst_bps > throttle.baseline_bps else "") + "; nothing on this machine changes")

    def forward(stream: str, text: str) -> None:
        (sys.stderr if stream == "stderr" else sys.stdout).write(text)
        (sys.stderr if stream == "stderr" else sys.stdout).flush()

    command = shlex.join([iobatch, "lab", *inner_argv(lab_argv, run_dir)])
    with tempfile.TemporaryDirectory(prefix="iobatch-lab-disk-") as tmp:
        image = Path(tmp) / "scratch.img"
        with image.open("wb") as stream:
            stream.truncate(config.loop_size_mib * MIB)  # sparse
        disk = ScratchDisk(image, throttle)
        try:
            with Guest(vcpus=vcpus, memory_mib=guest_memory_mib(memory_gib), share=run_dir, scratch=disk) as guest:
                result = guest.run(command, timeout=timeout, env=env, on_output=forward)
        except GuestError as exc:
            raise LabError(f"the guest did not run the lab: {exc}") from None
    return result.returncode
