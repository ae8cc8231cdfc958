"""The job image, built and run without a Docker daemon (podman/buildah with chroot isolation).

The image is built by tests/support/images.py (a debootstrap base cached under .tools/, then
containers/job/Dockerfile), then run with `buildah run --isolation chroot`: `iobatch job --help`, and
one array child against the embedded S3 server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import images
from tests.support.images import run

# untimed: one child, nothing timed: it runs beside the guest's boots (tests/conftest.py)
pytestmark = [pytest.mark.container, pytest.mark.root, pytest.mark.untimed]

if os.geteuid() != 0:
    pytest.skip("needs root: podman/buildah with chroot isolation, debootstrap", allow_module_level=True)
if missing := [t for t in ("podman", "buildah", "debootstrap") if shutil.which(t) is None]:
    pytest.skip(f"needs {', '.join(missing)} (make setup installs them)", allow_module_level=True)


@pytest.fixture(scope="session")
def job_image() -> str:
    """The job image (tests/support/images.py: built once, cached by podman)."""
    return images.job_image()


@pytest.fixture
def container(job_image: str) -> Iterator[str]:
    made = run("buildah", "from", job_image)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip().splitlines()[-1]
    try:
        yield name
    finally:
        run("buildah", "rm", name)


def buildah_run(container: str, *command: str, env: dict[str, str] | None = None,
                volumes: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    args = ["buildah", "run", "--isolation", "chroot", "--network", "host"]
    for key, value in (env or {}).items():
        args += ["--env", f"{key}={value}"]
    for volume in volumes:
        args += ["--volume", volume]
    return run(*args, container, "--", *command, timeout=300)


def test_image_runs_both_entrypoints_as_an_unprivileged_user(container: str) -> None:
    result = buildah_run(container, "iobatch", "job", "--help")
    assert result.returncode == 0, result.stderr
    assert "IOBATCH_INPUT" in result.stdout
    sidecar = buildah_run(container, "iobatch", "sidecar", "--help")
    assert sidecar.returncode == 0, sidecar.stderr
    assert "--emf" in sidecar.stdout
    user = buildah_run(container, "id", "-u")
    assert user.stdout.strip() == "1000"


def test_image_runs_one_child_against_the_embedded_s3(
    container: str, s3_server: Any, small_dataset: Any, tmp_path: Path
) -> None:
    from pipeline.s3 import freeze_batch
    from pipeline.settings import S3Uri
    from tests.support.data import upload_dir

    _, source = small_dataset
    client = s3_server.client()
    bucket = "container-test"
    client.create_bucket(Bucket=bucket)
    upload_dir(client, bucket, "images/", source)
    input_uri, output_uri = S3Uri(bucket, "images/"), S3Uri(bucket, "shards/")
    frozen = freeze_batch(client, input=input_uri, manifest=None, output=output_uri, per_child=4)
    assert frozen.children == 2

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)  # as the host script leaves /scratch
    env = {
        **s3_server.env(),
        "IOBATCH_S3_ENDPOINT": s3_server.endpoint,
        "IOBATCH_INPUT": str(input_uri),
        "IOBATCH_OUTPUT": str(output_uri),
        "IOBATCH_MANIFEST": str(frozen.manifest),
        "IOBATCH_IMAGES_PER_CHILD": "4",
        "AWS_BATCH_JOB_ARRAY_INDEX": "1",
        "AWS_BATCH_JOB_ID": "container-test",
        "IOBATCH_SCRATCH": "/scratch",
    }
    result = buildah_run(container, "iobatch", "job", env=env, volumes=(f"{scratch}:/scratch",))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix="shards/part-00001/").get("Contents", [])}
    assert "shards/part-00001/_SUCCESS" in keys
    assert len(keys) >= 2
    assert not client.list_objects_v2(Bucket=bucket, Prefix="shards/part-00000/").get("KeyCount")
