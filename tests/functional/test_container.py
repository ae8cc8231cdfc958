"""The job image, built and run without a Docker daemon (podman/buildah with chroot isolation).

The base is a Debian root filesystem made once with debootstrap and cached under .tools/ (the tar
and the imported image are reused by later runs). The image is built from containers/job/Dockerfile
with `--build-arg BASE=` that base, then run with `buildah run --isolation chroot`: `iobatch job
--help`, and one array child against the embedded S3 server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.container, pytest.mark.root]

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".tools" / "container-base"
BASE_TAR = CACHE / "bookworm-minbase.tar"
BASE_IMAGE = "localhost/iobatch-base:bookworm"
JOB_IMAGE = "localhost/iobatch-job:test"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# The host's CA bundle, mounted into build steps so pip works behind a TLS-intercepting proxy.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

if os.geteuid() != 0:
    pytest.skip("needs root: podman/buildah with chroot isolation, debootstrap", allow_module_level=True)
if missing := [t for t in ("podman", "buildah", "debootstrap") if shutil.which(t) is None]:
    pytest.skip(f"needs {', '.join(missing)} (make setup installs them)", allow_module_level=True)


def run(*args: str, timeout: float = 900, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses (deb822 or one-line sources)."""
    sources = [*sorted(Path("/etc/apt/sources.list.d").glob("*.sources")), Path("/etc/apt/sources.list")]
    for path in sources:
        if not path.exists():
            continue
        text = path.read_text()
        for match in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M):
            uri = match[1] or match[2]
            if "security" not in uri:
                return uri
    return DEFAULT_MIRROR


@pytest.fixture(scope="session")
def base_image() -> str:
    """localhost/iobatch-base:bookworm, from the cached debootstrap tar (made on first use, ~1 min)."""
    if run("podman", "image", "exists", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    if not BASE_TAR.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            rootfs = Path(tmp) / "rootfs"
            made = run("debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates",
                       "bookworm", str(rootfs), debian_mirror())
            if made.returncode != 0:
                pytest.skip(f"debootstrap failed (no Debian mirror?): {made.stderr.strip()[-300:]}")
            partial = BASE_TAR.with_suffix(".partial")
            packed = run("tar", "-C", str(rootfs), "-cf", str(partial), ".")
            assert packed.returncode == 0, packed.stderr
            partial.rename(BASE_TAR)
    imported = run("podman", "import", str(BASE_TAR), BASE_IMAGE)
    assert imported.returncode == 0, imported.stderr
    return BASE_IMAGE


@pytest.fixture(scope="session")
def job_image(base_image: str) -> str:
    """The job image, built from the repository with BASE set to the debootstrap base."""
    args = ["podman", "build", "--isolation=chroot", "--network=host", "--build-arg", f"BASE={base_image}",
            "-f", "containers/job/Dockerfile", "-t", JOB_IMAGE]
    if HOST_CA_BUNDLE.exists():
        args += ["--volume", f"{HOST_CA_BUNDLE}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
    for name in ("PIP_INDEX_URL",):
        if os.environ.get(name):
            args += ["--build-arg", f"{name}={os.environ[name]}"]
    built = run(*args, ".", cwd=ROOT, timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return JOB_IMAGE


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
