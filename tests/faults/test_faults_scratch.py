"""Scratch full: a child on a scratch volume too small for its images (a loop-device filesystem).

Needs root, losetup and mkfs.ext2; skips otherwise. The loop device is detached and the mount
removed on every exit path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import EXIT_PERMANENT, EXIT_RETRYABLE
from pipeline.local.s3server import EmbeddedS3
from tests.support.data import upload_dir
from tests.support.faults import assert_child_complete, freeze, objects, reference_outputs, run_child

pytestmark = pytest.mark.root

VOLUME_BYTES = 1 << 20  # 1 MiB: smaller than the child's 2 MiB of images


@contextmanager
def small_volume(image: Path, mountpoint: Path, size: int) -> Iterator[Path]:
    """A fresh ext2 filesystem of `size` bytes on a loop device, mounted at `mountpoint`."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a loop device and a mount")
    for tool in ("losetup", "mkfs.ext2", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    with image.open("wb") as stream:
        stream.truncate(size)
    found = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.skip(f"no loop device available: {found.stderr.strip()}")
    device = found.stdout.strip()
    mounted = False
    try:
        subprocess.run(["mkfs.ext2", "-q", "-F", "-m", "0", device], check=True, capture_output=True)
        mountpoint.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", device, str(mountpoint)], check=True, capture_output=True)
        mounted = True
        yield mountpoint
    finally:
        if mounted:
            subprocess.run(["umount", str(mountpoint)], check=False, capture_output=True)
        subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
        image.unlink(missing_ok=True)


def test_scratch_too_small_for_the_child_is_permanent_naming_sizes_and_a_bigger_volume_succeeds(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    keys = upload_dir(s3, bucket, "images/", source)
    with small_volume(tmp_path / "scratch.img", tmp_path / "small", VOLUME_BYTES) as small:
        batch = freeze(s3_server, s3, bucket, keys, source, "full/", 4, small)
        code, output = run_child(batch, 0, tmp_path / "run", sidecar=False)
        assert code == EXIT_PERMANENT, output
        headline = next(line for line in output.splitlines() if line.startswith("error: "))
        size_mib = shutil.disk_usage(small).total / 2**20
        images_mib = sum(s3.head_object(Bucket=bucket, Key=k)["ContentLength"] for k in sorted(keys)[:4]) / 2**20
        assert headline == (f"error: scratch volume {small} ({size_mib:.1f} MiB) is smaller than this child's "
                            f"{images_mib:.1f} MiB of images: use a bigger volume (see `iobatch advise`) or fewer "
                            "images per job")
        assert "Traceback" not in output
        # Scratch is cleaned: the attempt's directory is gone.
        assert [p.name for p in small.iterdir() if p.name != "lost+found"] == []
        assert objects(s3, bucket, "full/part-00000/") == {}
    # The same child on a big enough volume.
    big = freeze(s3_server, s3, bucket, keys, source, "full/", 4, tmp_path / "big")
    code, output = run_child(big, 0, tmp_path / "run2", sidecar=False)
    assert code == 0, output
    assert_child_complete(s3, bucket, "full/", 0, reference_outputs(source, keys, 0, 4, tmp_path))


def test_scratch_filled_by_the_neighbours_is_transient_and_the_child_cleans_up(
    s3_server: EmbeddedS3, s3: Any, bucket: str, small_dataset: tuple[Any, Path], tmp_path: Path
) -> None:
    _, source = small_dataset
    keys = upload_dir(s3, bucket, "images/", source)
    with small_volume(tmp_path / "scratch.img", tmp_path / "shared", 8 * VOLUME_BYTES) as shared:
        # Another child's files leave less room than this child's 2 MiB of images.
        neighbour = shared / "task-neighbour"
        neighbour.mkdir()
        free = shutil.disk_usage(shared).free
        with (neighbour / "input.bin").open("wb") as stream:
            stream.write(b"\xff" * (free - VOLUME_BYTES))
        batch = freeze(s3_server, s3, bucket, keys, source, "shared/", 4, shared)
        code, output = run_child(batch, 0, tmp_path / "run", sidecar=False)
        assert code == EXIT_RETRYABLE, output
        headline = next(line for line in output.splitlines() if line.startswith("error: "))
        assert headline.startswith(f"error: scratch volume {shared} (") and "other children hold" in headline
        assert headline.endswith(": the child is retried")
        assert "Traceback" not in output
        assert sorted(p.name for p in shared.iterdir() if p.name != "lost+found") == ["task-neighbour"]
        assert objects(s3, bucket, "shared/part-00000/") == {}
