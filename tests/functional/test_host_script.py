"""The rendered host script, run for real as root against a loop device.

It formats the device, mounts it with the options and applies the sysctls. Every test records the
kernel's dirty-page settings first and restores them, unmounts and detaches on every exit path. The
script writes its sysctl file into the test's directory and leaves /etc/fstab alone
(IOBATCH_SYSCTL_CONF, IOBATCH_FSTAB).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuning.host import SCRATCH_DEVICE_NAME, SCRATCH_READY_MARKER, STORE_MODEL, HostTuning, sysctl_path

pytestmark = pytest.mark.root

DIRTY_KEYS = ("vm.dirty_ratio", "vm.dirty_background_ratio", "vm.dirty_bytes", "vm.dirty_background_bytes")
TOOLS = ("losetup", "mkfs.xfs", "mkfs.ext4", "blkid", "findmnt", "mount", "umount", "sysctl")

if os.geteuid() != 0:
    pytest.skip("needs root: loop devices, mounts and sysctls", allow_module_level=True)
if missing := [t for t in TOOLS if shutil.which(t) is None]:
    pytest.skip(f"needs {', '.join(missing)} (xfsprogs, util-linux, procps)", allow_module_level=True)


def read_sysctl(key: str) -> str:
    return Path(sysctl_path(key)).read_text().strip()


def restore_dirty(saved: dict[str, str]) -> None:
    """Write back the form that was in effect: writing one form zeroes the other."""
    for ratio, size in (("vm.dirty_background_ratio", "vm.dirty_background_bytes"),
                        ("vm.dirty_ratio", "vm.dirty_bytes")):
        key = size if saved[size] != "0" else ratio
        Path(sysctl_path(key)).write_text(saved[key])


@pytest.fixture
def saved_sysctls() -> Iterator[dict[str, str]]:
    saved = {key: read_sysctl(key) for key in DIRTY_KEYS}
    try:
        yield saved
    finally:
        restore_dirty(saved)
        assert {key: read_sysctl(key) for key in DIRTY_KEYS} == saved


@pytest.fixture
def loop_device(tmp_path: Path) -> Iterator[str]:
    image = tmp_path / "scratch.img"
    with image.open("wb") as handle:
        handle.truncate(320 * 1024 * 1024)  # XFS wants at least 300 MiB
    try:
        device = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True,
                                check=True).stdout.strip()
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"no loop device available: {exc.stderr.strip()}")
    try:
        yield device
    finally:
        # Unmount wherever the script mounted it, then detach.
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET", "-S", device], capture_output=True,
                                text=True, check=False).stdout.split()
        for target in mounts:
            subprocess.run(["umount", target], check=False)
        subprocess.run(["losetup", "-d", device], check=False)


def run_script(script: str, tmp_path: Path, sys_block: Path | None = None,
               **more: str) -> subprocess.CompletedProcess[str]:
    # No IMDS: this machine is no EC2 instance, and its link-local address is never a target.
    env = {**os.environ, "IOBATCH_SYSCTL_CONF": str(tmp_path / "90-iobatch.conf"), "IOBATCH_FSTAB": "",
           "IOBATCH_IMDS": "", "IOBATCH_SYS_BLOCK": str(sys_block or tmp_path / "no-sys-block"),
           "IOBATCH_QUALIFICATION_FILE": str(tmp_path / "qualification.json"), **more}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120, check=False)


def test_script_formats_mounts_and_applies_the_sysctls(
    tmp_path: Path, loop_device: str, saved_sysctls: dict[str, str]
) -> None:
    mount_point = tmp_path / "scratch"
    # Values that differ from any kernel default, so the test sees the script's doing.
    tuning = HostTuning(dirty_ratio=37, dirty_background_ratio=13, mount_point=str(mount_point))
    result = run_script(tuning.render_script(device=loop_device), tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"making xfs on blank {loop_device}" in result.stderr

    fstype, options = subprocess.run(["findmnt", "-rn", "-o", "FSTYPE,OPTIONS", "-M", str(mount_point)],
                                     capture_output=True, text=True, check=True).stdout.split()
    assert fstype == "xfs"
    mounted = set(options.split(","))
    assert {"noatime", "nodiratime", "logbufs=8", "logbsize=256k"} <= mounted
    assert oct(mount_point.stat().st_mode & 0o7777) == "0o1777"
    assert read_sysctl("vm.dirty_ratio") == "37"
    assert read_sysctl("vm.dirty_background_ratio") == "13"
    assert (tmp_path / "90-iobatch.conf").read_text().splitlines()[1:] == [
        "vm.dirty_ratio = 37", "vm.dirty_background_ratio = 13"]

    # A second run (a reboot re-runs user data) keeps the filesystem and succeeds.
    (mount_point / "keep").write_text("x")
    again = run_script(tuning.render_script(device=loop_device), tmp_path)
    assert again.returncode == 0, again.stderr
    assert "making xfs" not in again.stderr
    assert (mount_point / "keep").read_text() == "x"


def test_script_refuses_a_device_holding_another_filesystem(
    tmp_path: Path, loop_device: str, saved_sysctls: dict[str, str]
) -> None:
    subprocess.run(["mkfs.ext4", "-q", "-F", loop_device], check=True)
    tuning = HostTuning(dirty_ratio=37, dirty_background_ratio=13, mount_point=str(tmp_path / "scratch"))
    result = run_script(tuning.render_script(device=loop_device), tmp_path)
    assert result.returncode == 1
    assert f"FATAL: {loop_device} holds ext4, not xfs; not formatting a device that has data" in result.stderr
    assert read_sysctl("vm.dirty_ratio") == saved_sysctls["vm.dirty_ratio"]


def test_script_fails_loudly_when_the_device_is_missing(tmp_path: Path, saved_sysctls: dict[str, str]) -> None:
    tuning = HostTuning(mount_point=str(tmp_path / "scratch"))
    result = run_script(tuning.render_script(device="/dev/iobatch-no-such-disk"), tmp_path)
    assert result.returncode == 1
    assert "FATAL: scratch device /dev/iobatch-no-such-disk is not a block device" in result.stderr
    assert not (tmp_path / "90-iobatch.conf").exists()


def fake_sys_block(tmp_path: Path, models: dict[str, str]) -> Path:
    """A /sys/block of disks and their NVMe models as the kernel shows them (the model padded with blanks to the
    field's 40 bytes, as the NVMe Identify Controller data holds it)."""
    root = tmp_path / "sys-block"
    for name, model in models.items():
        (root / name / "device").mkdir(parents=True)
        (root / name / "device" / "model").write_text(model.ljust(40) + "\n")
    return root


def test_instance_store_scratch_is_the_one_store_device(
    tmp_path: Path, loop_device: str, saved_sysctls: dict[str, str]
) -> None:
    mount_point = tmp_path / "scratch"
    loop = Path(loop_device).name
    # The root disk and an EBS volume beside the store: only the store's model is taken.
    sys_block = fake_sys_block(tmp_path, {"nvme0n1": "Amazon Elastic Block Store", loop: STORE_MODEL})
    tuning = HostTuning(scratch="instance-store", mount_point=str(mount_point))
    result = run_script(tuning.render_script(), tmp_path, sys_block)
    assert result.returncode == 0, result.stderr
    assert f"scratch device {loop_device} (instance-store)" in result.stderr
    assert f"making xfs on blank {loop_device}" in result.stderr
    assert subprocess.run(["findmnt", "-rn", "-o", "SOURCE", "-M", str(mount_point)], capture_output=True,
                          text=True, check=True).stdout.strip() == loop_device
    assert "scratch=instance-store" in (mount_point / SCRATCH_READY_MARKER).read_text()


@pytest.mark.parametrize(("models", "fatal"), [
    ({"nvme0n1": "Amazon Elastic Block Store"}, "no instance store device"),
    ({"nvme1n1": STORE_MODEL, "nvme2n1": STORE_MODEL}, "2 instance store devices (/dev/nvme1n1 /dev/nvme2n1)"),
])
def test_instance_store_scratch_fails_loudly_without_exactly_one_store(
    tmp_path: Path, saved_sysctls: dict[str, str], models: dict[str, str], fatal: str
) -> None:
    tuning = HostTuning(scratch="instance-store", mount_point=str(tmp_path / "scratch"))
    result = run_script(tuning.render_script(), tmp_path, fake_sys_block(tmp_path, models))
    assert result.returncode == 1
    assert f"FATAL: {fatal}" in result.stderr
    assert not (tmp_path / "90-iobatch.conf").exists()


@pytest.mark.parametrize(("model", "taken"), [(STORE_MODEL, False), ("Amazon Elastic Block Store", True)])
def test_ebs_scratch_never_formats_a_blank_instance_store_while_the_volume_attaches(
    tmp_path: Path, loop_device: str, saved_sysctls: dict[str, str], model: str, taken: bool
) -> None:
    # EBS scratch on a type with an instance store, the volume not attached yet (no /dev/xvdb): the one blank disk is
    # the store, blank at boot, which must be left alone; the same disk showing EBS's model is the volume under its
    # NVMe name, which is taken. lsblk shows the loop device as the host's one disk (it lists a loop device as TYPE
    # loop, which the script never takes).
    if Path(SCRATCH_DEVICE_NAME).exists():
        pytest.skip(f"{SCRATCH_DEVICE_NAME} exists on this machine: the script would take it")
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "lsblk").write_text(f'#!/bin/sh\ncase "$*" in -dnpo*) echo "{loop_device} disk";; *) echo "$3";; esac\n')
    (shims / "lsblk").chmod(0o755)
    sys_block = fake_sys_block(tmp_path, {Path(loop_device).name: model})
    mount_point = tmp_path / "scratch"
    result = run_script(HostTuning(mount_point=str(mount_point)).render_script(), tmp_path, sys_block,
                        IOBATCH_DEVICE_WAIT="2", PATH=f"{shims}:{os.environ['PATH']}")
    if taken:
        assert result.returncode == 0, result.stderr
        assert f"scratch device {loop_device} (ebs)" in result.stderr
        assert f"making xfs on blank {loop_device}" in result.stderr
        return
    assert result.returncode == 1, result.stderr
    assert (f"FATAL: no scratch device ({SCRATCH_DEVICE_NAME} or a blank disk); not running jobs on the root disk"
            in result.stderr)
    assert "making xfs" not in result.stderr
    assert subprocess.run(["blkid", "-p", "-s", "TYPE", "-o", "value", loop_device], capture_output=True,
                          text=True, check=False).stdout == ""  # the store is as blank as it was
    assert not (tmp_path / "90-iobatch.conf").exists()
