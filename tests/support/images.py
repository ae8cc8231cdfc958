"""The job image, built without a Docker daemon: a Debian base made once with debootstrap (cached under
.tools/ as a tar and as a podman image), then containers/job/Dockerfile with `--build-arg BASE=` that base.
podman's layer cache makes every later build of an unchanged tree take seconds, and each image is built once a
process (the tree does not change under a test run). `make setup` builds them as root, so a new machine's suite
does not (`python -m tests.support.images`)."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".tools" / "container-base"
BASE_TAR = CACHE / "bookworm-minbase.tar"
BASE_IMAGE = "localhost/iobatch-base:bookworm"
JOB_IMAGE = "localhost/iobatch-job:test"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# The host's CA bundle, mounted into build steps so pip works behind a TLS-intercepting proxy.
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


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


@functools.cache
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


@functools.cache
def job_image() -> str:
    """The job image, built from the repository with BASE set to the debootstrap base."""
    args = ["podman", "build", "--isolation=chroot", "--network=host", "--build-arg", f"BASE={base_image()}",
            "-f", "containers/job/Dockerfile", "-t", JOB_IMAGE]
    if HOST_CA_BUNDLE.exists():
        args += ["--volume", f"{HOST_CA_BUNDLE}:/run/host-ca.crt:ro", "--build-arg", "PIP_CERT=/run/host-ca.crt"]
    for name in ("PIP_INDEX_URL",):
        if os.environ.get(name):
            args += ["--build-arg", f"{name}={os.environ[name]}"]
    built = run(*args, ".", cwd=ROOT, timeout=1200)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return JOB_IMAGE


USER_IMAGE = "localhost/iobatch-user:test"


@functools.cache
def user_image() -> str:
    """A user's image as the README's "Your own processing" builds it: examples/Dockerfile FROM the job image."""
    built = run("podman", "build", "--isolation=chroot", "--network=host", "--build-arg", f"BASE={job_image()}",
                "-f", "examples/Dockerfile", "-t", USER_IMAGE, "examples", cwd=ROOT, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return USER_IMAGE


def main() -> int:
    """Build the images the rehearsals use, saying how long each took; a skip (no mirror) is one line, not a failure
    of setup (the tests that need the images then skip with the same line)."""
    for build in (base_image, job_image, user_image):
        start = time.monotonic()
        try:
            name = build()
        except pytest.skip.Exception as skipped:
            print(f"note: the rehearsals' images were not built: {skipped}")
            return 0
        except AssertionError as failed:
            print(f"the rehearsals' image {build.__name__} did not build: {str(failed)[-2000:]}", file=sys.stderr)
            return 1
        print(f"image {name}: {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
