"""The whole disk behind a path, as the block layer's requests name it (a partition's requests carry its
disk's device number and absolute sectors): what the eBPF probe watches for the scratch disk's requests."""

from __future__ import annotations

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
