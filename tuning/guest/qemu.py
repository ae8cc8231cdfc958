"""The QEMU command line of a guest, a pure function of what the guest should be: MachineSpec in, argv out.

The guest's root is the host's own `/`, shared read-only over 9p (`-virtfs`) and made writable inside the guest by a
RAM overlay, so the project's virtualenv and built binaries run unchanged in it; a second 9p share, read-write, is the
one directory the guest hands files back through. The scratch disk is a raw image on a virtio disk that QEMU's block
layer throttles like the named EBS volume (`scratch_throttle`, from tuning.ebs's figures). Unlike EBS, the bucket
starts full and its level cannot be set after boot: a credit level is given as the bucket's size (`credits_mib`).
What the throttle does, measured: docs/testing.md, "A Batch host in a box".

    qemu_argv(MachineSpec(kernel, initramfs, 2, 2048, share, stage2, modules), console=share / "console.log")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuning.ebs import MIB, Volume

# The guest sees the host at this address (QEMU's user-mode network); a host server bound to 127.0.0.1 answers.
HOST_ADDRESS = "10.0.2.2"
GUEST_ADDRESS = "10.0.2.15/24"
ROOT_TAG = "hostroot"
SHARE_TAG = "share"
SCRATCH_SERIAL = "iobatch-scratch"
# QEMU refuses a burst length of zero; a bucket this small is "at baseline" to any workload.
_MIN_BURST_SECONDS = 1


class GuestConfigError(ValueError):
    """A guest that cannot be built as asked; the message names the value and its range."""


# QEMU's throttling (docs/throttle.txt in QEMU's sources, a leaky bucket): bps-total is the rate the bucket drains at
# (the volume's baseline), bps-total-max the rate allowed while it has room (the burst), and bps-total-max-length how
# many seconds a full bucket lasts at that rate: the bucket holds max x length bytes. iops-total with iops-size
# counts an I/O of up to iops-size as one unit and a larger one as size / iops-size: with 1 MiB, as EBS charges an
# HDD volume for a small random I/O.
@dataclass(frozen=True)
class Throttle:
    """QEMU's limits for one disk: bytes per second at baseline, while bursting, and the burst's length."""

    baseline_bps: int
    burst_bps: int
    burst_seconds: int
    io_unit: int | None  # charge every I/O at least this many bytes (EBS HDD: 1 MiB), None: bytes only

    def drive_options(self) -> list[str]:
        """The `-drive` options that set these limits."""
        opts = [f"throttling.bps-total={self.baseline_bps}"]
        if self.burst_bps > self.baseline_bps:
            opts += [f"throttling.bps-total-max={self.burst_bps}",
                     f"throttling.bps-total-max-length={self.burst_seconds}"]
        if self.io_unit:
            units = max(1, self.baseline_bps // self.io_unit)
            opts += [f"throttling.iops-total={units}", f"throttling.iops-size={self.io_unit}"]
            burst_units = max(units, self.burst_bps // self.io_unit)
            if burst_units > units:
                opts += [f"throttling.iops-total-max={burst_units}",
                         f"throttling.iops-total-max-length={self.burst_seconds}"]
        return opts


def scratch_throttle(volume: Volume, *, credits_mib: float | None = None) -> Throttle:
    """The limits that make a virtio disk act like `volume` (tuning.ebs owns its numbers).

    `credits_mib`: the burst credits at boot, in MiB (HDD volumes); None gives the volume's full bucket, 0 a volume
    at baseline from the start (its cliff already passed). A volume that does not burst runs at its ceiling.
    """
    baseline = volume.baseline_mibps * MIB
    if not volume.bursts:
        return Throttle(int(baseline), int(baseline), _MIN_BURST_SECONDS, None)
    burst = volume.burst_mibps * MIB
    credits = volume.credit_capacity if credits_mib is None else credits_mib
    if credits < 0:
        raise GuestConfigError(f"credits_mib={credits_mib} is negative: give 0 (at baseline) or more")
    if credits <= 0:
        return Throttle(int(baseline), int(baseline), _MIN_BURST_SECONDS, MIB if volume.is_hdd else None)
    # The bucket holds burst x length bytes (QEMU), so a level of C MiB lasts C / burst seconds at full rate.
    seconds = max(_MIN_BURST_SECONDS, round(credits * MIB / burst))
    return Throttle(int(baseline), int(burst), seconds, MIB if volume.is_hdd else None)


@dataclass(frozen=True)
class ScratchDisk:
    """The guest's scratch volume: a raw image, attached as a virtio disk, throttled or not."""

    image: Path
    throttle: Throttle | None = None


@dataclass(frozen=True)
class MachineSpec:
    """What to boot: the kernel and initramfs, the guest's size, and the host folders it sees."""

    kernel: Path
    initramfs: Path
    vcpus: int
    memory_mib: int
    share: Path  # read-write, at the same path in the guest
    stage2: Path  # the guest's init after the root is mounted (tuning/guest/stage2.sh)
    modules: Path  # the kernel's modules, bound at /lib/modules/<release> in the guest
    scratch: ScratchDisk | None = None
    accel: str = "tcg"  # "kvm" where a probe showed it runs a stock kernel
    # 9p's passthrough model keeps owners and modes as they are on the host and needs QEMU to run as root; as
    # another user, "none" serves files with that user's rights (enough for a read-only root and its own share).
    passthrough: bool = True

    def validate(self) -> None:
        if not 1 <= self.vcpus <= 64:
            raise GuestConfigError(f"vcpus={self.vcpus} is out of range: give 1 to 64")
        if not 256 <= self.memory_mib <= 65536:
            raise GuestConfigError(f"memory_mib={self.memory_mib} is out of range: give 256 to 65536")
        if self.accel not in ("tcg", "kvm"):
            raise GuestConfigError(f"accel={self.accel!r} is not one of tcg, kvm")
        for path in (self.share, self.stage2, self.modules):
            if not path.is_absolute() or "," in str(path) or " " in str(path):
                raise GuestConfigError(f"{path} must be absolute, without commas or spaces (QEMU and the kernel "
                                       "command line split on them)")


def kernel_command_line(spec: MachineSpec, *, console_quiet: bool = True) -> str:
    """The kernel's command line: the serial console, no reboot on panic, and the init's settings.

    Parameters the kernel does not know and that carry no dot reach init as environment variables
    (Documentation/admin-guide/kernel-parameters.rst), which is how the initramfs learns its stage 2.
    """
    words = ["console=ttyS0", "panic=-1", "rdinit=/init", "net.ifnames=0", "systemd.unified_cgroup_hierarchy=1",
             f"IOBATCH_STAGE2={spec.stage2}", f"IOBATCH_SHARE={spec.share}", f"IOBATCH_MODULES={spec.modules}",
             f"IOBATCH_GUEST_IP={GUEST_ADDRESS}"]
    if console_quiet:
        words.append("quiet")
    return " ".join(words)


def qemu_argv(spec: MachineSpec, *, binary: str = "qemu-system-x86_64", console: Path) -> list[str]:
    """The whole QEMU command line. It powers off with the guest (-no-reboot) and opens no window or monitor."""
    spec.validate()
    if spec.accel == "kvm":
        machine = ["-machine", "q35", "-accel", "kvm", "-cpu", "host"]
    else:
        # Multi-threaded TCG: one host thread per vCPU.
        machine = ["-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max"]
    model = "passthrough" if spec.passthrough else "none"
    argv = [binary, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", *machine,
            "-smp", str(spec.vcpus), "-m", str(spec.memory_mib),
            "-kernel", str(spec.kernel), "-initrd", str(spec.initramfs),
            "-append", kernel_command_line(spec),
            "-serial", f"file:{console}",
            "-virtfs", f"local,path=/,mount_tag={ROOT_TAG},security_model={model},readonly=on,multidevs=remap",
            "-virtfs", f"local,path={spec.share},mount_tag={SHARE_TAG},security_model={model},multidevs=remap",
            # No default route and no DNS in the guest: it reaches the host's loopback servers at HOST_ADDRESS only.
            "-netdev", "user,id=net0", "-device", "virtio-net-pci,netdev=net0",
            "-device", "virtio-rng-pci"]
    if spec.scratch is not None:
        drive = [f"file={spec.scratch.image}", "if=none", "id=scratch", "format=raw", "cache=writeback"]
        if spec.scratch.throttle is not None:
            drive += spec.scratch.throttle.drive_options()
        argv += ["-drive", ",".join(drive), "-device", f"virtio-blk-pci,drive=scratch,serial={SCRATCH_SERIAL}"]
    return argv


def loopback_to_guest(url: str) -> str:
    """A URL of a server on the host's loopback as the guest reaches it (127.0.0.1/localhost -> HOST_ADDRESS)."""
    for name in ("127.0.0.1", "localhost", "[::1]"):
        if f"//{name}:" in url or url.endswith(f"//{name}"):
            return url.replace(f"//{name}", f"//{HOST_ADDRESS}", 1)
    return url


def describe(argv: Sequence[str]) -> str:
    """The command line on one line, for a log."""
    return " ".join(argv)
