"""The scratch volume's EBS id, from the NVMe serial number of the disk behind scratch (sysfs laid out as Linux does:
/sys/dev/block/MAJ:MIN -> the disk's directory, with device/serial)."""

from __future__ import annotations

import os
from pathlib import Path

from profiling.probes.disk import ebs_volume_id


def fake_sysfs(tmp_path: Path, serial: str | None) -> tuple[Path, Path]:
    """A sysfs whose entry for the device holding tmp_path is a disk with this serial."""
    st = os.stat(tmp_path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    disk = tmp_path / "sys" / "devices" / "nvme1n1"
    (disk / "device").mkdir(parents=True)
    (disk / "dev").write_text(f"{major}:{minor}\n")
    if serial is not None:
        (disk / "device" / "serial").write_text(serial + "\n")
    dev_block = tmp_path / "sys" / "dev" / "block"
    dev_block.mkdir(parents=True)
    (dev_block / f"{major}:{minor}").symlink_to(disk)
    return tmp_path, dev_block


def test_an_ebs_nvme_serial_is_the_volume_id_with_its_dash(tmp_path: Path) -> None:
    path, sysfs = fake_sysfs(tmp_path, "vol0123456789abcdef0")
    assert ebs_volume_id(path, sysfs) == "vol-0123456789abcdef0"


def test_other_disks_have_none(tmp_path: Path) -> None:
    path, sysfs = fake_sysfs(tmp_path, "AWS22C1D4D0C8A7B4FAA")  # an instance store NVMe disk
    assert ebs_volume_id(path, sysfs) is None
    assert ebs_volume_id(tmp_path / "sys", tmp_path / "nowhere") is None
