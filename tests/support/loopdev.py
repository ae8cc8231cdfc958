"""A loop device of the test's own over a sparse file, detached on every path; the test is skipped where none
can be attached (no losetup, no free loop device, not root)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def loop_device(directory: Path, size: int = 128 << 20) -> Iterator[str]:
    """The device node (e.g. /dev/loop3) of a loop device over a `size`-byte sparse file in `directory`. udev's
    probe of the new device (blkid reads it) is over when it is yielded, so it is not in a test's counts."""
    if shutil.which("losetup") is None:
        pytest.skip("losetup not installed")
    backing = directory / "disk.img"
    with backing.open("wb") as f:
        f.truncate(size)
    done = subprocess.run(["losetup", "--find", "--show", str(backing)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no loop device: {done.stderr.strip()}")
    device = done.stdout.strip()
    try:
        if shutil.which("udevadm"):
            subprocess.run(["udevadm", "settle", "--timeout=10"], check=False)
        yield device
    finally:
        subprocess.run(["losetup", "-d", device], check=False)
