"""The whole disk behind a path, as the block layer's requests name it (a partition's requests carry its
disk's device number and absolute sectors): what the eBPF probe watches for the scratch disk's requests."""

from __future__ import annotations

import re
from pathlib import Path

from profiling.probes.procfs import SYS_DEV_BLOCK, BlockDevice, DeviceError, device_of


def disk_of(device: BlockDevice, sys_dev_block: Path = SYS_DEV_BLOCK) -> tuple[int, int] | None:
    """(major, minor) of `device`'s whole disk, as block requests name it: itself, or a partition's parent (its
    sysfs directory's); None when sysfs cannot tell."""
    node = sys_dev_block / device.dev
    try:
        if (node / "partition").exists():
            major, minor = (node.resolve().parent / "dev").read_text(encoding="ascii").strip().split(":")
            return int(major), int(minor)
    except (OSError, ValueError):
        return None
    return device.major, device.minor


def whole_disk(path: Path, sys_dev_block: Path = SYS_DEV_BLOCK) -> tuple[int, int] | None:
    """(major, minor) of the disk holding `path` (disk_of); None when no block device backs `path` (overlay,
    tmpfs) or it cannot be told."""
    try:
        device, _ = device_of(path, sys_dev_block)
    except (DeviceError, OSError):
        return None
    return None if device is None else disk_of(device, sys_dev_block)


_EBS_SERIAL = re.compile(r"^vol-?([0-9a-f]{8,17})$")


def ebs_volume_id(path: Path, sys_dev_block: Path = SYS_DEV_BLOCK) -> str | None:
    """The EBS volume id of the disk holding `path`, or None (not EBS, or sysfs cannot tell). On Nitro instances an
    EBS volume is an NVMe device whose serial number is the volume id without its dash, "vol0123456789abcdef0"
    ("Amazon EBS and NVMe", Amazon EC2 User Guide: "the EBS volume ID is set as the serial number of the device")."""
    disk = whole_disk(path, sys_dev_block)
    if disk is None:
        return None
    try:
        serial = (sys_dev_block / f"{disk[0]}:{disk[1]}" / "device" / "serial").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    match = _EBS_SERIAL.match(serial)
    return f"vol-{match[1]}" if match else None
