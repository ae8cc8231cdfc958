"""What the lab builds (LabConfig) and its validation; the page-cache sysctls of an emulated memory size.

Nothing here changes the machine; `LabConfig.validate` reads only the kernel release.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from tuning.ebs import Volume
from tuning.host import HostTuning
from tuning.writecache import DIRTYABLE_FRACTION

DEFAULT_STATE_DIR = Path("/run/iobatch-lab")
DEFAULT_LAB_DIR = Path("/var/tmp/iobatch-lab")
THROTTLES = ("fuse", "blkio", "hypervisor")


class LabError(Exception):
    """The lab cannot run here or was misused; the message names the cause and the fix."""


@dataclass(frozen=True)
class LabConfig:
    """What to build. The defaults are the case study's volume: st1, 500 GiB."""

    volume: Volume = field(default_factory=lambda: Volume("st1", 500))
    lab_dir: Path = DEFAULT_LAB_DIR  # holds the backing file and the mount point
    state_dir: Path = DEFAULT_STATE_DIR
    loop_size_mib: int = 4096  # the file system's size (sparse: only written blocks take space)
    time_scale: float = 1.0  # the bucket is 1/time_scale of the real one: burst minutes shrink by it
    initial_credits_mib: float | None = None  # at the real volume's scale; default a full bucket
    tuning: HostTuning = field(default_factory=HostTuning)  # filesystem and mount options
    tick_s: float = 0.1
    # Hold the bucket empty: the volume runs at baseline throughout, as after the credit cliff under
    # sustained load (idle time in the lab, e.g. while the demo uploads its dataset, earns nothing).
    hold_empty: bool = False
    guard: bool = True  # start the guard process that restores after SIGKILL
    # How the volume is slowed: "fuse" (a fixed-rate FUSE device under the loop device: any kernel, cgroup v1
    # or v2, and AWS's HDD accounting by offset), "blkio" (the root blkio cgroup: cgroup v1 only) or
    # "hypervisor" (inside the guest of tuning.guest: `device` is a disk QEMU already throttles like the volume).
    throttle: str = "fuse"
    device: Path | None = None  # "hypervisor" only: the throttled disk (default tuning.host.SCRATCH_DEVICE_NAME)

    def validate(self, kernel_release: str | None = None) -> None:
        """Raise LabError if the lab cannot build this; the mount options are checked for `kernel_release`
        (default: this machine's kernel)."""
        if not self.volume.bursts and self.volume.kind not in ("gp3", "io2"):
            raise LabError(f"{self.volume.label} cannot be emulated")
        if self.loop_size_mib < 300:
            raise LabError(f"loop size {self.loop_size_mib} MiB is too small for XFS: give at least 300")
        if self.time_scale < 1:
            raise LabError(f"time scale {self.time_scale} must be at least 1 (1 = real time)")
        if self.initial_credits_mib is not None and not 0 <= self.initial_credits_mib <= \
                self.volume.credit_capacity:
            raise LabError(f"initial credits {self.initial_credits_mib:.0f} MiB are outside 0-"
                           f"{self.volume.credit_capacity:.0f} MiB for {self.volume.label}")
        if self.throttle not in THROTTLES:
            raise LabError(f"throttle {self.throttle!r} is not one of {', '.join(THROTTLES)}")
        if self.device is not None and self.throttle != "hypervisor":
            raise LabError(f"a device ({self.device}) is only given with the hypervisor throttle")
        if self.tuning.filesystem != "xfs":
            raise LabError("the lab builds XFS: use a tuning with filesystem xfs")
        self.tuning.validate(kernel_release if kernel_release is not None else os.uname().release)

    @property
    def initial_credits(self) -> float:
        """Credits at the start (MiB at the real volume's scale): none when held empty, else as asked or a full
        bucket."""
        if self.hold_empty:
            return 0.0
        return self.volume.credit_capacity if self.initial_credits_mib is None else self.initial_credits_mib


def emulated_sysctls(tuning: HostTuning, memory_bytes: int | None) -> dict[str, str]:
    """The page-cache sysctls that make this machine act like an instance with `memory_bytes`.

    A tuning in ratio form becomes the bytes form for that memory (ratio x dirtyable memory); a tuning
    already in bytes form is used as is. With memory None the tuning's own sysctls are returned.
    """
    values = tuning.sysctls()
    if memory_bytes is None:
        return values
    dirtyable = memory_bytes * DIRTYABLE_FRACTION
    out = {k: v for k, v in values.items() if "ratio" not in k}
    if tuning.dirty_ratio is not None:
        out["vm.dirty_bytes"] = str(int(dirtyable * tuning.dirty_ratio / 100))
    if tuning.dirty_background_ratio is not None:
        out["vm.dirty_background_bytes"] = str(int(dirtyable * tuning.dirty_background_ratio / 100))
    return out
